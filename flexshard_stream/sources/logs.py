"""Reading logged embedding-ID traffic (parquet or CSV), streaming, into :class:`~.batch.Batch` objects.

Log format
----------
One row per sample; columns:

``ts`` (optional)
    Sample time in seconds (int or float), or a datetime / timestamp / date column (polars
    ``Datetime``, arrow ``timestamp``), converted to epoch seconds (naive datetimes are taken as UTC).
    In CSV: a number, or an ISO-8601 datetime string.
one column per sparse feature (one embedding table each)
    An integer column (kind ``"single"``: one ID per sample) or a list-of-integers column (kind
    ``"sequence"``: a variable-length sequence of IDs per sample). IDs are non-negative and fit in
    int64; other integer widths are widened.

CSV files (``.csv``, or ``.tsv`` for tab-separated) need a header line. A sequence cell holds decimal
IDs separated by spaces (any ASCII whitespace), e.g. ``"12 7 7 40"``; an empty cell is an empty
sequence (and, in a ``"single"`` column, a null ID). Parquet string columns are parsed the same way
when requested explicitly. Parquet files are ``.parquet`` or ``.pq``.

Rows are numbered from 0 within each file, not counting the CSV header (CSV messages also give the
1-based line number, the header being line 1).

Bad rows
--------
A row is bad for the first of these reasons (in this order) that applies to it:
``"malformed"`` (CSV line with the wrong number of fields), ``"bad_ts"`` (null, NaN, infinite or
unparseable timestamp), ``"bad_id"`` (not an integer ID, does not fit in int64, or several IDs in a
``"single"`` column), ``"null_id"`` (null ID or null sequence; an empty ``"single"`` cell),
``"negative_id"``. By default the first bad row raises :class:`~.errors.LogError` naming the file,
the row and the column; with ``skip_bad_rows=True`` bad rows are dropped and counted in
:attr:`LogReader.skipped` and :attr:`LogReader.skipped_by_file`. With ``null_as_empty=True`` nulls
are not bad: a null ID or null sequence gives the sample no ID for that feature (length 0), which is
how missing categorical values (Criteo) are read. Whole-file problems (unknown extension, missing
or wrongly typed column, damaged or truncated file) always raise.

Streaming
---------
Parquet is read with ``pyarrow.parquet.ParquetFile.iter_batches`` (no pre-buffering, so memory is
bounded by one row group, not by the file); CSV with pyarrow's streaming CSV reader, block by block.
All conversions (list offsets to lengths, text to IDs, checks) are vectorized per chunk.
"""

from __future__ import annotations

import atexit
import csv
import io
import os
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence, Union

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..compat import REMOVED_IN, renamed_keywords, renamed_property
from ..errors import LogError
from ..stats.batch import Batch
from .ids import ID_MODES, OUT_OF_RANGE, RANGE_FIXES, IdMode, RowMap
from .paths import PARQUET_EXT, expand_log_paths, log_format

__all__ = ["LogSchema", "LogFileInfo", "LogReader", "inspect_log", "read_log", "log_max_ids",
           "REASONS", "TS_COLUMN", "ID_MODES", "OUT_OF_RANGE", "IdMode", "RowMap"]

Kind = Literal["single", "sequence"]
PathLike = Union[str, "os.PathLike[str]"]
Paths = Union[PathLike, Sequence[PathLike]]
FeatureSpec = Union[str, Sequence[str], Mapping[str, str], None]

TS_COLUMN = "ts"
#: Column names that are the sample time (seconds, or datetimes), in order of preference: the
#: first one every file has is the time column unless ``ts_column`` names another (``--ts``).
TIME_COLUMNS = ("ts", "timestamp", "time", "event_time")
#: Reasons a row can be bad, in the order in which a row is attributed to one of them.
REASONS: tuple[str, ...] = ("malformed", "bad_ts", "bad_id", "null_id", "negative_id")
_KINDS = ("single", "sequence")
_SAMPLE_ROWS = 1000            # rows sampled to infer the kind of a CSV / text column
_CSV_BLOCK = 4 << 20           # bytes per CSV block
_PQ_BUFFER = 1 << 20           # bytes of read buffer per parquet column
_INT64_MAX = np.iinfo(np.int64).max
_RE_SINGLE = r"^\s*-?[0-9]+\s*$"
_RE_SEQ = r"^\s*(-?[0-9]+(\s+-?[0-9]+)*)?\s*$"
_RE_MULTI = r"[0-9]\s+-?[0-9]"


# ----------------------------------------------------------------------------- schema
@dataclass(frozen=True)
class LogSchema:
    """What a log holds.

    Attributes
    ----------
    features : dict of str to {"single", "sequence"}
        Feature columns in reading order and their kind: one ID per sample, or a sequence.
    has_ts : bool
        True if every file has the time column (sample time, seconds).
    ts_column : str or None
        The time column: ``ts``, else the first of :data:`TIME_COLUMNS` every file has, or the
        one named (None: no time column).
    """

    features: dict[str, Kind]
    has_ts: bool
    ts_column: str | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """Feature names, in order (the ``keys`` of the batches)."""
        return tuple(self.features)


@dataclass(frozen=True)
class LogFileInfo:
    """One file of a log, as the reader found it (:attr:`LogReader.file_infos`).

    Attributes
    ----------
    path : Path
    format : {"parquet", "csv"}
    num_rows : int or None
        Data rows from the parquet footer (bad rows included); None for CSV (count them with
        :meth:`data_rows`).
    """

    path: Path
    format: str
    num_rows: int | None

    def data_rows(self) -> int:
        """Data rows of the file, bad rows included: the parquet footer, or the CSV line count
        (:func:`csv_data_rows`, one pass over the file)."""
        return int(self.num_rows) if self.num_rows is not None else csv_data_rows(self.path)


@dataclass
class _FileInfo:
    path: Path
    fmt: str                         # "parquet" | "csv"
    delimiter: str                   # CSV only
    types: dict[str, pa.DataType]    # column -> arrow type (CSV: all binary)
    kinds: dict[str, Kind | None]    # column -> inferred kind, None if not an ID column
    num_rows: int | None             # parquet only

    @property
    def columns(self) -> list[str]:
        return list(self.types)


def _fail(path: Path | str, msg: str) -> LogError:
    return LogError(f"{path}: {msg}")


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or (hasattr(pa.types, "is_list_view") and (pa.types.is_list_view(t)
                                                       or pa.types.is_large_list_view(t))))


def _is_text(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or (hasattr(pa.types, "is_string_view") and (pa.types.is_string_view(t)
                                                         or pa.types.is_binary_view(t))))


