"""TorchRec as a real runtime: sharded runs on CPU and the bytes of every collective they issue.

:func:`run_sharded` spawns a gloo world (``world_size`` processes, ``local_world_size`` per
"node"), shards a model of :class:`~flexshard_stream.plans.tables.EmbeddingTable` rows with
TorchRec 1.8's ``DistributedModelParallel`` under an explicit plan (:class:`TableSharding` per
table, or one of our :class:`~flexshard_stream.plans.plan.Plan` where TorchRec can express it),
runs forward and backward on given batches and returns the outputs, the gradients and every
collective the ranks issued (:class:`CollectiveCounter`), counted at the process group.
:func:`run_unsharded` runs the same batches through the unsharded modules for comparison, and
:func:`expected_collectives` gives the bytes TorchRec's code sends, from the batch alone
(docs/TORCHREC_RUNTIME.md derives each formula from TorchRec's source).

Importing this module does not import torch: the functions that need it import
:mod:`flexshard_stream.bridge.world` (torch, torchrec) when called, and raise
``ImportError`` naming the ``torchrec`` extra when it is missing.
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..optional import import_optional
from ..plans.plan import Plan
from ..plans.tables import EmbeddingTable
from ..stats.batch import Batch, slice_batch
from .export import TorchRecExport, load_torchrec_export
from .jobs import (
    CaseJob,
    CollectiveRecord,
    RankJob,
    RankResult,
    RunError,
    upstream_gradient,
)
from .sharding import (
    CPU_SHARDING_TYPES,
    OPENED_SHARDING_TYPES,
    SHARDING_TYPES,
    TORCH_MODULE,
    TableSharding,
    table_shardings,
    torchrec_column_block,
    torchrec_row_blocks,
)

__all__ = ["SHARDING_TYPES", "CPU_SHARDING_TYPES", "OPENED_SHARDING_TYPES", "TableSharding",
           "table_shardings", "sharding_plan", "CollectiveRecord", "CollectiveCounter",
           "expected_collectives", "RunResult", "RunError", "run_sharded", "run_sharded_cases",
           "run_unsharded", "initial_weights", "upstream_gradient", "torchrec_row_blocks",
           "torchrec_column_block", "CaseJob", "RankJob", "RankResult", "TORCH_MODULE",
           "export_shardings", "expected_export_collectives", "compare_components",
           "trace_workload", "TRACE_DATASETS"]

_DTYPES = ("int64", "int32")















def _torchrec_world():
    """The torch side (:mod:`~flexshard_stream.bridge.world`), through the one gate."""
    return import_optional("flexshard_stream.bridge.world", extra="torchrec",
                           purpose="a TorchRec run (the runtime harness)")


def sharding_plan(plan: Plan | Mapping[str, TableSharding | str],
                  tables: Sequence[EmbeddingTable] | None = None, *,
                  world_size: int | None = None, local_world_size: int | None = None) -> Any:
    """A TorchRec ``ShardingPlan`` to pass as ``DistributedModelParallel(plan=...)``.

    Each table gets a ``ParameterSharding`` with its ranks and shard offsets, built with
    TorchRec's own generators, so that TorchRec's planner does not choose anything. Pooled tables
    sit under the module path ``"ebc"``, sequence tables under ``"ec"`` (the model of
    :func:`run_sharded`); ``plan.plan[path][table]`` is the per-table entry for another model.

    Parameters
    ----------
    plan : Plan or mapping
        As in :func:`table_shardings`.
    tables : sequence of EmbeddingTable, optional
        Required with a mapping; a Plan carries its own.
    world_size, local_world_size : int, optional
        Ranks, and ranks per node; a Plan's topology gives them.
    """
    tables, world_size, local_world_size = _resolve_world(plan, tables, world_size,
                                                          local_world_size)
    shardings = table_shardings(plan, tables)
    for t in tables:
        shardings[t.name].check(t, world_size, local_world_size)
    return _torchrec_world().module_sharding_plan(tables, shardings, world_size, local_world_size)


def _resolve_world(plan: Any, tables: Sequence[EmbeddingTable] | None, world_size: int | None,
                   local_world_size: int | None) -> tuple[list[EmbeddingTable], int, int]:
    if isinstance(plan, Plan):
        tables = tables or [tp.table for tp in plan.tables.values()]
        world_size = world_size or plan.topology.num_gpus
        local_world_size = local_world_size or plan.topology.gpus_per_node
    if tables is None or world_size is None or local_world_size is None:
        raise ConfigError("give tables, world_size and local_world_size (or a Plan)")
    if world_size < 1 or local_world_size < 1 or world_size % local_world_size:
        raise ConfigError(f"world_size {world_size} must be a positive multiple of "
                          f"local_world_size {local_world_size}")
    return list(tables), int(world_size), int(local_world_size)




_KEYS = ("rank", "op", "component", "phase", "iteration", "dtype")


class CollectiveCounter:
    """The collectives of a run (:class:`CollectiveRecord`), with selections and exact totals.

    Parameters
    ----------
    records : iterable of CollectiveRecord
    """

    def __init__(self, records: Iterable[CollectiveRecord] = ()):
        self.records: list[CollectiveRecord] = list(records)

    def __len__(self) -> int:
        return len(self.records)

    def select(self, **where: Any) -> "CollectiveCounter":
        """The records whose attributes equal the given values (a tuple or set: any of them),
        e.g. ``select(phase="forward", component=("input_lengths", "input_values"))``."""
        bad = set(where) - set(_KEYS)
        if bad:
            raise ConfigError(f"cannot select on {sorted(bad)}; fields: {list(_KEYS)}")

        def keep(r: CollectiveRecord) -> bool:
            for k, v in where.items():
                got = getattr(r, k)
                if isinstance(v, (tuple, set, frozenset, list)) and got not in v:
                    return False
                if not isinstance(v, (tuple, set, frozenset, list)) and got != v:
                    return False
            return True
        return CollectiveCounter(r for r in self.records if keep(r))

    def iterations(self) -> "CollectiveCounter":
        """The records of forward and backward passes (no setup or teardown)."""
        return self.select(phase=("forward", "backward"))

    def totals(self, by: Sequence[str] = ("component", "phase", "op"),
               value: str = "input_bytes") -> dict[tuple, int]:
        """Sum of ``value`` (a record attribute or property, e.g. ``remote_send_bytes``) per
        combination of the ``by`` fields, as exact integers."""
        out: dict[tuple, int] = defaultdict(int)
        for r in self.records:
            out[tuple(getattr(r, k) for k in by)] += int(getattr(r, value))
        return dict(out)

    def send_matrix(self, world_size: int) -> np.ndarray:
        """int64[world_size, world_size]: bytes each rank's inputs destined to each rank
        (all-to-all, reduce-scatter and all-gather; all-reduce and broadcast are left out)."""
        m = np.zeros((world_size, world_size), np.int64)
        for r in self.records:
            for dst, b in zip(r.group, r.send_bytes):
                m[r.rank, dst] += b
        return m

    def component_bytes(self) -> dict[str, int]:
        """Bytes per component, summed over ranks, as the cost model's ``torchrec`` profile
        prices them: every collective but all-reduce, the bytes of each rank's input destined to
        each member of its group (itself included), forward only (an output's backward moves the
        same bytes back); ``data_parallel_all_reduce``, the float32 buffers all-reduced (DDP's
        first-iteration int32 bookkeeping left out). Select the iterations first
        (``select(iteration=...)``); divide by their number for a per-iteration figure."""
        out: dict[str, int] = defaultdict(int)
        for r in self.records:
            if r.op == "all_reduce":
                if r.dtype == "float32":
                    out[r.component] += r.input_bytes
            elif r.phase == "forward":
                out[r.component] += sum(r.send_bytes)
        return dict(out)

    def mean_component_bytes(self) -> dict[str, float]:
        """:meth:`component_bytes` per iteration, averaged over the iterations the records
        hold (setup and teardown left out): what the cost model prices per iteration."""
        its = sorted({r.iteration for r in self.records if r.iteration is not None})
        per = [self.select(iteration=it).component_bytes() for it in its]
        comps = set().union(*per) if per else set()
        return {c: float(np.mean([p.get(c, 0) for p in per])) for c in sorted(comps)}

    def summary(self) -> dict[tuple, tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
        """Per (rank, group, op, component, phase, dtype): the summed input and output bytes and
        the element-wise summed ``send_bytes`` and ``recv_bytes``. Two runs (or a run and
        :func:`expected_collectives`) moved the same bytes in the same collectives iff their
        summaries are equal; it ignores how DDP buckets its all-reduce."""
        out: dict[tuple, list] = {}
        for r in self.records:
            key = (r.rank, r.group, r.op, r.component, r.phase, r.dtype)
            acc = out.setdefault(key, [0, 0, (0,) * len(r.send_bytes), (0,) * len(r.recv_bytes)])
            acc[0] += r.input_bytes
            acc[1] += r.output_bytes
            acc[2] = tuple(a + b for a, b in zip(acc[2], r.send_bytes))
            acc[3] = tuple(a + b for a, b in zip(acc[3], r.recv_bytes))
        return {k: tuple(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- the formulas
_INT_BYTES = {"int64": 8, "int32": 4}
_EMB_BYTES = 4      # fp32 embeddings and gradients
_WEIGHT_BYTES = 4   # per-sample weights are float32
_SPLIT_BYTES = 8    # the KJT splits all-to-all sends Python ints as int64


@dataclass(frozen=True)
class _Slot:
    """One shard a rank serves: the feature's IDs in rows ``[lo, hi)`` come to ``rank``, which
    looks them up in ``dim`` columns."""

    table: EmbeddingTable
    rank: int
    dim: int
    lo: int
    hi: int


def _slots(t: EmbeddingTable, sh: TableSharding, world_size: int,
           local_world_size: int) -> list[_Slot]:
    """The shards of ``t`` as TorchRec lays them out (:meth:`TableSharding.shards`)."""
    return [_Slot(t, s.rank, s.sizes[1], s.offsets[0], s.offsets[0] + s.sizes[0])
            for s in sh.shards(t, world_size, local_world_size)]


@dataclass
class _Group:
    """The tables of one module (pooled or sequence) with one sharding type: one TorchRec
    ``EmbeddingSharding``, with its own input dist and output dist."""

    kind: str
    sharding_type: str
    slots: list[_Slot]
    local_batches: list[Batch]
    world_size: int
    local_world_size: int

    @property
    def batch_size(self) -> int:
        return self.local_batches[0].batch_size

    def ids(self, rank: int, s: _Slot) -> int:
        """IDs of rank ``rank``'s local batch that go to slot ``s``."""
        v = self.local_batches[rank].feature_values(s.table.feature)
        return int(np.count_nonzero((v >= s.lo) & (v < s.hi)))

    def to(self, dst: int) -> list[_Slot]:
        return [s for s in self.slots if s.rank == dst]


