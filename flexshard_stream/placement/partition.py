"""The planner's partition stage: a sharding kind and a place for every table, balanced by the
modelled cost the statistics give (as TorchRec's partitioner balances tables by its perf estimate,
but with the skew and de-duplication our summaries see).

How it works (docs/PLANNER.md, "Sharding kinds"):

1. :func:`table_options`: every table is priced alone, with the one evaluator
   (:class:`~flexshard_stream.placement.pricing.AnalyticPricing`), under every sharding kind the
   target runtime executes (:meth:`ExecutionProfile.table_issues
   <flexshard_stream.placement.profiles.ExecutionProfile.table_issues>`): table-wise on GPU 0,
   table-row-wise on node 0, column-wise and table-column-wise (when the table splits into several
   column shards), row-wise over ranges and over hashed IDs, data-parallel. Each priced option keeps
   its per-GPU bytes by phase and link class (:class:`TableOption`). The model is additive over
   tables (every byte a table moves is its own), so a plan's per-GPU loads are the sums of its
   tables' options.
2. :func:`partition`: largest table first, each table takes the kind and place (a GPU for
   table-wise, a node for table-row-wise; a place is a relabelling of GPUs that keeps the nodes, so
   an option priced at its canonical place is priced everywhere) that minimize the modelled
   iteration time of everything placed so far: per phase the slowest GPU's bytes over its links,
   plus the replica all-reduce; ties go to the lower peak memory. Options that would put more than
   ``cap_bytes`` of one table on a GPU are left out.
3. :func:`memory_caps`: the caps of the budget-independent ladder of partitions the planner prices
   (no cap: data-parallel and whole tables wherever they pay; then tighter caps, down to one
   row-wise share of the largest table): the memory budget only selects among them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..plans.plan import ColdSharding, Plan, TablePlan
from ..plans.tables import EmbeddingTable
from ..plans.topology import Topology
from .baselines import column_widths
from .cost import A2A_COMPONENTS, Cost
from .profiles import ExecutionProfile

__all__ = ["KINDS", "TableOption", "table_options", "memory_caps", "partition",
           "partition_plans", "place_permutations"]

#: The kinds the partitioner tries per table, in order of preference on ties ("row_wise_hash":
#: row-wise over hashed IDs).
KINDS: tuple[str, ...] = ("table_wise", "table_row_wise", "column_wise", "table_column_wise",
                          "row_wise", "row_wise_hash", "data_parallel")


@dataclass
class TableOption:
    """One table under one sharding kind, priced alone at its canonical place.

    kind : one of :data:`KINDS`
    plan : the table's plan at the canonical place (GPU 0, node 0, or everywhere)
    loads : float64[3, G, 4]   bytes per phase (index, forward, backward) and GPU: sent intra-node,
                               sent inter-node, received intra-node, received inter-node
    sync : float64[G, 2]       replica all-reduce bytes each GPU sends intra- and inter-node
    memory : float64[G]        rows plus communication buffers each GPU holds for it (bytes)
    time_s : float             its modelled iteration time alone (seconds)
    places : int64[P, G]       relabellings of GPUs to its places (row ``p``: where each GPU's
                               load goes); one row (the identity) when it has a single place
    """

    kind: str
    plan: TablePlan
    loads: np.ndarray
    sync: np.ndarray
    memory: np.ndarray
    time_s: float
    places: np.ndarray

    @property
    def peak_bytes(self) -> float:
        """The most bytes it puts on one GPU."""
        return float(self.memory.max())

    def placed(self, place: int, topology: Topology) -> TablePlan:
        """Its table plan at place ``place`` (a row of :attr:`places`)."""
        tp = self.plan
        perm = self.places[place]
        if tp.cold.kind == "columns":
            cold = ColdSharding.columns(perm[tp.cold.gpus], tp.cold.widths)
        elif tp.cold.kind == "range":
            cold = ColdSharding.ranges(perm[tp.cold.gpus], tp.table.num_rows)
        else:
            return tp
        return TablePlan(tp.table, cold, sharding=tp.sharding)


def place_permutations(topology: Topology, per: str) -> np.ndarray:
    """Relabellings of the GPUs that keep the nodes (int64[P, G]): ``per="gpu"``: row ``g`` swaps
    GPU 0 with GPU ``g`` (their nodes, then their local indices); ``per="node"``: row ``n`` swaps
    node 0 with node ``n``. Each is its own inverse; link classes between GPUs are unchanged."""
    N, M = topology.nodes, topology.gpus_per_node
    g = np.arange(N * M)
    node, local = g // M, g % M
    if per == "node":
        n = np.arange(N)[:, None]
        sw = np.where(node[None] == 0, n, np.where(node[None] == n, 0, node[None]))
        return (sw * M + local[None]).astype(np.int64)
    n, m = (g // M)[:, None], (g % M)[:, None]
    nn = np.where(node[None] == 0, n, np.where(node[None] == n, 0, node[None]))
    mm = np.where(local[None] == 0, m, np.where(local[None] == m, 0, local[None]))
    return (nn * M + mm).astype(np.int64)


def _canonical(kind: str, table: EmbeddingTable, topo: Topology) -> tuple[TablePlan, str] | None:
    """The table's plan under ``kind`` at its canonical place and how its places vary ("gpu",
    "node" or "" for one place); None when the kind adds nothing here (one column shard: that is
    table-wise; one node: table-row-wise is row-wise)."""
    G, M = topo.num_gpus, topo.gpus_per_node
    if kind == "table_wise":
        return TablePlan(table, ColdSharding.ranges([0], table.num_rows)), "gpu"
    if kind == "table_row_wise":
        if topo.nodes == 1 or M == 1:
            return None
        return (TablePlan(table, ColdSharding.ranges(np.arange(M), table.num_rows),
                          sharding="table_row_wise"), "node")
    if kind in ("column_wise", "table_column_wise"):
        group = G if kind == "column_wise" else M
        w = column_widths(table.dim, max_shards=group)
        if w.size < 2:
            return None
        return (TablePlan(table, ColdSharding.columns(np.arange(w.size), w), sharding=kind),
                "gpu" if kind == "column_wise" else "node")
    if kind == "row_wise":
        return TablePlan(table, ColdSharding.ranges(np.arange(G), table.num_rows)), ""
    if kind == "row_wise_hash":
        return TablePlan(table, ColdSharding.hashed(np.arange(G))), ""
    return TablePlan(table, ColdSharding.replicated()), ""


def _loads(cost: Cost) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loads float64[3, G, 4], sync float64[G, 2], memory float64[G]) of a one-table cost."""
    loads = np.stack([np.concatenate([cost.send[c][:, 1:3], cost.recv[c][:, 1:3]], axis=1)
                      for c in A2A_COMPONENTS])
    return loads, cost.send["sync"][:, 1:3].copy(), cost.row_bytes + cost.buffer_bytes


