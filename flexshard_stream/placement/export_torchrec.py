"""Export a plan for TorchRec 1.8 users: hot table + cold table + ID remapping + constraints.

TorchRec cannot place an arbitrary set of rows (``docs/TORCHREC_COMPAT.md``): a table is sharded
whole (data-parallel, table-wise, column-wise) or in contiguous, equal row blocks (row-wise,
table-row-wise). A FlexShard plan (:mod:`flexshard_stream.placement.plan`) replicates individually chosen
rows. The export therefore splits every table ``T`` of a plan into at most two TorchRec tables and
renumbers the rows:

``T__hot``
    the replicated rows, sharding type ``"data_parallel"`` (compute kernel ``"dense"``, the only one
    TorchRec 1.8 allows for data-parallel tables): the plan's global replicas (tier 0), plus its node
    replicas (tier 1) with ``node_replicas="hot"`` (the default; TorchRec has no one-copy-per-node
    sharding). Omitted when there are none.
``T__cold``
    every other row, sharding type ``"row_wise"`` (or ``"table_row_wise"`` / ``"table_wise"``, see
    ``cold_sharding``), compute kernel ``"fused"``. Omitted when every row is hot.
``remap`` (``T.remap.npy``, int64[H])
    a permutation of ``[0, H)``: ``new = remap[id]``; ``new < K`` is row ``new`` of ``T__hot``,
    otherwise row ``new - K`` of ``T__cold`` (K = ``hot_rows`` in the manifest). The data loader
    sends hot IDs to feature ``<feature>__hot`` and cold IDs to ``<feature>__cold``
    (:meth:`TorchRecExport.split_jagged` does it for a jagged batch).

Cold rows are numbered so that TorchRec's equal row blocks (``ceil(C / n)`` rows per rank,
``torchrec/distributed/sharding_plan.py`` l.181-237, the same block size the input bucketization
uses, ``sharding/rw_sharding.py`` l.429-431) hold, as far as their sizes allow, the rows the plan put
on that GPU: each rank keeps up to its block size of the plan's rows (explicitly placed rows first,
then by ID), the overflow fills the other ranks' free slots in ID order, and every block is in
increasing original-ID order. For a contiguous-range plan with no replicas and block-sized ranges the
remap is the identity.

Files written into ``out_dir`` (atomically; an existing export there is replaced, any other
non-empty directory is refused):

* ``torchrec_export.json``: the manifest (this module's own format, with a schema version; the
  returned dict);
* ``constraints.json``: per new table, exactly the fields of TorchRec 1.8's ``ParameterConstraints``
  (``PARAMETER_CONSTRAINTS_FIELDS``), enum values spelled as TorchRec spells them;
  :func:`torchrec_constraints` turns it into ``dict[str, ParameterConstraints]``;
* ``embedding_configs.json``: per new table, ``EmbeddingConfig`` / ``EmbeddingBagConfig`` fields;
  :func:`torchrec_embedding_configs` builds the objects;
* ``<T>.remap.npy`` per table.

torch and torchrec are never imported except by the two loaders, which import them lazily.
``docs/TORCHREC_EXPORT.md`` states the mapping, what TorchRec cannot express, and how much of the
modelled benefit survives (:func:`plan_from_export` rebuilds the plan TorchRec will actually run, in
our plan type, for :func:`flexshard_stream.placement.cost.evaluate_analytic`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError, FormatError
from ..formats.fields import field_int, field_list, field_mapping
from ..formats.files import (
    check_output_directory,
    read_json,
    read_npy,
    staging_directory,
    write_json,
    write_npy,
)
from ..stats.summary import FrequencySummary
from .plan import ColdSharding, Plan, Router, TablePlan
from .tables import EmbeddingTable, summaries_by_table
from .topology import Topology

__all__ = ["export_torchrec", "load_torchrec_export", "plan_from_export", "TorchRecExport",
           "torchrec_constraints", "torchrec_embedding_configs", "torchrec_rw_shard_rows",
           "PARAMETER_CONSTRAINTS_FIELDS", "COLD_SHARDINGS", "NODE_REPLICAS",
           "EXPORT_SCHEMA_VERSION", "MANIFEST_FILE", "CONSTRAINTS_FILE", "CONFIGS_FILE"]

TORCHREC_VERSION = "1.8.0"
EXPORT_SCHEMA_VERSION = 1
EXPORT_FORMAT = "flexshard_stream.torchrec_export"
MANIFEST_FILE = "torchrec_export.json"
#: The export directory's kind marker (:func:`~flexshard_stream.formats.files.staging_directory`).
EXPORT_KIND = "torchrec-export"
CONSTRAINTS_FILE = "constraints.json"
CONFIGS_FILE = "embedding_configs.json"
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

#: ``cold_sharding`` values. ``auto``: ``table_wise`` when the plan's cold rows live on one GPU,
#: ``table_row_wise`` when they live on one node and the table is pooled, else ``row_wise``.
COLD_SHARDINGS: tuple[str, ...] = ("auto", "row_wise", "table_row_wise", "table_wise")
#: ``node_replicas`` values: where the plan's tier-1 rows (one copy per node) go.
NODE_REPLICAS: tuple[str, ...] = ("hot", "cold")

# TorchRec 1.8 enum spellings: ShardingType (distributed/types.py l.142-162), EmbeddingComputeKernel
# (distributed/embedding_types.py l.87-108), DataType (torchrec/types.py l.54-69), PoolingType
# (modules/embedding_configs.py l.33-45).
_DATA_PARALLEL = "data_parallel"
_DENSE = "dense"
_FUSED = "fused"
_UVM_CACHING = "fused_uvm_caching"
_DATA_TYPE = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16"}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


# ----------------------------------------------------------------------------- TorchRec facts
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


# ----------------------------------------------------------------------------- per-table mapping
def _choose_cold(tp: TablePlan, topo: Topology, cold_sharding: str, owners: np.ndarray
                 ) -> tuple[str, np.ndarray, list[str]]:
    """TorchRec sharding type and target ranks of the cold table, with notes."""
    t = tp.table
    M, G = topo.gpus_per_node, topo.num_gpus
    used = np.unique(owners) if owners.size else np.unique(tp.cold.gpus)
    notes: list[str] = []
    one_node = used.size > 0 and np.unique(used // M).size == 1
    counts = np.bincount(owners, minlength=G) if owners.size else np.zeros(G, np.int64)
    if cold_sharding == "auto":
        if used.size == 1:
            kind = "table_wise"
        elif one_node and M > 1 and t.kind == "pooled":
            kind = "table_row_wise"
        else:
            kind = "row_wise"
            if one_node and M > 1:
                notes.append("the plan keeps the cold rows on one node, but TorchRec 1.8's "
                             "EmbeddingCollectionSharder offers no table_row_wise for sequence "
                             "tables (embedding.py l.1836-1843): exported row_wise over all ranks")
    else:
        kind = cold_sharding
    if kind == "table_row_wise" and t.kind != "pooled":
        raise ConfigError(f"table {t.name!r}: cold_sharding 'table_row_wise' is impossible for a "
                          "sequence table: TorchRec 1.8's EmbeddingCollectionSharder offers only "
                          "data_parallel, table_wise, column_wise and row_wise (embedding.py "
                          "l.1836-1843); use 'row_wise' or 'auto'")
    if kind == "row_wise":
        ranks = np.arange(G, dtype=np.int64)
    elif kind == "table_row_wise":
        node = int(np.argmax(np.bincount(np.arange(G) // M, weights=counts, minlength=topo.nodes)))
        ranks = topo.gpus_of_node(node).astype(np.int64)
        if not one_node:
            notes.append(f"table_row_wise puts all cold rows on one node (TorchRec picks which; "
                         f"the reverse mapping assumes node {node}, the one holding most of them "
                         f"in the plan)")
        else:
            notes.append(f"TorchRec's planner picks the node; the reverse mapping assumes the "
                         f"plan's node {node}")
    else:  # table_wise
        ranks = np.array([int(np.argmax(counts))], np.int64)
        if used.size > 1:
            notes.append(f"table_wise puts all cold rows on one rank (the reverse mapping assumes "
                         f"GPU {int(ranks[0])}, the one holding most of them in the plan)")
        notes.append("TorchRec's planner picks the rank of a table_wise table")
    return kind, ranks, notes


def _cold_blocks(cold_ids: np.ndarray, owners: np.ndarray, placed: np.ndarray,
                 ranks: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, int]:
    """Block (index into ``ranks``) of every cold row: each rank keeps up to ``caps`` of the rows
    the plan put on it (placed rows first, then by ID); the overflow fills the free slots in rank
    order, by ID. Returns (block per row, rows kept on their plan GPU)."""
    G = int(max(int(owners.max()) if owners.size else 0, int(ranks.max()) if ranks.size else 0)) + 1
    pos = np.full(G, ranks.size, np.int64)
    pos[ranks] = np.arange(ranks.size)
    j = pos[owners]
    order = np.lexsort((cold_ids, ~placed, j))
    js = j[order]
    starts = np.searchsorted(js, np.arange(ranks.size + 1))
    within = np.arange(js.size) - starts[np.minimum(js, ranks.size)]
    capx = np.concatenate([caps, [0]])
    keep_sorted = within < capx[js]
    block = np.empty(cold_ids.size, np.int64)
    block[order[keep_sorted]] = js[keep_sorted]
    kept = np.bincount(js[keep_sorted], minlength=ranks.size)[:ranks.size]
    free = caps - kept
    over = order[~keep_sorted]
    over = over[np.argsort(cold_ids[over], kind="stable")]
    block[over] = np.repeat(np.arange(ranks.size), free)
    return block, int(keep_sorted.sum())


def _hot_share(tp: TablePlan, hot_ids: np.ndarray, s: FrequencySummary | None) -> float | None:
    """Access probability of the hot rows, from a frequency summary (None without one)."""
    if s is None or not s.total:
        return None
    p = s.top_est / s.total
    inside = np.isin(s.top_ids, hot_ids)
    n_top_hot = int(np.count_nonzero(inside))
    share = float(p[inside].sum()) + max(0, hot_ids.size - n_top_hot) * s.tail_probability()
    return min(1.0, max(0.0, share))


def _table_mapping(tp: TablePlan, topo: Topology, cold_sharding: str, node_replicas: str
                   ) -> dict[str, Any]:
    t = tp.table
    H = t.num_rows
    if tp.replicated:
        return {"remap": np.arange(H, dtype=np.int64), "hot_ids": np.arange(H, dtype=np.int64),
                "K": H, "K0": H, "K1_hot": 0, "cold": None,
                "notes": ["data-parallel table: exported whole as the hot (data_parallel) table "
                          "with the identity remap"]}
    notes: list[str] = []
    hot_ids = tp.global_ids
    if node_replicas == "hot" and tp.node_ids.size:
        hot_ids = np.union1d(hot_ids, tp.node_ids)
        notes.append(f"{tp.node_ids.size} node replicas folded into the data-parallel hot table "
                     f"(stored on every GPU instead of once per node)")
    elif tp.node_ids.size:
        notes.append(f"{tp.node_ids.size} node replicas exported as cold rows (TorchRec has no "
                     f"one-copy-per-node sharding); each goes where the plan's cold function "
                     f"puts it")
    K = int(hot_ids.size)
    is_hot = np.zeros(H, np.bool_)
    is_hot[hot_ids] = True
    cold_ids = np.flatnonzero(~is_hot).astype(np.int64)
    remap = np.empty(H, np.int64)
    remap[hot_ids] = np.arange(K, dtype=np.int64)
    cold: dict[str, Any] | None = None
    if cold_ids.size:
        # plan owner of every cold row: explicit placement, else the plan's cold function (node
        # replicas demoted to cold follow the cold function too)
        owners = Router(TablePlan(t, tp.cold), topo).route(cold_ids, 0).astype(np.int64)
        placed = np.zeros(cold_ids.size, np.bool_)
        if tp.placed_ids.size:
            at = np.searchsorted(cold_ids, tp.placed_ids)
            owners[at] = tp.placed_gpus
            placed[at] = True
        kind, ranks, cnotes = _choose_cold(tp, topo, cold_sharding, owners)
        notes += cnotes
        C = int(cold_ids.size)
        caps = torchrec_rw_shard_rows(C, ranks.size)
        block, kept = _cold_blocks(cold_ids, owners, placed, ranks, caps)
        order = np.lexsort((cold_ids, block))
        cidx = np.empty(C, np.int64)
        cidx[order] = np.arange(C, dtype=np.int64)
        remap[cold_ids] = K + cidx
        plan_gpus = np.unique(owners)
        cold = {"rows": C, "sharding_type": kind, "ranks": ranks.tolist(),
                "shard_rows": caps.tolist(), "plan_gpus": plan_gpus.tolist(),
                "rows_on_plan_gpu": kept, "placed_rows": int(placed.sum()),
                "node_rows": int(tp.node_ids.size) if node_replicas == "cold" else 0}
    return {"remap": remap, "hot_ids": hot_ids, "K": K, "K0": int(tp.global_ids.size),
            "K1_hot": int(tp.node_ids.size) if node_replicas == "hot" else 0, "cold": cold,
            "notes": notes}


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
    return {"module": "EmbeddingBagCollection" if t.kind == "pooled" else "EmbeddingCollection",
            "config_class": "EmbeddingBagConfig" if t.kind == "pooled" else "EmbeddingConfig",
            "config": cfg}


# ----------------------------------------------------------------------------- export
def export_torchrec(plan: Plan, out_dir: str | os.PathLike, *, cold_sharding: str = "auto",
                    node_replicas: str = "hot",
                    summaries: Mapping[str, FrequencySummary] | None = None,
                    mean_lengths: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Write ``plan`` as TorchRec 1.8 tables, constraints and ID remapping arrays.

    Parameters
    ----------
    plan : Plan
        Any plan (FlexShard, HugeCTR hybrid, the baselines).
    out_dir : path
        Output directory, created or replaced atomically. A non-empty directory that is not an
        export is refused.
    cold_sharding : {"auto", "row_wise", "table_row_wise", "table_wise"}
        TorchRec sharding type of the cold tables. ``auto`` follows the plan: ``table_wise`` when its
        cold rows are on one GPU, ``table_row_wise`` when they are on one node and the table is
        pooled (TorchRec 1.8 offers no TWRW for sequence tables), else ``row_wise``.
    node_replicas : {"hot", "cold"}
        Where the plan's node replicas (tier 1, one copy per node: TorchRec has no such sharding)
        go. ``"hot"`` (default): into the data-parallel hot table; their lookups stay on the GPU
        (better than the plan's NVLink hop), but every GPU stores them (M times the plan's memory
        for them, reported as ``row_bytes_per_gpu`` in the manifest) and TorchRec all-reduces their
        gradient across all G GPUs instead of the N node copies. ``"cold"``: into the cold table, no
        memory above the plan's, but their lookups cross the network like any cold row (a plan
        made mostly of node replicas then keeps none of its benefit, docs/TORCHREC_EXPORT.md).
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
        a non-empty ``out_dir`` that is not an export, an empty plan.
    """
    _check_export(plan, cold_sharding, node_replicas)
    out_dir = Path(out_dir)
    _check_export_dir(out_dir)
    _check_features(plan)
    _check_columns(plan)
    with staging_directory(out_dir, kind=EXPORT_KIND, legacy=(MANIFEST_FILE,)) as tmp:
        parts = [_export_table(tmp, i, name, tp, plan.topology, cold_sharding, node_replicas,
                               summaries or {}, mean_lengths or {})
                 for i, (name, tp) in enumerate(plan.tables.items())]
        manifest = _manifest(plan, cold_sharding, node_replicas, parts)
        _write_json(tmp / CONSTRAINTS_FILE, {
            "format": "torchrec.ParameterConstraints", "torchrec_version": TORCHREC_VERSION,
            "schema_version": EXPORT_SCHEMA_VERSION,
            "constraints": {k: c for p in parts for k, c in p.constraints.items()}})
        _write_json(tmp / CONFIGS_FILE, {
            "format": "torchrec.EmbeddingConfigs", "torchrec_version": TORCHREC_VERSION,
            "schema_version": EXPORT_SCHEMA_VERSION,
            "tables": [c for p in parts for c in p.configs]})
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