def _record(rank: int, group: Sequence[int], op: str, component: str, phase: str, dtype: str,
            send: Sequence[int], recv: Sequence[int], elem: int) -> CollectiveRecord:
    return CollectiveRecord(rank, tuple(group), op, component, phase, None, dtype, elem,
                            int(sum(send)), int(sum(recv)), tuple(int(x) for x in send),
                            tuple(int(x) for x in recv))


def _all_to_all(matrix: np.ndarray, group: Sequence[int], component: str, phase: str,
                dtype: str, elem: int) -> list[CollectiveRecord]:
    """One all-to-all: ``matrix[i, j]`` bytes from the i-th to the j-th member of ``group``."""
    return [_record(r, group, "all_to_all", component, phase, dtype, matrix[i], matrix[:, i], elem)
            for i, r in enumerate(group)]


def _input_dist(g: _Group, values_dtype: str, lengths_dtype: str,
                weighted: bool) -> list[CollectiveRecord]:
    """The KJT all-to-all of one sharding (``dist_data.py`` ``KJTAllToAll``): the splits
    (``KJTAllToAllSplitsAwaitable``), then lengths, values and weights
    (``KJTAllToAllTensorsAwaitable``, ``KeyedJaggedTensor.dist_splits``)."""
    w, world = g.world_size, range(g.world_size)
    k = 3 + int(weighted)                   # lengths, values, [weights,] stride
    out = _all_to_all(np.full((w, w), k * _SPLIT_BYTES, np.int64), world, "input_splits",
                      "forward", "int64", _SPLIT_BYTES)
    ids = np.array([[sum(g.ids(r, s) for s in g.to(j)) for j in world] for r in world], np.int64)
    lengths = np.array([[g.batch_size * len(g.to(j)) for j in world] for _ in world], np.int64)
    le, ve = _INT_BYTES[lengths_dtype], _INT_BYTES[values_dtype]
    out += _all_to_all(lengths * le, world, "input_lengths", "forward", lengths_dtype, le)
    out += _all_to_all(ids * ve, world, "input_values", "forward", values_dtype, ve)
    if weighted:
        out += _all_to_all(ids * _WEIGHT_BYTES, world, "input_weights", "forward", "float32",
                           _WEIGHT_BYTES)
    return out


