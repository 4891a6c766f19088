"""The ``flexshard-stream`` command line (typer).

Commands: ``demo`` (replay the embedded default trace through four placement strategies and write
the HTML report), ``stats`` (sketch parquet/CSV logs and print per-table statistics, ``--json`` for
machines), ``plan``, ``evaluate``, ``replay`` (windows of a log through rw, twrw, static FlexShard
and the re-sharder; docs/REPLAY.md), ``report`` (HTML and PNGs of a replay directory), ``merge``
(statistics snapshots of many hosts into one; docs/SCALING.md) and ``sidecar`` (statistics and
re-sharding fed by a shared-memory ring; docs/SIDECAR.md).
"""

from __future__ import annotations

import importlib.util
import json
import re
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
                         "`python -m flexshard_stream.sources.synth default data/default_trace.parquet`")


def _sketch_logs(paths: List[Path], features: Optional[List[str]], read_batch_size: int,
                 show_progress: bool, skip_bad_rows: bool = False):
    """Sketch the logs; returns the statistics, the seconds taken and the bad rows skipped per
    reason (all zero unless ``skip_bad_rows``)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .sources.logs import LogReader
    from .stats.stream import StreamStats

    stats = StreamStats(auto_tables=True)
    t0 = time.perf_counter()
    reader = LogReader([str(p) for p in paths], features=features,
                       read_batch_size=read_batch_size, skip_bad_rows=skip_bad_rows)
    with Progress(TextColumn("[bold]sketching[/]"), BarColumn(), TextColumn("{task.fields[ids]}"),
                  TimeElapsedColumn(), disable=not show_progress, transient=True,
                  console=_stderr_console()) as prog:
        task = prog.add_task("sketch", total=None, ids="0 IDs")
        for batch in reader:
            stats.update(batch)
            prog.update(task, ids=f"{stats.ids:,} IDs")
    return stats, time.perf_counter() - t0, reader.skipped


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
          read_batch_size: int = typer.Option(65536, "--read-batch-size",
                                              help="Samples per batch read from the logs (memory "
                                                   "only; the statistics do not depend on it)."),
          old_batch_size: Optional[int] = typer.Option(None, "--batch-size", hidden=True,
                                                       help="Deprecated: --read-batch-size."),
          json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
          save: Optional[Path] = typer.Option(None, help="Also save the statistics here."),
          skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Drop and count bad "
                                             "rows (reported on stderr) instead of stopping at "
                                             "the first.")):
    """Sketch logs and print per-table statistics."""
    feats = [f.strip() for f in features.split(",") if f.strip()] if features else None
    if topk < 0:
        raise typer.BadParameter("--topk must be >= 0")
    if old_batch_size is not None:
        typer.echo("warning: --batch-size is deprecated (it is the read chunk); use "
                   "--read-batch-size", err=True)
        read_batch_size = old_batch_size
    try:
        st, secs, skipped = _sketch_logs(logs, feats, read_batch_size, not json_out,
                                         skip_bad_rows)
        if save is not None:
            st.save(save)
    except FlexShardError as e:
        _fail(e, ("--skip-bad-rows",))
    if any(skipped.values()):
        typer.echo(f"warning: skipped {sum(skipped.values()):,} bad rows ("
                   + ", ".join(f"{k} {v:,}" for k, v in skipped.items() if v) + ")", err=True)
    if json_out:
        d = st.to_json(topk)
        typer.echo(json.dumps(d))
    else:
        _print_tables(st, topk, secs)


@app.command()
def demo(out: Path = typer.Option(Path("flexshard-demo"), help="Directory for the replay and its "
                                  "report (replaced if it holds an earlier replay)."),
         topk: int = typer.Option(5, help="Top rows whose share of lookups the sketch summary "
                                  "prints."),
         topology: str = typer.Option("2x8", help="Topology TOML file or preset name."),
         batch_size: int = typer.Option(32, help="Samples per GPU per iteration (B)."),
         window: str = typer.Option("5s", help="Window: a duration on the trace's ts column "
                                    "('5s') or a number of samples."),
         dedup: bool = typer.Option(True, help="In-batch de-duplication of IDs (off: TorchRec's "
                                    "assumption, one request per occurrence)."),
         report: bool = typer.Option(True, help="Write report.html and the PNGs (matplotlib).")):
    """Replay the embedded default trace through four placements and write the HTML report."""
    from rich.console import Console

    from .online.replay import replay as run_replay
    from .placement.cost import CostModel

    try:
        path = _default_trace()
        con = Console()
        con.print(f"[bold]flexshard-stream demo[/]: replaying the embedded default trace "
                  f"{path.name} (seeded synthetic, production-like skew, 30 s of samples) in "
                  f"windows of {window} on {topology}, B = {batch_size}")
        t0 = time.perf_counter()
        with _ReplayProgress() as prog:
            res = run_replay([path], topology, window=window, out_dir=out, batch_size=batch_size,
                             model=CostModel(dedup=dedup), progress=prog)
        _print_sketch(con, res.stats, topk)
        _print_replay(con, res)
        where = out.resolve()
        if report and importlib.util.find_spec("matplotlib") is None:
            report = False
            con.print("[yellow]report skipped: matplotlib is not installed[/] (pip install "
                      "'flexshard-stream[report]')")
        if report:
            from .online.report import build_report
            html = build_report(out)
            con.print(f"Report: [bold]{html.resolve()}[/] (open it in a browser; the pictures "
                      f"and summary.json are beside it in {where})")
        else:
            con.print(f"Replay written to {where} (summary.json, cdf.json, plans/, traffic/); "
                      f"`flexshard-stream report {out}` draws it")
        con.print(f"[dim]{time.perf_counter() - t0:.1f} s. Next: `flexshard-stream replay LOG... "
                  f"--topology 2x8 --window 30m --out DIR` on your own logs, then "
                  f"`flexshard-stream report DIR`.[/]")
    except FlexShardError as e:
        _fail(e)


#: Python keyword arguments that error messages suggest, and the flag that does the same on the
#: command line (None: no command has one; the suggestion is left out).
_FLAGS = {"skip_bad_rows=True": "--skip-bad-rows", "null_as_empty=True": None, "ts=False": None,
          "features={": None}


def _cli_message(e: BaseException | str, flags: tuple[str, ...] = ()) -> str:
    """``e`` as one line for a command-line user: a suggested Python argument becomes the
    command's flag when it has one (``flags``), else the suggestion is dropped."""
    msg = " ".join(str(e).split())
    for arg, flag in _FLAGS.items():
        if arg not in msg:
            continue
        if flag is not None and flag in flags:
            msg = msg.replace(arg, flag)
        else:
            msg = re.sub(rf";? ?(pass|declare it with) {re.escape(arg)}[^;]*", "", msg)
    return msg


