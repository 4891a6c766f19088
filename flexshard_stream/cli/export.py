"""``flexshard-stream export``: a plan for TorchRec 1.8 (docs/TORCHREC_EXPORT.md); needs no
torch."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .common import choice, fail, load_plan, writing

#: ``export_torchrec.COLD_SHARDINGS`` and ``NODE_REPLICAS`` (spelled here: the module is imported
#: only when the command runs; tests/test_export_torchrec.py checks they agree).
EXPORT_COLD_SHARDINGS = ("auto", "row_wise", "table_row_wise", "table_wise")
EXPORT_NODE_REPLICAS = ("hot", "cold")


def export_command(
        plan_dir: Path = typer.Option(..., "--plan", help="Plan directory (flexshard-stream plan "
                                      "--out)."),
        out: Path = typer.Option(..., "--out", help="Export directory to write (an export there "
                                 "is replaced; a file or another non-empty directory is "
                                 "refused)."),
        cold_sharding: str = typer.Option("auto", callback=choice(EXPORT_COLD_SHARDINGS,
                                                                  "--cold-sharding"),
                                          help="TorchRec sharding of the cold rows: auto | "
                                          "row_wise | table_row_wise | table_wise."),
        node_replicas: str = typer.Option("hot", callback=choice(EXPORT_NODE_REPLICAS,
                                                                 "--node-replicas"),
                                          help="Node replicas (no TorchRec equivalent): hot "
                                          "(replicated on every GPU) | cold."),
        json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON.")) -> None:
    """Export a plan for TorchRec 1.8: tables, constraints, ShardingPlan, ID remap
    (docs/TORCHREC_EXPORT.md). Needs no torch."""
    from ..bridge.export import describe_export, export_torchrec
    from ..errors import FlexShardError

    try:
        plan = load_plan(plan_dir)
    except FlexShardError as e:
        fail(e)
    with writing(out):
        manifest = export_torchrec(plan, out, cold_sharding=cold_sharding,
                                   node_replicas=node_replicas)
    typer.echo(json.dumps(manifest) if json_out
               else "\n".join(describe_export(manifest) + [f"written to {out}"]))
