"""Export a plan for TorchRec 1.8 users: hot and cold tables, ID remap, constraints, sharding plan.

TorchRec cannot place an arbitrary set of rows (``docs/TORCHREC_COMPAT.md``): a table is sharded
whole (data-parallel, table-wise, column-wise) or in contiguous, equal row blocks (row-wise,
table-row-wise). A FlexShard plan (:mod:`flexshard_stream.plans.plan`) replicates individually
chosen rows. The export therefore splits every table ``T`` of a plan into at most two TorchRec
tables and renumbers the rows (:mod:`flexshard_stream.bridge.layout`):

``T__hot``
    the replicated rows, sharding type ``"data_parallel"`` (compute kernel ``"dense"``, the only one
    TorchRec 1.8 allows for data-parallel tables): the plan's global replicas (tier 0), plus its node
    replicas (tier 1) with ``node_replicas="hot"`` (the default; TorchRec has no one-copy-per-node
    sharding). Omitted when there are none.
``T__cold``
    every other row, sharding type ``"row_wise"`` (or ``"table_row_wise"`` / ``"table_wise"``, see
    ``cold_sharding``), compute kernel ``"fused"``. Omitted when every row is hot.
the remap (``T.remap_exceptions.npy``, ``T.remap_segments.npy``)
    a bijection of ``[0, H)`` (:class:`~flexshard_stream.bridge.remap.IdRemap`): the
    replicated and explicitly placed rows in a sorted map, every other row by arithmetic, so its
    size is that of the rows chosen individually, not the table's; ``new < K`` is row ``new`` of
    ``T__hot``, otherwise row ``new - K`` of ``T__cold`` (K = ``hot_rows`` in the manifest). The
    data loader sends hot IDs to feature ``<feature>__hot`` and cold IDs to ``<feature>__cold``
    (:meth:`TorchRecExport.remap_batch` in numpy; the torch module ``KJTRemap`` of
    :mod:`flexshard_stream.bridge.loader` on a ``KeyedJaggedTensor``).

Cold rows are numbered so that TorchRec's equal row blocks (``ceil(C / n)`` rows per rank,
``torchrec/distributed/sharding_plan.py`` l.181-237, the same block size the input bucketization
uses, ``sharding/rw_sharding.py`` l.429-431) hold, as far as their sizes allow, the rows the plan put
on that GPU (:mod:`~flexshard_stream.bridge.layout`). For a contiguous-range plan with no
replicas and block-sized ranges the remap is the identity.

Files written into ``out_dir`` (atomically; an existing export there is replaced, a file or any
other non-empty directory is refused: :func:`check_export_target`):

* ``torchrec_export.json``: the manifest (this module's own format, with a schema version; the
  returned dict);
* ``constraints.json``: per new table, exactly the fields of TorchRec 1.8's ``ParameterConstraints``
  (``PARAMETER_CONSTRAINTS_FIELDS``), enum values spelled as TorchRec spells them;
  :func:`torchrec_constraints` turns it into ``dict[str, ParameterConstraints]``;
* ``embedding_configs.json``: per new table, ``EmbeddingConfig`` / ``EmbeddingBagConfig`` fields;
  :func:`torchrec_embedding_configs` builds the objects;
* ``sharding_plan.json``: per new table its ``ParameterSharding`` (sharding type, compute kernel,
  ranks, each shard's rank, offsets and sizes), which :func:`torchrec_sharding_plan` turns into
  the ``ShardingPlan`` to pass as ``DistributedModelParallel(plan=...)``: the placement is ours,
  not TorchRec's planner's;
* ``<T>.remap_exceptions.npy`` and ``<T>.remap_segments.npy`` per table (int64, no pickles;
  ``<T>``: the table's name, or, long, unsafe or clashing, a short safe stem with a hash of it,
  ``formats.files.file_stems``; the manifest names each file).

torch and torchrec are never imported except by the loaders, which import them lazily.
``docs/TORCHREC_EXPORT.md`` states the mapping, what TorchRec cannot express, what runs, and how
much of the modelled benefit survives (:func:`plan_from_export` rebuilds the plan TorchRec will
actually run, in our plan type, for :func:`flexshard_stream.placement.cost.evaluate_analytic`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, FlexShardError, FormatError
from ..formats.fields import field_int, field_list, field_mapping, field_str
from ..formats.directories import check_output_directory, read_directory, staging_directory
from ..formats.files import file_stems, read_json, read_npy, write_json, write_npy
from ..formats.units import fmt_bytes
from ..optional import optional_imports
from ..plans.plan import ColdSharding, Plan, TablePlan
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..sources.ids import IdMode
from ..stats.batch import Batch
from ..stats.summary import FrequencySummary
from .layout import TableMapping, map_table
from .remap import IdRemap, regular_id
from .sharding import (
    COLD_SHARDINGS,
    COLLECTIONS,
    MODULE_PATHS,
    NODE_REPLICAS,
    TorchRecShard,
    torchrec_rw_shard_rows,
)

__all__ = ["export_torchrec", "load_torchrec_export", "plan_from_export", "TorchRecExport",
           "export_id_mode",
           "torchrec_constraints", "torchrec_embedding_configs", "torchrec_sharding_plan",
           "torchrec_rw_shard_rows", "check_export_target", "describe_export",
           "PARAMETER_CONSTRAINTS_FIELDS", "COLD_SHARDINGS", "NODE_REPLICAS",
           "EXPORT_SCHEMA_VERSION", "MANIFEST_FILE", "CONSTRAINTS_FILE", "CONFIGS_FILE",
           "SHARDING_PLAN_FILE", "EXPORT_FILES", "HOT_SUFFIX", "COLD_SUFFIX",
           "sharding_plan_from_doc",
           "MODULE_PATHS"]

TORCHREC_VERSION = "1.8.0"
#: Version 2: the compact remap (IdRemap) and sharding_plan.json; version 1 (a dense int64[H]
#: remap) is not read: export the plan again.
EXPORT_SCHEMA_VERSION = 2
EXPORT_FORMAT = "flexshard_stream.torchrec_export"
REMAP_ENCODING = "exceptions+segments"
MANIFEST_FILE = "torchrec_export.json"
#: The export directory's kind marker
#: (:func:`~flexshard_stream.formats.directories.staging_directory`).
EXPORT_KIND = "torchrec-export"
CONSTRAINTS_FILE = "constraints.json"
CONFIGS_FILE = "embedding_configs.json"
SHARDING_PLAN_FILE = "sharding_plan.json"
#: What an export directory holds (``fnmatch`` patterns): all a new export may replace; anything
#: else in it is a user's, and the export is refused rather than delete it.
EXPORT_FILES = (MANIFEST_FILE, CONSTRAINTS_FILE, CONFIGS_FILE, SHARDING_PLAN_FILE,
                "*.remap_exceptions.npy", "*.remap_segments.npy", "*.hot_ids.npy")
#: ``hot_capacity="auto"``: a live table's hot slots are its plan's hot rows times this, rounded up.
HOT_CAPACITY_FACTOR = 1.25
HOT_SUFFIX = "__hot"
COLD_SUFFIX = "__cold"

#: The fields of ``torchrec.distributed.planner.types.ParameterConstraints`` in TorchRec 1.8.0
#: (``types.py`` l.1551-1568 of the 1.8.0 wheel), in declaration order.
PARAMETER_CONSTRAINTS_FIELDS: tuple[str, ...] = (
    "sharding_types", "compute_kernels", "min_partition", "pooling_factors", "num_poolings",
    "batch_sizes", "is_weighted", "cache_params", "enforce_hbm", "stochastic_rounding",
    "bounds_check_mode", "feature_names", "output_dtype", "device_group", "key_value_params",
    "use_virtual_table")
# ParameterConstraints defaults (types.py l.1551-1568; POOLING_FACTOR = 1.0, constants.py l.20)
_PC_DEFAULTS: dict[str, Any] = {f: None for f in PARAMETER_CONSTRAINTS_FIELDS}
_PC_DEFAULTS.update(pooling_factors=[1.0], is_weighted=False, use_virtual_table=False)

# TorchRec 1.8 enum spellings: ShardingType (distributed/types.py l.142-162), EmbeddingComputeKernel
# (distributed/embedding_types.py l.87-108), DataType (torchrec/types.py l.54-69), PoolingType
# (modules/embedding_configs.py l.33-45).
_DATA_PARALLEL = "data_parallel"
_DENSE = "dense"
_FUSED = "fused"
_UVM_CACHING = "fused_uvm_caching"
_DATA_TYPE = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16"}


# ----------------------------------------------------------------------------- per-table mapping
def _hot_share(hot_ids: np.ndarray, s: FrequencySummary | None) -> float | None:
    """Access probability of the hot rows, from a frequency summary (None without one)."""
    if s is None or not s.total:
        return None
    p = s.top_est / s.total
    inside = np.isin(s.top_ids, hot_ids)
    n_top_hot = int(np.count_nonzero(inside))
    share = float(p[inside].sum()) + max(0, hot_ids.size - n_top_hot) * s.tail_probability()
    return min(1.0, max(0.0, share))


def _constraints(sharding: str, kernel: str, feature: str, pooling: float | None
                 ) -> dict[str, Any]:
    c = {f: (list(v) if isinstance(v, list) else v) for f, v in _PC_DEFAULTS.items()}
    c["sharding_types"] = [sharding]
    c["compute_kernels"] = [kernel]
    if pooling is not None:
        c["pooling_factors"] = [float(pooling)]
    c["feature_names"] = [feature]
    return c


def _config(t: EmbeddingTable, name: str, rows: int, feature: str) -> dict[str, Any]:
    bound = math.sqrt(1.0 / t.num_rows)
    cfg = {"name": name, "num_embeddings": int(rows), "embedding_dim": int(t.dim),
           "data_type": _DATA_TYPE[t.dtype], "feature_names": [feature],
           # TorchRec initializes U(-sqrt(1/num_embeddings), +...) by default
           # (embedding_configs.py l.409-419): pin the original table's range
           "weight_init_max": bound, "weight_init_min": -bound}
    if t.kind == "pooled":
        cfg["pooling"] = "SUM"
    return {"module": COLLECTIONS[t.kind],
            "config_class": "EmbeddingBagConfig" if t.kind == "pooled" else "EmbeddingConfig",
            "config": cfg}


# ----------------------------------------------------------------------------- export
def export_torchrec(plan: Plan, out_dir: str | os.PathLike, *, cold_sharding: str = "auto",
                    node_replicas: str = "hot",
                    summaries: Mapping[str, FrequencySummary] | None = None,
                    mean_lengths: Mapping[str, float] | None = None,
                    hot_capacity: "str | int | Mapping[str, int] | None" = None
                    ) -> dict[str, Any]:
    """Write ``plan`` as TorchRec 1.8 tables, constraints, a sharding plan and ID remaps.

    Parameters
    ----------
    plan : Plan
        Any plan (FlexShard, HugeCTR hybrid, the baselines).
    out_dir : path
        Output directory, created or replaced atomically. A file, or a non-empty directory that
        is not an export, is refused.
    cold_sharding : {"auto", "row_wise", "table_row_wise", "table_wise"}
        TorchRec sharding type of the cold tables. ``auto`` follows the sharding rule
        (:func:`~flexshard_stream.bridge.sharding.torchrec_sharding`): a table plan TorchRec
        runs directly keeps its type and ranks; otherwise ``table_wise`` when its cold rows are
        on one GPU, ``table_row_wise`` when they are on several GPUs of one node (not every GPU)
        and the table is pooled (TorchRec 1.8 offers no TWRW for sequence tables), else
        ``row_wise``.
    node_replicas : {"hot", "cold"}
        Where the plan's node replicas (tier 1, one copy per node: TorchRec has no such sharding)
        go. ``"hot"`` (default): into the data-parallel hot table; their lookups stay on the GPU
        (better than the plan's NVLink hop), but every GPU stores them (M times the plan's memory
        for them, reported as ``row_bytes_per_gpu`` in the manifest) and TorchRec all-reduces their
        gradient across all G GPUs instead of the N node copies. ``"cold"``: into the cold table, no
        memory above the plan's, but their lookups cross the network like any cold row (a plan
        made mostly of node replicas then keeps none of its benefit, docs/TORCHREC_EXPORT.md).
    hot_capacity : {"auto"} or int or mapping, optional
        A *live* export (:mod:`flexshard_stream.bridge.live`: deltas applied in a running job
        without a rebuild): every table that has cold rows gets a hot table of this many slots
        (``"auto"``: its plan's hot rows x :data:`HOT_CAPACITY_FACTOR`, rounded up; an int: that
        many for every such table; a mapping: per table name, the others ``"auto"``), its plan's
        hot rows in the first slots, and its cold table keeps *every* row of the table (hot rows'
        cold copies included), so a delta changes no shape. Default None: the static export
        (hot rows only in the hot table).
    summaries, mean_lengths : optional
        Frequency summaries and IDs per sample per table (by table name or feature). With a summary
        the constraints carry TorchRec ``pooling_factors`` split by access share: hot
        ``L * P(hot)``, cold ``L * (1 - P(hot))``; without, TorchRec's default ``[1.0]`` is written.

    Returns
    -------
    dict
        The manifest written to ``torchrec_export.json``.

    Raises
    ------
    ConfigError
        Unknown ``cold_sharding`` / ``node_replicas``, ``table_row_wise`` for a sequence table,
        an ``out_dir`` that is a file or a non-empty directory that is not an export, an empty
        plan.

    Notes
    -----
    Memory and time grow with the replicated and explicitly placed rows and the GPUs, not with the
    tables' rows (:class:`~flexshard_stream.bridge.remap.IdRemap`): a table of 10^9 rows, or
    of hashed 64-bit IDs, exports like a small one.
    """
    _check_export(plan, cold_sharding, node_replicas)
    out_dir = Path(out_dir)
    check_export_target(out_dir)
    _check_features(plan)
    _check_columns(plan)
    with staging_directory(out_dir, kind=EXPORT_KIND, legacy=(MANIFEST_FILE,),
                           owns=EXPORT_FILES) as tmp:
        stems = file_stems(plan.tables)   # unique, short, safe: never a table's file twice
        parts = [_export_table(tmp, stems[name], name, tp, plan.topology, cold_sharding,
                               node_replicas, summaries or {}, mean_lengths or {},
                               _capacity_of(hot_capacity, name, tp, node_replicas))
                 for name, tp in plan.tables.items()]
        manifest = _manifest(plan, cold_sharding, node_replicas, parts)
        _write_json(tmp / CONSTRAINTS_FILE, {
            "format": "torchrec.ParameterConstraints", "torchrec_version": TORCHREC_VERSION,
            "schema_version": EXPORT_SCHEMA_VERSION,
            "constraints": {k: c for p in parts for k, c in p.constraints.items()}})
        _write_json(tmp / CONFIGS_FILE, {
            "format": "torchrec.EmbeddingConfigs", "torchrec_version": TORCHREC_VERSION,
            "schema_version": EXPORT_SCHEMA_VERSION,
            "tables": [c for p in parts for c in p.configs]})
        _write_json(tmp / SHARDING_PLAN_FILE, {
            "format": "torchrec.ShardingPlan", "torchrec_version": TORCHREC_VERSION,
            "schema_version": EXPORT_SCHEMA_VERSION, "world_size": plan.topology.num_gpus,
            "local_world_size": plan.topology.gpus_per_node,
            "tables": {k: v for p in parts for k, v in p.shardings.items()}})
        _write_json(tmp / MANIFEST_FILE, manifest)
        load_torchrec_export(tmp)  # verify before publishing
    return manifest


def _check_export(plan: Plan, cold_sharding: str, node_replicas: str) -> None:
    """The arguments of :func:`export_torchrec` (ConfigError naming the bad one)."""
    if not isinstance(plan, Plan):
        raise ConfigError(f"export_torchrec needs a Plan, got {type(plan).__name__}")
    if cold_sharding not in COLD_SHARDINGS:
        raise ConfigError(f"cold_sharding must be one of {list(COLD_SHARDINGS)}, got "
                          f"{cold_sharding!r}")
    if node_replicas not in NODE_REPLICAS:
        raise ConfigError(f"node_replicas must be one of {list(NODE_REPLICAS)}, got "
                          f"{node_replicas!r}")
    if not plan.tables:
        raise ConfigError("the plan has no tables to export")


def _capacity_of(hot_capacity: Any, name: str, tp: TablePlan, node_replicas: str
                 ) -> int | None:
    """Hot slots of table ``name`` in a live export (None: a static export, or a table with no
    cold rows); ConfigError for a capacity that is not an int >= the plan's hot rows."""
    if hot_capacity is None or tp.replicated:
        return None
    hot = tp.global_ids.size + (tp.node_ids.size if node_replicas == "hot" else 0)
    cap = hot_capacity.get(name, "auto") if isinstance(hot_capacity, Mapping) else hot_capacity
    if cap == "auto":
        return int(math.ceil(hot * HOT_CAPACITY_FACTOR))
    if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < hot \
            or cap > tp.table.num_rows:
        raise ConfigError(f"hot_capacity of table {name!r}: expected 'auto' or an int in "
                          f"[{hot}, {tp.table.num_rows}] (its plan's hot rows .. its rows), "
                          f"got {cap!r}")
    return int(cap)


