"""The FlexShard planner: per-row tiered replication on skewed networks, memory-neutral by default.

Pipeline (docs/PLANNER.md gives the reasoning and where it departs from the paper's abstract):

1. order each table's rows by estimated access probability (the summary's explicit top rows; the tail
   stays cold);
2. generate promotion moves jointly across all tables by marginal benefit per byte on a balanced-load
   model of the evaluator (index, embedding and gradient exchange by link class, plus the replica
   all-reduce), lazily re-scored in a heap: a block of rows moves cold -> node replicas, or node ->
   global replicas, only while it pays for its sync;
3. shard what stays cold for the network: weighted ranges proportional to each GPU's inter-node
   bandwidth, the hottest cold rows placed one by one onto the GPU with the least load per bandwidth;
4. pick, among a fixed grid of prefixes of the move sequence, the plan with the least modelled
   communication time (exact analytic evaluator) whose peak per-GPU memory fits the budget; the
   row-wise baseline is always a candidate, so the result is never worse than it in the model, and a
   larger budget can only add candidates, so more memory is never worse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..kernels.greedy import greedy_moves
from ..kernels.routing import place_by_load
from ..stats.summary import FrequencySummary
from .baselines import build_baseline
from .cost import Cost, CostModel, evaluate_analytic
from .plan import ColdSharding, Plan, TablePlan
from .tables import EmbeddingTable, summaries_by_table
from .topology import Topology

__all__ = ["MemoryPolicy", "PlannerConfig", "PlanResult", "plan_flexshard"]


@dataclass(frozen=True)
class MemoryPolicy:
    """Per-GPU memory budget: explicit ``bytes_per_gpu``, or no more peak memory than ``baseline``
    ("rw", "twrw", "tw") on the same workload, times ``factor``.

    host_memory : bool   the RecShard tier: a candidate whose peak HBM exceeds the budget keeps its
                         hottest cold rows in HBM and the rest in host memory (frequency-aware,
                         ``recshard.split_cold``), host lookups charged at UVM bandwidth; the
                         budget is then HBM bytes per GPU and may be below what row-wise needs.
    """

    bytes_per_gpu: float | None = None
    baseline: str = "rw"
    factor: float = 1.0
    host_memory: bool = False

    def __post_init__(self) -> None:
        if self.bytes_per_gpu is not None and not self.bytes_per_gpu > 0:
            raise ConfigError(f"memory budget must be > 0 bytes per GPU, got {self.bytes_per_gpu}")
        if not self.factor > 0:
            raise ConfigError(f"memory factor must be > 0, got {self.factor}")
        if self.baseline not in ("rw", "rw-hash", "twrw", "tw"):
            raise ConfigError(f"memory baseline must be rw, rw-hash, twrw or tw, got "
                              f"{self.baseline!r}")


@dataclass(frozen=True)
class PlannerConfig:
    """Planner knobs.

    blocks : int            rows of a table's top list are promoted in about this many blocks
    max_placed : int        hottest cold rows placed by load per table (0: none)
    prefix_candidates : int plans evaluated exactly along the move sequence
    bandwidth_aware : bool  weighted cold ranges and load-per-bandwidth placement
    variant_tables : int    up to this many tables, each prefix is also tried with its global
                            boundary 2..64x deeper (exact evaluation)
    thresholds : int        shared marginal-value thresholds: every pair ``th0 >= th1`` of this
                            many levels (plus "none") cuts every table at the same expected
                            requests per byte; priced exactly when tables x GPUs <= 2^20, with
                            fewer levels when pairs x summarized rows exceed 2^25 (0: off)
    """

    blocks: int = 64
    max_placed: int = 4096
    prefix_candidates: int = 16
    bandwidth_aware: bool = True
    variant_tables: int = 8
    thresholds: int = 10


@dataclass
class PlanResult:
    """The chosen plan with its modelled cost, the baseline's, and the budget."""

    plan: Plan
    cost: Cost
    baseline: Plan
    baseline_cost: Cost
    budget_bytes: float
    moves_applied: int
    moves_generated: int

    def summary(self) -> dict[str, Any]:
        c, b = self.cost, self.baseline_cost
        return {"strategy": self.plan.strategy, "tiers": self.plan.tier_sizes(),
                "budget_bytes": self.budget_bytes, "peak_memory_bytes": c.peak_memory_bytes,
                "baseline_peak_memory_bytes": b.peak_memory_bytes,
                "comm_time_s": c.comm_time_s, "baseline_comm_time_s": b.comm_time_s,
                "a2a_bytes": c.a2a_bytes, "baseline_a2a_bytes": b.a2a_bytes,
                "inter_node_bytes": c.inter_node_bytes,
                "baseline_inter_node_bytes": b.inter_node_bytes,
                "memory_room": self.plan.meta.get("memory_room", {}),
                "moves_applied": self.moves_applied, "moves_generated": self.moves_generated}


