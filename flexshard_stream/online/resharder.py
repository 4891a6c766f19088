"""The incremental re-sharder: moves the replication threshold online as the row distribution drifts.

Fed batches (or pointed at a :class:`~flexshard_stream.stats.window.WindowedStats` /
:class:`~flexshard_stream.stats.window.DecayedStats` view; :func:`default_stats` by default), it
checks every ``check_every`` batches or seconds: it plans the target with the FlexShard planner on
the current statistics, prices the current plan on the same statistics (one evaluator,
``evaluate_analytic``), and computes the :class:`~flexshard_stream.plans.delta.PlanDelta`. It
is judged, and decides, on total cost: communication + migration transfer + a fixed pause per
applied delta (:func:`~flexshard_stream.plans.delta.migration_cost`; :class:`CostLedger`). A
change is applied only when its modelled saving over the horizon beats ``(1 + hysteresis)`` times
its pause and transfer, the horizon and hysteresis following the measured drift rate
(:class:`DriftMeter`); a change that does not pay waits and goes with the next. When the whole
delta moves more than the migration budget of one check, the largest gains go first: the rows the
target promotes in decreasing access probability, the rows it demotes in increasing probability, a
fraction of each (1, 3/4, 1/2, ...) chosen so the step fits both the migration budget and the
memory budget. A re-plan that fails (bad statistics, infeasible budget) keeps the current plan and
says why. Every check returns its :class:`Decision`; the caller publishes one that carries a delta
(the re-sharder calls nothing back). The decision rule is documented in docs/RESHARDER.md.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, FlexShardError, FormatError
from ..placement.baselines import build_baseline
from ..placement.cost import Cost, CostModel, evaluate_analytic
from ..placement.workload import Workload, workload_of
from ..placement.planner import MemoryPolicy, PlannerConfig, plan_flexshard
from ..plans.delta import (
    DEFAULT_PAUSE_S,
    MigrationCost,
    PlanDelta,
    check_pause,
    migration_cost,
)
from ..plans.plan import Plan, TablePlan
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..stats.batch import Batch
from ..stats.config import TableConfig
from ..stats.state import NUMBER, OPTIONAL_NUMBER, check_state
from ..stats.stream import StreamStats
from ..stats.summary import FrequencySummary
from ..stats.window import Clock, DecayedStats, WindowedStats

__all__ = ["CheckSchedule", "CostLedger", "DRIFT_WEIGHT", "Decision", "DriftMeter", "ReshardConfig",
           "Resharder", "default_stats", "made_for", "plan_share", "thresholds"]

#: weight of the newest check in the drift rate's moving average (:class:`DriftMeter`)
DRIFT_WEIGHT = 0.5


@dataclass(frozen=True)
class ReshardConfig:
    """When and how much the re-sharder moves.

    check_every : float       batches (or seconds, ``unit="seconds"``) between checks
    unit : str                "batches" or "seconds"
    pause_s : float           seconds a training job stalls per applied delta, whatever it moves
                              (barrier, rebuilt lookup modules, refilled pipeline); default
                              :data:`~flexshard_stream.plans.delta.DEFAULT_PAUSE_S`
                              (docs/RESHARDER.md, "The pause")
    iterations_per_check : float | None   training iterations between two checks; None: counted
                              (``check(iterations=...)``, else the samples fed to :meth:`Resharder.update`
                              since the previous check over ``G x batch_size``)
    horizon_iterations : float | None   iterations over which a saving is counted; None (default):
                              from the measured drift rate (the mean life of the lookups on the
                              rows the plan relies on, :class:`DriftMeter`)
    hysteresis : float | None  margin: apply when saving over the horizon > (1 + hysteresis) x
                              (pause + transfer); None (default): from the measured drift rate (the
                              share of the measured change that noise explains)
    max_horizon_checks : float  the longest horizon, in checks (a stream that looks stationary)
    min_gain : float          ignore targets that save less than this fraction of the current
                              modelled iteration time (sketch noise on a stationary stream)
    migration_budget_bytes : float | None   most bytes moved per check (None: no limit)
    urgent_gain : float       a target saving at least this fraction of the current time is
                              taken at once; below it, only row changes that the previous
                              check's target also wanted (noise-driven targets change from check
                              to check, drift persists)
    memory_slack : float      the current plan is moved regardless of the hysteresis when its
                              peak memory exceeds the budget by more than this fraction
    capture : float           apply the shortest prefix of the ranked row changes that captures
                              this share of the best feasible step's saving (rows near the
                              threshold swap places on noise alone; they are left until they matter)
    top_k : int               rows per table summarized for the planner
    """

    check_every: float = 16
    unit: str = "batches"
    pause_s: float = DEFAULT_PAUSE_S
    iterations_per_check: float | None = None
    horizon_iterations: float | None = None
    hysteresis: float | None = None
    max_horizon_checks: float = 64.0
    min_gain: float = 0.03
    migration_budget_bytes: float | None = None
    capture: float = 0.9
    urgent_gain: float = 0.1
    memory_slack: float = 0.05
    top_k: int = 4096

    def __post_init__(self) -> None:
        Clock(self.unit)
        check_pause(self.pause_s, "pause_s")
        for name in ("check_every", "max_horizon_checks"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("horizon_iterations", "iterations_per_check"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be > 0 iterations (or None), got {v}")
        if self.hysteresis is not None and not self.hysteresis >= 0:
            raise ConfigError(f"hysteresis must be >= 0 (or None), got {self.hysteresis}")
        if not (0 <= self.min_gain < 1):
            raise ConfigError(f"min_gain must be in [0, 1), got {self.min_gain}")
        if self.migration_budget_bytes is not None and not self.migration_budget_bytes > 0:
            raise ConfigError(f"migration_budget_bytes must be > 0 bytes (or None), got "
                              f"{self.migration_budget_bytes}")
        if not self.urgent_gain >= self.min_gain:
            raise ConfigError(f"urgent_gain must be >= min_gain ({self.min_gain}), got "
                              f"{self.urgent_gain}")
        if not self.memory_slack >= 0:
            raise ConfigError(f"memory_slack must be >= 0, got {self.memory_slack}")
        if not (0 < self.capture <= 1):
            raise ConfigError(f"capture must be in (0, 1], got {self.capture}")
        if self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1 rows, got {self.top_k}")


def default_stats(tables: Sequence[EmbeddingTable] | Sequence[TableConfig],
                  config: ReshardConfig) -> WindowedStats | DecayedStats:
    """The statistics a re-sharder (bare or in the sidecar) is fed by default: a sliding window of the last 8 checks in 4
    sub-windows (:class:`~flexshard_stream.stats.window.WindowedStats`).

    Keyed by the tables' features (``TableConfig`` of each ``EmbeddingTable``). docs/RESHARDER.md,
    "Statistics", gives the measurement behind the choice.
    """
    configs = [t if isinstance(t, TableConfig) else TableConfig(t.name, t.num_rows, t.feature)
               for t in tables]
    return WindowedStats(configs, window=8 * config.check_every, slots=4, unit=config.unit)


@dataclass
class CheckSchedule:
    """When a check is due: every ``check_every`` batches (position: batches seen, the first check
    at ``check_every``) or seconds (position: the batch's timestamp, else wall time; the first
    check ``check_every`` after the first batch). ``next`` is the position of the next check."""

    check_every: float
    unit: str = "batches"
    next: float | None = None

    def due(self, position: float) -> bool:
        """True when a check is due at ``position``; the next one is then scheduled past it."""
        if self.next is None:
            self.next = self.check_every if self.unit == "batches" else position + self.check_every
        if position < self.next:
            return False
        while self.next <= position:
            self.next += self.check_every
        return True


@dataclass
class Decision:
    """What one check decided (kept in :attr:`Resharder.history`).

    action : "applied" | "partial" | "kept" | "failed" | "skipped"
    reason : str                         why, in words
    delta : PlanDelta | None             what was applied (None unless applied / partial)
    current_s, target_s, applied_s : modelled iteration time (seconds) of the current plan, the
                                         planner's target and the plan after this check, all on the
                                         statistics of this check
    migration_bytes, migration_s : float what the applied delta moved (bytes) and the transfer time
                                         (seconds, at the topology's bandwidths)
    pause_s : float                      the fixed pause charged for applying it (seconds; 0 when
                                         nothing was applied)
    iterations : float                   training iterations since the previous check (priced with
                                         the plan in force at ``current_s``)
    drift_rate : float | None            measured loss of lookups on the plan's rows per check
                                         (:class:`DriftMeter`; None before a measurement)
    horizon_iterations, hysteresis :     what the saving was weighed with (iterations, margin)
    fraction : float                     share of the target's row changes applied (1: all)
    peak_memory_bytes, budget_bytes :    the applied plan's modelled peak per-GPU memory on this
                                         check's statistics, and the budget (bytes)
    thresholds : {table: {...}}          the replication threshold after this check
    """

    check: int
    position: float
    action: str
    reason: str
    delta: PlanDelta | None = None
    current_s: float = float("nan")
    target_s: float = float("nan")
    applied_s: float = float("nan")
    migration_bytes: float = 0.0
    migration_s: float = 0.0
    pause_s: float = 0.0
    iterations: float = 0.0
    drift_rate: float | None = None
    horizon_iterations: float = float("nan")
    hysteresis: float = float("nan")
    fraction: float = 0.0
    peak_memory_bytes: float = float("nan")
    budget_bytes: float = float("nan")
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def cost_s(self) -> float:
        """What applying this decision's delta cost the training job: transfer + pause (s)."""
        return self.migration_s + self.pause_s

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "position": self.position, "action": self.action,
                "reason": self.reason, "current_s_per_iter": self.current_s,
                "target_s_per_iter": self.target_s, "applied_s_per_iter": self.applied_s,
                "migration_bytes": self.migration_bytes, "migration_s": self.migration_s,
                "pause_s": self.pause_s, "cost_s": self.cost_s, "iterations": self.iterations,
                "drift_rate": self.drift_rate, "horizon_iterations": self.horizon_iterations,
                "hysteresis": self.hysteresis,
                "fraction": self.fraction, "peak_memory_bytes": self.peak_memory_bytes,
                "budget_bytes": self.budget_bytes, "thresholds": self.thresholds,
                "delta": self.delta.summary() if self.delta is not None else None}