def _text_kind(sample: pa.Array) -> Kind | None:
    """Kind of a text column from a sample of it: None if it does not look like IDs.

    A column is an ID column when most (more than half) of its sampled non-empty cells are
    decimal IDs; the others are then bad rows when the column is read (an error naming the file,
    line and column, or skipped and counted), never a reason to drop the whole column."""
    s = sample.drop_null()
    if len(s) == 0:
        return None
    if not pa.types.is_binary(s.type):
        s = pc.cast(s, pa.binary())
    s = s.filter(pc.invert(pc.match_substring_regex(s, r"^\s*$")))
    if len(s) == 0:
        return None
    ids = s.filter(pc.match_substring_regex(s, _RE_SEQ))
    if 2 * len(ids) <= len(s):
        return None
    return "sequence" if pc.any(pc.match_substring_regex(ids, _RE_MULTI)).as_py() else "single"


def open_parquet(path: Path) -> pq.ParquetFile:
    """Open a parquet file for streaming reads (page checksums verified); LogError naming the file
    when its footer cannot be read."""
    try:
        return pq.ParquetFile(path, pre_buffer=False, buffer_size=_PQ_BUFFER,
                              page_checksum_verification=True)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _fail(path, f"damaged or truncated parquet file: cannot read its footer ({e})") \
            from None


def _inspect_parquet(path: Path) -> _FileInfo:
    pf = open_parquet(path)
    try:
        schema = pf.schema_arrow
        types = {f.name: f.type for f in schema}
        kinds: dict[str, Kind | None] = {}
        for name, t in types.items():
            if _is_int(t):
                kinds[name] = "single"
            elif _is_list(t) and _is_int(t.value_type):
                kinds[name] = "sequence"
            else:
                kinds[name] = None
        return _FileInfo(path, "parquet", "", types, kinds, pf.metadata.num_rows)
    finally:
        pf.close()


def _csv_header(path: Path, delimiter: str) -> list[str]:
    with open(path, "rb") as f:
        first = f.readline(1 << 20)
    if not first.strip():
        raise _fail(path, "empty CSV file or empty header line; expected a header naming the "
                          "columns")
    try:
        line = first.decode("utf-8").lstrip("\ufeff").rstrip("\r\n")
    except UnicodeDecodeError:
        raise _fail(path, "damaged CSV header (line 1 is not UTF-8 text)") from None
    names = next(csv.reader(io.StringIO(line), delimiter=delimiter))
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise _fail(path, f"duplicate column name(s) {sorted(dup)} in the CSV header")
    if any(not n for n in names):
        raise _fail(path, "empty column name in the CSV header (line 1)")
    return names


class _RowHandler:
    """A CSV ``invalid_row_handler`` interpreter exit waits for (:func:`_release_row_handlers`).

    pyarrow's streaming CSV reader parses blocks ahead on its own threads, and a block parser holds
    the Python handler; the thread that drops the last parser releases the handler, which takes
    the GIL. When that happens while the interpreter finalizes (a command that stops with an error
    right after opening a CSV file: the reader was dropped, a read-ahead block was still being
    parsed), the thread is torn down inside C++ code and the process aborts (``terminate called
    without an active exception``, exit 134). Every handler is therefore one of these, tracked
    weakly: it dies exactly when pyarrow has released it.

    pyarrow decodes a malformed line as UTF-8 before it calls the handler; a line that is not
    UTF-8 text never reaches it: pyarrow prints the UnicodeDecodeError as an "Exception ignored"
    traceback and stops with a parse error. :func:`_quiet_undecodable_rows` keeps that traceback
    off stderr and marks :attr:`undecodable`, so the reader's error says why the line could not be
    skipped. (The reader keeps that :class:`_Undecodable`, never the handler: only pyarrow may
    keep a handler alive, or exit would wait for it.)
    """

    __slots__ = ("fn", "undecodable", "__weakref__")
    live: "weakref.WeakSet[_RowHandler]" = weakref.WeakSet()

    def __init__(self, fn: Callable[[Any], str], undecodable: "_Undecodable"):
        self.fn = fn
        self.undecodable = undecodable
        _RowHandler.live.add(self)
        if sys.unraisablehook is not _quiet_undecodable_rows:
            _quiet_undecodable_rows.previous = sys.unraisablehook
            sys.unraisablehook = _quiet_undecodable_rows

    def __call__(self, row: Any) -> str:
        return self.fn(row)


