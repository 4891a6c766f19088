"""Embedding tables: what a plan places (rows, dimension, element size, optimizer state).

Notation of ``DESIGN.md`` section 3: table t has H rows of dimension D, e bytes per element and s bytes
of optimizer state per row. A lookup moves one embedding vector of ``D * e`` bytes; a stored row takes
``D * e + s`` bytes.

TOML layout
-----------
::

    [[table]]
    name = "item_history"        # required, unique
    feature = "item_history"     # log column / batch key feeding the table; default: name
    num_rows = 100000000         # H, required
    dim = 128                    # D, required
    dtype = "fp32"               # fp32, fp16 or bf16 (e = 4, 2, 2 bytes); default fp32
    kind = "sequence"            # "sequence" or "pooled"; default sequence
    optimizer_state_bytes = 4    # s, bytes per row; default 0

``data/tables.example.toml`` is a commented example; ``flexshard-stream tables LOG... --out
tables.toml`` writes one sized for a log (:func:`size_tables`).

Table sizes and ID modes
------------------------
A log's IDs become rows by an ID mode (:class:`~flexshard_stream.sources.logs.IdMode`): ``raw``
(an ID is its row, so a table needs more rows than the largest ID of every log it will see) or
``hash`` / ``hash:ROWS`` (row = ID mod rows, TorchRec's modulo hashing, for raw sparse IDs such as
9-digit item IDs or 64-bit hashes). Sizes inferred from a log carry a headroom factor: the next
log's IDs go beyond the largest one seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, FlexShardError
from ..formats.toml import read_toml, toml_value, write_text_atomic
from ..sources.ids import DEFAULT_HEADROOM, IdMode, RowMap
from ..sources.logs import FeatureSpec, Paths, inspect_log, log_max_ids
from .topology import PathLike

__all__ = ["DTYPE_BYTES", "TABLE_KINDS", "EmbeddingTable", "load_tables", "save_tables",
           "infer_tables", "tables_by_feature", "row_map", "TableSizing", "size_tables",
           "DEFAULT_HEADROOM", "SPARSE_FACTOR"]

#: Bytes per element of each supported dtype (e).
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
#: Table kinds: a sequence table returns one vector per ID; a pooled table one sum per sample.
TABLE_KINDS: tuple[str, ...] = ("sequence", "pooled")

_KEYS = ("name", "feature", "num_rows", "dim", "dtype", "kind", "optimizer_state_bytes")
_REQUIRED = ("name", "num_rows", "dim")
_LOG_KIND = {"sequence": "sequence", "single": "pooled"}
#: Largest table: row counts (and IDs) are int64, so at most 2**63 - 1 rows (IDs 0 .. 2**63 - 2).
MAX_ROWS = 2**63 - 1
#: Largest embedding dimension accepted (elements per row); real models use up to a few thousand.
MAX_DIM = 1 << 20
#: Largest optimizer state per row accepted (bytes).
MAX_STATE_BYTES = 1 << 32
#: A feature's IDs are called sparse when its ID range is this many times its distinct IDs.
SPARSE_FACTOR = 8.0


def _as_int(value: Any, where: str, minimum: int, maximum: int) -> int:
    """``value`` as an int in ``[minimum, maximum]``; integral floats (``1e8`` in TOML) are
    accepted."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} = {value!r}: must be an integer, got bool")
    if isinstance(value, (int, np.integer)):
        v = int(value)
    elif isinstance(value, (float, np.floating)) and math.isfinite(value) \
            and float(value).is_integer() and abs(value) < 2**53:
        v = int(value)
    else:
        raise ConfigError(f"{where} = {value!r}: must be an integer, got {type(value).__name__}")
    if v < minimum:
        cond = "> 0" if minimum == 1 else f">= {minimum}"
        raise ConfigError(f"{where} = {value!r}: must be {cond}")
    if v > maximum:
        raise ConfigError(f"{where} = {value!r}: must be at most {maximum:,}")
    return v


