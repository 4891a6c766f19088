"""TorchRec 1.8's own planner on our tables and topology, its plan converted to our plan type.

:func:`plan_torchrec` builds what a TorchRec user builds (one ``EmbeddingBagCollection`` of the
pooled tables, ``EmbeddingCollection`` s of the sequence tables, on the ``meta`` device: no memory,
no GPU), a TorchRec ``Topology`` of the same cluster (:func:`torchrec_topology_config`), and runs
``EmbeddingShardingPlanner.plan`` with the sharders users pass (``EmbeddingBagCollectionSharder``,
``EmbeddingCollectionSharder``) and the mean IDs per sample as ``pooling_factors``. The
``ShardingPlan`` it returns is converted exactly (:func:`plan_from_sharding_plan`: sharding type,
ranks, shard row and column offsets and sizes per table) into a
:class:`~flexshard_stream.plans.plan.Plan` with strategy ``"torchrec"``, which the one cost
evaluator prices like any other plan. TorchRec's own estimate (its ``Perf`` per shard, in
milliseconds, and the rating of its ``NoopPerfModel``) is kept beside ours in ``plan.meta``.

torch and torchrec are imported only when :func:`plan_torchrec` runs; without them it raises
:class:`~flexshard_stream.errors.MissingExtraError` naming the ``torchrec`` extra. The conversion
reads the ``ShardingPlan``'s attributes only and needs neither. docs/TORCHREC_PLANNER.md says what
each step follows in TorchRec's source.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..optional import optional_imports
from ..plans.plan import SHARDING_KINDS, ColdSharding, Plan, TablePlan
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .estimator import TORCHREC_VERSION
from .sharding import POOLED_MODULE, SEQUENCE_MODULE

__all__ = ["plan_torchrec", "TorchRecPlanResult", "plan_from_sharding_plan", "torchrec_table_names",
           "torchrec_topology_config", "torchrec_estimate", "module_paths",
           "UVM_CACHING_RATIO", "TORCHREC_STRATEGY"]

#: The strategy name of a converted TorchRec plan.
TORCHREC_STRATEGY = "torchrec"
#: HBM share of a ``fused_uvm_caching`` table when its ``cache_params`` give no load factor
#: (``torchrec/distributed/planner/constants.py`` ``UVM_CACHING_RATIO``).
UVM_CACHING_RATIO = 0.2
_ROW_KINDS = ("table_wise", "row_wise", "table_row_wise")
_COLUMN_KINDS = ("column_wise", "table_column_wise")

@dataclass
class TorchRecPlanResult:
    """What TorchRec's planner chose, in our plan type, with both estimates.

    Attributes
    ----------
    plan : Plan
        TorchRec's plan (strategy ``"torchrec"``); ``plan.meta["torchrec"]`` records how it was
        made and TorchRec's estimate, ``plan.meta["estimates"]`` ours (when priced).
    sharding_plan : torchrec.distributed.types.ShardingPlan
        TorchRec's own plan object (``DistributedModelParallel(plan=...)`` takes it for the module
        of :func:`module_paths`).
    estimate : dict
        TorchRec's estimate (:func:`torchrec_estimate`): milliseconds, as TorchRec's ``Perf``.
    seconds : float
        Wall time of ``EmbeddingShardingPlanner.plan`` (seconds; building the module and the
        topology excluded).
    cost : Cost or None
        Our analytic cost of the plan, set by :func:`flexshard_stream.placement.references.
        plan_torchrec` (the same call, priced by the one evaluator); None here.
    """

    plan: Plan
    sharding_plan: Any
    estimate: dict[str, Any]
    seconds: float
    cost: Any = None


# ----------------------------------------------------------------------------- inputs
def torchrec_topology_config(topology: Topology) -> dict[str, Any]:
    """The TorchRec ``Topology`` of ``topology``, as the keyword arguments of TorchRec 1.8's
    ``TopologyFactory`` configs (``planner/types.py``: ``TrainerConfig``, ``HardwareConfig``,
    ``KernelConfig``).

    Units are TorchRec's: bandwidths in bytes per millisecond (our bytes per second / 1000; its
    constants are GiB-based, ``600 * 1024**3 / 1000``, the conversion is exact either way),
    capacities in bytes. TorchRec has one intra-host and one inter-host bandwidth for every rank
    and charges a collective at one of them, so a heterogeneous topology gives its slowest GPU's
    figures; per-GPU HBM goes in as ``custom_topology_data`` when GPUs differ (TorchRec then cuts
    row-wise tables unevenly). ``compute_device`` is ``"cuda"``, as a GPU job sets it (planning
    needs no GPU).

    Returns
    -------
    dict
        ``{"trainer": {...}, "hardware": {...}, "kernel": {...}, "hbm_cap_per_rank": [...]}``
        (the last only when GPUs differ in HBM).
    """
    hbm = topology.hbm_bytes
    hbm_cap = int(hbm.min())
    trainer = {"world_size": topology.num_gpus, "local_world_size": topology.gpus_per_node,
               "hbm_cap_bytes": hbm_cap,
               "ddr_cap_bytes": int(topology.host_memory_bytes.min() // topology.gpus_per_node)}
    hardware = {"hbm_cap_bytes": hbm_cap, "intra_host_bw": float(topology.intra_bw.min()) / 1e3,
                "inter_host_bw": float(topology.inter_bw.min()) / 1e3,
                "hbm_to_ddr_mem_bw": float(topology.uvm_bw.min()) / 1e3}
    out = {"trainer": trainer, "hardware": hardware,
           "kernel": {"compute_device": "cuda", "use_hardware_based_bandwidth": True}}
    if np.ptp(hbm) > 0:
        out["hbm_cap_per_rank"] = [int(x) for x in hbm]
    return out


def module_paths(tables: Sequence[EmbeddingTable]) -> dict[str, str]:
    """Per table, the module path of its collection in the model :func:`plan_torchrec` plans:
    ``"ebc"`` for pooled tables; ``"ec"`` for sequence tables when they share one dim, else
    ``"ec_d<dim>"`` (TorchRec's ``EmbeddingCollection`` requires one dim for all its tables)."""
    dims = {t.dim for t in tables if t.kind == "sequence"}
    return {t.name: POOLED_MODULE if t.kind == "pooled"
            else (SEQUENCE_MODULE if len(dims) == 1 else f"{SEQUENCE_MODULE}_d{t.dim}")
            for t in tables}


def _pooling_factors(tables: Sequence[EmbeddingTable],
                     summaries: Mapping[str, FrequencySummary] | None,
                     mean_lengths: Mapping[str, float] | None) -> dict[str, float]:
    """Mean IDs per sample per table: ``mean_lengths``, else the summaries', else none (TorchRec
    then assumes its default of 1.0)."""
    out = {}
    sums = summaries_by_table(tables, summaries) if summaries is not None else {}
    for t in tables:
        ml = (mean_lengths or {}).get(t.name)
        if ml is None and t.name in sums:
            ml = sums[t.name].mean_length
        if ml is not None:
            if not (math.isfinite(float(ml)) and float(ml) >= 0):
                raise ConfigError(f"table {t.name!r}: mean IDs per sample must be a number >= 0, "
                                  f"got {ml!r}")
            out[t.name] = float(ml)
    return out


# ----------------------------------------------------------------------------- conversion
def _shard_rank(shard: Any) -> int:
    """The rank of a ``ShardMetadata`` (``placement`` is ``rank:<r>/<device>``)."""
    p = shard.placement
    rank = getattr(p, "rank", None)
    if callable(rank):
        return int(rank())
    return int(str(p).split("/")[0].removeprefix("rank:"))


def _shards(ps: Any, name: str) -> list[tuple[int, int, int, int, int]]:
    """(row offset, column offset, rows, columns, rank) of every shard of a
    ``ParameterSharding``."""
    spec = getattr(ps, "sharding_spec", None)
    if spec is None or not getattr(spec, "shards", None):
        raise ConfigError(f"table {name!r}: TorchRec's {ps.sharding_type} sharding has no shards")
    return [(int(s.shard_offsets[0]), int(s.shard_offsets[1]), int(s.shard_sizes[0]),
             int(s.shard_sizes[1]), _shard_rank(s)) for s in spec.shards]


def _cover(starts: list[int], sizes: list[int], total: int, what: str, name: str) -> None:
    """Sorted shards must tile ``[0, total)`` exactly."""
    ends = np.cumsum([0] + sizes)
    if starts != ends[:-1].tolist() or int(ends[-1]) != total:
        raise ConfigError(f"table {name!r}: TorchRec's shards do not tile the {what} "
                          f"(offsets {starts}, sizes {sizes}, {total} in all)")


def _row_cold(t: EmbeddingTable, shards: list, kind: str) -> ColdSharding:
    """Row shards (whole columns) as contiguous ranges: shard ``j``'s rows on its rank."""
    shards = sorted(shards, key=lambda s: (s[0], s[4]))
    if any(s[1] != 0 or s[3] != t.dim for s in shards):
        raise ConfigError(f"table {t.name!r}: TorchRec's {kind} shards must span every column")
    _cover([s[0] for s in shards], [s[2] for s in shards], t.num_rows, "rows", t.name)
    bounds = [s[0] for s in shards] + [t.num_rows]
    return ColdSharding("range", np.array([s[4] for s in shards]), np.array(bounds))


def _column_cold(t: EmbeddingTable, shards: list, kind: str) -> tuple[ColdSharding, bool]:
    """Column shards (every row), in column order; adjacent shards on one rank merged into one
    (the same columns on the same rank). Returns the cold function and whether any merged."""
    shards = sorted(shards, key=lambda s: s[1])
    if any(s[0] != 0 or s[2] != t.num_rows for s in shards):
        raise ConfigError(f"table {t.name!r}: TorchRec's {kind} shards must span every row")
    _cover([s[1] for s in shards], [s[3] for s in shards], t.dim, "columns", t.name)
    gpus, widths = [], []
    for s in shards:
        if gpus and gpus[-1] == s[4]:
            widths[-1] += s[3]
        else:
            gpus.append(s[4])
            widths.append(s[3])
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"table {t.name!r}: TorchRec put column shards that are not adjacent "
                          f"on one rank (ranks in column order: {gpus}); the plan type holds one "
                          f"column range per GPU")
    return ColdSharding.columns(gpus, widths), len(gpus) < len(shards)


