"""``flexshard-stream plan``: a plan (FlexShard, a baseline or TorchRec's own) for the tables of a
log, its modelled cost, and the refusals of plans that cannot fit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

import typer

from ..errors import ConfigError, FlexShardError
from ..formats.units import fmt_bytes, fmt_rows, fmt_seconds
from ..sources.ids import DEFAULT_HEADROOM, IdMode
from .common import (
    CROSSING_NOTE,
    DEDUP_HELP,
    DEFAULT_BATCH_SIZE,
    IDS_HELP,
    PROFILE_HELP,
    PROFILES,
    TORCHREC_REFERENCE_TABLES,
    TS_HELP,
    choice,
    command_hint,
    cost_rows,
    default_dedup,
    fail,
    ids_option,
    note,
    plan_label,
    profile_label,
    require_logs,
    say,
    text_table,
    time_column_hint,
    time_like,
    topology_name,
    torchrec_reference_ok,
    vs_best_text,
    warn,
    warn_time_columns,
    writing,
)

#: ``plan --strategy`` values (FlexShard, the baselines of placement.baselines, and TorchRec's
#: own planner, placement.torchrec_planner, with the torchrec extra).
STRATEGIES = ("flexshard", "rw", "rw-hash", "tw", "twrw", "cw", "twcw", "dp", "hugectr",
              "torchrec")
#: Baselines whose peak memory can be FlexShard's budget (planner.MemoryPolicy).
MEMORY_BASELINES = ("rw", "rw-hash", "twrw", "tw")


# ============================================================================ settings
def _record_settings(plan, *, batch_size: int, model, ids: IdMode, requested: str,
                     tables_source: str) -> None:
    """Write into ``plan.meta`` how the plan was made (its topology is in the plan itself): B,
    de-duplication, the whole cost model (any execution profile it has), the ID mode, the
    strategy asked for and where the tables came from. ``evaluate`` and ``replay --plan``
    default to these."""
    plan.meta.update({"batch_size": int(batch_size), "dedup": bool(model.dedup),
                      "model": dataclasses.asdict(model), "ids": str(ids),
                      "requested_strategy": requested, "tables_source": tables_source})


def _torchrec_issues(plan) -> list[str]:
    """What TorchRec 1.8 cannot run of ``plan`` as planned (empty: it runs it)."""
    from ..placement.profiles import execution_profile

    return execution_profile("torchrec").issues(plan)


# ============================================================================ tables, memory
def _resolve_tables(logs: List[Path], tables: Optional[Path], mode: IdMode,
                    ts_column: Optional[str] = None):
    """The tables (a file, or inferred from the log with the default headroom) and a phrase
    saying where they came from."""
    from ..plans.tables import infer_tables, load_tables

    if tables is not None:
        return load_tables(tables), str(tables)
    tabs = infer_tables([str(p) for p in logs], ids=mode, headroom=DEFAULT_HEADROOM,
                        ts_column=ts_column)
    warn_time_columns([t.name for t in tabs])
    if mode.rows is not None:
        return tabs, f"inferred from the log, {mode.rows:,} rows each (--ids {mode})"
    return tabs, (f"inferred from the log, num_rows = {DEFAULT_HEADROOM:g} x (largest ID + 1); "
                  f"flexshard-stream tables writes them to a file")


def _memory_hints(big: Sequence[str], host_memory: bool = False, factor: float = 1.0) -> str:
    """The ways out of a plan that does not fit: hashing the IDs of the ``big`` tables, the host
    memory tier (unless used), more GPUs (unless ``factor``, the excess, is beyond them), smaller
    tables."""
    ways = [time_column_hint(big)] if time_like(big) else []
    if big:
        ways.append(f"hash the IDs of {', '.join(big)} (--ids hash:ROWS, or size the tables with "
                    f"`flexshard-stream tables LOG --ids hash --out tables.toml`)")
    if not host_memory:
        ways.append("--host-memory (FlexShard: cold rows in host memory, the hottest kept in "
                    "HBM)")
    if factor < 100:
        ways.append("more GPUs (a larger --topology)")
    ways.append("smaller tables (--tables with fewer rows)")
    return "Ways out: " + ", ".join(ways[:-1]) + ", or " + ways[-1] + "."


def _refuse_impossible(tabs, topo, host_memory: bool) -> None:
    """Every row is stored somewhere: refuse tables larger than the cluster's HBM (plus its
    host memory with the host tier) before reading the log."""
    total = float(sum(t.table_bytes for t in tabs))
    hbm = float(topo.hbm_bytes.sum())
    host = float(topo.host_memory_bytes.sum()) if host_memory else 0.0
    if total <= hbm + host:
        return
    where = f"{fmt_bytes(hbm)} of HBM" + (f" and {fmt_bytes(host)} of host memory"
                                          if host_memory else "")
    big = sorted(tabs, key=lambda t: -t.table_bytes)[:3]
    raise ConfigError(f"the tables hold {fmt_bytes(total)} of rows (largest: "
                      + ", ".join(f"{t.name} {fmt_rows(t.num_rows)} rows, "
                                  f"{fmt_bytes(t.table_bytes)}" for t in big)
                      + f") but the {topo.num_gpus} GPUs of {topology_name(topo)} have {where} "
                      f"together: no plan can store them. "
                      + _memory_hints([t.name for t in big if t.num_rows > 1e8], host_memory,
                                      total / (hbm + host)))


def _refuse_over_memory(label: str, p, cost, sparse: Sequence[str] = ()) -> None:
    """Refuse a plan whose modelled peak (rows + buffers) exceeds a GPU's HBM, or whose host
    tier exceeds a node's host memory, with the numbers and the ways out."""
    topo = p.topology
    peak = cost.peak_memory_per_gpu
    over = peak - topo.hbm_bytes
    if (over > 1e-9 * topo.hbm_bytes).any():
        g = int(over.argmax())
        raise ConfigError(
            f"{label} plan refused: GPU {g} needs {fmt_bytes(peak[g])} (rows "
            f"{fmt_bytes(p.row_bytes_per_gpu[g])} + buffers {fmt_bytes(cost.buffer_bytes[g])}) "
            f"but has {fmt_bytes(topo.hbm_bytes[g])} of HBM; {int((over > 0).sum())} of "
            f"{topo.num_gpus} GPUs are over. " + _memory_hints(sparse, p.has_host_tier))
    if p.has_host_tier:
        per_node = p.host_bytes_per_gpu.reshape(topo.nodes, topo.gpus_per_node).sum(axis=1)
        extra = per_node - topo.host_memory_bytes
        if (extra > 0).any():
            n = int(extra.argmax())
            have = fmt_bytes(topo.host_memory_bytes[n])
            raise ConfigError(f"{label} plan refused: node {n} keeps {fmt_bytes(per_node[n])} "
                              f"of rows in host memory but has {have}. "
                              + _memory_hints(sparse, True))


