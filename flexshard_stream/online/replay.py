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
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..errors import ConfigError, FlexShardError, LogError
from ..formats.container import replace_directory
from ..placement.baselines import build_baseline
from ..placement.cost import (
    A2A_COMPONENTS,
    COMPONENTS,
    Cost,
    CostModel,
    TraceCost,
    evaluate_analytic,
    evaluate_trace,
)
from ..placement.plan import Plan
from ..placement.planner import MemoryPolicy, plan_flexshard
from ..placement.tables import EmbeddingTable, infer_tables, load_tables
from ..placement.topology import Topology
from ..sources.logs import REASONS as _REASONS
from ..sources.logs import LogReader, csv_data_rows
from ..sources.windows import WindowSpec, parse_window
from ..stats.batch import Batch, concat_batches, rebatch, slice_batch
from ..stats.config import TableConfig
from ..stats.stream import StreamStats
from ..stats.window import DecayedStats
from .distributed import ENGINES, WindowStats, window_stats
from .resharder import Decision, ReshardConfig, Resharder

__all__ = [
    "DEFAULT_WINDOWS",
    "ENGINES",
    "EVALUATIONS",
    "STRATEGIES",
    "SUMMARY_VERSION",
    "ReplayResult",
    "WindowSpec",
    "parse_window",
    "replay",
]

#: Strategy names, in the order they appear everywhere.
STRATEGIES = ("rw", "twrw", "static", "resharder")
#: Without ``window``: this many windows of equal sample counts.
DEFAULT_WINDOWS = 10
SUMMARY_VERSION = 1
#: Evaluation modes of :func:`replay`.
EVALUATIONS = ("trace", "analytic")
_MAX_MATRIX_GPUS = 512            # analytic mode keeps G x G traffic matrices up to this many GPUs
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


def _count_rows(reader: LogReader) -> int:
    """Data rows in the log (bad rows included): parquet footers, CSV line counts."""
    total = 0
    for info in reader._infos:
        if info.num_rows is not None:
            total += int(info.num_rows)
            continue
        total += csv_data_rows(info.path)
    return total


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
def _finite(x: Any) -> Any:
    """JSON-safe: NaN / inf -> None, numpy scalars -> Python, recursively."""
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, np.ndarray):
        return _finite(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        v = float(x)
        return v if math.isfinite(v) else None
    return x


def _check_out_dir(out: Path) -> None:
    """Refuse to replace a directory that is not ours (it would be deleted)."""
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"{out}: exists and is not a directory; choose another output "
                              f"directory")
        if any(out.iterdir()) and not (out / "summary.json").is_file():
            raise ConfigError(f"{out}: exists, is not empty and holds no summary.json (not a "
                              f"replay directory); it would be replaced: choose another output "
                              f"directory or remove it")


def _decision_json(d: Decision) -> dict[str, Any]:
    out = {"check": d.check, "position": d.position, "action": d.action, "reason": d.reason,
           "current_s_per_iter": d.current_s, "target_s_per_iter": d.target_s,
           "applied_s_per_iter": d.applied_s, "migration_bytes": d.migration_bytes,
           "migration_s": d.migration_s, "fraction": d.fraction, "thresholds": d.thresholds}
    if d.delta is not None:
        tot = d.delta.summary().get("totals", {})
        out["delta"] = {k: tot[k] for k in ("rows_moved", "promoted", "demoted", "rows_changed")
                        if k in tot}
    return out