def _host_fraction(ps: Any, kind: str, G: int) -> np.ndarray:
    """The HBM share of a UVM table's rows (float64[G]; empty for HBM kernels): 0 for
    ``fused_uvm`` (every row in host memory), the cache's load factor for
    ``fused_uvm_caching`` (our fixed split standing for TorchRec's cache)."""
    kernel = str(getattr(ps, "compute_kernel", "") or "")
    if kernel == "fused_uvm":
        return np.zeros(G)
    if kernel == "fused_uvm_caching":
        lf = getattr(getattr(ps, "cache_params", None), "load_factor", None)
        return np.full(G, float(lf) if lf is not None else UVM_CACHING_RATIO)
    return np.zeros(0)


def _table_plan(t: EmbeddingTable, ps: Any, topology: Topology, notes: list[str]) -> TablePlan:
    """One table's ``ParameterSharding`` as a :class:`TablePlan` (exact placement)."""
    kind = str(ps.sharding_type)
    if kind not in SHARDING_KINDS:
        raise ConfigError(f"table {t.name!r}: TorchRec chose {kind!r}, which the plan type does "
                          f"not express (it has {list(SHARDING_KINDS)})")
    if kind == "data_parallel":
        return TablePlan(t, ColdSharding.replicated(), sharding=kind)
    shards = _shards(ps, t.name)
    hf = _host_fraction(ps, kind, topology.num_gpus)
    if kind in _ROW_KINDS:
        return TablePlan(t, _row_cold(t, shards, kind), hbm_fraction=hf, sharding=kind)
    cold, merged = _column_cold(t, shards, kind)
    if merged:
        notes.append(f"table {t.name!r}: adjacent column shards on one rank are one range here; "
                     f"TorchRec sends their IDs once per shard")
    if hf.size:
        notes.append(f"table {t.name!r}: {ps.compute_kernel} column shards are priced as HBM "
                     f"rows (a column-wise plan holds no host memory tier)")
    return TablePlan(t, cold, sharding=kind)


