"""Beyond one machine: windowed statistics of many log files in parallel, and merging the
statistics of many hosts.

``window_stats(paths, window=...)`` cuts a log into windows (a duration on the ``ts`` column, or a
number of samples, as the ``replay`` command does) and returns one merged :class:`StreamStats` per
window. The work is divided into *tasks*: one per file, or, when there are fewer files than workers,
contiguous runs of parquet row groups. The driver first computes the global origin (smallest ``ts``)
or the global sample offsets, and so the windows each task can touch, from the parquet footers
(row counts, ``ts`` statistics), else by a first pass. Each task reads its part with the log reader,
assigns its samples to windows and returns the serialized statistics of every window it touched
(:meth:`StreamStats.to_bytes`), one object per window. The driver merges each window's objects
pairwise in a tree (log depth; on Ray the merges are tasks too, so the bytes flow between workers
and only each window's root reaches the driver) and returns the windows in order.

Engines: ``"local"`` (this process, sequentially), ``"process"`` (a spawn ``ProcessPoolExecutor``),
``"ray"`` (Ray tasks; ``pip install 'flexshard-stream[ray]'``, imported only here and only then).
The result depends on the division of the work, never on the engine: with the same ``num_workers``
all engines return identical statistics (every array, heavy hitters included, except the
sequence-length KLL sketch, which DataSketches compacts with random coin flips). Count-min counters,
exact counts, HyperLogLog registers and totals are moreover equal to those of a single pass over the
log (linear sketches); heavy hitters merge within their published bounds (docs/STATISTICS.md).

Many sidecars: :func:`save_snapshot` writes statistics with window metadata (host, window start and
end); :func:`merge_snapshots` merges many snapshots (from many hosts and windows) into one, refusing
incompatible ones with an error naming both files (the ``flexshard-stream merge SNAPSHOT... -o OUT``
command, :func:`flexshard_stream.cli.merge_command`, drives it). :func:`export_datasketches` writes
heavy hitters and distinct counts as Apache DataSketches images for Spark / Java jobs
(docs/SCALING.md).

Heavy modules (the log reader, the Numba kernels, Ray) are imported inside the functions, so that
importing this module (and registering the CLI command) stays cheap.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from ..compat import REMOVED_IN, renamed_keywords
from ..errors import ConfigError, FlexShardError, FormatError, IncompatibleError
from ..optional import import_optional
from .windows import WindowSpec, parse_window

if TYPE_CHECKING:  # pragma: no cover
    from ..stats.batch import Batch
    from ..stats.config import SketchConfig, TableConfig
    from ..stats.stream import StreamStats
    from ..stats.table_stats import TableStats
    from .ids import RowMap
    from .logs import LogFileInfo, LogReader

__all__ = [
    "ENGINES",
    "MAX_WINDOWS",
    "SNAPSHOT_VERSION",
    "Snapshot",
    "WindowStats",
    "export_datasketches",
    "frequent_items_image",
    "hll_image",
    "load_snapshot",
    "load_stats",
    "merge_snapshots",
    "parse_window",
    "save_snapshot",
    "window_stats",
]

#: Engines of :func:`window_stats`.
ENGINES = ("local", "process", "ray")
#: Most windows one :func:`window_stats` run may span, from the first sample's to the last's: a
#: task returns one object per window it can touch (Ray: one return each), so a gap of many
#: windows in a log (1 ms windows over a day's gap) would make billions of them.
MAX_WINDOWS = 1 << 20
#: Version of the snapshot layout (inside the container); snapshots of other versions don't merge.
SNAPSHOT_VERSION = 1
_SNAPSHOT_KIND = "StreamSnapshot"
_STATS_KIND = "StreamStats"

PathLike = Union[str, "os.PathLike[str]"]


# ============================================================================ results
@dataclass
class WindowStats:
    """The merged statistics of one window.

    index : window number counted from the origin (0-based); windows without samples are omitted.
    unit : "seconds" (duration windows on ``ts``) or "samples".
    start, end : window bounds: epoch seconds ``[origin + index * size, start + size)`` for
        duration windows; global sample offsets ``[index * size, start + samples)`` otherwise.
    samples : samples in the window.
    stats : the window's :class:`StreamStats` (all tasks merged).
    """

    index: int
    unit: str
    start: float
    end: float
    samples: int
    stats: StreamStats = field(repr=False)


# ============================================================================ reading a part
def _part_reader(job: Mapping[str, Any]) -> LogReader:
    """A :class:`LogReader` over one task's part: one file, or the row groups ``row_groups``
    (contiguous) of a parquet file; bad-row messages keep the row numbers of the whole file."""
    from .logs import LogReader

    return LogReader([job["path"]], dict(job["features"]), job["read_batch_size"],
                     skip_bad_rows=job["skip_bad_rows"], ts=job["use_ts"],
                     row_groups=job["row_groups"], rows=job.get("rows"),
                     ts_column=job.get("ts_column"))


def _take(batch: Batch, mask: np.ndarray) -> Batch:
    """The samples of ``batch`` where ``mask`` (bool per sample) holds, in order."""
    from ..stats.batch import Batch
    nk, bs = len(batch.keys), batch.batch_size
    lens = batch.lengths.reshape(nk, bs)
    vmask = np.concatenate([np.repeat(mask, lens[i]) for i in range(nk)])
    ts = batch.timestamp
    if ts is not None and ts.size > 1:
        ts = ts[mask]
    return Batch(batch.keys, batch.values[vmask], lens[:, mask].ravel(),
                 None if batch.weights is None else batch.weights[vmask], ts)


def _split_windows(batch: Batch, w: np.ndarray) -> Iterator[tuple[int, Batch]]:
    """``(window, piece)`` of ``batch`` for per-sample window numbers ``w``."""
    from ..stats.batch import slice_batch
    n = batch.batch_size
    if n == 0:
        return
    if w[0] == w[-1] and (w == w[0]).all():
        yield int(w[0]), batch
    elif (np.diff(w) >= 0).all():
        cuts = [0, *(np.flatnonzero(np.diff(w)) + 1).tolist(), n]
        for lo, hi in pairwise(cuts):
            yield int(w[lo]), slice_batch(batch, lo, hi)
    else:  # out-of-order timestamps: group by window, keeping the order within each
        for u in np.unique(w):
            yield int(u), _take(batch, w == u)


def _window_of(batch: Batch, unit: str, size: float, origin: float, offset: int) -> np.ndarray:
    """Window number (int64) of every sample of ``batch``; ``offset`` = global index of its first
    sample (sample windows)."""
    n = batch.batch_size
    if unit == "seconds":
        ts = np.broadcast_to(batch.timestamp, (n,)).astype(np.float64)
        w = np.floor((ts - origin) / size)
        if n and w.min() < 0:
            raise FlexShardError(f"timestamp {float(ts.min())} lies before the origin {origin} "
                                 "taken from the files' metadata; the parquet statistics of the "
                                 "'ts' column are wrong")
        return w.astype(np.int64)
    return (offset + np.arange(n, dtype=np.int64)) // int(size)


# ============================================================================ task functions
# Module-level functions: the process pool and Ray ship them by reference (module + name).

def _scan_task(job: dict) -> dict:
    """First pass of one task: valid samples, smallest and largest timestamp (seconds or None)."""
    reader = _part_reader(job)
    lo, hi = math.inf, -math.inf
    for b in reader:
        if b.timestamp is not None and b.batch_size:
            lo = min(lo, float(np.min(b.timestamp)))
            hi = max(hi, float(np.max(b.timestamp)))
    return {"samples": reader.samples, "min_ts": None if lo == math.inf else lo,
            "max_ts": None if hi == -math.inf else hi}


def _map_task(job: dict) -> list:
    """Main pass of one task: ``[meta, blob(lo), ..., blob(hi - 1)]`` for the windows
    ``[lo, hi) = job["windows"]`` predicted from the metadata: the serialized
    :class:`StreamStats` of each window (None where the task has no sample of it).

    ``meta``: ``{"rows_read", "samples", "skipped_by_file", "sizes" (bytes per blob), "windows"
    (windows touched)}``.
    """
    from ..stats.config import SketchConfig, TableConfig
    from ..stats.stream import StreamStats

    cfg = SketchConfig.from_dict(job["config"])
    tcfg = [TableConfig(n, r, f) for n, r, f in job["tables"]]
    reader = _part_reader(job)
    unit, size, origin = job["unit"], job["size"], job["origin"]
    lo, hi = job["windows"]
    seen = job["sample_offset"]
    wins: dict[int, StreamStats] = {}
    for b in reader:
        w = _window_of(b, unit, size, origin, seen)
        seen += b.batch_size
        if w.size and (int(w.min()) < lo or int(w.max()) >= hi):
            raise FlexShardError(f"{job['path']}: a sample falls in window "
                                 f"{int(w.min()) if w.min() < lo else int(w.max())}, outside the "
                                 f"windows {lo}..{hi - 1} predicted from the file's metadata "
                                 "(row counts, 'ts' statistics); the metadata is wrong")
        for k, piece in _split_windows(b, w):
            st = wins.get(k)
            if st is None:
                st = wins[k] = StreamStats(tcfg, cfg)
            st.update(piece)
    if job["count"] is not None and reader.samples != job["count"]:
        raise FlexShardError(f"{job['path']}: read {reader.samples} samples where the file's "
                             f"metadata promised {job['count']}; sample offsets would be wrong")
    blobs = [wins[k].to_bytes() if k in wins else None for k in range(lo, hi)]
    meta = {"rows_read": reader.rows_read, "samples": reader.samples,
            "skipped_by_file": reader.skipped_by_file, "windows": len(wins),
            "sizes": [0 if x is None else len(x) for x in blobs]}
    return [meta, *blobs]


def _merge_blobs(a: bytes | None, b: bytes | None) -> bytes | None:
    """Merge two serialized window statistics (``a`` first); None is the empty window."""
    from ..stats.stream import StreamStats
    if a is None or b is None:
        return a if b is None else b
    return StreamStats.from_bytes(a).merge(StreamStats.from_bytes(b)).to_bytes()


def _tree(handles: list, merge: Callable[[Any, Any], Any]) -> Any:
    """Pairwise tree reduction, left to right: ``ceil(log2(n))`` levels, ``n - 1`` merges."""
    while len(handles) > 1:
        nxt = [merge(handles[i], handles[i + 1]) for i in range(0, len(handles) - 1, 2)]
        if len(handles) % 2:
            nxt.append(handles[-1])
        handles = nxt
    return handles[0]


# ============================================================================ engines
class _LocalEngine:
    """Everything in this process, in order."""

    workers = 1

    def scan(self, jobs: list[dict]) -> list[dict]:
        return [_scan_task(j) for j in jobs]

    def map(self, jobs: list[dict]) -> list[list]:
        return [_map_task(j) for j in jobs]

    def merge(self, a: Any, b: Any) -> Any:
        return _merge_blobs(a, b)

    def get(self, handles: list) -> list:
        return handles

    def close(self) -> None:
        pass


class _ProcessEngine(_LocalEngine):
    """A ``ProcessPoolExecutor`` with the spawn start method (no forked Numba / arrow state), or
    the caller's executor (kept open). Map tasks run in the workers; their window blobs come back
    once and merge in the driver."""

    def __init__(self, workers: int, executor: Any = None):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        self.workers = workers
        self.own = executor is None
        self.pool = executor if executor is not None else ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def scan(self, jobs: list[dict]) -> list[dict]:
        return [f.result() for f in [self.pool.submit(_scan_task, j) for j in jobs]]

    def map(self, jobs: list[dict]) -> list[list]:
        return [f.result() for f in [self.pool.submit(_map_task, j) for j in jobs]]

    def close(self) -> None:
        if self.own:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _RayEngine:
    """Ray tasks. A map task returns one object per window (``num_returns``), so each window's
    blobs travel only to the merge tasks of that window; the driver fetches the metadata and the
    root of every window's merge tree."""

    def __init__(self, workers: int | None, address: str | None):
        self.ray = ray = import_optional("ray", extra="ray", purpose="engine='ray'")
        self.started = False
        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address is None and workers is not None:
                kw["num_cpus"] = workers
            ray.init(address=address, **kw)
            self.started = True
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._scan = ray.remote(num_cpus=1)(_scan_task)
        self._map = ray.remote(num_cpus=1)(_map_task)
        self._merge = ray.remote(num_cpus=1)(_merge_blobs)

    def scan(self, jobs: list[dict]) -> list[dict]:
        return self.ray.get([self._scan.remote(j) for j in jobs])

    def map(self, jobs: list[dict]) -> list[list]:
        out = []
        for j in jobs:
            n = 1 + j["windows"][1] - j["windows"][0]
            refs = self._map.options(num_returns=n).remote(j)
            out.append(list(refs) if n > 1 else [refs])
        return out

    def merge(self, a: Any, b: Any) -> Any:
        return self._merge.remote(a, b)

    def get(self, handles: list) -> list:
        return self.ray.get(list(handles))

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def _engine(engine: str, address: str | None, workers: int | None, executor: Any = None):
    if engine == "local":
        return _LocalEngine()
    if engine == "process":
        if executor is not None and workers is None:
            workers = getattr(executor, "_max_workers", None)
        return _ProcessEngine(workers or os.cpu_count() or 1, executor)
    if engine == "ray":
        return _RayEngine(workers, address)
    raise ConfigError(f"engine {engine!r}: expected one of {ENGINES}")