# ----------------------------------------------------------------------------- the replay
def _require_ray() -> None:
    """Fail early and clearly when engine "ray" is asked for and Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("engine 'ray' needs Ray, which is not installed: "
                          "pip install 'flexshard_stream[ray]' (or 'ray>=2.9')") from None


def replay(logs: PathLike | Sequence[PathLike], topology: Topology | str,
           tables: Sequence[EmbeddingTable] | PathLike | None = None,
           window: str | int | WindowSpec | None = None, out_dir: PathLike = "replay",
           batch_size: int = 512, model: CostModel | None = None, *,
           skip_bad_rows: bool = False, top_k: int = 4096, checks_per_window: int = 4,
           half_life_windows: float = 1.0, reshard_config: ReshardConfig | None = None,
           read_batch_size: int = 65536,
           progress: Callable[[dict[str, Any]], None] | None = None,
           engine: str = "local", evaluation: str = "trace", address: str | None = None,
           num_workers: int | None = None) -> ReplayResult:
    """Replay logs in windows through rw, twrw, a static FlexShard plan and the re-sharder.

    Parameters
    ----------
    logs : path(s), globs or directories of parquet / CSV logs (see :mod:`~.logs`), read in order
    topology : a :class:`Topology`, a topology TOML file or a preset name ("2x8", ...)
    tables : tables (or a table TOML file); default: inferred from the log (rows = largest ID + 1,
        dim 128, fp32)
    window : a duration on ``ts`` ("30m", "1h", "90s") or a number of samples ("100000", 100000);
        default: :data:`DEFAULT_WINDOWS` windows of ``ceil(rows / 10)`` samples (rows from the
        parquet footers or CSV line counts)
    out_dir : directory to write (replaced whole, atomically; refused if it exists, is not empty
        and holds no ``summary.json``)
    batch_size : B, samples per GPU per iteration (an iteration is ``G * B`` samples)
    model : the cost model of every evaluation and plan (default ``CostModel()``: de-duplication on)
    skip_bad_rows : drop and count bad rows instead of raising :class:`LogError`
    top_k : rows per table summarized for the planner and the re-sharder, and in ``cdf.json``
    checks_per_window : re-sharder checks per window (one after each 1/checks_per_window of it);
        trace evaluation only (the analytic evaluation checks once per window)
    half_life_windows : half-life of the re-sharder's decayed statistics, in windows
    reshard_config : re-sharder knobs (its ``check_every``, ``unit`` and ``top_k`` are set by the
        replay); default horizon: the iterations of one window (measured on the first window)
    read_batch_size : samples per chunk read from the logs (memory bound)
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

    Raises
    ------
    LogError : unreadable log, bad row (naming the file and the row), missing column
    ConfigError : unknown topology, bad window spec, time window on a log without ``ts``, unknown
        engine or evaluation, engine "ray" without Ray installed, ...
    Nothing is written unless the whole replay succeeds.
    """
    t_start = time.perf_counter()
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size <= 0:
        raise ConfigError(f"batch_size must be a positive number of samples per GPU, got "
                          f"{batch_size!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ConfigError(f"top_k must be a positive number of rows, got {top_k!r}")
    if isinstance(checks_per_window, bool) or not isinstance(checks_per_window, (int, np.integer)) \
            or checks_per_window < 1:
        raise ConfigError(f"checks_per_window must be an integer >= 1, got {checks_per_window!r}")
    if not half_life_windows > 0:
        raise ConfigError(f"half_life_windows must be > 0 windows, got {half_life_windows!r}")
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if evaluation not in EVALUATIONS:
        raise ConfigError(f"evaluation {evaluation!r}: expected one of {', '.join(EVALUATIONS)}")
    if address is not None and engine != "ray":
        raise ConfigError(f"address {address!r} is for engine 'ray', not {engine!r}")
    if num_workers is not None and (isinstance(num_workers, bool)
                                    or not isinstance(num_workers, (int, np.integer))
                                    or num_workers < 1):
        raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    if engine == "ray":
        _require_ray()
    B = int(batch_size)
    Q = int(checks_per_window)
    top_k = int(top_k)
    model = model or CostModel()
    out = Path(out_dir)
    _check_out_dir(out)
    spec = parse_window(window) if window is not None else None
    topo = topology if isinstance(topology, Topology) else Topology.load(topology)
    G = topo.num_gpus
    spi = G * B
    analytic = evaluation == "analytic"

    # ---------------------------------------------------------------- the log and its tables
    log_paths = [logs] if isinstance(logs, (str, os.PathLike)) else list(logs)
    log_strs = [os.fspath(p) for p in log_paths]
    if tables is not None and not isinstance(tables, (str, os.PathLike)):
        tabs = list(tables)
    elif tables is not None:
        tabs = load_tables(tables)
    else:
        tabs = None
    feats = [t.feature for t in tabs] if tabs is not None else None

    def new_reader() -> LogReader:
        return LogReader(log_strs, features=feats, batch_size=read_batch_size,
                         skip_bad_rows=skip_bad_rows)

    reader = new_reader()
    if tabs is None:
        tabs = infer_tables(log_strs, dict(reader.schema.features))
    by_feat = {t.feature: t for t in tabs}
    if len(by_feat) != len(tabs):
        raise ConfigError("two tables are fed by the same feature; each feature may feed one table")
    missing = [f for f in reader.schema.keys if f not in by_feat]
    if missing:
        raise ConfigError(f"log features {missing} have no table")
    total_rows = _count_rows(reader)
    if spec is None:
        spec = WindowSpec("samples", max(1, -(-total_rows // DEFAULT_WINDOWS)),
                          f"{DEFAULT_WINDOWS} windows")
    if spec.unit == "seconds" and not reader.use_ts:
        raise ConfigError(f"window {spec.text!r} is a duration but the log has no 'ts' column "
                          f"({', '.join(log_strs)}); give a number of samples, e.g. "
                          f"--window 100000")
    configs = [TableConfig(t.name, t.num_rows, t.feature) for t in tabs]
    unit = "seconds" if spec.unit == "seconds" else "batches"
    half_life = (half_life_windows * spec.size if unit == "seconds"
                 else max(1.0, half_life_windows * spec.size / spi))

    done: dict[str, int] = {}

    def report(phase: str, rows: int, w: int) -> None:
        """Progress in rows, never backwards within a phase."""
        if progress is not None:
            done[phase] = max(done.get(phase, 0), int(rows))
            progress({"phase": phase, "rows_read": done[phase], "total_rows": total_rows,
                      "window": w})

    # ---------------------------------------------------------------- window statistics (tasks)
    wins: list[WindowStats] | None = None
    diag: dict[str, Any] = {}
    if engine != "local" or analytic:
        phase = f"window statistics ({engine})"
        report(phase, 0, 0)
        try:
            wins = window_stats(log_strs, window=spec, engine=engine, address=address,
                                num_workers=num_workers, skip_bad_rows=skip_bad_rows,
                                tables=configs, batch_size=read_batch_size, diagnostics=diag)
        except ConnectionError as e:
            if engine != "ray":
                raise
            where = f" at {address!r}" if address else ""
            raise ConfigError(f"engine 'ray': cannot connect to the Ray cluster{where}: "
                              f"{e}") from None
        report(phase, diag.get("rows_read", 0), wins[-1].index if wins else 0)
        if not wins:
            raise LogError(f"no samples to replay in {', '.join(log_strs)}")

    # ---------------------------------------------------------------- window 0: static plans
    if wins is None:
        decayed = DecayedStats(configs, half_life=half_life, unit=unit)
        st0 = StreamStats(configs)
        pre = new_reader()
        pre_cut = _Cutter(spec, Q)

        def window0() -> Iterator[Batch]:
            for chunk in pre:
                for k, piece in pre_cut.cut(chunk):
                    if k >= Q:
                        return
                    yield piece
                report("planning on the first window", pre.rows_read, 0)

        for b in rebatch(window0(), spi):
            st0.update(b)
            decayed.update(b)
    else:
        st0 = wins[0].stats
        if analytic:      # the re-sharder's decayed statistics start as window 0's
            decayed = st0.copy()
        else:             # fed window 0's batches during the main pass (before any check)
            decayed = DecayedStats(configs, half_life=half_life, unit=unit)
    if st0.samples == 0:
        raise LogError(f"no samples to replay in {', '.join(log_strs)}")
    sums0 = st0.summary(top_k)
    it0 = st0.samples / spi
    try:
        static_res = plan_flexshard(tabs, topo, sums0, B, MemoryPolicy(), model)
    except FlexShardError as e:
        raise type(e)(f"the static FlexShard plan on the first window failed: {e}") from None
    budget = float(static_res.budget_bytes)
    lookups = {by_feat[f].name: s.total / max(it0, 1.0) for f, s in sums0.items()}
    plans: dict[str, Plan] = {
        "rw": build_baseline("rw", tabs, topo),
        "twrw": build_baseline("twrw", tabs, topo, lookups=lookups),
        "static": static_res.plan}
    base_cfg = reshard_config or ReshardConfig(horizon_iterations=max(1.0, it0))
    rs_cfg = dataclasses.replace(base_cfg, check_every=float("inf"), unit=unit, top_k=top_k)
    rs = Resharder(tabs, topo, B, stats=decayed, memory=MemoryPolicy(bytes_per_gpu=budget),
                   model=model, config=rs_cfg, plan=static_res.plan)

    # ---------------------------------------------------------------- main pass
    want = G <= _MAX_MATRIX_GPUS or not analytic
    tot = {s: _Acc(G, want) for s in STRATEGIES}
    if analytic:
        assert wins is not None
        windows = _analytic_pass(wins, spec, reader.use_ts, B, spi, model, plans, rs, decayed,
                                 tot, budget, top_k, half_life_windows,
                                 lambda rows, w: report("replaying", rows, w))
        whole = _merge_windows(wins)
        counts = {"samples": int(diag["samples"]), "rows_read": int(diag["rows_read"]),
                  "late": 0, "t0": diag.get("origin") if spec.unit == "seconds" else None,
                  "skipped": {**dict.fromkeys(_REASONS, 0), **diag.get("skipped", {})},
                  "skipped_by_file": diag.get("skipped_by_file", {})}
    else:
        windows, whole, counts = _trace_pass(
            reader, spec, Q, B, spi, G, model, plans, rs, decayed, tot, budget, configs,
            whole=None if wins is None else _merge_windows(wins),
            report=lambda rows, w: report("replaying", rows, w))
    if not windows:
        raise LogError(f"no samples to replay in {', '.join(log_strs)}")

    # ---------------------------------------------------------------- totals and files
    final = {"rw": plans["rw"], "twrw": plans["twrw"], "static": plans["static"],
             "resharder": rs.plan}
    rw_time = tot["rw"].s["comm_time_s"]
    totals_strat = {}
    for s in STRATEGIES:
        a = tot[s]
        d = a.to_json(budget)
        d["total_bytes"] = {"total": a.s["total"], "intra_node": a.s["intra_node"],
                            "inter_node": a.s["inter_node"], "sync": a.s["sync"]}
        d["comm_time_s"] = a.s["comm_time_s"]
        d["iteration_time_s"] = a.s["iteration_time_s"]
        mig = sum(d2.migration_bytes for d2 in rs.history) if s == "resharder" else 0.0
        d["migration_bytes"] = float(mig)
        d["migration_s"] = float(sum(d2.migration_s for d2 in rs.history)) \
            if s == "resharder" else 0.0
        d["deltas"] = sum(1 for d2 in rs.history if d2.delta is not None) \
            if s == "resharder" else 0
        d["speedup_vs_rw"] = (rw_time / a.s["comm_time_s"]) if a.s["comm_time_s"] > 0 else None
        d["tiers"] = final[s].tier_sizes()
        totals_strat[s] = d
    skipped = counts["skipped"]
    samples_total = counts["samples"]
    totals = {"samples": samples_total, "rows_read": counts["rows_read"],
              "windows": len(windows), "iterations": tot["rw"].n,
              "dropped_samples": int(sum(w["dropped_samples"] for w in windows)),
              "late_samples": counts["late"],
              "skipped_rows": int(sum(skipped.values())), "skipped": skipped,
              "skipped_by_file": {f: c for f, c in counts["skipped_by_file"].items()
                                  if any(c.values())},
              "checks": len(rs.history),
              "decisions": {a: sum(1 for d in rs.history if d.action == a)
                            for a in ("applied", "partial", "kept", "failed", "skipped")},
              "strategies": totals_strat}
    warnings = []
    empty = [w["index"] for w in windows if w["iterations"] == 0]
    if empty:
        warnings.append(f"{len(empty)} of {len(windows)} window(s) hold fewer samples than one "
                        f"iteration (G x B = {spi:,}) and were not evaluated (windows "
                        f"{empty[:10]}{' ...' if len(empty) > 10 else ''}); use a smaller "
                        f"--batch-size or larger windows")
    if counts["late"]:
        warnings.append(f"{counts['late']:,} sample(s) had a ts before their window (the log is "
                        f"not in time order); they were kept in the window being read")
    if samples_total and totals["dropped_samples"] > 0.25 * samples_total:
        warnings.append(f"{totals['dropped_samples']:,} of {samples_total:,} samples fall in "
                        f"windows' partial last iterations and were not evaluated; use a smaller "
                        f"--batch-size or larger windows")
    if not want:
        warnings.append(f"{G} GPUs: the analytic evaluation keeps no G x G traffic matrices "
                        f"beyond {_MAX_MATRIX_GPUS} GPUs; traffic/*.npz was not written")
    summary = {
        "version": SUMMARY_VERSION,
        "logs": log_strs,
        "engine": engine,
        "evaluation": evaluation,
        "workers": diag.get("workers") if wins is not None else None,
        "topology": {"name": topo.name, "nodes": topo.nodes, "gpus_per_node": topo.gpus_per_node,
                     "num_gpus": G, "summary": topo.summary()},
        "tables": [t.to_dict() for t in tabs],
        "batch_size": B, "samples_per_iteration": spi,
        "window": {**spec.to_json(), "position": "ts" if reader.use_ts else "sample",
                   "t0": counts["t0"], "checks_per_window": 1 if analytic else Q},
        "strategies": list(STRATEGIES),
        "model": dataclasses.asdict(model),
        "budget_bytes": budget,
        "resharder": {"half_life": half_life_windows if analytic else half_life,
                      "half_life_unit": "windows" if analytic else unit,
                      "config": {k: v for k, v in dataclasses.asdict(rs_cfg).items()
                                 if k != "check_every"},
                      "checks_per_window": 1 if analytic else Q},
        "windows": windows,
        "totals": totals,
        "warnings": warnings,
        "elapsed_s": time.perf_counter() - t_start,
    }
    summary = _finite(summary)
    cdf = _cdf(whole, tabs, final, top_k)
    _write(out, summary, cdf, final, tot if want else {}, topo)
    summary_elapsed = time.perf_counter() - t_start
    return ReplayResult(out, summary, cdf, final, whole, list(rs.history), summary_elapsed)


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
    strat = {s: accs[s].to_json(budget) for s in STRATEGIES}
    mig = float(sum(d.migration_bytes for d in decs))
    strat["resharder"]["migration_bytes"] = mig
    return {"index": index, "start": start, "end": end, "samples": samples,
            "sample_start": sample_start, "sample_end": sample_start + samples,
            "ts_first": ts_first, "ts_last": ts_last,
            "iterations": iterations, "dropped_samples": dropped,
            "late_samples": late,
            "strategies": strat, "migration_bytes": mig,
            "migration_s": float(sum(d.migration_s for d in decs)),
            "thresholds": thresholds,
            "decisions": counts,
            "checks": [_decision_json(d) for d in decs]}


def _analytic_pass(wins: Sequence[WindowStats], spec: WindowSpec, use_ts: bool, B: int, spi: int,
                   model: CostModel, plans: Mapping[str, Plan], rs: Resharder,
                   decayed: StreamStats, tot: Mapping[str, _Acc], budget: float, top_k: int,
                   half_life_windows: float,
                   report: Callable[[int, int], None]) -> list[dict[str, Any]]:
    """The analytic evaluation: per window, every strategy priced by ``evaluate_analytic`` on the
    window's summaries (weighted by its whole iterations), then (from the second window on) the
    window merged into the re-sharder's decayed statistics and one check."""
    G = rs.topology.num_gpus
    want = G <= _MAX_MATRIX_GPUS
    windows: list[dict[str, Any]] = []
    sample_start = 0
    prev = wins[0].index
    for i, ws in enumerate(wins):
        st = ws.stats
        n = int(st.samples)
        its = n // spi
        hist0 = len(rs.history)
        accs = {s: _Acc(G, False) for s in STRATEGIES}
        if its:
            sums = st.summary(top_k)
            costs = {s: evaluate_analytic(plans[s], sums, B, model, want_matrices=want)
                     for s in ("rw", "twrw", "static")}
            costs["resharder"] = (costs["static"] if rs.plan is plans["static"] else
                                  evaluate_analytic(rs.plan, sums, B, model, want_matrices=want))
            for s, c in costs.items():
                accs[s].add_cost(c, its)
                tot[s].add_cost(c, its)
        if i > 0:     # online: the window is evaluated with the plan in force, then seen
            decayed.scale(0.5 ** ((ws.index - prev) / half_life_windows))
            decayed.merge(st)
            pos = (float(st.last_ts) if use_ts and st.last_ts is not None
                   else float(sample_start + n))
            dsums = decayed.summary(top_k)
            rs.check(summaries=dsums, position=pos)
        else:
            dsums = decayed.summary(top_k)
        prev = ws.index
        if spec.unit == "seconds":
            start, end = ws.start, ws.end
        elif use_ts:
            start, end = st.first_ts, st.last_ts
        else:
            start, end = sample_start, sample_start + n
        windows.append(_window_doc(ws.index, start, end, n, sample_start, st.first_ts,
                                   st.last_ts, its, n - its * spi, 0, accs, budget, rs, hist0,
                                   rs.thresholds(dsums)))
        sample_start += n
        report(sample_start, ws.index)
    return windows


