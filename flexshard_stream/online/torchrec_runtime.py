"""TorchRec as a real runtime: sharded runs on CPU and the bytes of every collective they issue.

:func:`run_sharded` spawns a gloo world (``world_size`` processes, ``local_world_size`` per
"node"), shards a model of :class:`~flexshard_stream.placement.tables.EmbeddingTable` rows with
TorchRec 1.8's ``DistributedModelParallel`` under an explicit plan (:class:`TableSharding` per
table, or one of our :class:`~flexshard_stream.placement.plan.Plan` where TorchRec can express it),
runs forward and backward on given batches and returns the outputs, the gradients and every
collective the ranks issued (:class:`CollectiveCounter`), counted at the process group.
:func:`run_unsharded` runs the same batches through the unsharded modules for comparison, and
:func:`expected_collectives` gives the bytes TorchRec's code sends, from the batch alone
(docs/TORCHREC_RUNTIME.md derives each formula from TorchRec's source).

Importing this module does not import torch: the functions that need it import
:mod:`flexshard_stream.online.torchrec_world` (torch, torchrec) when called, and raise
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

from ..errors import ConfigError, FlexShardError
from ..placement.plan import Plan, TablePlan
from ..placement.tables import EmbeddingTable
from ..stats.batch import Batch, slice_batch

__all__ = ["SHARDING_TYPES", "CPU_SHARDING_TYPES", "OPENED_SHARDING_TYPES", "TableSharding",
           "table_shardings", "sharding_plan", "CollectiveRecord", "CollectiveCounter",
           "expected_collectives", "RunResult", "RunError", "run_sharded", "run_sharded_cases",
           "run_unsharded", "initial_weights", "upstream_gradient", "torchrec_row_blocks",
           "torchrec_column_block", "CaseJob", "RankJob", "RankResult"]

#: Every sharding type this module builds plans for (TorchRec's ``ShardingType`` values).
SHARDING_TYPES: tuple[str, ...] = ("data_parallel", "table_wise", "column_wise",
                                   "table_column_wise", "row_wise", "table_row_wise")
#: What TorchRec 1.8's own sharders offer on CPU, per table kind (``embedding_types.py``
#: ``BaseEmbeddingSharder.sharding_types``; ``embedding.py`` ``EmbeddingCollectionSharder``).
CPU_SHARDING_TYPES: dict[str, tuple[str, ...]] = {
    "pooled": ("data_parallel", "table_wise", "column_wise", "table_column_wise"),
    "sequence": ("data_parallel", "table_wise", "column_wise", "row_wise"),
}
#: What the CPU sharder of :mod:`torchrec_world` opens in addition (TorchRec offers these on cuda).
OPENED_SHARDING_TYPES: dict[str, tuple[str, ...]] = {
    "pooled": ("row_wise", "table_row_wise"),
    "sequence": (),
}
_DTYPES = ("int64", "int32")
_EXTRA_HINT = ("TorchRec is not installed: install the 'torchrec' extra (make install-dev does), "
               "see docs/TORCHREC_RUNTIME.md")


class RunError(FlexShardError, RuntimeError):
    """A spawned TorchRec rank failed; the message holds its traceback."""


# ----------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class TableSharding:
    """How one table is sharded in TorchRec.

    Parameters
    ----------
    sharding_type : str
        One of :data:`SHARDING_TYPES`.
    ranks : tuple of int
        ``table_wise``: the one rank; ``column_wise`` / ``table_column_wise``: one rank per column
        shard (the dim is split evenly; table-column-wise ranks lie on one node); empty for the
        others (data-parallel and row-wise use every rank, table-row-wise the ranks of ``host``).
    host : int, optional
        ``table_row_wise``: the node whose ranks hold the row blocks.
    compute_kernel : str, optional
        TorchRec compute kernel; default what TorchRec's sharders offer on CPU: ``"dense"`` for
        data-parallel, ``"fused"`` otherwise (``"dense"`` is also accepted for pooled tables).
        The kernel does not change what is communicated.
    """

    sharding_type: str
    ranks: tuple[int, ...] = ()
    host: int | None = None
    compute_kernel: str | None = None

    @property
    def kernel(self) -> str:
        """The compute kernel used: :attr:`compute_kernel` or the CPU default."""
        if self.compute_kernel:
            return self.compute_kernel
        return "dense" if self.sharding_type == "data_parallel" else "fused"

    def __post_init__(self) -> None:
        if self.sharding_type not in SHARDING_TYPES:
            raise ConfigError(f"sharding type {self.sharding_type!r} unknown; expected one of "
                              f"{list(SHARDING_TYPES)}")
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if self.sharding_type == "table_wise" and len(self.ranks) != 1:
            raise ConfigError(f"table_wise needs exactly one rank, got {list(self.ranks)}")
        if self.sharding_type in ("column_wise", "table_column_wise") and not self.ranks:
            raise ConfigError(f"{self.sharding_type} needs the ranks of its column shards")
        if self.sharding_type == "table_row_wise" and self.host is None:
            raise ConfigError("table_row_wise needs host= (the node holding the row blocks)")

    @classmethod
    def parse(cls, spec: "TableSharding | str") -> "TableSharding":
        """A :class:`TableSharding` from itself or from a short string: ``"data_parallel"``,
        ``"row_wise"``, ``"table_wise:2"``, ``"column_wise:0,3"``, ``"table_column_wise:2,3"``,
        ``"table_row_wise:1"`` (the host)."""
        if isinstance(spec, TableSharding):
            return spec
        kind, _, arg = str(spec).partition(":")
        try:
            nums = tuple(int(x) for x in arg.split(",") if x.strip())
        except ValueError:
            raise ConfigError(f"sharding {spec!r}: expected 'type' or 'type:n[,n...]' with "
                              f"integer ranks (or the host)") from None
        if kind == "table_row_wise":
            return cls(kind, host=nums[0] if nums else None)
        return cls(kind, nums)

    def shard_ranks(self, world_size: int, local_world_size: int) -> tuple[int, ...]:
        """The rank of each shard, in shard order (data-parallel: every rank)."""
        st = self.sharding_type
        if st in ("data_parallel", "row_wise"):
            return tuple(range(world_size))
        if st == "table_row_wise":
            return tuple(range(self.host * local_world_size, (self.host + 1) * local_world_size))
        return self.ranks

    def check(self, table: EmbeddingTable, world_size: int, local_world_size: int) -> None:
        """Raise :class:`ConfigError` if TorchRec cannot shard ``table`` this way."""
        where = f"table {table.name!r} ({self.sharding_type})"
        if table.dtype != "fp32":
            raise ConfigError(f"{where}: runs use fp32 tables, got {table.dtype}")
        offered = CPU_SHARDING_TYPES[table.kind] + OPENED_SHARDING_TYPES[table.kind]
        if self.sharding_type not in offered:
            raise ConfigError(f"{where}: TorchRec 1.8 has no {self.sharding_type} for "
                              f"{table.kind} tables on CPU (offered: {list(offered)})")
        nodes = world_size // local_world_size
        if self.sharding_type == "table_row_wise" and not 0 <= self.host < nodes:
            raise ConfigError(f"{where}: host {self.host} not in [0, "
                              f"{world_size // local_world_size})")
        self._check_kernel(table, where)
        bad = [r for r in self.ranks if not 0 <= r < world_size]
        if bad:
            raise ConfigError(f"{where}: ranks {bad} not in [0, {world_size})")
        if self.sharding_type in ("column_wise", "table_column_wise"):
            if len(set(self.ranks)) != len(self.ranks):
                raise ConfigError(f"{where}: one column shard per rank, got ranks "
                                  f"{list(self.ranks)}")
            width = torchrec_column_block(table.dim, len(self.ranks))
            if width * len(self.ranks) != table.dim:
                raise ConfigError(f"{where}: TorchRec cuts dim {table.dim} into shards of "
                                  f"{width} columns (the smallest multiple of 4 dividing the "
                                  f"dim, at least dim / {len(self.ranks)}), not into "
                                  f"{len(self.ranks)} shards; give dim / ranks a multiple of 4")
        if self.sharding_type == "table_column_wise" and \
                len({r // local_world_size for r in self.ranks}) != 1:
            raise ConfigError(f"{where}: ranks {list(self.ranks)} span nodes; table-column-wise "
                              f"keeps the shards on one node")


    def _check_kernel(self, table: EmbeddingTable, where: str) -> None:
        k = self.kernel
        if self.sharding_type == "data_parallel" and k != "dense":
            raise ConfigError(f"{where}: data-parallel tables use the dense kernel (TorchRec "
                              f"keeps replicas in sync with DDP), got {k!r}")
        if self.sharding_type != "data_parallel" and k not in ("fused", "dense"):
            raise ConfigError(f"{where}: kernel {k!r} does not run on CPU; use 'fused'")
        if table.kind == "sequence" and k == "dense":
            raise ConfigError(f"{where}: the dense kernel of fbgemm-gpu-cpu 1.8 pools sequence "
                              f"lookups (PoolingMode.NONE is ignored on CPU); sequence tables "
                              f"need the fused kernel, so sequence data-parallel cannot run "
                              f"on CPU")


def torchrec_column_block(dim: int, n: int) -> int:
    """Columns per shard of TorchRec's ``column_wise(ranks)`` over ``n`` ranks: the smallest
    ``w >= dim // n`` dividing ``dim`` that is a multiple of 4, else ``dim``
    (``sharding_plan.py`` ``_find_base_dim``, ``_get_block_size_for_cw_shard``); TorchRec then
    makes ``dim // w`` shards on the first ranks and leaves the other ranks out."""
    for w in range(max(1, dim // n), dim):
        if dim % w == 0 and w % 4 == 0:
            return w
    return dim


def torchrec_row_blocks(num_rows: int, n: int) -> np.ndarray:
    """Bounds (int64[n + 1]) of TorchRec's row-wise blocks: ``ceil(num_rows / n)`` rows each,
    shard ``i`` on the ``i``-th rank, the last ones shorter or empty (``sharding_plan.py``
    ``_calculate_rw_shard_sizes_and_offsets``; the input bucketization uses the same block,
    ``rw_sharding.py`` ``RwSparseFeaturesDist``)."""
    block = -(-num_rows // n)
    return np.minimum(np.arange(n + 1, dtype=np.int64) * block, num_rows)


def _equal_ranges(tp: TablePlan) -> bool:
    cold = tp.cold
    n, h = cold.gpus.size, tp.table.num_rows
    if cold.weights.size and np.ptp(cold.weights) > 0:
        return False
    even = np.round(np.arange(n + 1) * (h / n)).astype(np.int64)
    return bool(np.all(np.abs(cold.bounds - even) <= 1)
                or np.array_equal(cold.bounds, torchrec_row_blocks(h, n)))


def _table_sharding_of(tp: TablePlan, plan: Plan) -> TableSharding:
    """The TorchRec sharding of one table plan, or :class:`ConfigError` saying why none fits."""
    topo, name = plan.topology, tp.name
    if tp.global_ids.size or tp.node_ids.size or tp.placed_ids.size or tp.hbm_fraction.size:
        raise ConfigError(f"table {name!r}: replicated, node or explicitly placed rows (or a host "
                          f"tier) need the export's ID remap (export_torchrec), not a plain "
                          f"TorchRec sharding")
    if tp.cold.kind == "replicated":
        return TableSharding("data_parallel")
    gpus = [int(g) for g in tp.cold.gpus]
    if tp.cold.kind == "columns":   # TorchRec's column_wise(ranks) cuts the dim evenly
        if np.ptp(tp.cold.widths) > 0:
            raise ConfigError(f"table {name!r}: column widths {tp.cold.widths.tolist()} are "
                              f"unequal; TorchRec's column_wise(ranks) cuts the dim evenly")
        return TableSharding(plan.sharding_kinds[name], tuple(gpus))
    if tp.cold.kind == "hash":
        raise ConfigError(f"table {name!r}: hashed rows have no TorchRec sharding (its row-wise "
                          f"blocks are contiguous); export the plan to remap the IDs")
    if len(gpus) == 1:
        return TableSharding("table_wise", (gpus[0],))
    if not _equal_ranges(tp):
        raise ConfigError(f"table {name!r}: weighted ranges have no TorchRec sharding (its "
                          f"row-wise blocks are equal, ceil(H / n) rows)")
    if gpus == list(range(topo.num_gpus)):
        return TableSharding("row_wise")
    m = topo.gpus_per_node
    if len(gpus) == m and gpus[0] % m == 0 and gpus == list(range(gpus[0], gpus[0] + m)):
        return TableSharding("table_row_wise", host=gpus[0] // m)
    raise ConfigError(f"table {name!r}: rows over GPUs {gpus} are neither every GPU in order "
                      f"(row_wise) nor the GPUs of one node in order (table_row_wise)")


def table_shardings(plan: Plan | Mapping[str, TableSharding | str],
                    tables: Sequence[EmbeddingTable] | None = None) -> dict[str, TableSharding]:
    """Per table, the :class:`TableSharding` of a plan.

    Parameters
    ----------
    plan : Plan or mapping of table name to TableSharding or str
        One of our plans (data-parallel, table-wise, row-wise over every GPU and table-row-wise
        over one node map exactly; equal ranges become TorchRec's ``ceil(H / n)``-row blocks), or
        the shardings themselves (strings as in :meth:`TableSharding.parse`).
    tables : sequence of EmbeddingTable, optional
        With a mapping: the tables it must cover (each one, no other).

    Raises
    ------
    ConfigError
        A table TorchRec cannot shard as planned (replicated or placed rows, hashed or weighted
        ranges, an arbitrary set of GPUs), or a mapping that misses or adds tables.
    """
    if isinstance(plan, Plan):
        return {name: _table_sharding_of(tp, plan) for name, tp in plan.tables.items()}
    out = {name: TableSharding.parse(s) for name, s in plan.items()}
    if tables is not None:
        names = [t.name for t in tables]
        missing, extra = set(names) - set(out), set(out) - set(names)
        if missing or extra:
            raise ConfigError(f"shardings must cover exactly the tables {names}: missing "
                              f"{sorted(missing)}, unknown {sorted(extra)}")
    return out


def _torchrec_world():
    try:
        from . import torchrec_world
    except ImportError as e:  # torch or torchrec missing
        raise ImportError(f"{_EXTRA_HINT} ({e})") from e
    return torchrec_world


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


# ----------------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class CollectiveRecord:
    """One collective as one rank issued it, counted at the process group.

    Attributes
    ----------
    rank : int
        Global rank that issued it.
    group : tuple of int
        Global ranks of the process group, in group order.
    op : str
        ``all_to_all``, ``reduce_scatter``, ``all_gather``, ``all_reduce`` or ``broadcast``.
    component : str
        The TorchRec dist it belongs to: ``input_splits``, ``input_lengths``, ``input_values``,
        ``input_weights`` (the KJT all-to-all), ``pooled_all_to_all``, ``pooled_reduce_scatter``,
        ``sequence_all_to_all``, ``data_parallel_all_reduce``; else the TorchRec function name.
    phase : str
        ``forward`` or ``backward`` of an iteration; ``setup`` / ``teardown`` outside them.
    iteration : int or None
        Index of the batch; None outside iterations.
    dtype : str
        Element type of the buffer (``int64``, ``int32``, ``float32`` ...).
    elem_bytes, input_bytes, output_bytes : int
        Bytes per element; of this rank's input and output buffers.
    send_bytes, recv_bytes : tuple of int
        Per group member (group order), the bytes of this rank's input destined to it and of its
        output coming from it (all-to-all: the splits; reduce-scatter: one chunk each;
        all-gather: the whole input each). Empty for all-reduce and broadcast.
    """

    rank: int
    group: tuple[int, ...]
    op: str
    component: str
    phase: str
    iteration: int | None
    dtype: str
    elem_bytes: int
    input_bytes: int
    output_bytes: int
    send_bytes: tuple[int, ...] = ()
    recv_bytes: tuple[int, ...] = ()

    @property
    def remote_send_bytes(self) -> int:
        """Bytes of ``send_bytes`` to members other than this rank (all-reduce: the input)."""
        if not self.send_bytes:
            return self.input_bytes
        return sum(b for r, b in zip(self.group, self.send_bytes) if r != self.rank)

    def inter_node_send_bytes(self, local_world_size: int) -> int:
        """Bytes of ``send_bytes`` to ranks on other nodes (``rank // local_world_size``)."""
        node = self.rank // local_world_size
        return sum(b for r, b in zip(self.group, self.send_bytes) if r // local_world_size != node)


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
    st, h = sh.sharding_type, t.num_rows
    if st == "table_wise":
        return [_Slot(t, sh.ranks[0], t.dim, 0, h)]
    if st in ("column_wise", "table_column_wise"):
        return [_Slot(t, r, t.dim // len(sh.ranks), 0, h) for r in sh.ranks]
    ranks = sh.shard_ranks(world_size, local_world_size)
    b = torchrec_row_blocks(h, len(ranks))
    return [_Slot(t, r, t.dim, int(b[j]), int(b[j + 1])) for j, r in enumerate(ranks)]


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


def upstream_gradient(seed: int, iteration: int, rank: int, feature: int,
                      shape: tuple[int, ...]) -> np.ndarray:
    """The fixed float32 gradient that flows into output ``feature`` (index in sorted feature
    order) of ``rank`` at ``iteration``: the loss of a run is ``sum_f <output_f, g_f>``."""
    rng = np.random.default_rng([seed, 1 + iteration, rank, feature])
    return rng.standard_normal(shape).astype(np.float32)


@dataclass
class CaseJob:
    """One model and plan of a run: its tables, their shardings (empty for the unsharded
    reference), initial weights, and whether pooled inputs carry weights."""

    tables: tuple[EmbeddingTable, ...]
    shardings: dict[str, TableSharding]
    weights: dict[str, np.ndarray]
    weighted: bool = False


@dataclass
class RankJob:
    """Everything a spawned rank needs (pickled to it): the cases, run one after the other in the
    same process group, and the batches they share."""

    cases: list[CaseJob]
    batches: list[Batch]
    world_size: int
    local_world_size: int
    seed: int = 0
    values_dtype: str = "int64"
    lengths_dtype: str = "int64"
    open_row_wise: bool = True
    timeout_s: float = 120.0
    work_dir: str = ""
    fake: bool = False
    ranks: tuple[int, ...] = ()

    @property
    def run_ranks(self) -> tuple[int, ...]:
        """The ranks started: :attr:`ranks`, or every rank when empty."""
        return self.ranks or tuple(range(self.world_size))

    @property
    def local_batch_size(self) -> int:
        """Samples per rank (each global batch is cut into ``world_size`` equal parts)."""
        return self.batches[0].batch_size // self.world_size

    @property
    def store_path(self) -> str:
        """The file store the ranks meet at."""
        return str(Path(self.work_dir) / "store")

    def result_path(self, rank: int) -> str:
        """Where ``rank`` writes its list of :class:`RankResult` (one per case)."""
        return str(Path(self.work_dir) / f"rank{rank}.pkl")


@dataclass
class RankResult:
    """What one rank returns for one case: per iteration its outputs (feature -> array) and its
    gradient shards (table -> [((row offset, column offset), gradient)]), and its collectives."""

    rank: int
    outputs: list[dict[str, np.ndarray]]
    grads: list[dict[str, list[tuple[tuple[int, int], np.ndarray]]]]
    records: list[CollectiveRecord]


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
    weighted = any(t.kind == "pooled" for t in tables) and all(b.weights is not None
                                                               for b in batches)
    return CaseJob(tuple(tables), dict(shardings), weights, weighted)


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


def _run_result(case: CaseJob, results: Sequence[RankResult], job: RankJob) -> RunResult:
    n = 0 if job.fake else len(job.batches)
    return RunResult(outputs=[[res.outputs[i] for res in results] for i in range(n)],
                     grads=[_assemble_grads(case.tables, results, i) for i in range(n)],
                     counter=CollectiveCounter(r for res in results for r in res.records),
                     world_size=job.world_size, local_world_size=job.local_world_size,
                     ranks=job.run_ranks)


def run_sharded_cases(cases: Sequence[tuple[Sequence[EmbeddingTable], Any]],
                      batches: Iterable[Any], *, world_size: int = 4, local_world_size: int = 2,
                      weights: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                      values_dtype: str = "int64", lengths_dtype: str = "int64",
                      open_row_wise: bool = True, timeout_s: float = 120.0,
                      fake_ranks: Sequence[int] | None = None) -> list[RunResult]:
    """:func:`run_sharded` for several (tables, shardings) cases in one spawned world, one
    after the other (each case its own ``DistributedModelParallel``); starting the processes
    costs seconds, a case a fraction of that. Returns one :class:`RunResult` per case.

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
    for tables, shardings in cases:
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