# ============================================================================ dividing the work
def _parquet_meta(path: Path) -> tuple[list[int], list[tuple[float, float] | None] | None]:
    """Rows per row group, and ``(min, max)`` of ``ts`` per row group from the column statistics
    (None for empty row groups; the whole list None when a non-empty row group lacks them)."""
    from .logs import TS_COLUMN, open_parquet
    pf = open_parquet(path)
    try:
        md = pf.metadata
        rows: list[int] = []
        ranges: list[tuple[float, float] | None] = []
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            rows.append(int(rg.num_rows))
            r: tuple[float, float] | None = None
            for j in range(rg.num_columns):
                c = rg.column(j)
                if c.path_in_schema == TS_COLUMN:
                    r = _ts_range(c.statistics)
            ranges.append(r)
        complete = all(r is not None for r, n in zip(ranges, rows) if n)
        return rows, (ranges if complete else None)
    finally:
        pf.close()


def _ts_range(s: Any) -> tuple[float, float] | None:
    """``(min, max)`` of a parquet column chunk's statistics when both are finite numbers; None
    when absent or unusable (damaged statistics, or a timestamp pyarrow cannot make a Python
    value of: the rows are then read to find the range)."""
    import pyarrow as pa
    try:
        lo, hi = (s.min, s.max) if s is not None and s.has_min_max else (None, None)
    except (OverflowError, ValueError, TypeError, pa.ArrowException):
        return None
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
           for v in (lo, hi)):
        return float(lo), float(hi)
    return None