@dataclass(frozen=True)
class EmbeddingTable:
    """One embedding table.

    Parameters
    ----------
    name : str
        Unique table name (non-empty).
    num_rows : int
        H, rows (> 0).
    dim : int
        D, elements per row (> 0).
    dtype : {"fp32", "fp16", "bf16"}
        Element type; e = ``DTYPE_BYTES[dtype]`` bytes.
    kind : {"sequence", "pooled"}
        Sequence: one vector per looked-up ID; pooled: one sum per sample.
    feature : str
        Log column / batch key feeding the table; ``""`` means ``name``.
    optimizer_state_bytes : int
        s, bytes of optimizer state stored per row (>= 0).

    Raises
    ------
    ConfigError
        Empty name, non-positive ``num_rows`` or ``dim``, unknown dtype or kind, negative
        ``optimizer_state_bytes``.
    """

    name: str
    num_rows: int
    dim: int
    dtype: str = "fp32"
    kind: str = "sequence"
    feature: str = ""
    optimizer_state_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table name = {self.name!r}: must be a non-empty string")
        where = f"table {self.name!r}:"
        object.__setattr__(self, "num_rows",
                           _as_int(self.num_rows, f"{where} num_rows", 1, MAX_ROWS))
        object.__setattr__(self, "dim", _as_int(self.dim, f"{where} dim", 1, MAX_DIM))
        object.__setattr__(self, "optimizer_state_bytes",
                           _as_int(self.optimizer_state_bytes, f"{where} optimizer_state_bytes", 0,
                                   MAX_STATE_BYTES))
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"{where} dtype = {self.dtype!r}: unknown; valid dtypes: "
                              f"{list(DTYPE_BYTES)}")
        if not isinstance(self.kind, str) or self.kind not in TABLE_KINDS:
            raise ConfigError(f"{where} kind = {self.kind!r}: unknown; valid kinds: "
                              f"{list(TABLE_KINDS)}")
        if not isinstance(self.feature, str):
            raise ConfigError(f"{where} feature = {self.feature!r}: must be a string")
        if not self.feature:
            object.__setattr__(self, "feature", self.name)

    @property
    def element_bytes(self) -> int:
        """e, bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def embedding_bytes(self) -> int:
        """D * e, bytes of one row's vector (what a lookup or a gradient moves)."""
        return self.dim * self.element_bytes

    @property
    def row_bytes(self) -> int:
        """D * e + s, bytes stored per row (vector plus optimizer state)."""
        return self.embedding_bytes + self.optimizer_state_bytes

    @property
    def table_bytes(self) -> int:
        """H * (D * e + s), bytes of the whole table."""
        return self.num_rows * self.row_bytes

    def to_dict(self) -> dict[str, Any]:
        """All fields, in the TOML key order."""
        return {k: getattr(self, k) for k in _KEYS}


def _table_from_entry(entry: Any, i: int, src: str) -> EmbeddingTable:
    where = f"{src}: [[table]] entry {i} (0-based)"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a table, got {entry!r}")
    if isinstance(entry.get("name"), str):
        where += f", name {entry['name']!r}"
    unknown = [k for k in entry if k not in _KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (value {entry[unknown[0]]!r}); "
                          f"known keys: {list(_KEYS)}")
    for key in _REQUIRED:
        if key not in entry:
            raise ConfigError(f"{where}: missing the required key {key!r}")
    for key in ("name", "feature", "dtype", "kind"):
        if key in entry and not isinstance(entry[key], str):
            raise ConfigError(f"{where}: {key} = {entry[key]!r}: must be a string")
    try:
        return EmbeddingTable(**entry)
    except ConfigError as e:
        raise ConfigError(f"{src}: [[table]] entry {i} (0-based), {e}") from None


def tables_from_dict(d: Mapping[str, Any], *, source: str | None = None) -> list[EmbeddingTable]:
    """Tables from the TOML layout (a mapping with a ``table`` array of tables).

    Raises
    ------
    ConfigError
        No ``[[table]]``, unknown keys, missing required keys (naming the entry), invalid values,
        duplicate names.
    """
    src = source or "<tables dict>"
    if not isinstance(d, Mapping):
        raise ConfigError(f"{src}: expected a mapping with [[table]] entries, got {type(d).__name__}")
    unknown = [k for k in d if k != "table"]
    if unknown:
        raise ConfigError(f"{src}: unknown top-level key(s) {unknown}; known keys: ['table'] "
                          f"([[table]] entries)")
    entries = d.get("table")
    if not entries:
        raise ConfigError(f"{src}: no [[table]] entries")
    if not isinstance(entries, list):
        raise ConfigError(f"{src}: table = {entries!r}: must be an array of tables ([[table]])")
    tables = [_table_from_entry(e, i, src) for i, e in enumerate(entries)]
    _check_unique_names(tables, src)
    return tables


def _check_unique_names(tables: Sequence[EmbeddingTable], src: str) -> None:
    first: dict[str, int] = {}
    for i, t in enumerate(tables):
        if t.name in first:
            raise ConfigError(f"{src}: duplicate table name {t.name!r} (entries {first[t.name]} "
                              f"and {i}, 0-based)")
        first[t.name] = i


