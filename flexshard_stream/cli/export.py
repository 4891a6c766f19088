"""``flexshard-stream export``: a plan for TorchRec 1.8 (docs/TORCHREC_EXPORT.md); needs no
torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import choice, fail, load_plan, writing

#: ``export_torchrec.COLD_SHARDINGS`` and ``NODE_REPLICAS`` (spelled here: the module is imported
#: only when the command runs; tests/test_export_torchrec.py checks they agree).
EXPORT_COLD_SHARDINGS = ("auto", "row_wise", "table_row_wise", "table_wise")
EXPORT_NODE_REPLICAS = ("hot", "cold")


def _summaries(path: Path, plan) -> dict:
    """The frequency summaries of statistics file ``path`` (a plain statistics file or a
    snapshot), rows enough to cover every table's hot rows; ConfigError when it holds none of
    the plan's features."""
    from ..errors import ConfigError
    from ..sources.distributed import load_stats

    st = load_stats(path)
    features = {tp.table.feature or name for name, tp in plan.tables.items()}
    if not features & set(st.tables):
        raise ConfigError(f"--stats {path}: holds the statistics of {sorted(st.tables)}, none of "
                          f"the plan's features {sorted(features)}")
    hot = max((tp.global_ids.size + tp.node_ids.size for tp in plan.tables.values()),
              default=0)   # a replicated table is all hot: its share needs no rows
    return st.summary(k=max(1 << 16, 2 * hot))


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
        stats: Optional[Path] = typer.Option(None, "--stats", help="Statistics of the log the "
                                             "plan was made on (`flexshard-stream stats --save` "
                                             "or `merge -o`): TorchRec's pooling factors from "
                                             "its mean IDs per sample, split by the hot rows' "
                                             "share (default: TorchRec's 1.0)."),
        json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON.")) -> None:
    """Export a plan for TorchRec 1.8: tables, constraints, ShardingPlan, ID remap
    (docs/TORCHREC_EXPORT.md). Needs no torch."""
    from ..bridge.export import describe_export, export_torchrec
    from ..errors import FlexShardError

    try:
        plan = load_plan(plan_dir)
        summaries = None if stats is None else _summaries(stats, plan)
    except FlexShardError as e:
        fail(e)
    with writing(out):
        manifest = export_torchrec(plan, out, cold_sharding=cold_sharding,
                                   node_replicas=node_replicas, summaries=summaries)
    typer.echo(json.dumps(manifest) if json_out
               else "\n".join(describe_export(manifest) + [f"written to {out}"]))