def _split_groups(rows: list[int], k: int) -> list[tuple[int, ...]]:
    """Contiguous runs of row groups, ``k`` at most, balanced by rows."""
    n = len(rows)
    k = max(1, min(k, n))
    if k == 1:
        return [tuple(range(n))]
    cum = np.cumsum(rows)
    total = float(cum[-1]) if n else 0.0
    cuts = [0]
    for j in range(1, k):
        c = int(np.searchsorted(cum, total * j / k, side="left")) + 1
        c = max(cuts[-1] + 1, min(c, n - (k - j)))
        cuts.append(c)
    cuts.append(n)
    return [tuple(range(a, b)) for a, b in pairwise(cuts) if b > a]


def _plan_tasks(infos: Sequence[LogFileInfo], workers: int) -> list[dict]:
    """One task per file, or, when there are fewer files than workers, parquet files split into
    ``ceil(workers * rows_of_file / rows_of_all_files)`` runs of row groups. Each task:
    ``{"path", "row_groups" (None = whole file), "rows" (None = unknown: CSV), "ts" ((min, max)
    seconds, None without samples, "unknown" without statistics)}``."""
    metas = [_parquet_meta(i.path) if i.format == "parquet" else (None, None) for i in infos]
    split = len(infos) < workers
    total = sum(sum(m[0]) for m in metas if m[0] is not None) or 1
    tasks: list[dict] = []
    for info, (rows, ranges) in zip(infos, metas):
        if rows is None:
            tasks.append({"path": str(info.path), "row_groups": None, "rows": None,
                          "ts": "unknown"})
            continue
        k = max(1, math.ceil(workers * sum(rows) / total)) if split and len(rows) > 1 else 1
        for groups in _split_groups(rows, k) if rows else [()]:
            ts: Any = "unknown"
            if ranges is not None:
                sub = [ranges[g] for g in groups if rows[g]]
                ts = (min(r[0] for r in sub), max(r[1] for r in sub)) if sub else None
            tasks.append({"path": str(info.path), "row_groups": groups if k > 1 else None,
                          "rows": int(sum(rows[g] for g in groups)), "ts": ts})
    return tasks