def check_export_target(out_dir: str | os.PathLike) -> None:
    """Refuse to replace anything but an export or an empty directory (it would be deleted): a
    file, a non-empty directory that is not an export (no kind marker, nor a manifest of an
    export written before markers), or an export holding a file it does not write
    (:data:`EXPORT_FILES`: a user's) is a :class:`ConfigError`. The one check of what an export
    may overwrite (``export_torchrec`` and ``flexshard-stream export``)."""
    check_output_directory(Path(out_dir), EXPORT_KIND, legacy=(MANIFEST_FILE,),
                           owns=EXPORT_FILES)


def _check_columns(plan: Plan) -> None:
    """Column shards have no export yet (the cold table would need TorchRec's column_wise with
    the plan's widths and ranks): refuse rather than export them as one table."""
    cw = [n for n, tp in plan.tables.items() if tp.column_wise]
    if cw:
        raise ConfigError(f"tables {cw} are column-wise: the export writes row-wise, "
                          f"table-row-wise, table-wise and data-parallel tables only; run "
                          f"column-wise plans with online.torchrec_runtime.sharding_plan")


def _check_features(plan: Plan) -> None:
    """One table per feature: the export splits each feature into ``__hot`` and ``__cold``."""
    features: dict[str, str] = {}
    for tp in plan.tables.values():
        if tp.table.feature in features:
            raise ConfigError(f"tables {features[tp.table.feature]!r} and {tp.name!r} share the "
                              f"feature {tp.table.feature!r}; the export splits features per table")
        features[tp.table.feature] = tp.name


