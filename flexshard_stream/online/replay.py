"""Replay a log in windows through four placement strategies and write what the report needs.

``replay(logs, topology, ...)`` reads parquet / CSV logs lazily (:class:`~.logs.LogReader`: memory
is bounded by one read chunk, one quarter window of whole iterations and one partial iteration,
never by the log), cuts the stream into windows (a duration on the ``ts`` column, or a number of
samples) and evaluates, window by window, in trace mode (:func:`~.cost.evaluate_trace`, one
:class:`CostModel` for all):

``rw``
    row-wise (equal ID ranges over all GPUs), data-independent;
``twrw``
    table-row-wise, tables balanced over nodes by the lookups of the first window;
``static``
    one FlexShard plan (:func:`~.planner.plan_flexshard`) made on the first window, kept;
``resharder``
    :class:`~.resharder.Resharder` starting from the static plan, with decayed statistics (half-life
    one window) that have seen the first window; from the second window on, each quarter window is
    evaluated with the plan in force and only then fed to it, followed by a check (online: the
    re-sharder never sees a sample before it is evaluated).

Iterations are ``G * batch_size`` consecutive samples of one window; a window's trailing partial
iteration is not evaluated (``dropped_samples``) but is counted and fed to the statistics.

Engines and evaluation modes (docs/REPLAY.md): with ``engine="process"`` or ``"ray"``, or with
``evaluation="analytic"``, the window statistics come from :func:`~.distributed.window_stats`
(tasks per file or row-group run, a tree merge per window). ``evaluation="analytic"`` then prices
every strategy with :func:`~.cost.evaluate_analytic` on each window's summaries and feeds the
re-sharder once per window (decayed statistics: scaled, then merged with the window's); no batch
reaches the driver, and equal ``num_workers`` give identical results on every engine.
``evaluation="trace"`` (the default) streams the log through the driver as described above.

Output directory (written to a temporary sibling, then renamed into place: all or nothing):
``summary.json``, ``cdf.json``, ``plans/<strategy>/`` (final plans, :meth:`Plan.save`),
``traffic/<strategy>.npz`` (mean G x G byte matrices over the replay and the link-class matrix).
docs/REPLAY.md gives the schema. Units: bytes, bytes per iteration, seconds, seconds per iteration.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..errors import ConfigError, FlexShardError, LogError
from ..formats.directories import check_output_directory, staging_directory
from ..formats.files import jsonable, write_atomic, write_json
from ..bridge.limits import TORCHREC_REFERENCE_TABLES
from ..optional import import_optional
from ..placement.baselines import build_baseline
from ..placement.cost import (
    A2A_COMPONENTS,
    COMPONENTS,
    Cost,
    CostModel,
    TraceCost,
    check_matrix_size,
    evaluate_analytic,
    evaluate_trace,
)
from ..placement.planner import MemoryPolicy, plan_flexshard
from ..placement.workload import Workload, workload_of
from ..plans.plan import Plan
from ..plans.tables import EmbeddingTable, infer_tables, load_tables, row_map
from ..plans.topology import Topology
from ..sources.distributed import ENGINES, WindowStats, window_stats
from ..sources.ids import IdMode, RowMap
from ..sources.logs import REASONS as _REASONS
from ..sources.logs import LogReader
from ..sources.windows import WindowSpec, parse_window
from ..stats.batch import Batch, concat_batches, rebatch, slice_batch
from ..stats.config import TableConfig
from ..stats.stream import StreamStats
from ..stats.summary import FrequencySummary
from ..stats.window import DecayedStats, decay_factor
from .resharder import Decision, ReshardConfig, Resharder

__all__ = [
    "DEFAULT_WINDOWS",
    "ENGINES",
    "EVALUATIONS",
    "STRATEGIES",
    "TORCHREC_STRATEGY",
    "SUMMARY_VERSION",
    "ReplayResult",
    "WindowSpec",
    "parse_window",
    "replay",
]

#: Strategy names of every replay, in the order they appear everywhere.
STRATEGIES = ("rw", "rw-hash", "twrw", "tw", "static", "resharder")
#: TorchRec's own plan, made on window 0, replayed beside them with ``vs_torchrec`` (after
#: ``tw``); the static FlexShard plan then has it among the plans it chooses from.
TORCHREC_STRATEGY = "torchrec"
#: The replayed strategies that are baselines: "vs best baseline" figures are against the
#: fastest of them over the replay that fits the budget (TorchRec's plan too when replayed).
BASELINES_REPLAYED = ("rw", "rw-hash", "twrw", "tw", TORCHREC_STRATEGY)
#: Without ``window``: this many windows of equal sample counts.
DEFAULT_WINDOWS = 10
SUMMARY_VERSION = 1
#: Evaluation modes of :func:`replay`.
EVALUATIONS = ("trace", "analytic")
_MAX_MATRIX_GPUS = 512            # analytic mode keeps G x G traffic matrices up to this many GPUs
#: B when neither ``batch_size`` nor ``workload`` is given (samples per GPU per iteration).
DEFAULT_BATCH_SIZE = 512
_MAX_CHUNK_SAMPLES = 1 << 20      # whole iterations evaluated per evaluate_trace call, at most


PathLike = Union[str, "os.PathLike[str]"]


# ----------------------------------------------------------------------------- cutting
class _Cutter:
    """Labels samples with their quarter-window index ``k`` (window ``k // Q``, quarter ``k % Q``)
    and cuts reader chunks where it changes. Time windows start at the first sample's ``ts``;
    ``k`` never decreases: a sample whose ``ts`` lies before the current quarter (out of order)
    stays in it and is counted in ``late``."""

    def __init__(self, spec: WindowSpec, quarters: int):
        self.spec = spec
        self.Q = quarters
        self.t0: float | None = None
        self.k_prev = 0
        self.seen = 0
        self.late = 0

    def cut(self, batch: Batch) -> Iterator[tuple[int, Batch]]:
        n = batch.batch_size
        if n == 0:
            return
        Q = self.Q
        if self.spec.unit == "seconds":
            ts = np.broadcast_to(batch.timestamp, (n,)).astype(np.float64)
            if self.t0 is None:
                self.t0 = float(ts[0])
            sub = self.spec.size / Q
            raw = np.floor((ts - self.t0) / sub)
            raw = np.clip(raw, -1, 2 ** 52).astype(np.int64)
            k = np.maximum.accumulate(np.maximum(raw, self.k_prev))
            self.late += int((raw < k).sum())
        else:
            W = int(self.spec.size)
            idx = self.seen + np.arange(n, dtype=np.int64)
            w = idx // W
            k = w * Q + ((idx - w * W) * Q) // W
        self.seen += n
        self.k_prev = int(k[-1])
        cuts = np.flatnonzero(np.diff(k)) + 1
        if cuts.size == 0:
            yield int(k[0]), batch
            return
        lo = 0
        for hi in [*cuts.tolist(), n]:
            yield int(k[lo]), slice_batch(batch, lo, hi)
            lo = hi


# ----------------------------------------------------------------------------- accumulators
class _Acc:
    """Iteration-weighted sums of the costs of one strategy (a window or the whole run): trace-mode
    means (:meth:`add`) or analytic expectations weighted by whole iterations (:meth:`add_cost`)."""

    def __init__(self, G: int, matrices: bool):
        self.n = 0
        self.s = dict.fromkeys(("total", "intra_node", "inter_node", "sync", "sync_inter_node",
                                "comm_time_s", "iteration_time_s"), 0.0)
        self.mem = np.zeros(G)
        self.peak = 0.0
        self.mats = {c: np.zeros((G, G)) for c in COMPONENTS} if matrices else None

    def add(self, tc: TraceCost) -> None:
        self.add_cost(tc.mean, tc.mean.iterations)

    def add_cost(self, c: Cost, k: int) -> None:
        """``k`` iterations of cost ``c`` (per iteration)."""
        if k == 0:
            return
        self.n += k
        self.s["total"] += c.a2a_bytes * k
        self.s["intra_node"] += c.intra_node_bytes * k
        self.s["inter_node"] += c.inter_node_bytes * k
        self.s["sync"] += c.sync_bytes * k
        self.s["sync_inter_node"] += float(c.send["sync"][:, 2].sum()) * k
        self.s["comm_time_s"] += c.comm_time_s * k
        self.s["iteration_time_s"] += c.iteration_time_s * k
        self.mem = np.maximum(self.mem, c.peak_memory_per_gpu)
        self.peak = max(self.peak, c.peak_memory_bytes)
        if self.mats is not None and c.matrices is not None:
            for comp in COMPONENTS:
                self.mats[comp] += c.matrices[comp] * k

    def to_json(self, budget: float | None) -> dict[str, Any]:
        n = self.n
        if n == 0:
            return {"iterations": 0, "bytes_per_iter": None, "comm_time_s_per_iter": None,
                    "iteration_time_s_per_iter": None, "peak_memory_bytes": None,
                    "memory_per_gpu_bytes": None, "budget_bytes": budget}
        s = self.s
        return {"iterations": n,
                "bytes_per_iter": {"total": s["total"] / n, "intra_node": s["intra_node"] / n,
                                   "inter_node": s["inter_node"] / n, "sync": s["sync"] / n,
                                   "sync_inter_node": s["sync_inter_node"] / n},
                "comm_time_s_per_iter": s["comm_time_s"] / n,
                "iteration_time_s_per_iter": s["iteration_time_s"] / n,
                "peak_memory_bytes": self.peak,
                "memory_per_gpu_bytes": self.mem.tolist(),
                "budget_bytes": budget}


@dataclass
class _Window:
    index: int
    sample_start: int
    samples: int = 0
    ts_first: float | None = None
    ts_last: float | None = None
    iterations: int = 0
    dropped: int = 0
    history_start: int = 0
    late_start: int = 0
    accs: dict[str, _Acc] = field(default_factory=dict)


# ----------------------------------------------------------------------------- result
@dataclass
class ReplayResult:
    """What :func:`replay` wrote and computed.

    out_dir : the output directory; summary, cdf : the JSON documents written there;
    plans : final plan per strategy; stats : the whole log's statistics (per feature);
    history : the re-sharder's decisions; elapsed_s : wall time (seconds).
    """

    out_dir: Path
    summary: dict[str, Any]
    cdf: dict[str, Any]
    plans: dict[str, Plan]
    stats: StreamStats
    history: list[Decision]
    elapsed_s: float

    @property
    def windows(self) -> list[dict[str, Any]]:
        return self.summary["windows"]

    @property
    def totals(self) -> dict[str, Any]:
        return self.summary["totals"]


# ----------------------------------------------------------------------------- helpers
#: The replay directory's kind
#: (:func:`~flexshard_stream.formats.directories.check_output_directory`); directories written
#: before kind markers are recognized by their summary.json.
REPLAY_KIND, _REPLAY_LEGACY = "replay", ("summary.json",)
#: What a replay directory holds (``fnmatch`` patterns), ``report``'s page and pictures
#: (``report.PICTURES``) included: all a new replay may replace; anything else is a user's, and
#: the replay is refused rather than delete it.
REPLAY_FILES = ("summary.json", "cdf.json", "plans/*", "traffic/*", "report.html", "cdf.png",
                "bytes_per_iter.png", "threshold.png", "traffic.png", "memory.png")


def _check_out_dir(out: Path) -> None:
    """Refuse to replace anything but a replay directory of only a replay's files (anything
    else would be deleted)."""
    check_output_directory(out, REPLAY_KIND, legacy=_REPLAY_LEGACY, owns=REPLAY_FILES)


def _decision_json(d: Decision) -> dict[str, Any]:
    out = {"check": d.check, "position": d.position, "action": d.action, "reason": d.reason,
           "current_s_per_iter": d.current_s, "target_s_per_iter": d.target_s,
           "applied_s_per_iter": d.applied_s, "migration_bytes": d.migration_bytes,
           "migration_s": d.migration_s, "pause_s": d.pause_s, "iterations": d.iterations,
           "drift_rate": d.drift_rate, "horizon_iterations": d.horizon_iterations,
           "hysteresis": d.hysteresis, "fraction": d.fraction, "thresholds": d.thresholds}
    if d.delta is not None:
        tot = d.delta.summary().get("totals", {})
        out["delta"] = {k: tot[k] for k in ("rows_moved", "promoted", "demoted", "rows_changed")
                        if k in tot}
    return out


# ----------------------------------------------------------------------------- the replay
def _require_ray() -> None:
    """Fail early and clearly when engine "ray" is asked for and Ray is not installed."""
    import_optional("ray", extra="ray", purpose="engine 'ray'")


def _positive_int(value: Any) -> bool:
    """An integer (not a bool) >= 1."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 1