def _output_all_to_all(g: _Group) -> list[CollectiveRecord]:
    """Table-wise, column-wise (pooled and sequence) and row-wise sequence outputs: owner ``o``
    sends rank ``r`` its pooled ``[B, d]`` block (``PooledEmbeddingsAllToAll``, comm_ops
    ``alltoall_pooled``) or the ``[n, d]`` rows of r's IDs (``SequenceEmbeddingsAllToAll``,
    ``alltoall_sequence``); the backward pass sends the gradients back the same way."""
    world = range(g.world_size)
    if g.kind == "pooled":
        per = [[g.batch_size * s.dim for s in g.to(o)] for o in world]
        m = np.array([[sum(per[o]) for _ in world] for o in world], np.int64)
    else:
        m = np.array([[sum(g.ids(r, s) * s.dim for s in g.to(o)) for r in world] for o in world],
                     np.int64)
    comp = f"{g.kind}_all_to_all"
    m *= _EMB_BYTES
    return (_all_to_all(m, world, comp, "forward", "float32", _EMB_BYTES)
            + _all_to_all(m.T.copy(), world, comp, "backward", "float32", _EMB_BYTES))


def _reduce_scatter(group: Sequence[int], chunks: Sequence[int], component: str
                    ) -> list[CollectiveRecord]:
    """A reduce-scatter (forward) and its backward all-gather in ``group``; member ``i`` holds
    chunks of ``chunks[i]`` bytes (``comm_ops`` ``ReduceScatterBase_Req`` /
    ``ReduceScatterBase_Wait.backward``)."""
    n, out = len(group), []
    for r, c in zip(group, chunks):
        per = (int(c),) * n
        out.append(CollectiveRecord(r, tuple(group), "reduce_scatter", component, "forward", None,
                                    "float32", _EMB_BYTES, n * c, c, per, per))
        out.append(CollectiveRecord(r, tuple(group), "all_gather", component, "backward", None,
                                    "float32", _EMB_BYTES, c, n * c, per, per))
    return out


def _pooled_row_wise(g: _Group) -> list[CollectiveRecord]:
    """Row-wise pooled output (``rw_sharding.py`` ``RwPooledEmbeddingDist``): every rank
    reduce-scatters partial sums for all ``W * B`` samples, a ``[B, D]`` chunk per rank."""
    d = sum(s.table.dim for s in g.slots if s.rank == 0)
    return _reduce_scatter(tuple(range(g.world_size)),
                           [g.batch_size * d * _EMB_BYTES] * g.world_size,
                           "pooled_reduce_scatter")