def table_options(tables: Sequence[EmbeddingTable], topology: Topology, price,
                  profile: ExecutionProfile) -> list[list[TableOption]]:
    """Per table (in order), every kind of :data:`KINDS` the ``profile``'s runtime executes,
    priced alone: ``price(plan) -> Cost`` is the planner's evaluator on a one-table plan."""
    perms = {"gpu": place_permutations(topology, "gpu"),
             "node": place_permutations(topology, "node"),
             "": np.arange(topology.num_gpus, dtype=np.int64)[None]}
    out = []
    for t in tables:
        opts = []
        for kind in KINDS:
            canon = _canonical(kind, t, topology)
            if canon is None or profile.table_issues(canon[0], topology):
                continue
            tp, per = canon
            cost = price(Plan("partition", topology, [tp]))
            loads, sync, mem = _loads(cost)
            opts.append(TableOption(kind, tp, loads, sync, mem, cost.iteration_time_s,
                                    perms[per]))
        out.append(opts)
    return out


def memory_caps(options: Sequence[Sequence[TableOption]], num_gpus: int, steps: int = 5
                ) -> list[float]:
    """The per-table memory caps (bytes one table may put on one GPU) of the partitions the
    planner prices: none, then ``steps`` geometric caps from the largest option's peak down to
    the largest table's row-wise share (its bytes over the GPUs). Independent of the budget."""
    peaks = [o.peak_bytes for opts in options for o in opts]
    if not peaks:
        return [np.inf]
    share = max(float(opts[0].plan.table.table_bytes) for opts in options if opts) / num_gpus
    hi = max(peaks)
    lo = min(hi, share)
    return [np.inf] + [float(c) for c in np.geomspace(hi, lo, steps)[1:]]