def load_tables(path: PathLike) -> list[EmbeddingTable]:
    """Read a TOML file of ``[[table]]`` entries (layout in the module docstring).

    Raises
    ------
    FormatError
        The file cannot be read or is not valid TOML.
    ConfigError
        Invalid content (see :func:`tables_from_dict`); the message names the file.
    """
    return tables_from_dict(read_toml(path), source=str(path))


def save_tables(tables: Iterable[EmbeddingTable], path: PathLike, *,
                header: Sequence[str] = (), notes: Mapping[str, str] | None = None) -> None:
    """Write tables as TOML, every field explicit; ``load_tables`` reads back equal tables.

    ``header`` lines and ``notes[name]`` (one comment above a table's entry) are written as TOML
    comments: where the sizes came from.

    Raises
    ------
    ConfigError
        No tables, a non-table item, or duplicate names.
    """
    tables = list(tables)
    if not tables:
        raise ConfigError(f"{path}: no tables to save")
    for i, t in enumerate(tables):
        if not isinstance(t, EmbeddingTable):
            raise ConfigError(f"{path}: item {i} is not an EmbeddingTable: {t!r}")
    _check_unique_names(tables, str(path))
    lines = ["# Embedding tables (flexshard_stream.plans.tables): H = num_rows, D = dim, e = dtype bytes,",
             "# s = optimizer_state_bytes per row."]
    lines += [f"# {h}" for h in header]
    for t in tables:
        note = (notes or {}).get(t.name)
        lines += [""] + ([f"# {note}"] if note else []) + ["[[table]]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in t.to_dict().items()]
    write_text_atomic(path, "\n".join(lines) + "\n", kind="tables")


def infer_tables(log_paths: Paths, features: FeatureSpec = None, dim: int = 128,
                 dtype: str = "fp32", *, optimizer_state_bytes: int = 0,
                 ignore: Iterable[str] = (), headroom: float = 1.0,
                 ids: IdMode | str | None = None,
                 ts_column: str | None = None) -> list[EmbeddingTable]:
    """One table per feature of a log, sized by the largest ID seen (times ``headroom``), or
    ``ROWS`` rows each with ``ids="hash:ROWS"``.

    Parameters
    ----------
    log_paths : path, glob, directory or sequence of them
        Log files (see :func:`flexshard_stream.sources.logs.inspect_log`).
    features : optional
        Feature columns (and kinds) to use; default: every ID column (see ``inspect_log``).
    dim : int
        D of every table.
    dtype : str
        Element type of every table.
    optimizer_state_bytes : int
        s of every table, bytes per row.
    ignore : iterable of str
        Columns never inferred as features (labels, ...).
    headroom : float
        ``num_rows = ceil(headroom * (largest ID + 1))`` (>= 1): room for the IDs later logs add.
    ids : IdMode or str
        ``raw`` (default) or ``hash:ROWS`` (every table ``ROWS`` rows; the log's IDs are not
        scanned). ``hash`` without ``ROWS`` needs distinct counts: see :func:`size_tables`.

    Returns
    -------
    list of EmbeddingTable
        In log column order; name = feature = column; ``num_rows`` as above; kind
        ``"sequence"`` for list columns and ``"pooled"`` for single-ID columns.

    Raises
    ------
    LogError
        Unreadable log or missing / wrongly typed columns.
    ConfigError
        A feature holds no ID at all (no row count to infer), invalid dim / dtype / headroom, or
        ``ids="hash"`` without ``ROWS``.
    """
    mode = _check_sizing(headroom, ids, "infer_tables")
    dim = _as_int(dim, "infer_tables: dim", 1, MAX_DIM)
    optimizer_state_bytes = _as_int(optimizer_state_bytes, "infer_tables: optimizer_state_bytes", 0,
                                    MAX_STATE_BYTES)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ConfigError(f"infer_tables: dtype = {dtype!r}: unknown; valid dtypes: "
                          f"{list(DTYPE_BYTES)}")
    if mode.hashed and mode.rows is None:
        raise ConfigError("infer_tables: ids='hash' hashes into each table's own num_rows: give "
                          "the tables (a tables file; flexshard-stream tables --ids hash sizes "
                          "them from distinct IDs) or a row count, ids='hash:ROWS'")
    ignore = tuple(ignore)
    schema = inspect_log(log_paths, features, ignore=ignore, ts_column=ts_column)
    if mode.rows is not None:
        return [EmbeddingTable(name, mode.rows, dim, dtype, _LOG_KIND[k], name,
                               optimizer_state_bytes) for name, k in schema.features.items()]
    max_ids = log_max_ids(log_paths, dict(schema.features), ignore=ignore)
    tables = []
    for name, log_kind in schema.features.items():
        top = max_ids[name]
        if top < 0:
            raise ConfigError(f"feature {name!r} holds no ID in the log {log_paths!s}; cannot "
                              f"infer its number of rows")
        if top >= MAX_ROWS:
            raise ConfigError(f"feature {name!r} holds ID {top} in the log {log_paths!s}: a "
                              f"table of {top + 1} rows does not fit an int64 row count; IDs "
                              f"must be below {MAX_ROWS} (give the tables with --tables)")
        tables.append(EmbeddingTable(name, _with_headroom(top + 1, headroom), dim, dtype,
                                     _LOG_KIND[log_kind], name, optimizer_state_bytes))
    return tables


def _check_sizing(headroom: float, ids: IdMode | str | None, where: str) -> IdMode:
    """The ID mode of a sizing, parsed; ConfigError for a headroom below 1 or a ``hash`` mode
    without ``ROWS`` (nothing to size by without distinct counts)."""
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float, np.number)) \
            or not math.isfinite(headroom) or headroom < 1:
        raise ConfigError(f"{where}: headroom = {headroom!r}: must be a number >= 1 (rows = "
                          f"headroom x the rows the log needs)")
    try:
        return IdMode.parse(ids)
    except FlexShardError as e:
        raise ConfigError(f"{where}: {e}") from None


