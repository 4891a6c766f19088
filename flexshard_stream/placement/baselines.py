"""Baseline sharding strategies, each producing the one :class:`Plan` type.

- ``row_wise``: every table's rows over all G GPUs, contiguous equal ranges (TorchRec RW) or hashed;
- ``table_wise``: each table whole on one GPU, greedy balance (largest first onto the least loaded);
- ``table_row_wise``: each table's rows over the M GPUs of one node, nodes balanced greedily;
- ``column_wise``: each table cut into column shards as TorchRec's planner cuts them (the smallest
  multiple of 4 dividing D that is at least 128 columns, else D: one shard), shards on distinct
  GPUs, balanced greedily (largest first onto the least loaded GPU);
- ``table_column_wise``: the same shards on the GPUs of one node, nodes balanced greedily;
- ``data_parallel``: every row of every table on every GPU;
- ``hugectr_hybrid``: HugeCTR's hybrid embedding rule: replicate every row whose profiled count
  reaches ``iterations * N * (a2a_bw / ar_bw) * efficiency * N / (N - 1)``, the number of frequent
  rows rounded up to a multiple of G; the rest row-wise. ``iterations`` is the workload's
  ``iterations_profiled`` (``placement.workload.iterations_from_samples``, the one definition).
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..plans.plan import ColdSharding, Plan, TablePlan
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .workload import Workload, iterations_from_samples, profiled_samples, workload_of

__all__ = ["row_wise", "table_wise", "table_row_wise", "column_wise", "table_column_wise",
           "column_widths", "data_parallel", "hugectr_hybrid", "hugectr_threshold",
           "build_baseline", "STRATEGIES", "MIN_COLUMN_SHARD", "BASELINES", "baseline_plans",
           "profiled_iterations", "rows_lower_bound"]

#: Narrowest column shard TorchRec 1.8's planner cuts (``planner/constants.py`` ``MIN_CW_DIM``).
MIN_COLUMN_SHARD = 128


def row_wise(tables: Sequence[EmbeddingTable], topo: Topology, *, mode: str = "range",
             seed: int = 0) -> Plan:
    """Row-wise: rows over all GPUs, ``mode`` "range" (contiguous) or "hash" (one hash function
    object shared by every table; tables of equal size share their ranges)."""
    if mode not in ("range", "hash"):
        raise ConfigError(f"row-wise mode must be 'range' or 'hash', got {mode!r}")
    colds = _equal_ranges(topo) if mode == "range" else _one_hash(topo, seed)
    return Plan("rw", topo, [TablePlan(t, colds(t.num_rows)) for t in tables], {"mode": mode})


def _equal_ranges(topo: Topology) -> Callable[[int], ColdSharding]:
    """Equal ranges over all GPUs of ``topo`` for a table of the given rows, made once per
    distinct row count (cold functions are immutable: plans share them)."""
    gpus = np.arange(topo.num_gpus, dtype=np.int32)
    made: dict[int, ColdSharding] = {}

    def ranges(num_rows: int) -> ColdSharding:
        cold = made.get(num_rows)
        if cold is None:
            cold = made[num_rows] = ColdSharding.ranges(gpus, num_rows)
        return cold
    return ranges


def _one_hash(topo: Topology, seed: int) -> Callable[[int], ColdSharding]:
    """The one hash function over all GPUs of ``topo``, whatever the rows."""
    cold = ColdSharding.hashed(np.arange(topo.num_gpus, dtype=np.int32), seed)
    return lambda num_rows: cold


def _greedy(weights: np.ndarray, bins: int) -> np.ndarray:
    """Largest weight first onto the least loaded bin; ties broken by the lowest index."""
    load = np.zeros(bins)
    out = np.zeros(weights.size, dtype=np.int64)
    for i in np.argsort(-weights, kind="stable"):
        b = int(np.argmin(load))
        out[i] = b
        load[b] += weights[i]
    return out


def _load_weights(tables: Sequence[EmbeddingTable],
                  lookups: Mapping[str, float] | None) -> np.ndarray:
    """Balance by expected embedding bytes moved per iteration when lookups are known, else by
    table bytes."""
    if lookups:
        return np.array([float(lookups.get(t.name, 0.0)) * t.embedding_bytes + 1e-9 * t.table_bytes
                         for t in tables])
    return np.array([float(t.table_bytes) for t in tables])


def table_wise(tables: Sequence[EmbeddingTable], topo: Topology, *,
               lookups: Mapping[str, float] | None = None) -> Plan:
    """Table-wise: each table whole on one GPU, balanced greedily (by traffic if ``lookups`` per
    iteration per table are given, else by bytes)."""
    where = _greedy(_load_weights(tables, lookups), topo.num_gpus)
    tps = [TablePlan(t, ColdSharding.ranges([int(g)], t.num_rows)) for t, g in zip(tables, where)]
    return Plan("tw", topo, tps, {"gpu_of_table": {t.name: int(g) for t, g in zip(tables, where)}})


def table_row_wise(tables: Sequence[EmbeddingTable], topo: Topology, *,
                   lookups: Mapping[str, float] | None = None) -> Plan:
    """Table-row-wise: each table's rows in equal ranges over the GPUs of one node."""
    where = _greedy(_load_weights(tables, lookups), topo.nodes)
    tps = [TablePlan(t, ColdSharding.ranges(topo.gpus_of_node(int(n)), t.num_rows),
                     sharding="table_row_wise")
           for t, n in zip(tables, where)]
    return Plan("twrw", topo, tps, {"node_of_table": {t.name: int(n) for t, n in zip(tables, where)}})