def _pooled_table_row_wise(g: _Group) -> list[CollectiveRecord]:
    """Table-row-wise pooled output (``twrw_sharding.py`` ``TwRwPooledEmbeddingDist``): a
    reduce-scatter inside each node (partial sums of the ``W * B`` samples, an ``[N * B, D_n]``
    chunk per local rank), then an all-to-all between the ranks of one local index across nodes
    (``[B, D_n]`` to each); backward: the all-to-all reversed, then an all-gather in the node."""
    w, m = g.world_size, g.local_world_size
    n_nodes, b = w // m, g.batch_size
    dim = [sum(s.dim for s in g.slots if s.rank == node * m) for node in range(n_nodes)]
    out = []
    for node in range(n_nodes):
        group = tuple(range(node * m, (node + 1) * m))
        out += _reduce_scatter(group, [n_nodes * b * dim[node] * _EMB_BYTES] * m,
                               "pooled_reduce_scatter")
    for local in range(m):
        group = tuple(range(local, w, m))
        fwd = np.array([[b * dim[i] for _ in group] for i in range(n_nodes)], np.int64)
        fwd *= _EMB_BYTES
        out += _all_to_all(fwd, group, "pooled_all_to_all", "forward", "float32", _EMB_BYTES)
        out += _all_to_all(fwd.T.copy(), group, "pooled_all_to_all", "backward", "float32",
                           _EMB_BYTES)
    return out


def _output_dist(g: _Group) -> list[CollectiveRecord]:
    if g.kind == "pooled" and g.sharding_type == "row_wise":
        return _pooled_row_wise(g)
    if g.kind == "pooled" and g.sharding_type == "table_row_wise":
        return _pooled_table_row_wise(g)
    return _output_all_to_all(g)


def _data_parallel(tables: Sequence[EmbeddingTable], world_size: int) -> list[CollectiveRecord]:
    """DDP's all-reduce of the data-parallel tables' dense gradients, whole tables
    (``model_parallel.py`` ``DefaultDataParallelWrapper``), summed over DDP's buckets."""
    nbytes = sum(t.num_rows * t.dim * _EMB_BYTES for t in tables)
    if not nbytes:
        return []
    return [CollectiveRecord(r, tuple(range(world_size)), "all_reduce", "data_parallel_all_reduce",
                             "backward", None, "float32", _EMB_BYTES, nbytes, nbytes)
            for r in range(world_size)]


def expected_collectives(tables: Sequence[EmbeddingTable],
                         shardings: Plan | Mapping[str, Any], batch: Any, *,
                         world_size: int = 4, local_world_size: int = 2,
                         values_dtype: str = "int64", lengths_dtype: str = "int64",
                         weighted: bool = False) -> CollectiveCounter:
    """The collectives TorchRec 1.8 issues for one iteration on ``batch``, from its source.

    The formulas of docs/TORCHREC_RUNTIME.md, per sharding type, for the model of
    :func:`run_sharded` (fp32 tables, one feature per table, ``world_size`` ranks of
    ``B = batch_size / world_size`` samples). It counts what every rank's input buffer holds for
    every other rank (itself included), so the records match :class:`CollectiveCounter`'s
    :meth:`~CollectiveCounter.summary` of a run from its second iteration on; the first
    iteration also has DDP's static-graph bookkeeping (an int32 all-reduce, 4 bytes per DDP
    parameter), not counted here. Iteration fields are None.

    Parameters
    ----------
    tables, shardings, world_size, local_world_size, values_dtype, lengths_dtype
        As in :func:`run_sharded`.
    batch : Batch or KeyedJaggedTensor
        One global batch.
    weighted : bool
        Pooled inputs carry per-sample weights (one more all-to-all, and a fourth split).
    """
    _check_dtypes(values_dtype, lengths_dtype)
    tables, world_size, local_world_size = _resolve_world(shardings, tables, world_size,
                                                          local_world_size)
    sh = table_shardings(shardings, tables)
    batch = _as_batches([batch], world_size)[0]
    b = batch.batch_size // world_size
    local_batches = [slice_batch(batch, r * b, (r + 1) * b) for r in range(world_size)]
    records: list[CollectiveRecord] = []
    for kind in ("pooled", "sequence"):
        for st in SHARDING_TYPES:
            ts = [t for t in tables if t.kind == kind and sh[t.name].sharding_type == st]
            if not ts or st == "data_parallel":
                continue
            slots = [s for t in ts for s in _slots(t, sh[t.name], world_size, local_world_size)]
            g = _Group(kind, st, slots, local_batches, world_size, local_world_size)
            records += _input_dist(g, values_dtype, lengths_dtype, weighted and kind == "pooled")
            records += _output_dist(g)
    dp = [t for t in tables if sh[t.name].sharding_type == "data_parallel"]
    return CollectiveCounter(records + _data_parallel(dp, world_size))


def compare_components(measured: Mapping[str, float], model: Mapping[str, float]
                       ) -> dict[str, dict[str, float]]:
    """Per component of either: ``measured`` and ``model`` bytes, their ``ratio`` (model /
    measured; 1 when both are 0, inf when only the measurement is 0) and the relative error
    ``err = |model - measured| / measured`` (0 when both are 0)."""
    out = {}
    for comp in sorted(set(measured) | set(model)):
        got, want = float(measured.get(comp, 0.0)), float(model.get(comp, 0.0))
        if got:
            ratio, err = want / got, abs(want - got) / got
        else:
            ratio, err = (1.0, 0.0) if not want else (math.inf, math.inf)
        out[comp] = {"measured": got, "model": want, "ratio": ratio, "err": err}
    return out