def _warn_over_memory(label: str, p, cost) -> None:
    """A warning when our model puts a plan made elsewhere (TorchRec's) over some GPU's HBM."""
    over = cost.peak_memory_per_gpu - p.topology.hbm_bytes
    if (over > 1e-9 * p.topology.hbm_bytes).any():
        g = int(over.argmax())
        warn(f"{label} plan: our model puts GPU {g} at {fmt_bytes(cost.peak_memory_per_gpu[g])} "
             f"(rows and buffers), over its {fmt_bytes(p.topology.hbm_bytes[g])} of HBM; "
             f"TorchRec's own storage model admitted it")


def _memory_policy(tabs, topo, memory_bytes: Optional[float], baseline: Optional[str],
                   host_memory: bool, reservation: float = 0.15, dense_bytes: float = 0.0):
    """FlexShard's memory policy: ``--memory-bytes``, else memory-neutral against
    ``--memory-baseline``, else each GPU's HBM less ``--reservation`` less ``--dense-bytes``
    (planner.MemoryPolicy). With ``--host-memory`` and no ``--memory-bytes``, tables that
    row-wise could not fit in HBM get the HBM of a GPU as the budget (the rest to host memory)."""
    from ..placement.planner import MemoryPolicy

    if host_memory and memory_bytes is None:
        rw_rows = float(sum(t.table_bytes for t in tabs)) / topo.num_gpus
        hbm = float(topo.hbm_bytes.min())
        if rw_rows >= hbm:
            memory_bytes = hbm
            note(f"--host-memory: budget = the HBM of a GPU ({fmt_bytes(hbm)}); row-wise would "
                 f"store {fmt_bytes(rw_rows)} of rows per GPU")
    return MemoryPolicy(bytes_per_gpu=memory_bytes, baseline=baseline, host_memory=host_memory,
                        reservation=reservation, dense_bytes_per_gpu=dense_bytes)