def _fail(e: BaseException | str, flags: tuple[str, ...] = ()) -> None:
    """One clean error line on stderr, exit status 2 (no traceback); ``flags``: the command's
    flags that error messages may suggest (:func:`_cli_message`)."""
    typer.echo(f"error: {_cli_message(e, flags)}", err=True)
    raise typer.Exit(2)


class _ReplayProgress:
    """A rich progress bar on stderr fed by :func:`flexshard_stream.online.replay.replay`'s callback."""

    def __init__(self, enabled: bool = True):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        con = _stderr_console()
        self.prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("rows"), TimeElapsedColumn(), console=con,
                             transient=True, disable=not (enabled and con.is_terminal))
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.prog.__enter__()
        return self

    def __exit__(self, *exc):
        return self.prog.__exit__(*exc)

    def __call__(self, ev: dict) -> None:
        phase = ev["phase"]
        if phase not in self.tasks:
            self.tasks[phase] = self.prog.add_task(phase, total=ev.get("total_rows") or None)
        desc = phase if phase != "replaying" else f"replaying, window {ev.get('window', 0)}"
        self.prog.update(self.tasks[phase], completed=ev["rows_read"], description=desc)


def _print_sketch(con, stats, topk: int) -> None:
    """A short per-table sketch summary of the whole log."""
    from rich.table import Table

    t = Table(title=f"the whole log: {stats.ids:,} lookups in {stats.samples:,} samples",
              title_justify="left")
    for col in ("table", "lookups", "distinct rows", "IDs/sample", f"top-{topk} share", "mode"):
        t.add_column(col, justify="right" if col != "table" else "left", no_wrap=True)
    for name, ts in stats.tables.items():
        sm = ts.summary(max(topk, 1))
        share = float(sm.top_est[:topk].sum()) / sm.total if sm.total else 0.0
        t.add_row(name, f"{sm.total:,}", f"{sm.distinct_estimate:,.0f}", f"{sm.mean_length:.1f}",
                  f"{share:.1%}", "exact" if sm.exact else "sketch")
    con.print(t)