# ----------------------------------------------------------------------------- per-table curves
class _Curve:
    """Cumulative sums over one table's rows in decreasing probability (balanced-load model)."""

    def __init__(self, t: EmbeddingTable, s: FrequencySummary, topo: Topology, B: int,
                 model: CostModel, L: float):
        G = topo.num_gpus
        ok = (s.top_ids >= 0) & (s.top_ids < t.num_rows)
        ids, est = s.top_ids[ok], s.top_est[ok]
        order = np.lexsort((ids, -est))
        self.ids = ids[order].astype(np.int64)
        p = est[order] / s.total if s.total else np.zeros(self.ids.size)
        self.p = p
        self.table = t
        lam = G * B * L * p
        req = -np.expm1(-lam / G) if model.dedup else lam / G
        self.req = req
        self.R = np.concatenate([[0.0], np.cumsum(req)])
        self.U = np.concatenate([[0.0], np.cumsum(-np.expm1(-lam))])
        self.P = np.concatenate([[0.0], np.cumsum(p)])
        pt = s.tail_probability()
        lt = G * B * L * pt
        tail_req = s.tail_rows * (-math.expm1(-lt / G) if model.dedup else lt / G)
        self.R_tot = self.R[-1] + tail_req
        self.tail_req1 = tail_req / s.tail_rows if s.tail_rows > 0 else 0.0
        self.P_tot = self.P[-1] + (s.tail_rows * pt if s.total else 0.0)
        self.k = self.ids.size
        self.L = L
        self.B = B
        self.pooled = t.kind == "pooled"
        self.eb = float(t.embedding_bytes)
        self.rb = float(t.row_bytes)


class _Model:
    """Constants of the load-aware approximation of the evaluator (the planner's proxy, computed in
    ``kernels/greedy.py``).

    Per GPU and phase, the bytes sent are the balanced average; the bytes received at the busiest GPU
    are the larger of the average and the load of the single hottest row it must serve (rows are
    indivisible: a hot cold row's owner, or a hot node replica's local GPU, takes all requests for
    it). Time of a phase: ``max(intra / min intra_bw, inter / min inter_bw)`` over sends and receives;
    sync as in the evaluator.
    """

    def __init__(self, topo: Topology, model: CostModel):
        self.G, self.N, self.M = topo.num_gpus, topo.nodes, topo.gpus_per_node
        self.bi = float(topo.intra_bw.min())
        self.be = float(topo.inter_bw.min())
        self.ib = float(model.index_bytes)
        G, N, M = self.G, self.N, self.M
        if model.allreduce == "hierarchical":
            self.s0_i = 2 * (M - 1) / M if M > 1 else 0.0
            self.s0_e = 2 * (N - 1) / N / M if N > 1 else 0.0
        else:
            self.s0_i = 2 * (G - 1) / G * (M - 1) / max(M, 1) if G > 1 else 0.0
            self.s0_e = 2 * (G - 1) / G * (1 - (M - 1) / max(M, 1)) if G > 1 else 0.0
        self.s1_e = 2 * (N - 1) / N / M if N > 1 else 0.0


_HOT_P = 16.0  # p-norm over tables of the hottest-row loads: a smooth stand-in for their max