@dataclass
class _TableExport:
    """One original table, exported: its manifest entry, the constraints, embedding configs and
    sharding-plan entries of its new tables, and the bytes of stored rows per GPU under the plan
    and under TorchRec."""

    entry: dict[str, Any]
    constraints: dict[str, dict[str, Any]]
    configs: list[dict[str, Any]]
    shardings: dict[str, dict[str, Any]]
    plan_row_bytes: np.ndarray          # bytes per GPU
    export_row_bytes: np.ndarray        # bytes per GPU


def _export_table(tmp: Path, stem: str, name: str, tp: TablePlan, topo: Topology,
                  cold_sharding: str, node_replicas: str,
                  summaries: Mapping[str, FrequencySummary],
                  mean_lengths: Mapping[str, float], capacity: int | None = None
                  ) -> _TableExport:
    """Split table ``name`` into its hot and cold TorchRec tables and write its remap arrays into
    ``tmp`` as ``<stem>.remap_*.npy`` (``stem``: the table's unique file stem; with
    ``capacity``: the live layout, :func:`_live_mapping`)."""
    t = tp.table
    m = map_table(tp, topo, cold_sharding, node_replicas) if capacity is None else \
        _live_mapping(tp, topo, cold_sharding, node_replicas, capacity)
    rows = np.full(topo.num_gpus, m.hot_rows, np.int64)
    if m.cold is not None:
        rows[m.cold.ranks] += m.cold.shard_rows
    pb = tp.rows_per_gpu(topo) * float(t.row_bytes)
    eb = rows * float(t.row_bytes)
    L, share = _length_and_hot_share(name, tp, m, summaries, mean_lengths)
    pf_hot = pf_cold = None
    if L is not None and share is not None:
        pf_hot, pf_cold = float(L) * share, float(L) * (1.0 - share)
    notes = list(m.notes)
    if pf_hot is None:
        notes.append("pooling_factors: TorchRec's default [1.0] (pass summaries=, or export "
                     "--stats FILE, to split the mean length by access share)")
    remap = {"encoding": REMAP_ENCODING, "rows": t.num_rows}
    for part in ("exceptions", "segments"):
        arr = getattr(m.remap, part)
        fn = f"{stem}.remap_{part}.npy"
        remap[part] = {"file": fn, "dtype": "int64", "shape": list(arr.shape),
                       "sha256": write_npy(tmp / fn, arr, mode=0o644)}
    live = None
    if capacity is not None:
        live = {"hot_capacity": capacity, "plan_hot_rows": int(m.hot_ids.size),
                "hot_ids": {"file": f"{stem}.hot_ids.npy", "dtype": "int64",
                            "shape": list(m.hot_ids.shape),
                            "sha256": write_npy(tmp / f"{stem}.hot_ids.npy", m.hot_ids,
                                                mode=0o644)}}
    out = _TableExport({}, {}, [], {}, pb, eb)
    hot = _hot_table(out, name, t, m, pf_hot, topo) if m.hot_rows else None
    cold = _cold_table(out, name, tp, topo, m, pf_cold) if m.cold is not None else None
    out.entry = {
        "table": name, "source_table": dataclasses.asdict(t),
        "hot_rows": m.hot_rows, "hot": hot, "cold": cold, "live": live,
        "node_replicas": node_replicas if tp.node_ids.size else None,
        "hot_access_share": share,
        "row_bytes_per_gpu_max": {"plan": float(pb.max()), "export": float(eb.max())},
        "mean_length": None if L is None else float(L),
        "plan_cold": tp.cold.to_dict(), "plan_tiers": tp.tier_sizes(),
        "remap": remap, "remap_bytes": m.remap.nbytes, "notes": notes}
    return out


