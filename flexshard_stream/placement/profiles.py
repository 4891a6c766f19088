"""Execution profiles of the cost model: what the runtime moves for a plan.

Two profiles price a plan through the one evaluator (:mod:`~flexshard_stream.placement.cost`,
``CostModel(profile=...)``), with the same :class:`~flexshard_stream.placement.cost.Cost` type and
the same link-class and time formulas:

- ``"torchrec"`` (the default): what TorchRec 1.8 sends for each sharding kind it runs, from its
  source and checked to the byte against a real ``DistributedModelParallel``
  (docs/TORCHREC_RUNTIME.md): the KJT input distribution, dense pooled outputs (all-to-all for
  table-wise and column-wise, reduce-scatter for row-wise and table-row-wise), sequence rows per
  looked-up ID (optionally de-duplicated) and the dense all-reduce of data-parallel and hot tables;
- ``"ideal"``: the project's own model of DESIGN.md section 3 (requests per row, one partial sum per
  (sample, owner) for pooled tables, the touched rows of replicas all-reduced): what a custom
  runtime could reach.

This module holds the profile objects (:class:`ExecutionProfile`: name, label, the capability
query :meth:`ExecutionProfile.can_run`) and the ID-independent collectives of the ``torchrec``
profile (:class:`TorchRecTerms`), with the closed forms that turn the structured byte matrices of
both into per-GPU bytes by link class (:class:`Structured`). docs/COST_MODEL.md gives every term.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bridge.sharding import sharding_issues, torchrec_kind
from ..errors import ConfigError
from ..kernels.analytic import torchrec_dense_terms
from ..plans.plan import SHARDING_CODES, SHARDING_KINDS, Plan, TablePlan
from ..plans.topology import Topology

__all__ = ["PROFILES", "ExecutionProfile", "execution_profile", "TorchRecTerms", "Structured",
           "TORCHREC_COMPONENTS", "SPLIT_BYTES", "torchrec_row_bytes"]

#: Execution profiles, the default first.
PROFILES: tuple[str, ...] = ("torchrec", "ideal")
#: The TorchRec collectives the ``torchrec`` profile prices, named as
#: ``online.torchrec_runtime.CollectiveRecord.component`` names them.
TORCHREC_COMPONENTS: tuple[str, ...] = (
    "input_splits", "input_lengths", "input_values", "pooled_all_to_all",
    "pooled_reduce_scatter", "sequence_all_to_all", "data_parallel_all_reduce")
#: Bytes each rank sends each rank per (module, sharding kind) group in the KJT splits
#: all-to-all: lengths, values and stride sizes as int64 (``dist_data.py``
#: ``KJTAllToAllSplitsAwaitable``).
SPLIT_BYTES = 3 * 8
#: Code (``SHARDING_CODES``) of the TorchRec type that runs each sharding kind code, per table
#: kind (row 0 sequence, row 1 pooled): the sharding rule's :func:`~flexshard_stream.bridge.
#: sharding.torchrec_kind` (sequence table-row-wise runs row-wise, table-column-wise
#: column-wise).
_RUN_CODES = np.array([[SHARDING_CODES[torchrec_kind(k, tk)] for k in SHARDING_KINDS]
                       for tk in ("sequence", "pooled")], np.int64)


# ----------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class ExecutionProfile:
    """One execution profile of the cost model.

    Attributes
    ----------
    name : str
        ``"torchrec"`` or ``"ideal"`` (:data:`PROFILES`).
    label : str
        How figures under it are labelled when printed: ``"TorchRec 1.8"`` or ``"idealized"``.
    """

    name: str
    label: str

    def issues(self, plan: Plan) -> list[str]:
        """What this runtime cannot execute as planned, one sentence per table and reason (empty:
        it runs the plan). ``ideal`` runs everything.

        ``torchrec``: the sharding rule's issues (:func:`~flexshard_stream.bridge.sharding.
        sharding_issues`): node replicas (tier 1; priced as the export runs them, folded into
        the data-parallel hot table); sequence ``table_row_wise`` / ``table_column_wise``
        (TorchRec 1.8's ``EmbeddingCollectionSharder`` offers neither; priced as ``row_wise`` /
        ``column_wise``); ``row_wise`` over fewer than all GPUs and ``table_row_wise`` over part
        of a node (TorchRec's blocks cover every rank of the group; priced on every rank); a host
        memory tier (TorchRec's UVM caching keeps what its cache decides in HBM, not the plan's
        split). Hashed and weighted cold rows and placed rows run through the export's ID remap
        (``export_torchrec``), which evens each rank's rows out to TorchRec's equal blocks; the
        profile prices the plan's own routing (``plan_from_export`` gives the exact plan)."""
        if self.name == "ideal":
            return []
        topo = plan.topology
        return list(_PLAN_ISSUES.get(plan, (topo.num_gpus, topo.gpus_per_node), lambda: tuple(
            m for tp in plan.tables.values() for m in _cached_sharding_issues(tp, topo))))

    def table_issues(self, tp: TablePlan, topology: Topology) -> list[str]:
        """:meth:`issues` of one table plan on ``topology`` (for a planner filtering candidates
        table by table, before it builds whole plans)."""
        if self.name == "ideal":
            return []
        return list(_cached_sharding_issues(tp, topology))

    def can_run(self, plan: Plan) -> bool:
        """Whether this runtime executes ``plan`` as planned (:meth:`issues` is empty)."""
        return not self.issues(plan)


class _ByIdentity:
    """Values computed once per live object and key: by identity (plans and table plans compare
    by value, so they are not hashable), each entry beside a weak reference that drops it when
    its object goes. The objects are immutable (frozen; their arrays never written once built)."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, dict]] = {}

    def get(self, obj: Any, key: Any, compute):
        """``compute()``, once per ``(obj, key)`` while ``obj`` lives."""
        entries, oid = self._entries, id(obj)
        entry = entries.get(oid)
        if entry is None or entry[0]() is not obj:
            entry = entries[oid] = (weakref.ref(obj, lambda _, k=oid: entries.pop(k, None)), {})
        found = entry[1].get(key)
        if found is None:
            found = entry[1][key] = compute()
        return found


#: The sharding rule's issues of each plan, per topology shape (GPUs, GPUs per node: all the
#: rule reads of it): a planner asks about every candidate, and the same candidates are asked
#: again when the result is chosen (a table plan's are kept on it: _cached_sharding_issues).
_PLAN_ISSUES = _ByIdentity()


def _cached_sharding_issues(tp: TablePlan, topology: Topology) -> tuple[str, ...]:
    """:func:`~flexshard_stream.bridge.sharding.sharding_issues` of ``tp``, computed once per
    table plan and topology shape: kept on the (immutable) table plan itself, so that the
    entry goes with it and a planner's tens of thousands of table plans need no weak
    references."""
    cache = tp.__dict__.get("_torchrec_issues")
    if cache is None:
        cache = tp.__dict__["_torchrec_issues"] = {}
    key = (topology.num_gpus, topology.gpus_per_node)
    found = cache.get(key)
    if found is None:
        found = cache[key] = tuple(sharding_issues(tp, topology))
    return found


_PROFILES = {"torchrec": ExecutionProfile("torchrec", "TorchRec 1.8"),
             "ideal": ExecutionProfile("ideal", "idealized")}


def execution_profile(name: str) -> ExecutionProfile:
    """The :class:`ExecutionProfile` called ``name`` (ConfigError listing :data:`PROFILES`)."""
    try:
        return _PROFILES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"execution profile {name!r} unknown; expected one of "
                          f"{list(PROFILES)}") from None


# ----------------------------------------------------------------------------- structure
@dataclass
class Structured:
    """A G x G byte matrix ``X[a, b]`` (bytes GPU ``a`` sends GPU ``b`` in one collective
    phase, ``a == b`` included) as a sum of four structured parts, each a float64[G] vector:

    - ``to[b]``: every GPU sends ``b`` this much (input distributions);
    - ``from_[a]``: ``a`` sends every GPU this much (outputs of owners);
    - ``node[a]``: ``a`` sends every GPU of its own node this much (a reduce-scatter in the node);
    - ``peer[a]``: ``a`` sends every GPU with its local index, on every node, this much (the
      cross-node all-to-all of table-row-wise).

    Per-GPU bytes by link class come in closed form in O(G) (:meth:`by_class`); the matrix is
    built only when asked (:meth:`matrix`)."""

    to: np.ndarray
    from_: np.ndarray
    node: np.ndarray
    peer: np.ndarray

    @classmethod
    def zeros(cls, G: int) -> "Structured":
        return cls(np.zeros(G), np.zeros(G), np.zeros(G), np.zeros(G))

    def by_class(self, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
        """(send, recv): float64[G, 3] bytes per GPU and link class (local, intra, inter)."""
        G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
        node = np.arange(G) // M

        def node_sum(v):
            return v.reshape(N, M).sum(axis=1)[node]

        def peer_sum(v):
            return np.tile(v.reshape(N, M).sum(axis=0), N)

        send = np.zeros((G, 3))
        recv = np.zeros((G, 3))
        for v, sender in ((self.to, False), (self.from_, True)):
            # one side sends v[x] to / receives v[x] from every GPU; the other side's share
            # of each class is the sum of v over its node (local itself) and outside it
            own = np.stack([v, (M - 1) * v, (G - M) * v], axis=1)
            ns = node_sum(v)
            other = np.stack([v, ns - v, v.sum() - ns], axis=1)
            send += own if sender else other
            recv += other if sender else own
        h, k = self.node, self.peer
        send += np.stack([h + k, (M - 1) * h, (N - 1) * k], axis=1)
        recv += np.stack([h + k, node_sum(h) - h, peer_sum(k) - k], axis=1)
        return send, recv

    def matrix(self, topo: Topology) -> np.ndarray:
        """The G x G matrix (bytes ``a`` sends ``b``)."""
        G, M = topo.num_gpus, topo.gpus_per_node
        g = np.arange(G)
        same_node = (g[:, None] // M) == (g[None, :] // M)
        same_local = (g[:, None] % M) == (g[None, :] % M)
        return (self.to[None, :] + self.from_[:, None] + same_node * self.node[:, None]
                + same_local * self.peer[:, None])

    def total(self, topo: Topology) -> float:
        """Bytes of the whole matrix."""
        G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
        return float(G * (self.to.sum() + self.from_.sum()) + M * self.node.sum()
                     + N * self.peer.sum())


@dataclass
class TorchRecTerms:
    """The collectives of one iteration under the ``torchrec`` profile that do not depend on the
    IDs, per TorchRec component (bytes; docs/COST_MODEL.md, "TorchRec profile"), and which
    tables' IDs go through an input distribution.

    parts : {component: Structured}   ``input_splits``, ``input_lengths``, ``pooled_all_to_all``,
        ``pooled_reduce_scatter`` (forward; the backward moves the transpose)
    allreduce_bytes : float   the data-parallel all-reduce buffer of every GPU (DDP: whole
        data-parallel tables and whole hot tables)
    reduce_scatter_excess : float64[G]   what the reduce-scatter's received chunks exceed its
        output buffer by (a reduce-scatter sums the chunks it receives into one)
    counted : bool[T]   tables (plan order) whose IDs TorchRec distributes
    """

    parts: dict[str, Structured]
    allreduce_bytes: float
    reduce_scatter_excess: np.ndarray
    counted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))

    @classmethod
    def of(cls, plan: Plan, workload: Any,
           length_bytes: int | None = None) -> "TorchRecTerms":
        """The terms of ``plan`` under ``workload`` (a ``placement.workload.Workload``, which
        builds on this module, so it is not imported here): its B samples per GPU and its cost
        model's
        KJT lengths of ``length_bytes`` bytes (or, as before the Workload, ``workload`` the
        batch size and ``length_bytes`` given)."""
        if hasattr(workload, "model"):
            batch_size, length_bytes = workload.batch_size, workload.model.length_bytes
        else:
            batch_size = workload
        topo = plan.topology
        G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
        f = plan.flat
        T = f["layout"].size
        lengths, pooled_owner = np.zeros(G), np.zeros(G)
        rs_node, x_node = np.zeros(N), np.zeros(N)
        groups = np.zeros(12, np.int64)
        counted = np.zeros(T, np.bool_)
        runs_as = _RUN_CODES[f["pooled"].astype(np.int64), f["sharding"]]
        rs_world, allreduce = torchrec_dense_terms(
            G, M, float(batch_size), float(length_bytes), runs_as, f["layout"],
            f["pooled"], f["emb_bytes"], f["num_rows"], f["sp_off"], f["sp_codes"], f["lay_off"],
            f["lay_gpus"], f["lay_w"], lengths, pooled_owner, rs_node, x_node, groups, counted)
        node = np.arange(G) // M
        zero = np.zeros(G)
        parts = {
            "input_splits": Structured(np.full(G, float(SPLIT_BYTES * groups.sum())), zero, zero,
                                       zero),
            "input_lengths": Structured(lengths, zero, zero, zero),
            "pooled_all_to_all": Structured(zero, pooled_owner, zero, x_node[node]),
            "pooled_reduce_scatter": Structured(zero, np.full(G, rs_world), rs_node[node], zero),
        }
        excess = (G - 1) * rs_world + (M - 1) * rs_node[node]
        return cls(parts, float(allreduce), excess, counted)


def torchrec_row_bytes(plan: Plan) -> np.ndarray:
    """Bytes of rows each GPU stores when TorchRec runs ``plan`` (float64[G]): the plan's, with
    node replicas folded into the data-parallel hot table (every GPU stores all of them)."""
    node_total = sum(float(tp.node_ids.size) * float(tp.table.row_bytes)
                     for tp in plan.tables.values())
    return plan.row_bytes_per_gpu - plan.node_replica_bytes_per_gpu + node_total

