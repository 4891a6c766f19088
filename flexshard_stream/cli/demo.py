"""``flexshard-stream demo``: replay the embedded default trace and write its report."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Optional

import typer

from ..errors import FlexShardError
from .common import (
    DEDUP_HELP,
    PROFILE_HELP,
    PROFILES,
    choice,
    default_dedup,
    fail,
    say,
    text_table,
    torchrec_reference_ok,
)
from .replay import ReplayProgress, print_replay


def _default_trace() -> Path:
    """The embedded default trace (``data/``, installed as ``flexshard_stream.data``)."""
    from ..data import DEFAULT_TRACE
    if DEFAULT_TRACE.exists():
        return DEFAULT_TRACE
    raise FlexShardError("the embedded default trace is missing; regenerate it with `python -m "
                         "flexshard_stream.sources.synth default data/default_trace.parquet`")


#: The demo's B (samples per GPU per iteration): hundreds, as training jobs use, while 30 s of
#: samples still fill several iterations per window on 2x8.
DEMO_BATCH_SIZE = 128
DEMO_WINDOW = "10s"


def headline(summary) -> str:
    """The first line of the demo's result: what FlexShard gains over the fastest baseline
    that fits (named), or that it gains nothing here."""
    st = summary["totals"]["strategies"]
    best = min(("static", "resharder"),
               key=lambda s: st[s].get("comm_time_s_per_iter") or float("inf"))
    sp, name = st[best].get("speedup_vs_best_baseline"), st[best].get("best_baseline")
    if sp is None or not name:
        return "FlexShard: no baseline fits the budget to compare with."
    what = "the re-sharder" if best == "resharder" else "its static plan"
    name = "TorchRec's own plan (torchrec)" if name == "torchrec" else name
    tr = _vs_torchrec(st, best)
    if sp < 1.005:
        return (f"FlexShard gains nothing here over {name}, the fastest baseline that fits "
                f"({sp:.2f}x with {what}){tr}.")
    return (f"FlexShard: {sp:.2f}x less communication time per iteration than {name}, the "
            f"fastest baseline that fits, with {what}{tr} (replayed out of sample: planned on "
            f"the first window).")


def _vs_torchrec(st, best: str) -> str:
    """", 1.23x over TorchRec's own plan" when TorchRec's plan was replayed, else ""."""
    mine, theirs = (st[best].get("comm_time_s_per_iter"),
                    (st.get("torchrec") or {}).get("comm_time_s_per_iter"))
    if not mine or not theirs or "torchrec" == st[best].get("best_baseline"):
        return ""
    return f"; {theirs / mine:.2f}x over TorchRec's own plan"



def _print_sketch(stats, topk: int) -> None:
    """A short per-table sketch summary of the whole log."""
    say(f"the whole log: {stats.ids:,} lookups in {stats.samples:,} samples")
    rows = []
    for name, ts in stats.tables.items():
        sm = ts.summary(max(topk, 1))
        share = float(sm.top_est[:topk].sum()) / sm.total if sm.total else 0.0
        rows.append([name, f"{sm.total:,}", f"{sm.distinct_estimate:,.0f}",
                     f"{sm.mean_length:.1f}", f"{share:.1%}", "exact" if sm.exact else "sketch"])
    typer.echo(text_table(["table", "lookups", "distinct rows", "IDs/sample", f"top-{topk} share",
                           "mode"], rows))


def demo(out: Path = typer.Option(Path("flexshard-demo"), help="Directory for the replay and its "
                                  "report (replaced if it holds an earlier replay)."),
         topk: int = typer.Option(5, help="Top rows whose share of lookups the sketch summary "
                                  "prints."),
         topology: str = typer.Option("2x8", help="Topology TOML file or preset name."),
         batch_size: int = typer.Option(DEMO_BATCH_SIZE, help="Samples per GPU per iteration "
                                        "(B)."),
         window: str = typer.Option(DEMO_WINDOW, help="Window: a duration on the trace's ts "
                                    "column ('10s') or a number of samples."),
         dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup", help=DEDUP_HELP),
         profile: str = typer.Option("torchrec", callback=choice(PROFILES, "--profile"),
                                     help=PROFILE_HELP),
         report: bool = typer.Option(True, help="Write report.html and the PNGs (matplotlib).")):
    """Replay the embedded default trace (sequence-heavy) through FlexShard and the baselines and
    write the HTML report."""
    from ..online.replay import replay as run_replay
    from ..placement.cost import CostModel

    try:
        path = _default_trace()
        say(f"flexshard-stream demo: replaying the embedded default trace {path.name} (seeded "
            f"synthetic, production-like skew, item histories of ~47 IDs per sample, 30 s of "
            f"samples) in windows of {window} on {topology}, B = {batch_size}")
        t0 = time.perf_counter()
        with_torchrec = torchrec_reference_ok(profile, "replayed", show=say)
        with ReplayProgress() as prog:
            res = run_replay([path], topology, window=window, out_dir=out, batch_size=batch_size,
                             model=CostModel(dedup=default_dedup(profile) if dedup is None
                                             else dedup, profile=profile), progress=prog,
                             vs_torchrec=with_torchrec)
        say(headline(res.summary))
        say()
        _print_sketch(res.stats, topk)
        say()
        print_replay(res)
        say()
        _finish_demo(out, report)
        say(f"{time.perf_counter() - t0:.1f} s. Next: flexshard-stream replay LOG... --topology "
            f"2x8 --window 30m --out DIR on your own logs, then flexshard-stream report DIR.")
    except FlexShardError as e:
        fail(e)


def _finish_demo(out: Path, report: bool) -> None:
    """The demo's report (when matplotlib is installed) and where everything is."""
    where = os.path.abspath(out)             # the path asked for (not the version it links to)
    if report and importlib.util.find_spec("matplotlib") is None:
        report = False
        say("report skipped: matplotlib is not installed (pip install "
            "'flexshard-stream[report]')")
    if report:
        from ..report import build_report
        html = build_report(out)
        say(f"Report: {os.path.abspath(html)} (open it in a browser; the pictures and summary.json "
            f"are beside it in {where})")
    else:
        say(f"Replay written to {where} (summary.json, cdf.json, plans/, traffic/); "
            f"`flexshard-stream report {out}` draws it")