class _Undecodable:
    """Whether pyarrow met a malformed line of a CSV reader that is not UTF-8 text
    (:class:`_RowHandler`)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False

    def why(self) -> str:
        """What to add to a parse error the reader stopped with."""
        return ("; a malformed line that is not UTF-8 text cannot be skipped (pyarrow cannot "
                "pass it to the bad-row handler): fix or remove it") if self.seen else ""


def _quiet_undecodable_rows(unraisable: Any) -> None:
    """``sys.unraisablehook`` while CSV logs are read: a UnicodeDecodeError pyarrow raised for a
    :class:`_RowHandler` (a malformed line that is not UTF-8 text) marks the handler instead of
    printing a traceback; everything else goes to the previous hook."""
    handler = unraisable.object
    if isinstance(handler, _RowHandler) and unraisable.exc_type is UnicodeDecodeError:
        handler.undecodable.seen = True
        return
    _quiet_undecodable_rows.previous(unraisable)


_quiet_undecodable_rows.previous = sys.unraisablehook


#: Longest wait at interpreter exit for pyarrow to release CSV row handlers (seconds): a
#: read-ahead block takes milliseconds to parse; the bound only keeps exit from hanging.
_EXIT_WAIT_S = 10.0


@atexit.register
def _release_row_handlers() -> None:
    """At exit, before the interpreter finalizes: wait until pyarrow's read-ahead threads have
    released every CSV row handler (see :class:`_RowHandler`), at most :data:`_EXIT_WAIT_S`."""
    deadline = time.monotonic() + _EXIT_WAIT_S
    while _RowHandler.live and time.monotonic() < deadline:
        time.sleep(0.002)


def _csv_reader(path: Path, delimiter: str, names: list[str], include: list[str],
                on_bad: Callable[[Any], str], undecodable: _Undecodable,
                block: int | None = None) -> pacsv.CSVStreamingReader:
    """A streaming CSV reader of ``path`` (every column as binary); ``on_bad`` is called with
    each malformed line (see :class:`_RowHandler`). LogError naming the file if it cannot be
    opened."""
    on_bad = _RowHandler(on_bad, undecodable)
    try:
        return pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=False, block_size=block or _CSV_BLOCK),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=on_bad,
                                              ignore_empty_lines=False, newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(
                include_columns=include, column_types={c: pa.binary() for c in names},
                strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _fail(path, f"damaged CSV file near its start ({e}){undecodable.why()}") from None


def _inspect_csv(path: Path, delimiter: str) -> _FileInfo:
    names = _csv_header(path, delimiter)
    types = {n: pa.binary() for n in names}
    kinds: dict[str, Kind | None] = dict.fromkeys(names)
    undecodable = _Undecodable()
    reader = _csv_reader(path, delimiter, names, names, lambda row: "skip", undecodable,
                         block=1 << 20)
    parts, n = [], 0
    try:
        for rb in reader:
            parts.append(rb)
            n += rb.num_rows
            if n >= _SAMPLE_ROWS:
                break
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _fail(path, f"damaged CSV file near its start ({e}){undecodable.why()}") from None
    if parts:
        tab = pa.Table.from_batches(parts).slice(0, _SAMPLE_ROWS)
        for name in names:
            kinds[name] = _text_kind(tab.column(name).combine_chunks())
    return _FileInfo(path, "csv", delimiter, types, kinds, None)


def _inspect_file(path: Path) -> _FileInfo:
    fmt, delim = log_format(path)
    return _inspect_parquet(path) if fmt == "parquet" else _inspect_csv(path, delim)


def _parquet_first_value(path: Path, column: str) -> str:
    """Describe row 0 of a parquet column (for whole-column type errors)."""
    try:
        pf = open_parquet(path)
        try:
            for rb in pf.iter_batches(batch_size=1, columns=[column]):
                if rb.num_rows:
                    return f"row 0 (0-based within this file) holds {rb.column(0)[0].as_py()!r}"
        finally:
            pf.close()
    except (pa.ArrowException, OSError, ValueError, LogError):
        pass
    return "the file has no rows"


def _normalize_features(features: FeatureSpec, ts_column: str | None = None
                        ) -> dict[str, Kind | None] | None:
    if features is None:
        return None
    if isinstance(features, str):
        features = [features]
    if isinstance(features, Mapping):
        out: dict[str, Kind | None] = {}
        for k, v in features.items():
            if v not in _KINDS:
                raise LogError(f"feature {k!r}: kind {v!r} is not one of {_KINDS}")
            out[str(k)] = v  # type: ignore[assignment]
    else:
        names = [str(f) for f in features]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise LogError(f"feature(s) {dup} requested twice")
        out = dict.fromkeys(names)
    if TS_COLUMN in out:
        raise LogError(f"{TS_COLUMN!r} is the timestamp column and cannot be a feature")
    if ts_column is not None and ts_column in out:
        raise LogError(f"{ts_column!r} is the time column (ts_column) and cannot be a feature")
    if not out:
        raise LogError("no features requested")
    return out


def _check_column(info: _FileInfo, name: str, declared: Kind | None) -> Kind:
    """Kind of requested column ``name`` in one file; raises if missing or wrongly typed."""
    if name not in info.types:
        raise _fail(info.path, f"column {name!r} is missing (requested feature); the file has "
                               f"columns {info.columns}")
    t = info.types[name]
    if info.fmt == "csv":
        return declared or info.kinds[name] or "sequence"
    if _is_int(t) or pa.types.is_null(t):
        return declared or "single"
    if _is_list(t) and (_is_int(t.value_type) or pa.types.is_null(t.value_type)):
        return declared or "sequence"
    if _is_text(t):
        if declared:
            return declared
        pf = open_parquet(info.path)
        try:
            sample = next(pf.iter_batches(batch_size=_SAMPLE_ROWS, columns=[name]), None)
        finally:
            pf.close()
        kind = _text_kind(sample.column(0)) if sample is not None else None
        return kind or "sequence"
    what = "floating point" if pa.types.is_floating(t) else str(t)
    raise _fail(info.path, f"row 0 (0-based within this file), column {name!r}: wrong type {t} "
                           f"({what}); IDs must be integers (kind 'single') or lists of integers "
                           f"(kind 'sequence'); the whole column has this type, "
                           f"{_parquet_first_value(info.path, name)}. Cast it to int64 when "
                           f"writing the log")


def _time_column(infos: list[_FileInfo], given: str | None,
                 features: Mapping[str, Any] | None) -> str | None:
    """The log's time column: ``given`` (LogError when a file lacks it), else the first of
    :data:`TIME_COLUMNS` that every file has and that is not a requested feature."""
    if given is not None:
        for i in infos:
            if given not in i.types:
                raise _fail(i.path, f"column {given!r} (the time column asked for) is missing; "
                                    f"the file has columns {i.columns}")
        return given
    for name in TIME_COLUMNS:
        if all(name in i.types for i in infos) and not (features and name in features):
            return name
    return None


def _check_ts(info: _FileInfo, column: str = TS_COLUMN) -> None:
    t = info.types[column]
    if info.fmt == "csv":
        return
    ok = (_is_int(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t)
          or pa.types.is_date(t) or _is_text(t) or pa.types.is_null(t))
    if not ok:
        raise _fail(info.path, f"row 0 (0-based within this file), column {column!r}: wrong "
                               f"type {t}; expected seconds (int or float) or a datetime; "
                               f"{_parquet_first_value(info.path, column)}")


def _schema_of(infos: list[_FileInfo], features: FeatureSpec,
               ignore: Iterable[str], ts_column: str | None = None) -> LogSchema:
    wanted = _normalize_features(features, ts_column)
    ts = _time_column(infos, ts_column, wanted)
    if wanted is None:
        first = infos[0]
        skip = set(ignore) | {TS_COLUMN} | ({ts} if ts else set())
        wanted = {c: k for c, k in first.kinds.items() if k is not None and c not in skip}
        if not wanted:
            raise _fail(first.path, f"no integer or list-of-integer column to read as a feature; "
                                    f"columns are {first.columns}")
    kinds: dict[str, Kind] = {}
    for info in infos:
        for name, declared in wanted.items():
            k = _check_column(info, name, declared)
            kinds[name] = "sequence" if kinds.get(name) == "sequence" else k
        if ts is not None:
            _check_ts(info, ts)
        elif TS_COLUMN in info.types:
            _check_ts(info)
    return LogSchema({n: kinds[n] for n in wanted}, ts is not None, ts)


def csv_data_rows(path: PathLike) -> int:
    """Data rows of a CSV file: its lines, not counting the header (the reader's rule: a line is a
    row), counted in 16 MB blocks."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while True:
            buf = f.read(16 << 20)
            if not buf:
                break
            lines += buf.count(b"\n")
            last = buf[-1:]
    if last != b"\n":
        lines += 1
    return max(0, lines - 1)