@dataclass
class CostLedger:
    """The total cost of a re-sharder's run so far, in the cost model's seconds.

    communication_s : float   modelled iteration time of the plan in force, times the iterations
                              it was in force (each check prices the iterations since the previous
                              one on its own statistics)
    migration : MigrationCost  bytes, transfer seconds and pauses of every applied delta
    iterations : float        iterations priced
    unpriced_iterations : float  iterations whose check could not price the plan (failed)
    """

    communication_s: float = 0.0
    migration: MigrationCost = field(default_factory=MigrationCost)
    iterations: float = 0.0
    unpriced_iterations: float = 0.0

    @property
    def total_s(self) -> float:
        """Communication + migration transfer + pauses (seconds)."""
        return self.communication_s + self.migration.total_s

    def to_json(self) -> dict[str, float]:
        """``{"communication_s", "migration_s", "pause_s", "total_s", "migration_bytes",
        "deltas", "iterations", "unpriced_iterations"}`` (the state protocol's form too)."""
        m = self.migration
        return {"communication_s": self.communication_s, "migration_s": m.transfer_s,
                "pause_s": m.pause_s, "total_s": self.total_s, "migration_bytes": m.bytes,
                "deltas": m.deltas, "iterations": self.iterations,
                "unpriced_iterations": self.unpriced_iterations}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CostLedger:
        """The inverse of :meth:`to_json`; FormatError naming a missing or bad entry."""
        keys = ("communication_s", "migration_s", "pause_s", "migration_bytes", "deltas",
                "iterations", "unpriced_iterations")
        if not isinstance(doc, Mapping):
            raise FormatError(f"re-sharder state: cost must be a mapping, got "
                              f"{type(doc).__name__}")
        bad = [k for k in keys if isinstance(doc.get(k), bool)
               or not isinstance(doc.get(k), (int, float)) or not math.isfinite(doc[k])
               or doc[k] < 0]
        if bad:
            raise FormatError(f"re-sharder state: cost entries {bad} must be finite numbers >= 0")
        return cls(float(doc["communication_s"]),
                   MigrationCost(float(doc["migration_bytes"]), float(doc["migration_s"]),
                                 float(doc["pause_s"]), int(doc["deltas"])),
                   float(doc["iterations"]), float(doc["unpriced_iterations"]))