def _check_export_dir(out_dir: Path) -> None:
    """Refuse to replace anything but an export (or an empty directory): it would be deleted."""
    check_output_directory(out_dir, EXPORT_KIND, legacy=(MANIFEST_FILE,))


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
    """One original table, exported: its manifest entry, the constraints and embedding configs
    of its new tables, and the bytes of stored rows per GPU under the plan and under TorchRec."""

    entry: dict[str, Any]
    constraints: dict[str, dict[str, Any]]
    configs: list[dict[str, Any]]
    plan_row_bytes: np.ndarray          # bytes per GPU
    export_row_bytes: np.ndarray        # bytes per GPU


def _export_table(tmp: Path, index: int, name: str, tp: TablePlan, topo: Topology,
                  cold_sharding: str, node_replicas: str,
                  summaries: Mapping[str, FrequencySummary],
                  mean_lengths: Mapping[str, float]) -> _TableExport:
    """Split table ``name`` into its hot and cold TorchRec tables and write its remap array into
    ``tmp``."""
    t = tp.table
    m = _table_mapping(tp, topo, cold_sharding, node_replicas)
    rows = np.full(topo.num_gpus, m["K"], np.int64)
    if m["cold"] is not None:
        rows[np.asarray(m["cold"]["ranks"])] += np.asarray(m["cold"]["shard_rows"])
    pb = tp.rows_per_gpu(topo) * float(t.row_bytes)
    eb = rows * float(t.row_bytes)
    L, share = _length_and_hot_share(name, tp, m, summaries, mean_lengths)
    pf_hot = pf_cold = None
    if L is not None and share is not None:
        pf_hot, pf_cold = float(L) * share, float(L) * (1.0 - share)
    notes = list(m["notes"])
    if pf_hot is None:
        notes.append("pooling_factors: TorchRec's default [1.0] (pass summaries= to split "
                     "the mean length by access share)")
    fn = f"{name}.remap.npy" if _SAFE_NAME.match(name) else f"t{index}.remap.npy"
    sha = write_npy(tmp / fn, m["remap"], mode=0o644)
    out = _TableExport({}, {}, [], pb, eb)
    hot = _hot_table(out, name, t, m, pf_hot) if m["K"] else None
    cold = _cold_table(out, name, tp, topo, m, pf_cold) if m["cold"] is not None else None
    out.entry = {
        "table": name, "source_table": dataclasses.asdict(t),
        "hot_rows": m["K"], "hot": hot, "cold": cold,
        "node_replicas": node_replicas if tp.node_ids.size else None,
        "hot_access_share": share,
        "row_bytes_per_gpu_max": {"plan": float(pb.max()), "export": float(eb.max())},
        "mean_length": None if L is None else float(L),
        "plan_cold": tp.cold.to_dict(), "plan_tiers": tp.tier_sizes(),
        "remap": {"file": fn, "dtype": "int64", "shape": [t.num_rows], "sha256": sha},
        "notes": notes}
    return out