def _check_replay_args(top_k: Any, checks_per_window: Any, half_life_windows: Any, engine: str,
                       evaluation: str, address: str | None, num_workers: Any) -> None:
    """The scalar arguments of :func:`replay` after the workload (which checks B itself), in
    signature order (ConfigError naming the first bad one); engine "ray" needs Ray installed."""
    if not _positive_int(top_k):
        raise ConfigError(f"top_k must be a positive number of rows, got {top_k!r}")
    if not _positive_int(checks_per_window):
        raise ConfigError(f"checks_per_window must be an integer >= 1, got {checks_per_window!r}")
    if not half_life_windows > 0:
        raise ConfigError(f"half_life_windows must be > 0 windows, got {half_life_windows!r}")
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if evaluation not in EVALUATIONS:
        raise ConfigError(f"evaluation {evaluation!r}: expected one of {', '.join(EVALUATIONS)}")
    if address is not None and engine != "ray":
        raise ConfigError(f"address {address!r} is for engine 'ray', not {engine!r}")
    if num_workers is not None and not _positive_int(num_workers):
        raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    if engine == "ray":
        _require_ray()


@dataclass
class _Log:
    """The log of a replay: its files, the tables it feeds, the driver's reader, its data rows
    (bad rows included) and how to open another reader over it."""

    paths: list[str]
    tables: list[EmbeddingTable]
    configs: list[TableConfig]
    features: list[str] | None            # None: inferred by the reader
    reader: LogReader
    total_rows: int
    read_batch_size: int                  # samples per chunk read
    skip_bad_rows: bool
    rows: RowMap                          # IDs -> table rows (ID mode, num_rows checks)
    ts_column: str | None = None          # the time column asked for (None: the default rule)

    def new_reader(self) -> LogReader:
        """A fresh reader over the same files (a second pass)."""
        return LogReader(self.paths, features=self.features,
                         read_batch_size=self.read_batch_size, skip_bad_rows=self.skip_bad_rows,
                         rows=self.rows, ts_column=self.ts_column)


