"""``flexshard-stream cluster``: wall-clock proof on an emulated cluster (docs/CLUSTER.md).

Plans row-wise, TorchRec's own plan and FlexShard for the sequence-heavy synthetic trace on the
topology scaled to ``--rate``, exports them, runs them in a real TorchRec
``DistributedModelParallel`` across network namespaces shaped with ``tc`` and prints, per plan,
the measured step time (median and interquartile range, slowest rank), its phases, the network
time, the wire bytes per link class and the CPU share beside the evaluator's figures (the
planner's model and the calibrated one). Needs root, iproute2 and the ``torchrec`` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

import typer

from .common import say, text_table

#: Link classes printed (data packets, headers included).
_CLASSES = ("inter_node", "intra_node")


def _rows(comparison: Mapping[str, Any], model: str) -> list[list[str]]:
    from ..formats.units import fmt_bytes, fmt_seconds

    rows = []
    for label, c in comparison.items():
        m, mm = c["measured"], c["models"][model]
        st = m["step_s"]
        rows.append([label, f"{fmt_seconds(st['median'])} ±{fmt_seconds(st['iqr'] / 2)}",
                     fmt_seconds(m["network_s"]["median"]), fmt_seconds(mm["network_s"]),
                     f"{mm['network_measured_over_model'] or 0:.2f}",
                     fmt_bytes(m["wire_bytes_mean"]["inter_node"]),
                     fmt_bytes(mm["wire_bytes"]["inter_node"]),
                     f"{m['cpu_share']:.0%}"])
    return rows


def print_comparison(result: Mapping[str, Any]) -> None:
    """The text report of :func:`cluster_experiment`'s result."""
    from ..formats.units import fmt_seconds

    run = result["run"]
    say(f"emulated {run['nodes']} x {run['gpus_per_node']} cluster, inter-node "
        f"{run['inter_rate_bits_per_s'] / 1e6:g} Mbit/s per rank and direction, intra-node "
        + (f"{run['intra_rate_bits_per_s'] / 1e6:g} Mbit/s" if run["intra_rate_bits_per_s"]
           else "unshaped")
        + f"; B = {run['batch_size']} per rank; load average "
        f"{run['load_average_before'][0]:.1f} -> {run['load_average_after'][0]:.1f}")
    for model in result["comparison"][next(iter(result["comparison"]))]["models"]:
        say(f"\nmodel: {model}")
        typer.echo(text_table(["plan", "step (median ±IQR/2)", "net meas.", "net model", "ratio",
                        "inter wire", "model", "CPU"], _rows(result["comparison"], model)))
    say("\nphases of the slowest rank (median): " + "; ".join(
        f"{k}: " + ", ".join(f"{p} {fmt_seconds(v)}" for p, v in
                             c["measured"]["phase_s"].items())
        for k, c in result["comparison"].items()))
    h = result["headline"]
    say(f"\nFlexShard vs TorchRec's plan: {h['speedup_vs_torchrec_measured']:.2f}x measured, "
        f"{h['speedup_vs_torchrec_model']:.2f}x modelled; vs row-wise "
        f"{h['speedup_vs_rw_measured']:.2f}x measured")


def cluster_command(
        topology: str = typer.Option("2x2", "--topology", help="Topology preset or TOML file; "
                                     "scaled to --rate (its intra/inter ratio kept)."),
        rate: float = typer.Option(20.0, "--rate", help="Inter-node rate per rank and "
                                   "direction, Mbit/s (low: the network dominates)."),
        batch_size: int = typer.Option(128, "--batch-size", "-b", help="Samples per rank per "
                                       "step."),
        steps: int = typer.Option(10, "--steps", help="Measured steps per plan."),
        warmup: int = typer.Option(2, "--warmup", help="Steps before the measured ones."),
        dim: int = typer.Option(32, "--dim", help="Embedding dimension (fp32)."),
        scale: float = typer.Option(0.02, "--scale", help="Multiplies the rows of the trace's "
                                    "tables (200,000 to 50,000 at 1)."),
        intra_unshaped: bool = typer.Option(False, "--intra-unshaped", help="Leave intra-node "
                                            "traffic unshaped."),
        exports_dir: Optional[Path] = typer.Option(None, "--keep-exports", help="Write the "
                                                   "three exports here (default: a temporary "
                                                   "directory)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Write the result as "
                                           "DIR/cluster.json (into a replay directory: "
                                           "`flexshard-stream report` shows it)."),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON.")) -> None:
    """Run row-wise, TorchRec's plan and FlexShard in a real TorchRec DMP on an emulated
    N x M cluster (network namespaces, tc HTB) and compare with the model
    (docs/CLUSTER.md). Needs root and the torchrec extra."""
    from ..cluster.experiment import cluster_experiment
    from ..plans.topology import Topology

    result = cluster_experiment(Topology.load(topology), rate * 1e6, batch_size=batch_size,
                                steps=steps, warmup=warmup, dim=dim, scale=scale,
                                intra_shaped=not intra_unshaped, exports_dir=exports_dir)
    if out is not None:
        from ..formats.files import write_atomic
        from ..report import CLUSTER_FILE

        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / CLUSTER_FILE, json.dumps(result, default=float).encode(),
                     fsync=False, mode=0o644)
    if json_out:
        typer.echo(json.dumps(result, default=float))
    else:
        print_comparison(result)
