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
def demo(topk: int = typer.Option(5, help="Top rows to print per table."),
         topology: str = typer.Option("2x8", help="Topology for the planning part."),
         batch_size: int = typer.Option(64, help="Samples per GPU per iteration (B).")):
    """Sketch the embedded default trace, print its statistics, then plan it and compare plans."""
    from rich.console import Console
    from rich.table import Table

    from .baselines import build_baseline
    from .batch import rebatch
    from .cost import CostModel, evaluate_trace
    from .logs import read_log
    from .planner import plan_flexshard
    from .topology import Topology

    path = _default_trace()
    con = Console()
    con.print(f"[bold]flexshard-stream demo[/]: sketching the embedded default trace {path.name} "
              "(seeded synthetic, production-like skew)")
    st, secs = _sketch_logs([path], None, 8192, show_progress=True)
    _print_tables(st, topk, secs)
    con.print("Each table is sketched by Numba kernels (count-min, Misra-Gries heavy hitters, "
              "HyperLogLog; exact counts when the table is small) in one pass.\n")

    # plan on the first half of the trace, evaluate every plan on the second half (out of sample)
    topo = Topology.load(topology)
    tabs = _load_tables([path], None)
    spi = topo.num_gpus * batch_size
    batches = list(rebatch(read_log([str(path)], batch_size=spi), spi, drop_last=True))
    half = len(batches) // 2
    prof = _profile_batches(batches[:half], tabs)
    by_feat = {t.feature: t.name for t in tabs}
    summaries = {by_feat[f]: s for f, s in prof.summary(k=1 << 20).items()}
    t = Table(title=f"planned on the first {half} iterations, evaluated on the next "
                    f"{len(batches) - half} (out of sample), {topo.summary().split(';')[0]}, "
                    f"B = {batch_size}")
    for col in ("de-dup", "plan", "all-to-all / iter", "inter-node / iter", "sync / iter",
                "comm time / iter", "peak memory / GPU"):
        t.add_column(col)
    for dedup in (False, True):
        model = CostModel(dedup=dedup)
        res = plan_flexshard(tabs, topo, summaries, batch_size, model=model)
        plans = [build_baseline("rw", tabs, topo), build_baseline("twrw", tabs, topo), res.plan]
        costs = [evaluate_trace(p, batches[half:], batch_size, model).mean for p in plans]
        base = costs[0].comm_time_s
        for p, c in zip(plans, costs):
            name = p.strategy if p.strategy != "flexshard" else \
                f"flexshard ({base / max(c.comm_time_s, 1e-30):.2f}x vs rw)"
            t.add_row("on" if dedup else "off", name, f"{c.a2a_bytes / 1e6:,.2f} MB",
                      f"{c.inter_node_bytes / 1e6:,.2f} MB", f"{c.sync_bytes / 1e6:,.2f} MB",
                      f"{c.comm_time_s * 1e6:,.1f} us", f"{c.peak_memory_bytes / 1e6:,.1f} MB")
    con.print(t)
    con.print("FlexShard replicates the rows that carry most lookups (globally or per node) and "
              "shards the rest by load, within the row-wise plan's peak memory. Next: "
              "`flexshard-stream stats LOG --json`, `flexshard-stream plan --strategy flexshard`, "
              "`flexshard-stream evaluate` on your own logs.")


def _profile_batches(batches, tables):
    from .config import TableConfig
    from .stream import StreamStats
    st = StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tables])
    for b in batches:
        st.update(b)
    return st


def _load_tables(logs: List[Path], tables: Optional[Path]):
    from .tables import infer_tables, load_tables
    if tables is not None:
        return load_tables(tables)
    return infer_tables([str(p) for p in logs])


def _profile(logs: List[Path], tables, batch_size: int):
    """Sketch the log with the tables' row counts; returns the StreamStats."""
    from .logs import read_log
    from .stream import StreamStats
    from .config import TableConfig

    st = StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tables])
    for b in read_log([str(p) for p in logs], features=[t.feature for t in tables],
                      batch_size=batch_size):
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
         json_out: bool = typer.Option(False, "--json", help="Print the plan summary as JSON.")):
    """Write a plan (FlexShard or a baseline) for the tables of a log."""
    from .baselines import build_baseline
    from .topology import Topology

    topo = Topology.load(topology)
    tabs = _load_tables(log, tables)
    summaries = iterations = lookups = None
    result = None
    if strategy in ("hugectr", "tw", "twrw", "flexshard"):
        st = _profile(log, tabs, 65536)
        by_feat = {t.feature: t.name for t in tabs}
        summaries = {by_feat[f]: s for f, s in st.summary(k=topk).items()}
        iterations = max(1, st.samples // (topo.num_gpus * batch_size))
        lookups = {n: s.total / iterations for n, s in summaries.items()}
    if strategy == "flexshard":
        from .cost import CostModel
        from .planner import MemoryPolicy, plan_flexshard
        result = plan_flexshard(tabs, topo, summaries, batch_size,
                                MemoryPolicy(bytes_per_gpu=memory_bytes, baseline=memory_baseline),
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
              f"written to {out}; stored rows per GPU {mem.min() / 1e9:.3g}..{mem.max() / 1e9:.3g} GB")
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
    for col in ("", "all-to-all", "inter-node", "intra-node", "sync", "comm time", "peak memory"):
        m.add_column(col)
    for label, x in ((result.baseline.strategy, b), ("flexshard", c)):
        m.add_row(label, f"{x.a2a_bytes / 1e6:,.1f} MB", f"{x.inter_node_bytes / 1e6:,.1f} MB",
                  f"{x.intra_node_bytes / 1e6:,.1f} MB", f"{x.sync_bytes / 1e6:,.1f} MB",
                  f"{x.comm_time_s * 1e3:,.3f} ms", f"{x.peak_memory_bytes / 1e9:,.3f} GB")
    con.print(m)
    room = s["memory_room"]
    con.print(f"speed-up {b.comm_time_s / max(c.comm_time_s, 1e-30):.2f}x; room for replicas at "
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

    from .cost import CostModel, evaluate_trace
    from .errors import ConfigError
    from .logs import read_log
    from .plan import Plan
    from .tables import load_tables
    from .topology import Topology

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
        batches = read_log([str(x) for x in log], features=feats, batch_size=65536)
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


def main() -> None:
    try:
        app()
    except FlexShardError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