class DriftMeter:
    """The measured drift rate: the share of the lookups on the plan's rows lost per check.

    After every check, :meth:`rebase` records the share of all lookups that falls on the plan
    then in force (its global, node and placed rows, :func:`plan_share`) under that check's
    statistics. The next check measures the same plan's share on its own statistics:
    ``1 - now / before`` is one measurement (negative when those rows gained lookups).
    ``rate`` is a moving average of the measurements (the newest weighs :data:`DRIFT_WEIGHT`),
    ``noise`` the moving average of their absolute deviation from it.

    The horizon is the mean life of the lookups a plan is built on, ``1 / rate`` checks in
    ``[1, max_checks]`` (``max_checks`` when the rows keep or gain their lookups, or before a
    measurement). The hysteresis is the share of the measured change that noise explains,
    ``noise / (noise + rate)``: near 1 on a stationary stream (a step must save twice its cost),
    near 0 under steady drift; 1 before a measurement.
    """

    def __init__(self) -> None:
        self.rate: float | None = None        # lookups lost per check (moving average)
        self.noise = 0.0                      # mean absolute deviation of the measurements
        self.reference: float | None = None   # lookup share of the plan's rows at the last check

    def observe(self, plan: Plan, sums: Mapping[str, FrequencySummary]) -> float | None:
        """Measure ``plan``'s lookup share on ``sums`` against :attr:`reference`; update and
        return the rate (None while nothing was measured)."""
        if self.reference is None or self.reference <= 0:
            return self.rate
        lost = 1.0 - plan_share(plan, sums) / self.reference
        if self.rate is None:
            self.rate = lost
        else:
            self.noise += DRIFT_WEIGHT * (abs(lost - self.rate) - self.noise)
            self.rate += DRIFT_WEIGHT * (lost - self.rate)
        return self.rate

    def rebase(self, plan: Plan, sums: Mapping[str, FrequencySummary]) -> None:
        """The plan in force after a check and its lookup share on that check's statistics: what
        the next check measures against."""
        self.reference = plan_share(plan, sums)

    def horizon_checks(self, max_checks: float) -> float:
        """``1 / rate`` checks in ``[1, max_checks]`` (``max_checks`` before a measurement)."""
        if self.rate is None or self.rate <= 1.0 / max_checks:
            return float(max_checks)
        return max(1.0, 1.0 / self.rate)

    def hysteresis(self) -> float:
        """``noise / (noise + rate)`` in [0, 1] (a negative rate counts as 0); 1 before a
        measurement or when both are 0."""
        rate = max(self.rate or 0.0, 0.0)
        if self.rate is None or self.noise + rate <= 0:
            return 1.0
        return self.noise / (self.noise + rate)

    def state(self) -> dict[str, float | None]:
        """``{"rate", "noise", "reference"}`` (JSON-able)."""
        return {"rate": self.rate, "noise": self.noise, "reference": self.reference}

    def restore(self, doc: Mapping[str, Any]) -> None:
        """Take up :meth:`state`; FormatError (nothing changed) for a malformed one."""
        def number(k: str) -> bool:
            v = doc.get(k)
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = (isinstance(doc, Mapping) and number("noise") and doc["noise"] >= 0
              and all(doc.get(k) is None or number(k) for k in ("rate", "reference")))
        if not ok:
            raise FormatError(f"re-sharder state: drift must hold a finite noise >= 0, rate and "
                              f"reference (None or finite), got {doc!r}")
        self.rate = None if doc["rate"] is None else float(doc["rate"])
        self.noise = float(doc["noise"])
        self.reference = None if doc["reference"] is None else float(doc["reference"])


def plan_share(plan: Plan, sums: Mapping[str, FrequencySummary]) -> float:
    """Share of all lookups (every table) on the plan's explicitly placed rows under ``sums``
    (global, node and placed tiers; 0 when nothing was looked up). Rows outside a summary's top
    count the tail probability each, all of them together at most the tail's lookups."""
    by_name = summaries_by_table([tp.table for tp in plan.tables.values()], sums,
                                 required=False)
    hot = total = 0.0
    for name, tp in plan.tables.items():
        s = by_name[name]
        if s is None or not s.total:
            continue
        ids, _ = tp.special_sorted
        in_top = np.isin(ids, s.top_ids)
        top = float(s.probabilities(ids[in_top]).sum()) * s.total
        tail = min(float((~in_top).sum()) * s.tail_probability() * s.total, float(s.tail_mass))
        hot += top + tail
        total += s.total
    return hot / total if total else 0.0


def thresholds(plan: Plan, summaries: Mapping[str, FrequencySummary]) -> dict[str, dict[str, float]]:
    """Per table: rows in the global and node tiers, and the access probability of the coldest
    replicated row under ``summaries`` (the threshold in probability; 0 when nothing is
    replicated; rows outside the summary's top count as the tail probability)."""
    out = {}
    by_name = summaries_by_table([tp.table for tp in plan.tables.values()], summaries)
    for name, tp in plan.tables.items():
        s = by_name[name]
        rep = np.concatenate([tp.global_ids, tp.node_ids])
        p_min = float(_prob(s, rep).min()) if rep.size else 0.0
        out[name] = {"global_rows": int(tp.global_ids.size), "node_rows": int(tp.node_ids.size),
                     "threshold_probability": p_min}
    return out