def _with_headroom(rows: float, headroom: float) -> int:
    """``ceil(headroom * rows)`` as an int, at least 1 and at most :data:`MAX_ROWS`."""
    return int(min(MAX_ROWS, max(1, math.ceil(float(rows) * float(headroom) - 1e-9))))


def row_map(tables: Iterable[EmbeddingTable], ids: IdMode | str | None = None) -> RowMap:
    """How a log's IDs become the rows of ``tables`` (their features' ``num_rows``) under the
    ID mode ``ids``: what :class:`~flexshard_stream.sources.logs.LogReader` takes as ``rows``.

    Raises
    ------
    ConfigError
        Two tables fed by one feature, an invalid mode, or ``hash:ROWS`` above a table's size.
    """
    by_feature = tables_by_feature(tables)
    try:
        return RowMap({f: t.num_rows for f, t in by_feature.items()}, ids)
    except FlexShardError as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class TableSizing:
    """A table sized from a log's statistics, with the figures it was sized by.

    Attributes
    ----------
    table : EmbeddingTable
    lookups : int               IDs of the feature in the log
    distinct : tuple of float   distinct IDs (estimate, lower, upper; about 95% bounds)
    max_id : int                largest ID seen (-1: none)
    basis : str                 how ``num_rows`` was chosen, in words
    sparse : bool               raw IDs spread over at least :data:`SPARSE_FACTOR` times more
                                rows than there are distinct IDs (hashing would shrink the table)
    collision_share : float or None
        hash modes: expected share of the distinct IDs that share their row with another ID
        (uniform hashing: ``1 - exp(-(n - 1) / R)`` for ``n`` distinct IDs in ``R`` rows)
    """

    table: EmbeddingTable
    lookups: int
    distinct: tuple[float, float, float]
    max_id: int
    basis: str
    sparse: bool
    collision_share: float | None

    def note(self) -> str:
        """One line for the tables file: the figures behind ``num_rows``."""
        d = self.distinct[0]
        text = (f"{self.table.name}: {self.lookups:,} lookups, ~{d:,.0f} distinct IDs, largest "
                f"ID {self.max_id:,}; num_rows = {self.basis}")
        if self.collision_share is not None:
            text += f"; ~{self.collision_share:.0%} of IDs share a row"
        return text