def plan_from_sharding_plan(sharding_plan: Any, tables: Sequence[EmbeddingTable],
                            topology: Topology, meta: Mapping[str, Any] | None = None, *,
                            names: Mapping[str, str] | None = None) -> Plan:
    """A TorchRec ``ShardingPlan`` as our :class:`Plan` (strategy ``"torchrec"``), exactly.

    Per table, found by name (``names[table]`` when given: the name TorchRec planned it under,
    :func:`torchrec_table_names`) under any module path of ``sharding_plan.plan``:

    - ``data_parallel``: replicated on every GPU;
    - ``table_wise``, ``row_wise``, ``table_row_wise``: contiguous row ranges, the bounds being
      TorchRec's shard row offsets (its ``ceil(H / n)`` blocks, or uneven ones) on the shards'
      ranks, in row order;
    - ``column_wise``, ``table_column_wise``: column shards in column order on their ranks (two
      column-adjacent shards on one rank become one range: the same columns on the same GPU;
      noted in ``meta["torchrec"]["notes"]``);
    - ``fused_uvm`` / ``fused_uvm_caching`` kernels: a host memory tier holding every row / all
      but the cache's load factor (row shardings; column shardings are priced in HBM, noted).

    Raises
    ------
    ConfigError
        A table missing from the plan, a sharding type the plan type does not express (TorchRec's
        ``grid_shard``, only given when a user asks for it), shards that do not tile the table,
        non-adjacent column shards on one rank.
    """
    by_name: dict[str, Any] = {}
    for module_plan in sharding_plan.plan.values():
        by_name.update(module_plan.items())
    theirs = {t.name: (names or {}).get(t.name, t.name) for t in tables}
    missing = [t.name for t in tables if theirs[t.name] not in by_name]
    if missing:
        raise ConfigError(f"TorchRec's plan has no entry for table(s) {missing}")
    notes: list[str] = []
    tps = [_table_plan(t, by_name[theirs[t.name]], topology, notes) for t in tables]
    m = dict(meta or {})
    m.setdefault("torchrec", {})
    m["torchrec"] = dict(m["torchrec"], notes=notes,
                         compute_kernels={t.name: str(by_name[theirs[t.name]].compute_kernel)
                                          for t in tables})
    return Plan(TORCHREC_STRATEGY, topology, tps, m)