def _print_replay(con, res) -> None:
    """Per strategy: bytes per iteration, comm time, peak memory, migration, speed-up vs rw."""
    from rich.table import Table

    from .online.replay import STRATEGIES

    s = res.summary
    tot = s["totals"]
    from rich import box

    t = Table(title=f"{tot['windows']} windows of {s['window']['describe']}, "
                    f"{tot['iterations']:,} "
                    f"iterations x {s['samples_per_iteration']:,} samples, de-dup "
                    f"{'on' if s['model']['dedup'] else 'off'}, per iteration",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("strategy", "a2a MB", "inter-node MB", "comm us", "peak MB", "moved MB",
                "vs rw"):
        t.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for name in STRATEGIES:
        r = tot["strategies"][name]
        b = r["bytes_per_iter"] or {}
        sp = r.get("speedup_vs_rw")
        t.add_row(name, f"{(b.get('total') or 0) / 1e6:,.2f}",
                  f"{(b.get('inter_node') or 0) / 1e6:,.2f}",
                  f"{(r['comm_time_s_per_iter'] or 0) * 1e6:,.1f}",
                  f"{(r['peak_memory_bytes'] or 0) / 1e6:,.1f}",
                  f"{r['migration_bytes'] / 1e6:,.2f}" if name == "resharder" else "-",
                  "" if sp is None else f"{sp:.2f}x")
    con.print(t)
    st = tot["strategies"]
    rs, sta = st["resharder"].get("speedup_vs_rw"), st["static"].get("speedup_vs_rw")
    if rs is not None and sta is not None:
        con.print(f"rw: row-wise; twrw: table-row-wise; static: a FlexShard plan made on the "
                  f"first window; resharder: that plan moved online by the re-sharder "
                  f"({st['resharder']['deltas']} plan change(s) in {tot['checks']} checks). "
                  f"FlexShard replicates the rows that carry most lookups (on every GPU or once "
                  f"per node) within row-wise's memory ({s['budget_bytes'] / 1e6:,.1f} MB per "
                  f"GPU): [bold]{rs:.2f}x[/] less communication time per iteration than "
                  f"row-wise with the re-sharder, {sta:.2f}x static.")
    if tot.get("skipped_rows"):
        con.print(f"[yellow]skipped {tot['skipped_rows']:,} bad rows[/]: "
                  + ", ".join(f"{k} {v:,}" for k, v in tot["skipped"].items() if v))
    for w in s.get("warnings") or []:
        con.print(f"[yellow]warning:[/] {w}")
    if tot.get("dropped_samples") and not s.get("warnings"):
        con.print(f"[dim]{tot['dropped_samples']:,} samples at window ends did not fill an "
                  f"iteration: counted and fed to the statistics, not evaluated.[/]")


@app.command("replay")
def replay_cmd(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs, one row per "
                                                 "sample, in time order."),
               topology: str = typer.Option(..., help="Topology TOML file or preset name (2x8, "
                                            "16x8, 16x8_skewed)."),
               out: Path = typer.Option(..., help="Directory to write (summary.json, cdf.json, "
                                        "plans/, traffic/); replaced atomically."),
               tables: Optional[Path] = typer.Option(None, help="Table TOML file (default: "
                                                     "inferred from the log: rows = largest ID "
                                                     "+ 1, dim 128)."),
               window: Optional[str] = typer.Option(None, help="A duration on the ts column "
                                                    "(90s, 30m, 1h, 1d) or a number of samples "
                                                    "(100000). Default: 10 windows of equal "
                                                    "sample counts."),
               batch_size: int = typer.Option(512, help="Samples per GPU per iteration (B)."),
               dedup: bool = typer.Option(True, help="In-batch de-duplication of IDs."),
               skip_bad_rows: bool = typer.Option(False, help="Drop and count bad rows instead "
                                                  "of stopping at the first."),
               top_k: int = typer.Option(4096, help="Rows per table summarized for the planner "
                                         "and the re-sharder."),
               engine: str = typer.Option("local", help="Where the window statistics are "
                                          "computed: local (this process), process (worker "
                                          "processes) or ray (Ray tasks; needs the ray extra)."),
               evaluation: str = typer.Option("trace", help="trace: the driver streams every "
                                              "window's batches and evaluates them iteration by "
                                              "iteration; analytic: everything from each "
                                              "window's merged statistics (no batch on the "
                                              "driver)."),
               address: Optional[str] = typer.Option(None, help="Ray cluster address (auto, "
                                                     "ray://head:10001), passed to ray.init; "
                                                     "--engine ray only."),
               workers: Optional[int] = typer.Option(None, help="Workers of the engine; they "
                                                     "also divide the work, so equal --workers "
                                                     "give identical statistics on every "
                                                     "engine. Default: local 1, process the CPU "
                                                     "count, ray the cluster's CPUs."),
               json_out: bool = typer.Option(False, "--json", help="Print the totals as one JSON "
                                             "object.")):
    """Replay logs in windows through rw, twrw, a static FlexShard plan and the re-sharder."""
    from rich.console import Console

    from .online.replay import replay as run_replay
    from .placement.cost import CostModel

    try:
        with _ReplayProgress(enabled=not json_out) as prog:
            res = run_replay(logs, topology, tables=tables, window=window, out_dir=out,
                             batch_size=batch_size, model=CostModel(dedup=dedup),
                             skip_bad_rows=skip_bad_rows, top_k=top_k, progress=prog,
                             engine=engine, evaluation=evaluation, address=address,
                             num_workers=workers)
    except FlexShardError as e:
        _fail(e, ("--skip-bad-rows",))
    except OSError as e:
        _fail(f"cannot write {out}: {e}")
    if json_out:
        typer.echo(json.dumps({"out": str(out), "engine": res.summary["engine"],
                               "evaluation": res.summary["evaluation"],
                               "workers": res.summary["workers"], "totals": res.totals,
                               "warnings": res.summary.get("warnings", [])}))
        return
    con = Console()
    _print_replay(con, res)
    s = res.summary
    nw = s["workers"]
    how = f"engine {s['engine']}" + (f", {nw} worker{'' if nw == 1 else 's'}" if nw else "")
    con.print(f"written to {out.resolve()}; draw it with `flexshard-stream report {out}` "
              f"({res.elapsed_s:.1f} s, {how}, {s['evaluation']} evaluation)")