def _warn_sparse_inferred(tabs, st, inferred: bool, mode: IdMode) -> list[str]:
    """Inferred raw tables of sparse IDs (far more rows than distinct IDs, over 1 GB): warned,
    named."""
    from ..plans.tables import SPARSE_FACTOR

    if not inferred or mode.hashed:
        return []
    out = []
    for t in tabs:
        ts = st.tables.get(t.feature)
        if ts is None:
            continue
        d = ts.distinct()
        if t.num_rows > SPARSE_FACTOR * max(d[2], 1.0) and t.table_bytes > 1e9:
            out.append(t.name)
            warn(f"table {t.name}: sparse IDs (~{d[0]:,.0f} distinct up to {ts.max_id:,}) give "
                 f"{fmt_rows(t.num_rows)} rows ({fmt_bytes(t.table_bytes)}); hash them with "
                 f"--ids hash:ROWS, or size tables with `flexshard-stream tables LOG --ids "
                 f"hash --out tables.toml`")
    return out


def _profile(logs: List[Path], tables, rows=None, skip_bad_rows: bool = False,
             read_batch_size: int = 65536, *, holdout_share: float = 0.0,
             min_holdout_samples: int = 1, ts_column: Optional[str] = None):
    """Sketch the log with the tables' row counts, IDs mapped by ``rows``, its last
    ``holdout_share`` of rows held out (``sources.profile``); returns the Profile and the reader
    (its ``skipped`` counts)."""
    from ..sources.logs import LogReader
    from ..sources.profile import profile_batches
    from ..stats.config import TableConfig

    reader = LogReader([str(p) for p in logs], features=[t.feature for t in tables],
                       read_batch_size=read_batch_size, skip_bad_rows=skip_bad_rows, rows=rows,
                       ts_column=ts_column)
    total = sum(info.data_rows() for info in reader.file_infos) if holdout_share else 0
    prof = profile_batches(reader, [TableConfig(t.name, t.num_rows, t.feature) for t in tables],
                           total, holdout_share, min_holdout_samples=min_holdout_samples)
    return prof, reader


# ============================================================================ the plan
#: Whole iterations a log must fill for evaluate and replay to judge a plan on it (their figures
#: are means over whole iterations of G x B samples; fewer rest on a handful of them).
MIN_JUDGED_ITERATIONS = 10


def _warn_few_iterations(samples: int, gpus: int, batch_size: int) -> None:
    """Warn, with the numbers, when ``samples`` fill fewer than :data:`MIN_JUDGED_ITERATIONS`
    iterations of ``gpus`` x ``batch_size`` samples, and say which B (or how long a log) would."""
    per = gpus * batch_size
    have = samples // per
    if have >= MIN_JUDGED_ITERATIONS:
        return
    need = MIN_JUDGED_ITERATIONS
    fits = samples // (gpus * need)
    way = (f"--batch-size {fits} or less fills {need} ({gpus * fits * need:,} samples)"
           if fits >= 1 and fits < batch_size else
           f"even B = 1 fills {samples // gpus:,}")
    warn(f"the log holds {samples:,} samples: {have:,} iteration{'' if have == 1 else 's'} of "
         f"{gpus} GPUs x B {batch_size} ({per:,} samples each); evaluate and replay judge a plan "
         f"on whole iterations, and fewer than {need} cannot judge it. {way}; or profile a log "
         f"of at least {per * need:,} samples.")