# ----------------------------------------------------------------------------- TorchRec's estimate
_PERF_FIELDS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "input_dist_comms",
                "prefetch_compute")


def torchrec_estimate(best_plan: Sequence[Any], world_size: int) -> dict[str, Any]:
    """TorchRec's own estimate of its chosen plan, from its ``ShardingOption`` s (milliseconds,
    as its ``Perf``; bytes as its ``Storage``).

    ``perf_rating_ms`` is what its default ``NoopPerfModel.rate`` scores a plan by: the maximum
    over ranks of the summed ``Perf.total`` (``fwd_compute + bwd_compute + fwd_comms +
    bwd_comms + prefetch_compute``; ``input_dist_comms`` is reported but not in the total).
    ``critical_rank_ms`` splits that rank's total into the ``Perf`` fields; ``per_rank_*`` are
    per rank; ``tables`` gives per table its sharding, kernel, ranks, summed ``Perf.total`` and
    HBM bytes."""
    per = {f: np.zeros(world_size) for f in _PERF_FIELDS + ("total",)}
    hbm, ddr = np.zeros(world_size), np.zeros(world_size)
    tables = {}
    for so in best_plan:
        total, t_hbm = 0.0, 0.0
        for sh in so.shards:
            r = int(sh.rank)
            for f in _PERF_FIELDS + ("total",):
                per[f][r] += float(getattr(sh.perf, f))
            hbm[r] += float(sh.storage.hbm)
            ddr[r] += float(sh.storage.ddr)
            total += float(sh.perf.total)
            t_hbm += float(sh.storage.hbm)
        tables[so.name] = {"sharding_type": str(so.sharding_type),
                           "compute_kernel": str(so.compute_kernel),
                           "ranks": sorted({int(sh.rank) for sh in so.shards}),
                           "perf_total_ms": total, "hbm_bytes": t_hbm}
    crit = int(np.argmax(per["total"]))
    return {"perf_rating_ms": float(per["total"][crit]), "critical_rank": crit,
            "critical_rank_ms": {f: float(per[f][crit]) for f in _PERF_FIELDS},
            "per_rank_total_ms": per["total"].tolist(), "per_rank_hbm_bytes": hbm.tolist(),
            "per_rank_ddr_bytes": ddr.tolist(), "tables": tables, "units": "ms, bytes"}


class _BestPlan:
    """A TorchRec ``Stats`` that keeps the planner's chosen ``ShardingOption`` s (TorchRec calls
    ``log`` of each of its stats once, with the best plan)."""

    def __init__(self) -> None:
        self.best_plan: list[Any] = []
        self.num_proposals = 0
        self.num_plans = 0

    def log(self, **kw: Any) -> None:
        self.best_plan = list(kw.get("best_plan") or [])
        self.num_proposals = int(kw.get("num_proposals") or 0)
        self.num_plans = int(kw.get("num_plans") or 0)