def _live_mapping(tp: TablePlan, topo: Topology, cold_sharding: str, node_replicas: str,
                  capacity: int) -> TableMapping:
    """The live layout of one table: its cold table holds every row, laid out as the plan's
    cold function would without replicas (the remap gives each row's cold index), and its hot
    table ``capacity`` slots, the plan's hot rows (``hot_ids``, by ID) in the first ones.
    ``hot_rows`` is then the hot table's rows (the capacity), not the plan's."""
    empty = np.zeros(0, np.int64)
    cold = map_table(dataclasses.replace(tp, global_ids=empty, node_ids=empty,
                                         node_local=np.zeros(0, np.int32)),
                     topo, cold_sharding, node_replicas)
    hot = tp.global_ids if node_replicas != "hot" else np.union1d(tp.global_ids, tp.node_ids)
    return dataclasses.replace(cold, hot_rows=int(capacity), live=True,
                               hot_ids=hot.astype(np.int64),
                               global_rows=int(tp.global_ids.size),
                               node_rows_hot=int(tp.node_ids.size) if node_replicas == "hot"
                               else 0,
                               notes=cold.notes + [f"live: {capacity} hot slots ({hot.size} "
                                                   f"hot rows); the cold table holds every "
                                                   f"row"])


def _length_and_hot_share(name: str, tp: TablePlan, m: TableMapping,
                          summaries: Mapping[str, FrequencySummary],
                          mean_lengths: Mapping[str, float]) -> tuple[float | None, float | None]:
    """IDs per sample (given by table name or feature, else the summary's mean length) and the
    hot rows' access probability (1 when every row is hot; None without a summary)."""
    t = tp.table
    s = summaries_by_table([t], summaries, required=False)[t.name]
    L = mean_lengths.get(name, mean_lengths.get(t.feature))
    if L is None and s is not None:
        L = s.mean_length or None
    share = _hot_share(m.hot_ids, s) if m.cold is not None else 1.0
    return L, share


def _shard_entry(module: str, sharding: str, kernel: str, ranks: Sequence[int],
                 shards: Sequence[TorchRecShard] | None) -> dict[str, Any]:
    """One table of ``sharding_plan.json``: what ``ParameterSharding`` holds (``shards``: row
    and column offsets and sizes of each rank's shard, the sharding rule's; None for
    data-parallel)."""
    entries = None
    if shards is not None:
        entries = [{"rank": s.rank, "offsets": list(s.offsets), "sizes": list(s.sizes)}
                   for s in shards]
    return {"module": module, "sharding_type": sharding, "compute_kernel": kernel,
            "ranks": [int(r) for r in ranks], "shards": entries, "cache_params": None}


def _module_of(t: EmbeddingTable) -> str:
    return COLLECTIONS[t.kind]


def _hot_table(out: _TableExport, name: str, t: EmbeddingTable, m: TableMapping,
               pooling: float | None, topo: Topology) -> dict[str, Any]:
    """``<name>__hot``: data-parallel, dense kernel; its constraints, config and sharding go into
    ``out``; returns its manifest entry."""
    hname, hfeat = name + HOT_SUFFIX, t.feature + HOT_SUFFIX
    out.constraints[hname] = _constraints(_DATA_PARALLEL, _DENSE, hfeat, pooling)
    out.configs.append(_config(t, hname, m.hot_rows, hfeat))
    out.shardings[hname] = _shard_entry(_module_of(t), _DATA_PARALLEL, _DENSE,
                                        range(topo.num_gpus), None)
    return {"table": hname, "feature": hfeat, "rows": m.hot_rows,
            "sharding_type": _DATA_PARALLEL, "global_rows": m.global_rows,
            "node_rows": m.node_rows_hot,
            # DDP all-reduces the dense gradient of a data-parallel table every
            # iteration (model_parallel.py l.163-190), touched or not
            "dense_grad_bytes": m.hot_rows * t.embedding_bytes}


def _cold_table(out: _TableExport, name: str, tp: TablePlan, topo: Topology,
                m: TableMapping, pooling: float | None) -> dict[str, Any]:
    """``<name>__cold``: the mapping's sharding type, fused kernel (UVM caching when the plan
    has a host memory tier); its constraints, config and sharding go into ``out``; returns its
    manifest entry."""
    t, c = tp.table, m.cold
    cname, cfeat = name + COLD_SUFFIX, t.feature + COLD_SUFFIX
    cons = _constraints(c.sharding_type, _FUSED, cfeat, pooling)
    out.constraints[cname] = cons
    out.configs.append(_config(t, cname, m.cold_rows, cfeat))
    shard = _shard_entry(_module_of(t), c.sharding_type, _FUSED, c.ranks.tolist(),
                         m.sharding.runs_as.shards)
    out.shardings[cname] = shard
    cold = {"table": cname, "feature": cfeat,
            **c.entry(m.cold_rows, tp.placed_ids.size, m.node_rows_cold), "notes": c.notes}
    if tp.has_host_tier:
        # the RecShard tier: TorchRec keeps such a table in UVM with an HBM cache; its load
        # factor is the plan's share of the cold rows kept in HBM (the cache picks rows by
        # frequency, as the plan's split does)
        host = float(tp.host_rows_per_gpu(topo).sum())
        lf = min(1.0, max(0.0, 1.0 - host / max(m.cold_rows, 1)))
        cons["compute_kernels"] = [_UVM_CACHING]
        cons["cache_params"] = {"algorithm": "LFU", "load_factor": lf}
        shard["compute_kernel"] = _UVM_CACHING
        shard["cache_params"] = dict(cons["cache_params"])
        cold["host_rows"] = host
        cold["hbm_load_factor"] = lf
    return cold


def _manifest(plan: Plan, cold_sharding: str, node_replicas: str,
              parts: list[_TableExport]) -> dict[str, Any]:
    """``torchrec_export.json``: the export's own format (see the module docstring)."""
    topo = plan.topology
    plan_bytes, export_bytes = np.zeros(topo.num_gpus), np.zeros(topo.num_gpus)
    for p in parts:
        plan_bytes += p.plan_row_bytes
        export_bytes += p.export_row_bytes
    return {
        "format": EXPORT_FORMAT, "schema_version": EXPORT_SCHEMA_VERSION,
        "torchrec_version": TORCHREC_VERSION, "strategy": plan.strategy,
        "topology": topo.to_dict(), "world_size": topo.num_gpus,
        "local_world_size": topo.gpus_per_node, "cold_sharding": cold_sharding,
        "node_replicas": node_replicas,
        # how the loader's IDs become rows, as the plan recorded it (``plan`` does; None when the
        # plan does not say): the drop-ins default to it
        "ids": (None if plan.meta.get("ids") is None else str(IdMode.parse(plan.meta["ids"]))),
        # stored rows (embedding + optimizer state) per GPU, plan vs TorchRec export
        "row_bytes_per_gpu": {"plan": plan_bytes.tolist(), "export": export_bytes.tolist()},
        "remap_encoding": "new = remap(id) (IdRemap: sorted exceptions + runs by arithmetic); "
                          "new < hot_rows: row new of <table>__hot (feature <feature>__hot); "
                          "else row new - hot_rows of <table>__cold (feature <feature>__cold)",
        "files": {"constraints": CONSTRAINTS_FILE, "embedding_configs": CONFIGS_FILE,
                  "sharding_plan": SHARDING_PLAN_FILE},
        "tables": [p.entry for p in parts]}