def expected_export_collectives(export: TorchRecExport | str | Path, batch: Any, *,
                                values_dtype: str = "int64", lengths_dtype: str = "int64",
                                weighted: bool = False) -> CollectiveCounter:
    """:func:`expected_collectives` of an exported plan on a batch of original IDs: the batch
    remapped as ``KJTRemap`` does (:meth:`TorchRecExport.remap_batch`), the exported tables
    and their shardings (:func:`export_shardings`), the export's world."""
    ex = _as_export(export)
    world = int(ex.manifest["world_size"])
    remapped, _ = ex.remap_batch(_as_batches([batch], world)[0])
    return expected_collectives(ex.new_tables(), export_shardings(ex), remapped,
                                world_size=world,
                                local_world_size=int(ex.manifest["local_world_size"]),
                                values_dtype=values_dtype, lengths_dtype=lengths_dtype,
                                weighted=weighted)


# ----------------------------------------------------------------------------- real traces
#: The features :func:`trace_workload` builds, by dataset of the shared traces.
TRACE_DATASETS: dict[str, tuple[str, ...]] = {
    "movielens": ("ml_movie", "ml_user"), "amazon": ("az_beauty", "az_toys"),
    "criteo": ("C1", "C2", "C3", "C4", "C5")}
_TRACE_SEQUENCES = ("ml_movie", "az_beauty", "az_toys")