def _length_and_hot_share(name: str, tp: TablePlan, m: Mapping[str, Any],
                          summaries: Mapping[str, FrequencySummary],
                          mean_lengths: Mapping[str, float]) -> tuple[float | None, float | None]:
    """IDs per sample (given by table name or feature, else the summary's mean length) and the
    hot rows' access probability (1 when every row is hot; None without a summary)."""
    t = tp.table
    s = summaries_by_table([t], summaries, required=False)[t.name]
    L = mean_lengths.get(name, mean_lengths.get(t.feature))
    if L is None and s is not None:
        L = s.mean_length or None
    share = _hot_share(tp, m["hot_ids"], s) if m["K"] < t.num_rows else 1.0
    return L, share


def _hot_table(out: _TableExport, name: str, t: EmbeddingTable, m: Mapping[str, Any],
               pooling: float | None) -> dict[str, Any]:
    """``<name>__hot``: data-parallel, dense kernel; its constraints and config go into ``out``;
    returns its manifest entry."""
    hname, hfeat = name + HOT_SUFFIX, t.feature + HOT_SUFFIX
    out.constraints[hname] = _constraints(_DATA_PARALLEL, _DENSE, hfeat, pooling)
    out.configs.append(_config(t, hname, m["K"], hfeat))
    return {"table": hname, "feature": hfeat, "rows": m["K"],
            "sharding_type": _DATA_PARALLEL, "global_rows": m["K0"],
            "node_rows": m["K1_hot"],
            # DDP all-reduces the dense gradient of a data-parallel table every
            # iteration (model_parallel.py l.163-190), touched or not
            "dense_grad_bytes": m["K"] * t.embedding_bytes}