def _window_range(unit: str, size: float, origin: float, count: int,
                  offset: int, ts: tuple[float, float] | None) -> tuple[int, int]:
    """Windows ``[lo, hi)`` a task's samples can fall in (the same arithmetic as
    :func:`_window_of`)."""
    if count == 0:
        return 0, 0
    if unit == "seconds":
        if ts is None:
            return 0, 0
        return math.floor((ts[0] - origin) / size), math.floor((ts[1] - origin) / size) + 1
    return offset // int(size), (offset + count - 1) // int(size) + 1


# ============================================================================ the driver
@renamed_keywords(REMOVED_IN, batch_size="read_batch_size")
def window_stats(paths: PathLike | Sequence[PathLike], *, window: str | int | WindowSpec,
                 features: Any = None, engine: str = "local", address: str | None = None,
                 num_workers: int | None = None, skip_bad_rows: bool = False,
                 config: SketchConfig | None = None,
                 tables: Mapping[str, int | None] | Sequence[TableConfig | str] | None = None,
                 read_batch_size: int = 65536, executor: Any = None,
                 diagnostics: dict[str, Any] | None = None,
                 rows: RowMap | None = None, ts_column: str | None = None) -> list[WindowStats]:
    """Per-window statistics of a log, computed in parallel and merged by a tree reduction.

    Parameters
    ----------
    paths : parquet / CSV log files, globs or directories, in order (see :mod:`~.logs`). On a Ray
        cluster every node must see the same paths (a shared file system).
    window : a duration on ``ts`` (``"30m"``, ``"90s"``) or a number of samples (``"100000"``),
        see :func:`parse_window`. Duration windows are aligned to the origin = the smallest ``ts``
        of the whole log: window ``i`` holds ``origin + i * size <= ts < origin + (i + 1) * size``
        (seconds), whatever the order of the rows. Sample windows hold global samples
        ``[i * size, (i + 1) * size)`` in file order (bad rows skipped are not samples).
    features : feature columns (see :class:`~.logs.LogReader`); default: the tables' features, or
        every ID column of the log.
    engine : "local" (this process), "process" (spawned worker processes) or "ray".
    address : Ray cluster address (``"auto"``, ``"ray://head:10001"``); default: an already
        initialized Ray, else a new local one with ``num_workers`` CPUs (shut down afterwards).
    num_workers : parallel workers (local: 1; process: CPU count; Ray: the cluster's CPUs). It also
        divides the work: with fewer files than workers, parquet files are split into row-group runs.
        Equal ``num_workers`` give identical statistics on every engine (but for the randomized
        KLL sequence-length sketch).
    skip_bad_rows : drop and count bad rows instead of raising :class:`LogError`. Costs a first
        pass over the log (valid samples and ``ts`` range per task), as does a duration window
        over CSV files or parquet files without ``ts`` statistics; otherwise the driver reads
        row counts and ``ts`` ranges from the parquet footers (CSV: line counts).
    config : sketch sizes (default :class:`SketchConfig()`); tables : ``{feature: num_rows or
        None}`` or :class:`TableConfig` s (known row counts allow exact counts); default: every
        feature sketched.
    read_batch_size : samples per batch read (memory per task: one batch plus the window
        statistics); ``batch_size`` is its deprecated name (one release).
    executor : engine "process" only: a ``concurrent.futures`` executor to run the tasks in (kept
        open, so its workers stay warm across calls; a process pool should use the spawn start
        method); default: a new spawn ``ProcessPoolExecutor`` per call (start-up about 1-3 s).
    rows : how the log's IDs become table rows (:class:`~.logs.RowMap`: ID mode and ``num_rows``
        checks, out-of-range rows counted as ``"out_of_range"`` with ``skip_bad_rows``); default:
        the IDs as they are.
    diagnostics : if a dict, filled with ``tasks``, ``scan_pass`` (a first counting pass ran),
        ``seconds`` per phase, ``task_bytes`` (bytes of the window statistics the map tasks
        return), ``merges``, ``moved_bytes`` (bytes that leave a task on a cluster: every map
        output plus every merge output), ``blob_bytes_per_window`` and ``state_bytes_per_window``
        (one window's statistics serialized / in memory), ``max_windows_per_task``,
        ``rows_read``, ``samples``, ``ids``, ``skipped`` (rows per reason), ``skipped_by_file``
        (``{file: {reason: rows}}``, the log reader's layout), ``workers``, ``origin``.

    Returns
    -------
    list of WindowStats, by window index; windows without samples are left out (as replay does).

    Raises
    ------
    ConfigError : bad window spec or engine, duration window on a log without ``ts``.
    LogError : unreadable file or bad row (naming the file and the row).
    """
    from ..stats.config import SketchConfig

    t0 = time.perf_counter()
    spec = parse_window(window)
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r}: expected one of {ENGINES}")
    if num_workers is not None and (isinstance(num_workers, bool) or int(num_workers) < 1):
        raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    config = config or SketchConfig()
    reader, tab_list = _open_log(paths, spec, features, tables, config, read_batch_size,
                                 skip_bad_rows, ts_column)
    if executor is not None and engine != "process":
        raise ConfigError(f"executor is for engine='process', not {engine!r}")
    eng = _engine(engine, address, num_workers if engine != "local" else 1, executor)
    workers = int(num_workers or eng.workers)
    diag: dict[str, Any] = {"engine": engine, "workers": workers, "seconds": {}}
    try:
        tasks = _plan_tasks(reader.file_infos, workers)
        base = {"features": dict(reader.schema.features), "use_ts": reader.use_ts,
                "ts_column": reader.schema.ts_column,
                "read_batch_size": int(read_batch_size), "skip_bad_rows": bool(skip_bad_rows),
                "rows": rows}
        jobs = [{**base, "path": t["path"], "row_groups": t["row_groups"]} for t in tasks]
        base = {"config": config.to_dict(), "tables": tab_list}
        origin = _assign_windows(eng, tasks, jobs, spec, skip_bad_rows, base, diag)
        t2 = time.perf_counter()
        reduced = _map_reduce(eng, jobs)
        diag["seconds"]["map_reduce"] = time.perf_counter() - t2
    finally:
        eng.close()
    out = _window_results(reduced, spec, origin)
    diag.update(_run_diagnostics(reduced, out, len(tasks), spec, origin))
    diag["seconds"]["total"] = time.perf_counter() - t0
    if diagnostics is not None:
        diagnostics.update(diag)
    return out