@app.command("report")
def report_cmd(directory: Path = typer.Argument(..., help="A directory written by "
                                                "`flexshard-stream replay`.")):
    """Write DIR/report.html and its PNG pictures from a replay directory (needs matplotlib)."""
    from .online.report import PICTURES, build_report

    try:
        html = build_report(directory)
    except FlexShardError as e:
        _fail(e)
    except OSError as e:
        _fail(f"cannot write the report into {directory}: {e}")
    typer.echo(f"report written to {html.resolve()} with {len(PICTURES)} pictures: "
               + ", ".join(PICTURES))


def _profile_batches(batches, tables):
    from .stats.config import TableConfig
    from .stats.stream import StreamStats
    st = StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tables])
    for b in batches:
        st.update(b)
    return st


def _load_tables(logs: List[Path], tables: Optional[Path]):
    from .placement.tables import infer_tables, load_tables
    if tables is not None:
        return load_tables(tables)
    return infer_tables([str(p) for p in logs])


def _profile(logs: List[Path], tables, read_batch_size: int = 65536):
    """Sketch the log with the tables' row counts (``read_batch_size`` samples read at a time);
    returns the StreamStats."""
    from .sources.logs import read_log
    from .stats.config import TableConfig
    from .stats.stream import StreamStats

    st = StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tables])
    for b in read_log([str(p) for p in logs], features=[t.feature for t in tables],
                      read_batch_size=read_batch_size):
        st.update(b)
    return st