def made_for(plan: Plan, tables: Sequence[EmbeddingTable], topology: Topology) -> bool:
    """Whether ``plan`` places exactly ``tables`` (same names and specs) on ``topology``: a plan
    saved by an earlier run can be taken up only then."""
    have = {n: tp.table for n, tp in plan.tables.items()}
    return plan.topology == topology and have == {t.name: t for t in tables}


# ----------------------------------------------------------------------------- partial steps
_STATE_VERSION = 2
_STATE_FIELDS = {"plan": Plan, "prev_target": (Plan, type(None)), "budget_bytes": OPTIONAL_NUMBER,
                 "migrated_bytes": NUMBER, "checks": int, "batches": int,
                 "next_check": OPTIONAL_NUMBER, "unit": str, "samples": int, "cost": dict,
                 "drift": dict}
_FRACTIONS = (1.0, 0.75, 0.5, 0.375, 0.25, 0.1875, 0.125, 0.0625, 0.03125)

def _codes(tp: TablePlan) -> tuple[np.ndarray, np.ndarray]:
    """Explicit rows of a table and their code: -1 global, -2 - m node (local GPU m), g placed."""
    ids, codes = tp.special_sorted
    return ids, codes.astype(np.int64)


def _from_codes(tp: TablePlan, ids: np.ndarray, codes: np.ndarray) -> TablePlan:
    g, n, p = codes == -1, codes <= -2, codes >= 0
    kw = {"sharding": tp.sharding}
    if hasattr(tp, "hbm_fraction"):
        kw["hbm_fraction"] = tp.hbm_fraction
    return TablePlan(tp.table, tp.cold, global_ids=ids[g], node_ids=ids[n],
                     node_local=(-2 - codes[n]).astype(np.int32), placed_ids=ids[p],
                     placed_gpus=codes[p].astype(np.int32), **kw)


def _prob(s: FrequencySummary | None, ids: np.ndarray) -> np.ndarray:
    """Access probability of ``ids`` under ``s`` (zeros without a summary)."""
    return np.zeros(ids.size) if s is None else s.probabilities(ids)


def _kind(codes: np.ndarray) -> np.ndarray:
    """Tier kind of placement codes: 0 cold, 1 global, 2 node, 3 placed."""
    none = np.iinfo(np.int64).min
    return np.where(codes == none, 0, np.where(codes == -1, 1, np.where(codes <= -2, 2, 3)))


def _confirmed(cur: Plan, tgt: Plan, prev: Plan) -> Plan:
    """``tgt`` restricted to the row changes ``prev`` (the previous check's target) also made:
    every other row keeps its current placement; the cold function changes only if ``prev``
    changed it the same way."""
    none = np.iinfo(np.int64).min
    tps = []
    for name, ct in cur.tables.items():
        tt, pt = tgt[name], prev[name]
        ci, cc = _codes(ct)
        ti, tc = _codes(tt)
        pi, pc = _codes(pt)
        allr = np.union1d(np.union1d(ci, ti), pi)
        old, new, pre = (np.full(allr.size, none) for _ in range(3))
        old[np.searchsorted(allr, ci)] = cc
        new[np.searchsorted(allr, ti)] = tc
        pre[np.searchsorted(allr, pi)] = pc
        ok = (_kind(new) == _kind(pre)) | (_kind(new) == _kind(old))
        res = np.where(ok, new, old)
        keep = res != none
        tp = _from_codes(ct, allr[keep], res[keep])
        if tt.cold != ct.cold and tt.cold == pt.cold:
            tp = dataclasses.replace(tp, cold=tt.cold)
        tps.append(tp)
    return Plan(tgt.strategy, cur.topology, tps, dict(tgt.meta))


def _balance_new_node_rows(res: np.ndarray, old: np.ndarray, rows: np.ndarray,
                           s: FrequencySummary | None, M: int) -> None:
    """Rows entering the node tier go, hottest first, to the local GPU with the least node-replica
    load (access probability) given the rows that stay where they are (in place on ``res``)."""
    none = np.iinfo(np.int64).min
    node = (res <= -2) & (res != none)
    new = node & ~((old <= -2) & (old != none))
    if not new.any():
        return
    p = _prob(s, rows)
    stay = node & ~new
    load = np.bincount(-2 - res[stay], weights=p[stay], minlength=M)[:M].astype(np.float64)
    idx = np.flatnonzero(new)
    idx = idx[np.lexsort((rows[idx], -p[idx]))]
    for i in idx:
        m = int(np.argmin(load))
        res[i] = -2 - m
        load[m] += p[i]