def _open_log(paths: PathLike | Sequence[PathLike], spec: WindowSpec, features: Any,
              tables: Any, config: SketchConfig, read_batch_size: int, skip_bad_rows: bool,
              ts_column: str | None = None
              ) -> tuple[LogReader, list[tuple[str, int | None, str]]]:
    """The driver's reader of the whole log (schema, files, ``ts``), checked against the window
    and the tables, and the tables as ``(name, num_rows or None, feature)`` for the tasks
    (default: every feature of the log, sketched).

    Raises ConfigError for a duration window on a log without ``ts`` or a feature without a
    table, LogError for an unreadable file.
    """
    from ..stats.config import TableConfig, normalize_tables
    from ..stats.stream import StreamStats
    from .logs import LogReader

    tconfs = normalize_tables(tables)
    if features is None and tconfs:
        features = [t.feature for t in tconfs.values()]
    reader = LogReader(paths, features, read_batch_size, skip_bad_rows=skip_bad_rows,
                       ts_column=ts_column)
    if spec.unit == "seconds" and not reader.use_ts:
        raise ConfigError(f"window {spec.text!r} is a duration but the log has no 'ts' column "
                          f"({', '.join(str(f) for f in reader.files)}); give a number of samples, "
                          f"e.g. window='100000'")
    missing = [f for f in reader.schema.keys if tconfs and f not in tconfs]
    if missing:
        raise ConfigError(f"log features {missing} have no table; tables: {sorted(tconfs)}")
    if not tconfs:
        tconfs = {f: TableConfig(f, None) for f in reader.schema.keys}
    StreamStats(list(tconfs.values()), config)  # validates the tables against the config
    return reader, [(t.name, t.num_rows, t.feature) for t in tconfs.values()]


def _assign_windows(eng: Any, tasks: Sequence[dict], jobs: Sequence[dict], spec: WindowSpec,
                    skip_bad_rows: bool, base: Mapping[str, Any], diag: dict[str, Any]) -> float:
    """Give every job its global sample offset, sample count and the windows ``[lo, hi)`` it can
    touch (plus ``base``: sketch config and tables); returns the origin (smallest ``ts``, seconds;
    0 for sample windows).

    Counts and ``ts`` ranges come from the parquet footers and CSV line counts, or from a first
    pass of the engine over every part (``diag["scan_pass"]``) when bad rows are skipped or a
    duration window meets a part without ``ts`` statistics.
    """
    from .logs import csv_data_rows

    seconds = spec.unit == "seconds"
    need_scan = skip_bad_rows or (seconds and any(t["ts"] == "unknown" for t in tasks))
    t1 = time.perf_counter()
    if need_scan:
        scans = eng.scan(jobs)
        counts = [s["samples"] for s in scans]
        ranges = [None if s["min_ts"] is None else (s["min_ts"], s["max_ts"]) for s in scans]
    else:
        counts = [t["rows"] if t["rows"] is not None else csv_data_rows(t["path"])
                  for t in tasks]
        ranges = [t["ts"] for t in tasks]
    diag["scan_pass"] = bool(need_scan)
    diag["seconds"]["scan"] = time.perf_counter() - t1
    mins = [r[0] for r in ranges if isinstance(r, tuple)]
    origin = float(min(mins)) + 0.0 if (seconds and mins) else 0.0
    size = float(spec.size) if seconds else int(spec.size)
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])[:-1]
    for j, off, n, r in zip(jobs, offsets, counts, ranges):
        j.update({**base, "unit": spec.unit, "size": size, "origin": origin,
                  "sample_offset": int(off), "count": int(n),
                  "windows": _window_range(spec.unit, size, origin, int(n), int(off),
                                           r if isinstance(r, tuple) else None)})
    _check_window_count(jobs, spec)
    return origin