def size_tables(stats: Mapping[str, Any], kinds: Mapping[str, str], *,
                headroom: float = DEFAULT_HEADROOM, ids: IdMode | str | None = None,
                dim: int = 128, dtype: str = "fp32",
                optimizer_state_bytes: int = 0) -> list[TableSizing]:
    """Tables sized from a log's statistics (what ``flexshard-stream tables`` writes).

    Parameters
    ----------
    stats : mapping of feature to TableStats
        The log's statistics per feature, of the raw IDs (``StreamStats.tables``).
    kinds : mapping of feature to {"single", "sequence"}
        The log's feature kinds (``inspect_log(...).features``); pooled and sequence tables.
    headroom : float
        >= 1. ``raw``: ``num_rows = ceil(headroom * (largest ID + 1))``; ``hash``:
        ``ceil(headroom * distinct IDs)`` (upper bound), rounded up to 3 significant digits.
    ids : IdMode or str
        ``raw``, ``hash`` (rows from the distinct IDs) or ``hash:ROWS`` (``ROWS`` rows each).
    dim, dtype, optimizer_state_bytes : every table's D, element type and s (bytes per row).

    Returns
    -------
    list of TableSizing
        In ``kinds`` order.

    Raises
    ------
    ConfigError
        A feature without statistics or without any ID (raw mode), invalid dim / dtype /
        headroom / mode.
    """
    mode = _check_sizing(headroom, ids, "size_tables")
    dim = _as_int(dim, "size_tables: dim", 1, MAX_DIM)
    out = []
    for feature, kind in kinds.items():
        ts = stats.get(feature)
        if ts is None:
            raise ConfigError(f"size_tables: no statistics for feature {feature!r}; have "
                              f"{sorted(stats)[:10]}")
        lo_hi = ts.distinct()
        distinct = (float(lo_hi[0]), float(lo_hi[1]), float(lo_hi[2]))
        rows, basis = _sized_rows(feature, int(ts.max_id), distinct[2], headroom, mode)
        sparse = ts.max_id + 1 > SPARSE_FACTOR * max(distinct[2], 1.0)
        share = (None if not mode.hashed else
                 float(1.0 - math.exp(-max(distinct[0] - 1.0, 0.0) / rows)))
        table = EmbeddingTable(feature, rows, dim, dtype, _LOG_KIND[kind], feature,
                               optimizer_state_bytes)
        out.append(TableSizing(table, int(ts.total), distinct, int(ts.max_id), basis, sparse,
                               share))
    return out


def _sized_rows(feature: str, max_id: int, distinct_hi: float, headroom: float,
                mode: IdMode) -> tuple[int, str]:
    """``num_rows`` of one feature and the words saying how it was chosen."""
    if mode.rows is not None:
        return mode.rows, f"{mode.rows:,} (--ids {mode})"
    if mode.hashed:
        rows = _round_up_3(distinct_hi * headroom)
        return rows, f"{headroom:g} x {distinct_hi:,.0f} distinct IDs (upper bound), rounded up"
    if max_id < 0:
        raise ConfigError(f"feature {feature!r} holds no ID in the log; cannot infer its number "
                          f"of rows")
    if max_id >= MAX_ROWS:
        raise ConfigError(f"feature {feature!r} holds ID {max_id}: a table of {max_id + 1} rows "
                          f"does not fit an int64 row count (IDs must be below {MAX_ROWS}); "
                          f"hash the IDs (--ids hash, or --ids hash:ROWS)")
    return (_with_headroom(max_id + 1, headroom),
            f"{headroom:g} x (largest ID + 1 = {max_id + 1:,})")


def _round_up_3(x: float) -> int:
    """``x`` rounded up to 3 significant digits (24,117 -> 24,200), at least 1."""
    if x <= 1:
        return 1
    step = 10 ** max(0, int(math.floor(math.log10(x))) - 2)
    return int(min(MAX_ROWS, math.ceil(x / step - 1e-9) * step))


def tables_by_feature(tables: Iterable[EmbeddingTable]) -> dict[str, EmbeddingTable]:
    """Map feature -> table.

    Raises
    ------
    ConfigError
        Two tables are fed by the same feature.
    """
    out: dict[str, EmbeddingTable] = {}
    for t in tables:
        if t.feature in out:
            raise ConfigError(f"tables {out[t.feature].name!r} and {t.name!r} are both fed by "
                              f"feature {t.feature!r}; each feature may feed one table")
        out[t.feature] = t
    return out


def summaries_by_table(tables: Iterable[EmbeddingTable], summaries: Mapping[str, Any], *,
                       required: bool = True) -> dict[str, Any]:
    """Resolve frequency summaries keyed by table name or by feature to one per table name.

    The one place where "a summary for table ``t``" is decided: the entry under ``t.name`` if
    present, else the one under ``t.feature``. Planners, baselines and evaluators call this once at
    their edge and then index by table name.

    Raises
    ------
    ConfigError
        ``required`` and a table has neither (the message lists the keys present).
    """
    out: dict[str, Any] = {}
    for t in tables:
        s = summaries.get(t.name)
        if s is None:
            s = summaries.get(t.feature)
        if s is None and required:
            raise ConfigError(f"no frequency summary for table {t.name!r} (feature "
                              f"{t.feature!r}); have {sorted(summaries)[:10]}")
        out[t.name] = s
    return out
