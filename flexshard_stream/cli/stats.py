"""``flexshard-stream stats``: sketch logs and print per-table statistics (``--json`` for
machines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence

import typer

from ..errors import ConfigError, FlexShardError
from ..sources.ids import IdMode
from .common import (
    IDS_HELP,
    TS_HELP,
    WIDTH,
    fail,
    ids_option,
    require_logs,
    say,
    sketch_logs,
    text_table,
    warn,
    writing,
)


def _stats_rows(logs: List[Path], features: Optional[List[str]], mode: Optional[IdMode],
                ts_column: Optional[str] = None):
    """The RowMap of ``stats --ids``: None for raw IDs; every feature ``ROWS`` rows with
    ``hash:ROWS`` (stats has no tables file, so plain ``hash`` has nothing to hash into)."""
    if mode is None or not mode.hashed:
        return None
    if mode.rows is None:
        raise ConfigError("stats has no tables to hash into: give the rows, --ids hash:ROWS")
    from ..sources.ids import RowMap
    from ..sources.logs import inspect_log
    schema = inspect_log([str(p) for p in logs], features, ts_column=ts_column)
    return RowMap({f: mode.rows for f in schema.keys}, mode)


def _print_stats(stats, topk: int, seconds: float) -> None:
    """Per table: lookups, distinct rows, mode, IDs per sample, the top-k share; then the
    top-k rows of each table (all k of them)."""
    rate = stats.ids / max(seconds, 1e-9) / 1e6
    say(f"{stats.ids:,} IDs in {stats.samples:,} samples, {seconds:.2f} s ({rate:.1f} M IDs/s "
        f"incl. I/O)")
    rows, tops = [], {}
    for name, ts in stats.tables.items():
        s = ts.summary(topk)
        q = s.length_quantiles
        share = float(s.top_est[:topk].sum()) / s.total if s.total else 0.0
        rows.append([name, f"{s.total:,}", f"{s.distinct_estimate:,.0f}",
                     "exact" if s.exact else "sketch",
                     "/".join(f"{q.get(k, 0):g}" for k in ("0.5", "0.9", "0.99")),
                     f"{share:.1%}"])
        tops[name] = (s.top_ids[:topk], s.top_est[:topk], s.exact)
    say()
    typer.echo(text_table(["table", "lookups", "distinct", "mode", "IDs/sample p50/p90/p99",
                           f"top-{topk} share"], rows, left={0, 3}))
    if topk:
        for name, (ids, est, exact) in tops.items():
            say()
            say(f"top {len(ids)} rows of {name} (ID: lookups{'' if exact else ', estimates'}):")
            typer.echo(_packed([f"{int(i)}: {int(e):,}" for i, e in zip(ids, est)]))


def _packed(items: Sequence[str], indent: str = "  ") -> str:
    """Items in aligned columns, as many per line as fit in 80 columns."""
    if not items:
        return indent + "(none)"
    w = max(len(x) for x in items) + 3
    per = max(1, (WIDTH - len(indent)) // w)
    lines = [indent + "".join(x.ljust(w) for x in items[i:i + per]).rstrip()
             for i in range(0, len(items), per)]
    return "\n".join(lines)


def stats(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs, one row per sample."),
          features: Optional[str] = typer.Option(None, help="Comma-separated feature columns "
                                                 "(default: every integer or list column)."),
          topk: int = typer.Option(10, help="Top rows to print per table."),
          read_batch_size: int = typer.Option(65536, "--read-batch-size",
                                              help="Samples per batch read from the logs (memory "
                                                   "only; the statistics do not depend on it)."),
          old_batch_size: Optional[int] = typer.Option(None, "--batch-size", hidden=True,
                                                       help="Deprecated: --read-batch-size."),
          ids: Optional[str] = typer.Option(None, "--ids", callback=ids_option,
                                            help=IDS_HELP + " stats takes hash:ROWS."),
          json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
          ts: Optional[str] = typer.Option(None, "--ts", metavar="COLUMN", help=TS_HELP),
          save: Optional[Path] = typer.Option(None, help="Also save the statistics here."),
          skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Drop and count bad "
                                             "rows (reported on stderr) instead of stopping at "
                                             "the first.")):
    """Sketch logs and print per-table statistics."""
    require_logs(logs)
    feats = [f.strip() for f in features.split(",") if f.strip()] if features else None
    if topk < 0:
        raise typer.BadParameter("--topk must be >= 0")
    if old_batch_size is not None:
        typer.echo("warning: --batch-size is deprecated (it is the read chunk); use "
                   "--read-batch-size", err=True)
        read_batch_size = old_batch_size
    try:
        rows = _stats_rows(logs, feats, ids, ts)
        st, secs, skipped = sketch_logs(logs, feats, read_batch_size, show_progress=not json_out,
                                        rows=rows, skip_bad_rows=skip_bad_rows, ts_column=ts)
        if save is not None:
            with writing(save):
                st.save(save)
    except FlexShardError as e:
        fail(e)
    if any(skipped.values()):
        warn(f"skipped {sum(skipped.values()):,} bad rows ("
             + ", ".join(f"{k} {v:,}" for k, v in skipped.items() if v) + ")")
    if json_out:
        d = st.to_json(topk)
        typer.echo(json.dumps(d))
    else:
        _print_stats(st, topk, secs)