def _trace_pass(reader: LogReader, spec: WindowSpec, Q: int, B: int, spi: int, G: int,
                model: CostModel, plans: Mapping[str, Plan], rs: Resharder,
                decayed: DecayedStats, tot: Mapping[str, _Acc], budget: float,
                configs: Sequence[TableConfig], whole: StreamStats | None,
                report: Callable[[int, int], None]
                ) -> tuple[list[dict[str, Any]], StreamStats, dict[str, Any]]:
    """The trace evaluation: the driver streams the log once, cuts it into windows and quarters
    and evaluates whole iterations in trace mode, feeding the re-sharder online.

    ``whole`` None: the whole log's statistics are computed here; given (from the engine's window
    statistics): window 0's batches are fed to ``decayed`` here (the engine's statistics made the
    static plans, so there was no pass over the first window)."""
    feed_window0 = whole is not None
    if whole is None:
        whole_stats = StreamStats(configs)
    else:
        whole_stats = whole
    windows: list[dict[str, Any]] = []
    cut = _Cutter(spec, Q)
    state: dict[str, Any] = {"win": None, "q": None, "pend": [], "pend_n": 0, "chunk": [],
                             "chunk_n": 0, "fed": 0, "pos": 0.0, "unchecked": False}

    def feed(b: Batch) -> None:
        """Feed the re-sharder; a check's position is in the unit of the windows' start / end:
        the last fed sample's ts when the log has one, else the global index after it."""
        rs.update(b)
        state["fed"] += b.batch_size
        state["pos"] = (float(np.max(b.timestamp)) if b.timestamp is not None
                        else float(state["fed"]))
        state["unchecked"] = True

    def evaluate_chunk() -> None:
        win: _Window = state["win"]
        chunk = state["chunk"]
        if not chunk:
            return
        costs = {}
        for s in ("rw", "twrw", "static"):
            costs[s] = evaluate_trace(plans[s], chunk, B, model, keep_matrices=False)
        costs["resharder"] = (costs["static"] if rs.plan is plans["static"]
                              else evaluate_trace(rs.plan, chunk, B, model))
        for s, tc in costs.items():
            win.accs[s].add(tc)
            tot[s].add(tc)
        win.iterations += len(chunk)
        if win.index > 0:
            for b in chunk:
                feed(b)
        elif feed_window0:
            for b in chunk:
                decayed.update(b)
        state["chunk"], state["chunk_n"] = [], 0

    def check() -> None:
        win: _Window = state["win"]
        if win.index > 0 and state["unchecked"]:
            rs.check(position=state["pos"])
            state["unchecked"] = False

    def cut_iterations() -> None:
        if state["pend_n"] < spi:
            return
        allp = concat_batches(state["pend"])
        n = allp.batch_size
        lo = 0
        while n - lo >= spi:
            state["chunk"].append(slice_batch(allp, lo, lo + spi) if n != spi else allp)
            lo += spi
        state["pend"] = [slice_batch(allp, lo, n)] if lo < n else []
        state["pend_n"] = n - lo
        state["chunk_n"] = len(state["chunk"]) * spi
        if state["chunk_n"] >= _MAX_CHUNK_SAMPLES:
            evaluate_chunk()

    def end_window() -> None:
        win: _Window = state["win"]
        evaluate_chunk()
        if state["pend_n"]:
            win.dropped += state["pend_n"]
            if win.index > 0:
                for b in state["pend"]:
                    feed(b)
            elif feed_window0:
                decayed.update(concat_batches(state["pend"]))
        state["pend"], state["pend_n"] = [], 0
        check()
        windows.append(_window_json(win))

    def _window_json(win: _Window) -> dict[str, Any]:
        if spec.unit == "seconds":
            start = cut.t0 + win.index * spec.size
            end = start + spec.size
        elif reader.use_ts:
            start, end = win.ts_first, win.ts_last
        else:
            start, end = win.sample_start, win.sample_start + win.samples
        return _window_doc(win.index, start, end, win.samples, win.sample_start, win.ts_first,
                           win.ts_last, win.iterations, win.dropped, cut.late - win.late_start,
                           win.accs, budget, rs, win.history_start, rs.thresholds())

    samples_seen = 0
    for chunk_batch in reader:
        if not feed_window0:
            whole_stats.update(chunk_batch)
        for k, piece in cut.cut(chunk_batch):
            w, q = divmod(k, Q)
            win = state["win"]
            if win is None or w != win.index:
                if win is not None:
                    end_window()
                state["fed"] = samples_seen      # every earlier sample was fed or is window 0
                state["win"] = _Window(w, samples_seen, history_start=len(rs.history),
                                       late_start=cut.late,
                                       accs={s: _Acc(G, False) for s in STRATEGIES})
                state["q"] = q
            elif q != state["q"]:
                evaluate_chunk()
                check()
                state["q"] = q
            win = state["win"]
            n = piece.batch_size
            win.samples += n
            samples_seen += n
            if piece.timestamp is not None:
                lo, hi = float(piece.timestamp.min()), float(piece.timestamp.max())
                win.ts_first = lo if win.ts_first is None else min(win.ts_first, lo)
                win.ts_last = hi if win.ts_last is None else max(win.ts_last, hi)
            state["pend"].append(piece)
            state["pend_n"] += n
            cut_iterations()
            report(samples_seen, w)
        report(reader.rows_read, state["win"].index if state["win"] else 0)
    if state["win"] is not None:
        end_window()
    counts = {"samples": reader.samples, "rows_read": reader.rows_read, "late": cut.late,
              "t0": cut.t0, "skipped": reader.skipped,
              "skipped_by_file": reader.skipped_by_file}
    return windows, whole_stats, counts


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
    return _finite(out)


def _write(out: Path, summary: dict, cdf: dict, final: Mapping[str, Plan],
           tot: Mapping[str, _Acc], topo: Topology) -> None:
    """Everything into a temporary sibling of ``out``, then renamed into place."""
    _check_out_dir(out)
    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp.", dir=parent))
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)       # mkdtemp makes it 0700: publish with the usual mode
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
        (tmp / "cdf.json").write_text(json.dumps(cdf, allow_nan=False))
        for s, p in final.items():
            p.save(tmp / "plans" / s)
        (tmp / "traffic").mkdir()
        lc = topo.link_class_matrix()
        for s, a in tot.items():
            k = max(a.n, 1)
            mats = {c: a.mats[c] / k for c in COMPONENTS}
            a2a = sum(mats[c] for c in A2A_COMPONENTS)
            with open(tmp / "traffic" / f"{s}.npz", "wb") as f:
                np.savez(f, a2a=a2a, link_class=lc, iterations=np.int64(a.n),
                         **{c: mats[c] for c in COMPONENTS})
        for p in tmp.rglob("*"):
            if p.is_dir():
                os.chmod(p, 0o777 & ~mask)
            elif p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