def _cold_table(out: _TableExport, name: str, tp: TablePlan, topo: Topology,
                m: Mapping[str, Any], pooling: float | None) -> dict[str, Any]:
    """``<name>__cold``: the mapping's sharding type, fused kernel (UVM caching when the plan
    has a host memory tier); its constraints and config go into ``out``; returns its manifest
    entry."""
    t = tp.table
    cname, cfeat = name + COLD_SUFFIX, t.feature + COLD_SUFFIX
    cons = _constraints(m["cold"]["sharding_type"], _FUSED, cfeat, pooling)
    out.constraints[cname] = cons
    out.configs.append(_config(t, cname, m["cold"]["rows"], cfeat))
    cold = {"table": cname, "feature": cfeat, **m["cold"]}
    if tp.has_host_tier:
        # the RecShard tier: TorchRec keeps such a table in UVM with an HBM cache; its load
        # factor is the plan's share of the cold rows kept in HBM (the cache picks rows by
        # frequency, as the plan's split does)
        host = float(tp.host_rows_per_gpu(topo).sum())
        lf = min(1.0, max(0.0, 1.0 - host / max(m["cold"]["rows"], 1)))
        cons["compute_kernels"] = [_UVM_CACHING]
        cons["cache_params"] = {"algorithm": "LFU", "load_factor": lf}
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
        # stored rows (embedding + optimizer state) per GPU, plan vs TorchRec export
        "row_bytes_per_gpu": {"plan": plan_bytes.tolist(), "export": export_bytes.tolist()},
        "remap_encoding": "new = remap[id]; new < hot_rows: row new of <table>__hot (feature "
                          "<feature>__hot); else row new - hot_rows of <table>__cold (feature "
                          "<feature>__cold)",
        "files": {"constraints": CONSTRAINTS_FILE, "embedding_configs": CONFIGS_FILE},
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
                          f"{EXPORT_SCHEMA_VERSION})")
    return doc


