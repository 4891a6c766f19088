"""The one cost evaluator: all-to-all bytes, replica sync, communication time and memory of a plan.

Two execution profiles (``CostModel(profile=...)``, :mod:`~flexshard_stream.placement.profiles`):
``"torchrec"`` (the default) prices what TorchRec 1.8 sends for the plan, ``"ideal"`` the project's
own model of DESIGN.md section 3 (what a custom runtime could reach). Both go through the same
:class:`Cost`, link classes and time formulas.

Two modes share every formula after the traffic counts (:func:`_finish`):

- trace mode, :func:`evaluate_trace`: replays batches as iterations of ``G * B`` samples (sample ``i``
  of an iteration on GPU ``i // B``) through the Numba kernel ``kernels/traffic.table_traffic``;
- analytic mode, :func:`evaluate_analytic`: expectations from a :class:`FrequencySummary` per table,
  with ``lambda_r = G * B * mean(L) * p_r`` expected lookups of row ``r`` per iteration.

Units: bytes and bytes per iteration, seconds per iteration. Byte matrices are ``M[a, b]`` = bytes
GPU ``a`` sends to GPU ``b``. docs/COST_MODEL.md gives the equations.

Host memory tier (``TablePlan.hbm_fraction``): lookups of cold rows kept in host memory are counted per
owner GPU (``Cost.host_lookups``) and charged at its UVM bandwidth (``Cost.uvm_time_s``);
``Cost.iteration_time_s = comm_time_s + uvm_time_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import BatchError, ConfigError
from ..kernels.analytic import (
    AnalyticHostTier,
    AnalyticOutputs,
    AnalyticPlan,
    AnalyticSummaries,
    AnalyticTopRows,
    analytic_traffic,
    segment_argsort,
    top_destinations,
    top_requests,
)
from ..kernels.traffic import table_traffic
from ..plans.plan import Plan, TablePlan
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..stats.batch import Batch, rebatch
from ..stats.config import TableConfig
from ..stats.stream import validate_batch
from ..stats.summary import FrequencySummary
from .profiles import (
    PROFILES,
    TORCHREC_COMPONENTS,
    Structured,
    TorchRecTerms,
    execution_profile,
    torchrec_row_bytes,
)
from .workload import CostModel, Workload, workload_of

__all__ = ["CostModel", "Cost", "TraceCost", "Workload", "evaluate_trace", "evaluate_analytic",
           "analytic_summaries", "TopRowCache",
           "check_matrix_size", "COMPONENTS", "A2A_COMPONENTS", "PROFILES", "TORCHREC_COMPONENTS",
           "MATRIX_MAX_GPUS", "TCP_WIRE_OVERHEAD"]

COMPONENTS = ("index", "forward", "backward", "sync")
A2A_COMPONENTS = ("index", "forward", "backward")
CLASSES = ("local", "intra_node", "inter_node")
#: Wire bytes per payload byte of gloo over TCP/IP on the emulated cluster's veths (MTU 1500),
#: measured (docs/CLUSTER.md): 66 bytes of Ethernet, IP and TCP headers (timestamps) per
#: 1448-byte segment (1.0456) plus the ACKs going the other way.
TCP_WIRE_OVERHEAD = 1.047
#: Most GPUs for which G x G traffic matrices are made (trace mode always makes them; analytic
#: mode when asked): about ten float64 matrices are alive at once, ~80 * G**2 bytes, 1.3 GiB at
#: 4096 GPUs. Larger topologies are evaluated analytically (per-GPU sums by link class, O(G)).
MATRIX_MAX_GPUS = 4096


def check_matrix_size(topo: Topology, what: str = "trace evaluation") -> None:
    """Refuse, before anything is allocated, to build G x G matrices for more than
    :data:`MATRIX_MAX_GPUS` GPUs (ConfigError naming the sizes)."""
    G = topo.num_gpus
    if G > MATRIX_MAX_GPUS:
        raise ConfigError(f"{what} keeps G x G traffic matrices (about {80 * G * G / 2**30:,.0f} "
                          f"GiB for G = {G:,} GPUs); at most {MATRIX_MAX_GPUS:,} GPUs: use the "
                          "analytic evaluation (evaluate_analytic, replay --evaluation analytic), "
                          "which keeps per-GPU sums")


@dataclass
class Cost:
    """Cost of one iteration (trace mode: the mean over iterations; peak memory: the max).

    send, recv : {component: float64[G, 3]}   bytes per GPU by link class (local, intra, inter)
    matrices : {component: float64[G, G]} or None
    time_s : {component: seconds}; comm_time_s = index + forward + backward + sync
    row_bytes, buffer_bytes : float64[G]   rows stored in HBM; communication buffers (bytes)
    host_lookups : float64[G]   row lookups served from GPU g's host memory per iteration (host
                                memory tier; every requester, the owner included; with
                                de-duplication once per (source GPU, row) pair)
    uvm_bytes : float64[G]      bytes moved over GPU g's UVM link per iteration: per host lookup
                                ``D e`` (forward read) + ``2 (D e + s)`` (backward read-modify-write
                                of the row and its optimizer state)
    host_bytes : float64[G]     rows GPU g keeps in host memory (bytes, expected value)
    profile : str               the execution profile of the figures ("torchrec" or "ideal")
    collectives : {component: float}   ``torchrec`` only: bytes per iteration of each TorchRec
                                collective (``profiles.TORCHREC_COMPONENTS``) as TorchRec's buffers
                                hold them, summed over ranks, a rank's own chunk included (the
                                forward direction; the backward moves as much again, the
                                all-reduce: every rank's buffer); matrices of them, ``[sender,
                                receiver]``, are in ``matrices`` under the component's name

    Under ``torchrec`` the byte matrices hold a rank's own chunk on the diagonal (the ``local``
    class): it is part of TorchRec's buffers (memory) but crosses no link, so ``a2a_bytes`` and
    the times leave it out.
    """

    topology: Topology
    send: dict[str, np.ndarray]
    recv: dict[str, np.ndarray]
    time_s: dict[str, float]
    row_bytes: np.ndarray
    buffer_bytes: np.ndarray
    reservation_bytes: float = 0.0
    matrices: dict[str, np.ndarray] | None = None
    iterations: int = 1
    mode: str = "trace"
    dedup: bool = True
    host_lookups: np.ndarray | None = None
    uvm_bytes: np.ndarray | None = None
    host_bytes: np.ndarray | None = None
    profile: str = "ideal"
    collectives: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        G = self.topology.num_gpus
        for a in ("host_lookups", "uvm_bytes", "host_bytes"):
            v = getattr(self, a)
            setattr(self, a, np.zeros(G) if v is None else np.asarray(v, dtype=np.float64))

    @property
    def comm_time_s(self) -> float:
        """Modelled communication time per iteration (seconds)."""
        return float(sum(self.time_s[c] for c in COMPONENTS))

    @property
    def uvm_time_s(self) -> float:
        """Host-memory (UVM) time per iteration: the slowest GPU's ``uvm_bytes / uvm_bw``
        (seconds; 0 without a host memory tier)."""
        if not self.uvm_bytes.size or not self.uvm_bytes.any():
            return 0.0
        return float((self.uvm_bytes / self.topology.uvm_bw).max())

    @property
    def iteration_time_s(self) -> float:
        """``comm_time_s + uvm_time_s`` (seconds per iteration): what a planner minimizes."""
        return self.comm_time_s + self.uvm_time_s

    @property
    def host_lookups_total(self) -> float:
        """Lookups served from host memory per iteration, all GPUs."""
        return float(self.host_lookups.sum())

    def bytes_by_class(self, component: str) -> dict[str, float]:
        """Bytes per iteration of one component, summed over GPUs, per link class."""
        s = self.send[component].sum(axis=0)
        return {c: float(s[i]) for i, c in enumerate(CLASSES)}

    @property
    def a2a_bytes(self) -> float:
        """All-to-all bytes per iteration: index exchange + forward + backward (whole cluster),
        over links (intra- and inter-node; a rank's own chunk is not sent)."""
        return float(sum(_link_bytes(self.send[c]) for c in A2A_COMPONENTS))

    @property
    def intra_node_bytes(self) -> float:
        return float(sum(self.send[c][:, 1].sum() for c in A2A_COMPONENTS))

    @property
    def inter_node_bytes(self) -> float:
        """All-to-all bytes crossing between nodes ("global" traffic)."""
        return float(sum(self.send[c][:, 2].sum() for c in A2A_COMPONENTS))

    @property
    def sync_bytes(self) -> float:
        """Replica-sync (all-reduce) bytes per iteration over links, whole cluster."""
        return float(_link_bytes(self.send["sync"]))

    @property
    def label(self) -> str:
        """How to label figures under this cost's profile: "TorchRec 1.8" or "idealized"."""
        return execution_profile(self.profile).label

    @property
    def peak_memory_per_gpu(self) -> np.ndarray:
        return self.row_bytes + self.buffer_bytes + self.reservation_bytes

    @property
    def peak_memory_bytes(self) -> float:
        """Largest per-GPU memory: rows + communication buffers + reservation (bytes)."""
        return float(self.peak_memory_per_gpu.max())

    def to_json(self) -> dict[str, Any]:
        """The summary printed by ``flexshard-stream evaluate --json``."""
        out = {"iterations": self.iterations, "mode": self.mode, "dedup": self.dedup,
                "profile": self.profile,
                "bytes_per_iter": {"total": self.a2a_bytes, "intra_node": self.intra_node_bytes,
                                   "inter_node": self.inter_node_bytes,
                                   "sync": self.sync_bytes,
                                   "sync_inter_node": float(self.send["sync"][:, 2].sum()),
                                   "by_component": {c: self.bytes_by_class(c) for c in COMPONENTS}},
                "comm_time_s_per_iter": self.comm_time_s,
                "time_s_per_iter": dict(self.time_s),
                "host_lookups_per_iter": self.host_lookups_total,
                "uvm_time_s_per_iter": self.uvm_time_s,
                "iteration_time_s": self.iteration_time_s,
                "peak_memory_bytes": self.peak_memory_bytes,
                "row_bytes_max": float(self.row_bytes.max()),
                "buffer_bytes_max": float(self.buffer_bytes.max()),
                "host_bytes_max": float(self.host_bytes.max()) if self.host_bytes.size else 0.0}
        if self.collectives:
            out["bytes_per_iter"]["torchrec_collectives"] = dict(self.collectives)
        return out


def _link_bytes(by_class: np.ndarray) -> float:
    """Bytes of a float64[G, 3] (local, intra, inter) array that cross a link: all but the local
    class (summed as the whole array less it, so that without local bytes the sum is the whole
    array's, bit for bit)."""
    return float(by_class.sum() - by_class[:, 0].sum())


@dataclass
class TraceCost:
    """Trace-mode result: the mean :class:`Cost` plus per-iteration series."""

    mean: Cost
    per_iteration: dict[str, np.ndarray] = field(default_factory=dict)
    matrices: list[dict[str, np.ndarray]] | None = None
    dropped_samples: int = 0

    def to_json(self) -> dict[str, Any]:
        d = self.mean.to_json()
        d["dropped_samples"] = self.dropped_samples
        return d


# ----------------------------------------------------------------------------- shared formulas
def _class_masks(topo: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lc = topo.link_class_matrix()
    return lc == 0, lc == 1, lc == 2


def _by_class_from_matrix(m: np.ndarray, masks) -> tuple[np.ndarray, np.ndarray]:
    send = np.stack([(m * k).sum(axis=1) for k in masks], axis=1)
    recv = np.stack([(m * k).sum(axis=0) for k in masks], axis=1)
    return send, recv


def _pairwise_time(topo: Topology, m: np.ndarray) -> float:
    """gloo's all-to-all of the byte matrix ``m[src, dst]``: ``G - 1`` rounds one after the
    other; in round ``i`` GPU ``g`` sends ``m[g, g + i]`` and receives ``m[g - i, g]``, each over
    its link class's bandwidth (the sender's, the receiver's); a round ends with its slowest
    transfer."""
    G, M = topo.num_gpus, topo.gpus_per_node
    g = np.arange(G)
    total = 0.0
    for i in range(1, G):
        dst, src = (g + i) % G, (g - i) % G
        out_bw = np.where(dst // M == g // M, topo.intra_bw, topo.inter_bw)
        in_bw = np.where(src // M == g // M, topo.intra_bw, topo.inter_bw)
        total += float(np.maximum(m[g, dst] / out_bw, m[src, g] / in_bw).max())
    return total


def _a2a_time(topo: Topology, send: np.ndarray, recv: np.ndarray,
              model: CostModel | None = None, component: str = "",
              matrix: np.ndarray | None = None) -> float:
    """An all-to-all ends when its slowest GPU ends: per GPU the max of intra and inter bytes over
    that GPU's bandwidths, for what it sends and what it receives (``model.alltoall ==
    "pairwise"``: gloo's rounds on ``matrix``, :func:`_pairwise_time`); with ``model``'s wire
    overhead and message latency (1.0 and 0 by default: the figure unchanged)."""
    if model is not None and model.alltoall == "pairwise":
        if matrix is None:
            raise ConfigError("alltoall='pairwise' needs the G x G byte matrices "
                              f"(at most {MATRIX_MAX_GPUS:,} GPUs)")
        out = _pairwise_time(topo, matrix)
    else:
        t = np.maximum.reduce([send[:, 1] / topo.intra_bw, send[:, 2] / topo.inter_bw,
                               recv[:, 1] / topo.intra_bw, recv[:, 2] / topo.inter_bw])
        out = float(t.max()) if t.size else 0.0
    if model is None or (model.wire_overhead == 1.0 and model.message_latency_s == 0.0):
        return out
    moved = bool((send[:, 1:] > 0).any() or (recv[:, 1:] > 0).any())
    return out * model.wire_overhead + (
        model.message_latency_s * model.a2a_rounds(component, topo) if moved else 0.0)


def _sync_traffic(topo: Topology, s_global: float, s_node: np.ndarray, model: CostModel,
                  want_matrix: bool):
    """All-reduce of replica gradients: ``s_global`` bytes over all GPUs, ``s_node[m]`` bytes over
    the N copies held by local GPU ``m`` of each node. Returns (send, recv, time, matrix)."""
    N, M, G = topo.nodes, topo.gpus_per_node, topo.num_gpus
    g = np.arange(G)
    node, local = g // M, g % M
    edges = []  # (src array, dst array, bytes array)
    if model.allreduce == "hierarchical":
        if M > 1 and s_global > 0:
            edges.append((g, node * M + (local + 1) % M, np.full(G, 2 * (M - 1) / M * s_global)))
        if N > 1 and s_global > 0:
            edges.append((g, ((node + 1) % N) * M + local, np.full(G, 2 * (N - 1) / N * s_global / M)))
    elif G > 1 and s_global > 0:
        edges.append((g, (g + 1) % G, np.full(G, 2 * (G - 1) / G * s_global)))
    if N > 1 and np.any(s_node > 0):
        edges.append((g, ((node + 1) % N) * M + local, 2 * (N - 1) / N * s_node[local]))
    send = np.zeros((G, 3))
    recv = np.zeros((G, 3))
    mat = np.zeros((G, G)) if want_matrix else None
    for src, dst, b in edges:
        cls = np.where(src == dst, 0, np.where(src // M == dst // M, 1, 2))
        np.add.at(send, (src, cls), b)
        np.add.at(recv, (dst, cls), b)
        if mat is not None:
            np.add.at(mat, (src, dst), b)
    # phases run one after the other: intra part then inter part (hierarchical); one ring otherwise
    t = send[:, 1] / topo.intra_bw + send[:, 2] / topo.inter_bw
    time_s = float(t.max()) if t.size else 0.0
    if model.wire_overhead != 1.0 or model.message_latency_s != 0.0:
        time_s *= model.wire_overhead
        if edges:
            time_s += model.message_latency_s * model.allreduce_rounds(topo)
    return send, recv, time_s, mat


def _finish(topo: Topology, a2a: Mapping[str, tuple[np.ndarray, np.ndarray]],
            sync: tuple[np.ndarray, np.ndarray, float], sync_buffer: np.ndarray,
            row_bytes: np.ndarray, model: CostModel, matrices, mode: str,
            host: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
            buffer_excess: np.ndarray | float = 0.0,
            collectives: dict[str, float] | None = None,
            a2a_matrices: Mapping[str, np.ndarray] | None = None) -> Cost:
    """The :class:`Cost` of one iteration's traffic: ``a2a`` (send, recv) per all-to-all
    component, the replica sync (send, recv, time) and its buffer per GPU, the rows stored;
    ``buffer_excess`` (bytes per GPU) is what the received bytes exceed the receive buffers by
    (a reduce-scatter sums what it receives)."""
    send = {c: a2a[c][0] for c in A2A_COMPONENTS}
    recv = {c: a2a[c][1] for c in A2A_COMPONENTS}
    send["sync"], recv["sync"] = sync[0], sync[1]
    mats = a2a_matrices if a2a_matrices is not None else (matrices or {})
    time_s = {c: _a2a_time(topo, send[c], recv[c], model, c, mats.get(c))
              for c in A2A_COMPONENTS}
    time_s["sync"] = sync[2]
    # buffers materialized by an iteration: index and embedding exchange (sent + received; the
    # backward reuses the forward's buffers, transposed) plus the replica gradients
    buf = sum(send[c].sum(axis=1) + recv[c].sum(axis=1) for c in ("index", "forward"))
    buf = buf + sync_buffer - buffer_excess
    hl, ub, hb = host if host is not None else (None, None, None)
    return Cost(topo, send, recv, time_s, row_bytes, buf, model.reservation_bytes, matrices,
                mode=mode, dedup=model.dedup, host_lookups=hl, uvm_bytes=ub, host_bytes=hb,
                profile=model.profile, collectives=dict(collectives or {}))


# ----------------------------------------------------------------------------- trace mode
def _split_features(batch: Batch) -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    """Per-feature views of a batch; ID ranges are checked inside the trace kernel (one pass)."""
    offs = batch.key_offsets()
    bs = batch.batch_size
    return [(k, batch.values[offs[i]:offs[i + 1]], batch.lengths[i * bs:(i + 1) * bs], -1)
            for i, k in enumerate(batch.keys)]


class _Scratch:
    """Reusable hash-set scratch of the trace kernel, grown on demand; stamps avoid clearing."""

    def __init__(self, G: int):
        self.G = G
        self.set_tab = np.zeros((16, 2), np.int64)
        self.dp_tab = np.zeros((1, 2), np.int64)
        self.marks = np.full(G, -1, np.int64)
        self.stamp = 1

    @staticmethod
    def _pow2(n: int) -> int:
        return 1 << max(4, math.ceil(math.log2(2 * n + 1)))

    def ensure(self, block_ids: int, dp_ids: int) -> None:
        need = self._pow2(block_ids)
        if need > self.set_tab.shape[0]:
            self.set_tab = np.zeros((need, 2), np.int64)
        if dp_ids and self._pow2(dp_ids) > self.dp_tab.shape[0]:
            self.dp_tab = np.zeros((self._pow2(dp_ids), 2), np.int64)

    def next_stamp(self) -> int:
        s = self.stamp
        self.stamp += self.G + 1
        return s


def _table_for_features(plan: Plan) -> dict[str, TablePlan]:
    out = {}
    for tp in plan.tables.values():
        out[tp.table.feature or tp.table.name] = tp
    return out


def evaluate_trace(plan: Plan, batches: Iterable[Batch], batch_size: int | None = None,
                   model: CostModel | None = None, *, keep_matrices: bool = False,
                   max_iterations: int | None = None, progress=None,
                   workload: Workload | None = None) -> TraceCost:
    """Replay ``batches`` through ``plan``: iterations of ``G * batch_size`` samples in order.

    The workload: ``workload=`` (its B and cost model), or ``batch_size`` (B, samples per GPU per
    iteration) and ``model`` (default ``CostModel()``); :func:`~.workload.workload_of`.

    A trailing partial iteration is not evaluated (``dropped_samples``), but checked like the
    others. Features without a table in the plan, IDs out of range or negative, raise
    :class:`BatchError` before anything is counted for that iteration. ``progress(iterations_done)``
    is called after each iteration when given.

    Each iteration goes through three steps: the trace kernel counts, per table, what every
    component moves (:class:`_TraceKernel`); the counts become the iteration's traffic by component
    (:class:`_IterationTraffic`: index and embedding all-to-all, replica sync, host-memory
    lookups; under ``torchrec`` added to the collectives that do not depend on the IDs,
    :class:`~flexshard_stream.placement.profiles.TorchRecTerms`) and its :class:`Cost`; the costs
    are summed (:class:`_TraceSums`).
    """
    work = workload_of(batch_size, model, None, workload, where="evaluate_trace")
    model = work.model
    topo = plan.topology
    check_matrix_size(topo)
    spi = work.samples_per_iteration(topo)
    kernel = _TraceKernel(plan, work)
    sums = _TraceSums(topo.num_gpus, keep_matrices)
    masks = _class_masks(topo)
    row_bytes = torchrec_row_bytes(plan) if model.torchrec else plan.row_bytes_per_gpu
    host_bytes = plan.host_bytes_per_gpu
    dropped = 0
    for it in rebatch(batches, spi):
        if it.batch_size < spi:  # not evaluated, but its IDs are checked like the others'
            validate_batch(it, kernel.configs)
            dropped = it.batch_size
            break
        traffic = kernel.iteration(it)
        cost, sync_matrix = traffic.cost(topo, model, masks, row_bytes, host_bytes)
        sums.add(cost, traffic, sync_matrix)
        if progress is not None:
            progress(sums.n)
        if max_iterations is not None and sums.n >= max_iterations:
            break
    return sums.result(topo, model, row_bytes, host_bytes, dropped)


@dataclass
class _TableCounts:
    """What the trace kernel counted for one table in one iteration: lookups requested (index
    messages; ``torchrec``: IDs distributed, a GPU's own included) and embeddings sent, as G x G
    counts ``[requester, owner]``; replica rows touched (``global_touched`` rows of tier 0,
    ``touched_node[m]`` of tier 1 held by local GPU ``m``); host-memory lookups per owner GPU
    (None without a host tier)."""

    index: np.ndarray
    embeddings: np.ndarray
    touched_node: np.ndarray
    global_touched: int
    host: np.ndarray | None


def _width_bytes(tp: TablePlan, G: int) -> float | np.ndarray:
    """Bytes of one looked-up row as its owner returns it: ``D e``, or for a column-wise table
    the owner's shard, ``w e`` per GPU (float64[G], zero off the shards)."""
    if not tp.column_wise:
        return float(tp.table.embedding_bytes)
    wb = np.zeros(G)
    wb[tp.cold.gpus] = tp.cold.widths * float(tp.table.embedding_bytes) / tp.table.dim
    return wb


class _TraceKernel:
    """The plan-side state of the trace kernel, built once per :func:`evaluate_trace` call:
    a router and a touch-mark array per feature, reusable hash-set scratch and, under
    ``torchrec``, the collectives that do not depend on the IDs (as G x G matrices)."""

    def __init__(self, plan: Plan, workload: Workload):
        topo = plan.topology
        self.plan, self.B, self.model = plan, workload.batch_size, workload.model
        self.G, self.M = topo.num_gpus, topo.gpus_per_node
        self.by_feature = _table_for_features(plan)
        self.configs = {f: TableConfig(tp.name, tp.table.num_rows, f)
                        for f, tp in self.by_feature.items()}
        self.routers = {f: plan.router(tp.name) for f, tp in self.by_feature.items()}
        self.touch = {f: np.zeros(max(1, r.keys.size), np.int64) for f, r in self.routers.items()}
        self.width = {f: _width_bytes(tp, self.G) for f, tp in self.by_feature.items()}
        self.scratch = _Scratch(self.G)
        self.host_cnt = np.zeros(self.G, np.int64)
        self.dense = _TorchRecDense(plan, workload) if workload.model.torchrec else None

    def iteration(self, it: Batch) -> _IterationTraffic:
        """The traffic of one iteration (``G * B`` samples, sample ``i`` on GPU ``i // B``)."""
        for k in it.keys:
            if k not in self.by_feature:
                raise BatchError(f"no table in plan {self.plan.strategy!r} for this feature; "
                                 f"plan features: {sorted(self.by_feature)}", feature=k,
                                 field="keys")
        traffic = _IterationTraffic.zeros(self.G, self.M, self.dense)
        for feat, ids, lens, _ in _split_features(it):
            tp = self.by_feature[feat]
            if self.dense is not None and not self.dense.counted[tp.name]:
                self.check_ids(it, feat, ids)   # no input distribution: only validate the IDs
                continue
            traffic.add_table(tp, self.table_counts(it, feat, ids, lens), self.model,
                              self.width[feat])
        return traffic

    def check_ids(self, it: Batch, feat: str, ids: np.ndarray) -> None:
        """BatchError naming the first ID of ``feat`` outside its table."""
        h = self.by_feature[feat].table.num_rows
        if ids.size and (ids.min() < 0 or ids.max() >= h):
            validate_batch(it, self.configs)
            bad = int(np.flatnonzero((ids < 0) | (ids >= h))[0])
            raise BatchError(f"ID {int(ids[bad])} out of range", feature=feat, field="values",
                             position=bad)

    def table_counts(self, it: Batch, feat: str, ids: np.ndarray, lens: np.ndarray
                     ) -> _TableCounts:
        """Run the kernel on one feature's IDs; an ID out of range raises BatchError naming it
        (the kernel stops and nothing is counted)."""
        tp, r, sc = self.by_feature[feat], self.routers[feat], self.scratch
        G, M, B = self.G, self.M, self.B
        block = int(lens.reshape(G, B).sum(axis=1).max()) if lens.size else 0
        sc.ensure(block, ids.size if tp.replicated else 0)
        stamp = sc.next_stamp()
        sc.marks.fill(-1)
        cnt_idx = np.zeros((G, G), np.int64)
        cnt_emb = np.zeros((G, G), np.int64)
        touched_node = np.zeros(M, np.int64)
        pooled = tp.table.kind == "pooled"
        torchrec = self.model.torchrec
        # TorchRec de-duplicates sequence tables only (index de-duplication of the EC sharder)
        dedup = self.model.dedup and not (torchrec and pooled)
        args = (ids, lens, B, M, tp.table.num_rows, r.keys, r.vals, r.used, r.lg, r.cold_kind,
                r.gpus, r.bounds, r.seed, dedup, pooled, sc.set_tab, stamp, self.touch[feat],
                sc.dp_tab, sc.marks, cnt_idx, cnt_emb, touched_node)
        host = None
        if tp.has_host_tier:  # the kernel counts host lookups (compiled apart)
            host = self.host_cnt
            host.fill(0)
            tg = table_traffic(*args, tp.hbm_fraction, host, torchrec)
        elif torchrec or r.col_gpus is not None:
            tg = table_traffic(*args, None, None, torchrec, r.col_gpus)
        else:
            tg = table_traffic(*args)
        if tg < 0:  # an ID out of range: the kernel stopped; name it (nothing was counted)
            validate_batch(it, self.configs)
            raise BatchError(f"ID {int(ids[-tg - 1])} out of range", feature=feat,
                             field="values", position=int(-tg - 1))
        return _TableCounts(cnt_idx, cnt_emb, touched_node, tg, host)


class _TorchRecDense:
    """The ``torchrec`` profile's collectives that do not depend on the IDs, as G x G matrices
    per TorchRec component (built once per :func:`evaluate_trace` call), and which tables'
    IDs are distributed (``counted``, by table name)."""

    def __init__(self, plan: Plan, workload: Workload):
        topo = plan.topology
        self.terms = TorchRecTerms.of(plan, workload)
        self.parts = {c: s.matrix(topo) for c, s in self.terms.parts.items()}
        self.index = self.parts["input_splits"] + self.parts["input_lengths"]
        self.forward = self.parts["pooled_all_to_all"] + self.parts["pooled_reduce_scatter"]
        self.counted = dict(zip(plan.tables, self.terms.counted.tolist()))


@dataclass
class _IterationTraffic:
    """One iteration's traffic, one field per component: index messages and embeddings as G x G
    byte matrices ``[sender, receiver]`` (the backward all-to-all is the forward transposed),
    replica-sync bytes (``s_global`` over all GPUs, ``s_node[m]`` over the copies of local GPU
    ``m``), host-memory lookups and UVM bytes per owner GPU. Under ``torchrec`` (``dense`` set) the
    ID-dependent TorchRec collectives are kept apart (``values``: the KJT values; ``rows``: the
    sequence all-to-all) and added to ``dense``'s. A new component is a field, a step in
    :meth:`add_table` and its share of :meth:`cost`."""

    index: np.ndarray
    forward: np.ndarray
    s_global: float
    s_node: np.ndarray
    host_lookups: np.ndarray
    uvm_bytes: np.ndarray
    dense: _TorchRecDense | None = None

    @classmethod
    def zeros(cls, G: int, M: int, dense: _TorchRecDense | None = None) -> "_IterationTraffic":
        """No traffic (but ``dense``'s, when given), for ``G`` GPUs, ``M`` per node."""
        s_global = dense.terms.allreduce_bytes if dense is not None else 0.0
        return cls(np.zeros((G, G)), np.zeros((G, G)), s_global, np.zeros(M), np.zeros(G),
                   np.zeros(G), dense)

    def add_table(self, tp: TablePlan, c: _TableCounts, model: CostModel,
                  width: float | np.ndarray) -> None:
        """Add one table's counts, in bytes (``width``: bytes of one row from each owner,
        :func:`_width_bytes`)."""
        wb = width[:, None] if isinstance(width, np.ndarray) else width
        if c.host is not None:
            self.host_lookups += c.host
            self.uvm_bytes += c.host * float(tp.table.embedding_bytes + 2 * tp.table.row_bytes)
        if self.dense is not None:     # index: the KJT values; forward: sequence rows
            self.index += c.index * float(model.index_bytes)
            if tp.table.kind == "sequence":
                self.forward += c.index.T * wb
            return
        eb = float(tp.table.embedding_bytes)
        self.index += c.index * float(model.index_bytes)
        self.forward += c.embeddings.T * wb          # embeddings flow owner -> requester
        self.s_global += c.global_touched * eb
        self.s_node += c.touched_node * eb

    def matrices(self) -> dict[str, np.ndarray]:
        """The all-to-all byte matrices by component (gradients flow requester -> owner); under
        ``torchrec`` also one per TorchRec collective (forward direction)."""
        if self.dense is None:
            return {"index": self.index, "forward": self.forward, "backward": self.forward.T}
        d = self.dense
        fwd = d.forward + self.forward
        return {"index": d.index + self.index, "forward": fwd, "backward": fwd.T,
                **d.parts, "input_values": self.index, "sequence_all_to_all": self.forward}

    def cost(self, topo: Topology, model: CostModel, masks, row_bytes: np.ndarray,
             host_bytes: np.ndarray) -> tuple[Cost, np.ndarray]:
        """The iteration's :class:`Cost` and its replica-sync byte matrix."""
        G, M = topo.num_gpus, topo.gpus_per_node
        mats = self.matrices()
        a2a = {c: _by_class_from_matrix(mats[c], masks) for c in A2A_COMPONENTS}
        ss, sr, st, smat = _sync_traffic(topo, self.s_global, self.s_node, model,
                                          want_matrix=True)
        sync_buf = np.full(G, self.s_global) + self.s_node[np.arange(G) % M]
        excess, coll = 0.0, None
        if self.dense is not None:
            excess = self.dense.terms.reduce_scatter_excess
            coll = {c: float(mats[c].sum()) for c in TORCHREC_COMPONENTS[:-1]}
            coll["data_parallel_all_reduce"] = G * self.s_global
        cost = _finish(topo, a2a, (ss, sr, st), sync_buf, row_bytes, model, None, "trace",
                       (self.host_lookups, self.uvm_bytes, host_bytes), excess, coll, mats)
        return cost, smat


class _TraceSums:
    """Running sums of the iterations' costs (per component, per GPU), their per-iteration
    series, the peak buffers and, with ``keep_matrices``, every iteration's byte matrices."""

    SERIES = ("a2a_bytes", "intra_node_bytes", "inter_node_bytes", "sync_bytes", "comm_time_s",
              "peak_memory_bytes", "host_lookups", "uvm_time_s")

    def __init__(self, G: int, keep_matrices: bool):
        self.n = 0
        self.G = G
        self.send = {c: np.zeros((G, 3)) for c in COMPONENTS}
        self.recv = {c: np.zeros((G, 3)) for c in COMPONENTS}
        self.time = {c: 0.0 for c in COMPONENTS}
        self.mat: dict[str, np.ndarray] = {}
        self.coll: dict[str, float] = {}
        self.peak_buf = np.zeros(G)
        self.host = np.zeros(G)
        self.uvm = np.zeros(G)
        self.series: dict[str, list[float]] = {k: [] for k in self.SERIES}
        self.per_iteration: list[dict[str, np.ndarray]] | None = [] if keep_matrices else None

    def add(self, cost: Cost, traffic: _IterationTraffic, sync_matrix: np.ndarray) -> None:
        """One iteration: its cost, its traffic (host lookups, UVM bytes, matrices) and its
        replica-sync byte matrix."""
        self.host += traffic.host_lookups
        self.uvm += traffic.uvm_bytes
        for c in COMPONENTS:
            self.send[c] += cost.send[c]
            self.recv[c] += cost.recv[c]
            self.time[c] += cost.time_s[c]
        for c, v in cost.collectives.items():
            self.coll[c] = self.coll.get(c, 0.0) + v
        mats = {**traffic.matrices(), "sync": sync_matrix}
        for c, m in mats.items():
            if c not in self.mat:
                self.mat[c] = np.zeros((self.G, self.G))
            self.mat[c] += m
        if self.per_iteration is not None:
            self.per_iteration.append(mats)
        self.peak_buf = np.maximum(self.peak_buf, cost.buffer_bytes)
        for k, v in (("a2a_bytes", cost.a2a_bytes), ("intra_node_bytes", cost.intra_node_bytes),
                     ("inter_node_bytes", cost.inter_node_bytes), ("sync_bytes", cost.sync_bytes),
                     ("comm_time_s", cost.comm_time_s),
                     ("peak_memory_bytes", cost.peak_memory_bytes),
                     ("host_lookups", cost.host_lookups_total), ("uvm_time_s", cost.uvm_time_s)):
            self.series[k].append(v)
        self.n += 1

    def result(self, topo: Topology, model: CostModel, row_bytes: np.ndarray,
               host_bytes: np.ndarray, dropped: int) -> TraceCost:
        """The mean :class:`Cost` per iteration, the series and the matrices kept."""
        k = max(self.n, 1)
        G = topo.num_gpus
        mats = {c: self.mat.get(c, np.zeros((G, G))) / k for c in COMPONENTS}
        mats.update({c: m / k for c, m in self.mat.items() if c not in mats})
        mean = Cost(topo, {c: self.send[c] / k for c in COMPONENTS},
                    {c: self.recv[c] / k for c in COMPONENTS},
                    {c: self.time[c] / k for c in COMPONENTS},
                    row_bytes, self.peak_buf, model.reservation_bytes, mats, iterations=self.n,
                    mode="trace", dedup=model.dedup, host_lookups=self.host / k,
                    uvm_bytes=self.uvm / k, host_bytes=host_bytes, profile=model.profile,
                    collectives={c: v / k for c, v in self.coll.items()})
        return TraceCost(mean, {k2: np.asarray(v) for k2, v in self.series.items()},
                         self.per_iteration, dropped)


# ----------------------------------------------------------------------------- analytic mode
_TOPS: list = []   # one entry: (key, the summaries, (offsets, IDs, probabilities))


def _sorted_tops(sums: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The summaries' top rows concatenated, sorted by ID within each table (the analytic kernel
    merges them with the plan's sorted special rows), with their access probabilities. Cached
    for the last list of summaries: the planner prices many plans against the same ones."""
    key = tuple((id(s), s.total, s.top_ids.size) for s in sums)
    entry = _TOPS[0] if _TOPS else None   # one read: other threads may replace the entry
    if entry is not None and entry[0] == key:
        return entry[2]
    usual = all(s.top_ids.dtype == np.int64 and s.top_est.dtype == np.float64
                and s.top_ids.ndim == 1 and s.top_est.shape == s.top_ids.shape for s in sums)
    val = _tops_together(sums) if usual and sums else _tops_one_by_one(sums)
    _TOPS[:] = [(key, list(sums), val)]   # the summaries are kept, so their ids are not reused
    return val


def _tops_one_by_one(sums: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_sorted_tops` summary by summary (any dtypes)."""
    ids, ps, off = [], [], [0]
    for s in sums:
        o = np.argsort(s.top_ids, kind="stable")
        ids.append(s.top_ids[o])
        ps.append(s.top_est[o] / s.total if s.total else np.zeros(s.top_ids.size))
        off.append(off[-1] + s.top_ids.size)
    return (np.asarray(off, np.int64),
            np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64),
            np.concatenate(ps).astype(np.float64) if ps else np.zeros(0))


def _tops_together(sums: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_sorted_tops` of int64 IDs and float64 estimates: the same sort (stable, per
    summary) and divisions, on the concatenated rows (one Numba call, ``segment_argsort``,
    and a few array operations instead of a few per summary)."""
    off = np.zeros(len(sums) + 1, np.int64)
    np.cumsum([s.top_ids.size for s in sums], out=off[1:])
    sizes = np.diff(off)
    ids = np.concatenate([s.top_ids for s in sums])
    order = np.empty(ids.size, np.int64)
    segment_argsort(ids, off, order)
    totals = np.array([s.total for s in sums], np.float64)
    seen = totals != 0
    p = np.concatenate([s.top_est for s in sums])[order] / np.repeat(
        np.where(seen, totals, 1.0), sizes)
    p[np.repeat(~seen, sizes)] = 0.0
    return off, ids[order], p


def evaluate_analytic(plan: Plan, summaries: Mapping[str, FrequencySummary],
                      batch_size: int | None = None, model: CostModel | None = None, *,
                      mean_lengths: Mapping[str, float] | None = None,
                      want_matrices: bool | None = None,
                      workload: Workload | None = None,
                      summary_arrays: AnalyticSummaries | None = None,
                      top_rows: "TopRowCache | None" = None) -> Cost:
    """Expected cost per iteration from frequency summaries (keyed by table name or feature).

    The workload: ``workload=`` (B, cost model, mean lengths), or ``batch_size`` (B, samples per
    GPU per iteration), ``model`` (default ``CostModel()``) and ``mean_lengths`` (IDs per sample
    per table, default the summaries'); :func:`~.workload.workload_of`.

    Per row ``r``: ``lambda_r = G * B * L * p_r`` expected lookups per iteration, spread evenly over
    the GPUs. With de-duplication GPU ``src`` requests row ``r`` with probability
    ``1 - exp(-lambda_r / G)``; without, ``lambda_r / G`` times. Tail rows (beyond the summary's top)
    share the tail mass evenly and are spread over the cold GPUs in proportion to the rows each
    holds. Pooled tables send one partial sum per (sample, owner) pair: ``B * (1 - exp(-L * q_dst))``
    with ``q_dst`` the probability mass owned by ``dst``. All tables go through one Numba call
    (``kernels/analytic.py``, fed named arrays: :func:`_kernel_inputs`); matrices are built only
    for G <= 512 (or when asked), the per-GPU sums come from closed forms in O(G) per table.

    Host memory tier: a host row ``r`` owned by ``g`` adds ``G * (1 - exp(-lambda_r / G))`` host
    lookups at ``g`` with de-duplication (every GPU, ``g`` included, requests it), ``lambda_r``
    without; explicit top rows by their own hash test, tail rows with probability ``1 - f[g]``.

    ``summary_arrays``: :func:`analytic_summaries` of the plan's tables in plan order, the
    summaries and the workload, computed once by a caller pricing many plans of the same tables;
    ``top_rows``: a :class:`TopRowCache` of those arrays, which keeps what every plan of them
    shares (each top row's requests, its cold owner under the plan's layouts).

    Under ``torchrec`` the same kernel gives the expected IDs each GPU sends each owner (every GPU
    alike, its own share included) and the sequence rows returned, and
    :class:`~flexshard_stream.placement.profiles.TorchRecTerms` the collectives that do not
    depend on the IDs (:func:`_assemble_torchrec`).
    """
    work = workload_of(batch_size, model, mean_lengths, workload, where="evaluate_analytic")
    model = work.model
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    want = G <= 512 if want_matrices is None else want_matrices
    want = want or model.alltoall == "pairwise"     # gloo's rounds are priced on the matrices
    if want:
        check_matrix_size(topo, "evaluate_analytic(want_matrices=True)")
    kplan, ksums, khost, out = _kernel_inputs(plan, summaries, work, summary_arrays)
    top = (top_rows if top_rows is not None else TopRowCache()).rows(G, kplan, ksums, work)
    s_global = analytic_traffic(G, M, float(work.batch_size), model.dedup, model.torchrec, kplan,
                                ksums, khost, out, top)
    host = (out.host_lk, out.uvm_b, plan.host_bytes_per_gpu)
    if model.torchrec:
        return _assemble_torchrec(plan, work, out.idx_cold, out.emb_cold, host, want)
    ib = float(model.index_bytes)
    idx_node_g = out.idx_node[np.arange(G) % M]
    a2a = {"index": _structured(topo, out.idx_cold * ib, idx_node_g * ib),
           "forward": _structured(topo, out.emb_cold, out.emb_node, transpose=True),
           "backward": _structured(topo, out.emb_cold, out.emb_node)}
    matrices = None
    if want:
        matrices = {"index": _structured_matrix(topo, out.idx_cold * ib, idx_node_g * ib),
                    "backward": _structured_matrix(topo, out.emb_cold, out.emb_node)}
        matrices["forward"] = matrices["backward"].T.copy()
    ss, sr, st, smat = _sync_traffic(topo, s_global, out.s_node, model, want_matrix=want)
    if matrices is not None:
        matrices["sync"] = smat
    sync_buf = np.full(G, s_global) + out.s_node[np.arange(G) % M]
    return _finish(topo, a2a, (ss, sr, st), sync_buf, plan.row_bytes_per_gpu, model, matrices,
                   "analytic", host)


def analytic_summaries(tables: Sequence[EmbeddingTable],
                       summaries: Mapping[str, FrequencySummary], workload: Workload
                       ) -> AnalyticSummaries:
    """The summaries side of the analytic kernel for ``tables`` in this order (top rows sorted by
    ID, tail probabilities and rows, the workload's mean lengths): what every plan of these
    tables is priced against, so a planner computes it once (``evaluate_analytic``'s
    ``summary_arrays``)."""
    T = len(tables)
    tail_p, tail_rows, mean_len = np.zeros(T), np.zeros(T), np.zeros(T)
    by_name = summaries_by_table(tables, summaries)
    sums = []
    for i, t in enumerate(tables):
        s = by_name[t.name]
        sums.append(s)
        tail_p[i] = s.tail_probability()
        tail_rows[i] = s.tail_rows if s.total else 0.0
        mean_len[i] = workload.mean_length(t.name, s)
    return AnalyticSummaries(*_sorted_tops(sums), tail_p, tail_rows, mean_len)


class TopRowCache:
    """The per-top-row arrays of ``kernels/analytic.analytic_traffic`` (:data:`AnalyticTopRows`)
    for one :func:`analytic_summaries` (one table order), kept for the plans priced against it:
    the requests of each top row (per GPU count, workload and tables' kinds: every plan of a
    planning run shares them) and its cold owner (per set of cold layouts: the candidates on
    row-wise ranges share row-wise's). The last :attr:`KEEP` layout sets are kept (int32, one
    per top row each). The arrays are the kernel's own per-row values, so a plan costs the same,
    bit for bit, with or without the cache."""

    KEEP = 4

    def __init__(self) -> None:
        self._requests: dict[tuple, np.ndarray] = {}
        self._owners: dict[tuple, np.ndarray] = {}

    def rows(self, G: int, kplan: AnalyticPlan, ksums: AnalyticSummaries,
             workload: Workload) -> AnalyticTopRows:
        """The arrays for a plan on ``G`` GPUs (its kernel inputs ``kplan``, the summaries'
        ``ksums``) under ``workload``."""
        model = workload.model
        B = float(workload.batch_size)
        rkey = (G, B, model.dedup, model.torchrec, kplan.pooled.tobytes())
        rq = self._requests.get(rkey)
        if rq is None:
            rq = np.empty(ksums.top_ids.size)
            top_requests(G, B, model.dedup, model.torchrec, kplan.pooled, ksums, rq)
            self._requests = {rkey: rq}   # one workload and topology per planning run
        okey = tuple(np.ascontiguousarray(a).tobytes() for a in (
            kplan.layout, kplan.num_rows, kplan.lay_kind, kplan.lay_off, kplan.lay_gpus,
            kplan.lay_boff, kplan.lay_bounds, kplan.lay_seed))
        dst = self._owners.pop(okey, None)
        if dst is None:
            dst = np.empty(ksums.top_ids.size, np.int32)
            top_destinations(kplan, ksums, dst)
            while len(self._owners) >= self.KEEP:
                self._owners.pop(next(iter(self._owners)))
        self._owners[okey] = dst   # most recently used last
        return AnalyticTopRows(rq, dst)


def _kernel_inputs(plan: Plan, summaries: Mapping[str, FrequencySummary], workload: Workload,
                   summary_arrays: AnalyticSummaries | None = None
                   ) -> tuple[AnalyticPlan, AnalyticSummaries, AnalyticHostTier,
                              AnalyticOutputs]:
    """The named arrays ``kernels/analytic.analytic_traffic`` reads (the plan's layout, the
    summaries in plan order with the workload's mean lengths: ``summary_arrays`` when given,
    the host tier) and the zeroed outputs it accumulates into."""
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    f = plan.flat
    kplan = AnalyticPlan(*(f[k] for k in AnalyticPlan._fields))
    ksums = summary_arrays if summary_arrays is not None else analytic_summaries(
        [tp.table for tp in plan.tables.values()], summaries, workload)
    khost = AnalyticHostTier(f["hf_off"], f["hf"], f["uvm_lookup_bytes"])
    out = AnalyticOutputs(np.zeros(G), np.zeros(M), np.zeros(G), np.zeros(G), np.zeros(M),
                          np.zeros(G), np.zeros(G))
    return kplan, ksums, khost, out


def _assemble_torchrec(plan: Plan, workload: Workload, values: np.ndarray, rows: np.ndarray,
                       host: tuple, want: bool) -> Cost:
    """The analytic :class:`Cost` under ``torchrec``: ``values[g]`` IDs and ``rows[g]`` sequence
    row bytes every GPU exchanges with owner ``g`` (``analytic_traffic``), plus the collectives
    that do not depend on the IDs."""
    model = workload.model
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    terms = TorchRecTerms.of(plan, workload)
    z = np.zeros(G)
    parts = {**terms.parts,
             "input_values": Structured(values * float(model.index_bytes), z, z, z),
             "sequence_all_to_all": Structured(z, rows, z, z)}
    index = _sum_structured([parts[c] for c in ("input_splits", "input_lengths", "input_values")])
    forward = _sum_structured([parts[c] for c in ("pooled_all_to_all", "pooled_reduce_scatter",
                                                  "sequence_all_to_all")])
    fs, fr = forward.by_class(topo)
    a2a = {"index": index.by_class(topo), "forward": (fs, fr), "backward": (fr, fs)}
    S = terms.allreduce_bytes
    ss, sr, st, smat = _sync_traffic(topo, S, np.zeros(M), model, want_matrix=want)
    matrices = None
    if want:
        matrices = {c: p.matrix(topo) for c, p in parts.items()}
        matrices["index"] = index.matrix(topo)
        matrices["forward"] = forward.matrix(topo)
        matrices["backward"] = matrices["forward"].T.copy()
        matrices["sync"] = smat
    coll = {c: p.total(topo) for c, p in parts.items()}
    coll["data_parallel_all_reduce"] = G * S
    return _finish(topo, a2a, (ss, sr, st), np.full(G, S), torchrec_row_bytes(plan), model,
                   matrices, "analytic", host, terms.reduce_scatter_excess,
                   {c: coll[c] for c in TORCHREC_COMPONENTS})


def _sum_structured(parts: list[Structured]) -> Structured:
    """The sum of structured byte matrices (part by part)."""
    return Structured(sum(p.to for p in parts), sum(p.from_ for p in parts),
                      sum(p.node for p in parts), sum(p.peer for p in parts))


def _structured(topo: Topology, c: np.ndarray, cn: np.ndarray, transpose: bool = False):
    """Per-GPU (send, recv) by class for the matrix ``A[src, dst] = c[dst]`` (src != dst) plus
    ``cn[dst]`` for src != dst in the same node; transposed for the forward direction."""
    G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
    g = np.arange(G)
    node = g // M
    node_sum = c.reshape(N, M).sum(axis=1)
    cn_sum = cn.reshape(N, M).sum(axis=1)
    total = c.sum()
    # requester side (sends requests / index; receives embeddings in forward)
    req_intra = node_sum[node] - c + cn_sum[node] - cn
    req_inter = total - node_sum[node]
    # owner side
    own_intra = (M - 1) * (c + cn)
    own_inter = (G - M) * c
    z = np.zeros(G)
    requester = np.stack([z, req_intra, req_inter], axis=1)
    owner = np.stack([z, own_intra, own_inter], axis=1)
    return (owner, requester) if transpose else (requester, owner)


def _structured_matrix(topo: Topology, c: np.ndarray, cn: np.ndarray) -> np.ndarray:
    G, M = topo.num_gpus, topo.gpus_per_node
    m = np.tile(c, (G, 1))
    node = np.arange(G) // M
    same = node[:, None] == node[None, :]
    m = m + same * cn[None, :]
    np.fill_diagonal(m, 0.0)
    return m
