"""TorchRec's own plan as a reference, priced by the one evaluator.

:func:`plan_torchrec` is :func:`flexshard_stream.bridge.planner.plan_torchrec` (TorchRec 1.8's
``EmbeddingShardingPlanner`` on our tables and topology, its plan in our plan type) followed by our
analytic cost of that plan when summaries are given, so that every "vs TorchRec" figure comes from
the same evaluator as the plans it is compared with. Every other name of the bridge's planner
adapter is re-exported (``placement.torchrec_planner``, the path before 0.2's bridge, resolves here).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..bridge.planner import (
    TORCHREC_STRATEGY,
    UVM_CACHING_RATIO,
    TorchRecPlanResult,
    module_paths,
    plan_from_sharding_plan,
    torchrec_estimate,
    torchrec_topology_config,
)
from ..bridge.limits import TORCHREC_REFERENCE_TABLES
from ..bridge.planner import plan_torchrec as _plan_unpriced
from ..plans.tables import EmbeddingTable
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .cost import CostModel, evaluate_analytic
from .workload import Workload, workload_of

__all__ = ["plan_torchrec", "TorchRecPlanResult", "TORCHREC_REFERENCE_TABLES",
           "plan_from_sharding_plan", "torchrec_topology_config", "torchrec_estimate", "module_paths",
           "UVM_CACHING_RATIO", "TORCHREC_STRATEGY"]


def plan_torchrec(tables: Sequence[EmbeddingTable], topology: Topology,
                  batch_size: int | None = None, *,
                  summaries: Mapping[str, FrequencySummary] | None = None,
                  mean_lengths: Mapping[str, float] | None = None,
                  model: CostModel | None = None, quiet: bool = True,
                  workload: Workload | None = None) -> TorchRecPlanResult:
    """TorchRec's plan (:func:`flexshard_stream.bridge.planner.plan_torchrec`, same parameters),
    priced by :func:`~flexshard_stream.placement.cost.evaluate_analytic` under the workload
    (``workload=``, or ``batch_size``, ``mean_lengths`` and ``model``, default ``CostModel()``,
    the torchrec profile) when ``summaries`` are given: ``result.cost`` and
    ``plan.meta["estimates"]``. TorchRec's planner is given the workload's B and its listed mean
    lengths (pooling factors; tables not listed: their summaries')."""
    work = workload_of(batch_size, model, mean_lengths, workload, where="plan_torchrec")
    result = _plan_unpriced(tables, topology, work.batch_size, summaries=summaries,
                            mean_lengths=dict(work.mean_lengths), quiet=quiet)
    if summaries is not None:
        result.cost = evaluate_analytic(result.plan, summaries, workload=work)
        result.plan.meta["estimates"] = result.cost.to_json()
    return result