@app.command()
def plan(log: List[Path] = typer.Option(..., "--log", help="Log files to profile (parquet/CSV)."),
         topology: str = typer.Option(..., help="Topology TOML file or preset name (2x8, 16x8, "
                                      "16x8_skewed)."),
         strategy: str = typer.Option("rw", help="flexshard | rw | rw-hash | tw | twrw | dp | "
                                      "hugectr"),
         out: Path = typer.Option(..., help="Plan directory to write."),
         tables: Optional[Path] = typer.Option(None, help="Table TOML file (default: inferred "
                                               "from the log: rows = largest ID + 1, dim 128)."),
         batch_size: int = typer.Option(512, help="Samples per GPU per iteration (B); hugectr "
                                        "counts profiled iterations with it."),
         dedup: bool = typer.Option(True, help="Plan for in-batch de-duplication (flexshard)."),
         memory_bytes: Optional[float] = typer.Option(None, help="Per-GPU memory budget in bytes "
                                                      "(flexshard; default: no more peak memory "
                                                      "than row-wise)."),
         memory_baseline: str = typer.Option("rw", help="Baseline whose peak memory is the "
                                             "budget (flexshard): rw | twrw | tw."),
         topk: int = typer.Option(1 << 20, help="Top rows per table the planner may replicate."),
         host_memory: bool = typer.Option(False, "--host-memory", help="RecShard tier (flexshard):"
                                          " cold rows that do not fit the memory budget (then HBM "
                                          "bytes per GPU) go to host memory, the hottest kept in "
                                          "HBM; host lookups at UVM bandwidth."),
         json_out: bool = typer.Option(False, "--json", help="Print the plan summary as JSON.")):
    """Write a plan (FlexShard or a baseline) for the tables of a log."""
    from .placement.baselines import build_baseline
    from .placement.topology import Topology

    topo = Topology.load(topology)
    tabs = _load_tables(log, tables)
    summaries = iterations = lookups = None
    result = None
    if strategy in ("hugectr", "tw", "twrw", "flexshard"):
        st = _profile(log, tabs)
        by_feat = {t.feature: t.name for t in tabs}
        summaries = {by_feat[f]: s for f, s in st.summary(k=topk).items()}
        iterations = max(1, st.samples // (topo.num_gpus * batch_size))
        lookups = {n: s.total / iterations for n, s in summaries.items()}
    if strategy == "flexshard":
        from .placement.cost import CostModel
        from .placement.planner import MemoryPolicy, plan_flexshard
        result = plan_flexshard(tabs, topo, summaries, batch_size,
                                MemoryPolicy(bytes_per_gpu=memory_bytes, baseline=memory_baseline,
                                             host_memory=host_memory),
                                CostModel(dedup=dedup))
        p = result.plan
    else:
        p = build_baseline(strategy, tabs, topo, summaries=summaries, iterations=iterations,
                           lookups=lookups)
    p.save(out)
    mem = p.row_bytes_per_gpu
    doc = {"strategy": p.strategy, "out": str(out), "topology": topo.name or
           f"{topo.nodes}x{topo.gpus_per_node}", "tiers": p.tier_sizes(),
           "row_bytes_per_gpu": {"max": float(mem.max()), "min": float(mem.min())}}
    if p.has_host_tier:
        hb = p.host_bytes_per_gpu
        doc["host_bytes_per_gpu"] = {"max": float(hb.max()), "min": float(hb.min())}
    if result is not None:
        doc["estimate"] = result.summary()
    if json_out:
        typer.echo(json.dumps(doc))
    else:
        _print_plan(doc, p, result, out)


def _print_plan(doc, p, result, out) -> None:
    """Human summary: tiers, memory per GPU, bytes per iteration by link class vs the baseline."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    mem = p.row_bytes_per_gpu
    con.print(f"[bold]{p.strategy}[/] plan for {len(p.tables)} tables on {doc['topology']} "
              f"written to {out}; stored rows per GPU {mem.min() / 1e9:.3g}..{mem.max() / 1e9:.3g} GB"
              + (f" in HBM, {p.host_bytes_per_gpu.max() / 1e9:.3g} GB at most in host memory"
                 if p.has_host_tier else ""))
    t = Table(title="tiers (rows)")
    for c in ("table", "global replicas", "node replicas", "cold", "placed by load"):
        t.add_column(c)
    for name, ts in p.tier_sizes().items():
        t.add_row(name, f"{ts['global']:,}", f"{ts['node']:,}", f"{ts['cold']:,}",
                  f"{ts['placed']:,}")
    con.print(t)
    if result is None:
        return
    s = result.summary()
    c, b = result.cost, result.baseline_cost
    m = Table(title=f"modelled per iteration (analytic), vs {result.baseline.strategy} at a budget "
                    f"of {s['budget_bytes'] / 1e9:.3f} GB per GPU")
    host = p.has_host_tier
    cols = ["", "all-to-all", "inter-node", "intra-node", "sync", "comm time"]
    cols += ["host lookups", "UVM time"] if host else []
    for col in cols + ["peak memory"]:
        m.add_column(col)
    for label, x in ((result.baseline.strategy, b), ("flexshard", c)):
        row = [label, f"{x.a2a_bytes / 1e6:,.1f} MB", f"{x.inter_node_bytes / 1e6:,.1f} MB",
               f"{x.intra_node_bytes / 1e6:,.1f} MB", f"{x.sync_bytes / 1e6:,.1f} MB",
               f"{x.comm_time_s * 1e3:,.3f} ms"]
        if host:
            row += [f"{x.host_lookups.sum():,.0f}", f"{x.uvm_time_s * 1e3:,.3f} ms"]
        m.add_row(*row, f"{x.peak_memory_bytes / 1e9:,.3f} GB")
    con.print(m)
    room = s["memory_room"]
    con.print(f"speed-up {b.iteration_time_s / max(c.iteration_time_s, 1e-30):.2f}x; room for "
              "replicas at "
              f"the peak GPU: {room.get('buffers_freed', 0) / 1e6:,.1f} MB of buffers freed, "
              f"{room.get('extra_rows', 0) / 1e6:,.1f} MB more rows, "
              f"{room.get('headroom', 0) / 1e6:,.1f} MB headroom over the baseline")


@app.command()
def evaluate(plan_dirs: List[Path] = typer.Option(..., "--plan", help="Plan directory (repeat "
                                                  "to compare several)."),
             log: List[Path] = typer.Option(..., "--log", help="Log files to replay."),
             batch_size: int = typer.Option(..., help="Samples per GPU per iteration (B)."),
             topology: Optional[str] = typer.Option(None, help="Check the plan was made for this "
                                                    "topology (file or preset)."),
             tables: Optional[Path] = typer.Option(None, help="Check the plan's tables against "
                                                   "this table file."),
             dedup: bool = typer.Option(True, help="In-batch de-duplication of IDs."),
             max_iterations: Optional[int] = typer.Option(None, help="Stop after this many."),
             json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Replay logs through plans: bytes per iteration by link class, time, peak memory."""
    from rich.console import Console
    from rich.table import Table

    from .errors import ConfigError
    from .placement.cost import CostModel, evaluate_trace
    from .placement.plan import Plan
    from .placement.tables import load_tables
    from .placement.topology import Topology
    from .sources.logs import read_log

    results = {}
    for d in plan_dirs:
        p = Plan.load(d)
        if topology is not None and Topology.load(topology) != p.topology:
            raise ConfigError(f"plan {d} was made for another topology than {topology}")
        if tables is not None:
            want = {t.name: t for t in load_tables(tables)}
            have = {n: tp.table for n, tp in p.tables.items()}
            if want != have:
                raise ConfigError(f"plan {d} tables differ from {tables}")
        feats = [tp.table.feature for tp in p.tables.values()]
        batches = read_log([str(x) for x in log], features=feats, read_batch_size=65536)
        tc = evaluate_trace(p, batches, batch_size, CostModel(dedup=dedup),
                            max_iterations=max_iterations)
        key = p.strategy if p.strategy not in results else f"{p.strategy}:{d}"
        results[key] = tc.to_json()
    if json_out:
        typer.echo(json.dumps(results))
        return
    t = Table(title=f"per iteration, B = {batch_size} samples per GPU, "
                    f"de-duplication {'on' if dedup else 'off'}")
    for c in ("plan", "iterations", "all-to-all bytes", "inter-node bytes", "sync bytes",
              "comm time", "peak memory / GPU"):
        t.add_column(c)
    for k, r in results.items():
        b = r["bytes_per_iter"]
        t.add_row(k, str(r["iterations"]), f"{b['total'] / 1e6:,.2f} MB",
                  f"{b['inter_node'] / 1e6:,.2f} MB", f"{b['sync'] / 1e6:,.2f} MB",
                  f"{r['comm_time_s_per_iter'] * 1e3:,.3f} ms",
                  f"{r['peak_memory_bytes'] / 1e9:,.3f} GB")
    Console().print(t)


@app.command("merge")
def merge_command(
        snapshots: List[Path] = typer.Argument(..., help="Snapshot files (or plain statistics "
                                               "files) from many hosts or windows."),
        out: Path = typer.Option(..., "-o", "--out", help="Merged snapshot to write (atomic; "
                                 "not written if any input is incompatible)."),
        json_out: bool = typer.Option(False, "--json", help="Print a JSON summary.")) -> None:
    """Merge statistics snapshots from many sidecars into one (for the planner)."""
    from .online.distributed import load_snapshot, merge_snapshots

    t0 = time.perf_counter()
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


@app.command("sidecar")
def sidecar_command(
        ring: str = typer.Option(..., "--ring", help="Shared-memory ring name (created if "
                                 "missing; DataLoader workers write into it)."),
        tables: Path = typer.Option(..., "--tables", help="Table TOML file."),
        topology: str = typer.Option(..., "--topology", help="Topology TOML file or preset."),
        out: Path = typer.Option(..., "--out", help="Directory for plans, deltas, counters and "
                                 "checkpoints."),
        batch_size: int = typer.Option(512, help="Samples per GPU per iteration (B)."),
        ring_dir: Optional[Path] = typer.Option(None, help="Directory of the ring file "
                                                "(default /dev/shm)."),
        slots: int = typer.Option(8, help="Producer slots when creating the ring (>= number of "
                                  "writer processes)."),
        capacity_mb: float = typer.Option(64.0, help="Ring capacity when creating it (MiB, "
                                          "shared by the slots)."),
        checksum: bool = typer.Option(False, help="CRC-32 on every ring record."),
        check_every: float = typer.Option(64.0, help="Batches (or seconds, --unit seconds) "
                                          "between re-sharder checks."),
        unit: str = typer.Option("batches", help="batches | seconds"),
        half_life: Optional[float] = typer.Option(None, help="Half-life of the decayed "
                                                  "statistics (default 4 checks)."),
        top_k: int = typer.Option(4096, help="Rows per table summarized for the planner."),
        horizon: float = typer.Option(1000.0, help="Iterations over which a saving must beat "
                                      "the migration."),
        memory_bytes: Optional[float] = typer.Option(None, help="Per-GPU memory budget (bytes; "
                                                     "default: row-wise peak)."),
        dedup: bool = typer.Option(True, help="Plan for in-batch de-duplication."),
        checkpoint_every: float = typer.Option(60.0, help="Seconds between checkpoints (0: only "
                                               "at shutdown)."),
        queue_batches: int = typer.Option(64, help="In-process queue between the ring and the "
                                          "statistics (batches)."),
        resume: bool = typer.Option(True, help="Resume from the last good checkpoint in --out."),
        status_every: float = typer.Option(0.0, help="Print a status line every this many "
                                           "seconds (0: never)."),
        unlink: bool = typer.Option(False, help="At shutdown, drain the ring and remove it."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress to stderr.")):
    """Consume a shared-memory ring of batches: statistics, re-sharding, published plans and
    deltas, checkpoints; clean shutdown (final checkpoint) on SIGTERM/SIGINT. Prints JSON lines
    (events resume, ready, status, stopped) on stdout (docs/SIDECAR.md)."""
    import logging
    import warnings

    from .online.resharder import ReshardConfig
    from .online.sidecar import SidecarWarning, run_ring
    from .placement.cost import CostModel
    from .placement.planner import MemoryPolicy

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
                            stream=sys.stderr)
    cfg = ReshardConfig(check_every=check_every, unit=unit, horizon_iterations=horizon,
                        top_k=top_k)
    warnings.simplefilter("default", SidecarWarning)
    return run_ring(ring, tables, topology, out, batch_size=batch_size, ring_dir=ring_dir,
                    slots=slots, capacity_bytes=int(capacity_mb * (1 << 20)), checksum=checksum,
                    config=cfg, half_life=half_life,
                    memory=MemoryPolicy(bytes_per_gpu=memory_bytes), model=CostModel(dedup=dedup),
                    checkpoint_every_s=checkpoint_every or None, queue_batches=queue_batches,
                    resume=resume, status_every_s=status_every, unlink=unlink)


def main() -> None:
    try:
        app()
    except FlexShardError as e:
        typer.echo(f"error: {_cli_message(e)}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # python -m flexshard_stream.cli ...
    main()
