"""``flexshard-stream replay``: windows of a log through rw, twrw, a static FlexShard plan and the
re-sharder (docs/REPLAY.md); its progress bar and printout serve ``demo`` too."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, List, Optional

import typer

from ..errors import ConfigError, FlexShardError
from ..formats.units import fmt_bytes
from ..sources.ids import IdMode
from .common import (
    CROSSING_NOTE,
    DEFAULT_BATCH_SIZE,
    IDS_HELP,
    PROFILE_HELP,
    PROFILES,
    TS_HELP,
    choice,
    cost_model,
    cost_rows,
    default_dedup,
    fail,
    ids_option,
    load_plan,
    note,
    os_reason,
    profile_label,
    recorded_settings,
    require_logs,
    resolve_setting,
    say,
    stderr_console,
    topology_name,
    vs_best_text,
    warn,
)

#: ``replay --engine`` and ``--evaluation`` values (online.replay.ENGINES / EVALUATIONS).
ENGINES = ("local", "process", "ray")
EVALUATIONS = ("trace", "analytic")


class ReplayProgress:
    """A rich progress bar on stderr fed by the callback of
    :func:`flexshard_stream.online.replay.replay`."""

    def __init__(self, enabled: bool = True):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        con = stderr_console()
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


def _what_flexshard(st) -> str:
    """What the FlexShard plans hold, said only of what they hold (a hashed plan without
    replicas does not "replicate the rows that carry most lookups")."""
    tiers = [t for s in ("static", "resharder") for t in (st[s].get("tiers") or {}).values()]
    replicated = any((t.get("global") or 0) + (t.get("node") or 0) for t in tiers)
    return ("FlexShard replicates the rows that carry most lookups (on every GPU or once per "
            "node)" if replicated else "FlexShard's plans replicate no row: they shard "
            "every table")


def _static_text(summary) -> str:
    """What the replay's static plan is: the user's (``--plan``) or one made on window 0."""
    return ("the plan given with --plan" if summary.get("static_plan") == "given"
            else "a FlexShard plan made on the first window")


def print_replay(res) -> None:
    """Per strategy: bytes per iteration, crossing nodes, comm time, peak memory, speed-up vs
    rw; then what the re-sharder did, skipped rows and warnings."""
    s = res.summary
    tot = s["totals"]
    st = tot["strategies"]
    say(f"{tot['windows']} window(s) of {s['window']['describe']}, {tot['iterations']:,} "
        f"iteration(s) x {s['samples_per_iteration']:,} samples (B = {s['batch_size']}), "
        f"de-duplication {'on' if s['model']['dedup'] else 'off'}; per iteration, "
        f"{profile_label(s['model'].get('profile', 'ideal'))} figures:")
    typer.echo(cost_rows([(n, st[n]) for n in s["strategies"]], vs_rw=True))
    rs, sta = st["resharder"].get("speedup_vs_rw"), st["static"].get("speedup_vs_rw")
    say(f"rw: row-wise; rw-hash: row-wise, rows hashed; twrw: table-row-wise; tw: table-wise; "
        + ("torchrec: TorchRec's own plan (its planner on the first window); "
           if "torchrec" in st else "") + f"static: {_static_text(s)}; resharder: that plan moved online "
        f"by the re-sharder ({st['resharder']['deltas']} plan change(s) in {tot['checks']} "
        f"checks, {fmt_bytes(st['resharder']['migration_bytes'])} moved). {_what_flexshard(st)}"
        f" within a budget of {fmt_bytes(s['budget_bytes'])} per GPU"
        + (f": {rs:.2f}x less communication time per iteration than row-wise with the "
           f"re-sharder, {sta:.2f}x static; {vs_best_text(st['resharder'])} with the "
           f"re-sharder ({vs_best_text(st['static'])} static)."
           if rs is not None and sta is not None else "."))
    if rs is not None and sta is not None and max(rs, sta) < 1.005:
        say(f"Here FlexShard gains under 0.5% over row-wise: under "
            f"{profile_label(s['model'].get('profile', 'ideal'))} exchanges at B = "
            f"{s['batch_size']}, within its budget less the margin the planner keeps free for "
            f"the next window, nothing it tried saves more.")
    say(CROSSING_NOTE)
    if tot.get("skipped_rows"):
        say(f"skipped {tot['skipped_rows']:,} bad rows: "
            + ", ".join(f"{k} {v:,}" for k, v in tot["skipped"].items() if v))
    for w in s.get("warnings") or []:
        warn(w)
    if tot.get("dropped_samples") and not s.get("warnings"):
        say(f"{tot['dropped_samples']:,} samples at window ends did not fill an iteration: "
            f"counted and fed to the statistics, not evaluated.")


def _replay_settings(plan_dir: Optional[Path], topology: Optional[str], tables: Optional[Path],
                     ids: Optional[IdMode], batch_size: Optional[int], dedup: Optional[bool],
                     profile: Optional[str] = None) -> dict[str, Any]:
    """Topology, tables, ID mode, B and cost model of a replay: the options, else the plan's
    (``--plan``), else the defaults; a topology is needed from one of them."""
    from ..placement.cost import CostModel
    from ..plans.topology import Topology

    if plan_dir is None:
        if topology is None:
            raise ConfigError("replay needs a topology: --topology (a preset such as 2x8, or a "
                              "TOML file), or --plan DIR to take it from a plan")
        return {"topology": Topology.load(topology), "tables": tables, "ids": ids or IdMode(),
                "plan": None,
                "batch_size": batch_size or DEFAULT_BATCH_SIZE,
                "model": CostModel(dedup=default_dedup(profile) if dedup is None else dedup,
                                   profile=profile or "torchrec")}
    p = load_plan(plan_dir)
    rec = recorded_settings(p)
    where = f"plan {plan_dir}"
    topo = p.topology if topology is None else Topology.load(topology)
    if topo != p.topology:
        warn(f"--topology {topology} differs from {topology_name(p.topology)} that {where} was "
             f"made for; replaying on {topology}")
    own = tables is None and topo == p.topology
    if not own:
        warn(f"the static plan replayed is made on the first window, not {where}'s: its "
             "topology or tables were replaced by the options")
    return {"topology": topo, "plan": p if own else None,
            "tables": tables if tables is not None else [tp.table for tp in p.tables.values()],
            "ids": resolve_setting("ids", "--ids", ids, rec["ids"], where, IdMode()),
            "batch_size": resolve_setting("batch_size", "--batch-size", batch_size,
                                          rec["batch_size"], where, DEFAULT_BATCH_SIZE),
            "model": cost_model(rec["model"],
                                resolve_setting("dedup", "--dedup/--no-dedup", dedup,
                                                rec["dedup"], where,
                                                default_dedup(profile or rec["profile"])),
                                resolve_setting("profile", "--profile", profile, rec["profile"],
                                                where, "torchrec"))}


def _fit_windows(logs: List[Path], window: Optional[str], topo, B: int
                 ) -> tuple[Optional[str], Optional[str]]:
    """The window to replay with and a note for the user: ``window`` if each can fill an
    iteration of ``G x B`` samples (ConfigError with the numbers otherwise); by default fewer
    equal windows when ten would not fill one (the note says so; printed once the arguments
    have all been checked). Duration windows are checked after the replay."""
    from ..online.replay import DEFAULT_WINDOWS
    from ..sources.logs import LogReader
    from ..sources.windows import parse_window

    G = topo.num_gpus
    spi = G * B
    if window is not None:
        spec = parse_window(window)
        if spec.unit == "samples" and spec.size < spi:
            raise ConfigError(f"windows of {int(spec.size):,} samples cannot fill one iteration "
                              f"of {G} GPUs x B {B} = {spi:,} samples: use --window {spi} or "
                              f"more, --batch-size {max(1, int(spec.size) // G)} or less, or "
                              f"fewer GPUs")
        return window, None
    rows = LogReader([str(p) for p in logs]).data_rows()
    if rows < spi:
        raise ConfigError(f"the log holds {rows:,} rows, fewer than one iteration of {G} GPUs x "
                          f"B {B} = {spi:,} samples: use --batch-size {max(1, rows // G)} or "
                          f"less, or fewer GPUs")
    per = math.ceil(rows / DEFAULT_WINDOWS)
    if per >= spi:
        return None, None
    n = max(1, rows // spi)
    size = math.ceil(rows / n)
    return str(size), (f"{DEFAULT_WINDOWS} windows of {per:,} samples would not fill one "
                       f"iteration of {G} GPUs x B {B} = {spi:,} samples: replayed {n} window(s) "
                       f"of {size:,} samples instead (--window chooses)")


def _check_replayed(res, B: int) -> None:
    """Refuse a replay in which no window filled an iteration (duration windows), with the
    numbers."""
    tot = res.totals
    if tot["iterations"]:
        return
    s = res.summary
    spi = s["samples_per_iteration"]
    most = max((w["samples"] for w in s["windows"]), default=0)
    raise ConfigError(f"no window of {s['window']['describe']} filled one iteration of "
                      f"{s['topology']['num_gpus']} GPUs x B {B} = {spi:,} samples (the largest "
                      f"holds {most:,}): nothing was evaluated. Use a larger --window or "
                      f"--batch-size {max(1, most // s['topology']['num_gpus'])} or less")


def replay_cmd(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs, one row per "
                                                 "sample, in time order."),
               out: Path = typer.Option(..., help="Directory to write (summary.json, cdf.json, "
                                        "plans/, traffic/); replaced atomically."),
               plan_dir: Optional[Path] = typer.Option(None, "--plan", help="Replay this plan "
                                                       "(flexshard-stream plan) as the static "
                                                       "one, the re-sharder starting from it; "
                                                       "topology, tables, ID mode, B and "
                                                       "de-duplication from it (options given "
                                                       "win, with a warning)."),
               topology: Optional[str] = typer.Option(None, help="Topology TOML file or preset "
                                                      "name (2x8, 16x8, 16x8_skewed); needed "
                                                      "without --plan."),
               tables: Optional[Path] = typer.Option(None, help="Tables file (default: the "
                                                     "plan's, or inferred from the log: rows = "
                                                     "largest ID + 1, dim 128)."),
               ids: Optional[str] = typer.Option(None, "--ids", callback=ids_option,
                                                 help=IDS_HELP),
               window: Optional[str] = typer.Option(None, help="A duration on the ts column "
                                                    "(90s, 30m, 1h, 1d) or a number of samples "
                                                    "(100000). Default: 10 windows of equal "
                                                    "sample counts (fewer if 10 cannot each "
                                                    "fill an iteration)."),
               batch_size: Optional[int] = typer.Option(None, help="Samples per GPU per "
                                                        "iteration (B). Default: the plan's, "
                                                        f"else {DEFAULT_BATCH_SIZE}."),
               dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup",
                                                    help="In-batch de-duplication of IDs "
                                                         "(default: the plan's, else on)."),
               profile: Optional[str] = typer.Option(None, callback=choice(PROFILES,
                                                                           "--profile"),
                                                     help=PROFILE_HELP + " Default: the "
                                                          "plan's, else torchrec."),
               skip_bad_rows: bool = typer.Option(False, help="Drop and count bad rows (IDs out "
                                                  "of the tables' range included) instead of "
                                                  "stopping at the first."),
               top_k: int = typer.Option(4096, help="Rows per table summarized for the planner "
                                         "and the re-sharder."),
               engine: str = typer.Option("local", callback=choice(ENGINES, "--engine"),
                                          help="Where the window statistics are computed: local "
                                               "(this process), process (worker processes) or "
                                               "ray (Ray tasks; needs the ray extra)."),
               evaluation: str = typer.Option("trace", callback=choice(EVALUATIONS,
                                                                       "--evaluation"),
                                              help="trace: the driver streams every window's "
                                                   "batches and evaluates them iteration by "
                                                   "iteration; analytic: everything from each "
                                                   "window's merged statistics."),
               address: Optional[str] = typer.Option(None, help="Ray cluster address (auto, "
                                                     "ray://head:10001), passed to ray.init; "
                                                     "--engine ray only."),
               workers: Optional[int] = typer.Option(None, help="Workers of the engine; they "
                                                     "also divide the work, so equal --workers "
                                                     "give identical statistics on every "
                                                     "engine. Default: local 1, process the CPU "
                                                     "count, ray the cluster's CPUs."),
               ts: Optional[str] = typer.Option(None, "--ts", metavar="COLUMN", help=TS_HELP),
               json_out: bool = typer.Option(False, "--json", help="Print the totals as one JSON "
                                             "object."),
               vs_torchrec: bool = typer.Option(False, help="Replay TorchRec's own plan too "
                                                "(its planner on the first window; the "
                                                "torchrec extra, at most 64 tables; seconds to "
                                                "minutes more). The demo does when TorchRec is "
                                                "installed.")):
    """Replay logs in windows through rw, twrw, a static FlexShard plan and the re-sharder."""
    require_logs(logs)
    from ..online.replay import replay as run_replay

    if batch_size is not None and batch_size < 1:
        raise typer.BadParameter("must be >= 1 sample per GPU", param_hint="--batch-size")
    try:
        cfg = _replay_settings(plan_dir, topology, tables, ids, batch_size, dedup, profile)
        win, window_note = _fit_windows(logs, window, cfg["topology"], cfg["batch_size"])
        with ReplayProgress(enabled=not json_out) as prog:
            res = run_replay(logs, cfg["topology"], tables=cfg["tables"], window=win,
                             out_dir=out, batch_size=cfg["batch_size"], model=cfg["model"],
                             skip_bad_rows=skip_bad_rows, top_k=top_k, progress=prog,
                             engine=engine, evaluation=evaluation, address=address,
                             num_workers=workers, ids=cfg["ids"], plan=cfg["plan"],
                             ts_column=ts, vs_torchrec=vs_torchrec)
        if window_note:
            note(window_note)
        _check_replayed(res, cfg["batch_size"])
    except FlexShardError as e:
        fail(e)
    except OSError as e:
        fail(f"cannot write {out}: {os_reason(e)}")
    if json_out:
        typer.echo(json.dumps({"out": str(out), "profile": cfg["model"].profile,
                               "engine": res.summary["engine"],
                               "evaluation": res.summary["evaluation"],
                               "workers": res.summary["workers"], "totals": res.totals,
                               "warnings": res.summary.get("warnings", [])}))
        return
    print_replay(res)
    s = res.summary
    nw = s["workers"]
    how = f"engine {s['engine']}" + (f", {nw} worker{'' if nw == 1 else 's'}" if nw else "")
    say(f"written to {out}; draw it with `flexshard-stream report {out}` "
        f"({res.elapsed_s:.1f} s, {how}, {s['evaluation']} evaluation)")