def _note_selection(strategy: str, prof, share: float, per_iteration: int) -> None:
    """Say how FlexShard's plan is chosen when it is not on a held-out part as asked."""
    if strategy != "flexshard" or not share:
        return
    if prof.holdout is None:
        note(f"the log's last {share:.0%} holds fewer than one iteration ({per_iteration:,} "
             f"samples): FlexShard's plan is chosen in sample")
    elif not prof.time_ordered:
        note("the log's ts goes back in time: its last rows, not its latest samples, are held "
             "out")


def _torchrec_reference(tabs, topo, summaries, batch_size: int, model, wanted: bool,
                        target: Optional[str]) -> dict[str, Any]:
    """``{"torchrec": TorchRec's own plan}`` for FlexShard to choose among, when TorchRec is
    installed, asked for (``--vs-torchrec``), the target is TorchRec and the tables few enough
    for TorchRec's planner (it takes minutes from 100 tables); else empty, with a note why."""
    if not wanted or not torchrec_reference_ok(target or model.profile, "compared", len(tabs)):
        return {}
    from ..placement.references import plan_torchrec
    try:
        return {"torchrec": plan_torchrec(tabs, topo, batch_size, summaries=summaries).plan}
    except ConfigError as e:
        note(f"TorchRec's own plan is not among the plans compared: {e}")
        return {}


def _make_plan(strategy: str, tabs, topo, prof, summaries, batch_size: int, memory, model,
               target: Optional[str] = None, topk: int = 1 << 20, vs_torchrec: bool = True):
    """(planner result or None, plan) for ``strategy`` (FlexShard for the ``target`` runtime:
    fitted on the profile's first part, chosen on its held-out part, TorchRec's plan among the
    whole plans; ``summaries`` are the whole profile's)."""
    if strategy == "flexshard":
        from ..placement.planner import plan_flexshard
        from ..plans.tables import summaries_by_table
        refs = _torchrec_reference(tabs, topo, summaries, batch_size, model, vs_torchrec, target)
        fit = summaries_by_table(tabs, prof.fit.summary(k=topk))
        hold = (summaries_by_table(tabs, prof.holdout.summary(k=topk))
                if prof.holdout is not None else None)
        halves = (None if prof.holdout_halves is None else
                  [summaries_by_table(tabs, h.summary(k=topk)) for h in prof.holdout_halves])
        result = plan_flexshard(tabs, topo, fit, batch_size, memory, model, target=target,
                                holdout=hold, references=refs,
                                refit=summaries if hold is not None else None,
                                holdout_halves=halves)
        return result, result.plan
    if strategy == "torchrec":
        from ..placement.references import plan_torchrec
        return None, plan_torchrec(tabs, topo, batch_size, summaries=summaries, model=model).plan
    from ..placement.baselines import build_baseline
    from ..placement.workload import Workload

    work = Workload.from_stats(tabs, topo, summaries, batch_size, model=model)
    return None, build_baseline(strategy, tabs, topo, summaries=summaries, workload=work)


# ============================================================================ output
def _table_shardings(p) -> list[dict[str, Any]]:
    """Per table: sharding, GPUs holding shards, shard rows per GPU (min, max over those GPUs;
    cold rows and rows placed by load), replicated rows (on every GPU, on every node), placed
    rows, table bytes."""
    import numpy as np

    from ..bridge.sharding import sharding_label
    from ..plans.plan import Plan

    topo = p.topology
    out = []
    for name, tp in p.tables.items():
        tiers = tp.tier_sizes()
        if tp.replicated:
            gpus, lo, hi = topo.num_gpus, tp.table.num_rows, tp.table.num_rows
        else:
            cold = tp.rows_per_gpu(topo) - Plan.non_cold_rows_per_gpu(tp, topo)
            cold = cold + np.bincount(tp.placed_gpus, minlength=topo.num_gpus)
            held = cold[tp.cold.gpus] if tp.cold.gpus.size else cold
            gpus, lo, hi = int(tp.cold.gpus.size), int(held.min()), int(held.max())
        out.append({"table": name, "sharding": sharding_label(tp, topo), "gpus": gpus,
                    "shard_rows_per_gpu": [lo, hi], "global_rows": tiers["global"],
                    "node_rows": tiers["node"], "placed_rows": tiers["placed"],
                    "table_bytes": tp.table.table_bytes})
    return out


