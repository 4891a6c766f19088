"""The whole wall-clock experiment in one call: the sequence workload, the three plans on the
topology scaled to the emulation's rate, their exports, the run on the emulated cluster and the
comparison with the evaluator (what ``flexshard-stream cluster`` and ``bench/cluster.py`` print).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..plans.topology import Topology
from .compare import compare_run, speedups
from .run import LINK_CLASSES, run_on_cluster
from .workload import (
    MAX_INTRA_RATE,
    cluster_plans,
    emulation_rates,
    export_plans,
    scaled_topology,
    sequence_workload,
)

__all__ = ["cluster_experiment", "headline"]


def headline(comparison: dict[str, Any], model: str = "calibrated") -> dict[str, Any]:
    """The figures the benchmark reports: speed-ups measured and modelled, the largest errors
    of the network time and of the wire bytes (data packets, per link class) against ``model``,
    the CPU share per plan."""
    vs_tr, vs_rw = speedups(comparison, "torchrec", model), speedups(comparison, "row_wise", model)
    net_err = max(abs(c["models"][model]["network_measured_over_model"] - 1)
                  for c in comparison.values())
    wire_err = max(abs(r - 1) for c in comparison.values()
                   for k, r in c["models"][model]["wire_measured_over_model"].items()
                   if k in LINK_CLASSES and r is not None)
    return {"step_s": {k: c["measured"]["step_s"] for k, c in comparison.items()},
            "speedup_vs_torchrec_measured": vs_tr["flexshard"]["measured"],
            "speedup_vs_torchrec_model": vs_tr["flexshard"]["model"],
            "speedup_vs_rw_measured": vs_rw["flexshard"]["measured"],
            "speedup_vs_rw_model": vs_rw["flexshard"]["model"],
            "network_time_model_vs_measured_max_err": net_err,
            "wire_bytes_model_vs_measured_max_err": wire_err,
            "cpu_share": {k: c["measured"]["cpu_share"] for k, c in comparison.items()},
            "ranking_measured": sorted(comparison, key=lambda k: comparison[k]["measured"]
                                       ["step_s"]["median"]),
            "ranking_model": sorted(comparison, key=lambda k: comparison[k]["models"][model]
                                    ["network_s"])}


def cluster_experiment(topology: Topology, inter_rate: float, *, batch_size: int = 64,
                       steps: int = 10, warmup: int = 2, dim: int = 64, scale: float = 1.0,
                       batches: int = 4, intra_shaped: bool = True,
                       exports_dir: str | os.PathLike | None = None, seed: int = 0,
                       started=None) -> dict[str, Any]:
    """Plan, export, run and compare (module text); returns ``{"run", "comparison",
    "headline", "plans", "seconds"}`` as JSON-able dicts.

    Parameters
    ----------
    topology : Topology
        The cluster to emulate (N x M ranks); its bandwidths are scaled so that inter-node
        links run at ``inter_rate`` bits per second, intra-node ones at the topology's ratio
        (unshaped above :data:`~.workload.MAX_INTRA_RATE`, or when ``intra_shaped`` is False).
    batch_size, steps, warmup, dim, scale, batches, seed
        Samples per rank per step; measured and warm-up steps; the tables' dimension and row
        scale; distinct global batches cycled through; the trace's seed.
    exports_dir : path, optional
        Where the exports are written (default: a temporary directory, removed).
    started : callable, optional
        Passed to :func:`~.run.run_on_cluster`.
    """
    t0 = time.perf_counter()
    inter, intra = emulation_rates(topology, inter_rate)
    if not intra_shaped:
        intra = None
    scaled = scaled_topology(topology, inter, intra, MAX_INTRA_RATE)
    tables, trace = sequence_workload(batch_size, topology.num_gpus, batches, dim=dim,
                                      scale=scale, seed=seed)
    plans, summaries = cluster_plans(tables, scaled, trace, batch_size)
    planned = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="fs-cluster-exports-") as tmp:
        out = Path(exports_dir) if exports_dir is not None else Path(tmp)
        exports = export_plans(plans, out, summaries)
        run = run_on_cluster(exports, trace, nodes=topology.nodes,
                             gpus_per_node=topology.gpus_per_node, inter_rate=inter,
                             intra_rate=intra, steps=steps, warmup=warmup, started=started)
        comparison = compare_run(run, trace, scaled, warmup=warmup)
    return {"run": run.to_json(), "comparison": comparison, "headline": headline(comparison),
            "plans": {k: {n: tp.sharding_kind(scaled) + (f", {tp.global_ids.size} hot rows"
                                                         if tp.global_ids.size else "")
                          for n, tp in p.tables.items()} for k, p in plans.items()},
            "seconds": {"plan": planned, "total": time.perf_counter() - t0}}