def _check_window_count(jobs: Sequence[dict], spec: WindowSpec) -> None:
    """Refuse a run spanning more than :data:`MAX_WINDOWS` windows (ConfigError), before any
    task makes one object per window."""
    spans = [j["windows"] for j in jobs if j["windows"][1] > j["windows"][0]]
    if not spans:
        return
    n = max(b for _, b in spans) - min(a for a, _ in spans)
    if n > MAX_WINDOWS:
        raise ConfigError(f"windows of {spec.describe()} over this log span {n:,} windows (its "
                          f"samples lie far apart); at most {MAX_WINDOWS:,}: use a larger window")


@dataclass
class _Reduced:
    """What the map tasks and the merge trees returned: per window (ascending) the serialized
    statistics of the root (None: no sample), the tasks' metadata, and the merges done."""

    windows: list[int]
    blobs: list[bytes | None]
    metas: list[dict]
    merges: int


def _map_reduce(eng: Any, jobs: Sequence[dict]) -> _Reduced:
    """Run the map tasks, then one pairwise merge tree per window over the outputs of the tasks
    that touch it (in task order); fetch the metadata and every window's root."""
    outs = eng.map(jobs)
    by_window: dict[int, list] = {}            # window -> its task outputs, in task order
    for o, j in zip(outs, jobs):
        a, b = j["windows"]
        for w in range(a, b):
            by_window.setdefault(w, []).append(o[1 + w - a])
    roots, merges = {}, 0
    for w in sorted(by_window):
        merges += len(by_window[w]) - 1
        roots[w] = _tree(by_window[w], eng.merge)
    metas = eng.get([o[0] for o in outs])
    blobs = eng.get(list(roots.values()))
    return _Reduced(list(roots), blobs, metas, merges)


def _window_results(reduced: _Reduced, spec: WindowSpec, origin: float) -> list[WindowStats]:
    """The non-empty windows as :class:`WindowStats`, bounds in seconds (duration windows) or
    global sample offsets."""
    from ..stats.stream import StreamStats

    out: list[WindowStats] = []
    for k, blob in zip(reduced.windows, reduced.blobs):
        if blob is None:
            continue
        st = StreamStats.from_bytes(blob, f"window {k}")
        if spec.unit == "seconds":
            start = origin + k * float(spec.size)
            end = start + float(spec.size)
        else:
            start = float(k * int(spec.size))
            end = start + st.samples
        out.append(WindowStats(int(k), spec.unit, start, end, st.samples, st))
    return out


def _run_diagnostics(reduced: _Reduced, out: Sequence[WindowStats], tasks: int,
                     spec: WindowSpec, origin: float) -> dict[str, Any]:
    """The ``diagnostics`` of :func:`window_stats` from the tasks' metadata: bytes moved (bytes),
    rows and samples read, bad rows skipped (per reason and per file)."""
    metas, blobs = reduced.metas, reduced.blobs
    skipped: dict[str, int] = {}
    by_file: dict[str, dict[str, int]] = {}
    for m in metas:
        for f, c in m["skipped_by_file"].items():
            fc = by_file.setdefault(f, {})
            for r, n in c.items():
                skipped[r] = skipped.get(r, 0) + n
                fc[r] = fc.get(r, 0) + n
    leaf_bytes = [s for m in metas for s in m["sizes"] if s]
    state = len(blobs[0]) if blobs and blobs[0] is not None else 0
    return {"tasks": tasks, "task_bytes": int(sum(leaf_bytes)), "merges": reduced.merges,
            "moved_bytes": int(sum(leaf_bytes) + reduced.merges * (state or 0)),
            "max_windows_per_task": max((m["windows"] for m in metas), default=0),
            "rows_read": sum(m["rows_read"] for m in metas),
            "samples": sum(m["samples"] for m in metas),
            "ids": sum(w.stats.ids for w in out), "skipped": skipped,
            "skipped_by_file": by_file,
            "origin": origin if spec.unit == "seconds" else None,
            "window": {"unit": spec.unit, "size": spec.size},
            "state_bytes_per_window": out[0].stats.state_bytes if out else 0,
            "blob_bytes_per_window": state}


# ============================================================================ snapshots
@dataclass
class Snapshot:
    """Statistics with where and when they were taken.

    path : the file; host : the host (or hosts, comma-separated, of a merged snapshot);
    unit : "seconds" or "samples" or None; start, end : the window (epoch seconds or sample
    offsets; None when unknown); sources : snapshots merged into it (1 for a host's own);
    version : :data:`SNAPSHOT_VERSION` of the file; stats : the :class:`StreamStats`.
    """

    path: Path | None
    host: str | None
    unit: str | None
    start: float | None
    end: float | None
    sources: int
    version: int
    stats: StreamStats = field(repr=False)