def column_widths(dim: int, min_width: int = MIN_COLUMN_SHARD, max_shards: int | None = None
                  ) -> np.ndarray:
    """Widths (int64) of the column shards TorchRec's planner cuts a ``dim``-column table into:
    shards of the smallest ``w >= min_width`` that is a multiple of 4 and divides ``dim`` (``dim``
    itself when none does: one shard), ``sharding_plan.py`` ``_find_base_dim``; with
    ``max_shards`` (GPUs available) the width grows to the next such divisor until the shards
    fit."""
    if min_width < 1:
        raise ConfigError(f"min_width must be >= 1 column, got {min_width}")
    w = next((c for c in range(min_width, dim) if dim % c == 0 and c % 4 == 0), dim)
    while max_shards is not None and dim // w > max_shards:
        w = next((c for c in range(w + 1, dim) if dim % c == 0 and c % 4 == 0), dim)
    return np.full(dim // w, w, dtype=np.int64)


class _LeastLoaded:
    """Column shards onto GPUs, each table's shards in turn onto the least loaded GPUs of its
    group not yet picked for it (ties: the lowest GPU), the shards' loads added: one heap of
    ``(load, GPU)`` per group (shares are never negative, so a load only grows), O(log G) per
    shard (a scan of the group's loads per shard before; the same picks)."""

    def __init__(self, groups: list[np.ndarray]):
        self.heaps = [[(0.0, int(g)) for g in sorted(grp.tolist())] for grp in groups]

    def pick(self, group: int, shares: np.ndarray) -> list[int]:
        heap = self.heaps[group]
        taken = [heapq.heappop(heap) for _ in range(len(shares))]
        for (load, g), share in zip(taken, shares):
            heapq.heappush(heap, (load + float(share), g))
        return [g for _, g in taken]


#: The last placements of column shards: ``(key, tables, placement)``, the tables kept so that
#: their ids in the key are not reused (a planner bounds a column baseline's rows, then builds it).
_SHARDS: list = []
_SHARDS_KEEP = 2


def _column_shards(tables: Sequence[EmbeddingTable], topo: Topology, groups: list[np.ndarray],
                   lookups: Mapping[str, float] | None, min_width: int
                   ) -> list[tuple[int, list[int], np.ndarray]]:
    """Where :func:`_column_plan` puts each table's column shards: ``(table index, GPUs,
    widths)`` in the order placed (heaviest first), groups then GPUs balanced greedily by the
    shards' share of the table's load. The last two placements are kept (``rows_lower_bound``
    and the build ask for the same one; the widths read-only)."""
    weights = _load_weights(tables, lookups)
    key = (tuple(id(t) for t in tables), tuple(g.tobytes() for g in groups), weights.tobytes(),
           min_width)
    for k, _, placed in list(_SHARDS):
        if k == key:
            return placed
    size = min(g.size for g in groups)
    widths = [column_widths(t.dim, min_width, size) for t in tables]
    group_of = _greedy(weights, len(groups))
    least = _LeastLoaded(groups)
    out = []
    for i in np.argsort(-weights, kind="stable"):
        t, w = tables[i], widths[i]
        w.flags.writeable = False
        out.append((int(i), least.pick(int(group_of[i]), w / t.dim * weights[i]), w))
    _SHARDS[:] = [*_SHARDS[-(_SHARDS_KEEP - 1):], (key, list(tables), out)]
    return out


def _column_groups(kind: str, topo: Topology) -> list[np.ndarray]:
    """The GPU groups a column-sharded kind spreads each table's shards within: every GPU
    (``column_wise``) or the GPUs of each node (``table_column_wise``)."""
    if kind == "column_wise":
        return [np.arange(topo.num_gpus)]
    return [topo.gpus_of_node(n).astype(np.int64) for n in range(topo.nodes)]


def _column_plan(strategy: str, kind: str, tables: Sequence[EmbeddingTable], topo: Topology,
                 groups: list[np.ndarray], lookups: Mapping[str, float] | None,
                 min_width: int) -> Plan:
    """Column shards of every table over the GPUs of one group each (``groups``: every GPU, or
    the GPUs of each node), placed by :func:`_column_shards`."""
    tps, where = [], {}
    for i, picked, w in _column_shards(tables, topo, groups, lookups, min_width):
        t = tables[i]
        where[t.name] = list(picked)
        tps.append((i, TablePlan(t, ColdSharding.columns(picked, w), sharding=kind)))
    tps = [tp for _, tp in sorted(tps, key=lambda x: x[0])]
    return Plan(strategy, topo, tps, {"gpus_of_table": where, "min_width": min_width})


def column_wise(tables: Sequence[EmbeddingTable], topo: Topology, *,
                lookups: Mapping[str, float] | None = None,
                min_width: int = MIN_COLUMN_SHARD) -> Plan:
    """Column-wise: each table in column shards of at least ``min_width`` columns
    (:func:`column_widths`) on distinct GPUs anywhere, balanced greedily (by traffic with
    ``lookups``, else by bytes). Tables narrower than twice ``min_width`` stay whole (one
    shard: the table-wise placement)."""
    return _column_plan("cw", "column_wise", tables, topo, _column_groups("column_wise", topo),
                        lookups, min_width)


def table_column_wise(tables: Sequence[EmbeddingTable], topo: Topology, *,
                      lookups: Mapping[str, float] | None = None,
                      min_width: int = MIN_COLUMN_SHARD) -> Plan:
    """Table-column-wise: as :func:`column_wise`, each table's shards on the GPUs of one node
    (nodes balanced greedily, then GPUs)."""
    return _column_plan("twcw", "table_column_wise", tables, topo,
                        _column_groups("table_column_wise", topo), lookups, min_width)


def data_parallel(tables: Sequence[EmbeddingTable], topo: Topology) -> Plan:
    """Data-parallel: every table replicated on every GPU (one cold function object for all)."""
    cold = ColdSharding.replicated()
    return Plan("dp", topo, [TablePlan(t, cold) for t in tables])


def hugectr_threshold(iterations: int, nodes: int, all_to_all_bw: float = 1.9e11,
                      all_reduce_bw: float = 1.3e11, efficiency: float = 1.0) -> float:
    """HugeCTR's frequent-category threshold (lookups over the profiled iterations).

    ``iterations * nodes * (all_to_all_bw / all_reduce_bw) * efficiency * nodes / (nodes - 1)``;
    infinite on one node (nothing is worth replicating without inter-node traffic).
    """
    if nodes <= 1:
        return math.inf
    return iterations * nodes * (all_to_all_bw / all_reduce_bw) * efficiency * nodes / (nodes - 1)


def hugectr_hybrid(tables: Sequence[EmbeddingTable], topo: Topology,
                   summaries: Mapping[str, FrequencySummary], *, iterations: int,
                   all_to_all_bw: float = 1.9e11, all_reduce_bw: float = 1.3e11,
                   efficiency: float = 1.0, row_wise_plan: Plan | None = None) -> Plan:
    """HugeCTR hybrid embedding (last in v23.12), from profiled statistics.

    ``summaries`` cover ``iterations`` profiled iterations. A row is frequent when its estimated
    count reaches :func:`hugectr_threshold`; the frequent set is then grown to a multiple of G with
    the next most frequent rows (as HugeCTR rounds up). Infrequent rows are row-wise: the equal
    ranges of ``row_wise_plan`` (a :func:`row_wise` plan of the same tables and topology, shared
    rather than rebuilt) or new ones.
    """
    if iterations <= 0:
        raise ConfigError(f"iterations must be > 0, got {iterations}")
    thr = hugectr_threshold(iterations, topo.nodes, all_to_all_bw, all_reduce_bw, efficiency)
    G = topo.num_gpus
    tps = []
    frequent = {}
    by_name = summaries_by_table(tables, summaries)
    colds = _row_wise_colds(row_wise_plan, tables, topo)
    for t in tables:
        s = by_name[t.name]
        ids, est = s.hottest_first(t.num_rows)
        k = int(np.count_nonzero(est >= thr))
        if k:
            k = min(ids.size, -(-k // G) * G)
        frequent[t.name] = k
        tps.append(TablePlan(t, colds(t), global_ids=np.sort(ids[:k])))
    return Plan("hugectr", topo, tps, {"threshold": thr, "iterations": iterations,
                                       "frequent_rows": frequent})


def _row_wise_colds(plan: Plan | None, tables: Sequence[EmbeddingTable], topo: Topology
                    ) -> Callable[[EmbeddingTable], ColdSharding]:
    """Each table's equal ranges over all GPUs: those of ``plan`` (checked to be a row-wise plan
    of ``tables`` on ``topo``) or new ones."""
    if plan is None:
        ranges = _equal_ranges(topo)
        return lambda t: ranges(t.num_rows)
    if plan.strategy != "rw" or plan.topology != topo or \
            [t.name for t in tables] != list(plan.tables) or \
            any(plan.tables[t.name].table != t for t in tables):
        raise ConfigError(f"row_wise_plan must be the row-wise plan of these tables on this "
                          f"topology; got a {plan.strategy!r} plan of {len(plan.tables)} tables")
    return lambda t: plan.tables[t.name].cold


STRATEGIES: dict[str, Callable[..., Plan]] = {
    "rw": row_wise, "tw": table_wise, "twrw": table_row_wise, "cw": column_wise,
    "twcw": table_column_wise, "dp": data_parallel, "hugectr": hugectr_hybrid}


def build_baseline(strategy: str, tables: Sequence[EmbeddingTable], topo: Topology, *,
                   summaries: Mapping[str, FrequencySummary] | None = None,
                   iterations: int | None = None, lookups: Mapping[str, float] | None = None,
                   workload: Workload | None = None, row_wise_plan: Plan | None = None) -> Plan:
    """Dispatch by name ("rw", "rw-hash", "tw", "twrw", "cw", "twcw", "dp", "hugectr").

    With ``workload`` (and ``summaries``), ``iterations`` defaults to its ``iterations_profiled``
    and ``lookups`` to its lookups per iteration per table (``total / iterations_profiled``),
    as the planner's baselines take them (:func:`baseline_plans`); a workload not yet profiled is
    bound to ``summaries`` first (``Workload.for_stats``). ``row_wise_plan``: the row-wise plan
    of these tables, returned for "rw" and its ranges shared by "hugectr" (not rebuilt).
    """
    if workload is not None and summaries is not None:
        by_name = summaries_by_table(tables, summaries)
        if workload.iterations_profiled is None:
            workload = workload.for_stats(tables, topo, by_name)
        iterations = workload.iterations_profiled if iterations is None else iterations
        lookups = workload.lookups_per_iteration(by_name) if lookups is None else lookups
    if strategy in ("rw", "rw-range"):
        if row_wise_plan is not None:
            _row_wise_colds(row_wise_plan, tables, topo)  # checked
            return row_wise_plan
        return row_wise(tables, topo)
    if strategy == "rw-hash":
        return row_wise(tables, topo, mode="hash")
    if strategy == "tw":
        return table_wise(tables, topo, lookups=lookups)
    if strategy == "twrw":
        return table_row_wise(tables, topo, lookups=lookups)
    if strategy == "cw":
        return column_wise(tables, topo, lookups=lookups)
    if strategy == "twcw":
        return table_column_wise(tables, topo, lookups=lookups)
    if strategy == "dp":
        return data_parallel(tables, topo)
    if strategy == "hugectr":
        if summaries is None or iterations is None:
            raise ConfigError("the hugectr strategy needs profiled statistics and iterations")
        return hugectr_hybrid(tables, topo, summaries, iterations=iterations,
                              row_wise_plan=row_wise_plan)
    raise ConfigError(f"unknown strategy {strategy!r}; choose one of rw, rw-hash, tw, twrw, cw, "
                      "twcw, dp, hugectr")


def rows_lower_bound(strategy: str, tables: Sequence[EmbeddingTable], topo: Topology, *,
                     lookups: Mapping[str, float] | None = None,
                     min_width: int = MIN_COLUMN_SHARD) -> float | None:
    """A lower bound on the largest bytes of rows one GPU stores (its plan's
    ``row_bytes_per_gpu``, the max over GPUs) under baseline ``strategy`` as
    :func:`build_baseline` builds it with these ``lookups``, from its layout alone, without
    building the plan (what a planner can tell before it builds and prices a baseline that
    cannot fit):

    - ``dp``: every table on every GPU (exact);
    - ``tw``: each GPU its tables whole (exact, the same greedy as :func:`table_wise`);
    - ``twrw``: the busiest node's tables over its GPUs (their mean: the most loaded GPU
      stores at least that much);
    - ``cw`` / ``twcw``: each shard its columns of every row (exact, the placement of
      :func:`column_wise` / :func:`table_column_wise`);
    - None for the others (row-wise and HugeCTR spread every table over every GPU).

    "Exact" is up to the rounding of the sums (bytes summed in another order)."""
    G = topo.num_gpus
    if strategy == "dp":
        return float(sum(float(t.table_bytes) for t in tables))
    if strategy in ("tw", "twrw"):
        bins = G if strategy == "tw" else topo.nodes
        where = _greedy(_load_weights(tables, lookups), bins)
        stored = np.bincount(where, weights=[float(t.table_bytes) for t in tables],
                             minlength=bins)
        return float(stored.max()) / (1 if strategy == "tw" else topo.gpus_per_node)
    if strategy in ("cw", "twcw"):
        kind = "column_wise" if strategy == "cw" else "table_column_wise"
        out = np.zeros(G)
        for i, picked, w in _column_shards(tables, topo, _column_groups(kind, topo), lookups,
                                           min_width):
            t = tables[i]
            out[picked] += t.num_rows * float(t.row_bytes) * (w / w.sum())
        return float(out.max())
    return None


#: The baselines a planner must never lose to, in the order they are priced (row-wise first).
BASELINES: tuple[str, ...] = ("rw", "rw-hash", "tw", "twrw", "cw", "twcw", "dp", "hugectr")


def profiled_iterations(summaries: Mapping[str, FrequencySummary], topo: Topology,
                        batch_size: int) -> int:
    """Iterations of ``batch_size`` samples per GPU on ``topo`` the summaries were counted over:
    :func:`~flexshard_stream.placement.workload.iterations_from_samples` of their samples
    (:func:`~flexshard_stream.placement.workload.profiled_samples`), the one definition that
    ``Workload.iterations_profiled`` holds."""
    return iterations_from_samples(profiled_samples(summaries), topo.num_gpus * batch_size)


def baseline_plans(tables: Sequence[EmbeddingTable], topo: Topology,
                   summaries: Mapping[str, FrequencySummary], workload: Workload | int,
                   strategies: Sequence[str] = BASELINES, *,
                   row_wise_plan: Plan | None = None) -> dict[str, Plan]:
    """Every baseline of ``strategies`` as the planner and the never-worse check build it: tables
    balanced by their lookups per iteration (``total / iterations_profiled``), HugeCTR's
    threshold over the workload's ``iterations_profiled`` (a workload not yet profiled, or a
    batch size, is bound to ``summaries``: ``Workload.for_stats``). ``row_wise_plan``: the
    row-wise plan already built (the planner's), used as "rw" and for HugeCTR's ranges; without
    it row-wise is built once for both."""
    by_name = summaries_by_table(tables, summaries)
    work = workload_of(workload, where="baseline_plans")
    if work.iterations_profiled is None:
        work = work.for_stats(tables, topo, by_name)
    if row_wise_plan is None and {"rw", "hugectr"} & set(strategies):
        row_wise_plan = row_wise(tables, topo)
    return {s: build_baseline(s, tables, topo, summaries=by_name, workload=work,
                              row_wise_plan=row_wise_plan)
            for s in strategies}
