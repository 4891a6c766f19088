"""``flexshard-stream merge``: statistics snapshots of many hosts into one (docs/SCALING.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

import typer

from .common import writing


def merge_command(
        snapshots: List[Path] = typer.Argument(..., help="Snapshot files (or plain statistics "
                                               "files) from many hosts or windows."),
        out: Path = typer.Option(..., "-o", "--out", help="Merged snapshot to write (atomic; "
                                 "not written if any input is incompatible)."),
        json_out: bool = typer.Option(False, "--json", help="Print a JSON summary.")) -> None:
    """Merge statistics snapshots from many sidecars into one (for the planner)."""
    from ..sources.distributed import load_snapshot, merge_snapshots

    t0 = time.perf_counter()
    with writing(out):
        merged = merge_snapshots(snapshots, out)
        snap = load_snapshot(out)
    doc = {"out": str(out), "inputs": len(snapshots), "sources": snap.sources,
           "hosts": [h for h in (snap.host or "").split(",") if h], "unit": snap.unit,
           "start": snap.start, "end": snap.end, "samples": merged.samples, "ids": merged.ids,
           "tables": sorted(merged), "state_bytes": merged.state_bytes,
           "seconds": time.perf_counter() - t0}
    if json_out:
        typer.echo(json.dumps(doc))
    else:
        typer.echo(f"merged {len(snapshots)} snapshot(s) from {len(doc['hosts'])} host(s): "
                   f"{merged.samples:,} samples, {merged.ids:,} IDs, {len(doc['tables'])} "
                   f"table(s) -> {out}")
