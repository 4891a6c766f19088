"""``flexshard-stream evaluate``: replay logs through plans (trace mode): bytes per iteration by
link class, time, peak memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

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
    choice,
    cost_model,
    cost_rows,
    default_dedup,
    fail,
    ids_option,
    load_plan,
    note,
    plan_label,
    profile_label,
    recorded_settings,
    require_logs,
    resolve_setting,
    say,
    spell_setting,
    topology_name,
    warn,
)


def _common_setting(name: str, flag: str, given: Any, plans: Sequence[tuple[Path, Any]],
                    default: Any) -> Any:
    """One value for every plan: ``given``, else the first recorded one, else ``default``; each
    plan made for another value is named in a warning with both values."""
    recs = [(d, recorded_settings(p)[name]) for d, p in plans]
    value = given if given is not None else next((r for _, r in recs if r is not None), default)
    why = f"({flag})" if given is not None else "(the first plan's)"
    for d, r in recs:
        if r is not None and r != value:
            warn(f"{flag}: plan {d} was made for {spell_setting(name, r)}; evaluating it at "
                 f"{spell_setting(name, value)} {why}. Re-plan with it for a like-for-like figure.")
    if all(r is None for _, r in recs) and given is None:
        note(f"the plans record no {flag}: using {spell_setting(name, value)}")
    return value


def _check_plan_against(d: Path, p, topology: Optional[str], tables: Optional[Path]) -> None:
    """``evaluate --topology/--tables``: the plan must have been made for them."""
    from ..plans.tables import load_tables
    from ..plans.topology import Topology

    if topology is not None and Topology.load(topology) != p.topology:
        raise ConfigError(f"plan {d} was made for topology {topology_name(p.topology)}, not "
                          f"{topology}")
    if tables is not None:
        want = {t.name: t for t in load_tables(tables)}
        have = {n: tp.table for n, tp in p.tables.items()}
        if want != have:
            raise ConfigError(f"plan {d} tables differ from {tables}")


def _evaluate_one(d: Path, p, logs: List[Path], B: int, dedup: bool, mode: IdMode,
                  skip_bad_rows: bool, max_iterations: Optional[int],
                  profile: str) -> dict[str, Any]:
    """Replay ``logs`` through plan ``p``: its cost per iteration (trace mode) as JSON, with the
    settings used and the rows skipped."""
    from ..placement.cost import evaluate_trace
    from ..plans.tables import row_map
    from ..sources.logs import LogReader

    tabs = [tp.table for tp in p.tables.values()]
    reader = LogReader([str(x) for x in logs], features=[t.feature for t in tabs],
                       read_batch_size=65536, skip_bad_rows=skip_bad_rows,
                       rows=row_map(tabs, mode))
    model = cost_model(recorded_settings(p)["model"], dedup, profile)
    tc = evaluate_trace(p, reader, B, model, max_iterations=max_iterations)
    spi = p.topology.num_gpus * B
    if tc.mean.iterations == 0:
        raise ConfigError(f"plan {d}: the log holds {reader.samples:,} samples"
                          f"{' after skipping bad rows' if any(reader.skipped.values()) else ''}"
                          f", fewer than one iteration of {p.topology.num_gpus} GPUs x B {B} = "
                          f"{spi:,} samples; use a smaller --batch-size (at most "
                          f"{max(1, reader.samples // p.topology.num_gpus):,})")
    r = tc.to_json()
    r.update({"batch_size": B, "dedup": dedup, "ids": str(mode), "samples": reader.samples,
              "profile": profile,
              "skipped": {k: v for k, v in reader.skipped.items() if v},
              "label": plan_label(recorded_settings(p)["requested"], p)})
    hbm = float(p.topology.hbm_bytes.min())
    if r["peak_memory_bytes"] > hbm:
        warn(f"plan {d}: peak memory {fmt_bytes(r['peak_memory_bytes'])} per GPU exceeds the "
             f"{fmt_bytes(hbm)} of HBM of its topology")
    return r


def _print_evaluation(results: Mapping[str, Mapping[str, Any]], plans) -> None:
    first = next(iter(results.values()))
    topo = plans[0][1].topology
    say(f"per iteration: {topo.num_gpus} GPUs x B = {first['batch_size']} samples, "
        f"de-duplication {'on' if first['dedup'] else 'off'}, "
        f"{profile_label(first['profile'])} figures; "
        + "; ".join(f"{r['label']}: {r['iterations']:,} iterations, IDs {r['ids']}"
                    for r in results.values()))
    labels = [r["label"] for r in results.values()]
    typer.echo(cost_rows([(r["label"] if labels.count(r["label"]) == 1 else k, r)
                          for k, r in results.items()]))
    for k, r in results.items():
        vs = r.get("vs_best_other")
        if vs:
            say(f"{k}: {vs['speedup']:.2f}x the fastest other plan evaluated, {vs['plan']}"
                + (" (faster)" if vs["speedup"] > 1 else " (slower)" if vs["speedup"] < 1
                   else ""))
    skipped = {k: r["skipped"] for k, r in results.items() if r["skipped"]}
    for k, sk in (list(skipped.items())[:1] if _same(skipped.values()) else skipped.items()):
        who = "every plan" if len(skipped) == len(results) > 1 and _same(skipped.values()) else k
        say(f"{who}: skipped {sum(sk.values()):,} bad rows ("
            + ", ".join(f"{why} {n:,}" for why, n in sk.items()) + ")")
    dropped = {k: r.get("dropped_samples") for k, r in results.items() if r.get("dropped_samples")}
    for k, n in (list(dropped.items())[:1] if _same(dropped.values()) else dropped.items()):
        who = "every plan" if len(dropped) == len(results) > 1 and _same(dropped.values()) else k
        say(f"{who}: the last {n:,} samples did not fill an iteration and were not evaluated")
    say(CROSSING_NOTE)


def _same(values) -> bool:
    """Whether every value is equal (True for none)."""
    vals = list(values)
    return all(v == vals[0] for v in vals[1:])


def _vs_best_other(results: dict[str, dict[str, Any]]) -> None:
    """Each plan's speed-up against the fastest of the other plans evaluated (communication time
    per iteration, the other's over its own), named: ``r["vs_best_other"]``."""
    for k, r in results.items():
        others = [(o, x["comm_time_s_per_iter"]) for o, x in results.items()
                  if o != k and x.get("comm_time_s_per_iter")]
        mine = r.get("comm_time_s_per_iter")
        if others and mine:
            name, t = min(others, key=lambda ot: ot[1])
            r["vs_best_other"] = {"plan": name, "speedup": t / mine}