def _moves(curves: list[_Curve], pm: _Model, blocks: int, max_steps: int
           ) -> list[tuple[int, int, int]]:
    """Greedy move sequence (table, k0, k1 after each move), independent of the memory budget:
    one Numba call (``kernels/greedy.py``).

    The busiest GPU's load depends on the hottest single row of *any* table; with a plain max,
    promoting one table's hottest row gains nothing while another table's is as hot, and the greedy
    stalls on that plateau. The proxy therefore aggregates the hottest-row loads with a p-norm
    (p = 16), which every table's promotion lowers. Blocks grow geometrically from one row (the
    hottest rows matter most) up to ``k / blocks`` rows. When no move is left in the heap, every
    table is scored again: a table whose moves did not pay earlier may pay now."""
    T = len(curves)
    if T == 0 or max_steps <= 0:
        return []
    ks = np.array([c.k for c in curves], np.int64)
    off = np.zeros(T + 1, np.int64)
    off[1:] = np.cumsum(ks + 1)
    R = np.concatenate([np.asarray(c.R, np.float64) for c in curves])
    U = np.concatenate([np.asarray(c.U, np.float64) for c in curves])
    P = np.concatenate([np.asarray(c.P, np.float64) for c in curves])
    req = np.concatenate([c.req for c in curves] + [np.zeros(1)])
    tab = np.array([[c.R_tot, c.tail_req1, c.P_tot, c.k, c.L, c.B, float(c.pooled), c.eb, c.rb,
                     c.table.num_rows] for c in curves], np.float64)
    step = np.maximum(1, ks // blocks)
    out = np.zeros((max_steps, 3), np.int64)
    n = greedy_moves(R, U, P, req, off, tab, step, float(pm.G), float(pm.M), pm.ib, pm.bi, pm.be,
                     pm.s0_i, pm.s0_e, pm.s1_e, _HOT_P, max_steps, out)
    return [tuple(r) for r in out[:n].tolist()]


def _threshold_states(curves: list[_Curve], levels: int) -> list[list[tuple[int, int]]]:
    """Tier sizes cut at shared marginal values: a row is a global replica when its expected
    requests per GPU per iteration per stored byte (``req * D*e / row_bytes``) reach ``th0``, a node
    replica when they reach ``th1 <= th0``; all pairs over ``levels`` geometric thresholds between
    the hottest and coldest summarized rows, plus "none". Independent of the memory budget."""
    score = [c.req * (c.eb / c.rb) for c in curves]
    nonempty = [s for s in score if s.size]
    if not nonempty or levels <= 0:
        return []
    hi = max(float(s[0]) for s in nonempty)
    lo = max(min(float(s[-1]) for s in nonempty), hi * 1e-9)
    if not hi > 0:
        return []
    ths = [math.inf] + list(np.geomspace(hi, lo, levels))
    counts = [[int(np.searchsorted(-s, -th, side="right")) for s in score] for th in ths]
    out = []
    for i0 in range(len(ths)):
        for i1 in range(i0, len(ths)):
            st = [(a, b - a) for a, b in zip(counts[i0], counts[i1])]
            if any(b for b in counts[i1]):
                out.append(st)
    return out


def _node_local(p: np.ndarray, M: int) -> np.ndarray:
    """Spread node replicas over the M local GPUs by load: hottest first onto the least loaded."""
    if p.size == 0:
        return np.zeros(0, np.int32)
    if p.size <= 4 * M:
        load = np.zeros(M)
        out = np.empty(p.size, np.int32)
        for i in range(p.size):       # p is sorted decreasing: longest-processing-time greedy
            m = int(np.argmin(load))
            out[i] = m
            load[m] += p[i]
        return out
    # many rows: serpentine order is within one row's load of LPT and vectorized
    i = np.arange(p.size)
    r, c = i // M, i % M
    return np.where(r % 2 == 0, c, M - 1 - c).astype(np.int32)


def _build_plan(curves: list[_Curve], state: Sequence[tuple[int, int]], topo: Topology,
                cfg: PlannerConfig, model: CostModel, *, place: bool = True,
                cold_cache: dict | None = None, weights: np.ndarray | None = None,
                table_cache: dict | None = None) -> Plan:
    """The plan for per-table tier sizes ``state``; ``place`` also places the hottest cold rows by
    load (skipped while comparing candidates, done for the chosen one); ``weights``: the cold
    ranges' row share per GPU (default equal). ``table_cache`` reuses the TablePlan of a table
    whose tiers, placement and layout are unchanged since an earlier call (thousands of tables:
    most candidates differ in a part of them only)."""
    G, M = topo.num_gpus, topo.gpus_per_node
    gpus = np.arange(G)
    w = np.ones(G) if weights is None else weights
    cold_cache = {} if cold_cache is None else cold_cache
    tps = []
    empty_i64, empty_i32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
    wkey = w.tobytes()  # once: G floats, hashed per table otherwise
    for i, (c, (k0, k1)) in enumerate(zip(curves, state)):
        if table_cache is not None:
            tkey = (i, k0, k1, place, wkey)
            hit = table_cache.get(tkey)
            if hit is not None:
                tps.append(hit)
                continue
        t = c.table
        ck = (t.num_rows, wkey)
        cold = cold_cache.get(ck)
        if cold is None:
            cold = cold_cache[ck] = ColdSharding.ranges(gpus, t.num_rows, w)
        g_ids = np.sort(c.ids[:k0])
        n_ids = c.ids[k0:k0 + k1]
        n_loc = _node_local(c.p[k0:k0 + k1], M)
        on = np.argsort(n_ids)
        placed, placed_gpus = empty_i64, empty_i32
        if place and cfg.max_placed > 0:
            # place individually the rows hot enough to unbalance a GPU: above 1/16 of the mean load
            rest = c.p[k0 + k1:k0 + k1 + cfg.max_placed]
            cold_mass = max(0.0, c.P_tot - c.P[k0 + k1])
            n_hot = int(np.count_nonzero(rest >= cold_mass / G / 16)) if cold_mass > 0 else 0
            if n_hot:
                ids = c.ids[k0 + k1:k0 + k1 + n_hot]
                gp = _place_by_load(ids, rest[:n_hot], c, cold, w, topo)
                op = np.argsort(ids)
                placed, placed_gpus = ids[op], gp[op]
        tp = TablePlan(t, cold, global_ids=g_ids, node_ids=n_ids[on], node_local=n_loc[on],
                       placed_ids=placed, placed_gpus=placed_gpus)
        if table_cache is not None:
            table_cache[tkey] = tp
        tps.append(tp)
    return Plan("flexshard", topo, tps)


def _place_by_load(ids: np.ndarray, p: np.ndarray, c: _Curve, cold: ColdSharding, w: np.ndarray,
                   topo: Topology) -> np.ndarray:
    """Hottest cold rows onto the GPU with the least (load / bandwidth), starting from the loads the
    weighted ranges give the rest of the cold rows."""
    G = topo.num_gpus
    share = np.diff(cold.bounds).astype(np.float64)
    share = share / share.sum() if share.sum() else share
    rest = max(0.0, c.P_tot - float(p.sum()))
    load = np.zeros(G)
    np.add.at(load, cold.gpus, share * rest)
    return place_by_load(np.ascontiguousarray(p, np.float64), load,
                         np.ascontiguousarray(1.0 / w, np.float64))


def plan_flexshard(tables: Sequence[EmbeddingTable], topo: Topology,
                   summaries: Mapping[str, FrequencySummary], batch_size: int,
                   memory: MemoryPolicy | None = None, model: CostModel | None = None, *,
                   mean_lengths: Mapping[str, float] | None = None,
                   config: PlannerConfig | None = None) -> PlanResult:
    """Plan FlexShard tiers for ``tables`` on ``topo`` from per-table frequency summaries.

    Parameters
    ----------
    tables : the embedding tables
    topo : the cluster
    summaries : {table name or feature: FrequencySummary}
    batch_size : samples per GPU per iteration (B)
    memory : per-GPU budget (default: no more peak memory than row-wise on the same workload)
    model : the cost model options (de-duplication on by default)
    mean_lengths : IDs per sample per table (default: from the summaries)

    Raises ConfigError for an impossible budget (below what the tables need at all) or missing
    statistics; nothing is half-built.
    """
    memory = memory or MemoryPolicy()
    model = model or CostModel()
    cfg = config or PlannerConfig()
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0 samples per GPU, got {batch_size}")
    sums = summaries_by_table(tables, summaries)
    ml = {t.name: float((mean_lengths or {}).get(t.name, sums[t.name].mean_length) or 1.0)
          for t in tables}
    baseline = build_baseline(memory.baseline if memory.bytes_per_gpu is None else "rw",
                              tables, topo)
    base_cost = evaluate_analytic(baseline, sums, batch_size, model, mean_lengths=ml,
                                  want_matrices=False)
    budget = (memory.bytes_per_gpu if memory.bytes_per_gpu is not None
              else base_cost.peak_memory_bytes * memory.factor)
    rw = baseline if baseline.strategy == "rw" else build_baseline("rw", tables, topo)
    rw_cost = base_cost if rw is baseline else evaluate_analytic(rw, sums, batch_size, model,
                                                                 mean_lengths=ml,
                                                                 want_matrices=False)

    def fit(plan: Plan, cost: Cost) -> tuple[Plan, Cost]:
        """With the host tier: cold rows that do not fit the HBM budget go to host memory."""
        if not memory.host_memory or cost.peak_memory_bytes <= budget * (1 + 1e-12):
            return plan, cost
        from .recshard import split_cold
        try:
            sp = split_cold(plan, sums, batch_size, budget, model, mean_lengths=ml, cost=cost)
        except ConfigError:
            return plan, cost          # even replicas + buffers exceed the budget: infeasible
        return sp, evaluate_analytic(sp, sums, batch_size, model, mean_lengths=ml,
                                     want_matrices=False)

    rw_plain = rw
    rw, rw_cost = fit(rw, rw_cost)
    curves = [_Curve(t, sums[t.name], topo, batch_size, model, ml[t.name]) for t in tables]
    pm = _Model(topo, model)
    # fewer, larger blocks when there are many tables (planning time stays ~linear in tables)
    blocks = int(min(cfg.blocks, max(8, 4096 // max(1, len(curves)))))
    steps = sum(2 * blocks + 2 * max(1, c.k).bit_length() + 2 for c in curves)
    moves = _moves(curves, pm, blocks, steps)
    n = len(moves)
    # candidate prefixes, a fixed grid along the move sequence (independent of the budget):
    # geometric near the start (tight budgets fit only the first few moves), linear over the rest.
    # Many tables on many GPUs: each exact pricing builds and prices a whole fresh plan (~0.2 s at
    # 1,000 tables x 4,096 GPUs), and the first moves change nothing there (another table's hot row
    # still sets the busiest GPU), so five prefixes from n/64 on.
    big = len(curves) > cfg.variant_tables and len(curves) * topo.num_gpus > (1 << 20)
    if big:
        grid = sorted({int(round(n * f)) for f in (1 / 64, 0.25, 0.5, 0.75, 1.0)} - {0})
    else:
        half = max(2, cfg.prefix_candidates // 2)
        grid = sorted({0, n} | {int(round(x)) for x in np.geomspace(1, max(n, 1), half)}
                      | {int(round(n * f)) for f in np.linspace(0, 1, half)})
    grid = [g for g in grid if 0 <= g <= n]
    states = [(0, 0)] * len(curves)
    applied = 0
    cache: dict = {}
    ones = np.ones(topo.num_gpus).tobytes()
    for tp in rw_plain.tables.values():   # row-wise's equal ranges are the planner's equal ranges
        if tp.cold.kind == "range" and tp.cold.weights.tobytes() == ones:
            cache[(tp.table.num_rows, ones)] = tp.cold
    tcache: dict = {}
    best = (rw_cost.iteration_time_s, rw, rw_cost, 0, None, None) \
        if rw_cost.peak_memory_bytes <= budget * (1 + 1e-12) else None
    evaluated: dict[tuple, tuple] = {}
    # cold layouts tried: equal ranges, and on heterogeneous networks ranges weighted by each GPU's
    # inter-node bandwidth (slow GPUs serve less but then request more over their slow links:
    # which wins depends on the workload, so both are candidates)
    layouts = [None]
    if cfg.bandwidth_aware and topo.nodes > 1 and np.ptp(topo.inter_bw) > 0:
        layouts.append(np.asarray(topo.inter_bw, dtype=np.float64))

    def consider(st: list[tuple[int, int]], g: int, place: bool = False) -> Cost:
        """Price tier sizes ``st`` under every cold layout; returns the fastest cost."""
        out = None
        for li, w in enumerate(layouts):
            key = (tuple(st), li, place)
            if key not in evaluated:
                cand = _build_plan(curves, st, topo, cfg, model, place=place, cold_cache=cache,
                                   weights=w, table_cache=tcache if big else None)
                cost = evaluate_analytic(cand, sums, batch_size, model, mean_lengths=ml,
                                         want_matrices=False)
                cand, cost = fit(cand, cost)
                evaluated[key] = (cand, cost, g, list(st), w)
            cost = evaluated[key][1]
            if out is None or cost.iteration_time_s < out.iteration_time_s:
                out = cost
        return out

    def variants(st, factors0, factors01):
        """Same tables, global boundary and replicated prefix scaled (prefixes of one order)."""
        out = []
        for a in factors0:
            for b in factors01:
                v = []
                for (k0, k1), c in zip(st, curves):
                    tot = min(c.k, int(round((k0 + k1) * b)))
                    n0 = min(tot, int(round(max(k0, 1) * a)) if a else 0)
                    v.append((n0, tot - n0))
                out.append(v)
        return out

    at_grid = []
    for g in grid:
        while applied < g:
            t, k0, k1 = moves[applied]
            states[t] = (k0, k1)
            applied += 1
        cost = consider(list(states), g)
        at_grid.append((cost.iteration_time_s, g, list(states)))
    if not big:
        # every table cut at the same marginal value per byte (pairs of shared thresholds): where
        # the exact per-GPU peak memory, not the proxy's balanced one, decides what fits (many
        # small tables, tight memory-neutral budgets), these fit when the move prefixes do not.
        # Fewer levels when the summaries are long (each pricing is linear in their rows).
        levels = cfg.thresholds
        rows = sum(c.k for c in curves)
        while levels > 2 and (levels + 1) * (levels + 2) // 2 * rows > (1 << 25):
            levels -= 1
        for st in _threshold_states(curves, levels):
            consider(st, -1)
    if len(curves) <= cfg.variant_tables:
        # with few tables, refine with the exact evaluator around the move sequence: the
        # load-aware proxy is flat where hot node replicas or memory decide. The candidate set
        # depends only on the inputs, never on the budget, so more memory is never worse.
        for _, g, st in at_grid:
            if g:
                for v in variants(st, (0.25, 4.0), (0.5, 2.0)):
                    consider(v, g)
        for _, g, st in sorted(at_grid)[:3]:
            for v in variants(st, (0, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 64), (0.5, 1, 2, 4)):
                consider(v, g)
    if cfg.max_placed > 0:
        # the hottest cold rows placed by load, on a budget-independent set of candidates: every
        # grid prefix when there are few tables, and the three fastest candidates overall
        unplaced = sorted((v[1].iteration_time_s, i) for i, v in enumerate(evaluated.values()))
        vals = list(evaluated.values())
        todo = [(vals[i][3], vals[i][2]) for _, i in unplaced[:1 if big else 3]]
        if len(curves) <= cfg.variant_tables:
            todo += [(st, g) for _, g, st in at_grid]
        for st, g in todo:
            if any(k0 or k1 for k0, k1 in st) or g == 0:
                consider(st, g, place=True)
    for cand, cost, g, st, w in evaluated.values():
        if cost.peak_memory_bytes <= budget * (1 + 1e-12):
            if best is None or cost.iteration_time_s < best[0] * (1 - 1e-12):
                best = (cost.iteration_time_s, cand, cost, g, st, w)
    if best is None:
        need = min(rw_cost.peak_memory_bytes, base_cost.peak_memory_bytes)
        if memory.host_memory:
            raise ConfigError(f"memory budget {budget:.4g} bytes per GPU is impossible even with "
                              "cold rows in host memory: the row-wise plan's communication "
                              "buffers and reservation alone do not fit")
        raise ConfigError(f"memory budget {budget:.4g} bytes per GPU is impossible: even the "
                          f"row-wise plan needs {need:.4g} bytes per GPU at its peak (the host "
                          "memory tier, MemoryPolicy(host_memory=True), can hold cold rows)")
    _, chosen, cost, g, _, w_best = best
    meta = {"planner": "flexshard", "batch_size": batch_size, "dedup": model.dedup,
            "budget_bytes": budget, "memory_policy": {"bytes_per_gpu": memory.bytes_per_gpu,
                                                      "baseline": memory.baseline,
                                                      "factor": memory.factor,
                                                      "host_memory": memory.host_memory},
            "moves_applied": g, "moves_generated": n,
            "cold_ranges": "bandwidth-weighted" if w_best is not None else "equal",
            "estimates": cost.to_json(), "baseline_estimates": base_cost.to_json(),
            "memory_room": _memory_room(cost, base_cost, budget)}
    chosen = Plan("flexshard" if chosen is not rw else "rw", topo, chosen.tables.values(), meta)
    return PlanResult(chosen, cost, baseline, base_cost, budget, g, n)


def _memory_room(cost: Cost, base: Cost, budget: float) -> dict[str, float]:
    """Where the room for replicas came from, at the plan's peak GPU (bytes)."""
    g = int(np.argmax(cost.peak_memory_per_gpu))
    gb = int(np.argmax(base.peak_memory_per_gpu))
    return {"baseline_peak": float(base.peak_memory_per_gpu[gb]),
            "plan_peak": float(cost.peak_memory_per_gpu[g]),
            "buffers_freed": float(base.buffer_bytes[gb] - cost.buffer_bytes[g]),
            "extra_rows": float(cost.row_bytes[g] - base.row_bytes[gb]),
            "headroom": float(budget - base.peak_memory_per_gpu[gb])}
