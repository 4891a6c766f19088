"""The RecShard memory tier: split each GPU's cold shard between HBM and host memory (UVM).

:func:`split_cold` takes a plan and an HBM budget per GPU and returns a plan whose cold rows overflow
to host memory so that every GPU's peak HBM (HBM rows + communication buffers + reservation, as
:func:`~flexshard_stream.placement.cost.evaluate_analytic` computes it) fits the budget. Routing is unchanged
(every row keeps its owner), so the communication buffers are unchanged too; only where the owner keeps
a row changes. Representation (``TablePlan.hbm_fraction``, docs/COST_MODEL.md "Host memory tier"):
replicas and placed rows are always in HBM; any other cold row ``r`` of GPU ``g`` is in HBM iff
``host_u(r) < hbm_fraction[g]``.

- frequency-aware (RecShard): over all tables at once, the explicit top cold rows of the summaries are
  ranked by expected host lookups saved per HBM byte, ``h_r * (D e + 2 (D e + s)) / (D e + s)`` with
  ``h_r`` the cost model's host lookups of the row (``G (1 - exp(-lambda_r / G))`` with
  de-duplication, ``lambda_r`` without), and each table's tail as one uniform block with its own
  density; each overflowing GPU's capacity is filled greedily in that order: explicit rows become
  placed rows at their current owner, a table's block gets the fraction of its bytes that fits;
- frequency-blind: the same capacity per GPU, filled by one fraction for all cold rows of that GPU
  (every table), no new placed rows.

The memory of the hash split is counted by its expected value, ``(1 - f) * rows * row_bytes`` in host
memory, as :attr:`Plan.host_bytes_per_gpu` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..kernels.analytic import cold_rows_by_table, fill_hbm, top_cold_owners
from ..plans.plan import Plan, TablePlan
from ..plans.tables import summaries_by_table
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .cost import Cost, evaluate_analytic
from .workload import CostModel, Workload, workload_of

__all__ = ["HbmRoom", "TopRows", "cold_rows_per_gpu", "slow_memory_report", "split_cold"]

_EMPTY_F = np.zeros(0, np.float64)


def _strip(plan: Plan) -> Plan:
    """The plan without any host tier (the same object when it has none)."""
    if not plan.has_host_tier:
        return plan
    tps = [tp if not tp.has_host_tier else TablePlan(
        tp.table, tp.cold, tp.global_ids, tp.node_ids, tp.node_local, tp.placed_ids,
        tp.placed_gpus, sharding=tp.sharding) for tp in plan.tables.values()]
    return Plan(plan.strategy, plan.topology, tps, plan.meta)


def cold_rows_per_gpu(plan: Plan) -> np.ndarray:
    """Rows of each table routed by its cold function (not replicas, not placed) on each GPU:
    float64[G, T] (GPU-major), tables in plan order (hash-sharded tables above 2**24 rows: expected
    values)."""
    topo = plan.topology
    G = topo.num_gpus
    f = plan.flat
    out = np.zeros((G, len(plan.tables)))
    todo = cold_rows_by_table(G, f["layout"], f["num_rows"], f["lay_kind"], f["lay_off"],
                              f["lay_gpus"], f["lay_boff"], f["lay_bounds"], f["sp_off"],
                              f["sp_ids"], out)
    if todo.size:
        tps = list(plan.tables.values())
        for t in todo:
            tp = tps[int(t)]
            out[:, t] = tp.rows_per_gpu(topo) - Plan.non_cold_rows_per_gpu(tp, topo)
    return out


def _budget(hbm_budget: Any, G: int) -> np.ndarray:
    try:
        b = np.asarray(hbm_budget, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"hbm_budget must be bytes per GPU (a number or {G} numbers), "
                          f"got {hbm_budget!r}") from None
    if b.ndim == 0:
        b = np.full(G, float(b))
    b = b.ravel()
    if b.size != G:
        raise ConfigError(f"hbm_budget has {b.size} values; one per GPU expected ({G})")
    if not np.all(np.isfinite(b)) or np.any(b < 0):
        raise ConfigError("hbm_budget must be finite bytes >= 0 per GPU")
    return b


def _summary(summaries: Mapping[str, FrequencySummary], tp: TablePlan) -> FrequencySummary:
    return summaries_by_table([tp.table], summaries)[tp.table.name]


def split_cold(plan: Plan, summaries: Mapping[str, FrequencySummary],
               batch_size: int | Workload | None = None, hbm_budget: Any = None,
               model: CostModel | None = None, *, frequency_aware: bool = True,
               mean_lengths: Mapping[str, float] | None = None,
               cost: Cost | None = None, top_rows: "TopRows | None" = None,
               workload: Workload | None = None) -> Plan:
    """A new plan whose cold rows overflow to host memory so that every GPU's peak HBM fits.

    Steps: the HBM room each GPU has for its cold rows (:class:`HbmRoom`), the split of the
    overflowing GPUs' cold rows (frequency-aware or blind), the host memory check per node, and the
    table plans with their host tier.

    Parameters
    ----------
    plan : Plan
        The placement to split (left untouched; any host tier it has is replaced).
    summaries, batch_size, model, mean_lengths, workload
        As for :func:`~flexshard_stream.placement.cost.evaluate_analytic` (``workload=``, or
        the loose ``batch_size``, ``model``, ``mean_lengths``): they give the communication
        buffers and reservation (peak memory) and, frequency-aware, the expected lookups of
        each row.
    hbm_budget : float or float64[G]
        HBM bytes per GPU for rows + buffers + reservation.
    frequency_aware : bool
        RecShard's frequency-aware split (hot cold rows kept in HBM as placed rows, then a fraction
        per table and GPU) when True; one fraction per GPU for all its cold rows when False.
    cost : Cost, optional
        ``evaluate_analytic(plan, ...)`` of the plan without host tier, when the caller has it
        already (saves that evaluation; the split does not change routing or buffers).
    top_rows : TopRows, optional
        The summaries' top rows gathered once (:meth:`TopRows.gather`) with the same
        ``summaries`` and workload, for a caller that splits
        many plans of the same tables (a planner); saves gathering, ranking and routing them again.

    Returns
    -------
    Plan
        Same strategy, topology, routing and replicas; extra placed rows (frequency-aware) and
        ``hbm_fraction`` on the tables with rows in host memory; ``meta["recshard"]`` summarizes the
        split. When everything fits in HBM, a plan without host tier.

    Raises
    ------
    ConfigError
        A GPU's replicas + placed rows + buffers + reservation already exceed its budget (naming the
        GPU and the bytes); the rows sent to host memory overflow a node's ``host_memory_bytes``;
        a missing summary; a malformed budget.
    """
    work = workload_of(batch_size, model, mean_lengths, workload, where="split_cold")
    topo = plan.topology
    budget = _budget(hbm_budget, topo.num_gpus)
    base = _strip(plan)
    if cost is None:
        cost = evaluate_analytic(base, summaries, workload=work, want_matrices=False)
    room = HbmRoom.measure(base, cost, budget)
    meta = dict(plan.meta)
    info: dict[str, Any] = {"frequency_aware": bool(frequency_aware),
                            "hbm_budget_min": float(budget.min()),
                            "gpus_overflowing": int(room.over.sum())}
    if not room.over.any():
        meta["recshard"] = {**info, "host_tier": False, "placed_rows_added": 0,
                            "host_bytes_max": 0.0}
        return Plan(base.strategy, topo, list(base.tables.values()), meta)
    if frequency_aware:
        rows = top_rows or TopRows.gather(list(base.tables.values()), summaries, work)
        split = _aware_split(base, room, rows)
    else:
        split = _blind_split(room)
    _check_host_memory(split.host, topo)
    meta["recshard"] = {**info, "host_tier": True, "placed_rows_added": int(split.placed_ids.size),
                        "host_bytes_max": float(split.host.max())}
    return Plan(base.strategy, topo, _with_host_tier(base, split), meta)


@dataclass(frozen=True)
class HbmRoom:
    """The HBM each GPU has for its cold rows under a budget (every array per GPU).

    row_bytes : float64[T]   bytes of one stored row per table (plan order)
    cold : float64[G, T]     cold rows (not replicas, not placed) per GPU and table
    cold_bytes : float64[G]  their bytes
    capacity : float64[G]    HBM bytes left for cold rows: the budget less replicas, placed rows,
                             communication buffers and reservation, less a margin of 1e-12 of the
                             budget (so that the evaluator's peak never exceeds the budget)
    over : bool[G]           GPUs whose cold rows do not all fit (they get a host tier)
    """

    row_bytes: np.ndarray
    cold: np.ndarray
    cold_bytes: np.ndarray
    capacity: np.ndarray
    over: np.ndarray

    @classmethod
    def measure(cls, plan: Plan, cost: Cost, budget: np.ndarray) -> "HbmRoom":
        """The room of ``plan`` (no host tier) with analytic ``cost`` under ``budget`` (bytes per
        GPU); raises ConfigError naming the GPU whose fixed bytes already exceed its budget."""
        G = plan.topology.num_gpus
        tps = list(plan.tables.values())
        T = len(tps)
        rb = np.array([float(tp.table.row_bytes) for tp in tps]) if T else np.zeros(0)
        cold = cold_rows_per_gpu(plan)                                   # [G, T] rows
        cold_bytes = cold @ rb if T else np.zeros(G)
        # the plan's HBM with every row in HBM, less what the split can move (the rows as the
        # cost's profile stores them: TorchRec keeps node replicas on every GPU)
        peak = cost.peak_memory_per_gpu
        fixed = peak - cold_bytes
        cap = budget - fixed
        tol = 1e-9 * np.maximum(budget, 1.0)
        short = np.flatnonzero(cap < -tol)
        if short.size:
            g = int(short[np.argmin(cap[short])])
            raise ConfigError(
                f"HBM budget too small on GPU {g}: replicas + placed rows + communication buffers "
                f"+ reservation already take {fixed[g]:.6g} bytes, over its budget of "
                f"{budget[g]:.6g} bytes ({short.size} of {G} GPUs short; the host memory tier can "
                "only move cold rows)")
        cap = np.maximum(cap, 0.0)
        over = cap < cold_bytes * (1 - 1e-12)
        # what the split fills: a margin of 1e-12 of the budget absorbs the rounding of the sums
        cap = np.maximum(cap - 1e-12 * budget, 0.0)
        return cls(rb, cold, cold_bytes, cap, over)


@dataclass(frozen=True)
class _Split:
    """Where cold rows go: expected host bytes per GPU, the tables with a host tier, the HBM
    fraction per GPU (float64[G], every table) or per GPU and table (float64[G, T]), and the rows
    newly placed at their owner (table after table: table t's at
    ``placed_off[t]:placed_off[t + 1]``)."""

    host: np.ndarray
    tier: np.ndarray
    fraction: np.ndarray
    placed_ids: np.ndarray
    placed_gpus: np.ndarray
    placed_off: np.ndarray

    def table_fraction(self, t: int) -> np.ndarray:
        return self.fraction[:, t] if self.fraction.ndim == 2 else self.fraction


def _blind_split(room: HbmRoom) -> _Split:
    """Frequency-blind: each overflowing GPU keeps one fraction of all its cold rows in HBM."""
    G, T = room.cold.shape
    over, cap, cold_bytes = room.over, room.capacity, room.cold_bytes
    fg = np.ones(G)
    fg[over] = np.clip(cap[over] / cold_bytes[over] * (1 - 1e-12), 0.0, 1.0)
    host = (1.0 - fg) * cold_bytes
    tier = over.astype(np.float64) @ room.cold > 0           # cold rows on an overflowing GPU
    return _Split(host, tier, fg, np.zeros(0, np.int64), np.zeros(0, np.int32),
                  np.zeros(T + 1, np.int64))


class TopRows:
    """The summaries' explicit top rows of every table, concatenated in plan order (table t's at
    ``off[t]:off[t+1]``), with probabilities per ID drawn; per table the IDs per sample, the
    probability of one tail row and the number of tail rows. Gathered once per workload
    (:meth:`gather`), it keeps what does not depend on the plan being split: the rows' expected
    host lookups, their ranking by host lookups saved per HBM byte, and each table's top rows'
    owners under every cold function met (``split_cold(..., top_rows=...)``).
    """

    def __init__(self, names: tuple[str, ...], off: np.ndarray, ids: np.ndarray, p: np.ndarray,
                 mean_length: np.ndarray, tail_p: np.ndarray, tail_rows: np.ndarray,
                 batch_size: int, dedup: bool):
        self.names, self.off, self.ids, self.p = names, off, ids, p
        self.mean_length, self.tail_p, self.tail_rows = mean_length, tail_p, tail_rows
        self.batch_size, self.dedup = int(batch_size), bool(dedup)
        self.table = np.repeat(np.arange(len(names), dtype=np.int64), np.diff(off))
        self._owners: dict[tuple[int, tuple], np.ndarray] = {}
        self._ranked: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._first: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def gather(cls, tps: list[TablePlan], summaries: Mapping[str, FrequencySummary],
               workload: Workload | int, model: CostModel | None = None,
               mean_lengths: Mapping[str, float] | None = None) -> "TopRows":
        """The top rows of the tables of ``tps`` (in order) under ``workload``: its B samples per
        GPU, mean lengths and de-duplication (or the loose ``batch_size``, ``model``,
        ``mean_lengths`` of :func:`~flexshard_stream.placement.workload.workload_of`)."""
        work = workload_of(workload, model, mean_lengths, where="TopRows.gather")
        T = len(tps)
        ids_l, p_l, off = [], [], [0]
        L = np.zeros(T)
        tail_p = np.zeros(T)
        tail_rows = np.zeros(T)
        for i, tp in enumerate(tps):
            s = _summary(summaries, tp)
            ids_l.append(np.asarray(s.top_ids, np.int64))
            p_l.append(np.asarray(s.top_est, np.float64) / s.total if s.total
                       else np.zeros(s.top_ids.size))
            off.append(off[-1] + s.top_ids.size)
            L[i] = work.mean_length(tp.name, s)
            tail_p[i] = s.tail_probability()
            tail_rows[i] = s.tail_rows if s.total else 0.0
        return cls(tuple(tp.name for tp in tps), np.asarray(off, np.int64),
                   np.concatenate(ids_l) if ids_l else np.zeros(0, np.int64),
                   np.concatenate(p_l) if p_l else np.zeros(0), L, tail_p, tail_rows,
                   work.batch_size, work.dedup)

    def host_lookups(self, lam: np.ndarray, num_gpus: int) -> np.ndarray:
        """The cost model's host lookups per iteration of rows with ``lam`` expected lookups."""
        return num_gpus * -np.expm1(-lam / num_gpus) if self.dedup else lam

    def ranked(self, per_byte: np.ndarray, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
        """(density float64[n], order int64[n]): each top row's host lookups saved per HBM byte
        (UVM bytes, ``per_byte[t]`` UVM bytes per HBM byte of table t) and the rows by density,
        highest first (stable)."""
        key = per_byte.tobytes() + num_gpus.to_bytes(8, "little")
        got = self._ranked.get(key)
        if got is None:
            lam = num_gpus * float(self.batch_size) * self.mean_length[self.table] * self.p
            dens = self.host_lookups(lam, num_gpus) * per_byte[self.table]
            got = self._ranked[key] = (dens, np.argsort(-dens, kind="stable").astype(np.int64))
        return got

    def owners(self, plan: Plan) -> np.ndarray:
        """Owner GPU of every top row that ``plan``'s cold functions route (int64[n]), or -1 (as
        ``kernels.analytic.top_cold_owners``: replicas and placed rows, rows out of range, later
        listings of a row, tables data-parallel or column-wise). Each table's owners under a cold
        function are computed once; the plan's replicas and placed rows are then masked."""
        tps = list(plan.tables.values())
        if tuple(tp.name for tp in tps) != self.names:
            raise ConfigError(f"top rows gathered for tables {list(self.names)[:5]}..., the plan "
                              f"has {[tp.name for tp in tps][:5]}...")
        keys = [(t, tp.cold.layout_key) for t, tp in enumerate(tps)]
        f = plan.flat
        if any(k not in self._owners for k in keys):
            out = np.empty(self.ids.size, np.int64)
            no_special = np.zeros(len(tps) + 1, np.int64)
            top_cold_owners(no_special, np.zeros(0, np.int64), f["layout"], f["num_rows"],
                            f["lay_kind"], f["lay_off"], f["lay_gpus"], f["lay_bounds"],
                            f["lay_boff"], f["lay_seed"], self.off, self.ids, out)
            for t, k in enumerate(keys):
                self._owners.setdefault(k, out[self.off[t]:self.off[t + 1]].copy())
        owner = np.concatenate([self._owners[k] for k in keys]) if keys else \
            np.zeros(0, np.int64)
        sp_off, sp_ids = f["sp_off"], f["sp_ids"]
        for t in np.flatnonzero(np.diff(sp_off)):
            uniq, first = self._first_listings(int(t))
            sp = sp_ids[sp_off[t]:sp_off[t + 1]]
            pos = np.minimum(np.searchsorted(uniq, sp), max(uniq.size - 1, 0))
            hit = pos[uniq[pos] == sp] if uniq.size else pos[:0]
            owner[self.off[t] + first[hit]] = -1
        return owner

    def _first_listings(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Table ``t``'s distinct top IDs (sorted) and the index of each one's first listing."""
        got = self._first.get(t)
        if got is None:
            got = self._first[t] = np.unique(self.ids[self.off[t]:self.off[t + 1]],
                                             return_index=True)
        return got


def _aware_split(base: Plan, room: HbmRoom, top: TopRows) -> _Split:
    """Frequency-aware (RecShard): each overflowing GPU's capacity is filled with the cold rows of
    most expected host lookups saved per HBM byte: explicit top rows become placed rows at their
    owner, each table's tail a fraction of its bytes (``kernels/analytic.fill_hbm``)."""
    G, T = room.cold.shape
    rb, cold, over = room.row_bytes, room.cold, room.over
    owner = top.owners(base)
    tab = top.table
    per_byte = base.flat["uvm_lookup_bytes"] / np.where(rb > 0, rb, 1.0)  # UVM per HBM byte
    # explicit rows: the cost model's host lookups per HBM byte, in UVM bytes, ranked once
    dens, ranked = top.ranked(per_byte, G)
    # each table's tail: its lookups spread uniformly over its cold rows outside the top
    n_top_cold = np.bincount(tab[owner >= 0], minlength=T).astype(np.float64)
    rest = cold.sum(axis=0) - n_top_cold
    lam_tail = G * float(top.batch_size) * top.mean_length * top.tail_p
    tail_h = top.tail_rows * top.host_lookups(lam_tail, G)
    tail_dens = np.where(rest > 0, tail_h / np.where(rest > 0, rest, 1.0), 0.0) * per_byte
    tail_order = np.argsort(-tail_dens, kind="stable").astype(np.int64)
    frac = np.empty((G, T))
    placed = np.zeros(top.ids.size, np.bool_)
    host = np.zeros(G)
    tier = np.zeros(T, np.bool_)
    on_over = owner >= 0
    on_over[on_over] = over[owner[on_over]]
    ex_order = ranked[on_over[ranked]]
    fill_hbm(room.capacity, over, owner, tab, dens, ex_order, tail_order, tail_dens, cold, rb,
             frac, placed, host, tier)
    k = np.flatnonzero(placed)                       # table after table
    if not k.size:
        return _Split(host, tier, frac, np.zeros(0, np.int64), np.zeros(0, np.int32),
                      np.zeros(T + 1, np.int64))
    return _Split(host, tier, frac, top.ids[k], owner[k].astype(np.int32),
                  np.searchsorted(tab[k], np.arange(T + 1)).astype(np.int64))


def _check_host_memory(host: np.ndarray, topo: Topology) -> None:
    """Raise ConfigError when a node's GPUs need more host memory (bytes, ``host`` per GPU) than its
    ``host_memory_bytes``."""
    M = topo.gpus_per_node
    per_node = host.reshape(topo.nodes, M).sum(axis=1)
    bad = np.flatnonzero(per_node > topo.host_memory_bytes * (1 + 1e-12))
    if bad.size:
        n = int(bad[np.argmax(per_node[bad] - topo.host_memory_bytes[bad])])
        raise ConfigError(
            f"host memory overflow on node {n}: its GPUs {n * M}..{n * M + M - 1} need "
            f"{per_node[n]:.6g} bytes of cold rows in host memory, over its host_memory_bytes of "
            f"{float(topo.host_memory_bytes[n]):.6g} bytes (raise the HBM budget or host memory)")


def _with_host_tier(base: Plan, split: _Split) -> list[TablePlan]:
    """``base``'s table plans with ``split``'s HBM fractions and extra placed rows (tables without
    either unchanged)."""
    out = []
    for t, tp in enumerate(base.tables.values()):
        a, b = split.placed_off[t], split.placed_off[t + 1]
        if not split.tier[t] and a == b:
            out.append(tp)
            continue
        hf = np.ascontiguousarray(split.table_fraction(t)) if split.tier[t] else _EMPTY_F
        if b > a:
            pid, pg = split.placed_ids[a:b], split.placed_gpus[a:b]
            if tp.placed_ids.size:
                pid = np.concatenate([tp.placed_ids, pid])
                pg = np.concatenate([tp.placed_gpus, pg])
            o = np.argsort(pid)                          # IDs are distinct
            pid, pg = pid[o], pg[o]
        else:
            pid, pg = tp.placed_ids, tp.placed_gpus
        out.append(TablePlan(tp.table, tp.cold, tp.global_ids, tp.node_ids, tp.node_local, pid,
                             pg, hf, sharding=tp.sharding))
    return out


def slow_memory_report(cost_aware: Cost, cost_blind: Cost) -> dict[str, float]:
    """Host-memory (slow memory) accesses of a frequency-aware split against a frequency-blind one
    with the same budget: lookups per iteration, UVM time, and the reduction / speedup of aware."""
    ha, hb = cost_aware.host_lookups_total, cost_blind.host_lookups_total
    ua, ub = cost_aware.uvm_time_s, cost_blind.uvm_time_s

    def ratio(num: float, den: float) -> float:
        if den > 0:
            return num / den
        return 1.0 if num == 0 else math.inf

    return {"host_lookups_aware": ha, "host_lookups_blind": hb,
            "slow_memory_access_reduction_vs_blind": (1.0 - ha / hb) if hb > 0 else 0.0,
            "uvm_time_s_aware": ua, "uvm_time_s_blind": ub,
            "uvm_time_speedup_vs_blind": ratio(ub, ua),
            "iteration_time_s_aware": cost_aware.iteration_time_s,
            "iteration_time_s_blind": cost_blind.iteration_time_s,
            "iteration_time_speedup_vs_blind": ratio(cost_blind.iteration_time_s,
                                                     cost_aware.iteration_time_s)}