def _partial(cur: Plan, tgt: Plan, sums: Mapping[str, FrequencySummary], frac: float,
             sticky: bool = True) -> Plan:
    """``cur`` with a fraction of ``tgt``'s row changes applied: in every table the first
    ``ceil(frac * n)`` promotions (rows that gain or change an explicit placement, hottest first)
    and demotions (rows that lose theirs, coldest first). With ``sticky``, rows that stay node
    replicas, or stay placed, keep their current GPU (the target spreads them afresh by rank; moving
    them buys little and costs a transfer each). The cold function stays ``cur``'s unless
    ``frac == 1`` and not ``sticky`` (then the result is ``tgt``)."""
    if frac >= 1.0 and not sticky:
        return tgt
    none = np.iinfo(np.int64).min
    tps = []
    for name, ct in cur.tables.items():
        tt = tgt[name]
        ci, cc = _codes(ct)
        ti, tc = _codes(tt)
        allr = np.union1d(ci, ti)
        old = np.full(allr.size, none)
        new = np.full(allr.size, none)
        old[np.searchsorted(allr, ci)] = cc
        new[np.searchsorted(allr, ti)] = tc
        if sticky:
            same_kind = ((old <= -2) & (new <= -2) & (old != none) & (new != none)) | \
                ((old >= 0) & (new >= 0))
            new = np.where(same_kind, old, new)
        ch = old != new
        if not ch.any() and (ct.cold == tt.cold or frac < 1.0):
            tps.append(ct)
            continue
        rows, n_c = allr[ch], new[ch]
        p = _prob(sums.get(name) or sums.get(ct.table.feature), rows)
        demote = n_c == none
        pro = np.flatnonzero(~demote)
        dem = np.flatnonzero(demote)
        pro = pro[np.lexsort((rows[pro], -p[pro]))][: int(np.ceil(frac * pro.size))]
        dem = dem[np.lexsort((rows[dem], p[dem]))][: int(np.ceil(frac * dem.size))]
        res = old.copy()
        idx = np.flatnonzero(ch)[np.concatenate([pro, dem])]
        res[idx] = new[idx]
        if sticky:
            _balance_new_node_rows(res, old, allr, sums.get(name) or sums.get(ct.table.feature),
                                   cur.topology.gpus_per_node)
        keep = res != none
        tp = _from_codes(ct, allr[keep], res[keep])
        if frac >= 1.0 and ct.cold != tt.cold:
            tp = dataclasses.replace(tp, cold=tt.cold)
        tps.append(tp)
    return Plan(tgt.strategy, cur.topology, tps, {**tgt.meta, "partial_fraction": frac})