def _write_json(path: Path, doc: Any) -> None:
    """An export JSON file (atomically, ``0o644``; non-finite numbers kept, as ever)."""
    write_json(path, doc, indent=1, allow_nonfinite=True, mode=0o644)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """An export JSON file with a ``schema_version`` this module reads; FormatError naming the
    file otherwise."""
    if not path.exists():
        raise FormatError(f"{path}: no {what} file")
    doc = read_json(path, what, allow_nonfinite=True)
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise FormatError(f"{path}: not a flexshard_stream {what} (no schema_version)")
    if doc["schema_version"] != EXPORT_SCHEMA_VERSION:
        raise FormatError(f"{path}: {what} schema version {doc['schema_version']!r} is not "
                          f"supported (this flexshard_stream reads version "
                          f"{EXPORT_SCHEMA_VERSION}; export the plan again)")
    return doc


def describe_export(manifest: Mapping[str, Any]) -> list[str]:
    """Human lines (under 80 columns for names up to 30 characters) about an export: per table
    its hot and cold TorchRec tables, the cold rows kept on their plan GPU and the remap's size;
    then the stored bytes per GPU, plan vs export."""
    lines = [f"{manifest['strategy']} plan on {manifest['world_size']} GPUs "
             f"({manifest['local_world_size']} per node) for TorchRec "
             f"{manifest['torchrec_version']}:"]
    for e in manifest["tables"]:
        lines.append(f"  {e['table']} (remap {fmt_bytes(e['remap_bytes'])})")
        if e["hot"]:
            lines.append(f"    {e['hot']['table']}: data_parallel, {e['hot']['rows']:,} rows")
        c = e["cold"]
        if c:
            kept = ("" if c["rows_on_plan_gpu"] is None else
                    f", {c['rows_on_plan_gpu'] / max(c['rows'], 1):.1%} on plan GPU")
            lines.append(f"    {c['table']}: {c['sharding_type']}, {c['rows']:,} rows{kept}")
    rb = manifest["row_bytes_per_gpu"]
    lines.append(f"stored rows per GPU, max: plan {fmt_bytes(max(rb['plan']))}, export "
                 f"{fmt_bytes(max(rb['export']))}")
    return lines