class _Loads:
    """The running per-GPU loads of a partition and the modelled time of adding an option."""

    def __init__(self, topo: Topology):
        G = topo.num_gpus
        bw = np.stack([topo.intra_bw, topo.inter_bw, topo.intra_bw, topo.inter_bw], axis=1)
        self.inv_bw = 1.0 / bw
        self.inv_sync = 1.0 / np.stack([topo.intra_bw, topo.inter_bw], axis=1)
        self.loads = np.zeros((3, G, 4))
        self.sync = np.zeros((G, 2))
        self.memory = np.zeros(G)

    def score(self, o: TableOption) -> tuple[np.ndarray, np.ndarray]:
        """(time_s float64[P], peak memory float64[P]) with ``o`` added at each of its places."""
        P = o.places
        ph = ((self.loads[:, None] + o.loads[:, P]) * self.inv_bw).max(axis=(2, 3)).sum(axis=0)
        sy = ((self.sync[None] + o.sync[P]) * self.inv_sync).sum(axis=2).max(axis=1)
        mem = (self.memory[None] + o.memory[P]).max(axis=1)
        return ph + sy, mem

    def add(self, o: TableOption, place: int) -> None:
        perm = o.places[place]
        self.loads += o.loads[:, perm]
        self.sync += o.sync[perm]
        self.memory += o.memory[perm]


def partition(options: Sequence[Sequence[TableOption]], topology: Topology, cap_bytes: float
              ) -> list[TablePlan]:
    """Table plans (in table order): largest table first (its fastest option alone), each
    table's kind and place the ones that minimize the modelled time of the tables placed so far
    (ties: lower peak memory, then the order of :data:`KINDS` and places), among its options
    whose peak is at most ``cap_bytes`` (row-wise is always allowed)."""
    order = np.argsort([-min(o.time_s for o in opts) for opts in options], kind="stable")
    state = _Loads(topology)
    chosen: dict[int, TablePlan] = {}
    for i in order:
        opts = [o for o in options[i] if o.peak_bytes <= cap_bytes or o.kind == "row_wise"]
        best = None
        for o in opts:
            t, mem = state.score(o)
            p = int(np.lexsort((mem, t))[0])
            key = (float(t[p]), float(mem[p]))
            if best is None or key < best[0]:
                best = (key, o, p)
        _, o, p = best
        state.add(o, p)
        chosen[int(i)] = o.placed(p, topology)
    return [chosen[i] for i in range(len(options))]


def partition_plans(tables: Sequence[EmbeddingTable], topology: Topology,
                    options: Sequence[Sequence[TableOption]], caps: Sequence[float]
                    ) -> list[Plan]:
    """One plan ("partition") per cap of ``caps`` (:func:`partition`), duplicates dropped."""
    out: list[Plan] = []
    for cap in caps:
        plan = Plan("partition", topology, partition(options, topology, cap),
                    {"memory_cap_bytes": cap})
        if not any(plan == p for p in out):
            out.append(plan)
    return out