# ----------------------------------------------------------------------------- reading back
@dataclass(frozen=True, eq=False)
class TorchRecExport:
    """A verified export: the manifest and the remap array of every original table."""

    path: Path
    manifest: dict[str, Any]
    remaps: dict[str, np.ndarray]

    def entry(self, table: str) -> dict[str, Any]:
        for e in self.manifest["tables"]:
            if e["table"] == table:
                return e
        raise KeyError(f"no table {table!r} in the export; have "
                       f"{[e['table'] for e in self.manifest['tables']]}")

    def hot_rows(self, table: str) -> int:
        """K: rows of ``<table>__hot``; remapped IDs below K are hot."""
        return int(self.entry(table)["hot_rows"])

    def split(self, table: str, ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(is_hot, hot_ids, cold_ids)`` for original IDs of ``table``: the data loader's step."""
        remap = self.remaps[self.entry(table)["table"]]
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= remap.size):
            raise ConfigError(f"table {table!r}: IDs must lie in [0, {remap.size})")
        new = remap[ids]
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
        values = np.asarray(values, dtype=np.int64)
        if int(lengths.sum()) != values.size:
            raise ConfigError(f"table {table!r}: lengths sum to {int(lengths.sum())} but there are "
                              f"{values.size} values")
        is_hot, hot, cold = self.split(table, values)
        seg = np.repeat(np.arange(lengths.size), lengths)
        hl = np.bincount(seg[is_hot], minlength=lengths.size).astype(np.int64)
        return hot, hl, cold, lengths - hl, is_hot