# ----------------------------------------------------------------------------- reading back
@dataclass(frozen=True, eq=False)
class TorchRecExport:
    """A verified export: the manifest and the :class:`IdRemap` of every original table.

    The numpy side of the data loader's step (the torch twin is
    ``flexshard_stream.bridge.loader.KJTRemap``: identical IDs)."""

    path: Path
    manifest: dict[str, Any]
    remaps: dict[str, IdRemap]
    #: Per live table (``hot_capacity``), the plan's hot rows by ID (slot i holds row i).
    hot_ids: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Exported with ``hot_capacity`` (some table's rows move by :mod:`.live` deltas)."""
        return bool(self.hot_ids) or any(e.get("live") for e in self.manifest["tables"])

    def _static(self, table: str, what: str) -> dict[str, Any]:
        """The entry of ``table``; ConfigError if it is live (its rows are not one remap's)."""
        e = self.entry(table)
        if e.get("live"):
            raise ConfigError(f"{self.path}: table {table!r} is a live export (hot_capacity): "
                              f"{what} maps rows through the live remap "
                              f"(flexshard_stream.bridge.live), not the export's")
        return e

    def entry(self, table: str) -> dict[str, Any]:
        """The manifest entry of an original table."""
        for e in self.manifest["tables"]:
            if e["table"] == table:
                return e
        raise KeyError(f"no table {table!r} in the export; have "
                       f"{[e['table'] for e in self.manifest['tables']]}")

    def hot_rows(self, table: str) -> int:
        """K: rows of ``<table>__hot``; remapped IDs below K are hot."""
        return int(self.entry(table)["hot_rows"])

    def apply(self, table: str, ids: Any) -> np.ndarray:
        """New index (int64) of each original ID of ``table`` (static tables only)."""
        return self.remaps[self._static(table, "apply")["table"]].apply(ids, f"table {table!r}")

    def split(self, table: str, ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(is_hot, hot_ids, cold_ids)`` for original IDs of ``table``: the data loader's step."""
        new = self.apply(table, ids)
        K = self.hot_rows(table)
        is_hot = new < K
        return is_hot, new[is_hot], new[~is_hot] - K

    def split_jagged(self, table: str, values: Any, lengths: Any
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Split a jagged feature (KJT ``values``/``lengths`` of one key) into the hot and cold
        features: ``(hot_values, hot_lengths, cold_values, cold_lengths, is_hot)``. Order within a
        sample is kept; ``is_hot`` puts a sequence back together (``out[is_hot] = hot_embeddings``,
        ``out[~is_hot] = cold_embeddings``); for SUM-pooled tables add the two pooled outputs."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or (lengths.size and lengths.min() < 0):
            raise ConfigError(f"table {table!r}: lengths must be a 1-d array of counts >= 0")
        values = np.asarray(values)
        if int(lengths.sum()) != values.size:
            raise ConfigError(f"table {table!r}: lengths sum to {int(lengths.sum())} but there are "
                              f"{values.size} values")
        is_hot, hot, cold = self.split(table, values)
        csum = np.concatenate([[0], np.cumsum(is_hot, dtype=np.int64)])
        ends = np.cumsum(lengths)
        hl = csum[ends] - csum[ends - lengths]
        return hot, hl, cold, lengths - hl, is_hot

    def table_of_feature(self, feature: str) -> str | None:
        """The original table a batch key feeds (None if no exported table reads it)."""
        for e in self.manifest["tables"]:
            if (e["source_table"]["feature"] or e["table"]) == feature:
                return e["table"]
        return None

    def remap_batch(self, batch: Batch) -> tuple[Batch, dict[str, np.ndarray]]:
        """A :class:`Batch` of original IDs as the exported model reads it: every exported
        feature ``f`` becomes ``f__hot`` and / or ``f__cold`` (the parts the table has, hot first),
        other keys pass through; weights follow their IDs. Returns the batch and, per exported
        feature, ``is_hot`` (bool per value). The numpy twin of ``KJTRemap``."""
        keys, vals, lens, wts, masks = [], [], [], [], {}
        offs = batch.key_offsets()
        for i, key in enumerate(batch.keys):
            v = batch.values[offs[i]:offs[i + 1]]
            w = None if batch.weights is None else batch.weights[offs[i]:offs[i + 1]]
            ln = batch.feature_lengths(key)
            table = self.table_of_feature(key)
            if table is None:
                keys.append(key), vals.append(v), lens.append(ln), wts.append(w)
                continue
            hv, hl, cv, cl, is_hot = self.split_jagged(table, v, ln)
            masks[key] = is_hot
            e = self.entry(table)
            for part, pv, pl, pw in (("hot", hv, hl, None if w is None else w[is_hot]),
                                     ("cold", cv, cl, None if w is None else w[~is_hot])):
                if e[part] is not None:
                    keys.append(e[part]["feature"]), vals.append(pv), lens.append(pl)
                    wts.append(pw)
        weights = None if batch.weights is None else np.concatenate(wts)
        return Batch(keys, np.concatenate(vals), np.concatenate(lens), weights,
                     batch.timestamp), masks

    def new_tables(self) -> list[EmbeddingTable]:
        """The exported tables (``<table>__hot``, ``<table>__cold``) as :class:`EmbeddingTable`
        rows, in export order, each fed by its own feature."""
        out = []
        for e in self.manifest["tables"]:
            src = EmbeddingTable(**e["source_table"])
            for part in ("hot", "cold"):
                p = e[part]
                if p is not None:
                    out.append(dataclasses.replace(src, name=p["table"], num_rows=p["rows"],
                                                   feature=p["feature"]))
        return out

    def split_rows(self, table: str, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Per-row data of an original table (weights, gradients: ``rows[id]``) as the exported
        tables hold it: ``{<table>__hot: rows[ids of hot rows 0..K-1], <table>__cold: ...}``.
        ``O(H)``: for moving trained weights. A live table: the hot slots hold its plan's hot
        rows (zeros in the free slots), the cold table every row."""
        e = self.entry(table)
        remap = self.remaps[e["table"]]
        K = int(e["hot_rows"])
        if e.get("live"):
            return self._live_split_rows(e, rows)
        out = {}
        for part, lo, hi in (("hot", 0, K), ("cold", K, remap.num_rows)):
            if e[part] is not None:
                out[e[part]["table"]] = rows[remap.original(np.arange(lo, hi, dtype=np.int64))]
        return out

    def _live_split_rows(self, e: Mapping[str, Any], rows: np.ndarray) -> dict[str, np.ndarray]:
        remap, ids = self.remaps[e["table"]], self.hot_ids[e["table"]]
        out = {}
        if e["hot"] is not None:
            hot = np.zeros((int(e["hot_rows"]),) + rows.shape[1:], rows.dtype)
            hot[:ids.size] = rows[ids]
            out[e["hot"]["table"]] = hot
        out[e["cold"]["table"]] = rows[remap.original(np.arange(remap.num_rows, dtype=np.int64))]
        return out

    def merge_rows(self, table: str, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        """The inverse of :meth:`split_rows`: per-row data of the exported tables back on the
        original rows (e.g. a run's gradients); static tables only."""
        e = self._static(table, "merge_rows")
        remap = self.remaps[e["table"]]
        K = int(e["hot_rows"])
        first = next(iter(parts.values()))
        out = np.zeros((remap.num_rows,) + first.shape[1:], first.dtype)
        for part, lo in (("hot", 0), ("cold", K)):
            if e[part] is not None:
                rows = parts[e[part]["table"]]
                out[remap.original(np.arange(lo, lo + rows.shape[0], dtype=np.int64))] = rows
        return out

    def sharding_plan_doc(self) -> dict[str, Any]:
        """``sharding_plan.json``: per exported table, its ``ParameterSharding`` as JSON."""
        return _read_json(self.path / SHARDING_PLAN_FILE, "sharding plan")


def load_torchrec_export(path: str | os.PathLike) -> TorchRecExport:
    """Read an export directory, verifying its version, the remap checksums and that every remap
    is a bijection of its table's rows (in time and memory of the remap's size, not the
    table's). Every file comes from one version of a replaced export (the returned ``path`` is
    that version's directory: :func:`~flexshard_stream.formats.directories.read_directory`)."""
    return read_directory(path, _load_export)


def _load_export(path: Path) -> TorchRecExport:
    """:func:`load_torchrec_export` of the resolved directory."""
    doc = _read_json(path / MANIFEST_FILE, "TorchRec export manifest")
    if doc.get("format") != EXPORT_FORMAT:
        raise FormatError(f"{path / MANIFEST_FILE}: format {doc.get('format')!r}, expected "
                          f"{EXPORT_FORMAT!r}")
    _check_id_mode(doc, path / MANIFEST_FILE)
    remaps, hot_ids = {}, {}
    try:
        for e in doc["tables"]:
            spec = e["remap"]
            if spec.get("encoding") != REMAP_ENCODING:
                raise FormatError(f"{path / MANIFEST_FILE}: table {e['table']!r}: remap "
                                  f"encoding {spec.get('encoding')!r}, expected "
                                  f"{REMAP_ENCODING!r}")
            arrays = {}
            for part in ("exceptions", "segments"):
                s = spec[part]
                arr = read_npy(path, s["file"], s["sha256"], "remap file")
                if arr.dtype != np.int64 or list(arr.shape) != s["shape"]:
                    raise FormatError(f"{path / s['file']}: {arr.dtype} {list(arr.shape)}, "
                                      f"expected int64 {s['shape']}")
                arrays[part] = arr
            remap = IdRemap(int(spec["rows"]), arrays["exceptions"], arrays["segments"])
            remap.verify(f"{path}: table {e['table']!r} remap")
            _check_entry(e, remap.num_rows, f"{path / MANIFEST_FILE}: table {e['table']!r}")
            remaps[e["table"]] = remap
            if e.get("live"):
                hot_ids[e["table"]] = _read_hot_ids(path, e, remap.num_rows)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        if isinstance(err, FlexShardError):
            raise
        raise FormatError(f"{path / MANIFEST_FILE}: inconsistent manifest "
                          f"({type(err).__name__}: {err})") from None
    return TorchRecExport(path, doc, remaps, hot_ids)


def _check_id_mode(doc: Mapping[str, Any], where: Path) -> None:
    """The manifest's ``ids`` is absent, null or an ID mode; FormatError naming the file and the
    value otherwise."""
    spec = doc.get("ids")
    if spec is None:
        return
    try:
        if not isinstance(spec, str):
            raise TypeError
        IdMode.parse(spec)
    except (FlexShardError, TypeError):
        raise FormatError(f"{where}: ids {spec!r} is not an ID mode (raw, hash or hash:ROWS)"
                          ) from None


def export_id_mode(export: TorchRecExport) -> IdMode | None:
    """How the export's plan took the loader's IDs to rows: the manifest's ``ids``, recorded from
    the plan's ``meta["ids"]``; None when the plan did not record it (or predates it)."""
    spec = export.manifest.get("ids")
    return None if spec is None else IdMode.parse(spec)


def _read_hot_ids(path: Path, e: Mapping[str, Any], rows: int) -> np.ndarray:
    """A live table's plan hot rows (``<T>.hot_ids.npy``: sorted, unique, in range, at most
    the capacity); FormatError naming the file otherwise."""
    s = e["live"]["hot_ids"]
    ids = read_npy(path, s["file"], s["sha256"], "hot IDs file")
    if ids.dtype != np.int64 or ids.ndim != 1 or list(ids.shape) != s["shape"] or \
            ids.size > int(e["live"]["hot_capacity"]) or \
            (ids.size and (ids[0] < 0 or ids[-1] >= rows or np.any(ids[1:] <= ids[:-1]))):
        raise FormatError(f"{path / s['file']}: expected sorted unique int64 row IDs in "
                          f"[0, {rows}), at most the hot capacity, shape {s['shape']}")
    return ids


def _check_part(e: Mapping[str, Any], key: str, where: str, *, required: bool
                ) -> Mapping[str, Any] | None:
    """An entry's ``hot`` or ``cold`` part: a mapping naming its TorchRec table and feature
    (None where it may be absent); FormatError naming the field otherwise."""
    if e.get(key) is None and not required:
        return None
    part = field_mapping(e, key, where)
    field_str(part, "table", f"{where}: {key}")
    field_str(part, "feature", f"{where}: {key}")
    return part


def _check_entry(e: Mapping[str, Any], rows: int, where: str) -> None:
    """The fields of one table's manifest entry that reading the export uses, against its remap
    of ``rows`` rows: the source table (as many rows), ``hot_rows`` in ``[0, rows]``, and the cold
    part's ranks (GPU indices) and shard rows (one per rank, adding up to the cold rows).
    FormatError naming the field otherwise."""
    try:
        t = EmbeddingTable(**field_mapping(e, "source_table", where))
    except ConfigError as err:
        raise FormatError(f"{where}: source_table: {err}") from None
    if t.num_rows != rows:
        raise FormatError(f"{where}: source_table has {t.num_rows} rows, its remap {rows}")
    hot = field_int(e, "hot_rows", where, hi=rows)
    field_mapping(e, "plan_cold", where)
    _check_part(e, "hot", where, required=bool(hot))
    cold = e.get("cold")
    if cold is None and hot == rows:
        return
    cold = _check_part(e, "cold", where, required=True)
    ranks, shard_rows = field_list(cold, "ranks", where), field_list(cold, "shard_rows", where)
    def ints_in(xs: list, hi: int) -> bool:
        return all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < hi for x in xs)

    cold_rows = rows if e.get("live") else rows - hot
    if not ranks or len(ranks) != len(shard_rows) or not ints_in(ranks, 2**31) or \
            not ints_in(shard_rows, 2**63) or sum(shard_rows) != cold_rows:
        raise FormatError(f"{where}: cold 'ranks' and 'shard_rows' must be lists of as many "
                          f"integers (ranks in [0, 2**31), rows in [0, 2**63)), the shard rows "
                          f"adding up to {cold_rows}")
    if e.get("live"):
        live = field_mapping(e, "live", where)
        cap = field_int(live, "hot_capacity", where, hi=rows)
        if cap != hot or (cap and (e.get("hot") or {}).get("rows") != cap):
            raise FormatError(f"{where}: live hot_capacity {cap} must equal hot_rows {hot} "
                              f"and the hot table's rows")


def plan_from_export(export: TorchRecExport | str | os.PathLike) -> Plan:
    """The plan TorchRec will run, in our plan type (strategy ``"torchrec_export"``), exactly.

    Per original table: hot rows become global replicas; every cold row is owned by the rank of
    its TorchRec block (``ranks[cold_index // ceil(C / n)]``): the remap's runs of regular rows,
    cut at the block boundaries, become a range cold function over original IDs (a GPU may hold
    several ranges), and the explicitly placed rows explicit placements. For ``table_wise`` /
    ``table_row_wise`` the rank / node is the one recorded in the export's sharding plan. Memory
    grows with the remap, not the table. Feed it to
    :func:`flexshard_stream.placement.cost.evaluate_analytic` to see how much of the plan's
    modelled benefit survives.
    """
    ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
    doc = ex.manifest
    if ex.live:
        raise ConfigError(f"{ex.path}: a live export (hot_capacity) runs the plan its current "
                          f"slot map says (flexshard_stream.bridge.live), not one fixed plan")
    try:
        topo = Topology.from_dict(doc["topology"])
        tps = [_table_plan_of(EmbeddingTable(**e["source_table"]), ex.remaps[e["table"]],
                              int(e["hot_rows"]), e["cold"]) for e in doc["tables"]]
        return Plan("torchrec_export", topo, tps,
                    {"source_strategy": doc.get("strategy"),
                     "cold_sharding": doc.get("cold_sharding"),
                     "node_replicas": doc.get("node_replicas")})
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError, IndexError) as err:
        if isinstance(err, ConfigError):
            raise FormatError(f"{ex.path}: inconsistent export ({err})") from None
        raise FormatError(f"{ex.path}: inconsistent export ({type(err).__name__}: {err})") \
            from None


def _table_plan_of(t: EmbeddingTable, remap: IdRemap, K: int,
                   cold: Mapping[str, Any] | None) -> TablePlan:
    """One table of :func:`plan_from_export`."""
    H = t.num_rows
    if K == H:
        return TablePlan(t, ColdSharding.replicated())
    exc = remap.exceptions
    hot = exc[:, 1] < K
    ranks = np.asarray(cold["ranks"], np.int64)
    block = -(-(H - K) // ranks.size)
    placed = exc[~hot]
    # runs of regular rows, cut where they cross a block boundary
    seg, lengths = remap.segments, remap.segment_lengths()
    c0 = seg[:, 1] - K
    first_block, last_block = c0 // block, (c0 + lengths - 1) // block
    n_cut = last_block - first_block + 1
    idx = np.repeat(np.arange(seg.shape[0]), n_cut)
    step = np.arange(idx.size) - np.repeat(np.cumsum(n_cut) - n_cut, n_cut)
    blk = first_block[idx] + step
    start_c = np.maximum(blk * block, c0[idx])
    start_rank = seg[idx, 0] + (start_c - c0[idx])
    owner = ranks[blk]
    keep = np.concatenate([[True], owner[1:] != owner[:-1]]) if owner.size else owner.astype(bool)
    bounds = regular_id(remap.exception_ids, start_rank[keep])
    if bounds.size:
        bounds[0] = 0
        cs = ColdSharding("range", owner[keep].astype(np.int32),
                          np.concatenate([bounds, [H]]).astype(np.int64))
    else:   # every cold row is placed explicitly: the cold function routes nothing
        cs = ColdSharding("range", ranks[:1].astype(np.int32), np.array([0, H], np.int64))
    return TablePlan(t, cs, global_ids=exc[hot, 0],
                     placed_ids=placed[:, 0],
                     placed_gpus=ranks[(placed[:, 1] - K) // block].astype(np.int32))


# ----------------------------------------------------------------------------- TorchRec loaders
def _import_torchrec(what: str) -> dict[str, Any]:
    with optional_imports("torchrec", f"{what} (the JSON files can be read without it)"):
        from torchrec.distributed.planner.types import ParameterConstraints
        from torchrec.distributed.types import (
            BoundsCheckMode,
            CacheAlgorithm,
            CacheParams,
            KeyValueParams,
        )
        from torchrec.modules.embedding_configs import (
            DataType,
            EmbeddingBagConfig,
            EmbeddingConfig,
            PoolingType,
        )
    return dict(ParameterConstraints=ParameterConstraints, BoundsCheckMode=BoundsCheckMode,
                CacheAlgorithm=CacheAlgorithm, CacheParams=CacheParams,
                KeyValueParams=KeyValueParams, DataType=DataType,
                EmbeddingBagConfig=EmbeddingBagConfig, EmbeddingConfig=EmbeddingConfig,
                PoolingType=PoolingType)


def _enum(cls: Any, value: Any, where: str) -> Any:
    """A TorchRec / FBGEMM enum member from its JSON spelling (value, else member name)."""
    try:
        return cls(value)
    except (ValueError, KeyError, TypeError):
        pass
    try:
        return cls[value]
    except (KeyError, TypeError):
        raise ConfigError(f"{where} = {value!r}: not a {cls.__name__} "
                          f"(valid: {[m.name for m in cls]})") from None


def _dataclass_from(cls: Any, d: Any, where: str, convert: Mapping[str, Any]) -> Any:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected an object, got {d!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown} for {cls.__name__}")
    kw = {}
    for k, v in d.items():
        if v is not None and k in convert:
            v = convert[k](v, f"{where}.{k}")
        kw[k] = v
    return cls(**kw)


def torchrec_constraints(path: str | os.PathLike) -> dict[str, Any]:
    """``{table: torchrec ParameterConstraints}`` from an export's ``constraints.json``.

    ``path`` is the file or the export directory. TorchRec is imported here, lazily; without it
    this raises ``ImportError`` saying what to install. Enum fields are converted from their JSON
    spelling (``bounds_check_mode``: FBGEMM ``BoundsCheckMode`` name; ``output_dtype``: TorchRec
    ``DataType`` value; ``cache_params`` / ``key_value_params``: objects of the dataclass fields).
    A field the installed TorchRec does not know is dropped when it holds TorchRec 1.8's default
    and refused otherwise.

    Usage::

        planner = EmbeddingShardingPlanner(topology=..., constraints=torchrec_constraints(out_dir))
    """
    p = Path(path)
    if p.is_dir():
        p = p / CONSTRAINTS_FILE
    doc = _read_json(p, "constraints")
    cons = doc.get("constraints")
    if not isinstance(cons, dict):
        raise FormatError(f"{p}: no 'constraints' object")
    tr = _import_torchrec("torchrec_constraints")
    PC = tr["ParameterConstraints"]
    have = {f.name for f in dataclasses.fields(PC)}

    def dtype(v, w):
        return _enum(tr["DataType"], v, w)

    def cache(v, w):
        return _dataclass_from(tr["CacheParams"], v, w, {
            "algorithm": lambda x, w2: _enum(tr["CacheAlgorithm"], x, w2), "precision": dtype})

    def kv(v, w):
        return _dataclass_from(tr["KeyValueParams"], v, w, {
            "ps_hosts": lambda x, w2: tuple(tuple(h) for h in x)})

    convert = {"bounds_check_mode": lambda v, w: _enum(tr["BoundsCheckMode"], v, w),
               "output_dtype": dtype, "cache_params": cache, "key_value_params": kv}
    out = {}
    for name, fields in cons.items():
        where = f"{p}: constraints[{name!r}]"
        if not isinstance(fields, dict):
            raise ConfigError(f"{where}: expected an object of ParameterConstraints fields")
        kw = {}
        for k, v in fields.items():
            if k not in have:
                if k in _PC_DEFAULTS and v == _PC_DEFAULTS[k]:
                    continue
                raise ConfigError(f"{where}: field {k!r} = {v!r} is not a field of the installed "
                                  f"TorchRec's ParameterConstraints")
            kw[k] = convert[k](v, f"{where}.{k}") if (v is not None and k in convert) else v
        out[name] = PC(**kw)
    return out


def torchrec_embedding_configs(path: str | os.PathLike) -> list[Any]:
    """TorchRec ``EmbeddingConfig`` / ``EmbeddingBagConfig`` objects from an export's
    ``embedding_configs.json`` (the file or the export directory), in export order. Sequence tables
    give ``EmbeddingConfig`` (for an ``EmbeddingCollection``), pooled tables ``EmbeddingBagConfig``
    (``EmbeddingBagCollection``, SUM pooling). TorchRec is imported lazily."""
    p = Path(path)
    if p.is_dir():
        p = p / CONFIGS_FILE
    doc = _read_json(p, "embedding configs")
    tables = doc.get("tables")
    if not isinstance(tables, list):
        raise FormatError(f"{p}: no 'tables' list")
    tr = _import_torchrec("torchrec_embedding_configs")
    out = []
    for i, e in enumerate(tables):
        where = f"{p}: tables[{i}]"
        cls_name = e.get("config_class") if isinstance(e, dict) else None
        if cls_name not in ("EmbeddingConfig", "EmbeddingBagConfig"):
            raise ConfigError(f"{where}: config_class {cls_name!r}, expected EmbeddingConfig or "
                              f"EmbeddingBagConfig")
        out.append(_dataclass_from(tr[cls_name], e.get("config"), where, {
            "data_type": lambda v, w: _enum(tr["DataType"], v, w),
            "pooling": lambda v, w: _enum(tr["PoolingType"], v, w)}))
    return out


def sharding_plan_from_doc(doc: Mapping[str, Any], *, device: str = "cuda",
                           module_paths: Mapping[str, str] | None = None,
                           dense_sequence_hot: bool = False) -> Any:
    """The ``ShardingPlan`` of a ``sharding_plan.json`` document (see
    :func:`torchrec_sharding_plan`). TorchRec is imported here, lazily."""
    with optional_imports("torchrec", "a TorchRec ShardingPlan"):
        from torchrec.distributed.sharding_plan import placement
        from torchrec.distributed.types import (
            CacheAlgorithm,
            CacheParams,
            EmbeddingModuleShardingPlan,
            EnumerableShardingSpec,
            ParameterSharding,
            ShardingPlan,
            ShardMetadata,
        )

    paths = dict(MODULE_PATHS, **(module_paths or {}))
    local = int(doc["local_world_size"])
    plans: dict[str, dict[str, Any]] = {}
    for name, e in doc["tables"].items():
        if dense_sequence_hot and e["module"] == "EmbeddingCollection" and \
                e["sharding_type"] == "data_parallel":
            continue
        spec = None
        if e["shards"] is not None:
            spec = EnumerableShardingSpec([
                ShardMetadata(shard_offsets=list(s["offsets"]), shard_sizes=list(s["sizes"]),
                              placement=placement(device, int(s["rank"]), local))
                for s in e["shards"]])
        cache = None
        if e.get("cache_params"):
            c = e["cache_params"]
            cache = CacheParams(algorithm=CacheAlgorithm[c["algorithm"]],
                                load_factor=c["load_factor"])
        if e["module"] not in paths:
            raise ConfigError(f"sharding plan table {name!r}: unknown module {e['module']!r}")
        plans.setdefault(paths[e["module"]], {})[name] = ParameterSharding(
            sharding_type=e["sharding_type"], compute_kernel=e["compute_kernel"],
            ranks=list(e["ranks"]), sharding_spec=spec, cache_params=cache)
    return ShardingPlan({p: EmbeddingModuleShardingPlan(d) for p, d in plans.items()})


def torchrec_sharding_plan(path: str | os.PathLike, *, device: str = "cuda",
                           module_paths: Mapping[str, str] | None = None,
                           dense_sequence_hot: bool | None = None) -> Any:
    """The TorchRec ``ShardingPlan`` of an export, for ``DistributedModelParallel(plan=...)``.

    Built from ``sharding_plan.json`` (every ``ParameterSharding`` with its ranks, shard offsets
    and sizes, as TorchRec's own generators would make them), so TorchRec's planner chooses
    nothing. TorchRec is imported here, lazily.

    Parameters
    ----------
    path : path
        The export directory (or its ``sharding_plan.json``).
    device : {"cuda", "cpu"}
        Where the shards live (``placement`` ``rank:r/cuda:<local rank>`` or ``rank:r/cpu``).
    module_paths : mapping, optional
        Module path of the ``EmbeddingBagCollection`` and ``EmbeddingCollection`` in the model
        (keys ``"EmbeddingBagCollection"``, ``"EmbeddingCollection"``); default ``"ebc"`` and
        ``"ec"``, the modules of ``torchrec_loader.EmbeddingModules``.
    dense_sequence_hot : bool, optional
        Leave the data-parallel tables of sequence features out of the plan: they run as plain
        ``nn.Embedding`` modules that ``DistributedModelParallel`` replicates and DDP keeps in
        sync (the same all-reduce), because fbgemm-gpu-cpu's dense kernel pools sequence lookups
        (docs/TORCHREC_RUNTIME.md). Default: on CPU only.
    """
    p = Path(path)
    doc = _read_json(p / SHARDING_PLAN_FILE if p.is_dir() else p, "sharding plan")
    if dense_sequence_hot is None:
        dense_sequence_hot = device == "cpu"
    return sharding_plan_from_doc(doc, device=device, module_paths=module_paths,
                                  dense_sequence_hot=dense_sequence_hot)

