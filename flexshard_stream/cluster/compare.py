"""Measured against modelled: the evaluator's figures for each export on the emulated cluster's
topology, beside what :func:`~flexshard_stream.cluster.run.run_on_cluster` measured.

Per plan: the model's communication time per component (index, forward, backward, sync) and in
all, under each cost model given (by default the planner's, :func:`~.workload.default_model`,
and the calibrated one, :func:`~.workload.calibrated_model`), and its wire bytes per link class
(link bytes times the model's ``wire_overhead``); beside them the measured network time (the
slowest rank's time with a collective under way) per component and in all, and the wire bytes
of the HTB counters; and measured / modelled for each. Each measured step is priced on the batch
it ran (step ``s`` ran ``batches[(warmup + s) % len(batches)]``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..bridge.export import load_torchrec_export, plan_from_export
from ..placement.cost import Cost, CostModel, evaluate_trace
from ..plans.plan import Plan
from ..plans.topology import Topology
from ..stats.batch import Batch
from .run import LINK_CLASSES, MODEL_COMPONENTS, ClusterRun, PlanMeasurement
from .workload import calibrated_model, default_model

__all__ = ["model_costs", "compare_plan", "compare_run", "speedups"]

_CLASS_INDEX = {"intra_node": 1, "inter_node": 2}


def _features(batch: Batch, keys: Sequence[str]) -> Batch:
    return Batch.from_features({k: batch.feature_values(k) for k in keys},
                               {k: batch.feature_lengths(k) for k in keys})


def model_costs(export_dir: str, batches: Sequence[Batch], batch_size: int, topology: Topology,
                model: CostModel) -> list[Cost]:
    """The evaluator's :class:`~flexshard_stream.placement.cost.Cost` of the plan an export
    runs (``plan_from_export``) on ``topology``, one per batch."""
    exported = plan_from_export(load_torchrec_export(export_dir))
    plan = Plan(exported.strategy, topology, exported.tables.values(), exported.meta)
    keys = [tp.table.feature for tp in plan.tables.values()]
    return [evaluate_trace(plan, [_features(b, keys)], batch_size, model).mean for b in batches]


def _wire(cost: Cost, model: CostModel) -> dict[str, float]:
    """Modelled wire bytes per link class: every component's link bytes, sent side, times the
    model's wire overhead."""
    return {c: model.wire_overhead * float(sum(cost.send[k][:, i].sum()
                                                for k in MODEL_COMPONENTS))
            for c, i in _CLASS_INDEX.items()}


def _ratio(measured: float, modelled: float) -> float | None:
    return measured / modelled if modelled > 0 else None


def compare_plan(m: PlanMeasurement, batches: Sequence[Batch], batch_size: int,
                 topology: Topology, models: Mapping[str, CostModel], warmup: int
                 ) -> dict[str, Any]:
    """One plan's measured figures beside each model's (medians over the measured steps for the
    measurement, means over the same steps' batches for the model)."""
    order = [(warmup + s) % len(batches) for s in range(m.steps)]
    net = {c: float(np.median(m.network_seconds(c))) for c in MODEL_COMPONENTS}
    net_total = float(np.median(m.network_seconds()))
    wire = {c: float(np.mean(v)) for c, v in m.wire_bytes().items()}
    out: dict[str, Any] = {"measured": m.summary(), "models": {}}
    for name, model in models.items():
        costs = model_costs(m.export_dir, batches, batch_size, topology, model)
        per_step = [costs[i] for i in order]
        t = {c: float(np.mean([x.time_s[c] for x in per_step])) for c in MODEL_COMPONENTS}
        total = float(np.mean([x.comm_time_s for x in per_step]))
        mw = {c: float(np.mean([_wire(x, model)[c] for x in per_step])) for c in LINK_CLASSES}
        out["models"][name] = {
            "model": {"allreduce": model.allreduce, "wire_overhead": model.wire_overhead,
                      "message_latency_s": model.message_latency_s},
            "network_s": total, "network_s_by_component": t,
            "network_measured_over_model": _ratio(net_total, total),
            "network_measured_over_model_by_component": {c: _ratio(net[c], t[c])
                                                         for c in MODEL_COMPONENTS},
            "wire_bytes": mw,
            "wire_measured_over_model": {c: _ratio(wire[c], mw[c]) for c in LINK_CLASSES}}
    return out


def compare_run(run: ClusterRun, batches: Sequence[Batch], topology: Topology, *,
                warmup: int, models: Mapping[str, CostModel] | None = None) -> dict[str, Any]:
    """Every plan of ``run`` against every model (default: ``{"default": default_model(),
    "calibrated": calibrated_model()}``); ``topology``: the emulation's (``scaled_topology``)."""
    models = models or {"default": default_model(), "calibrated": calibrated_model()}
    return {label: compare_plan(m, batches, run.batch_size, topology, models, warmup)
            for label, m in run.plans.items()}


def speedups(comparison: Mapping[str, Any], over: str, model: str = "calibrated"
             ) -> dict[str, dict[str, float]]:
    """Per plan: ``over``'s median step time over the plan's, measured, and the model's
    network time likewise."""
    base = comparison[over]
    out = {}
    for label, c in comparison.items():
        ms = c["measured"]["step_s"]["median"]
        mm = c["models"][model]["network_s"]
        out[label] = {"measured": base["measured"]["step_s"]["median"] / ms if ms else None,
                      "model": base["models"][model]["network_s"] / mm if mm else None}
    return out