def inspect_log(paths: Paths, features: FeatureSpec = None, *,
                ignore: Iterable[str] = (), ts_column: str | None = None) -> LogSchema:
    """Infer which columns of a log are features, and their kinds.

    Parameters
    ----------
    paths : path, glob pattern, directory, or a sequence of them
        Log files (``.parquet``, ``.pq``, ``.csv``, ``.tsv``), read in the given order.
    features : str, sequence of str, or mapping of str to {"single", "sequence"}, optional
        Requested feature columns (and, as a mapping, their kinds). By default every integer or
        list-of-integer column of the first file except ``ts`` and ``ignore`` (for CSV, every column
        whose first 1,000 values look like IDs; a column whose sampled cells all hold one ID is
        ``"single"``: declare sequences explicitly if their first rows are all of length 1).
    ignore : iterable of str
        Columns never inferred as features (e.g. labels).

    Returns
    -------
    LogSchema

    Raises
    ------
    LogError
        Unknown extension, damaged file, requested column missing or not integer-typed.
    """
    infos = [_inspect_file(p) for p in expand_log_paths(paths)]
    return _schema_of(infos, features, ignore, ts_column)


# ----------------------------------------------------------------------------- conversion
@dataclass
class _Col:
    """One feature of one chunk: IDs, per-row lengths and per-row problems."""

    values: np.ndarray                        # int64, sum(lengths)
    lengths: np.ndarray                       # int64, rows
    value_null: np.ndarray | None = None      # bool per value
    row_null: np.ndarray | None = None        # bool per row
    bad_id: np.ndarray | None = None          # bool per row


def _np_offsets(arr: pa.Array) -> np.ndarray:
    """Offsets of a (large) list / binary array as int64, length len(arr)+1, sliced correctly."""
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return np.asarray(arr.offsets).astype(np.int64, copy=False)
    buf = arr.buffers()[1]
    dt = np.int64 if (pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)) \
        else np.int32
    return np.frombuffer(buf, dtype=dt)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)


