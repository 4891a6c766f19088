"""The incremental re-sharder: moves the replication threshold online as the row distribution drifts.

Fed batches (or pointed at a :class:`~flexshard_stream.stats.window.DecayedStats` /
:class:`~flexshard_stream.stats.window.WindowedStats` view), it checks every ``check_every`` batches or
seconds: it plans the target with the FlexShard planner on the current statistics, prices the
current plan on the same statistics (one evaluator, ``evaluate_analytic``), and computes the
:class:`~flexshard_stream.placement.delta.PlanDelta`. A change is applied only when its modelled saving over
the horizon beats its migration time by the hysteresis margin; when the whole delta moves more than
the migration budget of one check, the largest gains go first: the rows the target promotes in
decreasing access probability, the rows it demotes in increasing probability, a fraction of each
(1, 1/2, 1/4, ...) chosen so the step fits both the migration budget and the memory budget. A
re-plan that fails (bad statistics, infeasible budget) keeps the current plan and says why. Every
check returns its :class:`Decision`; the caller publishes one that carries a delta (the re-sharder
calls nothing back). The decision rule is documented in docs/RESHARDER.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, FlexShardError, FormatError
from ..placement.baselines import build_baseline
from ..placement.cost import Cost, CostModel, evaluate_analytic
from ..placement.delta import PlanDelta
from ..placement.plan import Plan, TablePlan
from ..placement.planner import MemoryPolicy, PlannerConfig, plan_flexshard
from ..placement.tables import EmbeddingTable, summaries_by_table
from ..placement.topology import Topology
from ..stats.batch import Batch
from ..stats.state import NUMBER, OPTIONAL_NUMBER, check_state
from ..stats.stream import StreamStats
from ..stats.summary import FrequencySummary
from ..stats.window import Clock, DecayedStats, WindowedStats

__all__ = ["CheckSchedule", "ReshardConfig", "Decision", "Resharder", "made_for", "thresholds"]


@dataclass(frozen=True)
class ReshardConfig:
    """When and how much the re-sharder moves.

    check_every : float       batches (or seconds, ``unit="seconds"``) between checks
    unit : str                "batches" or "seconds"
    horizon_iterations : float  training iterations over which a saving is counted (iterations of
                              G x batch_size samples); the saving per iteration times this must
                              beat the migration time by the hysteresis margin
    hysteresis : float        margin: apply when saving > (1 + hysteresis) x migration time
    min_gain : float          ignore targets that save less than this fraction of the current
                              modelled iteration time (sketch noise on a stationary stream)
    migration_budget_bytes : float | None   most bytes moved per check (None: no limit)
    urgent_gain : float       a target saving at least this fraction of the current time is
                              applied at once; below it, only row changes that the previous
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
    horizon_iterations: float = 1000.0
    hysteresis: float = 0.25
    min_gain: float = 0.03
    migration_budget_bytes: float | None = None
    capture: float = 0.9
    urgent_gain: float = 0.1
    memory_slack: float = 0.05
    top_k: int = 4096

    def __post_init__(self) -> None:
        Clock(self.unit)
        for name in ("check_every", "horizon_iterations"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.hysteresis >= 0:
            raise ConfigError(f"hysteresis must be >= 0, got {self.hysteresis}")
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
    migration_bytes, migration_s : float what the applied delta moved (bytes) and its time (s)
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
    fraction: float = 0.0
    peak_memory_bytes: float = float("nan")
    budget_bytes: float = float("nan")
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "position": self.position, "action": self.action,
                "reason": self.reason, "current_s_per_iter": self.current_s,
                "target_s_per_iter": self.target_s, "applied_s_per_iter": self.applied_s,
                "migration_bytes": self.migration_bytes, "migration_s": self.migration_s,
                "fraction": self.fraction, "peak_memory_bytes": self.peak_memory_bytes,
                "budget_bytes": self.budget_bytes, "thresholds": self.thresholds,
                "delta": self.delta.summary() if self.delta is not None else None}


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
_STATE_VERSION = 1
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
    """Keeps a plan near the planner's target at a fraction of the migration.

    Parameters
    ----------
    tables, topology, batch_size : as for :func:`~flexshard_stream.placement.planner.plan_flexshard`
        (``batch_size``: samples per GPU per iteration)
    stats : DecayedStats | WindowedStats | StreamStats   where the statistics come from; default a
        WindowedStats of the last 8 checks in 4 sub-windows. :meth:`update` feeds it.
    memory, model, planner : planner options (memory policy, cost model, planner knobs)
    config : ReshardConfig
    plan : the plan in force at the start (default: the row-wise baseline)

    ``plan`` is the current plan; ``history`` the decisions of this object (``checks`` counts
    restored ones too); ``thresholds()`` the replication threshold per table. :meth:`check` and
    :meth:`update` return each :class:`Decision`; one with a ``delta`` moved ``plan``: the caller
    publishes it (nothing is called back). ``state()`` / ``restore(state)`` carry the re-sharder
    across a restart.
    """

    def __init__(self, tables: Sequence[EmbeddingTable], topology: Topology, batch_size: int, *,
                 stats: DecayedStats | WindowedStats | StreamStats | None = None,
                 memory: MemoryPolicy | None = None, model: CostModel | None = None,
                 planner: PlannerConfig | None = None, config: ReshardConfig | None = None,
                 plan: Plan | None = None):
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0 samples per GPU, got {batch_size}")
        self.tables = list(tables)
        self.topology = topology
        self.batch_size = int(batch_size)
        self.config = config or ReshardConfig()
        self.memory = memory or MemoryPolicy()
        self.model = model or CostModel()
        self.planner = planner
        names = {t.name: t.num_rows for t in self.tables}
        if stats is None:
            # a sliding window forgets exactly (decayed statistics keep their distinct counts)
            stats = WindowedStats(names, window=8 * self.config.check_every, slots=4,
                                  unit=self.config.unit)
        self.stats = stats
        self.plan = plan if plan is not None else build_baseline("rw", self.tables, topology)
        if set(self.plan.tables) != set(names):
            raise ConfigError(f"the initial plan's tables {sorted(self.plan.tables)} are not the "
                              f"re-sharder's {sorted(names)}")
        self.history: list[Decision] = []
        self._clock = Clock(self.config.unit)
        self._batches = 0
        self._schedule = CheckSchedule(self.config.check_every, self.config.unit)
        self.migrated_bytes = 0.0
        self.budget_bytes: float | None = (self.memory.bytes_per_gpu
                                           if self.memory.bytes_per_gpu is not None else None)
        self._prev_target: Plan | None = None
        self._checks_before = 0       # checks run before a restore (decision numbers go on)

    # ------------------------------------------------------------------ feeding
    def update(self, batch: Batch) -> Decision | None:
        """Feed one batch to the statistics; run a check when one is due (returns its decision)."""
        self.stats.update(batch)
        self._batches += 1
        pos = self._clock.position(batch, self._batches)
        return self.check(position=pos) if self._schedule.due(pos) else None

    @property
    def checks(self) -> int:
        """Checks run so far, those before a :meth:`restore` included."""
        return self._checks_before + len(self.history)

    def thresholds(self, summaries: Mapping[str, FrequencySummary] | None = None
                   ) -> dict[str, dict[str, float]]:
        """The replication threshold per table (rows and access probability)."""
        return thresholds(self.plan, summaries if summaries is not None
                          else self.stats.view().summary(self.config.top_k))

    # ------------------------------------------------------------------ state protocol
    def state(self) -> dict[str, Any]:
        """What a restart needs, as a plain dict (torch: ``state_dict``)::

            {"kind": "resharder", "version": 1,
             "plan": Plan, "prev_target": Plan | None,  # the plan in force, the last target
             "budget_bytes": float | None,              # memory budget per GPU (bytes), fixed
                                                        # at the first check
             "migrated_bytes": float, "checks": int,    # bytes moved, checks run so far
             "batches": int, "next_check": float | None, "unit": str}   # :meth:`update`'s
                                                                         # schedule
        JSON-able scalars but for the two :class:`Plan` values (immutable; a checkpoint writes
        them with ``Plan.save``). The statistics are not in it: they have their own ``state()``.
        """
        return {"kind": "resharder", "version": _STATE_VERSION, "plan": self.plan,
                "prev_target": self._prev_target, "budget_bytes": self.budget_bytes,
                "migrated_bytes": self.migrated_bytes, "checks": self.checks,
                "batches": self._batches, "next_check": self._schedule.next,
                "unit": self._schedule.unit}

    def restore(self, state: Mapping[str, Any]) -> list[str]:
        """Take up ``state`` (from :meth:`state`; torch: ``load_state_dict``): the next decision is
        the one the saved re-sharder would have made on the same statistics. Decisions are numbered
        on from ``checks``; :attr:`history` starts empty.

        Both plans must place this re-sharder's tables on its topology (ConfigError); a malformed
        state is a FormatError; either way nothing changes. Returns notes: an explicit memory
        budget (``memory.bytes_per_gpu``) is kept over the saved one, and with another ``unit``
        :meth:`update`'s schedule starts afresh.
        """
        check_state(state, "resharder", _STATE_VERSION,
                    {"plan": Plan, "prev_target": (Plan, type(None)),
                     "budget_bytes": OPTIONAL_NUMBER, "migrated_bytes": NUMBER, "checks": int,
                     "batches": int, "next_check": OPTIONAL_NUMBER, "unit": str})
        for key in ("plan", "prev_target"):
            if state[key] is not None and not made_for(state[key], self.tables, self.topology):
                raise ConfigError(f"re-sharder state: its {key} was made for other tables or "
                                  "another topology than this re-sharder's")
        budget, nxt = state["budget_bytes"], state["next_check"]
        counts = (state["migrated_bytes"], state["checks"], state["batches"])
        if not (all(math.isfinite(x) and x >= 0 for x in counts)
                and (budget is None or (math.isfinite(budget) and budget > 0))
                and (nxt is None or math.isfinite(nxt))):
            raise FormatError(f"re-sharder state: migrated bytes, checks and batches must be "
                              f"finite and >= 0 (got {counts}), the budget None or > 0 bytes "
                              f"(got {budget!r}), the next check None or finite (got {nxt!r})")
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
        self.migrated_bytes = float(state["migrated_bytes"])
        self._checks_before, self.history = int(state["checks"]), []
        self._batches = int(state["batches"]) if same_unit else 0
        self._schedule.next = (None if nxt is None else float(nxt)) if same_unit else None
        return notes

    # ------------------------------------------------------------------ one check
    def check(self, summaries: Mapping[str, FrequencySummary] | None = None, *,
              position: float | None = None) -> Decision:
        """Plan the target on the current statistics (or ``summaries``) and apply what pays.

        Returns the :class:`Decision`; when it carries a ``delta``, :attr:`plan` moved by it (the
        caller publishes the change). Never raises for a failed re-plan: the decision says
        ``failed`` and why, and the current plan stays in force.
        """
        cfg = self.config
        n = self.checks
        pos = float(self._batches if position is None else position)
        try:
            sums = summaries if summaries is not None else self.stats.view().summary(cfg.top_k)
            if not any(s.total for s in sums.values()):
                return self._record(Decision(n, pos, "skipped", "no lookups seen yet"), sums)
            # the budget is fixed at the first check (the memory policy applied to the statistics
            # then): a memory-neutral budget recomputed every check would move with sketch noise
            memory = (self.memory if self.budget_bytes is None
                      else MemoryPolicy(bytes_per_gpu=self.budget_bytes))
            res = plan_flexshard(self.tables, self.topology, sums, self.batch_size, memory,
                                 self.model, config=self.planner)
            cur_cost = evaluate_analytic(self.plan, sums, self.batch_size, self.model,
                                         want_matrices=False)
        except FlexShardError as e:
            return self._record(Decision(n, pos, "failed", f"re-plan failed, plan kept: {e}"),
                                None)
        if self.budget_bytes is None:
            self.budget_bytes = float(res.budget_bytes)
        cur_s, tgt_s = cur_cost.iteration_time_s, res.cost.iteration_time_s
        budget = self.budget_bytes
        d = Decision(n, pos, "kept", "", current_s=cur_s, target_s=tgt_s, applied_s=cur_s)
        prev, self._prev_target = self._prev_target, res.plan
        over = cur_cost.peak_memory_bytes > budget * (1 + cfg.memory_slack)
        gain = cur_s - tgt_s
        if not over and gain <= cfg.min_gain * cur_s:
            d.reason = (f"target saves {gain / cur_s:.2%} of {cur_s * 1e3:.4g} ms per iteration, "
                        f"under min_gain {cfg.min_gain:.2%}")
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
            sc = res.cost if step is tgt else evaluate_analytic(step, sums, self.batch_size,
                                                                self.model, want_matrices=False)
            if (sc.peak_memory_bytes > budget * (1 + 1e-9)
                    or not (over or sc.iteration_time_s < cur_s)):
                continue
            steps.append((mb, frac, step, delta, sc))
        return steps

    def _apply_if_worth_it(self, d: Decision, steps: list[tuple],
                           sums: Mapping[str, FrequencySummary], budget: float) -> Decision | None:
        """Largest gains first: of the ``steps`` that capture enough of the best saving, the one
        that moves the fewest bytes, applied if its saving over the horizon beats the hysteresis
        times its migration time; else None, with the reason in ``d``."""
        cfg, cur_s = self.config, d.current_s
        best = max(cur_s - x[4].iteration_time_s for x in steps)
        mb, frac, step, delta, sc = min((x for x in steps if cur_s - x[4].iteration_time_s
                                         >= cfg.capture * best), key=lambda x: (x[0], -x[1]))
        saving = (cur_s - sc.iteration_time_s) * cfg.horizon_iterations
        ms = float(delta.migration_time_s(self.topology))
        if saving > (1 + cfg.hysteresis) * ms:
            return self._apply(d, step, sums, frac, budget, delta=delta, cost=sc)
        d.reason = (f"saving {saving * 1e3:.4g} ms over {cfg.horizon_iterations:g} iterations "
                    f"does not beat (1 + {cfg.hysteresis:g}) x migration {ms * 1e3:.4g} ms "
                    f"({float(delta.migration_bytes):.4g} bytes)")
        return None

    def _apply(self, d: Decision, new: Plan, sums, frac: float, budget: float, *,
               delta: PlanDelta | None = None, cost: Cost | None = None,
               forced: bool = False) -> Decision:
        delta = delta if delta is not None else PlanDelta.between(self.plan, new)
        cost = cost if cost is not None else evaluate_analytic(new, sums, self.batch_size,
                                                               self.model, want_matrices=False)
        applied = delta.apply(self.plan)   # through the delta: what a training job would apply
        if applied != new:
            raise FlexShardError("internal error: applying the delta did not give the step plan")
        d.delta = delta
        d.action = "applied" if frac >= 1.0 else "partial"
        d.fraction = frac
        d.applied_s = cost.iteration_time_s
        d.peak_memory_bytes = float(cost.peak_memory_bytes)
        d.budget_bytes = float(budget)
        d.migration_bytes = float(delta.migration_bytes)
        d.migration_s = float(delta.migration_time_s(self.topology))
        if forced:
            d.reason = (f"current plan exceeds the memory budget {budget:.4g} bytes per GPU on "
                        "these statistics: moved to the target")
        else:
            d.reason = (f"saves {(d.current_s - d.applied_s) * 1e3:.4g} ms per iteration "
                        f"({(d.current_s - d.applied_s) / d.current_s:.1%}); migration "
                        f"{d.migration_bytes:.4g} bytes, {d.migration_s * 1e3:.4g} ms")
        self.plan = applied
        self.migrated_bytes += d.migration_bytes
        return self._record(d, sums)

    def _record(self, d: Decision, sums) -> Decision:
        d.thresholds = thresholds(self.plan, sums) if sums is not None else \
            (self.history[-1].thresholds if self.history else {})
        self.history.append(d)
        return d
