"""The emulated cluster's topology and workload: a topology scaled to what this machine carries,
a sequence-heavy synthetic trace and the three plans measured on it (row-wise, TorchRec's own,
FlexShard), exported for TorchRec.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..bridge.export import export_torchrec
from ..errors import ConfigError
from ..placement import baselines
from ..placement.cost import TCP_WIRE_OVERHEAD, CostModel
from ..placement.planner import plan_flexshard
from ..placement.references import plan_torchrec
from ..plans.plan import Plan
from ..plans.tables import EmbeddingTable
from ..plans.topology import Topology
from ..sources.synth import TableSpec, generate
from ..stats.batch import Batch
from ..stats.stream import StreamStats

__all__ = ["scaled_topology", "emulation_rates", "sequence_workload", "cluster_plans",
           "export_plans", "calibrated_model", "default_model", "PLAN_LABELS",
           "SEQUENCE_TABLES", "MAX_INTRA_RATE", "GLOO_MESSAGE_LATENCY_S"]

#: The plans measured side by side, in order.
PLAN_LABELS = ("row_wise", "torchrec", "flexshard")
#: Fastest intra-node rate shaped (bits per second); above it intra-node traffic is unshaped
#: (veths on this 2-core machine carry a few Gbit/s at best, less under load).
MAX_INTRA_RATE = 1e9
#: Seconds per message round of a gloo collective across the emulated cluster, measured
#: (docs/CLUSTER.md): the namespaces' round trip (~30 us) plus gloo's and Python's per-call work.
GLOO_MESSAGE_LATENCY_S = 2e-3

#: The sequence-heavy trace: (name, rows, Zipf alpha, IDs per sample); 86 IDs per sample.
SEQUENCE_TABLES = (("click_history", 200_000, 1.1, 40), ("view_history", 150_000, 1.05, 24),
                   ("ad_history", 50_000, 1.15, 14), ("search_history", 100_000, 1.0, 8))


def emulation_rates(topology: Topology, inter_rate: float,
                    max_intra_rate: float = MAX_INTRA_RATE) -> tuple[float, float | None]:
    """(inter, intra) rates (bits per second) of an emulation of ``topology`` whose inter-node
    links run at ``inter_rate``: intra-node keeps the topology's ratio to inter-node (the least
    over GPUs), or is unshaped (None) when that exceeds ``max_intra_rate``."""
    if not inter_rate > 0:
        raise ConfigError(f"inter_rate must be > 0 bits per second, got {inter_rate}")
    ratio = float(np.min(topology.intra_bw / topology.inter_bw))
    intra = inter_rate * ratio
    return float(inter_rate), (intra if intra <= max_intra_rate else None)


def scaled_topology(topology: Topology, inter_rate: float, intra_rate: float | None,
                    unshaped_rate: float = MAX_INTRA_RATE) -> Topology:
    """``topology`` with the emulation's bandwidths (bytes per second of payload: ``rate / 8``;
    an unshaped intra-node class at ``unshaped_rate``); memory sizes unchanged."""
    intra = intra_rate if intra_rate is not None else unshaped_rate
    return Topology(topology.nodes, topology.gpus_per_node, topology.hbm_bytes,
                    np.full(topology.num_gpus, intra / 8.0),
                    np.full(topology.num_gpus, inter_rate / 8.0), topology.uvm_bw,
                    topology.host_memory_bytes,
                    f"{topology.name or 'cluster'} at {inter_rate / 1e6:g} Mbit/s")


def default_model() -> CostModel:
    """The evaluator as the planner uses it, de-duplication off (TorchRec's index
    de-duplication has no CPU kernel): the figures every other comparison quotes."""
    return CostModel(dedup=False)


def calibrated_model() -> CostModel:
    """The evaluator calibrated to the emulated cluster (docs/CLUSTER.md): gloo's flat ring
    all-reduce and pairwise all-to-all, TCP/IP's bytes per payload byte and a per-message
    latency."""
    return CostModel(dedup=False, allreduce="ring", alltoall="pairwise",
                     wire_overhead=TCP_WIRE_OVERHEAD, message_latency_s=GLOO_MESSAGE_LATENCY_S)


def sequence_workload(batch_size: int, world_size: int, batches: int, *, dim: int = 64,
                      scale: float = 1.0, seed: int = 0
                      ) -> tuple[list[EmbeddingTable], list[Batch]]:
    """The sequence-heavy synthetic trace: four Zipf sequence tables of
    :data:`SEQUENCE_TABLES` (rows times ``scale``), 86 IDs per sample (fixed lengths), fp32
    rows of ``dim`` columns; ``batches`` global batches of ``world_size * batch_size`` samples."""
    specs = [TableSpec(n, max(16, int(rows * scale)), a, "sequence", "fixed", float(L))
             for n, rows, a, L in SEQUENCE_TABLES]
    spb = batch_size * world_size
    out = list(generate(specs, spb * batches, spb, seed=seed))
    tables = [EmbeddingTable(s.name, s.num_rows, dim, kind="sequence", feature=s.name)
              for s in specs]
    return tables, out


def cluster_plans(tables: Sequence[EmbeddingTable], topology: Topology, batches: Sequence[Batch],
                  batch_size: int, model: CostModel | None = None, top_k: int = 4096
                  ) -> tuple[dict[str, Plan], dict]:
    """Row-wise, TorchRec's own plan and FlexShard (planned under ``model``, default
    :func:`calibrated_model`, with TorchRec's plan among its references) for ``tables`` on
    ``topology`` from the statistics of ``batches``; and the summaries."""
    model = model or calibrated_model()
    stats = StreamStats(auto_tables=True)
    for b in batches:
        stats.update(b)
    summaries = stats.summary(k=top_k)
    tr = plan_torchrec(tables, topology, batch_size, summaries=summaries, model=model).plan
    fs = plan_flexshard(tables, topology, summaries, batch_size, model=model,
                        references={"torchrec": tr}).plan
    return {"row_wise": baselines.row_wise(tables, topology), "torchrec": tr,
            "flexshard": fs}, summaries


def export_plans(plans: Mapping[str, Plan], out_dir: str | os.PathLike,
                 summaries: Mapping | None = None) -> dict[str, str]:
    """Each plan exported for TorchRec under ``out_dir/<label>``; {label: directory}."""
    out = {}
    for label, plan in plans.items():
        d = Path(out_dir) / label
        export_torchrec(plan, d, summaries=summaries)
        out[label] = str(d)
    return out
