"""The one sharding rule: what a table plan becomes in TorchRec 1.8.

:func:`torchrec_sharding` decides it for one table plan (:class:`TorchRecSharding`: TorchRec's
sharding type, ranks and host, the shards' row and column offsets and sizes as TorchRec lays them
out, whether TorchRec runs the table plan directly or only through the export's ID remap, and what
TorchRec cannot run as planned). Everything that asks "which TorchRec sharding is this" asks it:
the export (:mod:`~flexshard_stream.bridge.export`, :mod:`~flexshard_stream.bridge.layout`), the
estimator compat (:func:`~flexshard_stream.bridge.estimator.torchrec_sharding_of`), the runtime
harness (:func:`table_shardings`), the execution profiles
(:meth:`~flexshard_stream.placement.profiles.ExecutionProfile.table_issues`) and the CLI
(:func:`sharding_label`). Each TorchRec sharding type is defined once here: its ranks
(:func:`type_ranks`), its shards (:func:`torchrec_shards`: ``ceil(H / n)``-row blocks,
:func:`torchrec_rw_shard_rows`; column shards, :func:`torchrec_column_block`), which table kinds
TorchRec 1.8 offers it for (:data:`OFFERED_SHARDING_TYPES`, :func:`torchrec_kind`).

The plan's own sharding kind (:meth:`~flexshard_stream.plans.plan.TablePlan.sharding_kind`) is
what the cost model prices; the rule maps it onto TorchRec (TorchRec 1.8's source, read from the
installed wheel):

- ``data_parallel``, ``table_wise`` (one GPU, hashed or not: it holds every row),
  ``column_wise`` / ``table_column_wise`` (the plan's column shards on its GPUs, in column order;
  ``cw_sharding.py`` ``_shard`` takes any widths and ranks), ``row_wise`` over every GPU in order
  and ``table_row_wise`` over the GPUs of one node in order (``rw_sharding.py`` /
  ``twrw_sharding.py`` ``_shard``: shard ``i`` on the ``i``-th rank of the group, IDs bucketized
  by ``ceil(H / n)``-row blocks) run directly when the plan has no replicas, placed rows or host
  tier, its ranges are equal (within a row of the even split: TorchRec runs its own blocks) and
  its column shards are what TorchRec's ``column_wise(ranks)`` generator makes (the runtime
  harness builds its plans with TorchRec's generators);
- every other row plan runs only through the export (:func:`export_torchrec
  <flexshard_stream.bridge.export.export_torchrec>`): a data-parallel hot table of the replicas
  and a cold table, its type chosen by where the plan keeps the cold rows (the plan's inference,
  :func:`~flexshard_stream.plans.plan.infer_row_kind`, on the GPUs holding them), its rows
  renumbered by the ID remap into TorchRec's blocks: hashed and weighted rows, GPUs out of
  TorchRec's order, a part of a node or of the cluster (run on every rank of the group);
- TorchRec 1.8 has no ``table_row_wise`` or ``table_column_wise`` for sequence tables
  (``embedding.py`` ``create_embedding_sharding`` raises "Sharding not supported"): the rule still
  gives the plan's sharding (the runtime harness maps it and :meth:`TableSharding.check` refuses
  it; TorchRec's estimator has the formula) and, as ``fallback``, what runs instead: ``row_wise``
  over every rank through the export, and ``column_wise`` on the same shards.

``issues`` holds what TorchRec cannot run as planned, in the execution profile's sentences
(:func:`sharding_issues`); a table plan TorchRec runs directly has none, but for a type TorchRec
lacks for the table kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..plans.plan import Plan, TablePlan, infer_row_kind
from ..plans.tables import EmbeddingTable
from ..plans.topology import Topology

__all__ = ["SHARDING_TYPES", "CPU_SHARDING_TYPES", "OPENED_SHARDING_TYPES",
           "OFFERED_SHARDING_TYPES", "TORCH_MODULE", "COLD_SHARDINGS", "NODE_REPLICAS",
           "COLLECTIONS", "POOLED_MODULE", "SEQUENCE_MODULE", "MODULE_PATHS",
           "TableSharding", "TorchRecShard", "TorchRecSharding", "torchrec_sharding",
           "sharding_issues", "sharding_label", "table_shardings", "torchrec_kind", "type_ranks",
           "torchrec_shards", "torchrec_row_blocks", "torchrec_rw_shard_rows",
           "torchrec_block_starts", "torchrec_column_block", "plan_cold_rows"]


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


#: What TorchRec 1.8 offers on cuda, per table kind: every type for pooled tables, no
#: table-row-wise or table-column-wise for sequence tables (``embedding.py`` l.1836-1843).
OFFERED_SHARDING_TYPES: dict[str, tuple[str, ...]] = {
    k: CPU_SHARDING_TYPES[k] + OPENED_SHARDING_TYPES[k] for k in CPU_SHARDING_TYPES}


#: The "kernel" of a data-parallel table run as a plain torch module (see :class:`TableSharding`).
TORCH_MODULE = "torch_module"

#: The export's ``cold_sharding`` values. ``auto``: the type the rule gives (see the module
#: docstring); the others force the cold table's type.
COLD_SHARDINGS: tuple[str, ...] = ("auto", "row_wise", "table_row_wise", "table_wise")
#: The export's ``node_replicas`` values: where the plan's tier-1 rows (one copy per node) go.
NODE_REPLICAS: tuple[str, ...] = ("hot", "cold")

#: The TorchRec collection of each table kind.
COLLECTIONS: dict[str, str] = {"pooled": "EmbeddingBagCollection",
                               "sequence": "EmbeddingCollection"}
#: Module paths of the two collections in this library's models (the attributes of
#: ``loader.EmbeddingModules``, the default of every ``ShardingPlan`` built here).
POOLED_MODULE, SEQUENCE_MODULE = "ebc", "ec"
#: Default module path of each collection.
MODULE_PATHS: dict[str, str] = {COLLECTIONS["pooled"]: POOLED_MODULE,
                                COLLECTIONS["sequence"]: SEQUENCE_MODULE}

# what TorchRec runs a kind it does not offer for a table kind as
_NEAREST = {"table_row_wise": "row_wise", "table_column_wise": "column_wise"}
_ROW_TYPES = ("table_wise", "row_wise", "table_row_wise")
# the export's note when a sequence table's cold rows sit on one node
_SEQUENCE_NOTE = ("the plan keeps the cold rows on one node, but TorchRec 1.8's "
                  "EmbeddingCollectionSharder offers no table_row_wise for sequence tables "
                  "(embedding.py l.1836-1843): exported row_wise over all ranks")
_COLUMN_TYPES = ("column_wise", "table_column_wise")


# ----------------------------------------------------------------------------- TorchRec layouts
def torchrec_kind(kind: str, table_kind: str) -> str:
    """The TorchRec sharding type that runs a plan's sharding ``kind`` for a table of
    ``table_kind``: the kind itself where TorchRec 1.8 offers it
    (:data:`OFFERED_SHARDING_TYPES`), else ``row_wise`` for ``table_row_wise`` and
    ``column_wise`` for ``table_column_wise`` (sequence tables)."""
    if kind in OFFERED_SHARDING_TYPES[table_kind]:
        return kind
    return _NEAREST[kind]


def type_ranks(sharding_type: str, world_size: int, local_world_size: int,
               ranks: Sequence[int] = (), host: int | None = None) -> tuple[int, ...]:
    """The rank of each shard of a TorchRec sharding, in shard order: every rank for
    ``data_parallel`` (its ``ParameterSharding.ranks``) and ``row_wise``; the ranks of node
    ``host``, in order, for ``table_row_wise``; ``ranks`` (one per shard) for ``table_wise``,
    ``column_wise`` and ``table_column_wise``."""
    if sharding_type in ("data_parallel", "row_wise"):
        return tuple(range(world_size))
    if sharding_type == "table_row_wise":
        return tuple(range(host * local_world_size, (host + 1) * local_world_size))
    return tuple(int(r) for r in ranks)


def torchrec_rw_shard_rows(num_rows: int, num_shards: int) -> np.ndarray:
    """Rows per shard of a TorchRec 1.8 row-wise (or table-row-wise) table: ``ceil(H / n)`` on every
    shard until the rows run out (``sharding_plan.py`` l.181-237, ``_calculate_rw_shard_sizes_and_
    offsets``; e.g. 10 rows on 4 ranks: 3, 3, 3, 1; 5 on 4: 2, 2, 1, 0). Row ``i`` lives on shard
    ``i // ceil(H / n)``, as the input bucketization computes it (``rw_sharding.py`` l.429-431,
    ``twrw_sharding.py`` l.369-371)."""
    if num_shards <= 0:
        raise ConfigError(f"num_shards must be > 0, got {num_shards}")
    if num_rows <= 0:
        return np.zeros(num_shards, np.int64)
    block = -(-num_rows // num_shards)
    last = num_rows // block
    out = np.zeros(num_shards, np.int64)
    out[:min(last, num_shards)] = block
    if last < num_shards:
        out[last] = num_rows - block * last
    return out


def torchrec_block_starts(num_rows: int, num_shards: int) -> np.ndarray:
    """First row of each of TorchRec's row-wise shards (int64[n]; see
    :func:`torchrec_rw_shard_rows`)."""
    sizes = torchrec_rw_shard_rows(num_rows, num_shards)
    return np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)


def torchrec_row_blocks(num_rows: int, n: int) -> np.ndarray:
    """Bounds (int64[n + 1]) of TorchRec's row-wise blocks: ``ceil(num_rows / n)`` rows each,
    shard ``i`` on the ``i``-th rank, the last ones shorter or empty (``sharding_plan.py``
    ``_calculate_rw_shard_sizes_and_offsets``, :func:`torchrec_rw_shard_rows`; the input
    bucketization uses the same block, ``rw_sharding.py`` ``RwSparseFeaturesDist``)."""
    return np.concatenate([[0], np.cumsum(torchrec_rw_shard_rows(num_rows, n))]).astype(np.int64)


def torchrec_column_block(dim: int, n: int) -> int:
    """Columns per shard of TorchRec's ``column_wise(ranks)`` over ``n`` ranks: the smallest
    ``w >= dim // n`` dividing ``dim`` that is a multiple of 4, else ``dim``
    (``sharding_plan.py`` ``_find_base_dim``, ``_get_block_size_for_cw_shard``); TorchRec then
    makes ``dim // w`` shards on the first ranks and leaves the other ranks out."""
    for w in range(max(1, dim // n), dim):
        if dim % w == 0 and w % 4 == 0:
            return w
    return dim


@dataclass(frozen=True)
class TorchRecShard:
    """One shard of a TorchRec table: ``rank`` holds rows ``[offsets[0], offsets[0] + sizes[0])``
    of columns ``[offsets[1], offsets[1] + sizes[1])`` (``ShardMetadata``)."""

    rank: int
    offsets: tuple[int, int]
    sizes: tuple[int, int]


def torchrec_shards(sharding_type: str, num_rows: int, dim: int, ranks: Sequence[int],
                    widths: Sequence[int] | None = None) -> tuple[TorchRecShard, ...]:
    """The shards of a TorchRec sharding of a ``num_rows`` x ``dim`` table whose shards sit on
    ``ranks`` (:func:`type_ranks`), as TorchRec lays them out: none for ``data_parallel``;
    every column in ``ceil(H / n)``-row blocks for the row types (:func:`torchrec_rw_shard_rows`);
    every row in column shards of ``widths`` (default TorchRec's ``column_wise(ranks)`` cut,
    :func:`torchrec_column_block`, on the first ranks) for the column types."""
    if sharding_type == "data_parallel":
        return ()
    if sharding_type in _ROW_TYPES:
        bounds = torchrec_row_blocks(num_rows, len(ranks))
        return tuple(TorchRecShard(int(r), (int(bounds[j]), 0),
                                   (int(bounds[j + 1] - bounds[j]), int(dim)))
                     for j, r in enumerate(ranks))
    if widths is None:
        w = torchrec_column_block(dim, len(ranks))
        widths = [w] * (dim // w)
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
    return tuple(TorchRecShard(int(r), (0, int(offsets[j])), (int(num_rows), int(w)))
                 for j, (r, w) in enumerate(zip(ranks, widths)))


# ----------------------------------------------------------------------------- runtime shardings
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
        ``"torch_module"`` (data-parallel only) is not a TorchRec kernel: the table is a plain
        ``nn.EmbeddingBag`` / ``nn.Embedding`` outside TorchRec's collections, which
        ``DistributedModelParallel`` replicates and DDP keeps in sync, as TorchRec's data-parallel
        sharding does (the one way to replicate a sequence table on CPU). The kernel does not
        change what is communicated.
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
        if self.sharding_type in _COLUMN_TYPES and not self.ranks:
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
        """The rank of each shard, in shard order (data-parallel: every rank;
        :func:`type_ranks`)."""
        return type_ranks(self.sharding_type, world_size, local_world_size, self.ranks,
                          self.host)

    def shards(self, table: EmbeddingTable, world_size: int,
               local_world_size: int) -> tuple[TorchRecShard, ...]:
        """The shards of ``table`` under this sharding, as TorchRec lays them out
        (:func:`torchrec_shards`; column shards as TorchRec's ``column_wise(ranks)`` cuts the
        dim)."""
        return torchrec_shards(self.sharding_type, table.num_rows, table.dim,
                               self.shard_ranks(world_size, local_world_size))

    def check(self, table: EmbeddingTable, world_size: int, local_world_size: int) -> None:
        """Raise :class:`ConfigError` if TorchRec cannot shard ``table`` this way."""
        where = f"table {table.name!r} ({self.sharding_type})"
        if table.dtype != "fp32":
            raise ConfigError(f"{where}: runs use fp32 tables, got {table.dtype}")
        offered = OFFERED_SHARDING_TYPES[table.kind]
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
        if self.sharding_type in _COLUMN_TYPES:
            if len(set(self.ranks)) != len(self.ranks):
                raise ConfigError(f"{where}: one column shard per rank, got ranks "
                                  f"{list(self.ranks)}")
            why = _column_cut(table, len(self.ranks))
            if why:
                raise ConfigError(f"{where}: {why}")
        if self.sharding_type == "table_column_wise" and \
                len({r // local_world_size for r in self.ranks}) != 1:
            raise ConfigError(f"{where}: ranks {list(self.ranks)} span nodes; table-column-wise "
                              f"keeps the shards on one node")

    @property
    def plain_module(self) -> bool:
        """The table runs as a plain torch module (``compute_kernel="torch_module"``)."""
        return self.kernel == TORCH_MODULE

    def _check_kernel(self, table: EmbeddingTable, where: str) -> None:
        k = self.kernel
        if self.sharding_type == "data_parallel" and k not in ("dense", TORCH_MODULE):
            raise ConfigError(f"{where}: data-parallel tables use the dense kernel (TorchRec "
                              f"keeps replicas in sync with DDP) or {TORCH_MODULE!r}, got {k!r}")
        if self.sharding_type != "data_parallel" and k not in ("fused", "dense"):
            raise ConfigError(f"{where}: kernel {k!r} does not run on CPU; use 'fused'")
        if table.kind == "sequence" and k == "dense":
            raise ConfigError(f"{where}: the dense kernel of fbgemm-gpu-cpu 1.8 pools sequence "
                              f"lookups (PoolingMode.NONE is ignored on CPU); sequence tables "
                              f"need the fused kernel, so sequence data-parallel cannot run "
                              f"on CPU in TorchRec (compute_kernel={TORCH_MODULE!r} replicates "
                              f"the table as a plain nn.Embedding under DDP instead)")


def _column_cut(table: EmbeddingTable, n: int) -> str:
    """Why TorchRec's ``column_wise(ranks)`` over ``n`` ranks does not cut ``table``'s dim into
    ``n`` shards ("" when it does)."""
    width = torchrec_column_block(table.dim, n)
    if width * n == table.dim:
        return ""
    return (f"TorchRec cuts dim {table.dim} into shards of {width} columns (the smallest multiple "
            f"of 4 dividing the dim, at least dim / {n}), not into {n} shards; give dim / ranks "
            f"a multiple of 4")


# ----------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class TorchRecSharding:
    """What one table plan becomes in TorchRec 1.8 (:func:`torchrec_sharding`).

    Attributes
    ----------
    table : str
        The table's name.
    kind : str
        The plan's sharding kind (:meth:`TablePlan.sharding_kind`): what the plan asks for and
        the cost model prices.
    sharding_type : str
        The table plan's TorchRec sharding type (:data:`SHARDING_TYPES`): of the table itself
        when TorchRec runs it directly, else of the export's cold table (``data_parallel`` when
        the export's hot table holds every row); when TorchRec 1.8 lacks it for the table's kind,
        :attr:`fallback` runs instead.
    ranks : tuple of int
        The rank of each shard, in shard order (:func:`type_ranks`; ``data_parallel``: every
        rank).
    host : int or None
        ``table_row_wise``: the node holding the row blocks.
    shards : tuple of TorchRecShard
        Row and column offsets and sizes of each shard as TorchRec lays them out (of the cold
        table's ``H - hot_rows`` rows through the export; none for ``data_parallel``).
    hot_rows : int
        Rows of the export's data-parallel hot table (replicas; every row of a data-parallel
        table); 0 for a table plan TorchRec runs directly as a sharded table.
    indirect : str
        Why TorchRec cannot run the table plan directly (the runtime harness's refusal), ``""``
        when it can (:attr:`direct`).
    issues : tuple of str
        What TorchRec cannot run as planned (the ``torchrec`` execution profile's sentences,
        :func:`sharding_issues`); empty when TorchRec runs the plan as planned.
    notes : tuple of str
        What the choice of the cold table's type assumed (the export's manifest notes).
    exportable : bool
        The export writes the table (it writes no column-wise tables).
    fallback : TorchRecSharding or None
        When TorchRec 1.8 has no :attr:`sharding_type` for the table's kind (sequence
        ``table_row_wise`` / ``table_column_wise``, :func:`torchrec_kind`): what it runs instead
        (``row_wise`` over every rank through the export; ``column_wise`` on the same shards).
    """

    table: str
    kind: str
    sharding_type: str
    ranks: tuple[int, ...]
    host: int | None
    shards: tuple[TorchRecShard, ...]
    hot_rows: int
    indirect: str
    issues: tuple[str, ...]
    notes: tuple[str, ...] = ()
    exportable: bool = True
    fallback: "TorchRecSharding | None" = None

    @property
    def direct(self) -> bool:
        """TorchRec runs the table plan as it is: its own IDs, a sharding TorchRec's
        ``sharding_plan`` generators make (:func:`table_shardings`, the runtime harness; of a
        type TorchRec lacks for the table kind, :meth:`TableSharding.check` refuses it);
        otherwise only through the export's ID remap (hot data-parallel table + cold table)."""
        return not self.indirect

    @property
    def runs_as(self) -> "TorchRecSharding":
        """The sharding TorchRec runs: :attr:`fallback` when TorchRec lacks :attr:`sharding_type`
        for the table's kind, else this one (the export writes it)."""
        return self.fallback or self

    @property
    def shard_rows(self) -> tuple[int, ...]:
        """Rows of each shard, in shard order."""
        return tuple(s.sizes[0] for s in self.shards)

    @property
    def table_sharding(self) -> TableSharding:
        """The :class:`TableSharding` the runtime harness runs (ConfigError saying
        :attr:`indirect` when TorchRec cannot run the table plan directly)."""
        if self.indirect:
            raise ConfigError(self.indirect)
        st = self.sharding_type
        ranks = self.ranks if st in ("table_wise",) + _COLUMN_TYPES else ()
        return TableSharding(st, ranks, host=self.host)


def torchrec_sharding(tp: TablePlan, topology: Topology, *, cold_sharding: str = "auto",
                      node_replicas: str = "hot") -> TorchRecSharding:
    """The TorchRec 1.8 sharding of one table plan on ``topology`` (see the module docstring).

    Parameters
    ----------
    tp : TablePlan
    topology : Topology
    cold_sharding : {"auto", "row_wise", "table_row_wise", "table_wise"}
        The export's option (:data:`COLD_SHARDINGS`): ``auto`` decides by the rule, the others
        force the type of the cold table (row plans; a table plan then runs only through the
        export).
    node_replicas : {"hot", "cold"}
        The export's option (:data:`NODE_REPLICAS`): node replicas go into the hot table
        (default) or stay cold rows.

    Raises
    ------
    ConfigError
        An unknown option; ``cold_sharding="table_row_wise"`` for a sequence table with cold
        rows (TorchRec 1.8 has none).
    """
    if cold_sharding not in COLD_SHARDINGS:
        raise ConfigError(f"cold_sharding must be one of {list(COLD_SHARDINGS)}, got "
                          f"{cold_sharding!r}")
    if node_replicas not in NODE_REPLICAS:
        raise ConfigError(f"node_replicas must be one of {list(NODE_REPLICAS)}, got "
                          f"{node_replicas!r}")
    kind = tp.sharding_kind(topology)
    issues = tuple(sharding_issues(tp, topology))
    if tp.replicated:
        return _data_parallel(tp, topology, kind, tp.table.num_rows, _special_rows(tp), issues)
    if tp.column_wise:
        return _column_sharding(tp, topology, kind, issues)
    why = _special_rows(tp) or _row_layout(tp, topology, kind)
    if not why and cold_sharding != "auto":
        why = (f"table {tp.name!r}: cold_sharding={cold_sharding!r} asks the export for its cold "
               f"table's type")
    hot = int(tp.global_ids.size + (tp.node_ids.size if node_replicas == "hot" else 0))
    H = tp.table.num_rows
    if hot == H:
        return _data_parallel(tp, topology, kind, H, why, issues)
    if cold_sharding not in ("auto",) + OFFERED_SHARDING_TYPES[tp.table.kind]:
        raise ConfigError(f"table {tp.name!r}: cold_sharding {cold_sharding!r} is impossible for "
                          "a sequence table: TorchRec 1.8's EmbeddingCollectionSharder offers "
                          "only data_parallel, table_wise, column_wise and row_wise (embedding.py "
                          "l.1836-1843); use 'row_wise' or 'auto'")
    st, ranks, host, notes = _cold_choice(tp, topology, kind if not why else cold_sharding,
                                          plan_cold_rows(tp, topology, node_replicas))
    fallback = None
    if st not in OFFERED_SHARDING_TYPES[tp.table.kind]:
        fallback = _row_fallback(tp, topology, kind, st, hot, issues)
    return TorchRecSharding(tp.name, kind, st, ranks, host,
                            torchrec_shards(st, H - hot, tp.table.dim, ranks), hot, why, issues,
                            tuple(notes), fallback=fallback)


def _row_fallback(tp: TablePlan, topology: Topology, kind: str, sharding_type: str, hot: int,
                  issues: tuple[str, ...]) -> TorchRecSharding:
    """What runs a row sharding TorchRec lacks for the table's kind (sequence table-row-wise):
    the export's cold table, row-wise over every rank."""
    t = tp.table
    fb = torchrec_kind(sharding_type, t.kind)
    ranks = type_ranks(fb, topology.num_gpus, topology.gpus_per_node)
    why = (f"table {tp.name!r}: TorchRec 1.8 has no {sharding_type} for {t.kind} tables "
           f"(embedding.py create_embedding_sharding); the export runs it {fb} over every rank")
    return TorchRecSharding(tp.name, kind, fb, ranks, None,
                            torchrec_shards(fb, t.num_rows - hot, t.dim, ranks), hot, why, issues,
                            (_SEQUENCE_NOTE,))


def _data_parallel(tp: TablePlan, topology: Topology, kind: str, hot_rows: int, why: str,
                   issues: tuple[str, ...]) -> TorchRecSharding:
    """A table TorchRec replicates: a data-parallel table plan, or the export's hot table when
    it holds every row."""
    return TorchRecSharding(tp.name, kind, "data_parallel", tuple(range(topology.num_gpus)),
                            None, (), int(hot_rows), why, issues)


def _special_rows(tp: TablePlan) -> str:
    """Why rows chosen one by one keep TorchRec from running ``tp`` directly ("" without)."""
    if tp.global_ids.size or tp.node_ids.size or tp.placed_ids.size or tp.hbm_fraction.size:
        return (f"table {tp.name!r}: replicated, node or explicitly placed rows (or a host tier) "
                f"need the export's ID remap (export_torchrec), not a plain TorchRec sharding")
    return ""


def _column_sharding(tp: TablePlan, topology: Topology, kind: str,
                     issues: tuple[str, ...]) -> TorchRecSharding:
    """Column shards: the plan's, on its GPUs in column order (TorchRec's column-wise sharding
    takes any widths and ranks); run directly when they are what TorchRec's
    ``column_wise(ranks)`` generator makes. The export writes no column-wise table."""
    c, t, name = tp.cold, tp.table, tp.name
    ranks = tuple(int(g) for g in c.gpus)
    why = _special_rows(tp)
    if not why and np.ptp(c.widths) > 0:
        why = (f"table {name!r}: column widths {c.widths.tolist()} are unequal; TorchRec's "
               f"column_wise(ranks) cuts the dim evenly")
    if not why and _column_cut(t, len(ranks)):
        why = f"table {name!r}: {_column_cut(t, len(ranks))}"
    shards = torchrec_shards(kind, t.num_rows, t.dim, ranks, c.widths.tolist())
    fallback = None
    if torchrec_kind(kind, t.kind) != kind:
        fb = torchrec_kind(kind, t.kind)
        fallback = TorchRecSharding(name, kind, fb, ranks, None, shards, 0, why, issues,
                                    exportable=False)
    return TorchRecSharding(name, kind, kind, ranks, None, shards, 0, why, issues,
                            exportable=False, fallback=fallback)


def _equal_ranges(tp: TablePlan) -> bool:
    """The range cold function is equal: within a row of the even split, or TorchRec's own
    ``ceil(H / n)`` blocks (TorchRec then runs its blocks)."""
    cold = tp.cold
    n, h = cold.gpus.size, tp.table.num_rows
    if cold.weights.size and np.ptp(cold.weights) > 0:
        return False
    even = np.round(np.arange(n + 1) * (h / n)).astype(np.int64)
    return bool(np.all(np.abs(cold.bounds - even) <= 1)
                or np.array_equal(cold.bounds, torchrec_row_blocks(h, n)))


def _row_layout(tp: TablePlan, topology: Topology, kind: str) -> str:
    """Why the cold function of a row plan is not TorchRec's layout of its ``kind`` ("" when it
    is: one GPU; equal ranges over every GPU in order (row_wise) or over the GPUs of one node in
    order (table_row_wise))."""
    name, c = tp.name, tp.cold
    gpus = [int(g) for g in c.gpus]
    if len(gpus) == 1:
        return ""
    if c.kind == "hash":
        return (f"table {name!r}: hashed rows have no TorchRec sharding (its row-wise blocks are "
                f"contiguous); export the plan to remap the IDs")
    if not _equal_ranges(tp):
        return (f"table {name!r}: weighted ranges have no TorchRec sharding (its row-wise blocks "
                f"are equal, ceil(H / n) rows)")
    m = topology.gpus_per_node
    if kind == "row_wise" and gpus == list(range(topology.num_gpus)):
        return ""
    if kind == "table_row_wise" and gpus == list(range(gpus[0], gpus[0] + m)) \
            and gpus[0] % m == 0:
        return ""
    return (f"table {name!r}: rows over GPUs {gpus} are neither every GPU in order (row_wise) "
            f"nor the GPUs of one node in order (table_row_wise), as its {kind} kind needs")


def plan_cold_rows(tp: TablePlan, topology: Topology, node_replicas: str = "hot") -> np.ndarray:
    """Rows of the export's cold table each GPU holds under the plan (int64[G]): placed rows
    plus the cold function's rows (node replicas with ``node_replicas="cold"``; a hash over more
    than 2**24 rows by its expected value, as :meth:`TablePlan.rows_per_gpu` counts it)."""
    hot_ids = tp.global_ids
    if node_replicas == "hot" and tp.node_ids.size:
        hot_ids = np.union1d(hot_ids, tp.node_ids)
    cold_only = TablePlan(tp.table, tp.cold, global_ids=hot_ids, placed_ids=tp.placed_ids,
                          placed_gpus=tp.placed_gpus)
    return cold_only.rows_per_gpu(topology) - hot_ids.size


def _cold_choice(tp: TablePlan, topology: Topology, choice: str, counts: np.ndarray
                 ) -> tuple[str, tuple[int, ...], int | None, list[str]]:
    """TorchRec sharding type, ranks and host of the cold rows, with notes. ``choice``: a row
    type (a table plan TorchRec runs directly passes its kind), or ``auto``: the plan's inference
    (:func:`~flexshard_stream.plans.plan.infer_row_kind`) on the GPUs holding cold rows
    (``counts``, :func:`plan_cold_rows`); whether TorchRec offers it for the table's kind is the
    caller's."""
    M, G = topology.gpus_per_node, topology.num_gpus
    used = np.flatnonzero(counts)
    if not used.size:
        used = np.unique(tp.cold.gpus).astype(np.int64)
    one_node = used.size > 0 and np.unique(used // M).size == 1
    notes: list[str] = []
    kind = infer_row_kind(used, G, M) if choice == "auto" else choice
    if kind == "row_wise":
        return kind, type_ranks(kind, G, M), None, notes
    if kind == "table_row_wise":
        node = int(np.argmax(np.bincount(np.arange(G) // M, weights=counts.astype(float),
                                         minlength=topology.nodes)))
        notes.append(f"table_row_wise puts all cold rows on one node (TorchRec picks which; "
                     f"the reverse mapping assumes node {node}, the one holding most of them "
                     f"in the plan)" if not one_node else
                     f"TorchRec's planner picks the node; the reverse mapping assumes the "
                     f"plan's node {node}")
        return kind, type_ranks(kind, G, M, host=node), node, notes
    rank = int(np.argmax(counts))
    if used.size > 1:
        notes.append(f"table_wise puts all cold rows on one rank (the reverse mapping assumes "
                     f"GPU {rank}, the one holding most of them in the plan)")
    notes.append("TorchRec's planner picks the rank of a table_wise table")
    return kind, (rank,), None, notes


def sharding_issues(tp: TablePlan, topology: Topology) -> list[str]:
    """What TorchRec 1.8 cannot run of table plan ``tp`` as planned, one sentence per reason
    (the ``torchrec`` execution profile's :meth:`table_issues
    <flexshard_stream.placement.profiles.ExecutionProfile.table_issues>`): node replicas (tier 1;
    the export folds them into the data-parallel hot table); sequence ``table_row_wise`` /
    ``table_column_wise`` (:func:`torchrec_kind`); ``row_wise`` over fewer than all GPUs and
    ``table_row_wise`` over part of a node (TorchRec's blocks cover every rank of the group); a
    host memory tier (TorchRec's UVM caching keeps what its cache decides in HBM). Hashed and
    weighted cold rows, replicas and placed rows run through the export's ID remap as planned."""
    out = []
    kind = tp.sharding_kind(topology)
    where = f"table {tp.name!r} ({kind})"
    if tp.node_ids.size:
        out.append(f"{where}: {tp.node_ids.size} node replicas (tier 1): TorchRec has no "
                   f"one-copy-per-node sharding")
    if torchrec_kind(kind, tp.table.kind) != kind:
        out.append(f"{where}: TorchRec 1.8 offers no {kind} for sequence tables "
                   f"(embedding.py EmbeddingCollectionSharder.sharding_types)")
    gpus = tp.cold.distinct_gpus
    if kind == "row_wise" and gpus != topology.num_gpus:
        out.append(f"{where}: rows on {gpus} of {topology.num_gpus} GPUs; TorchRec's "
                   f"row_wise blocks cover every rank")
    if kind == "table_row_wise" and gpus != topology.gpus_per_node:
        out.append(f"{where}: rows on {gpus} of the node's {topology.gpus_per_node} "
                   f"GPUs; TorchRec's table_row_wise blocks cover every rank of the node")
    if tp.has_host_tier:
        out.append(f"{where}: a host memory tier; TorchRec's UVM caching keeps in HBM what "
                   f"its cache decides, not the plan's split")
    return out


_SHORT_KIND = {"table_wise": "tw", "column_wise": "cw", "table_column_wise": "twcw",
               "row_wise": "rw", "table_row_wise": "twrw", "data_parallel": "dp"}


def sharding_label(tp: TablePlan, topology: Topology) -> str:
    """How a table plan is sharded, in TorchRec's short words (tw, cw, twcw, rw, twrw, dp) of
    its kind, with ``(hashed)`` for hashed rows, ``, n GPUs`` when row-wise spans part of the
    cluster and ``+host`` with a host-memory tier (replicated and placed rows are counted beside
    it): the CLI's label of a table."""
    kind = tp.sharding_kind(topology)
    base = _SHORT_KIND.get(kind, kind)
    c = tp.cold
    n = int(c.gpus.size)
    if kind == "row_wise" and n != topology.num_gpus:
        base += f", {n} GPUs"
    if c.kind == "hash":
        base += " (hashed)"
    return base + (" +host" if tp.has_host_tier else "")


def table_shardings(plan: Plan | Mapping[str, TableSharding | str],
                    tables: Sequence[EmbeddingTable] | None = None) -> dict[str, TableSharding]:
    """Per table, the :class:`TableSharding` of a plan.

    Parameters
    ----------
    plan : Plan or mapping of table name to TableSharding or str
        One of our plans (each table plan by :func:`torchrec_sharding`: those TorchRec runs
        directly map exactly; equal ranges become TorchRec's ``ceil(H / n)``-row blocks), or
        the shardings themselves (strings as in :meth:`TableSharding.parse`).
    tables : sequence of EmbeddingTable, optional
        With a mapping: the tables it must cover (each one, no other).

    Raises
    ------
    ConfigError
        A table TorchRec cannot run directly (:attr:`TorchRecSharding.indirect`: replicated or
        placed rows, a host tier, hashed or weighted ranges, GPUs out of TorchRec's order, column
        shards TorchRec's generator does not make), or a mapping that misses or adds tables.
        (A type TorchRec lacks for the table's kind is mapped; :meth:`TableSharding.check`
        refuses it.)
    """
    if isinstance(plan, Plan):
        return {name: torchrec_sharding(tp, plan.topology).table_sharding
                for name, tp in plan.tables.items()}
    out = {name: TableSharding.parse(s) for name, s in plan.items()}
    if tables is not None:
        names = [t.name for t in tables]
        missing, extra = set(names) - set(out), set(out) - set(names)
        if missing or extra:
            raise ConfigError(f"shardings must cover exactly the tables {names}: missing "
                              f"{sorted(missing)}, unknown {sorted(extra)}")
    return out
