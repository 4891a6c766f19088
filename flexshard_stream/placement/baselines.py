"""Baseline sharding strategies, each producing the one :class:`Plan` type.

- ``row_wise``: every table's rows over all G GPUs, contiguous equal ranges (TorchRec RW) or hashed;
- ``table_wise``: each table whole on one GPU, greedy balance (largest first onto the least loaded);
- ``table_row_wise``: each table's rows over the M GPUs of one node, nodes balanced greedily;
- ``data_parallel``: every row of every table on every GPU;
- ``hugectr_hybrid``: HugeCTR's hybrid embedding rule: replicate every row whose profiled count
  reaches ``iterations * N * (a2a_bw / ar_bw) * efficiency * N / (N - 1)``, the number of frequent
  rows rounded up to a multiple of G; the rest row-wise.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..stats.summary import FrequencySummary
from .plan import ColdSharding, Plan, TablePlan
from .tables import EmbeddingTable, summaries_by_table
from .topology import Topology

__all__ = ["row_wise", "table_wise", "table_row_wise", "data_parallel", "hugectr_hybrid",
           "hugectr_threshold", "build_baseline", "STRATEGIES"]


def row_wise(tables: Sequence[EmbeddingTable], topo: Topology, *, mode: str = "range",
             seed: int = 0) -> Plan:
    """Row-wise: rows over all GPUs, ``mode`` "range" (contiguous) or "hash"."""
    gpus = np.arange(topo.num_gpus)
    tps = []
    for t in tables:
        if mode == "range":
            cold = ColdSharding.ranges(gpus, t.num_rows)
        elif mode == "hash":
            cold = ColdSharding.hashed(gpus, seed)
        else:
            raise ConfigError(f"row-wise mode must be 'range' or 'hash', got {mode!r}")
        tps.append(TablePlan(t, cold))
    return Plan("rw", topo, tps, {"mode": mode})


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
    tps = [TablePlan(t, ColdSharding.ranges(topo.gpus_of_node(int(n)), t.num_rows))
           for t, n in zip(tables, where)]
    return Plan("twrw", topo, tps, {"node_of_table": {t.name: int(n) for t, n in zip(tables, where)}})


def data_parallel(tables: Sequence[EmbeddingTable], topo: Topology) -> Plan:
    """Data-parallel: every table replicated on every GPU."""
    return Plan("dp", topo, [TablePlan(t, ColdSharding.replicated()) for t in tables])


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
                   efficiency: float = 1.0) -> Plan:
    """HugeCTR hybrid embedding (last in v23.12), from profiled statistics.

    ``summaries`` cover ``iterations`` profiled iterations. A row is frequent when its estimated
    count reaches :func:`hugectr_threshold`; the frequent set is then grown to a multiple of G with
    the next most frequent rows (as HugeCTR rounds up). Infrequent rows are row-wise.
    """
    if iterations <= 0:
        raise ConfigError(f"iterations must be > 0, got {iterations}")
    thr = hugectr_threshold(iterations, topo.nodes, all_to_all_bw, all_reduce_bw, efficiency)
    G = topo.num_gpus
    gpus = np.arange(G)
    tps = []
    frequent = {}
    by_name = summaries_by_table(tables, summaries)
    for t in tables:
        s = by_name[t.name]
        ok = (s.top_ids >= 0) & (s.top_ids < t.num_rows)
        ids, est = s.top_ids[ok], s.top_est[ok]
        order = np.lexsort((ids, -est))
        ids, est = ids[order], est[order]
        k = int(np.count_nonzero(est >= thr))
        if k:
            k = min(ids.size, -(-k // G) * G)
        frequent[t.name] = k
        tps.append(TablePlan(t, ColdSharding.ranges(gpus, t.num_rows),
                             global_ids=np.sort(ids[:k])))
    return Plan("hugectr", topo, tps, {"threshold": thr, "iterations": iterations,
                                       "frequent_rows": frequent})


STRATEGIES: dict[str, Callable[..., Plan]] = {
    "rw": row_wise, "tw": table_wise, "twrw": table_row_wise, "dp": data_parallel,
    "hugectr": hugectr_hybrid}


def build_baseline(strategy: str, tables: Sequence[EmbeddingTable], topo: Topology, *,
                   summaries: Mapping[str, FrequencySummary] | None = None,
                   iterations: int | None = None, lookups: Mapping[str, float] | None = None
                   ) -> Plan:
    """Dispatch by name ("rw", "rw-hash", "tw", "twrw", "dp", "hugectr")."""
    if strategy in ("rw", "rw-range"):
        return row_wise(tables, topo)
    if strategy == "rw-hash":
        return row_wise(tables, topo, mode="hash")
    if strategy == "tw":
        return table_wise(tables, topo, lookups=lookups)
    if strategy == "twrw":
        return table_row_wise(tables, topo, lookups=lookups)
    if strategy == "dp":
        return data_parallel(tables, topo)
    if strategy == "hugectr":
        if summaries is None or iterations is None:
            raise ConfigError("the hugectr strategy needs profiled statistics and iterations")
        return hugectr_hybrid(tables, topo, summaries, iterations=iterations)
    raise ConfigError(f"unknown strategy {strategy!r}; choose one of rw, rw-hash, tw, twrw, dp, "
                      "hugectr")