def load_torchrec_export(path: str | os.PathLike) -> TorchRecExport:
    """Read an export directory, verifying its version and the remap checksums and permutations."""
    path = Path(path)
    doc = _read_json(path / MANIFEST_FILE, "TorchRec export manifest")
    if doc.get("format") != EXPORT_FORMAT:
        raise FormatError(f"{path / MANIFEST_FILE}: format {doc.get('format')!r}, expected "
                          f"{EXPORT_FORMAT!r}")
    remaps = {}
    try:
        for e in doc["tables"]:
            spec = e["remap"]
            arr = read_npy(path, spec["file"], spec["sha256"], "remap file")
            f = path / spec["file"]
            if arr.dtype != np.int64 or list(arr.shape) != spec["shape"]:
                raise FormatError(f"{f}: {arr.dtype} {list(arr.shape)}, expected int64 "
                                  f"{spec['shape']}")
            seen = np.zeros(arr.size, np.bool_)
            if arr.size and (arr.min() < 0 or arr.max() >= arr.size):
                raise FormatError(f"{f}: remap values must lie in [0, {arr.size})")
            seen[arr] = True
            if not seen.all():
                raise FormatError(f"{f}: remap is not a permutation of [0, {arr.size})")
            remaps[e["table"]] = arr
            _check_entry(e, arr.size, f"{path / MANIFEST_FILE}: table {e['table']!r}")
    except (KeyError, TypeError, AttributeError) as err:
        raise FormatError(f"{path / MANIFEST_FILE}: inconsistent manifest "
                          f"({type(err).__name__}: {err})") from None
    return TorchRecExport(path, doc, remaps)


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
    cold = e.get("cold")
    if cold is None and hot == rows:
        return
    cold = field_mapping(e, "cold", where)
    ranks, shard_rows = field_list(cold, "ranks", where), field_list(cold, "shard_rows", where)
    if not ranks or len(ranks) != len(shard_rows) or \
            not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31
                    for x in ranks + shard_rows) or sum(shard_rows) != rows - hot:
        raise FormatError(f"{where}: cold 'ranks' and 'shard_rows' must be lists of as many "
                          f"integers in [0, 2**31), the shard rows adding up to {rows - hot}")


