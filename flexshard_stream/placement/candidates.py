"""The planner's propose stage: candidate tier sizes, and plans built from them.

A candidate is one ``(k0, k1)`` pair per table: the first ``k0`` rows of the table's summary order
are global replicas, the next ``k1`` node replicas, everything else is cold (docs/PLANNER.md,
"Steps"). This module proposes candidates and builds plans from them; it never prices or chooses
(``placement.pricing`` does, with the one evaluator). Everything here depends only on the inputs,
never on the memory budget, so a larger budget can only add feasible candidates.

Stages, in the order :func:`~flexshard_stream.placement.planner.plan_flexshard` runs them:

1. :func:`benefit_curves`: per table, cumulative requests, distinct rows and probability mass over
   its summarized rows in decreasing probability (:class:`BenefitCurve`);
2. :func:`move_sequence`: the greedy promotion moves over all tables on the load-aware proxy
   (:class:`LoadAwareProxy`, one Numba call in ``kernels/greedy.py``);
3. :func:`prefix_grid` and :func:`prefix_states`: a fixed grid of prefixes of that sequence;
4. :func:`threshold_states`: every table cut at shared marginal values per byte;
5. :func:`refinement_states`: scaled variants around the prefixes (few tables only);
6. :func:`placement_states`: which candidates are also tried with their hottest cold rows placed by
   load;
7. :class:`PlanBuilder` / :func:`build_plan`: the
   :class:`~flexshard_stream.plans.plan.Plan` of a candidate: replicas, node replicas spread
   by load (:func:`node_local_gpus`), cold ranges (equal or weighted by bandwidth,
   :func:`cold_layouts`) and optionally the hottest cold rows placed by load
   (:func:`place_by_load_per_bandwidth`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np

from ..kernels.curves import segment_running_sums
from ..kernels.greedy import greedy_moves
from ..kernels.routing import place_by_load
from ..plans.plan import ColdSharding, Plan, TablePlan
from ..plans.tables import EmbeddingTable
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .workload import CostModel, Workload, workload_of

__all__ = ["BenefitCurve", "LoadAwareProxy", "PlanBuilder", "State", "benefit_curves",
           "build_plan", "coarse_search", "cold_layouts", "move_sequence", "node_local_gpus",
           "place_by_load_per_bandwidth", "placement_states", "prefix_grid", "prefix_states",
           "refinement_states", "scaled_variants", "threshold_levels", "threshold_states"]

#: Per-table tier sizes of a candidate: ``[(k0, k1), ...]`` in table order (rows).
State = Sequence[tuple[int, int]]

# p-norm over tables of the hottest-row loads: a smooth stand-in for their max (see move_sequence)
_HOT_P = 16.0


# ----------------------------------------------------------------------------- 1. benefit curves
class BenefitCurve:
    """Cumulative sums over one table's summarized rows in decreasing probability.

    The balanced-load model of the evaluator (docs/PLANNER.md, "Steps" 1-2) reads a table's tiers
    through these sums: promoting the first ``k0 + k1`` rows removes ``R[k0 + k1]`` requests from
    the cold tier, and so on. Rows are ordered by decreasing estimate, ties by ID; IDs outside the
    table are dropped.

    Attributes
    ----------
    ids : int64[k]       row IDs in promotion order
    p : float64[k]       probability of each row per ID drawn (estimate / total)
    req : float64[k]     expected requests of each row per source GPU per iteration (distinct
                         requests with de-duplication)
    R, U, P : float64[k + 1]
                         cumulative ``req``; cumulative expected distinct rows touched per
                         iteration over the cluster (the replica all-reduce); cumulative ``p``
    R_tot, P_tot : float  ``R`` and ``P`` over all rows, the uniform tail included
    tail_req1 : float    ``req`` of one tail row
    k : int              summarized rows (the longest possible tier prefix)
    L : float            IDs per sample; ``B``: samples per GPU per iteration
    pooled : bool        pooled table (its embeddings are reduced per sample)
    eb, rb : float       bytes of one embedding (``D e``) and of one stored row (``D e + s``)

    ``workload`` gives B, the table's mean length and the de-duplication; the form before the
    :class:`~flexshard_stream.placement.workload.Workload`, ``BenefitCurve(table, summary,
    topology, batch_size, model, mean_length)``, is accepted too.
    """

    def __init__(self, table: EmbeddingTable, summary: FrequencySummary, topology: Topology,
                 workload: Workload | int, model: CostModel | None = None,
                 mean_length: float | None = None):
        work = workload_of(workload, model, None if mean_length is None
                           else {table.name: mean_length}, where="BenefitCurve")
        self.__dict__.update(_curves([table], {table.name: summary}, topology, work)[0].__dict__)


def benefit_curves(tables: Sequence[EmbeddingTable], summaries: Mapping[str, FrequencySummary],
                   topology: Topology, workload: Workload | int, model: CostModel | None = None,
                   mean_lengths: Mapping[str, float] | None = None) -> list[BenefitCurve]:
    """One :class:`BenefitCurve` per table, in table order, under ``workload`` (B, mean lengths,
    de-duplication; or the loose ``batch_size``, ``model``, ``mean_lengths`` of
    :func:`~flexshard_stream.placement.workload.workload_of`).

    ``summaries`` (and mean lengths) are keyed by table name, as
    :func:`~flexshard_stream.plans.tables.summaries_by_table` resolves them.
    """
    work = workload_of(workload, model, mean_lengths, where="benefit_curves")
    return _curves(tables, summaries, topology, work)


def _curves(tables: Sequence[EmbeddingTable], summaries: Mapping[str, FrequencySummary],
            topology: Topology, work: Workload) -> list[BenefitCurve]:
    """The curves of all ``tables`` at once: their rows' values computed on the concatenated
    rows (the same operations, element by element, as one table's), the running sums in one
    Numba call (``kernels/curves.py``, sequential as ``np.cumsum``); each curve's arrays are
    views of the concatenated ones. Thousands of tables: a few array operations in all instead
    of a dozen per table."""
    G, B, dedup = topology.num_gpus, work.batch_size, work.dedup
    sums = [summaries[t.name] for t in tables]
    tops = [s.hottest_first(t.num_rows) for t, s in zip(tables, sums)]
    T = len(tables)
    off = np.zeros(T + 1, np.int64)
    np.cumsum([ids.size for ids, _ in tops], out=off[1:])
    sizes = np.diff(off)
    ids = np.concatenate([i for i, _ in tops] + [np.zeros(0, np.int64)]).astype(np.int64)
    est = np.concatenate([e for _, e in tops] + [np.zeros(0)])
    L = [work.mean_length(t.name, s) for t, s in zip(tables, sums)]
    totals = np.array([s.total for s in sums], np.float64)
    seen = totals != 0
    p = est / np.repeat(np.where(seen, totals, 1.0), sizes)
    p[np.repeat(~seen, sizes)] = 0.0
    lam = np.repeat(np.array([G * B * x for x in L], np.float64), sizes) * p
    req = -np.expm1(-lam / G) if dedup else lam / G
    run = np.empty((3, off[-1] + T))
    for row, x in enumerate((req, -np.expm1(-lam), p)):
        segment_running_sums(x, off, run[row])
    return [_curve(t, s, topology, work, L[i], (ids, p, req), run, off, i)
            for i, (t, s) in enumerate(zip(tables, sums))]


def _curve(t: EmbeddingTable, s: FrequencySummary, topology: Topology, work: Workload,
           L: float, rows: tuple, run: np.ndarray, off: np.ndarray, i: int) -> BenefitCurve:
    """Table ``i``'s :class:`BenefitCurve` from the concatenated rows ``(ids, p, req)`` and
    running sums ``run`` (R, U, P) of :func:`_curves`."""
    G, B, dedup = topology.num_gpus, work.batch_size, work.dedup
    a, b = off[i], off[i + 1]
    c = BenefitCurve.__new__(BenefitCurve)
    c.ids, c.p, c.req = (x[a:b] for x in rows)
    c.table = t
    c.R, c.U, c.P = (x[a + i:b + i + 1] for x in run)
    pt = s.tail_probability()
    lt = G * B * L * pt
    tail_req = s.tail_rows * (-math.expm1(-lt / G) if dedup else lt / G)
    c.R_tot = c.R[-1] + tail_req
    c.tail_req1 = tail_req / s.tail_rows if s.tail_rows > 0 else 0.0
    c.P_tot = c.P[-1] + (s.tail_rows * pt if s.total else 0.0)
    c.k = c.ids.size
    c.L = L
    c.B = B
    c.pooled = t.kind == "pooled"
    c.eb = float(t.embedding_bytes)
    c.rb = float(t.row_bytes)
    return c


# ----------------------------------------------------------------------------- 2. move sequence
class LoadAwareProxy:
    """Constants of the load-aware approximation of the evaluator (the planner's proxy, computed in
    ``kernels/greedy.py``).

    Per GPU and phase, the bytes sent are the balanced average; the bytes received at the busiest
    GPU are the larger of the average and the load of the single hottest row it must serve (rows
    are indivisible: a hot cold row's owner, or a hot node replica's local GPU, takes all requests
    for it). Time of a phase: ``max(intra / min intra_bw, inter / min inter_bw)`` over sends and
    receives (bytes over bytes per second); the replica all-reduce as in the evaluator, its bytes per
    replicated byte ``s0_i``, ``s0_e`` (global replicas, intra / inter-node) and ``s1_e`` (node
    replicas, inter-node).
    """

    def __init__(self, topology: Topology, model: CostModel):
        topo = topology
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


def move_sequence(curves: list[BenefitCurve], topology: Topology, model: CostModel,
                  blocks: int) -> list[tuple[int, int, int]]:
    """The greedy promotion moves over all tables: ``(table index, k0, k1)`` after each move.

    Independent of the memory budget; one Numba call (``kernels/greedy.py``). Moves are scored on
    :class:`LoadAwareProxy` and taken lazily best-first while they lower its time: first those that
    save time and memory, then by time saved per byte of memory. The busiest GPU's load depends on
    the hottest single row of *any* table; with a plain max, promoting one table's hottest row gains
    nothing while another table's is as hot, and the greedy stalls on that plateau. The proxy
    therefore aggregates the hottest-row loads with a p-norm (p = 16), which every table's promotion
    lowers. Blocks grow geometrically from one row (the hottest rows matter most) up to ``k /
    blocks`` rows, with fewer, larger blocks when there are many tables (``4096 / tables``, at least
    8: planning time stays about linear in tables). When no move is left in the heap, every table is
    scored again: a table whose moves did not pay earlier may pay now.

    Parameters
    ----------
    curves : the tables' :class:`BenefitCurve`
    topology, model : the cluster and the cost model options
    blocks : at most this many blocks per table (``PlannerConfig.blocks``)
    """
    T = len(curves)
    blocks = int(min(blocks, max(8, 4096 // max(1, T))))
    max_steps = sum(2 * blocks + 2 * max(1, c.k).bit_length() + 2 for c in curves)
    if T == 0 or max_steps <= 0:
        return []
    pm = LoadAwareProxy(topology, model)
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


# ----------------------------------------------------------------------------- 3. prefixes
#: Above this many tables x GPUs (and more than ``variant_tables`` tables) the search is coarse.
COARSE_TABLE_GPUS = 1 << 14


def coarse_search(num_tables: int, num_gpus: int, variant_tables: int) -> bool:
    """Whether the planner searches coarsely: more than ``variant_tables`` tables and more than
    :data:`COARSE_TABLE_GPUS` (2^14) tables x GPUs. There each exact pricing builds and prices a
    whole fresh plan (~0.1 s at 1,000 tables x 32 GPUs, ~0.2 s at 1,000 x 4,096): five prefixes
    only, no threshold candidates, no tiers on other sharding kinds, placement tried on the fastest
    candidate only, and unchanged TablePlans reused between candidates."""
    return num_tables > variant_tables and num_tables * num_gpus > COARSE_TABLE_GPUS


def prefix_grid(num_moves: int, prefix_candidates: int, coarse: bool) -> list[int]:
    """Prefix lengths (moves applied) of the move sequence to price, sorted, in ``[0, num_moves]``.

    Geometric near the start (tight budgets fit only the first few moves), linear over the rest,
    about ``prefix_candidates`` in all, 0 (all cold) and ``num_moves`` included. Coarse
    (:func:`coarse_search`): the first moves change nothing there (another table's hot row still
    sets the busiest GPU), so five prefixes from ``num_moves / 64`` on.
    """
    n = num_moves
    if coarse:
        grid = sorted({int(round(n * f)) for f in (1 / 64, 0.25, 0.5, 0.75, 1.0)} - {0})
    else:
        half = max(2, prefix_candidates // 2)
        grid = sorted({0, n} | {int(round(x)) for x in np.geomspace(1, max(n, 1), half)}
                      | {int(round(n * f)) for f in np.linspace(0, 1, half)})
    return [g for g in grid if 0 <= g <= n]


def prefix_states(moves: Sequence[tuple[int, int, int]], grid: Sequence[int],
                  num_tables: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """``(g, state)`` for each prefix length ``g`` of ``grid`` (increasing): the tier sizes after
    the first ``g`` moves (a fresh list each)."""
    states = [(0, 0)] * num_tables
    applied = 0
    out = []
    for g in grid:
        while applied < g:
            t, k0, k1 = moves[applied]
            states[t] = (k0, k1)
            applied += 1
        out.append((g, list(states)))
    return out


# ----------------------------------------------------------------------------- 4. thresholds
def threshold_levels(curves: list[BenefitCurve], levels: int) -> int:
    """``levels`` (``PlannerConfig.thresholds``), fewer while the pairs of levels times the
    summarized rows exceed 2^25 (each pricing is linear in the summaries' rows), at least 2."""
    rows = sum(c.k for c in curves)
    while levels > 2 and (levels + 1) * (levels + 2) // 2 * rows > (1 << 25):
        levels -= 1
    return levels


def threshold_states(curves: list[BenefitCurve], levels: int) -> list[list[tuple[int, int]]]:
    """Tier sizes cut at shared marginal values.

    A row is a global replica when its expected requests per GPU per iteration per stored byte
    (``req * D*e / row_bytes``) reach ``th0``, a node replica when they reach ``th1 <= th0``; all
    pairs over ``levels`` geometric thresholds between the hottest and coldest summarized rows,
    plus "none" (infinity), except the all-cold state. Where the exact per-GPU peak memory, not
    the proxy's balanced one, decides what fits (many small tables, tight memory-neutral budgets),
    these fit when the move prefixes do not. Independent of the memory budget.
    """
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


# ----------------------------------------------------------------------------- 5. refinement
def scaled_variants(state: State, curves: list[BenefitCurve], global_factors: Sequence[float],
                    prefix_factors: Sequence[float]) -> list[list[tuple[int, int]]]:
    """Variants of ``state``: every table's replicated prefix ``k0 + k1`` scaled by each of
    ``prefix_factors`` and its global boundary ``k0`` (at least 1) by each of ``global_factors``
    (0: no global replicas), capped at the summarized rows; one variant per pair of factors."""
    out = []
    for a in global_factors:
        for b in prefix_factors:
            v = []
            for (k0, k1), c in zip(state, curves):
                tot = min(c.k, int(round((k0 + k1) * b)))
                n0 = min(tot, int(round(max(k0, 1) * a)) if a else 0)
                v.append((n0, tot - n0))
            out.append(v)
    return out


def refinement_states(priced_prefixes: Sequence[tuple[float, int, list[tuple[int, int]]]],
                      curves: list[BenefitCurve]) -> list[tuple[list[tuple[int, int]], int]]:
    """Candidates around the priced prefixes, for few tables (``PlannerConfig.variant_tables``):
    the load-aware proxy is flat where hot node replicas or memory decide, the exact evaluator is
    not.

    ``priced_prefixes`` holds ``(iteration_time_s, g, state)`` per prefix. Returns ``(state, g)``:
    coarse variants (global x 1/4, 4; prefix x 1/2, 2) of every non-empty prefix, then a finer set
    (global x 0 .. 64, prefix x 1/2 .. 4) around the three fastest prefixes.
    """
    out = []
    for _, g, st in priced_prefixes:
        if g:
            out += [(v, g) for v in scaled_variants(st, curves, (0.25, 4.0), (0.5, 2.0))]
    for _, g, st in sorted(priced_prefixes)[:3]:
        out += [(v, g) for v in scaled_variants(st, curves, (0, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16,
                                                             64), (0.5, 1, 2, 4))]
    return out


def placement_states(fastest: Sequence[tuple[list[tuple[int, int]], int]],
                     prefixes: Sequence[tuple[int, list[tuple[int, int]]]] = ()
                     ) -> list[tuple[list[tuple[int, int]], int]]:
    """Candidates also tried with their hottest cold rows placed by load: ``fastest`` (the
    fastest candidates priced so far, ``(state, g)``), then ``prefixes`` (``(g, state)``, the grid
    prefixes when there are few tables); a budget-independent set. A state without replicas is
    kept only as the all-cold prefix (``g == 0``)."""
    todo = list(fastest) + [(st, g) for g, st in prefixes]
    return [(st, g) for st, g in todo if any(k0 or k1 for k0, k1 in st) or g == 0]


# ----------------------------------------------------------------------------- 6. plans
def cold_layouts(topology: Topology, bandwidth_aware: bool) -> list[np.ndarray | None]:
    """The cold range layouts every candidate is priced with: equal ranges (``None``), and on
    heterogeneous networks (``bandwidth_aware``, several nodes, unequal inter-node bandwidth) ranges
    weighted by each GPU's inter-node bandwidth (bytes per second). Slow GPUs then serve less but
    request more over their slow links: which wins depends on the workload, so both are priced."""
    layouts: list[np.ndarray | None] = [None]
    if bandwidth_aware and topology.nodes > 1 and np.ptp(topology.inter_bw) > 0:
        layouts.append(np.asarray(topology.inter_bw, dtype=np.float64))
    return layouts


def node_local_gpus(p: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """The local GPU (0 .. M-1) of each node replica, by load: rows of probability ``p`` (sorted
    decreasing), hottest first onto the least loaded GPU (int32, one per row)."""
    M = gpus_per_node
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


def place_by_load_per_bandwidth(p: np.ndarray, curve: BenefitCurve, cold: ColdSharding,
                                weights: np.ndarray) -> np.ndarray:
    """The GPU (int32) of each of the hottest cold rows, probabilities ``p`` (sorted decreasing):
    each onto the GPU with the least load / ``weights`` (probability mass per unit of relative
    bandwidth), starting from the loads the (weighted) ranges of ``cold`` give the rest of the
    table's cold mass."""
    share = np.diff(cold.bounds).astype(np.float64)
    share = share / share.sum() if share.sum() else share
    rest = max(0.0, curve.P_tot - float(p.sum()))
    load = np.zeros(weights.size)
    if cold.distinct_gpus == cold.gpus.size:   # each GPU once (the usual ranges): one add each
        load[cold.gpus] += share * rest
    else:
        np.add.at(load, cold.gpus, share * rest)
    return place_by_load(np.ascontiguousarray(p, np.float64), load,
                         np.ascontiguousarray(1.0 / weights, np.float64))


class PlanBuilder:
    """Builds the :class:`~flexshard_stream.plans.plan.Plan` of a candidate's tier sizes.

    Owns two caches: the cold range sharding per (rows, layout) (shared by every table of that
    size), and, with ``reuse_tables``, the TablePlan per (table, tiers, placement, layout), reused
    when a later candidate leaves that table unchanged (thousands of tables: most candidates
    differ in a part of them only).

    Parameters
    ----------
    curves : the tables' :class:`BenefitCurve`, in plan order
    topology : the cluster
    max_placed : at most this many of a table's hottest cold rows are placed by load (0: none)
    reuse_tables : keep and reuse TablePlans between builds
    base : tiers on top of this plan's sharding kinds (None: row-wise ranges). Each table keeps
        its base cold function and kind; global replicas go on top of any kind but data-parallel
        (already everywhere); node replicas only on row-wise tables; no rows placed by load.
    """

    def __init__(self, curves: list[BenefitCurve], topology: Topology, max_placed: int, *,
                 reuse_tables: bool = False, base: Plan | None = None):
        self.curves = curves
        self.topology = topology
        self.max_placed = max_placed if base is None else 0
        self.base = base
        self._cold: dict[tuple[int, bytes], ColdSharding] = {}
        self._tables: dict[tuple, TablePlan] | None = {} if reuse_tables else None
        self._bare: dict[str, TablePlan] = {}

    def runnable_state(self, state: State) -> list[tuple[int, int]]:
        """``state`` as this builder can build it: on a base plan, no tiers on data-parallel
        tables and node replicas made global on tables other than row-wise."""
        if self.base is None:
            return list(state)
        return [(0, 0) if kind == "replicated" else (k0 + k1, 0) if kind != "row_wise"
                else (k0, k1) for kind, (k0, k1) in zip(self._base_kinds, state)]

    @cached_property
    def _base_kinds(self) -> list[str]:
        """Per curve, ``"replicated"`` or the base plan's sharding kind of its table (once: every
        state priced on the base asks)."""
        out = []
        for c in self.curves:
            tp = self.base[c.table.name]
            out.append("replicated" if tp.replicated else tp.sharding_kind(self.topology))
        return out

    def share_cold_ranges(self, plan: Plan) -> None:
        """Reuse ``plan``'s equal cold ranges (row-wise's equal ranges are the planner's), and
        its table plans without tiers for the tables a candidate leaves without any (one object:
        its checks and flattening are done once)."""
        ones = np.ones(self.topology.num_gpus).tobytes()
        for tp in plan.tables.values():
            if tp.cold.kind == "range" and tp.cold.weights.tobytes() == ones:
                self._cold[(tp.table.num_rows, ones)] = tp.cold
                if not (tp.sharding or tp.has_host_tier or tp.global_ids.size
                        or tp.node_ids.size or tp.placed_ids.size):
                    self._bare[tp.table.name] = tp

    def build(self, state: State, *, place: bool = True,
              weights: np.ndarray | None = None) -> Plan:
        """The "flexshard" plan for per-table tier sizes ``state``.

        ``place`` also places the hottest cold rows by load (those above 1/16 of a GPU's mean cold
        load, at most ``max_placed`` per table); ``weights`` is each GPU's share of the cold ranges'
        rows (float64[G], default equal).
        """
        G = self.topology.num_gpus
        w = np.ones(G) if weights is None else weights
        wkey = w.tobytes()  # once: G floats, hashed per table otherwise
        tps = []
        for i, (c, (k0, k1)) in enumerate(zip(self.curves, state)):
            tkey = (i, k0, k1, place, wkey)
            tp = self._tables.get(tkey) if self._tables is not None else None
            if tp is None:
                tp = self._table_plan(c, k0, k1, place, w, wkey)
                if self._tables is not None:
                    self._tables[tkey] = tp
            tps.append(tp)
        return Plan("flexshard", self.topology, tps)

    def _table_plan(self, c: BenefitCurve, k0: int, k1: int, place: bool, w: np.ndarray,
                    wkey: bytes) -> TablePlan:
        t = c.table
        if self.base is not None:
            return self._on_base(c, k0, k1)
        ck = (t.num_rows, wkey)
        cold = self._cold.get(ck)
        if cold is None:
            cold = self._cold[ck] = ColdSharding.ranges(np.arange(self.topology.num_gpus),
                                                        t.num_rows, w)
        g_ids = np.sort(c.ids[:k0])
        n_ids = c.ids[k0:k0 + k1]
        n_loc = node_local_gpus(c.p[k0:k0 + k1], self.topology.gpus_per_node)
        on = np.argsort(n_ids)
        placed, placed_gpus = np.zeros(0, np.int64), np.zeros(0, np.int32)
        if place and self.max_placed > 0:
            placed, placed_gpus = self._placed_rows(c, k0 + k1, cold, w)
        bare = self._bare.get(t.name)
        if not (k0 or k1 or placed.size) and bare is not None and bare.cold is cold \
                and bare.table == t:
            return bare
        return TablePlan(t, cold, global_ids=g_ids, node_ids=n_ids[on], node_local=n_loc[on],
                         placed_ids=placed, placed_gpus=placed_gpus)

    def _on_base(self, c: BenefitCurve, k0: int, k1: int) -> TablePlan:
        """Tiers ``(k0, k1)`` (:meth:`runnable_state`) on the base plan's table."""
        bt = self.base[c.table.name]
        if bt.replicated or not (k0 or k1):
            return bt
        n_ids = c.ids[k0:k0 + k1]
        n_loc = node_local_gpus(c.p[k0:k0 + k1], self.topology.gpus_per_node)
        on = np.argsort(n_ids)
        return TablePlan(c.table, bt.cold, global_ids=np.sort(c.ids[:k0]), node_ids=n_ids[on],
                         node_local=n_loc[on], sharding=bt.sharding)

    def _placed_rows(self, c: BenefitCurve, k: int, cold: ColdSharding,
                     w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted IDs and GPUs of the cold rows after the first ``k`` hot enough to unbalance a
        GPU: above 1/16 of the mean cold load per GPU."""
        G = self.topology.num_gpus
        rest = c.p[k:k + self.max_placed]
        cold_mass = max(0.0, c.P_tot - c.P[k])
        n_hot = int(np.count_nonzero(rest >= cold_mass / G / 16)) if cold_mass > 0 else 0
        if not n_hot:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        ids = c.ids[k:k + n_hot]
        gp = place_by_load_per_bandwidth(rest[:n_hot], c, cold, w)
        op = np.argsort(ids)
        return ids[op], gp[op]


def build_plan(curves: list[BenefitCurve], state: State, topology: Topology, *,
               max_placed: int, place: bool = True, weights: np.ndarray | None = None) -> Plan:
    """The plan of one candidate, without caches: ``PlanBuilder(curves, topology,
    max_placed).build(state, place=place, weights=weights)`` (see :class:`PlanBuilder`)."""
    return PlanBuilder(curves, topology, max_placed).build(state, place=place, weights=weights)