def evaluate(plan_dirs: List[Path] = typer.Option(..., "--plan", help="Plan directory (repeat "
                                                  "to compare several)."),
             log: List[Path] = typer.Option(..., "--log", help="Log files to replay."),
             batch_size: Optional[int] = typer.Option(None, help="Samples per GPU per iteration "
                                                      "(B). Default: the plan's (a different "
                                                      "value is used with a warning)."),
             dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup",
                                                  help="In-batch de-duplication of IDs. "
                                                       "Default: the plan's."),
             profile: Optional[str] = typer.Option(None, callback=choice(PROFILES, "--profile"),
                                                   help=PROFILE_HELP + " Default: the plan's."),
             ids: Optional[str] = typer.Option(None, "--ids", callback=ids_option,
                                               help=IDS_HELP + " Default: the plan's."),
             skip_bad_rows: bool = typer.Option(False, help="Drop and count bad rows (IDs out "
                                                "of the plan's tables included) instead of "
                                                "stopping at the first."),
             topology: Optional[str] = typer.Option(None, help="Check the plan was made for this "
                                                    "topology (file or preset)."),
             tables: Optional[Path] = typer.Option(None, help="Check the plan's tables against "
                                                   "this table file."),
             max_iterations: Optional[int] = typer.Option(None, help="Stop after this many."),
             json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Replay logs through plans: bytes per iteration by link class, time, peak memory."""
    require_logs(log)
    if batch_size is not None and batch_size < 1:
        raise typer.BadParameter("must be >= 1 sample per GPU", param_hint="--batch-size")
    results: dict[str, dict[str, Any]] = {}
    try:
        plans = [(d, load_plan(d)) for d in plan_dirs]
        B = _common_setting("batch_size", "--batch-size", batch_size, plans, DEFAULT_BATCH_SIZE)
        P = _common_setting("profile", "--profile", profile, plans, "torchrec")
        D = _common_setting("dedup", "--dedup/--no-dedup", dedup, plans, default_dedup(P))
        for d, p in plans:
            _check_plan_against(d, p, topology, tables)
            mode = resolve_setting("ids", "--ids", ids, recorded_settings(p)["ids"], f"plan {d}",
                                   IdMode())
            r = _evaluate_one(d, p, log, B, D, mode, skip_bad_rows, max_iterations, P)
            key = recorded_settings(p)["requested"]
            results[key if key not in results else f"{key}:{d}"] = r
    except FlexShardError as e:
        fail(e)
    _vs_best_other(results)
    if json_out:
        typer.echo(json.dumps(results))
    else:
        _print_evaluation(results, plans)