def plan_from_export(export: TorchRecExport | str | os.PathLike) -> Plan:
    """The plan TorchRec will run, in our plan type (strategy ``"torchrec_export"``).

    Per original table: hot rows become global replicas; cold rows are owned by the rank TorchRec's
    equal blocks give them (``ranks[cold_index // ceil(C / n)]``), written as a cold function plus
    explicit placements for the rows that function gets wrong. Of two cold functions, the one
    needing fewer placements is used: TorchRec's blocks as ranges over original IDs (bounds = the
    first original ID of each block; exact when the cold order is monotone in the ID) or the plan's
    own cold function (right for every row kept on its plan GPU). For
    ``table_wise`` / ``table_row_wise`` the rank / node is the one recorded in the manifest
    (TorchRec's planner may pick another; by symmetry the modelled cost is the same on a uniform
    topology). Feed it to :func:`flexshard_stream.placement.cost.evaluate_analytic` to see how much of the
    plan's modelled benefit survives.
    """
    ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
    doc = ex.manifest
    try:
        topo = Topology.from_dict(doc["topology"])
        tps = []
        for e in doc["tables"]:
            t = EmbeddingTable(**e["source_table"])
            remap = ex.remaps[e["table"]]
            H, K = t.num_rows, int(e["hot_rows"])
            if K == H:
                tps.append(TablePlan(t, ColdSharding.replicated()))
                continue
            hot_ids = np.flatnonzero(remap < K).astype(np.int64)
            c = e["cold"]
            ranks = np.asarray(c["ranks"], np.int64)
            C = H - K
            cold_ids = np.flatnonzero(remap >= K).astype(np.int64)
            cidx = remap[cold_ids] - K
            block = cidx // (-(-C // ranks.size))
            owner = ranks[block]
            by_cidx = np.empty(C, np.int64)
            by_cidx[cidx] = cold_ids
            offs = np.concatenate([[0], np.cumsum(c["shard_rows"])])
            bounds = np.where(offs < C, by_cidx[np.minimum(offs, C - 1)], H)
            bounds[0] = 0
            bounds[-1] = H
            bounds = np.maximum.accumulate(bounds)
            # two candidate cold functions, the one with fewer exceptions wins (ties: the blocks):
            # TorchRec's blocks as ranges over original IDs (exact when the cold order is
            # monotone), or the plan's own cold function (right for every row kept on its plan GPU)
            best = None
            for base in (ColdSharding("range", ranks.astype(np.int32), bounds),
                         ColdSharding.from_dict(e["plan_cold"])):
                if base.kind == "replicated":
                    continue
                got = Router(TablePlan(t, base), topo).route(cold_ids, 0)
                wrong = np.flatnonzero(got != owner)
                if best is None or wrong.size < best[1].size:
                    best = (base, wrong)
            base, wrong = best
            tps.append(TablePlan(t, base, global_ids=hot_ids, placed_ids=cold_ids[wrong],
                                 placed_gpus=owner[wrong].astype(np.int32)))
        return Plan("torchrec_export", topo, tps,
                    {"source_strategy": doc.get("strategy"),
                     "cold_sharding": doc.get("cold_sharding"),
                     "node_replicas": doc.get("node_replicas")})
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError, IndexError) as err:
        if isinstance(err, ConfigError):
            raise FormatError(f"{ex.path}: inconsistent export ({err})") from None
        raise FormatError(f"{ex.path}: inconsistent export ({type(err).__name__}: {err})") \
            from None


# ----------------------------------------------------------------------------- TorchRec loaders
def _import_torchrec(what: str) -> dict[str, Any]:
    try:
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
    except ImportError as e:
        raise ImportError(f"{what} needs TorchRec (and torch), which flexshard_stream does not "
                          f"install: `pip install torchrec=={TORCHREC_VERSION}` plus a matching "
                          f"torch and fbgemm-gpu. The JSON files can be read without it. "
                          f"({e})") from e
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