# ----------------------------------------------------------------------------- planning
def _torchrec() -> dict[str, Any]:
    """The TorchRec names planning needs (imported here: torch is not a dependency)."""
    with optional_imports("torchrec", "plan --strategy torchrec (TorchRec's own planner)"):
        import torch
        import torchrec
        from torch import nn
        from torchrec import (
            EmbeddingBagCollection,
            EmbeddingBagConfig,
            EmbeddingCollection,
            EmbeddingConfig,
        )
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import (
            EmbeddingShardingPlanner,
            ParameterConstraints,
        )
        from torchrec.distributed.planner.stats import EmbeddingStats
        from torchrec.distributed.planner.types import (
            CustomTopologyData,
            HardwareConfig,
            KernelConfig,
            PlannerError,
            TopologyFactory,
            TrainerConfig,
        )
        from torchrec.modules.embedding_configs import DataType
    return {"torch": torch, "torchrec": torchrec, "nn": nn, "DataType": DataType,
            "EmbeddingBagCollection": EmbeddingBagCollection,
            "EmbeddingBagConfig": EmbeddingBagConfig, "EmbeddingCollection": EmbeddingCollection,
            "EmbeddingConfig": EmbeddingConfig,
            "EmbeddingBagCollectionSharder": EmbeddingBagCollectionSharder,
            "EmbeddingCollectionSharder": EmbeddingCollectionSharder,
            "EmbeddingShardingPlanner": EmbeddingShardingPlanner,
            "ParameterConstraints": ParameterConstraints, "EmbeddingStats": EmbeddingStats,
            "CustomTopologyData": CustomTopologyData, "HardwareConfig": HardwareConfig,
            "KernelConfig": KernelConfig, "PlannerError": PlannerError,
            "TopologyFactory": TopologyFactory, "TrainerConfig": TrainerConfig}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """TorchRec's planner warnings and log lines silenced for the call (its debug table, the
    'constructed directly' and 'dry run' warnings): the caller reports what matters."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def torchrec_table_names(tables: Sequence[EmbeddingTable], reserved: Any = None
                         ) -> dict[str, str]:
    """Per table, the name TorchRec's collections can hold it under: the table's own name, or
    ``<name>__t<index>`` when the name is an attribute of ``torch.nn.ModuleDict`` (``items``,
    ``keys``, ``update``...: TorchRec keeps tables in one, which refuses such keys), holds a dot or
    is empty. ``reserved``: the names to avoid (default: ``nn.ModuleDict``'s attributes)."""
    if reserved is None:
        with optional_imports("torchrec", "plan --strategy torchrec (TorchRec's own planner)"):
            from torch import nn
        reserved = set(dir(nn.ModuleDict()))
    taken = {t.name for t in tables}
    out = {}
    for i, t in enumerate(tables):
        name = t.name
        if name in reserved or "." in name or not name:
            name = f"{t.name.replace('.', '_')}__t{i}"
            while name in taken or name in reserved:
                name += "_"
            taken.add(name)
        out[t.name] = name
    return out


def _module(tables: Sequence[EmbeddingTable], tr: Mapping[str, Any],
            names: Mapping[str, str]) -> Any:
    """The model TorchRec plans: an ``EmbeddingBagCollection`` of the pooled tables and
    ``EmbeddingCollection`` s of the sequence tables (:func:`module_paths`), on ``meta``; each
    table under ``names[table]`` (:func:`torchrec_table_names`)."""
    meta = tr["torch"].device("meta")
    dtype = {"fp32": tr["DataType"].FP32, "fp16": tr["DataType"].FP16,
             "bf16": tr["DataType"].BF16}
    paths = module_paths(tables)
    children: dict[str, list[EmbeddingTable]] = {}
    for t in tables:
        children.setdefault(paths[t.name], []).append(t)
    mods = {}
    for path, ts in children.items():
        cls = tr["EmbeddingBagConfig"] if path == POOLED_MODULE else tr["EmbeddingConfig"]
        configs = [cls(name=names[t.name], embedding_dim=t.dim, num_embeddings=t.num_rows,
                       feature_names=[t.feature], data_type=dtype[t.dtype]) for t in ts]
        coll = tr["EmbeddingBagCollection"] if path == POOLED_MODULE else \
            tr["EmbeddingCollection"]
        mods[path] = coll(tables=configs, device=meta)
    return tr["nn"].ModuleDict(mods)


def _topology(topology: Topology, tr: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """TorchRec's ``Topology`` made by its ``TopologyFactory``, and the config it came from."""
    cfg = torchrec_topology_config(topology)
    extra = {}
    if "hbm_cap_per_rank" in cfg:
        extra = {"custom_topology_data": tr["CustomTopologyData"](
            {"hbm_cap": cfg["hbm_cap_per_rank"]}, topology.num_gpus)}
    topo = tr["TopologyFactory"].create_topology(
        trainer_config=tr["TrainerConfig"](**cfg["trainer"], additional_params=extra),
        hardware_config=tr["HardwareConfig"](**cfg["hardware"]),
        kernel_config=tr["KernelConfig"](**cfg["kernel"]))
    return topo, cfg


def plan_torchrec(tables: Sequence[EmbeddingTable], topology: Topology, batch_size: int, *,
                  summaries: Mapping[str, FrequencySummary] | None = None,
                  mean_lengths: Mapping[str, float] | None = None,
                  quiet: bool = True) -> TorchRecPlanResult:
    """Run TorchRec 1.8's ``EmbeddingShardingPlanner`` on ``tables`` and ``topology``.

    Parameters
    ----------
    tables : sequence of EmbeddingTable
        Pooled tables go into an ``EmbeddingBagCollection`` (sum pooling), sequence tables into
        ``EmbeddingCollection`` s (one per dim), with their dtype.
    topology : Topology
        Converted by :func:`torchrec_topology_config` (TorchRec's units, ``compute_device`` cuda).
    batch_size : int
        B, samples per GPU per iteration (TorchRec's per-rank ``batch_size``).
    summaries : mapping of table name or feature to FrequencySummary, optional
        Their mean IDs per sample become TorchRec's ``pooling_factors`` (what a user who measured
        them would set). :func:`flexshard_stream.placement.references.plan_torchrec` also prices
        the plan with our evaluator.
    mean_lengths : mapping of table name to float, optional
        IDs per sample per table, instead of the summaries' (TorchRec's default is 1.0).
    quiet : bool
        Silence TorchRec's log lines and warnings for the call (they go through the root logger).

    Returns
    -------
    TorchRecPlanResult

    Raises
    ------
    MissingExtraError
        torch or torchrec is not installed (the ``torchrec`` extra).
    ConfigError
        ``batch_size`` <= 0, TorchRec finds no plan (its message, e.g. the tables do not fit the
        HBM), or its plan holds what the plan type cannot express (:func:`plan_from_sharding_plan`).
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be > 0 samples per GPU, got {batch_size}")
    if not tables:
        raise ConfigError("no tables to plan")
    tr = _torchrec()
    pooling = _pooling_factors(tables, summaries, mean_lengths)
    with _quiet() if quiet else contextlib.nullcontext():
        names = torchrec_table_names(tables, set(dir(tr["nn"].ModuleDict())))
        module = _module(tables, tr, names)
        topo, cfg = _topology(topology, tr)
        constraints = {names[n]: tr["ParameterConstraints"](pooling_factors=[pf])
                       for n, pf in pooling.items()}
        recorder = _BestPlan()
        planner = tr["EmbeddingShardingPlanner"](
            topology=topo, batch_size=int(batch_size), constraints=constraints or None,
            stats=[tr["EmbeddingStats"](), recorder])
        sharders = [tr["EmbeddingBagCollectionSharder"](), tr["EmbeddingCollectionSharder"]()]
        t0 = time.perf_counter()
        try:
            sharding_plan = planner.plan(module, sharders)
        except tr["PlannerError"] as e:
            raise ConfigError(f"TorchRec's planner found no plan: {str(e).strip()}") from None
        seconds = time.perf_counter() - t0
    estimate = torchrec_estimate(recorder.best_plan, topology.num_gpus)
    estimate.update(num_proposals=recorder.num_proposals, num_plans=recorder.num_plans)
    meta = {"planner": "torchrec", "batch_size": int(batch_size),
            "torchrec": {"version": str(tr["torchrec"].__version__),
                         "read_version": TORCHREC_VERSION, "topology": cfg,
                         "pooling_factors": pooling, "module_paths": module_paths(tables),
                         "sharders": ["EmbeddingBagCollectionSharder",
                                      "EmbeddingCollectionSharder"],
                         "planning_seconds": seconds, "estimate": estimate}}
    if any(k != v for k, v in names.items()):
        meta["torchrec"]["table_names"] = {k: v for k, v in names.items() if k != v}
    plan = plan_from_sharding_plan(sharding_plan, tables, topology, meta, names=names)
    return TorchRecPlanResult(plan, sharding_plan, estimate, seconds)