def _open_log(logs: PathLike | Sequence[PathLike],
              tables: Sequence[EmbeddingTable] | PathLike | None, read_batch_size: int,
              skip_bad_rows: bool, ids: IdMode | str | None = None,
              ts_column: str | None = None) -> _Log:
    """Open the log and resolve its tables (given, a TOML file, or inferred from the log) and
    how its IDs become their rows (``ids``, :func:`~.tables.row_map`).

    Raises ConfigError when two tables share a feature or a log feature has no table, LogError
    for an unreadable log.
    """
    paths = [os.fspath(p) for p in
             ([logs] if isinstance(logs, (str, os.PathLike)) else list(logs))]
    if tables is not None and not isinstance(tables, (str, os.PathLike)):
        tabs = list(tables)
    elif tables is not None:
        tabs = load_tables(tables)
    else:
        tabs = None
    feats = [t.feature for t in tabs] if tabs is not None else None
    reader = LogReader(paths, features=feats, read_batch_size=read_batch_size,
                       skip_bad_rows=skip_bad_rows, ts_column=ts_column)
    if tabs is None:
        tabs = infer_tables(paths, dict(reader.schema.features), ids=ids, ts_column=ts_column)
    by_feat = {t.feature: t for t in tabs}
    if len(by_feat) != len(tabs):
        raise ConfigError("two tables are fed by the same feature; each feature may feed one table")
    missing = [f for f in reader.schema.keys if f not in by_feat]
    if missing:
        raise ConfigError(f"log features {missing} have no table")
    configs = [TableConfig(t.name, t.num_rows, t.feature) for t in tabs]
    reader.rows = row_map(tabs, ids)
    return _Log(paths, tabs, configs, feats, reader, reader.data_rows(), read_batch_size,
                skip_bad_rows, reader.rows, ts_column)


