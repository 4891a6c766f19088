"""The ``flexshard-stream`` command line (typer), one module per command.

Commands: ``stats`` (sketch parquet/CSV logs and print per-table statistics, ``--json`` for
machines), ``tables`` (a tables file sized for a log), ``plan``, ``evaluate``, ``replay`` (windows
of a log through rw, twrw, static FlexShard and the re-sharder; docs/REPLAY.md), ``report`` (HTML
and PNGs of a replay directory), ``demo`` (replay the embedded default trace and write the
report), ``merge`` (statistics snapshots of many hosts into one; docs/SCALING.md), ``sidecar``
(statistics and re-sharding fed by a shared-memory ring; docs/SIDECAR.md), ``export`` (a plan
for TorchRec; docs/TORCHREC_EXPORT.md) and ``cluster`` (exported plans timed in a real TorchRec
DMP on an emulated cluster; docs/CLUSTER.md). docs/CLI.md walks through them.

Layout: this module holds the typer ``app``, :func:`main` (the console entry point) and the
registration of the commands; :mod:`.common` what several commands share (option values and
parsing, error lines, text output, a plan's recorded settings); one module per command
(:mod:`.stats`, :mod:`.tables`, :mod:`.plan`, :mod:`.evaluate`, :mod:`.demo`, :mod:`.replay`,
:mod:`.report`, :mod:`.export`, :mod:`.merge`, :mod:`.sidecar`, :mod:`.cluster`).

Start-up: the package imports only typer and two standard-library-only modules (units, ID modes)
at the top; every command imports what it needs (numpy, Numba, polars, pyarrow, matplotlib, Ray)
inside, so ``--help`` and argument errors answer at once. Output is plain text that fits 80
columns; figures carry units chosen by magnitude (:mod:`flexshard_stream.formats.units`).
"""

from __future__ import annotations

import sys

import typer

from ..errors import FlexShardError
from . import demo, evaluate, plan, stats
from .cluster import cluster_command
from .common import DEFAULT_BATCH_SIZE, PROFILES, cli_message
from .export import EXPORT_COLD_SHARDINGS, EXPORT_NODE_REPLICAS, export_command
from .merge import merge_command
from .plan import MEMORY_BASELINES, STRATEGIES
from .replay import ENGINES, EVALUATIONS, replay_cmd
from .report import report_cmd
from .sidecar import sidecar_command
from .tables import tables_cmd

__all__ = ["app", "main", "STRATEGIES", "PROFILES", "MEMORY_BASELINES", "ENGINES", "EVALUATIONS",
           "DEFAULT_BATCH_SIZE", "EXPORT_COLD_SHARDINGS", "EXPORT_NODE_REPLICAS", "tables_cmd",
           "replay_cmd", "report_cmd", "export_command", "merge_command", "sidecar_command",
           "cluster_command"]

#: Plain (click) help and error formatting: rich's help renderer costs more start-up time than
#: everything else ``--help`` loads, and click's formatter already wraps at 80 columns.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="Live statistics-driven embedding-table placement: sketch ID streams, "
                       "plan, evaluate.")

# The order of registration is the order of ``--help``. The commands whose module has their name
# (stats, plan, evaluate, demo) are reached through it: ``cli.plan`` is the module.
app.command("stats")(stats.stats)
app.command("tables")(tables_cmd)
app.command("plan")(plan.plan)
app.command("evaluate")(evaluate.evaluate)
app.command("demo")(demo.demo)
app.command("replay")(replay_cmd)
app.command("report")(report_cmd)
app.command("export")(export_command)
app.command("merge")(merge_command)
app.command("sidecar")(sidecar_command)
app.command("cluster")(cluster_command)


def main() -> None:
    """The console entry point: run the command line; a library error that escapes a command is
    one ``error:`` line on stderr, exit status 2."""
    try:
        app()
    except FlexShardError as e:
        typer.echo(f"error: {cli_message(e)}", err=True)
        sys.exit(2)