# ----------------------------------------------------------------------------- the re-sharder
class Resharder:
    """Keeps a plan near the planner's target, moving only when the move pays for itself.

    Parameters
    ----------
    tables, topology, batch_size : as for :func:`~flexshard_stream.placement.planner.plan_flexshard`
        (``batch_size``: samples per GPU per iteration)
    workload : the :class:`~flexshard_stream.placement.workload.Workload` instead of
        ``batch_size`` and ``model`` (built from them otherwise), the same at every check; the
        mean lengths and iterations profiled it leaves out come from each check's statistics
    stats : DecayedStats | WindowedStats | StreamStats   where the statistics come from; default
        :func:`default_stats`. :meth:`update` feeds it.
    memory, model, planner : planner options (memory policy, cost model, planner knobs)
    config : ReshardConfig
    plan : the plan in force at the start (default: the row-wise baseline)

    ``plan`` is the current plan; ``history`` the decisions of this object (``checks`` counts
    restored ones too); ``thresholds()`` the replication threshold per table; ``cost`` the run's
    total cost so far (:class:`CostLedger`: communication, migration, pauses); ``drift`` the
    measured drift rate (:class:`DriftMeter`). :meth:`check` and :meth:`update` return each
    :class:`Decision`; one with a ``delta`` moved ``plan``: the caller publishes it (nothing is
    called back). ``state()`` / ``restore(state)`` carry the re-sharder across a restart.
    A caller that feeds the statistics itself counts the iterations with
    :meth:`count_iterations`; :meth:`forget_old_deltas` bounds the memory of a long history.
    """

    def __init__(self, tables: Sequence[EmbeddingTable], topology: Topology,
                 batch_size: int | None = None, *,
                 stats: DecayedStats | WindowedStats | StreamStats | None = None,
                 memory: MemoryPolicy | None = None, model: CostModel | None = None,
                 planner: PlannerConfig | None = None, config: ReshardConfig | None = None,
                 plan: Plan | None = None, workload: Workload | None = None):
        self.workload = workload_of(batch_size, model, None, workload, where="Resharder")
        self.tables = list(tables)
        self.topology = topology
        self.config = config or ReshardConfig()
        self.memory = memory or MemoryPolicy()
        self.planner = planner
        self.stats = stats if stats is not None else default_stats(self.tables, self.config)
        self.plan = plan if plan is not None else build_baseline("rw", self.tables, topology)
        names = {t.name for t in self.tables}
        if set(self.plan.tables) != names:
            raise ConfigError(f"the initial plan's tables {sorted(self.plan.tables)} are not the "
                              f"re-sharder's {sorted(names)}")
        self.history: list[Decision] = []
        self.cost = CostLedger()
        self.drift = DriftMeter()
        self._clock = Clock(self.config.unit)
        self._batches = 0
        self._samples = 0               # samples fed by update() since the previous check
        self._schedule = CheckSchedule(self.config.check_every, self.config.unit)
        self.budget_bytes: float | None = (self.memory.bytes_per_gpu
                                           if self.memory.bytes_per_gpu is not None else None)
        self._prev_target: Plan | None = None
        self._checks_before = 0       # checks run before a restore (decision numbers go on)
        self._deltas_forgotten = 0    # history[:this] has had its deltas released

    @property
    def batch_size(self) -> int:
        """B, samples per GPU per iteration (the workload's)."""
        return self.workload.batch_size

    @property
    def model(self) -> CostModel:
        """The cost model (the workload's)."""
        return self.workload.model

    # ------------------------------------------------------------------ feeding
    def update(self, batch: Batch) -> Decision | None:
        """Feed one batch to the statistics; run a check when one is due (returns its decision).
        The samples fed count the iterations between checks (``G x batch_size`` samples each)
        unless ``config.iterations_per_check`` says otherwise."""
        self.stats.update(batch)
        self._batches += 1
        self._samples += batch.batch_size
        pos = self._clock.position(batch, self._batches)
        return self.check(position=pos) if self._schedule.due(pos) else None

    def count_iterations(self, iterations: int) -> None:
        """Count ``iterations`` training iterations run since the previous check whose batches
        reached the statistics without :meth:`update` (a sidecar feeds them itself): the next
        :meth:`check` prices them as it prices the samples :meth:`update` counts (``G x
        batch_size`` samples an iteration), unless ``config.iterations_per_check`` fixes the
        count. ConfigError (nothing counted) unless a whole number >= 0."""
        if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) \
                or iterations < 0:
            raise ConfigError(f"iterations must be a whole number >= 0, got {iterations!r}")
        self._samples += int(iterations) * self.topology.num_gpus * self.batch_size

    def forget_old_deltas(self, keep: int) -> None:
        """Release the :class:`~flexshard_stream.plans.delta.PlanDelta` of every decision in
        :attr:`history` but the last ``keep`` (``delta`` becomes None; the decisions, their
        figures and reasons stay): bounded memory on a long run. ConfigError unless ``keep``
        >= 0."""
        if isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or keep < 0:
            raise ConfigError(f"keep must be a whole number of decisions >= 0, got {keep!r}")
        end = max(0, len(self.history) - int(keep))
        for d in self.history[self._deltas_forgotten:end]:
            d.delta = None
        self._deltas_forgotten = max(self._deltas_forgotten, end)

    @property
    def checks(self) -> int:
        """Checks run so far, those before a :meth:`restore` included."""
        return self._checks_before + len(self.history)

    @property
    def migrated_bytes(self) -> float:
        """Bytes moved by the deltas applied so far (restored runs included)."""
        return self.cost.migration.bytes

    def thresholds(self, summaries: Mapping[str, FrequencySummary] | None = None
                   ) -> dict[str, dict[str, float]]:
        """The replication threshold per table (rows and access probability)."""
        return thresholds(self.plan, summaries if summaries is not None
                          else self.stats.view().summary(self.config.top_k))

    # ------------------------------------------------------------------ state protocol
    def state(self) -> dict[str, Any]:
        """What a restart needs, as a plain dict (torch: ``state_dict``)::

            {"kind": "resharder", "version": 2,
             "plan": Plan, "prev_target": Plan | None,  # the plan in force, the last target
             "budget_bytes": float | None,              # memory budget per GPU (bytes), fixed
                                                        # at the first check
             "migrated_bytes": float, "checks": int,    # bytes moved, checks run so far
             "batches": int, "next_check": float | None, "unit": str,   # :meth:`update`'s
             "samples": int,                            # schedule; samples since the last check
             "cost": CostLedger.to_json(),              # the run's cost so far
             "drift": DriftMeter.state()}               # the measured drift rate
        JSON-able but for the two :class:`Plan` values (immutable; a checkpoint writes them with
        ``Plan.save``). The statistics are not in it: they have their own ``state()``. Version 1
        states (no samples, cost or drift) are restored with a fresh ledger and meter.
        """
        return {"kind": "resharder", "version": _STATE_VERSION, "plan": self.plan,
                "prev_target": self._prev_target, "budget_bytes": self.budget_bytes,
                "migrated_bytes": self.migrated_bytes, "checks": self.checks,
                "batches": self._batches, "next_check": self._schedule.next,
                "unit": self._schedule.unit, "samples": self._samples,
                "cost": self.cost.to_json(), "drift": self.drift.state()}

    def restore(self, state: Mapping[str, Any]) -> list[str]:
        """Take up ``state`` (from :meth:`state`; torch: ``load_state_dict``): the next decision is
        the one the saved re-sharder would have made on the same statistics. Decisions are numbered
        on from ``checks``; :attr:`history` starts empty.

        Both plans must place this re-sharder's tables on its topology (ConfigError); a malformed
        state is a FormatError; either way nothing changes. Returns notes: an explicit memory
        budget (``memory.bytes_per_gpu``) is kept over the saved one, and with another ``unit``
        :meth:`update`'s schedule starts afresh.
        """
        version = state.get("version") if isinstance(state, Mapping) else None
        fields = dict(_STATE_FIELDS)
        if version == 1:   # before the cost ledger and the drift meter
            fields = {k: v for k, v in fields.items() if k not in ("samples", "cost", "drift")}
        check_state(state, "resharder", version if version in (1, 2) else _STATE_VERSION,
                    fields)
        for key in ("plan", "prev_target"):
            if state[key] is not None and not made_for(state[key], self.tables, self.topology):
                raise ConfigError(f"re-sharder state: its {key} was made for other tables or "
                                  "another topology than this re-sharder's")
        budget, nxt = state["budget_bytes"], state["next_check"]
        counts = (state["migrated_bytes"], state["checks"], state["batches"],
                  state.get("samples", 0))
        if not (all(math.isfinite(x) and x >= 0 for x in counts)
                and (budget is None or (math.isfinite(budget) and budget > 0))
                and (nxt is None or math.isfinite(nxt))):
            raise FormatError(f"re-sharder state: migrated bytes, checks, batches and samples "
                              f"must be finite and >= 0 (got {counts}), the budget None or > 0 "
                              f"bytes (got {budget!r}), the next check None or finite (got "
                              f"{nxt!r})")
        cost = (CostLedger.from_json(state["cost"]) if "cost" in fields else
                CostLedger(migration=MigrationCost(bytes=float(state["migrated_bytes"]))))
        drift = DriftMeter()
        if "drift" in fields:
            drift.restore(state["drift"])
        notes = []
        if self.memory.bytes_per_gpu is not None and budget != self.budget_bytes:
            notes.append(f"budget_bytes: the state was made with {budget!r}, this re-sharder's "
                         f"memory policy sets {self.budget_bytes!r} (kept)")
            budget = self.budget_bytes
        same_unit = state["unit"] == self._schedule.unit
        if not same_unit:
            notes.append(f"unit: the state counts in {state['unit']!r}, this re-sharder in "
                         f"{self._schedule.unit!r}: update()'s check schedule starts afresh")
        self.plan, self._prev_target = state["plan"], state["prev_target"]
        self.budget_bytes = None if budget is None else float(budget)
        self.cost, self.drift = cost, drift
        self._checks_before, self.history = int(state["checks"]), []
        self._deltas_forgotten = 0
        self._batches = int(state["batches"]) if same_unit else 0
        self._samples = int(state.get("samples", 0))
        self._schedule.next = (None if nxt is None else float(nxt)) if same_unit else None
        return notes

    # ------------------------------------------------------------------ one check
    def check(self, summaries: Mapping[str, FrequencySummary] | None = None, *,
              position: float | None = None, iterations: float | None = None) -> Decision:
        """Plan the target on the current statistics (or ``summaries``) and apply what pays.

        ``iterations``: training iterations since the previous check (default
        ``config.iterations_per_check``, else the samples :meth:`update` fed since then over
        ``G x batch_size``); they are priced with the plan in force (:attr:`cost`) and scale the
        horizon. Returns the :class:`Decision`; when it carries a ``delta``, :attr:`plan` moved by
        it (the caller publishes the change). Never raises for a failed re-plan: the decision says
        ``failed`` and why, and the current plan stays in force. A negative or non-finite
        ``iterations`` is a ConfigError (nothing changes).
        """
        cfg = self.config
        n = self.checks
        pos = float(self._batches if position is None else position)
        its = self._iterations_since(iterations)
        priced = False
        try:
            sums = summaries if summaries is not None else self.stats.view().summary(cfg.top_k)
            if not any(s.total for s in sums.values()):
                self.cost.unpriced_iterations += its
                return self._record(Decision(n, pos, "skipped", "no lookups seen yet",
                                             iterations=its), sums)
            cur_cost = evaluate_analytic(self.plan, sums, workload=self.workload,
                                         want_matrices=False)
            self._price_iterations(cur_cost.iteration_time_s, its)
            priced = True
            # the budget is fixed at the first check (the memory policy applied to the statistics
            # then): a memory-neutral budget recomputed every check would move with sketch noise
            memory = (self.memory if self.budget_bytes is None
                      else MemoryPolicy(bytes_per_gpu=self.budget_bytes))
            res = plan_flexshard(self.tables, self.topology, sums, memory=memory,
                                 config=self.planner, workload=self.workload)
        except FlexShardError as e:
            if not priced:
                self.cost.unpriced_iterations += its
            return self._record(Decision(n, pos, "failed", f"re-plan failed, plan kept: {e}",
                                         iterations=its), None)
        if self.budget_bytes is None:
            self.budget_bytes = float(res.budget_bytes)
        rate = self.drift.observe(self.plan, sums)
        d = Decision(n, pos, "kept", "", current_s=cur_cost.iteration_time_s,
                     target_s=res.cost.iteration_time_s, applied_s=cur_cost.iteration_time_s,
                     iterations=its, drift_rate=rate,
                     horizon_iterations=self._horizon(its), hysteresis=self._hysteresis())
        return self._decide(d, res, cur_cost, sums)

    def _iterations_since(self, iterations: float | None) -> float:
        """Training iterations since the previous check (see :meth:`check`); resets the count of
        samples fed."""
        if iterations is not None and not (math.isfinite(iterations) and iterations >= 0):
            raise ConfigError(f"iterations must be a finite number >= 0, got {iterations!r}")
        samples, self._samples = self._samples, 0
        if iterations is not None:
            return float(iterations)
        if self.config.iterations_per_check is not None:
            return float(self.config.iterations_per_check)
        return samples / self.workload.samples_per_iteration(self.topology)

    def _price_iterations(self, seconds_per_iteration: float, iterations: float) -> None:
        """The plan in force ran ``iterations`` at ``seconds_per_iteration`` (modelled)."""
        self.cost.communication_s += seconds_per_iteration * iterations
        self.cost.iterations += iterations

    def _horizon(self, iterations: float) -> float:
        """Iterations a saving is counted over: ``config.horizon_iterations``, else the drift
        meter's horizon in checks times the iterations of this check (or the configured
        iterations per check)."""
        if self.config.horizon_iterations is not None:
            return float(self.config.horizon_iterations)
        per_check = (self.config.iterations_per_check
                     if self.config.iterations_per_check is not None else iterations)
        return self.drift.horizon_checks(self.config.max_horizon_checks) * per_check

    def _hysteresis(self) -> float:
        """``config.hysteresis``, else the drift meter's."""
        h = self.config.hysteresis
        return float(h) if h is not None else self.drift.hysteresis()

    def _decide(self, d: Decision, res: Any, cur_cost: Cost,
                sums: Mapping[str, FrequencySummary]) -> Decision:
        """Steps 3 to 7 of the rule (docs/RESHARDER.md): over budget, worth it, confirmed,
        steps, cost."""
        cfg, budget = self.config, self.budget_bytes
        cur_s, tgt_s = d.current_s, d.target_s
        prev, self._prev_target = self._prev_target, res.plan
        over = cur_cost.peak_memory_bytes > budget * (1 + cfg.memory_slack)
        gain = cur_s - tgt_s
        if not over and gain <= cfg.min_gain * cur_s:
            d.reason = (f"target saves {gain / cur_s:.2%} of {cur_s * 1e3:.4g} ms per iteration, "
                        f"under min_gain {cfg.min_gain:.2%}")
            return self._record(d, sums)
        if not over and gain * d.horizon_iterations <= (1 + d.hysteresis) * cfg.pause_s:
            d.reason = (f"target saves {gain * d.horizon_iterations * 1e3:.4g} ms over "
                        f"{d.horizon_iterations:.4g} iterations, not (1 + {d.hysteresis:.3g}) x "
                        f"the pause ({cfg.pause_s * 1e3:.4g} ms): waiting, the change merges "
                        f"with the next")
            return self._record(d, sums)
        tgt = res.plan
        if not over and gain < cfg.urgent_gain * cur_s:
            if prev is None:
                d.reason = (f"target saves {gain / cur_s:.2%} (under urgent_gain "
                            f"{cfg.urgent_gain:.0%}): waiting for the next check to confirm it")
                return self._record(d, sums)
            tgt = _confirmed(self.plan, tgt, prev)
        steps = self._feasible_steps(tgt, sums, res, cur_s, budget, over)
        if over:
            # the current plan no longer fits (the workload's buffers grew): the step that fits
            # with the least migration, regardless of the hysteresis and the migration budget
            if not steps:
                return self._apply(d, res.plan, sums, 1.0, budget, forced=True)
            mb, frac, step, delta, sc = min(steps, key=lambda x: (x[0], x[4].iteration_time_s))
            return self._apply(d, step, sums, frac, budget, delta=delta, cost=sc, forced=True)
        if steps:
            applied = self._apply_if_worth_it(d, steps, sums, budget)
            if applied is not None:
                return applied
        if not d.reason:
            mig = ("" if cfg.migration_budget_bytes is None
                   else f"the migration budget ({cfg.migration_budget_bytes:.4g} bytes) and ")
            d.reason = f"no step towards the target fits {mig}the memory budget ({budget:.4g} bytes)"
        return self._record(d, sums)

    def _feasible_steps(self, tgt: Plan, sums: Mapping[str, FrequencySummary], res: Any,
                        cur_s: float, budget: float, over: bool) -> list[tuple]:
        """The steps towards ``tgt`` that fit, as ``(migration bytes, fraction, plan, delta,
        cost)``: ranked fractions of its row changes (sticky) and the full target. A step must fit
        the memory budget (bytes per GPU) and, unless the current plan is ``over`` it, the
        per-check migration budget and lower the modelled iteration time below ``cur_s``."""
        cfg = self.config
        steps = []
        for frac, sticky in [(f, True) for f in _FRACTIONS] + [(1.0, False)]:
            step = _partial(self.plan, tgt, sums, frac, sticky)
            delta = PlanDelta.between(self.plan, step)
            if not delta:
                continue
            mb = float(delta.migration_bytes)
            if (not over and cfg.migration_budget_bytes is not None
                    and mb > cfg.migration_budget_bytes):
                continue
            sc = res.cost if step is tgt else evaluate_analytic(
                step, sums, workload=self.workload, want_matrices=False)
            if (sc.peak_memory_bytes > budget * (1 + 1e-9)
                    or not (over or sc.iteration_time_s < cur_s)):
                continue
            steps.append((mb, frac, step, delta, sc))
        return steps

    def _apply_if_worth_it(self, d: Decision, steps: list[tuple],
                           sums: Mapping[str, FrequencySummary], budget: float) -> Decision | None:
        """Largest gains first: of the ``steps`` that capture enough of the best saving, the one
        that moves the fewest bytes, applied if its saving over the horizon beats (1 +
        hysteresis) times its full cost (pause + transfer); else None, with the reason in ``d``
        (the plan stays: the next check weighs the change again, merged with what drifted
        since)."""
        cfg, cur_s = self.config, d.current_s
        best = max(cur_s - x[4].iteration_time_s for x in steps)
        mb, frac, step, delta, sc = min((x for x in steps if cur_s - x[4].iteration_time_s
                                         >= cfg.capture * best), key=lambda x: (x[0], -x[1]))
        saving = (cur_s - sc.iteration_time_s) * d.horizon_iterations
        price = migration_cost(delta, cfg.pause_s, self.topology)
        if saving > (1 + d.hysteresis) * price.total_s:
            return self._apply(d, step, sums, frac, budget, delta=delta, cost=sc)
        d.reason = (f"saving {saving * 1e3:.4g} ms over {d.horizon_iterations:.4g} iterations "
                    f"does not beat (1 + {d.hysteresis:.3g}) x (pause {price.pause_s * 1e3:.4g} ms"
                    f" + transfer {price.transfer_s * 1e3:.4g} ms of {price.bytes:.4g} bytes): "
                    f"waiting, the change merges with the next")
        return None

    def _apply(self, d: Decision, new: Plan, sums, frac: float, budget: float, *,
               delta: PlanDelta | None = None, cost: Cost | None = None,
               forced: bool = False) -> Decision:
        delta = delta if delta is not None else PlanDelta.between(self.plan, new)
        cost = cost if cost is not None else evaluate_analytic(
            new, sums, workload=self.workload, want_matrices=False)
        applied = delta.apply(self.plan)   # through the delta: what a training job would apply
        if applied != new:
            raise FlexShardError("internal error: applying the delta did not give the step plan")
        price = migration_cost(delta, self.config.pause_s, self.topology)
        d.delta = delta
        d.action = "applied" if frac >= 1.0 else "partial"
        d.fraction = frac
        d.applied_s = cost.iteration_time_s
        d.peak_memory_bytes = float(cost.peak_memory_bytes)
        d.budget_bytes = float(budget)
        d.migration_bytes, d.migration_s, d.pause_s = price.bytes, price.transfer_s, price.pause_s
        if forced:
            d.reason = (f"current plan exceeds the memory budget {budget:.4g} bytes per GPU on "
                        "these statistics: moved to the target")
        else:
            d.reason = (f"saves {(d.current_s - d.applied_s) * 1e3:.4g} ms per iteration "
                        f"({(d.current_s - d.applied_s) / d.current_s:.1%}) over "
                        f"{d.horizon_iterations:.4g} iterations; migration "
                        f"{d.migration_bytes:.4g} bytes, {d.migration_s * 1e3:.4g} ms + pause "
                        f"{d.pause_s * 1e3:.4g} ms")
        self.plan = applied
        self.cost.migration = self.cost.migration + price
        return self._record(d, sums)

    def _record(self, d: Decision, sums) -> Decision:
        if sums is not None:
            d.thresholds = thresholds(self.plan, sums)
            if d.action != "skipped":
                self.drift.rebase(self.plan, sums)
        else:
            d.thresholds = self.history[-1].thresholds if self.history else {}
        self.history.append(d)
        return d
