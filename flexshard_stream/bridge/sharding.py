"""The one sharding rule: what a table plan becomes in TorchRec 1.8.

:class:`TableSharding` is a TorchRec sharding of one table (type, ranks, host, kernel);
:func:`table_shardings` gives it for every table of one of our plans, or says why TorchRec cannot
shard a table as planned. Export, estimator compat, runtime harness, execution profiles and the CLI
all ask this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..plans.plan import Plan, TablePlan
from ..plans.tables import EmbeddingTable
from .layout import torchrec_rw_shard_rows

__all__ = ["SHARDING_TYPES", "CPU_SHARDING_TYPES", "OPENED_SHARDING_TYPES", "TORCH_MODULE",
           "TableSharding", "table_shardings", "torchrec_row_blocks", "torchrec_column_block"]


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


#: The "kernel" of a data-parallel table run as a plain torch module (see :class:`TableSharding`).
TORCH_MODULE = "torch_module"


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
    ``_calculate_rw_shard_sizes_and_offsets``, :func:`~flexshard_stream.bridge.layout.
    torchrec_rw_shard_rows`; the input bucketization uses the same block, ``rw_sharding.py``
    ``RwSparseFeaturesDist``)."""
    return np.concatenate([[0], np.cumsum(torchrec_rw_shard_rows(num_rows, n))]).astype(np.int64)


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