def _snapshot_bytes(stats: StreamStats, host: str | None, unit: str | None,
                    start: float | None, end: float | None, sources: int = 1) -> bytes:
    from .. import __version__
    from ..formats.container import pack
    from ..stats.stream import StreamStats
    if not isinstance(stats, StreamStats):
        raise ConfigError(f"a snapshot holds StreamStats, not {type(stats).__name__}")
    if unit not in (None, "seconds", "samples"):
        raise ConfigError(f"window unit {unit!r}: expected 'seconds', 'samples' or None")
    meta = {"snapshot_version": SNAPSHOT_VERSION, "host": host, "unit": unit,
            "start": None if start is None else float(start),
            "end": None if end is None else float(end), "sources": int(sources),
            "library_version": __version__, "written_at": time.time()}
    return pack(_SNAPSHOT_KIND, meta, {"stats": np.frombuffer(stats.to_bytes(), np.uint8)})


def save_snapshot(stats: StreamStats, path: PathLike, *, host: str | None = None,
                  start: float | None = None, end: float | None = None,
                  unit: str | None = "seconds") -> Path:
    """Write ``stats`` with its window metadata (atomic, verified; container kind
    ``StreamSnapshot``).

    host : default this machine's host name; start, end : the window (epoch seconds for unit
    "seconds", sample offsets for "samples"); default: the statistics' first / last ``ts``.
    """
    from ..formats.container import write_atomic
    if start is None and unit == "seconds":
        start = stats.first_ts
    if end is None and unit == "seconds":
        end = stats.last_ts
    data = _snapshot_bytes(stats, socket.gethostname() if host is None else host, unit, start,
                           end)
    return write_atomic(path, data, verify_kind=_SNAPSHOT_KIND)


def load_snapshot(path: PathLike) -> Snapshot:
    """Read a snapshot; a plain :class:`StreamStats` file (``StreamStats.save``, the sidecar's
    ``stats.fss``) reads as a snapshot without metadata. Raises FormatError naming the file."""
    from ..formats.container import header_kind, unpack
    from ..formats.fields import field_int, field_number, field_str
    from ..formats.files import read_bytes
    from ..stats.stream import StreamStats
    p = Path(path)
    data = read_bytes(p, "snapshot file")
    kind = header_kind(data, str(p))
    if kind == _STATS_KIND:
        return Snapshot(p, None, None, None, None, 1, SNAPSHOT_VERSION,
                        StreamStats.from_bytes(data, str(p)))
    meta, arrays = unpack(data, _SNAPSHOT_KIND, str(p))
    where = str(p)
    version = field_int(meta, "snapshot_version", where)
    host = field_str(meta, "host", where, optional=True, default=None)
    unit = field_str(meta, "unit", where, optional=True, choices=("seconds", "samples"),
                     default=None)
    start, end = (field_number(meta, k, where, optional=True, default=None)
                  for k in ("start", "end"))
    sources = field_int(meta, "sources", where, lo=1, default=1)
    blob = arrays.get("stats")
    if blob is None or blob.dtype != np.uint8 or blob.ndim != 1:
        raise FormatError(f"{p}: array 'stats' must hold the statistics' bytes (uint8)")
    stats = StreamStats.from_bytes(blob.tobytes(), f"{p} (statistics)")
    return Snapshot(p, host, unit, start, end, sources, version, stats)


def load_stats(path: PathLike) -> StreamStats:
    """The :class:`StreamStats` of a snapshot or of a plain statistics file."""
    return load_snapshot(path).stats


def _incompatibility(a: StreamStats, b: StreamStats) -> str | None:
    """Why ``b`` cannot merge into ``a`` (None if it can)."""
    if a.config != b.config:
        da, db = a.config.to_dict(), b.config.to_dict()
        diff = ", ".join(f"{k} {da[k]!r} vs {db[k]!r}" for k in da if da[k] != db[k])
        return f"sketch configs differ ({diff})"
    for f, t in b.tables.items():
        if f in a and a[f].num_rows != t.num_rows:
            return f"table {f!r} has num_rows {a[f].num_rows} vs {t.num_rows}"
    return None


def _refuse_duplicate(seen: dict, p: Path, s: Snapshot) -> None:
    """IncompatibleError when snapshot ``s`` (file ``p``) holds the same statistics as one in
    ``seen`` (key -> file; updated): the same file (also through another name), the same bytes,
    or the same host's same window. Merging them would count every lookup twice."""
    import hashlib

    from ..formats.files import read_bytes
    keys = [("file", p.resolve()),
            ("bytes", hashlib.sha256(read_bytes(p, "snapshot file")).hexdigest())]
    if s.host and s.start is not None and s.end is not None and s.sources == 1:
        keys.append(("window", s.host, s.unit, s.start, s.end))
    for k in keys:
        if k in seen:
            what = {"file": "the same file", "bytes": "the same statistics (identical bytes)",
                    "window": f"the same host's ({s.host}) same window [{s.start:g}, "
                              f"{s.end:g}) {s.unit or ''}".rstrip()}[str(k[0])]
            raise IncompatibleError(f"{p} and {seen[k]} hold {what}: merging them would count "
                                    f"every lookup twice; give each snapshot once")
    seen.update({k: p for k in keys})


