"""The ``flexshard-stream`` command line (typer).

Commands: ``demo`` (sketch the embedded default trace and print what it found) and ``stats`` (sketch
parquet/CSV logs and print per-table statistics, ``--json`` for machines).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from .errors import FlexShardError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Live statistics-driven embedding-table placement: sketch ID streams, "
                       "plan, evaluate.")

def _default_trace() -> Path:
    """The embedded default trace (``data/``, installed as ``flexshard_stream.data``)."""
    from .data import DEFAULT_TRACE
    if DEFAULT_TRACE.exists():
        return DEFAULT_TRACE
    raise FlexShardError("the embedded default trace is missing; regenerate it with "
                         "`python -m flexshard_stream.synth default data/default_trace.parquet`")


def _sketch_logs(paths: List[Path], features: Optional[List[str]], batch_size: int,
                 show_progress: bool):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .logs import read_log
    from .stream import StreamStats

    stats = StreamStats(auto_tables=True)
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]sketching[/]"), BarColumn(), TextColumn("{task.fields[ids]}"),
                  TimeElapsedColumn(), disable=not show_progress, transient=True,
                  console=_stderr_console()) as prog:
        task = prog.add_task("sketch", total=None, ids="0 IDs")
        for batch in read_log([str(p) for p in paths], features=features, batch_size=batch_size):
            stats.update(batch)
            prog.update(task, ids=f"{stats.ids:,} IDs")
    return stats, time.perf_counter() - t0


def _stderr_console():
    from rich.console import Console
    return Console(stderr=True)


def _print_tables(stats, topk: int, seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"{stats.ids:,} IDs in {stats.samples:,} samples, {stats.batches} batches, "
                    f"{seconds:.2f} s ({stats.ids / max(seconds, 1e-9) / 1e6:.1f} M IDs/s incl. I/O)")
    for col in ("table", "lookups", "distinct rows", "mode", "IDs/sample p50/p90/p99",
                f"top-{topk} share", "top rows (ID: lookups)"):
        t.add_column(col, overflow="fold")
    for name, ts in stats.tables.items():
        s = ts.summary(topk)
        q = s.length_quantiles
        share = float(s.top_est.sum()) / s.total if s.total else 0.0
        tops = ", ".join(f"{int(i)}: {int(e):,}" for i, e in zip(s.top_ids[:3], s.top_est[:3]))
        t.add_row(name, f"{s.total:,}", f"{s.distinct_estimate:,.0f}",
                  "exact" if s.exact else "sketch",
                  "/".join(f"{q.get(k, 0):g}" for k in ("0.5", "0.9", "0.99")),
                  f"{share:.1%}", tops)
    con.print(t)


@app.command()
def stats(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs, one row per sample."),
          features: Optional[str] = typer.Option(None, help="Comma-separated feature columns "
                                                 "(default: every integer or list column)."),
          topk: int = typer.Option(10, help="Top rows to print per table."),
          batch_size: int = typer.Option(65536, help="Samples per batch read from the logs."),
          json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
          save: Optional[Path] = typer.Option(None, help="Also save the statistics here.")):
    """Sketch logs and print per-table statistics."""
    feats = [f.strip() for f in features.split(",") if f.strip()] if features else None
    if topk < 0:
        raise typer.BadParameter("--topk must be >= 0")
    st, secs = _sketch_logs(logs, feats, batch_size, show_progress=not json_out)
    if save is not None:
        st.save(save)
    if json_out:
        d = st.to_json(topk)
        typer.echo(json.dumps(d))
    else:
        _print_tables(st, topk, secs)


@app.command()
def demo(topk: int = typer.Option(5, help="Top rows to print per table.")):
    """Sketch the embedded default trace and print its statistics."""
    from rich.console import Console

    path = _default_trace()
    con = Console()
    con.print(f"[bold]flexshard-stream demo[/]: sketching the embedded default trace {path.name} "
              "(seeded synthetic, production-like skew)")
    st, secs = _sketch_logs([path], None, 8192, show_progress=True)
    _print_tables(st, topk, secs)
    con.print("Each table is sketched by Numba kernels (count-min, Misra-Gries heavy hitters, "
              "HyperLogLog; exact counts when the table is small) in one pass. "
              "Next: `flexshard-stream stats LOG --json` on your own logs.")


def main() -> None:
    try:
        app()
    except FlexShardError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