def _last_items(values: np.ndarray, lengths: np.ndarray, users: int, keep: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """The last ``keep`` items of each of the first ``users`` users (values, lengths)."""
    offs = np.concatenate([[0], np.cumsum(lengths)])
    parts = [values[offs[u]:offs[u + 1]][-keep:] for u in range(users)]
    return np.concatenate(parts), np.array([p.size for p in parts], np.int64)


def trace_workload(shared_dir: str | Path, samples: int, dim: int = 8
                   ) -> tuple[dict[str, EmbeddingTable], Batch]:
    """Tables and one batch of ``samples`` samples from the shared real traces, the workload of
    the TorchRec runs (tests and ``bench/torchrec_real.py``; :data:`TRACE_DATASETS`).

    IDs are made dense per feature. Sequence features: ``ml_movie`` (a MovieLens user's last 6
    movies), ``az_beauty`` / ``az_toys`` (an Amazon Beauty / Toys user's last 8 items); pooled:
    ``ml_user`` (the user) and ``C1`` .. ``C5`` (Criteo fields, one ID or none per row, modulo
    64). ``shared_dir`` holds ``movielens-latest-small``, ``amazon-reviews-sequences`` and
    ``criteo-1k``; every table has ``dim`` fp32 columns and is fed by the feature of its name.
    """
    from ..sources import datasets

    shared = Path(shared_dir)
    ratings = datasets.movielens_ratings(shared / "movielens-latest-small")
    users = ratings.get_column("user").to_numpy()
    movies = np.unique(ratings.get_column("movie").to_numpy(), return_inverse=True)[1]
    _, per_user = np.unique(users, return_counts=True)
    feats, lens, rows = {}, {}, {}
    feats["ml_movie"], lens["ml_movie"] = _last_items(movies[np.argsort(users, kind="stable")],
                                                      per_user, samples, 6)
    rows["ml_movie"] = int(movies.max()) + 1
    feats["ml_user"], lens["ml_user"] = np.arange(samples) % per_user.size, np.ones(samples,
                                                                                    np.int64)
    rows["ml_user"] = per_user.size
    for key, name in (("az_beauty", "Beauty"), ("az_toys", "Toys_and_Games")):
        v, ln = datasets.amazon_sequences(name, shared / "amazon-reviews-sequences"
                                          / f"{name}.txt")
        feats[key], lens[key] = _last_items(v, ln, samples, 8)
        rows[key] = int(v.max()) + 1
    frame = datasets.criteo_frame(shared / "criteo-1k" / "train.txt")
    for c in TRACE_DATASETS["criteo"]:
        col = frame.get_column(c).to_numpy()[:samples]
        present = ~np.isnan(col.astype(float))
        feats[c] = col[present].astype(np.int64) % 64
        lens[c] = present.astype(np.int64)
        rows[c] = 64
    tables = {f: EmbeddingTable(f, rows[f], dim, kind="sequence" if f in _TRACE_SEQUENCES
                                else "pooled", feature=f) for f in feats}
    return tables, Batch.from_features(feats, lens)


# ----------------------------------------------------------------------------- runs
def initial_weights(tables: Sequence[EmbeddingTable], seed: int = 0) -> dict[str, np.ndarray]:
    """Per table, float32[H, D] weights uniform in ``±sqrt(1 / H)`` (TorchRec's default range),
    drawn from ``numpy.random.default_rng([seed, i])`` for the ``i``-th table."""
    out = {}
    for i, t in enumerate(tables):
        a = math.sqrt(1.0 / t.num_rows)
        rng = np.random.default_rng([seed, i])
        out[t.name] = rng.uniform(-a, a, size=(t.num_rows, t.dim)).astype(np.float32)
    return out










@dataclass
class RunResult:
    """The result of :func:`run_sharded` or :func:`run_unsharded`.

    Attributes
    ----------
    outputs : list of list of dict
        ``outputs[iteration][rank][feature]``: pooled float32[B, D], sequence float32[n, D]
        (``n`` the rank's IDs of the feature), ``B`` the samples per rank.
    grads : list of dict
        ``grads[iteration][table]``: float32[H, D], the gradient every trainer applies (the loss
        of all ranks divided by ``world_size``: TorchRec and DDP average over ranks).
    counter : CollectiveCounter
        Every collective of every rank run (empty for unsharded runs).
    world_size, local_world_size : int
    ranks : tuple of int
        The ranks run, in order: every rank, or the simulated ones of a fake world (whose
        ``outputs`` and ``grads`` are empty).
    """

    outputs: list[list[dict[str, np.ndarray]]]
    grads: list[dict[str, np.ndarray]]
    counter: CollectiveCounter = field(default_factory=CollectiveCounter)
    world_size: int = 1
    local_world_size: int = 1
    ranks: tuple[int, ...] = ()


def _as_batches(batches: Iterable[Any], world_size: int) -> list[Batch]:
    out = []
    for i, b in enumerate(batches):
        b = b if isinstance(b, Batch) else Batch.from_kjt(b)
        if b.batch_size == 0 or b.batch_size % world_size:
            raise ConfigError(f"batch {i}: {b.batch_size} samples do not split evenly over "
                              f"{world_size} ranks")
        if out and b.batch_size != out[0].batch_size:
            raise ConfigError(f"batch {i}: {b.batch_size} samples, batch 0 has "
                              f"{out[0].batch_size}; give batches of one size")
        out.append(b)
    if not out:
        raise ConfigError("no batches to run")
    return out


def _check_inputs(tables: Sequence[EmbeddingTable], batches: Sequence[Batch],
                  weights: Mapping[str, np.ndarray]) -> None:
    for t in tables:
        w = weights.get(t.name)
        if w is None or tuple(np.shape(w)) != (t.num_rows, t.dim):
            raise ConfigError(f"table {t.name!r}: weights must be float32[{t.num_rows}, {t.dim}], "
                              f"got {None if w is None else np.shape(w)}")
        for i, b in enumerate(batches):
            if t.feature not in b.keys:
                raise ConfigError(f"batch {i}: no feature {t.feature!r} for table {t.name!r}")
            ids = b.feature_values(t.feature)
            if ids.size and (ids.min() < 0 or ids.max() >= t.num_rows):
                raise ConfigError(f"batch {i}, feature {t.feature!r}: IDs must lie in "
                                  f"[0, {t.num_rows}), got {int(ids.min())}..{int(ids.max())}")


def _case(tables: Sequence[EmbeddingTable], shardings: Mapping[str, TableSharding],
          batches: Sequence[Batch], weights: Mapping[str, np.ndarray] | None,
          seed: int) -> CaseJob:
    weights = dict(weights) if weights is not None else initial_weights(tables, seed)
    _check_inputs(tables, batches, weights)
    return CaseJob(tuple(tables), dict(shardings), weights, _weighted(tables, batches))


def _weighted(tables: Sequence[EmbeddingTable], batches: Sequence[Batch]) -> bool:
    """Pooled inputs carry weights: some table is pooled and every batch has weights."""
    return any(t.kind == "pooled" for t in tables) and all(b.weights is not None
                                                           for b in batches)


def _as_export(export: Any) -> TorchRecExport:
    return export if isinstance(export, TorchRecExport) else load_torchrec_export(export)


def export_shardings(export: TorchRecExport | str | Path) -> dict[str, TableSharding]:
    """Per exported table (``<table>__hot`` / ``<table>__cold``), the :class:`TableSharding` of
    the export's ``sharding_plan.json``: its sharding type, ranks and kernel. On CPU a
    data-parallel table of a sequence feature runs as a plain ``nn.Embedding``
    (``compute_kernel="torch_module"``), as ``torchrec_loader.exported_embeddings`` builds it."""
    ex = _as_export(export)
    doc = ex.sharding_plan_doc()
    world, local = int(doc["world_size"]), int(doc["local_world_size"])
    kind = {t.name: t.kind for t in ex.new_tables()}
    out = {}
    for name, e in doc["tables"].items():
        st, ranks, kernel = e["sharding_type"], list(e["ranks"]), e["compute_kernel"]
        if st == "data_parallel":
            out[name] = TableSharding(st, compute_kernel="dense" if kind[name] == "pooled"
                                      else TORCH_MODULE)
            continue
        sh = _sharding_on(st, ranks, local, kernel)
        if sh is None or list(sh.shard_ranks(world, local)) != ranks:
            raise ConfigError(f"{ex.path}: table {name!r}: {st} on ranks {ranks} is not a "
                              f"sharding of a world of {world} ranks, {local} per node")
        out[name] = sh
    return out


def _sharding_on(sharding_type: str, ranks: list, local: int, kernel: str
                 ) -> TableSharding | None:
    """The row sharding (table-wise, row-wise, table-row-wise) on ``ranks``, None if it is
    none (its ranks are then checked against the type's, :func:`~flexshard_stream.bridge.
    sharding.type_ranks`)."""
    if sharding_type not in ("table_wise", "row_wise", "table_row_wise") or not ranks:
        return None
    try:
        return TableSharding(sharding_type, tuple(ranks) if sharding_type == "table_wise" else (),
                             host=int(ranks[0]) // local if sharding_type == "table_row_wise"
                             else None, compute_kernel=kernel)
    except (ConfigError, TypeError, ValueError):
        return None


def _export_case(export: TorchRecExport | str | Path, batches: Sequence[Batch],
                 weights: Mapping[str, np.ndarray] | None, seed: int, world_size: int,
                 local_world_size: int) -> CaseJob:
    """An export case: the exported tables, their shardings, and the original tables' weights
    (given, else :func:`initial_weights` of the original tables) split onto them."""
    ex = _as_export(export)
    m = ex.manifest
    if (m["world_size"], m["local_world_size"]) != (world_size, local_world_size):
        raise ConfigError(f"{ex.path}: exported for {m['world_size']} ranks, "
                          f"{m['local_world_size']} per node; the run has {world_size}, "
                          f"{local_world_size}")
    source = tuple(EmbeddingTable(**e["source_table"]) for e in m["tables"])
    tables = tuple(ex.new_tables())
    sh = export_shardings(ex)
    for t in tables:
        sh[t.name].check(t, world_size, local_world_size)
    w = dict(weights) if weights is not None else initial_weights(source, seed)
    _check_inputs(source, batches, w)
    split: dict[str, np.ndarray] = {}
    for t in source:
        split.update(ex.split_rows(t.name, np.asarray(w[t.name], np.float32)))
    return CaseJob(tables, sh, split, _weighted(source, batches), str(ex.path), source)


def _check_dtypes(values_dtype: str, lengths_dtype: str) -> None:
    for name, d in (("values_dtype", values_dtype), ("lengths_dtype", lengths_dtype)):
        if d not in _DTYPES:
            raise ConfigError(f"{name} = {d!r}: expected one of {list(_DTYPES)}")


def _assemble_grads(tables: Sequence[EmbeddingTable], results: Sequence[RankResult],
                    iteration: int) -> dict[str, np.ndarray]:
    """Full gradients of one iteration from the ranks' shards (replicas must agree exactly)."""
    out = {}
    for t in tables:
        full = np.zeros((t.num_rows, t.dim), np.float32)
        seen = np.zeros((t.num_rows, t.dim), bool)
        for res in results:
            for (r0, c0), g in res.grads[iteration].get(t.name, []):
                view = (slice(r0, r0 + g.shape[0]), slice(c0, c0 + g.shape[1]))
                prior = seen[view]
                if prior.any() and not np.array_equal(full[view][prior], g[prior]):
                    raise RunError(f"table {t.name!r}: rank {res.rank}'s replica gradient "
                                   f"differs from another rank's")
                full[view], seen[view] = g, True
        out[t.name] = full
    return out


def _case_grads(case: CaseJob, results: Sequence[RankResult], iteration: int,
                export: TorchRecExport | None) -> dict[str, np.ndarray]:
    """Full gradients of one iteration, per table of the case; an export case's exported tables
    are mapped back onto the original tables' rows."""
    grads = _assemble_grads(case.tables, results, iteration)
    if export is None:
        return grads
    return {t.name: export.merge_rows(t.name, grads) for t in case.source}


def _run_result(case: CaseJob, results: Sequence[RankResult], job: RankJob) -> RunResult:
    n = 0 if job.fake else len(job.batches)
    ex = load_torchrec_export(case.export_dir) if case.export_dir else None
    return RunResult(outputs=[[res.outputs[i] for res in results] for i in range(n)],
                     grads=[_case_grads(case, results, i, ex) for i in range(n)],
                     counter=CollectiveCounter(r for res in results for r in res.records),
                     world_size=job.world_size, local_world_size=job.local_world_size,
                     ranks=job.run_ranks)


def run_sharded_cases(cases: Sequence[tuple[Sequence[EmbeddingTable], Any]
                                       | TorchRecExport | str | Path],
                      batches: Iterable[Any], *, world_size: int = 4, local_world_size: int = 2,
                      weights: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                      values_dtype: str = "int64", lengths_dtype: str = "int64",
                      open_row_wise: bool = True, timeout_s: float = 120.0,
                      fake_ranks: Sequence[int] | None = None) -> list[RunResult]:
    """:func:`run_sharded` for several (tables, shardings) cases in one spawned world, one
    after the other (each case its own ``DistributedModelParallel``); starting the processes
    costs seconds, a case a fraction of that. Returns one :class:`RunResult` per case.

    A case may also be a TorchRec export (its directory or :class:`TorchRecExport`): each rank
    runs what a user of the export runs, its drop-in modules (``bridge/module.py``) sharded by
    ``build_dmp`` under the export's ``ShardingPlan``, fed the batches' original features, which
    the modules split (``KJTRemap``) and merge back; the result's outputs and gradients are those
    of the original features and tables (compare them with :func:`run_unsharded` of the original
    tables), its counter has the exported tables' collectives (:func:`expected_export_collectives`).
    ``weights`` are then the original tables' (split onto the exported ones).

    ``fake_ranks``: start only these ranks, each alone in a world of ``world_size`` on torch's
    fake process group, in which every rank holds the simulated rank's local batch (see
    ``torchrec_world.CountingProcessGroup``; pooled tables only): larger worlds than the
    machine can run, exact
    bytes for that world (:func:`expected_collectives` of the batch made of ``world_size``
    copies of the local one); no outputs or gradients (other ranks' embeddings are unknown)."""
    _check_dtypes(values_dtype, lengths_dtype)
    fake = tuple(int(r) for r in fake_ranks) if fake_ranks is not None else ()
    if fake_ranks is not None and (not fake or any(not 0 <= r < world_size for r in fake)):
        raise ConfigError(f"fake_ranks {list(fake)} must be ranks in [0, {world_size})")
    bs = _as_batches(batches, world_size)
    jobs = []
    for case in cases:
        if isinstance(case, (TorchRecExport, str, Path)):
            if fake:
                raise ConfigError("export cases run on a real gloo world, not a fake one")
            jobs.append(_export_case(case, bs, weights, seed, world_size, local_world_size))
            continue
        tables, shardings = case
        tables, world_size, local_world_size = _resolve_world(shardings, tables, world_size,
                                                              local_world_size)
        if fake and any(t.kind == "sequence" for t in tables):
            raise ConfigError("a fake world runs pooled tables only: TorchRec 1.8's sharded "
                              "EmbeddingCollection all-gathers every rank's shard metadata "
                              "(embedding.py _initialize_torch_state), which one fake rank "
                              "cannot know")
        sh = table_shardings(shardings, tables)
        for t in tables:
            sh[t.name].check(t, world_size, local_world_size)
        jobs.append(_case(tables, sh, bs, weights, seed))
    world = _torchrec_world()
    with tempfile.TemporaryDirectory(prefix="fs-torchrec-") as tmp:
        job = RankJob(jobs, bs, world_size, local_world_size, seed, values_dtype, lengths_dtype,
                      open_row_wise, timeout_s, tmp, fake=bool(fake), ranks=fake)
        per_rank = world.spawn_ranks(job)
    return [_run_result(c, [res[i] for res in per_rank], job) for i, c in enumerate(jobs)]


def run_sharded(tables: Sequence[EmbeddingTable], shardings: Plan | Mapping[str, Any],
                batches: Iterable[Any], *, world_size: int | None = None,
                local_world_size: int | None = None,
                weights: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                values_dtype: str = "int64", lengths_dtype: str = "int64",
                open_row_wise: bool = True, timeout_s: float = 120.0) -> RunResult:
    """Run ``batches`` through a TorchRec ``DistributedModelParallel`` on a spawned gloo world.

    Parameters
    ----------
    tables : sequence of EmbeddingTable
        fp32 tables; ``kind`` "pooled" go into one ``EmbeddingBagCollection`` (sum pooling),
        "sequence" into one ``EmbeddingCollection``; ``feature`` is the batch key of each.
    shardings : Plan or mapping
        Per table a :class:`TableSharding` (or its string), or a Plan (:func:`table_shardings`).
    batches : iterable of Batch or KeyedJaggedTensor
        Global batches of equal size, a multiple of ``world_size``; rank ``r`` takes samples
        ``[r * B, (r + 1) * B)``. Weights (pooled tables) are used when every batch has them.
    world_size, local_world_size : int, optional
        Processes and processes per "node" (default 4 and 2; a Plan's topology when given).
    weights : mapping of table name to float32[H, D], optional
        Initial weights; default :func:`initial_weights` of ``seed``.
    seed : int
        Seeds the default weights and the upstream gradients (:func:`upstream_gradient`).
    values_dtype, lengths_dtype : {"int64", "int32"}
        dtypes of the KJT's values and lengths.
    open_row_wise : bool
        Give DMP the CPU sharder that offers pooled row-wise and table-row-wise
        (:data:`OPENED_SHARDING_TYPES`); False gives TorchRec's own, which runs them too under
        an explicit plan (the difference matters to TorchRec's planner, not to a run).
    timeout_s : float
        Collective timeout of the process group, seconds.

    Returns
    -------
    RunResult

    Raises
    ------
    ConfigError
        Inputs TorchRec cannot run (see :meth:`TableSharding.check`, :func:`table_shardings`).
    RunError
        A rank failed (its traceback is in the message).
    """
    if isinstance(shardings, Plan):
        world_size = world_size or shardings.topology.num_gpus
        local_world_size = local_world_size or shardings.topology.gpus_per_node
    return run_sharded_cases([(tables, shardings)], batches, world_size=world_size or 4,
                             local_world_size=local_world_size or 2, weights=weights, seed=seed,
                             values_dtype=values_dtype, lengths_dtype=lengths_dtype,
                             open_row_wise=open_row_wise, timeout_s=timeout_s)[0]


def run_unsharded(tables: Sequence[EmbeddingTable], batches: Iterable[Any], *,
                  world_size: int = 4, weights: Mapping[str, np.ndarray] | None = None,
                  seed: int = 0, values_dtype: str = "int64",
                  lengths_dtype: str = "int64") -> RunResult:
    """The unsharded ``EmbeddingBagCollection`` / ``EmbeddingCollection`` on the same inputs as
    :func:`run_sharded` (same arguments), in this process: the reference its outputs and
    gradients must equal."""
    _check_dtypes(values_dtype, lengths_dtype)
    bs = _as_batches(batches, world_size)
    case = _case(tables, {}, bs, weights, seed)
    job = RankJob([case], bs, world_size, 1, seed, values_dtype, lengths_dtype)
    results = _torchrec_world().run_reference(job, case)
    n = len(bs)
    return RunResult(outputs=[[res.outputs[i] for res in results] for i in range(n)],
                     grads=[_assemble_grads(case.tables, results[:1], i) for i in range(n)],
                     world_size=world_size, local_world_size=1)