def merge_snapshots(paths: Sequence[PathLike], out: PathLike | None) -> StreamStats:
    """Merge many snapshots (hosts and windows) into one and write it to ``out`` as a snapshot.

    The result's host lists the hosts, its window spans the earliest start to the latest end
    (unknown when units differ or any is unknown). Every file is checked and merged before
    anything is written: an incompatible snapshot (other sketch sizes or seeds, other table row
    counts, another snapshot version) raises :class:`IncompatibleError` naming both files, a damaged
    one :class:`FormatError`; ``out`` is then left as it was (absent if it was). ``out=None``
    only returns the merged statistics.
    """
    from ..formats.container import write_atomic
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no snapshots to merge")
    first = load_snapshot(paths[0])
    seen: dict = {}
    _refuse_duplicate(seen, paths[0], first)
    if first.version != SNAPSHOT_VERSION:
        raise IncompatibleError(f"{first.path}: snapshot version {first.version}; this "
                                f"flexshard_stream merges version {SNAPSHOT_VERSION}")
    merged = first.stats.copy()
    hosts = [h for h in (first.host or "").split(",") if h]
    units = {first.unit}
    starts, ends = [first.start], [first.end]
    sources = first.sources
    origin_of: dict[str, Path] = {f: paths[0] for f in merged}  # file that brought each table
    for p in paths[1:]:
        s = load_snapshot(p)
        _refuse_duplicate(seen, p, s)
        if s.version != first.version:
            raise IncompatibleError(f"cannot merge {p} into {paths[0]}: snapshot versions differ "
                                    f"({s.version} vs {first.version})")
        why = _incompatibility(merged, s.stats)
        if why is not None:
            ref = paths[0]
            if "num_rows" in why:
                ref = next((origin_of[f] for f in s.stats if f in merged and
                            merged[f].num_rows != s.stats[f].num_rows), ref)
            raise IncompatibleError(f"cannot merge {p} with {ref}: {why}")
        try:
            merged.merge(s.stats)
        except IncompatibleError as e:
            raise IncompatibleError(f"cannot merge {p} with {paths[0]}: {e}") from None
        for f in s.stats:
            origin_of.setdefault(f, p)
        hosts += [h for h in (s.host or "").split(",") if h and h not in hosts]
        units.add(s.unit)
        starts.append(s.start)
        ends.append(s.end)
        sources += s.sources
    if out is not None:
        known = len(units) == 1 and None not in starts and None not in ends
        unit = units.pop() if len(units) == 1 else None
        data = _snapshot_bytes(merged, ",".join(hosts) or None, unit,
                               min(starts) if known else None, max(ends) if known else None,
                               sources)
        write_atomic(out, data, verify_kind=_SNAPSHOT_KIND)
    return merged


# ============================================================================ interop
def frequent_items_image(table: TableStats) -> bytes:
    """The table's heavy hitters as a DataSketches frequent-items image (int64 items:
    ``PyLongsSerDe`` / Java ``ArrayOfLongsSerDe``); see :meth:`TableStats.to_datasketches_frequent_items`."""
    return table.to_datasketches_frequent_items()


def hll_image(table: TableStats) -> bytes:
    """The table's distinct rows as a DataSketches HLL image (``HllSketch.heapify`` in Java,
    ``hll_sketch.deserialize`` in Python), ``lg_k = hll_p``, type HLL_8, updatable form.

    Only for exact tables: the image is made by feeding every row with a non-zero count to a
    DataSketches ``hll_sketch`` (one Python call per distinct row: about 0.3 s per million rows).
    Sketched tables keep HyperLogLog registers of this library's own hash, which a DataSketches
    HLL image cannot carry (DataSketches hashes with its own MurmurHash3 and seed): raises
    :class:`ConfigError` for them; their distinct estimate is in ``table.distinct()``.
    """
    import datasketches as ds
    if not table.exact:
        raise ConfigError(f"table {table.name!r} is sketched: its HyperLogLog registers use this "
                          "library's hash and cannot become a DataSketches HLL image; only exact "
                          "tables (known num_rows within exact_memory_limit) export one")
    lg_k = min(21, max(4, table.config.hll_p))
    h = ds.hll_sketch(lg_k, ds.tgt_hll_type.HLL_8)
    upd = h.update
    for i in table.nonzero_rows().tolist():
        upd(i)
    return bytes(h.serialize_updatable())


def export_datasketches(stats: StreamStats, out_dir: PathLike) -> dict[str, dict[str, str]]:
    """Write ``<feature>.frequent_items.bin`` (every table) and ``<feature>.hll.bin`` (exact
    tables) into ``out_dir``; returns ``{feature: {"frequent_items": path, "hll": path}}``.
    ``out_dir`` must be absent, empty or such an export (marker kind ``datasketches``): a user's
    other directory is refused (:func:`~flexshard_stream.formats.files.claim_directory`)."""
    from ..formats.container import write_atomic
    from ..formats.files import claim_directory, file_stems
    safe_names = file_stems(stats.tables)   # a/b and a_b: two files, never one overwritten
    d = claim_directory(out_dir, "datasketches", legacy=tuple(
        f"{s}.frequent_items.bin" for s in safe_names.values()))
    out: dict[str, dict[str, str]] = {}
    for f, t in stats.tables.items():
        safe = safe_names[f]
        files = {"frequent_items": str(write_atomic(d / f"{safe}.frequent_items.bin",
                                                    frequent_items_image(t)))}
        if t.exact:
            files["hll"] = str(write_atomic(d / f"{safe}.hll.bin", hll_image(t)))
        out[f] = files
    return out