def _per_gpu(p, cost) -> dict[str, list[float]]:
    """Per GPU: modelled peak memory, row bytes in HBM, host-memory row bytes, bytes sent and
    received per iteration (every component, both link classes)."""
    import numpy as np

    sent = sum(np.asarray(v)[:, 1:].sum(axis=1) for v in cost.send.values())
    recv = sum(np.asarray(v)[:, 1:].sum(axis=1) for v in cost.recv.values())
    return {"memory_bytes": cost.peak_memory_per_gpu.tolist(),
            "row_bytes": p.row_bytes_per_gpu.tolist(),
            "host_bytes": p.host_bytes_per_gpu.tolist(),
            "sent_bytes": np.asarray(sent, float).tolist(),
            "received_bytes": np.asarray(recv, float).tolist()}


def _replicated(d: Mapping[str, Any]) -> str:
    g, n = d["global_rows"], d["node_rows"]
    if d["sharding"] == "dp":
        return "all (dp)"
    parts = ([f"{g:,} all"] if g else []) + ([f"{n:,}/node"] if n else [])
    return " + ".join(parts) or "-"


def _print_tables_of_plan(doc: Mapping[str, Any]) -> None:
    rows = []
    for d in doc["tables"]:
        lo, hi = d["shard_rows_per_gpu"]
        rows.append([d["table"], d["sharding"], d["gpus"],
                     fmt_rows(lo) if lo == hi else f"{fmt_rows(lo)}..{fmt_rows(hi)}",
                     _replicated(d), fmt_bytes(d["table_bytes"])])
    typer.echo(text_table(["table", "sharding", "GPUs", "shard rows/GPU", "replicated rows",
                           "size"], rows, left=2))