def _rows_of(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rows holding the given value positions, for row offsets ``offsets``."""
    return np.searchsorted(offsets, positions, side="right") - 1


def _row_mask(n: int, rows: np.ndarray) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    m[rows] = True
    return m


def _int_values(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(int64 values, null mask or None, overflow mask or None) of an integer arrow array."""
    nulls = None
    if pa.types.is_null(arr.type):
        return np.zeros(len(arr), np.int64), np.ones(len(arr), bool), None
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        arr = arr.fill_null(0)
    v = arr.to_numpy(zero_copy_only=False)
    over = None
    if v.dtype == np.uint64:
        o = v > np.uint64(_INT64_MAX)
        if o.any():
            over = o
        v = v.view(np.int64)
    return v.astype(np.int64, copy=False), nulls, over


def _convert_int(arr: pa.Array) -> _Col:
    v, nulls, over = _int_values(arr)
    n = len(arr)
    bad = None
    if over is not None:
        bad = over
    return _Col(v, np.ones(n, np.int64), value_null=nulls, bad_id=bad)


def _convert_list(arr: pa.Array) -> _Col:
    n = len(arr)
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        arr = pc.cast(arr, pa.large_list(t.value_type))
    off = _np_offsets(arr)
    child = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    off = off - off[0]
    lengths = np.diff(off)
    v, vnull, over = _int_values(child)
    row_null = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
    bad = None
    if over is not None:
        bad = _row_mask(n, _rows_of(off, np.flatnonzero(over)))
    return _Col(v, lengths, value_null=vnull, row_null=row_null, bad_id=bad)


def _ascii_only(arr: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Binary array -> string array, rows holding non-ASCII bytes nulled (and returned as a mask)."""
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = pc.cast(arr, pa.large_binary() if pa.types.is_large_string(arr.type)
                      else pa.binary())
    n = len(arr)
    bad = None
    if n:
        off = _np_offsets(arr)
        data = arr.buffers()[2]
        if data is not None and off[-1] > off[0]:
            raw = np.frombuffer(data, dtype=np.uint8)[off[0]:off[-1]]
            hi = np.flatnonzero(raw >= 0x80)
            if hi.size:
                bad = _row_mask(n, _rows_of(off - off[0], hi))
                arr = pc.if_else(pa.array(bad), pa.scalar(None, arr.type), arr)
    target = pa.large_string() if pa.types.is_large_binary(arr.type) else pa.string()
    return pc.cast(arr, target), bad


def _parse_ints(tokens: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """Decimal tokens (no whitespace) -> (int64 values, mask of unparseable tokens or None)."""
    try:
        return pc.cast(tokens, pa.int64()).to_numpy(zero_copy_only=False), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        s = pl.Series(tokens).cast(pl.Int64, strict=False)
        bad = s.is_null().to_numpy()
        return s.fill_null(0).to_numpy().astype(np.int64, copy=False), bad


def _separator_hint(token: str | None) -> str:
    """When a bad token is IDs joined by another separator (``"12,7,40"``): say how a cell
    separates IDs."""
    if not token:
        return ""
    for sep in (",", ";", "|", ":", "/"):
        parts = token.split(sep)
        if len(parts) > 1 and all(x.strip().isascii() and x.strip().isdigit() for x in parts):
            return (f"; IDs in a cell are separated by spaces, not {sep!r}: write "
                    f"{' '.join(x.strip() for x in parts[:3])!r}"
                    + (" ..." if len(parts) > 3 else ""))
    return ""


def _convert_text(arr: pa.Array) -> _Col:
    n = len(arr)
    s, non_ascii = _ascii_only(arr)
    trimmed = pc.ascii_trim_whitespace(s)
    row_null = s.is_null().to_numpy(zero_copy_only=False) if s.null_count else None
    if non_ascii is not None and row_null is not None:
        row_null = row_null & ~non_ascii
    empty = pc.equal(pc.binary_length(trimmed), 0).fill_null(False).to_numpy(zero_copy_only=False)
    lists = pc.ascii_split_whitespace(trimmed)
    off = _np_offsets(lists)
    toks = lists.values.slice(int(off[0]), int(off[-1] - off[0]))
    off = off - off[0]
    lengths = np.diff(off)
    if empty.any():                     # "" splits into one empty token: drop it
        keep = ~np.repeat(empty, lengths)
        toks = toks.filter(pa.array(keep))
        lengths = np.where(empty, 0, lengths)
        off = np.concatenate([[0], np.cumsum(lengths)])
    v, badtok = _parse_ints(toks)
    bad = non_ascii
    if badtok is not None and badtok.any():
        m = _row_mask(n, _rows_of(off, np.flatnonzero(badtok)))
        bad = m if bad is None else (bad | m)
    return _Col(v, lengths.astype(np.int64, copy=False), row_null=row_null, bad_id=bad)


def _convert_ts(arr: pa.Array) -> np.ndarray:
    """Timestamps in float seconds; NaN where null or unparseable. Integers beyond 2**53 are
    rounded to the nearest float (pyarrow's checked cast refuses them)."""
    t = arr.type

    def seconds(a: pa.Array) -> np.ndarray:
        return pc.cast(a, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(t):
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[t.unit]
        return seconds(pc.cast(arr, pa.int64())) / scale
    if pa.types.is_date32(t):
        return seconds(pc.cast(arr, pa.int32())) * 86400.0
    if pa.types.is_date64(t):
        return seconds(pc.cast(arr, pa.int64())) / 1e3
    if _is_int(t) or pa.types.is_floating(t) or pa.types.is_null(t):
        return seconds(arr).astype(np.float64)
    s, _ = _ascii_only(arr)
    ser = pl.Series(s).str.strip_chars()
    ts = ser.cast(pl.Float64, strict=False)
    fail = ts.is_null() & ser.is_not_null() & (ser.str.len_bytes() > 0)
    out = ts.fill_null(np.nan).to_numpy().astype(np.float64, copy=True)
    if fail.any():
        idx = np.flatnonzero(fail.to_numpy())
        try:
            dt = ser.gather(idx).str.to_datetime(strict=False, time_unit="us")
            sec = dt.dt.epoch("us").cast(pl.Float64) / 1e6
            out[idx] = sec.fill_null(np.nan).to_numpy()
        except pl.exceptions.PolarsError:
            pass
    return out


def _convert(arr: pa.Array, text: bool) -> _Col:
    t = arr.type
    if text or _is_text(t):
        return _convert_text(arr)
    if _is_int(t) or pa.types.is_null(t):
        return _convert_int(arr)
    return _convert_list(arr)


# ----------------------------------------------------------------------------- chunks
@dataclass
class _Part:
    """Validated rows ready to batch: per feature (values, lengths), timestamps."""

    values: list[np.ndarray]
    lengths: list[np.ndarray]
    ts: np.ndarray | None
    n: int

    def split(self, k: int) -> tuple["_Part", "_Part"]:
        va, vb, la, lb = [], [], [], []
        for v, l in zip(self.values, self.lengths):
            cut = int(l[:k].sum())
            va.append(v[:cut])
            vb.append(v[cut:])
            la.append(l[:k])
            lb.append(l[k:])
        ta = tb = None
        if self.ts is not None:
            ta, tb = self.ts[:k], self.ts[k:]
        return _Part(va, la, ta, k), _Part(vb, lb, tb, self.n - k)


class _Rebatcher:
    """Cuts a stream of parts into batches of exactly ``size`` samples (the last smaller)."""

    def __init__(self, keys: tuple[str, ...], size: int):
        self.keys = keys
        self.size = size
        self.parts: deque[_Part] = deque()
        self.n = 0

    def add(self, part: _Part) -> Iterator[Batch]:
        if part.n:
            self.parts.append(part)
            self.n += part.n
        while self.n >= self.size:
            yield self._take(self.size)

    def flush(self) -> Iterator[Batch]:
        if self.n:
            yield self._take(self.n)

    def _take(self, k: int) -> Batch:
        taken: list[_Part] = []
        need = k
        while need:
            p = self.parts[0]
            if p.n <= need:
                taken.append(self.parts.popleft())
                need -= p.n
            else:
                a, b = p.split(need)
                taken.append(a)
                self.parts[0] = b
                need = 0
        self.n -= k
        nf = len(self.keys)
        vals = [p.values[i] for i in range(nf) for p in taken]
        lens = [p.lengths[i] for i in range(nf) for p in taken]
        values = vals[0] if len(vals) == 1 else np.concatenate(vals)
        lengths = lens[0] if len(lens) == 1 else np.concatenate(lens)
        ts = None
        if taken[0].ts is not None:
            ts = taken[0].ts if len(taken) == 1 else np.concatenate([p.ts for p in taken])
        return Batch(self.keys, values, lengths, timestamp=ts)


@dataclass
class _Malformed:
    row: int          # 0-based data row within the file
    line: int         # 1-based physical line (header = 1)
    text: str
    expected: int
    actual: int


def _fmt_value(v: Any, limit: int = 80) -> str:
    r = repr(v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v)
    return r if len(r) <= limit else r[:limit - 4] + "...'"


# ----------------------------------------------------------------------------- reader
@renamed_keywords(REMOVED_IN, batch_size="read_batch_size")
class LogReader:
    """Stream a log (parquet / CSV files) as :class:`~.batch.Batch` objects.

    Iterating yields batches of exactly ``read_batch_size`` samples (the last one may be smaller), in
    file order; batches span file boundaries. Each batch has ``keys`` = the feature names, and
    per-sample ``timestamp`` (float64 seconds) when the log has ``ts``. Iterating again re-reads
    the files and resets the counters. A batch's arrays may be read-only views of arrow memory
    (zero-copy when a batch is one feature from one chunk): copy before writing into them.

    Parameters
    ----------
    paths : path, glob pattern, directory, or a sequence of them
        Log files, read in the given order (a directory or a glob in sorted name order).
    features : str, sequence of str, or mapping of str to {"single", "sequence"}, optional
        Feature columns to read; default: inferred by :func:`inspect_log`.
    read_batch_size : int
        Samples per batch read (the read chunk: memory is bounded by it). ``batch_size`` is its
        deprecated name (one release).
    skip_bad_rows : bool
        Drop bad rows and count them instead of raising :class:`LogError`.
    null_as_empty : bool
        Read a null ID / null sequence as "no ID" (length 0) instead of a bad row.
    ts : bool or None
        Use the time column: None = if every file has one (raises if only some do), True =
        require it, False = ignore it.
    ts_column : str, optional
        The time column (``--ts COLUMN``); default ``ts``, else the first of
        :data:`TIME_COLUMNS` (``timestamp``, ``time``, ``event_time``) every file has: a column
        named like time is never read as a table of IDs.
    ignore : iterable of str
        Columns never inferred as features.
    row_groups : sequence of int, optional
        Read only these row groups (ascending) of a single parquet file, e.g. one task's share of
        a large file; bad-row messages keep the row numbers of the whole file.
    rows : RowMap, optional
        Map IDs to table rows (``raw``: checked against the tables' ``num_rows``; ``hash``: ID
        mod rows). A row with an ID out of range is a bad row (``"out_of_range"``, counted only
        when ``rows`` is given).

    Attributes
    ----------
    schema : LogSchema
    files : list of Path
    file_infos : tuple of LogFileInfo
        Format and footer row count of every file, in reading order.
    read_batch_size : int
    skipped : dict of str to int
        Rows dropped per reason (see :data:`REASONS`), all files.
    skipped_by_file : dict of str to dict of str to int
        Rows dropped per file and reason.
    rows_read : int
        Data rows read from the files, bad ones included.
    samples : int
        Samples yielded.
    """

    batch_size = renamed_property("batch_size", "read_batch_size", REMOVED_IN)

    def __init__(self, paths: Paths, features: FeatureSpec = None, read_batch_size: int = 65536,
                 *, skip_bad_rows: bool = False, null_as_empty: bool = False,
                 ts: bool | None = None, ignore: Iterable[str] = (),
                 row_groups: Sequence[int] | None = None, rows: "RowMap | None" = None,
                 ts_column: str | None = None):
        if isinstance(read_batch_size, bool) or not isinstance(read_batch_size, (int, np.integer)) \
                or read_batch_size < 1:
            raise LogError(f"read_batch_size must be a positive integer (samples per batch read), "
                           f"got {read_batch_size!r}")
        self.files = expand_log_paths(paths)
        self._infos = [_inspect_file(p) for p in self.files]
        self.row_groups = None if row_groups is None else [int(g) for g in row_groups]
        if self.row_groups is not None and (
                len(self._infos) != 1 or self._infos[0].path.suffix.lower() not in PARQUET_EXT):
            raise LogError(f"row_groups needs exactly one parquet file, got {self.files}")
        self.schema = _schema_of(self._infos, features, ignore, ts_column)
        self.ts_column = self.schema.ts_column or TS_COLUMN
        have = [self.ts_column in i.types for i in self._infos]
        if ts is None:
            if any(have) and not all(have):
                lacking = [str(i.path) for i, h in zip(self._infos, have) if not h]
                raise LogError(f"only some files have a {self.ts_column!r} column; missing in "
                               f"{lacking}; pass ts=False to ignore timestamps")
            self.use_ts = all(have)
        elif ts:
            for i, h in zip(self._infos, have):
                if not h:
                    raise _fail(i.path, f"column {self.ts_column!r} is missing (ts=True); the file has "
                                        f"columns {i.columns}")
            self.use_ts = True
        else:
            self.use_ts = False
        self.read_batch_size = int(read_batch_size)
        self.skip_bad_rows = bool(skip_bad_rows)
        self.null_as_empty = bool(null_as_empty)
        self.rows = rows
        self._reset()

    def _reset(self) -> None:
        self.skipped_by_file: dict[str, dict[str, int]] = {
            str(p): dict.fromkeys(REASONS + ((OUT_OF_RANGE,) if self.rows else ()), 0)
            for p in self.files}
        self.rows_read = 0
        self.samples = 0

    @property
    def file_infos(self) -> tuple[LogFileInfo, ...]:
        """Path, format and footer row count of every file, in reading order."""
        return tuple(LogFileInfo(i.path, i.fmt, i.num_rows) for i in self._infos)

    def data_rows(self) -> int:
        """Data rows of the whole log, bad rows included, without reading it: parquet footers and
        CSV line counts (:meth:`LogFileInfo.data_rows`)."""
        return sum(f.data_rows() for f in self.file_infos)

    @property
    def skipped(self) -> dict[str, int]:
        """Rows dropped per reason, summed over files."""
        out = dict.fromkeys(REASONS, 0)
        for counts in self.skipped_by_file.values():
            for r, c in counts.items():
                out[r] = out.get(r, 0) + c
        return out

    def __repr__(self) -> str:
        return (f"LogReader({len(self.files)} file(s), features={dict(self.schema.features)}, "
                f"ts={self.use_ts}, read_batch_size={self.read_batch_size})")

    def __iter__(self) -> Iterator[Batch]:
        self._reset()
        reb = _Rebatcher(self.schema.keys, self.read_batch_size)
        for info in self._infos:
            start = self.rows_read - _first_row_read(info, self.row_groups)
            for part in self._file_parts(info):
                if self.rows is not None:
                    part = _map_part(self.rows, part, self.schema.keys, info.path,
                                     self.rows_read - part.n - start, self.skip_bad_rows,
                                     self.skipped_by_file[str(info.path)])
                for b in reb.add(part):
                    self.samples += b.batch_size
                    yield b
        for b in reb.flush():
            self.samples += b.batch_size
            yield b

    # ------------------------------------------------------------------ per file
    def _file_parts(self, info: _FileInfo) -> Iterator[_Part]:
        if info.fmt == "parquet":
            yield from self._parquet_parts(info)
        else:
            yield from self._csv_parts(info)

    def _columns(self) -> list[str]:
        cols = list(self.schema.keys)
        return cols + [self.ts_column] if self.use_ts else cols

    def _parquet_parts(self, info: _FileInfo) -> Iterator[_Part]:
        pf = open_parquet(info.path)
        try:
            if self.row_groups is None:
                it = pf.iter_batches(batch_size=self.read_batch_size, columns=self._columns(),
                                     use_threads=True)
                row = 0
            else:
                md = pf.metadata
                if self.row_groups and not (0 <= min(self.row_groups)
                                            and max(self.row_groups) < md.num_row_groups):
                    raise _fail(info.path, f"row groups {self.row_groups} out of range: the file "
                                           f"has {md.num_row_groups}")
                it = pf.iter_batches(batch_size=self.read_batch_size, row_groups=self.row_groups,
                                     columns=self._columns(), use_threads=True)
                row = sum(md.row_group(i).num_rows for i in range(self.row_groups[0])) \
                    if self.row_groups else 0
            while True:
                try:
                    rb = next(it)
                except StopIteration:
                    break
                except (pa.ArrowException, OSError, ValueError) as e:
                    raise self._parquet_damage(pf, info.path, row, e) from None
                n = rb.num_rows
                self.rows_read += n
                part = self._validate(info, rb, lambda i, r0=row: r0 + i, [], 0)
                row += n
                yield part
        finally:
            pf.close()

    def _parquet_damage(self, pf: pq.ParquetFile, path: Path, row: int, err: Exception
                        ) -> LogError:
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        first = int(np.searchsorted(starts, row, side="right") - 1)
        first = min(max(first, 0), max(md.num_row_groups - 1, 0))
        # the reader reads ahead: look for the damaged row group and column from here on
        found: tuple[int, str] | None = None
        for rg in range(first, min(first + 4, md.num_row_groups)):
            for c in self._columns():
                try:
                    pf.read_row_group(rg, columns=[c])
                except (pa.ArrowException, OSError, ValueError):
                    found = (rg, c)
                    break
            if found:
                break
        if found is None:
            return _fail(path, f"damaged or truncated parquet data at or after row {row} "
                               f"(0-based within this file): {err}")
        rg, c = found
        return _fail(path, f"damaged or truncated parquet data in row group {rg} (rows "
                           f"{int(starts[rg])}..{int(starts[rg + 1]) - 1}, 0-based within this "
                           f"file), column {c!r}: {err}; rows before {row} were read")

    def _csv_parts(self, info: _FileInfo) -> Iterator[_Part]:
        mal_rows: list[int] = []          # data rows of malformed lines, in file order
        first: list[_Malformed] = []      # details of the first malformed line

        def on_bad(r: Any) -> str:        # called by pyarrow once per malformed line
            line = int(r.number) if r.number is not None else -1
            mal_rows.append(line - 2 if line > 0 else -1)
            if not first:
                first.append(_Malformed(mal_rows[-1], line, r.text, r.expected_columns,
                                        r.actual_columns))
            return "skip"

        undecodable = _Undecodable()
        reader = _csv_reader(info.path, info.delimiter, info.columns, self._columns(), on_bad,
                             undecodable)
        valid = 0                          # well-formed rows seen so far
        due = 0                            # malformed rows accounted for so far
        shift = np.zeros(0, np.int64)      # mal_rows[j] - j: maps well-formed index -> file row
        while True:
            try:
                rb = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowException, OSError, ValueError) as e:
                at = valid + len(mal_rows)
                raise _fail(info.path, f"damaged CSV data at or after row {at} (0-based within "
                                       f"this file): {e}{undecodable.why()}") from None
            n = rb.num_rows
            if len(mal_rows) > shift.size:
                new = np.asarray(mal_rows[shift.size:], np.int64)
                shift = np.concatenate([shift, new - np.arange(shift.size, len(mal_rows))])

            def row_of(i: int, v0: int = valid, shift: np.ndarray = shift) -> int:
                v = v0 + i
                return int(v + np.searchsorted(shift, v, side="right"))

            end = row_of(n - 1) if n else -1
            k = int(np.searchsorted(np.asarray(mal_rows[due:], np.int64), end, side="right"))
            part = self._validate(info, rb, row_of, first if (k and due == 0) else [], k)
            self.rows_read += n + k
            due += k
            valid += n
            yield part
        rest = len(mal_rows) - due
        if rest:
            self._malformed(info, first if due == 0 else [], rest)
            self.rows_read += rest

    def _malformed(self, info: _FileInfo, first: list[_Malformed], count: int) -> None:
        """Account for ``count`` malformed lines (raise on the first one unless skipping)."""
        if not count:
            return
        if not self.skip_bad_rows:
            m = first[0]
            row = f"row {m.row} (0-based within this file, line {m.line})" if m.row >= 0 \
                else "a row"
            raise _fail(info.path, f"{row}: malformed CSV line with {m.actual} field(s), "
                                   f"expected {m.expected}: {_fmt_value(m.text)}; pass "
                                   f"skip_bad_rows=True to drop and count such rows")
        self.skipped_by_file[str(info.path)]["malformed"] += count

    # ------------------------------------------------------------------ validation
    def _validate(self, info: _FileInfo, rb: pa.RecordBatch, row_of: Callable[[int], int],
                  first_malformed: list[_Malformed], n_malformed: int) -> _Part:
        """Convert and check one chunk; raise on the first problem or drop and count bad rows.

        ``n_malformed`` malformed CSV lines fall before the end of this chunk; the first of them
        is described by ``first_malformed`` if it is the first of the file.
        """
        n = rb.num_rows
        keys = self.schema.keys
        text = info.fmt == "csv"
        cols: list[_Col] = []
        # (reason, column, row mask) in attribution order
        problems: list[tuple[str, str, np.ndarray]] = []
        ts = None
        if self.use_ts:
            ts = _convert_ts(rb.column(self.ts_column))
            bad = ~np.isfinite(ts)
            if bad.any():
                problems.append(("bad_ts", self.ts_column, bad))
        by_reason: dict[str, list[tuple[str, np.ndarray]]] = {"bad_id": [], "null_id": [],
                                                              "negative_id": []}
        for name in keys:
            kind = self.schema.features[name]
            c = _convert(rb.column(name), text)
            lengths = c.lengths
            row_null = c.row_null
            if kind == "single":
                zero = lengths == 0
                if zero.any():
                    row_null = zero if row_null is None else (row_null | zero)
                multi = lengths > 1
                if multi.any():
                    c.bad_id = multi if c.bad_id is None else (c.bad_id | multi)
            if c.bad_id is not None and c.bad_id.any():
                by_reason["bad_id"].append((name, c.bad_id))
            vnull = c.value_null
            if vnull is not None and not vnull.any():
                vnull = None
            if row_null is not None and not row_null.any():
                row_null = None
            if vnull is not None or row_null is not None:
                if self.null_as_empty:
                    keep_v = np.ones(c.values.size, bool) if vnull is None else ~vnull
                    if row_null is not None:
                        keep_v &= ~np.repeat(row_null, lengths)
                    rows = np.repeat(np.arange(n), lengths)
                    c.values = c.values[keep_v]
                    c.lengths = np.bincount(rows[keep_v], minlength=n).astype(np.int64)
                else:
                    m = np.zeros(n, bool) if row_null is None else row_null.copy()
                    if vnull is not None:
                        m[_rows_of(np.concatenate([[0], np.cumsum(lengths)]),
                                   np.flatnonzero(vnull))] = True
                    by_reason["null_id"].append((name, m))
            neg = c.values < 0                   # null slots hold 0 (see _int_values)
            if neg.any():
                off = np.concatenate([[0], np.cumsum(c.lengths)])
                by_reason["negative_id"].append(
                    (name, _row_mask(n, _rows_of(off, np.flatnonzero(neg)))))
            cols.append(c)
        for reason in ("bad_id", "null_id", "negative_id"):
            problems.extend((reason, col, m) for col, m in by_reason[reason])

        if not self.skip_bad_rows and problems:
            first_bad = min(int(np.argmax(m)) for _, _, m in problems)
            if not (first_malformed and first_malformed[0].row < row_of(first_bad)):
                reason, col = next((r, c) for r, c, m in problems if m[first_bad])
                raise self._row_error(info, rb, reason, col, first_bad, row_of(first_bad))
        self._malformed(info, first_malformed, n_malformed)

        part = _Part([c.values for c in cols], [c.lengths for c in cols], ts, n)
        if problems:
            counts = self.skipped_by_file[str(info.path)]
            remaining = np.zeros(n, bool)
            for _, _, m in problems:
                remaining |= m
            keep = ~remaining
            for reason in REASONS:
                for r, _, m in problems:
                    if r == reason:
                        hit = m & remaining
                        counts[reason] += int(hit.sum())
                        remaining &= ~hit
            part = _Part([v[np.repeat(keep, l)] for v, l in zip(part.values, part.lengths)],
                         [l[keep] for l in part.lengths],
                         None if ts is None else ts[keep], int(keep.sum()))
        return part

    def _row_error(self, info: _FileInfo, rb: pa.RecordBatch, reason: str, column: str,
                   i: int, row: int) -> LogError:
        raw = rb.column(column)[i].as_py()
        shown = _fmt_value(raw)
        kind = self.schema.features.get(column)
        csv_cell = info.fmt == "csv"
        if reason == "bad_ts":
            what = (f"timestamp {shown} is null, NaN, infinite or not a number of seconds / an "
                    f"ISO-8601 datetime")
        elif reason == "null_id":
            if csv_cell:
                what = f"empty cell ({shown}): null ID in a 'single' column"
            elif raw is None:
                what = "null ID" if kind == "single" else "null sequence"
            else:
                what = f"null ID in {shown}"
            what += "; pass null_as_empty=True to read nulls as samples without an ID"
        elif reason == "negative_id":
            what = f"negative ID in {shown}; IDs must be >= 0"
        else:  # bad_id
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            if isinstance(text, str):
                toks = text.split()
                badtok = next((t for t in toks if not (t.lstrip("-+").isascii()
                                                       and t.lstrip("-+").isdigit())), None)
                if kind == "single" and len(toks) > 1 and badtok is None:
                    what = (f"{shown} holds {len(toks)} IDs but feature {column!r} is 'single'; "
                            f"declare it with features={{{column!r}: 'sequence'}}")
                else:
                    what = (f"{shown} is not {'an integer ID' if kind == 'single' else 'a list of IDs'}"
                            + (f" ({_fmt_value(badtok)} is not a decimal integer)"
                               if badtok is not None else " (ID does not fit in int64)")
                            + _separator_hint(badtok))
            elif isinstance(raw, list) and kind == "single":
                what = (f"{shown} holds {len(raw)} IDs but feature {column!r} is declared "
                        f"'single'")
            else:
                what = f"ID in {shown} does not fit in int64"
        line = f", line {row + 2}" if csv_cell else ""
        return _fail(info.path, f"row {row} (0-based within this file{line}), column {column!r}: "
                                f"{what}; pass skip_bad_rows=True to drop and count bad rows")


@renamed_keywords(REMOVED_IN, batch_size="read_batch_size")
def read_log(paths: Paths, features: FeatureSpec = None, read_batch_size: int = 65536, *,
             skip_bad_rows: bool = False, null_as_empty: bool = False, ts: bool | None = None,
             ignore: Iterable[str] = (), rows: "RowMap | None" = None) -> Iterator[Batch]:
    """Stream a log as batches; a thin wrapper over :class:`LogReader` (use it for the counts).

    Parameters
    ----------
    See :class:`LogReader`.

    Yields
    ------
    Batch
        ``read_batch_size`` samples each (the last may be smaller), keys = feature names,
        per-sample timestamps (float64 seconds) if the log has ``ts``.
    """
    return iter(LogReader(paths, features, read_batch_size, skip_bad_rows=skip_bad_rows,
                          null_as_empty=null_as_empty, ts=ts, ignore=ignore, rows=rows))


# ----------------------------------------------------------------------------- max IDs
def log_max_ids(paths: Paths, features: FeatureSpec = None, *,
                ignore: Iterable[str] = ()) -> dict[str, int]:
    """Largest ID per feature over all files, computed lazily (streaming) with polars.

    Parameters
    ----------
    paths : see :func:`inspect_log`
    features : see :func:`inspect_log`; default: inferred.
    ignore : iterable of str
        Columns never inferred as features.

    Returns
    -------
    dict of str to int
        Largest ID per feature; -1 if the feature holds no ID. A table needs ``max + 1`` rows.
        Rows are not validated (use :func:`read_log` for that): unparseable CSV tokens and nulls
        are ignored.
    """
    files = expand_log_paths(paths)
    infos = [_inspect_file(p) for p in files]
    schema = _schema_of(infos, features, ignore)
    frames = []
    for info in infos:
        if info.fmt == "parquet":
            lf = pl.scan_parquet(info.path)
            exprs = []
            for name in schema.keys:
                t = info.types[name]
                col = pl.col(name)
                if _is_text(t):
                    col = col.cast(pl.String).str.extract_all(r"\S+").list.eval(
                        pl.element().cast(pl.Int64, strict=False))
                    t = pa.large_list(pa.int64())
                if _is_list(t):
                    col = col.list.max()
                exprs.append(col.max().cast(pl.Int64).alias(name))
        else:
            lf = pl.scan_csv(info.path, separator=info.delimiter, infer_schema=False,
                             truncate_ragged_lines=True)
            exprs = [pl.col(n).str.extract_all(r"\S+").list.eval(
                pl.element().cast(pl.Int64, strict=False)).list.max().max().alias(n)
                     for n in schema.keys]
        frames.append(lf.select(exprs))
    try:
        results = pl.collect_all(frames, engine="streaming")
    except pl.exceptions.PolarsError as e:
        raise LogError(f"could not scan {[str(f) for f in files]} for max IDs ({e}); "
                       f"read_log names the bad file and row") from None
    out: dict[str, int] = {}
    for name in schema.keys:
        vals = [r[name][0] for r in results if r[name][0] is not None]
        out[name] = int(max(vals)) if vals else -1
    return out


# ----------------------------------------------------------------------------- ID modes
def _map_part(rows: RowMap, part: _Part, keys: Sequence[str], path: Path, first_row: int,
              skip: bool, counts: dict[str, int]) -> _Part:
    """One chunk of a file with its IDs mapped by ``rows``. Out-of-range samples raise
    :class:`LogError` naming the file, the row (``first_row`` + index: without skipping, a
    chunk's rows are consecutive) and the column, or are dropped and counted in ``counts``."""
    values, bad_rows = [], None
    for name, v, lens in zip(keys, part.values, part.lengths):
        mapped, bad = rows.map_values(name, v)
        if bad is not None:
            hit = _row_mask(part.n, _rows_of(np.concatenate([[0], np.cumsum(lens)]),
                                             np.flatnonzero(bad)))
            if not skip:
                i = int(np.argmax(hit))
                first = int(np.flatnonzero(bad)[0])
                raise _fail(path, f"row {first_row + i} (0-based within this file), column "
                                  f"{name!r}: ID {int(v[first])} out of range: the table has "
                                  f"num_rows {rows.num_rows[name]:,} (IDs 0.."
                                  f"{rows.num_rows[name] - 1:,}); {RANGE_FIXES}")
            bad_rows = hit if bad_rows is None else (bad_rows | hit)
        values.append(mapped)
    mapped_part = _Part(values, part.lengths, part.ts, part.n)
    if bad_rows is None:
        return mapped_part
    keep = ~bad_rows
    counts[OUT_OF_RANGE] = counts.get(OUT_OF_RANGE, 0) + int(bad_rows.sum())
    return _Part([v[np.repeat(keep, l)] for v, l in zip(values, part.lengths)],
                 [l[keep] for l in part.lengths], None if part.ts is None else part.ts[keep],
                 int(keep.sum()))


def _first_row_read(info: _FileInfo, row_groups: Sequence[int] | None) -> int:
    """The file row (0-based) where reading starts: 0, or the first row of the first row group
    read (``LogReader(row_groups=...)``)."""
    if not row_groups:
        return 0
    pf = open_parquet(info.path)
    try:
        md = pf.metadata
        return sum(md.row_group(i).num_rows for i in range(min(row_groups[0], md.num_row_groups)))
    finally:
        pf.close()