def _window_spec(spec: WindowSpec | None, log: _Log) -> WindowSpec:
    """The given window, or :data:`DEFAULT_WINDOWS` windows of equal sample counts; a duration
    needs a ``ts`` column (ConfigError)."""
    if spec is None:
        spec = WindowSpec("samples", max(1, -(-log.total_rows // DEFAULT_WINDOWS)),
                          f"{DEFAULT_WINDOWS} windows")
    if spec.unit == "seconds" and not log.reader.use_ts:
        raise ConfigError(f"window {spec.text!r} is a duration but the log has no 'ts' column "
                          f"({', '.join(log.paths)}); give a number of samples, e.g. "
                          f"--window 100000")
    return spec


@dataclass(frozen=True)
class _Run:
    """The fixed parameters of one replay. Units: samples, windows, seconds."""

    topo: Topology
    spec: WindowSpec
    workload: Workload          # B and the cost model (mean lengths: each window's statistics)
    Q: int                      # re-sharder checks (quarters) per window, trace evaluation
    top_k: int                  # rows per table summarized
    analytic: bool
    half_life_windows: float

    @property
    def B(self) -> int:
        """Samples per GPU per iteration (the workload's)."""
        return self.workload.batch_size

    @property
    def model(self) -> CostModel:
        """The cost model of every evaluation and plan (the workload's)."""
        return self.workload.model

    @property
    def G(self) -> int:
        """GPUs of the topology."""
        return self.topo.num_gpus

    @property
    def spi(self) -> int:
        """Samples per iteration, ``G * B``."""
        return self.G * self.B

    @property
    def unit(self) -> str:
        """Unit of the re-sharder's half-life in trace mode: "seconds" or "batches"."""
        return "seconds" if self.spec.unit == "seconds" else "batches"

    @property
    def half_life(self) -> float:
        """The re-sharder's half-life in :attr:`unit` (seconds, or iterations of ``G * B``)."""
        if self.unit == "seconds":
            return self.half_life_windows * self.spec.size
        return max(1.0, self.half_life_windows * self.spec.size / self.spi)

    @property
    def keep_matrices(self) -> bool:
        """Whether the totals keep G x G traffic matrices (analytic mode: up to 512 GPUs)."""
        return self.G <= _MAX_MATRIX_GPUS or not self.analytic


class _Progress:
    """The ``progress`` callback of :func:`replay`, fed rows read per phase (never backwards
    within a phase)."""

    def __init__(self, callback: Callable[[dict[str, Any]], None] | None, total_rows: int):
        self.callback = callback
        self.total_rows = total_rows
        self.done: dict[str, int] = {}

    def __call__(self, phase: str, rows: int, window: int) -> None:
        """Report ``rows`` data rows read in ``phase``, while in window ``window``."""
        if self.callback is None:
            return
        self.done[phase] = max(self.done.get(phase, 0), int(rows))
        self.callback({"phase": phase, "rows_read": self.done[phase],
                       "total_rows": self.total_rows, "window": window})


def _engine_windows(log: _Log, spec: WindowSpec, engine: str, address: str | None,
                    num_workers: int | None, diag: dict[str, Any], report: _Progress
                    ) -> list[WindowStats]:
    """Every window's statistics from :func:`~.distributed.window_stats` (``diag`` filled with
    its diagnostics). Raises ConfigError when a Ray cluster cannot be reached, LogError for a log
    without samples."""
    phase = f"window statistics ({engine})"
    report(phase, 0, 0)
    try:
        wins = window_stats(log.paths, window=spec, engine=engine, address=address,
                            num_workers=num_workers, skip_bad_rows=log.skip_bad_rows,
                            tables=log.configs, read_batch_size=log.read_batch_size,
                            diagnostics=diag, rows=log.rows, ts_column=log.ts_column)
    except ConnectionError as e:
        if engine != "ray":
            raise
        where = f" at {address!r}" if address else ""
        raise ConfigError(f"engine 'ray': cannot connect to the Ray cluster{where}: "
                          f"{e}") from None
    report(phase, diag.get("rows_read", 0), wins[-1].index if wins else 0)
    if not wins:
        raise LogError(f"no samples to replay in {', '.join(log.paths)}")
    return wins


def _window0_batches(reader: LogReader, cutter: _Cutter, quarters: int,
                     report: _Progress) -> Iterator[Batch]:
    """The samples of the first window (quarters ``0 .. quarters - 1``), in reader chunks."""
    for chunk in reader:
        for k, piece in cutter.cut(chunk):
            if k >= quarters:
                return
            yield piece
        report("planning on the first window", reader.rows_read, 0)


def _first_window(run: _Run, log: _Log, wins: Sequence[WindowStats] | None,
                  report: _Progress) -> tuple[StreamStats, StreamStats | DecayedStats]:
    """Window 0's statistics (for the static plans) and the re-sharder's decayed statistics.

    Engine statistics give window 0 directly (analytic mode: the decayed statistics start as its
    copy; trace mode: they are fed window 0 during the main pass, before any check); otherwise a
    first pass over window 0 of the log feeds both.
    """
    if wins is not None:
        st0 = wins[0].stats
        decayed = (st0.copy() if run.analytic else
                   DecayedStats(log.configs, half_life=run.half_life, unit=run.unit))
        return st0, decayed
    decayed = DecayedStats(log.configs, half_life=run.half_life, unit=run.unit)
    st0 = StreamStats(log.configs)
    first = _window0_batches(log.new_reader(), _Cutter(run.spec, run.Q), run.Q, report)
    for b in rebatch(first, run.spi):
        st0.update(b)
        decayed.update(b)
    return st0, decayed


@dataclass
class _Start:
    """What the first window decides: the plans of rw, twrw and static, the memory budget
    (bytes per GPU, the static plan's), the re-sharder (starting from the static plan) with its
    configuration, and its decayed statistics."""

    plans: dict[str, Plan]
    budget: float
    resharder: Resharder
    config: ReshardConfig
    decayed: StreamStats | DecayedStats
    given: bool = False        # the static plan is the caller's (replay(plan=...))

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategies replayed, in order: the fixed plans, then the re-sharder."""
        return (*self.plans, "resharder")

    @property
    def fixed(self) -> tuple[str, ...]:
        """The strategies whose plan never changes during the replay."""
        return tuple(self.plans)


def _static_plan(run: _Run, tabs: Sequence[EmbeddingTable], sums0: Any, work0: Workload,
                 given: Plan | None, references: Mapping[str, Plan]) -> tuple[Plan, float]:
    """The static plan and the re-sharder's budget (bytes per GPU): the ``given`` plan (the
    user's, its tables those of the log) with the budget it was made within, else a FlexShard plan
    made on window 0 (``references`` among the plans it chooses from) and its budget."""
    if given is not None:
        _check_given_plan(given, tabs, run.topo)
        budget = given.meta.get("budget_bytes")
        if isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0:
            return given, float(budget)
    try:
        res = plan_flexshard(tabs, run.topo, sums0, memory=MemoryPolicy(), workload=work0,
                             references=references)
    except FlexShardError as e:
        raise type(e)(f"the static FlexShard plan on the first window failed: {e}") from None
    return (res.plan if given is None else given), float(res.budget_bytes)


def _check_given_plan(plan: Plan, tabs: Sequence[EmbeddingTable], topo: Topology) -> None:
    """ConfigError unless ``plan`` places exactly the tables ``tabs`` on ``topo``."""
    if plan.topology != topo:
        raise ConfigError(f"the plan to replay was made for {plan.topology.name}, not the "
                          f"replay's {topo.name}; replay it on its own topology")
    mine = {t.name: t for t in tabs}
    theirs = {name: tp.table for name, tp in plan.tables.items()}
    if mine != theirs:
        differ = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        raise ConfigError(f"the plan to replay places other tables than the replay's (differing: "
                          f"{', '.join(differ[:5])}); replay with the plan's own tables")


def _check_torchrec_reference(tabs: Sequence[EmbeddingTable]) -> None:
    """Before any log is read: TorchRec installed (MissingExtraError) and at most
    :data:`~flexshard_stream.bridge.limits.TORCHREC_REFERENCE_TABLES` tables (ConfigError), the
    limit ``plan`` and the demo apply to TorchRec's plan as a reference."""
    import_optional("torchrec", extra="torchrec", purpose="replay with vs_torchrec")
    if len(tabs) > TORCHREC_REFERENCE_TABLES:
        raise ConfigError(f"vs_torchrec: {len(tabs)} tables, more than the "
                          f"{TORCHREC_REFERENCE_TABLES} TorchRec's planner is asked to plan as a "
                          "reference (it takes minutes above); replay its plan made apart "
                          "(plan --strategy torchrec, then replay --plan) instead")


def _torchrec_plan(tabs: Sequence[EmbeddingTable], topo: Topology, sums0, work0) -> Plan:
    """TorchRec's own plan on window 0's statistics (its planner given B and the lengths)."""
    from ..placement.references import plan_torchrec

    try:
        return plan_torchrec(tabs, topo, summaries=sums0, workload=work0).plan
    except FlexShardError as e:
        raise type(e)(f"TorchRec's plan on the first window failed: {e}") from None


def _starting_plans(run: _Run, tabs: Sequence[EmbeddingTable], st0: StreamStats,
                    decayed: StreamStats | DecayedStats,
                    reshard_config: ReshardConfig | None, given: Plan | None = None,
                    vs_torchrec: bool = False) -> _Start:
    """Plan on window 0: the static plan (``given``, else FlexShard's on window 0; its budget
    bounds the re-sharder), twrw and tw balanced by window 0's lookups per iteration, rw and
    hashed rw, TorchRec's plan with ``vs_torchrec``; the re-sharder from the static plan (its
    default configuration: pause, horizon and hysteresis from the measured drift rate)."""
    sums0 = st0.summary(run.top_k)
    work0 = run.workload.for_stats(tabs, run.topo, sums0)   # window 0's lengths and iterations
    refs = ({TORCHREC_STRATEGY: _torchrec_plan(tabs, run.topo, sums0, work0)}
            if vs_torchrec else {})
    static, budget = _static_plan(run, tabs, sums0, work0, given, refs)
    plans: dict[str, Plan] = {
        "rw": build_baseline("rw", tabs, run.topo),
        "rw-hash": build_baseline("rw-hash", tabs, run.topo),
        "twrw": build_baseline("twrw", tabs, run.topo, summaries=sums0, workload=work0),
        "tw": build_baseline("tw", tabs, run.topo, summaries=sums0, workload=work0),
        **refs, "static": static}
    base_cfg = reshard_config or ReshardConfig()
    rs_cfg = dataclasses.replace(base_cfg, check_every=float("inf"), unit=run.unit,
                                 top_k=run.top_k)
    rs = Resharder(tabs, run.topo, stats=decayed, memory=MemoryPolicy(bytes_per_gpu=budget),
                   config=rs_cfg, plan=static, workload=run.workload)
    return _Start(plans, budget, rs, rs_cfg, decayed, given is not None)


def replay(logs: PathLike | Sequence[PathLike], topology: Topology | str,
           tables: Sequence[EmbeddingTable] | PathLike | None = None,
           window: str | int | WindowSpec | None = None, out_dir: PathLike = "replay",
           batch_size: int | None = None, model: CostModel | None = None, *,
           skip_bad_rows: bool = False, top_k: int = 4096, checks_per_window: int = 4,
           half_life_windows: float = 1.0, reshard_config: ReshardConfig | None = None,
           read_batch_size: int = 65536,
           progress: Callable[[dict[str, Any]], None] | None = None,
           engine: str = "local", evaluation: str = "trace", address: str | None = None,
           num_workers: int | None = None, ids: IdMode | str | None = None,
           workload: Workload | None = None, plan: Plan | None = None,
           ts_column: str | None = None, vs_torchrec: bool = False) -> ReplayResult:
    """Replay logs in windows through rw, twrw, a static FlexShard plan and the re-sharder.

    Parameters
    ----------
    logs : path(s), globs or directories of parquet / CSV logs (see :mod:`~.logs`), read in order
    topology : a :class:`Topology`, a topology TOML file or a preset name ("2x8", ...)
    tables : tables (or a table TOML file); default: inferred from the log (rows = largest ID + 1,
        or ROWS with ``ids="hash:ROWS"``; dim 128, fp32)
    window : a duration on ``ts`` ("30m", "1h", "90s") or a number of samples ("100000", 100000);
        default: :data:`DEFAULT_WINDOWS` windows of ``ceil(rows / 10)`` samples (rows from the
        parquet footers or CSV line counts)
    out_dir : directory to write (replaced atomically, as a new version: docs/FILES.md; refused if
        it exists, is not empty and holds no ``summary.json``, or holds a file a replay does not
        write)
    batch_size : B, samples per GPU per iteration (an iteration is ``G * B`` samples; default 512)
    model : the cost model of every evaluation and plan (default ``CostModel()``: de-duplication on)
    workload : the :class:`~flexshard_stream.placement.workload.Workload` instead of
        ``batch_size`` and ``model``; the mean lengths and iterations profiled it leaves out come
        from each window's statistics (window 0's for the static plans)
    skip_bad_rows : drop and count bad rows instead of raising :class:`LogError`
    top_k : rows per table summarized for the planner and the re-sharder, and in ``cdf.json``
    checks_per_window : re-sharder checks per window (one after each 1/checks_per_window of it);
        trace evaluation only (the analytic evaluation checks once per window)
    half_life_windows : half-life of the re-sharder's decayed statistics, in windows
    reshard_config : re-sharder knobs (its ``check_every``, ``unit`` and ``top_k`` are set by the
        replay; its ``pause_s`` is charged per applied delta); default ``ReshardConfig()``
    read_batch_size : samples per chunk read from the logs (memory bound; not ``batch_size``)
    progress : called after every chunk read (per window with the analytic evaluation) with
        ``{"phase", "rows_read", "total_rows", "window"}``
    engine : where the window statistics are computed: "local" (this process), "process"
        (spawned worker processes) or "ray" (Ray tasks), by
        :func:`~.distributed.window_stats`. With "local" and the trace evaluation the driver
        sketches the log itself while it replays it (one stream, as always).
    evaluation : "trace" (the driver streams every window's batches, evaluates them in trace mode
        and feeds them to the re-sharder) or "analytic" (everything from each window's merged
        statistics: :func:`~.cost.evaluate_analytic` on its summaries, the re-sharder fed once
        per window; no batch reaches the driver). See docs/REPLAY.md.
    address : Ray cluster address (engine "ray" only): passed to ``ray.init``
    num_workers : workers of the engine; it also divides the work into tasks (files, or runs of
        row groups), so the statistics, and hence the analytic replay, are identical on every
        engine for equal ``num_workers`` (default: local 1, process the CPU count, Ray the
        cluster's CPUs)
    ids : how the log's IDs become table rows (:class:`~.logs.IdMode`): ``"raw"`` (default; a
        row with an ID out of its table's range is a bad row, ``"out_of_range"``), ``"hash"``
        (ID mod each table's ``num_rows``) or ``"hash:ROWS"``
    plan : the static plan to replay (the user's, e.g. ``Plan.load`` of ``flexshard-stream plan
        --out``) instead of a FlexShard plan made on window 0; the re-sharder starts from it,
        within the budget it records (``meta["budget_bytes"]``, else window 0's planner's). Its
        tables and topology must be the replay's (ConfigError)
    ts_column : the log's time column (default: ``ts``, else ``timestamp``, ``time`` or
        ``event_time``; :data:`~flexshard_stream.sources.logs.TIME_COLUMNS`)
    vs_torchrec : also replay TorchRec's own plan made on window 0 (``"torchrec"``, after
        ``tw``; the ``torchrec`` extra), one of the baselines and among the plans the static
        FlexShard plan is chosen from (not given ``plan``); TorchRec's planner takes seconds to
        minutes, so more than ``TORCHREC_REFERENCE_TABLES`` (64) tables is refused

    Raises
    ------
    LogError : unreadable log, bad row (naming the file and the row), missing column
    ConfigError : unknown topology, bad window spec, time window on a log without ``ts``, unknown
        engine or evaluation, engine "ray" without Ray installed, ...
    Nothing is written unless the whole replay succeeds.
    """
    t_start = time.perf_counter()
    work = workload_of(DEFAULT_BATCH_SIZE if batch_size is None and workload is None
                       else batch_size, model, None, workload, where="replay")
    _check_replay_args(top_k, checks_per_window, half_life_windows, engine, evaluation, address,
                       num_workers)
    out = Path(out_dir)
    _check_out_dir(out)
    spec = parse_window(window) if window is not None else None
    topo = topology if isinstance(topology, Topology) else Topology.load(topology)
    if evaluation == "trace":
        check_matrix_size(topo, "replay's trace evaluation")
    log = _open_log(logs, tables, read_batch_size, skip_bad_rows, ids, ts_column)
    if vs_torchrec:
        _check_torchrec_reference(log.tables)
    run = _Run(topo, _window_spec(spec, log), work, int(checks_per_window), int(top_k),
               evaluation == "analytic", half_life_windows)
    report = _Progress(progress, log.total_rows)
    diag: dict[str, Any] = {}
    wins = (_engine_windows(log, run.spec, engine, address, num_workers, diag, report)
            if engine != "local" or run.analytic else None)
    st0, decayed = _first_window(run, log, wins, report)
    if st0.samples == 0:
        raise LogError(f"no samples to replay in {', '.join(log.paths)}")
    start = _starting_plans(run, log.tables, st0, decayed, reshard_config, plan, vs_torchrec)
    tot = {s: _Acc(run.G, run.keep_matrices) for s in start.strategies}
    replaying = functools.partial(report, "replaying")
    if run.analytic:
        windows = _analytic_pass(wins, run, log.reader.use_ts, start, tot, replaying)
        whole, counts = _merge_windows(wins), _engine_counts(diag, run.spec)
    else:
        whole = None if wins is None else _merge_windows(wins)
        windows, whole, counts = _TracePass(run, start, tot, log.configs, whole,
                                            replaying).run_over(log.reader)
    if not windows:
        raise LogError(f"no samples to replay in {', '.join(log.paths)}")
    final = {**start.plans, "resharder": start.resharder.plan}
    totals = _totals(tot, start, final, windows, counts)
    summary = _summary_doc(run, log, engine, evaluation,
                           diag.get("workers") if wins is not None else None, start, windows,
                           totals, counts["t0"], time.perf_counter() - t_start)
    cdf = _cdf(whole, log.tables, final, run.top_k)
    _write(out, summary, cdf, final, tot if run.keep_matrices else {}, topo)
    return ReplayResult(out, summary, cdf, final, whole, list(start.resharder.history),
                        time.perf_counter() - t_start)


def _summary_doc(run: _Run, log: _Log, engine: str, evaluation: str, workers: int | None,
                 start: _Start, windows: list[dict[str, Any]], totals: dict[str, Any],
                 t0: float | None, elapsed_s: float) -> dict[str, Any]:
    """``summary.json`` (docs/REPLAY.md): what was replayed and how, the windows and the totals;
    ``t0``: the origin of time windows (seconds), ``elapsed_s``: wall time so far (seconds)."""
    topo = run.topo
    return jsonable({
        "version": SUMMARY_VERSION, "logs": log.paths, "engine": engine,
        "evaluation": evaluation, "workers": workers,
        "topology": {"name": topo.name, "nodes": topo.nodes, "gpus_per_node": topo.gpus_per_node,
                     "num_gpus": run.G, "summary": topo.summary()},
        "tables": [t.to_dict() for t in log.tables],
        "batch_size": run.B, "samples_per_iteration": run.spi,
        "window": {**run.spec.to_json(), "position": "ts" if log.reader.use_ts else "sample",
                   "t0": t0, "checks_per_window": 1 if run.analytic else run.Q},
        "strategies": list(start.strategies),
        "model": dataclasses.asdict(run.model),
        "budget_bytes": start.budget,
        "static_plan": "given" if start.given else "window 0",
        "resharder": _resharder_doc(run, start.config),
        "windows": windows,
        "totals": totals,
        "warnings": _warnings(run, windows, totals),
        "elapsed_s": elapsed_s,
    })


def _engine_counts(diag: Mapping[str, Any], spec: WindowSpec) -> dict[str, Any]:
    """Samples, rows read, origin and bad rows of the analytic evaluation, from the engine's
    diagnostics (the trace pass counts them itself)."""
    return {"samples": int(diag["samples"]), "rows_read": int(diag["rows_read"]),
            "late": 0, "t0": diag.get("origin") if spec.unit == "seconds" else None,
            "skipped": {**dict.fromkeys(_REASONS, 0), **diag.get("skipped", {})},
            "skipped_by_file": diag.get("skipped_by_file", {})}


def _resharder_doc(run: _Run, config: ReshardConfig) -> dict[str, Any]:
    """``summary["resharder"]``: half-life (windows in analytic mode, else seconds or
    iterations), the configuration (without ``check_every``) and the checks per window."""
    return {"half_life": run.half_life_windows if run.analytic else run.half_life,
            "half_life_unit": "windows" if run.analytic else run.unit,
            "config": {k: v for k, v in dataclasses.asdict(config).items()
                       if k != "check_every"},
            "checks_per_window": 1 if run.analytic else run.Q}


def _strategy_totals(name: str, a: _Acc, budget: float, rs: Resharder, plan: Plan,
                     rw_time: float, best: tuple[str, float]) -> dict[str, Any]:
    """One strategy's entry of ``summary["totals"]["strategies"]``: per-iteration means, sums
    over the replay (bytes, seconds), migration and pauses (the re-sharder's only; the others
    never change their plan), the total cost, the final tiers, and the speed-ups over row-wise
    and over ``best`` (the fastest baseline replayed: name, comm time)."""
    d = a.to_json(budget)
    d["total_bytes"] = {"total": a.s["total"], "intra_node": a.s["intra_node"],
                        "inter_node": a.s["inter_node"], "sync": a.s["sync"]}
    d["comm_time_s"] = a.s["comm_time_s"]
    d["iteration_time_s"] = a.s["iteration_time_s"]
    d.update(_migration_totals(rs.history if name == "resharder" else []))
    d["total_cost_s"] = a.s["iteration_time_s"] + d["migration_s"] + d["pause_s"]
    d["speedup_vs_rw"] = (rw_time / a.s["comm_time_s"]) if a.s["comm_time_s"] > 0 else None
    d["best_baseline"] = best[0]
    d["speedup_vs_best_baseline"] = (best[1] / a.s["comm_time_s"]
                                     if best[1] is not None and a.s["comm_time_s"] > 0 else None)
    d["tiers"] = plan.tier_sizes()
    return d


def _migration_totals(decisions: Sequence[Decision]) -> dict[str, Any]:
    """What the applied deltas among ``decisions`` cost: ``migration_bytes``, ``migration_s``
    (transfer at the topology's bandwidths), ``pause_s`` (the fixed pauses), ``deltas``."""
    applied = [d for d in decisions if d.delta is not None]
    return {"migration_bytes": float(sum(d.migration_bytes for d in applied)),
            "migration_s": float(sum(d.migration_s for d in applied)),
            "pause_s": float(sum(d.pause_s for d in applied)), "deltas": len(applied)}


def _best_baseline(tot: Mapping[str, _Acc], budget: float) -> tuple[str | None, float | None]:
    """The replayed baseline with the least communication time among those whose peak memory
    per GPU fits ``budget`` (bytes), with that time (seconds over the replay); (None, None) when
    none fits (a "best baseline that fits" must fit)."""
    fits = [(b, tot[b].s["comm_time_s"]) for b in BASELINES_REPLAYED
            if b in tot and tot[b].n and tot[b].peak <= budget * (1 + 1e-9)]
    return min(fits, key=lambda x: x[1]) if fits else (None, None)


def _totals(tot: Mapping[str, _Acc], start: _Start, final: Mapping[str, Plan],
            windows: Sequence[Mapping[str, Any]], counts: Mapping[str, Any]) -> dict[str, Any]:
    """``summary["totals"]``: samples, rows, windows, iterations, dropped / late / skipped
    samples, the re-sharder's checks and decisions, and every strategy's totals."""
    rs = start.resharder
    rw_time = tot["rw"].s["comm_time_s"]
    best = _best_baseline(tot, start.budget)
    skipped = counts["skipped"]
    return {"samples": counts["samples"], "rows_read": counts["rows_read"],
            "windows": len(windows), "iterations": tot["rw"].n,
            "dropped_samples": int(sum(w["dropped_samples"] for w in windows)),
            "late_samples": counts["late"],
            "skipped_rows": int(sum(skipped.values())), "skipped": skipped,
            "skipped_by_file": {f: c for f, c in counts["skipped_by_file"].items()
                                if any(c.values())},
            "checks": len(rs.history),
            "decisions": {a: sum(1 for d in rs.history if d.action == a)
                          for a in ("applied", "partial", "kept", "failed", "skipped")},
            "strategies": {s: _strategy_totals(s, tot[s], start.budget, rs, final[s], rw_time,
                                              best)
                           for s in start.strategies}}


def _warnings(run: _Run, windows: Sequence[Mapping[str, Any]],
              totals: Mapping[str, Any]) -> list[str]:
    """What the reader of the summary should know: windows too small to evaluate, late samples,
    many samples in partial iterations, traffic matrices not kept."""
    out = []
    spi, G = run.spi, run.G
    empty = [w["index"] for w in windows if w["iterations"] == 0]
    if empty:
        out.append(f"{len(empty)} of {len(windows)} window(s) hold fewer samples than one "
                   f"iteration (G x B = {spi:,}) and were not evaluated (windows "
                   f"{empty[:10]}{' ...' if len(empty) > 10 else ''}); use a smaller "
                   f"--batch-size or larger windows")
    if totals["late_samples"]:
        out.append(f"{totals['late_samples']:,} sample(s) had a ts before their window (the log "
                   f"is not in time order); they were kept in the window being read")
    samples_total = totals["samples"]
    if samples_total and totals["dropped_samples"] > 0.25 * samples_total:
        out.append(f"{totals['dropped_samples']:,} of {samples_total:,} samples fall in "
                   f"windows' partial last iterations and were not evaluated; use a smaller "
                   f"--batch-size or larger windows")
    if not run.keep_matrices:
        out.append(f"{G} GPUs: the analytic evaluation keeps no G x G traffic matrices "
                   f"beyond {_MAX_MATRIX_GPUS} GPUs; traffic/*.npz was not written")
    return out


def _merge_windows(wins: Sequence[WindowStats]) -> StreamStats:
    """The whole log's statistics: every window's merged into a copy of the first, in order."""
    whole = wins[0].stats.copy()
    for w in wins[1:]:
        whole.merge(w.stats)
    return whole


def _window_doc(index: int, start: Any, end: Any, samples: int, sample_start: int,
                ts_first: float | None, ts_last: float | None, iterations: int, dropped: int,
                late: int, accs: Mapping[str, _Acc], budget: float, rs: Resharder,
                history_start: int, thresholds: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One entry of ``summary["windows"]`` (both evaluations)."""
    decs = rs.history[history_start:]
    counts = {a: 0 for a in ("applied", "partial", "kept", "failed", "skipped")}
    for d in decs:
        counts[d.action] = counts.get(d.action, 0) + 1
    strat = {s: a.to_json(budget) for s, a in accs.items()}
    mig = _migration_totals(decs)
    strat["resharder"]["migration_bytes"] = mig["migration_bytes"]
    for s, a in accs.items():
        paid = mig["migration_s"] + mig["pause_s"] if s == "resharder" else 0.0
        strat[s]["total_cost_s"] = a.s["iteration_time_s"] + paid
    return {"index": index, "start": start, "end": end, "samples": samples,
            "sample_start": sample_start, "sample_end": sample_start + samples,
            "ts_first": ts_first, "ts_last": ts_last,
            "iterations": iterations, "dropped_samples": dropped,
            "late_samples": late,
            "strategies": strat, "migration_bytes": mig["migration_bytes"],
            "migration_s": mig["migration_s"], "pause_s": mig["pause_s"],
            "thresholds": thresholds,
            "decisions": counts,
            "checks": [_decision_json(d) for d in decs]}


def _analytic_pass(wins: Sequence[WindowStats], run: _Run, use_ts: bool, start: _Start,
                   tot: Mapping[str, _Acc], report: Callable[[int, int], None]
                   ) -> list[dict[str, Any]]:
    """The analytic evaluation: per window, every strategy priced by ``evaluate_analytic`` on the
    window's summaries (weighted by its whole iterations), then (from the second window on) the
    window merged into the re-sharder's decayed statistics and one check."""
    rs, decayed, spec = start.resharder, start.decayed, run.spec
    want = run.G <= _MAX_MATRIX_GPUS
    windows: list[dict[str, Any]] = []
    sample_start = 0
    prev = wins[0].index
    for i, ws in enumerate(wins):
        st = ws.stats
        n = int(st.samples)
        its = n // run.spi
        hist0 = len(rs.history)
        accs = {s: _Acc(run.G, False) for s in start.strategies}
        if its:
            for s, c in _analytic_costs(run, start, st.summary(run.top_k), want).items():
                accs[s].add_cost(c, its)
                tot[s].add_cost(c, its)
        if i > 0:     # online: the window is evaluated with the plan in force, then seen
            decayed.scale(decay_factor(ws.index - prev, run.half_life_windows))
            decayed.merge(st)
            pos = (float(st.last_ts) if use_ts and st.last_ts is not None
                   else float(sample_start + n))
            dsums = decayed.summary(run.top_k)
            rs.check(summaries=dsums, position=pos, iterations=n / run.spi)
        else:
            dsums = decayed.summary(run.top_k)
        prev = ws.index
        if spec.unit == "seconds":
            bounds = ws.start, ws.end
        elif use_ts:
            bounds = st.first_ts, st.last_ts
        else:
            bounds = sample_start, sample_start + n
        windows.append(_window_doc(ws.index, *bounds, n, sample_start, st.first_ts,
                                   st.last_ts, its, n - its * run.spi, 0, accs, start.budget, rs,
                                   hist0, rs.thresholds(dsums)))
        sample_start += n
        report(sample_start, ws.index)
    return windows


def _analytic_costs(run: _Run, start: _Start, sums: Mapping[str, FrequencySummary],
                    want_matrices: bool) -> dict[str, Cost]:
    """Every strategy's expected cost per iteration on one window's summaries (the re-sharder's
    is the static plan's while it has not moved)."""
    plans, rs = start.plans, start.resharder
    costs = {s: evaluate_analytic(plans[s], sums, workload=run.workload,
                                  want_matrices=want_matrices)
             for s in start.fixed}
    costs["resharder"] = (costs["static"] if rs.plan is plans["static"] else
                          evaluate_analytic(rs.plan, sums, workload=run.workload,
                                            want_matrices=want_matrices))
    return costs


class _TracePass:
    """The trace evaluation: the driver streams the log once, cuts it into windows and quarters
    and evaluates whole iterations in trace mode, feeding the re-sharder online.

    ``whole`` None: the whole log's statistics are computed here; given (from the engine's
    window statistics): window 0's batches are fed to the decayed statistics here (the engine's
    statistics made the static plans, so there was no pass over the first window).

    State between reader chunks: the window being read (``win``, quarter ``q``), its samples not
    yet forming a whole iteration (``pend``), whole iterations not yet evaluated (``chunk``), and
    what the re-sharder was fed (``fed`` samples, last position ``pos``, ``unchecked``).
    """

    def __init__(self, run: _Run, start: _Start, tot: Mapping[str, _Acc],
                 configs: Sequence[TableConfig], whole: StreamStats | None,
                 report: Callable[[int, int], None]):
        self.run, self.start, self.tot, self.report = run, start, tot, report
        self.rs = start.resharder
        self.feed_window0 = whole is not None
        self.whole = StreamStats(configs) if whole is None else whole
        self.cut = _Cutter(run.spec, run.Q)
        self.windows: list[dict[str, Any]] = []
        self.win: _Window | None = None
        self.q: int | None = None
        self.pend: list[Batch] = []
        self.pend_n = 0                 # samples in ``pend``
        self.chunk: list[Batch] = []     # whole iterations, G * B samples each
        self.fed = 0                    # samples fed to the re-sharder (or in window 0)
        self.pos = 0.0                  # position of the last sample fed (ts or sample index)
        self.unchecked = False
        self.samples_seen = 0
        self.use_ts = False             # the log has ``ts`` (set by :meth:`run_over`)

    def run_over(self, reader: LogReader
                 ) -> tuple[list[dict[str, Any]], StreamStats, dict[str, Any]]:
        """Replay the whole log; returns the window entries, the whole log's statistics and the
        counts (samples, rows read, late samples, origin ``t0``, bad rows skipped)."""
        self.use_ts = reader.use_ts
        for chunk_batch in reader:
            if not self.feed_window0:
                self.whole.update(chunk_batch)
            for k, piece in self.cut.cut(chunk_batch):
                self._add(k, piece)
            self.report(reader.rows_read, self.win.index if self.win else 0)
        if self.win is not None:
            self._end_window()
        counts = {"samples": reader.samples, "rows_read": reader.rows_read, "late": self.cut.late,
                  "t0": self.cut.t0, "skipped": reader.skipped,
                  "skipped_by_file": reader.skipped_by_file}
        return self.windows, self.whole, counts

    def _add(self, k: int, piece: Batch) -> None:
        """A piece of quarter ``k``: close the window or quarter it ends, then buffer it."""
        w, q = divmod(k, self.run.Q)
        if self.win is None or w != self.win.index:
            if self.win is not None:
                self._end_window()
            self._start_window(w, q)
        elif q != self.q:
            self._evaluate_chunk()
            self._check()
            self.q = q
        win = self.win
        n = piece.batch_size
        win.samples += n
        self.samples_seen += n
        if piece.timestamp is not None:
            lo, hi = float(piece.timestamp.min()), float(piece.timestamp.max())
            win.ts_first = lo if win.ts_first is None else min(win.ts_first, lo)
            win.ts_last = hi if win.ts_last is None else max(win.ts_last, hi)
        self.pend.append(piece)
        self.pend_n += n
        self._cut_iterations()
        self.report(self.samples_seen, w)

    def _start_window(self, w: int, q: int) -> None:
        """Open window ``w`` at quarter ``q``: its accumulators, the decisions and late samples
        so far."""
        self.fed = self.samples_seen      # every earlier sample was fed or is window 0
        self.win = _Window(w, self.samples_seen, history_start=len(self.rs.history),
                           late_start=self.cut.late,
                           accs={s: _Acc(self.run.G, False) for s in self.start.strategies})
        self.q = q

    def _feed(self, b: Batch) -> None:
        """Feed the re-sharder; a check's position is in the unit of the windows' start / end:
        the last fed sample's ts when the log has one, else the global index after it."""
        self.rs.update(b)
        self.fed += b.batch_size
        self.pos = float(np.max(b.timestamp)) if b.timestamp is not None else float(self.fed)
        self.unchecked = True

    def _evaluate_chunk(self) -> None:
        """Evaluate the whole iterations buffered with every strategy's plan, then let the
        re-sharder see them (window 0: only its decayed statistics, when the engine planned)."""
        if not self.chunk:
            return
        win, chunk, plans, run = self.win, self.chunk, self.start.plans, self.run
        costs = {s: evaluate_trace(plans[s], chunk, workload=run.workload, keep_matrices=False)
                 for s in self.start.fixed}
        costs["resharder"] = (costs["static"] if self.rs.plan is plans["static"]
                              else evaluate_trace(self.rs.plan, chunk, workload=run.workload))
        for s, tc in costs.items():
            win.accs[s].add(tc)
            self.tot[s].add(tc)
        win.iterations += len(chunk)
        if win.index > 0:
            for b in chunk:
                self._feed(b)
        elif self.feed_window0:
            for b in chunk:
                self.start.decayed.update(b)
        self.chunk = []

    def _check(self) -> None:
        """One re-sharder check after a quarter, from the second window on, if it saw samples."""
        if self.win.index > 0 and self.unchecked:
            self.rs.check(position=self.pos)
            self.unchecked = False

    def _cut_iterations(self) -> None:
        """Move whole iterations from ``pend`` to ``chunk``; evaluate when the chunk is large."""
        spi = self.run.spi
        if self.pend_n < spi:
            return
        allp = concat_batches(self.pend)
        n = allp.batch_size
        lo = 0
        while n - lo >= spi:
            self.chunk.append(slice_batch(allp, lo, lo + spi) if n != spi else allp)
            lo += spi
        self.pend = [slice_batch(allp, lo, n)] if lo < n else []
        self.pend_n = n - lo
        if len(self.chunk) * spi >= _MAX_CHUNK_SAMPLES:
            self._evaluate_chunk()

    def _end_window(self) -> None:
        """Evaluate what is left, count the trailing partial iteration (fed, not evaluated),
        check, and record the window."""
        win = self.win
        self._evaluate_chunk()
        if self.pend_n:
            win.dropped += self.pend_n
            if win.index > 0:
                for b in self.pend:
                    self._feed(b)
            elif self.feed_window0:
                self.start.decayed.update(concat_batches(self.pend))
        self.pend, self.pend_n = [], 0
        self._check()
        self.windows.append(self._window_entry(win))

    def _window_entry(self, win: _Window) -> dict[str, Any]:
        """The window's entry of ``summary["windows"]``; bounds in seconds (time windows, or the
        first / last ``ts`` seen) or sample offsets."""
        spec = self.run.spec
        if spec.unit == "seconds":
            start = self.cut.t0 + win.index * spec.size
            end = start + spec.size
        elif self.use_ts:
            start, end = win.ts_first, win.ts_last
        else:
            start, end = win.sample_start, win.sample_start + win.samples
        return _window_doc(win.index, start, end, win.samples, win.sample_start, win.ts_first,
                           win.ts_last, win.iterations, win.dropped, self.cut.late - win.late_start,
                           win.accs, self.start.budget, self.rs, win.history_start,
                           self.rs.thresholds())


def _cdf(whole: StreamStats, tabs: Sequence[EmbeddingTable], final: Mapping[str, Plan],
         top_k: int) -> dict[str, Any]:
    """Per table: the whole log's top rows (lookups, sorted), cumulative share of all lookups and
    the tier cut points of the static and final re-sharder plans."""
    sums = whole.summary(top_k)
    out: dict[str, Any] = {"top_k": top_k, "tables": {}}
    for t in tabs:
        s = sums[t.feature]
        est = np.asarray(s.top_est, dtype=np.float64)
        order = np.argsort(-est, kind="stable")
        est = est[order]
        cum = np.cumsum(est) / s.total if s.total else np.zeros(est.size)
        cuts = {}
        for name in ("static", "resharder"):
            tp = final[name][t.name]
            k0, k1 = int(tp.global_ids.size), int(tp.node_ids.size)
            rep = np.concatenate([tp.global_ids, tp.node_ids])
            cuts[name] = {"k0": k0, "k0_k1": k0 + k1,
                          "global_share": float(s.probabilities(tp.global_ids).sum()),
                          "replicated_share": float(s.probabilities(rep).sum())}
        out["tables"][t.name] = {
            "feature": t.feature, "num_rows": t.num_rows, "total": int(s.total),
            "exact": bool(s.exact), "distinct_estimate": float(s.distinct_estimate),
            "tail_mass": float(s.tail_mass),
            "top_counts": [float(round(x, 3)) for x in est.tolist()],
            "cumulative_share": [float(f"{x:.6g}") for x in cum.tolist()],
            "cuts": cuts}
    return jsonable(out)


def _write(out: Path, summary: dict, cdf: dict, final: Mapping[str, Plan],
           tot: Mapping[str, _Acc], topo: Topology) -> None:
    """Everything into a temporary directory, then published at ``out`` (all or nothing: renamed
    into place, or as a new version behind the ``out`` symlink,
    :func:`~flexshard_stream.formats.directories.staging_directory`). Directories get the usual
    mode (``0o777`` less the umask), files ``0o644``."""
    _check_out_dir(out)
    with staging_directory(out, kind=REPLAY_KIND, legacy=_REPLAY_LEGACY,
                           owns=REPLAY_FILES) as tmp:
        write_json(tmp / "summary.json", summary, indent=1, mode=0o644)
        write_json(tmp / "cdf.json", cdf, indent=None, mode=0o644)
        for s, p in final.items():
            p.save(tmp / "plans" / s)
        (tmp / "traffic").mkdir()
        lc = topo.link_class_matrix()
        for s, a in tot.items():
            write_atomic(tmp / "traffic" / f"{s}.npz", _traffic_npz(a, lc), mode=0o644)
        _usual_directory_modes(tmp)


def _traffic_npz(acc: _Acc, link_class: np.ndarray) -> bytes:
    """``traffic/<strategy>.npz``: the mean G x G byte matrices per iteration (``a2a`` and each
    component), the link-class matrix and the iterations averaged. ``a2a`` is the bytes over
    links: under the ``torchrec`` profile the components also hold each rank's own chunk on their
    diagonal, which ``a2a`` leaves out (as ``Cost.a2a_bytes`` does)."""
    k = max(acc.n, 1)
    mats = {c: acc.mats[c] / k for c in COMPONENTS}
    a2a = sum(mats[c] for c in A2A_COMPONENTS)
    np.fill_diagonal(a2a, 0.0)
    buf = io.BytesIO()
    np.savez(buf, a2a=a2a, link_class=link_class, iterations=np.int64(acc.n), **mats)
    return buf.getvalue()


def _usual_directory_modes(root: Path) -> None:
    """``root`` and the directories under it get ``0o777`` less the umask (temporary
    directories are made ``0o700``)."""
    mask = os.umask(0)
    os.umask(mask)
    for p in [root, *root.rglob("*")]:
        if p.is_dir():
            os.chmod(p, 0o777 & ~mask)