def _print_gpus_of_plan(doc: Mapping[str, Any], gpus_per_node: int) -> None:
    """Per GPU (up to 32 GPUs; per node above): memory, rows, host rows, bytes sent and
    received per iteration."""
    g = doc["per_gpu"]
    G = len(g["memory_bytes"])
    host = any(g["host_bytes"])
    cols = ["memory_bytes", "row_bytes"] + (["host_bytes"] if host else []) + \
        ["sent_bytes", "received_bytes"]
    names = ["memory", "rows"] + (["host rows"] if host else []) + ["sent", "received"]
    if G <= 32:
        rows = [[i, i // gpus_per_node] + [fmt_bytes(g[c][i]) for c in cols] for i in range(G)]
        typer.echo(text_table(["GPU", "node"] + names, rows, left=0))
        return
    rows = []
    for n in range(G // gpus_per_node):
        sl = slice(n * gpus_per_node, (n + 1) * gpus_per_node)
        rows.append([n, f"{sl.start}-{sl.stop - 1}"] + [fmt_bytes(max(g[c][sl])) for c in cols])
    typer.echo(text_table(["node", "GPUs"] + [f"max {x}" for x in names], rows, left=0))
    say("(per GPU: --json, key per_gpu)")


def _print_plan(doc: Mapping[str, Any], p, result) -> None:
    """Human summary: what was written and how it was made, per table, per GPU, and the
    modelled figures per iteration (against the baseline for FlexShard)."""
    topo = p.topology
    s = doc["settings"]
    hbm = fmt_bytes(float(topo.hbm_bytes.max()))
    say(f"{doc['label']} plan for {len(p.tables)} table(s) on {doc['topology']} "
        f"({topo.num_gpus} GPUs, {hbm} HBM each) written to {doc['out']}")
    say(f"made for B = {s['batch_size']} samples per GPU, de-duplication "
        f"{'on' if s['dedup'] else 'off'}, IDs {s['ids']}; tables {s['tables_source']}; "
        f"{profile_label(doc['profile'])} figures.")
    for issue in doc["torchrec_issues"]:
        warn(f"TorchRec 1.8 cannot run this as planned: {issue}")
    if doc.get("equals"):
        say(f"FlexShard found no plan better than {doc['equals']} within the budget: the plan "
            f"written is {doc['equals']}'s placement (labelled {doc['label']}).")
    say()
    _print_tables_of_plan(doc)
    say()
    say("per GPU, modelled per iteration (analytic):")
    _print_gpus_of_plan(doc, topo.gpus_per_node)
    say()
    entries = [(doc["label"], doc["cost"])]
    if result is not None:
        entries = [(result.baseline.strategy, result.baseline_cost.to_json())] + entries
        sel = doc["estimate"].get("selection") or {}
        where = ("on the log's held-out last rows (the plan was fitted on the rest)"
                 if sel.get("holdout") else "in sample")
        halves = sel.get("halves") or {}
        if sel.get("rule") == "lead on both halves":
            where += (f"; chosen by its lead over {halves['incumbent']} on both halves of them"
                      f" (x{halves['worse_half_ratio']:.3f} on the worse)"
                      if halves["worse_half_ratio"] < 1 else
                      f"; no candidate led {halves['incumbent']} on both halves of them")
        say(f"modelled per iteration (analytic, {where}) against {result.baseline.strategy}, "
            f"at a budget of {fmt_bytes(result.budget_bytes)} per GPU "
            f"({doc['estimate']['budget']}):")
    else:
        say("modelled per iteration (analytic):")
    typer.echo(cost_rows(entries))
    if result is not None:
        _print_gains(doc, p, result)
    if "torchrec_estimate" in doc:
        _print_torchrec_estimate(doc["torchrec_estimate"], doc["cost"], doc["profile"])
    say(CROSSING_NOTE)
    say()
    command_hint("Next (B, de-duplication and the ID mode default to this plan's):",
                 f"flexshard-stream evaluate --plan {doc['out']} --log OTHER_LOG")


def _print_gains(doc: Mapping[str, Any], p, result) -> None:
    """FlexShard's speed-ups (over the memory baseline, the best baseline, TorchRec's plan),
    where they were measured, and its peak memory against row-wise's."""
    c, b = result.cost, result.baseline_cost
    est = doc["estimate"]
    room = est["memory_room"]
    freed, extra = room.get("buffers_freed", 0), room.get("extra_rows", 0)
    vs_tr = est.get("speedup_vs_torchrec")
    say(f"speed-up {b.iteration_time_s / max(c.iteration_time_s, 1e-30):.2f}x over "
        f"{result.baseline.strategy}, {vs_best_text(est)}"
        + (f", {vs_tr:.2f}x over TorchRec's own plan" if vs_tr else "")
        + f" (chosen from {p.meta.get('chosen_from', 'flexshard')}).")
    peak, rw_peak = room.get("plan_peak", 0.0), room.get("baseline_peak", 0.0)
    say(f"peak memory {fmt_bytes(peak)} per GPU, {peak / max(rw_peak, 1e-30):.0%} of "
        f"{result.baseline.strategy}'s {fmt_bytes(rw_peak)}; at the peak GPU: "
        f"{fmt_bytes(freed)} of buffers freed, {fmt_bytes(extra)} more rows.")


def _print_torchrec_estimate(e: Mapping[str, Any], cost: Mapping[str, Any], profile: str
                             ) -> None:
    """TorchRec's own estimate of its plan beside ours."""
    c = e["critical_rank_ms"]
    compute = c["fwd_compute"] + c["bwd_compute"] + c["prefetch_compute"]
    comms = c["fwd_comms"] + c["bwd_comms"]
    say(f"TorchRec {e['version']}'s own estimate (planned in {fmt_seconds(e['planning_seconds'])}"
        f"): {e['perf_rating_ms']:.4g} ms per iteration on its slowest rank "
        f"({e['critical_rank']}): compute {compute:.4g} ms + comms {comms:.4g} ms, uniform "
        f"access, no de-duplication, index bytes left out; ours ({profile_label(profile)}): "
        f"communication {1e3 * cost['comm_time_s_per_iter']:.4g} ms.")
    for line in e["notes"]:
        note(line)


def plan(log: List[Path] = typer.Option(..., "--log", help="Log files to profile (parquet/CSV)."),
         topology: str = typer.Option(..., help="Topology TOML file, preset name (2x8, 16x8, "
                                      "16x8_skewed) or NxM (N nodes of M DGX-style GPUs)."),
         strategy: str = typer.Option("flexshard", callback=choice(STRATEGIES, "--strategy"),
                                      help=" | ".join(STRATEGIES) + " (any case)."),
         out: Path = typer.Option(..., help="Plan directory to write."),
         tables: Optional[Path] = typer.Option(None, help="Tables file (TOML; `flexshard-stream "
                                               "tables` writes one). Default: inferred from the "
                                               f"log, rows = {DEFAULT_HEADROOM:g} x (largest ID "
                                               "+ 1), dim 128."),
         ids: Optional[str] = typer.Option(None, "--ids", callback=ids_option, help=IDS_HELP),
         batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, help="Samples per GPU per iteration "
                                        "(B), recorded in the plan; hugectr counts profiled "
                                        "iterations with it."),
         dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup", help=DEDUP_HELP),
         profile: str = typer.Option("torchrec", callback=choice(PROFILES, "--profile"),
                                     help=PROFILE_HELP + " The planner prices its candidates "
                                          "under it (recorded)."),
         target: Optional[str] = typer.Option(None, callback=choice(PROFILES, "--target"),
                                              help="Runtime the flexshard plan must run on: "
                                                   "torchrec | ideal (default: the profile)."),
         memory_bytes: Optional[float] = typer.Option(None, help="Per-GPU memory budget in bytes "
                                                      "(flexshard; default: each GPU's HBM less "
                                                      "--reservation less --dense-bytes)."),
         memory_baseline: Optional[str] = typer.Option(
             None, callback=choice(MEMORY_BASELINES, "--memory-baseline"),
             help="Memory-neutral (flexshard): no more peak memory per GPU than this baseline, "
                  + " | ".join(MEMORY_BASELINES) + " (the paper's 'no additional memory')."),
         reservation: float = typer.Option(0.15, help="Share of each GPU's HBM kept free "
                                           "(TorchRec's planner reserves 15%)."),
         dense_bytes: float = typer.Option(0.0, help="Bytes per GPU of the dense model and its "
                                           "optimizer state, kept out of the budget."),
         holdout: float = typer.Option(0.25, help="Share of the log, its last rows, held out: "
                                       "FlexShard's candidates are fitted on the rest and the "
                                       "fastest on it chosen (0: choose in sample)."),
         vs_torchrec: bool = typer.Option(True, help="Compare TorchRec's own plan too (when "
                                          "TorchRec is installed and at most "
                                          f"{TORCHREC_REFERENCE_TABLES} tables)."),
         topk: int = typer.Option(1 << 20, help="Top rows per table the planner may replicate."),
         host_memory: bool = typer.Option(False, "--host-memory", help="RecShard tier (flexshard):"
                                          " cold rows that do not fit the memory budget (then HBM "
                                          "bytes per GPU) go to host memory, the hottest kept in "
                                          "HBM; host lookups at UVM bandwidth."),
         skip_bad_rows: bool = typer.Option(False, help="Drop and count bad rows (IDs out of "
                                            "the tables' range included) instead of stopping."),
         ts: Optional[str] = typer.Option(None, "--ts", metavar="COLUMN", help=TS_HELP),
         json_out: bool = typer.Option(False, "--json", help="Print the plan summary as JSON.")):
    """Write a plan (FlexShard or a baseline) for the tables of a log."""
    require_logs(log)
    from ..placement.cost import CostModel, evaluate_analytic
    from ..plans.tables import row_map, summaries_by_table
    from ..plans.topology import Topology

    mode = ids or IdMode()
    model = CostModel(dedup=default_dedup(profile) if dedup is None else dedup, profile=profile)
    try:
        topo = Topology.load(topology)
        tabs, source = _resolve_tables(log, tables, mode, ts)
        _refuse_impossible(tabs, topo, host_memory and strategy == "flexshard")
        prof, reader = _profile(log, tabs, row_map(tabs, mode), skip_bad_rows,
                                holdout_share=holdout if strategy == "flexshard" else 0.0,
                                min_holdout_samples=topo.num_gpus * batch_size, ts_column=ts)
        st = prof.whole
        _warn_few_iterations(prof.samples, topo.num_gpus, batch_size)
        sparse = _warn_sparse_inferred(tabs, st, tables is None, mode)
        summaries = summaries_by_table(tabs, st.summary(k=topk))
        memory = _memory_policy(tabs, topo, memory_bytes, memory_baseline, host_memory,
                                reservation, dense_bytes)
        _note_selection(strategy, prof, holdout, topo.num_gpus * batch_size)
        result, p = _make_plan(strategy, tabs, topo, prof, summaries, batch_size, memory, model,
                               target, topk, vs_torchrec)
        cost = result.cost if result is not None else evaluate_analytic(p, summaries,
                                                                          batch_size, model)
        label = plan_label(strategy, p)
        if strategy == "torchrec":   # TorchRec checked its own plan against its memory model
            _warn_over_memory(label, p, cost)
        else:
            _refuse_over_memory(label, p, cost, sparse)
        _record_settings(p, batch_size=batch_size, model=model, ids=mode, requested=strategy,
                         tables_source=source)
        with writing(out):
            p.save(out)
    except FlexShardError as e:
        fail(e)
    doc = _plan_doc(p, result, cost, out, label, strategy, reader)
    if json_out:
        typer.echo(json.dumps(doc))
    else:
        _print_plan(doc, p, result)


def _plan_doc(p, result, cost, out: Path, label: str, requested: str, reader
              ) -> dict[str, Any]:
    """``plan --json``: what was written, how it was made, per table, per GPU, the cost."""
    mem = p.row_bytes_per_gpu
    doc = {"strategy": requested, "label": label,
           "equals": p.strategy if p.strategy != requested else None,
           "out": str(out), "topology": topology_name(p.topology),
           "settings": {k: p.meta[k] for k in ("batch_size", "dedup", "ids", "model",
                                               "tables_source")},
           "tiers": p.tier_sizes(), "sharding": p.sharding_kinds,
           "profile": p.meta["model"].get("profile"),
           "torchrec_issues": _torchrec_issues(p),
           "row_bytes_per_gpu": {"max": float(mem.max()), "min": float(mem.min())},
           "tables": _table_shardings(p), "per_gpu": _per_gpu(p, cost), "cost": cost.to_json(),
           "skipped": {k: v for k, v in reader.skipped.items() if v}}
    if p.has_host_tier:
        hb = p.host_bytes_per_gpu
        doc["host_bytes_per_gpu"] = {"max": float(hb.max()), "min": float(hb.min())}
    if result is not None:
        doc["estimate"] = result.summary()
        doc["estimate"]["budget"] = p.meta.get("memory_policy", {}).get("budget", "")
    if "torchrec" in p.meta and "estimate" in p.meta["torchrec"]:
        doc["torchrec_estimate"] = _torchrec_estimate(p.meta["torchrec"])
    return doc


def _torchrec_estimate(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """``plan --strategy torchrec``: TorchRec's own estimate of its plan (milliseconds, its slowest
    rank) and how the planner was run."""
    e = recorded["estimate"]
    return {"perf_rating_ms": e["perf_rating_ms"], "critical_rank": e["critical_rank"],
            "critical_rank_ms": e["critical_rank_ms"], "version": recorded["version"],
            "planning_seconds": recorded["planning_seconds"],
            "pooling_factors": recorded["pooling_factors"], "notes": recorded["notes"]}
