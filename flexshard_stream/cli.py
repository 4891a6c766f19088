"""The ``flexshard-stream`` command line (typer).

Commands: ``stats`` (sketch parquet/CSV logs and print per-table statistics, ``--json`` for
machines), ``tables`` (a tables file sized for a log), ``plan``, ``evaluate``, ``replay`` (windows
of a log through rw, twrw, static FlexShard and the re-sharder; docs/REPLAY.md), ``report`` (HTML
and PNGs of a replay directory), ``demo`` (replay the embedded default trace and write the
report), ``merge`` (statistics snapshots of many hosts into one; docs/SCALING.md), ``sidecar``
(statistics and re-sharding fed by a shared-memory ring; docs/SIDECAR.md) and ``export`` (a plan
for TorchRec; docs/TORCHREC_EXPORT.md). docs/CLI.md walks through them.

Start-up: this module imports only typer and two standard-library-only modules (units, ID modes)
at the top; every command imports what it needs (numpy, Numba, polars, pyarrow, matplotlib, Ray)
inside, so ``--help`` and argument errors answer at once. Output is plain text that fits 80
columns; figures carry units chosen by magnitude (:mod:`flexshard_stream.formats.units`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

import typer

from .errors import ConfigError, FlexShardError
from .formats.units import fmt_bytes, fmt_count, fmt_rows, fmt_seconds
from .sources.ids import DEFAULT_HEADROOM, IdMode

#: Plain (click) help and error formatting: rich's help renderer costs more start-up time than
#: everything else ``--help`` loads, and click's formatter already wraps at 80 columns.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="Live statistics-driven embedding-table placement: sketch ID streams, "
                       "plan, evaluate.")

#: ``plan --strategy`` values (FlexShard, the baselines of placement.baselines, and TorchRec's
#: own planner, placement.torchrec_planner, with the torchrec extra).
STRATEGIES = ("flexshard", "rw", "rw-hash", "tw", "twrw", "cw", "twcw", "dp", "hugectr",
              "torchrec")
#: ``--profile`` values: the cost model's execution profiles (placement.profiles).
PROFILES = ("torchrec", "ideal")
#: Baselines whose peak memory can be FlexShard's budget (planner.MemoryPolicy).
MEMORY_BASELINES = ("rw", "rw-hash", "twrw", "tw")
#: ``replay --engine`` and ``--evaluation`` values (online.replay.ENGINES / EVALUATIONS).
ENGINES = ("local", "process", "ray")
EVALUATIONS = ("trace", "analytic")
#: Defaults when neither the command line nor a plan gives them.
DEFAULT_BATCH_SIZE = 512
_WIDTH = 80
_PROFILE_HELP = ("Execution profile of the cost model: torchrec (what TorchRec 1.8 sends for the "
                 "plan) or ideal (the project's own model: what a custom runtime could reach; "
                 "figures labelled 'idealized').")
_IDS_HELP = ("How log IDs become table rows: raw (an ID is its row), hash (row = ID mod the "
             "table's num_rows) or hash:ROWS (ID mod ROWS; inferred tables get ROWS rows). "
             "hash is the modulo TorchRec users apply to raw sparse or 64-bit hashed IDs.")


# ============================================================================ choices, errors
def _choice(valid: Sequence[str], flag: str):
    """A typer callback accepting ``valid`` values in any case (returned lower-case) and naming
    every valid value otherwise."""

    def check(value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        v = value.strip().lower()
        if v not in valid:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(valid)} (any case)",
                                     param_hint=flag)
        return v

    return check


def _ids_option(value: Optional[str]) -> Optional[IdMode]:
    """``--ids`` parsed (None when not given, so a plan's recorded mode can apply)."""
    if value is None:
        return None
    try:
        return IdMode.parse(value)
    except FlexShardError as e:
        raise typer.BadParameter(str(e), param_hint="--ids") from None


#: The library's spelling of a way out -> the flag that does it on the command line.
_FLAG_SPELLING = (("skip_bad_rows=True", "--skip-bad-rows"), ("ids='hash:ROWS'", "--ids hash:ROWS"),
                  ("ids='hash'", "--ids hash"), ("null_as_empty=True", "null_as_empty (Python)"))
#: Ways out only the Python API has (no command has a flag for them): left out of messages.
_PYTHON_ONLY = ("ts=False", "features={")


def _drop_way_out(msg: str, lib: str) -> str:
    """``msg`` without its "pass <lib> ..." / "declare it with <lib> ..." clause."""
    return re.sub(rf";? ?(pass|declare it with) {re.escape(lib)}[^;]*", "", msg)


def _cli_message(e: BaseException | str, flags: Optional[Sequence[str]] = None) -> str:
    """``e`` as one line for a command-line user: library keywords become the flags that do the
    same; with ``flags`` (the command's own), a way out through a flag it lacks is left out."""
    msg = " ".join(str(e).split())
    for lib, flag in _FLAG_SPELLING:
        lacking = flags is not None and flag.startswith("--") and flag.split()[0] not in flags
        msg = _drop_way_out(msg, lib) if lacking else msg.replace(lib, flag)
    for lib in _PYTHON_ONLY:
        msg = _drop_way_out(msg, lib)
    return msg


def _fail(e: BaseException | str, flags: Optional[Sequence[str]] = None) -> None:
    """One clean error line on stderr, exit status 2 (no traceback); library keywords in the
    message become the flags that do the same here (only ``flags``, when given)."""
    typer.echo(f"error: {_cli_message(e, flags)}", err=True)
    raise typer.Exit(2)


def _warn(msg: str) -> None:
    """A warning on stderr, wrapped at 80 columns."""
    typer.echo(_wrap(f"warning: {msg}", "  "), err=True)


def _note(msg: str) -> None:
    """A note on stderr (what a default turned into), wrapped at 80 columns."""
    typer.echo(_wrap(f"note: {msg}", "  "), err=True)


# ============================================================================ plain text output
def _text_table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: Any = 1) -> str:
    """Columns of text, two spaces apart, widths from the content (nothing is truncated or
    wrapped): left-aligned are the first ``left`` columns (an int) or the columns in ``left``
    (a set of indices), the rest right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lefts = set(range(left)) if isinstance(left, int) else set(left)
    lines = []
    for r in cells:
        parts = [c.ljust(w) if i in lefts else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _wrap(text: str, indent: str = "") -> str:
    """``text`` wrapped at 80 columns."""
    import textwrap
    return textwrap.fill(" ".join(text.split()), _WIDTH, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def _say(text: str = "") -> None:
    """Print a paragraph wrapped at 80 columns (an empty line for "")."""
    typer.echo(_wrap(text) if text else "")


def _crossing(b: Mapping[str, Any]) -> tuple[float, float, float]:
    """Bytes crossing between nodes per iteration from a ``bytes_per_iter`` dict: (all, the
    all-to-all part, the replica-sync part)."""
    a2a = float(b.get("inter_node") or 0.0)
    sync = float(b.get("sync_inter_node") or 0.0)
    return a2a + sync, a2a, sync


def _cost_rows(entries: Sequence[tuple[str, Mapping[str, Any]]], vs_rw: bool = False) -> str:
    """The per-iteration figures of several results (``to_json()`` of a Cost, or a replay
    strategy's totals): all-to-all, bytes crossing nodes with the replica sync's part of them,
    comm time, peak memory, and the speed-up over row-wise when ``vs_rw``."""
    rows = []
    for label, r in entries:
        b = r.get("bytes_per_iter") or {}
        cross, _, sync = _crossing(b)
        row = [label, fmt_bytes(b.get("total")), fmt_bytes(cross), fmt_bytes(sync),
               fmt_seconds(r.get("comm_time_s_per_iter")), fmt_bytes(r.get("peak_memory_bytes"))]
        if vs_rw:
            sp = r.get("speedup_vs_rw")
            row.append("-" if sp is None else f"{sp:.2f}x")
        rows.append(row)
    return _text_table(["", "all-to-all", "crossing nodes", "incl. sync", "comm time",
                        "peak/GPU"] + (["vs rw"] if vs_rw else []), rows)


def _vs_best_text(r: Mapping[str, Any]) -> str:
    """``"<x>x over <name>, the best baseline"`` from a summary with ``speedup_vs_best_baseline``
    and ``best_baseline``."""
    sp, name = r.get("speedup_vs_best_baseline"), r.get("best_baseline")
    return "no baseline fits" if sp is None or not name else \
        f"{sp:.2f}x over {name}, the best baseline that fits"


_CROSSING_NOTE = ("crossing nodes: every byte sent between nodes per iteration, the all-to-all's "
                  "and the replica sync's (gradients of replicated rows; incl. sync gives that "
                  "part); comm time: the slowest GPU's; peak/GPU: rows + buffers.")


# ============================================================================ stats
def _default_trace() -> Path:
    """The embedded default trace (``data/``, installed as ``flexshard_stream.data``)."""
    from .data import DEFAULT_TRACE
    if DEFAULT_TRACE.exists():
        return DEFAULT_TRACE
    raise FlexShardError("the embedded default trace is missing; regenerate it with `python -m "
                         "flexshard_stream.sources.synth default data/default_trace.parquet`")


def _stderr_console():
    from rich.console import Console
    return Console(stderr=True)


def _sketch_logs(paths: List[Path], features: Optional[List[str]], read_batch_size: int,
                 show_progress: bool, rows: Any = None, skip_bad_rows: bool = False):
    """Sketch ``paths`` with every feature's table found on first sight; ``rows`` maps IDs to
    rows first (hash modes). Returns the StreamStats, the seconds taken and the bad rows skipped
    per reason (all zero unless ``skip_bad_rows``)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .sources.logs import LogReader
    from .stats.stream import StreamStats

    stats = StreamStats(auto_tables=True)
    t0 = time.perf_counter()
    reader = LogReader([str(p) for p in paths], features=features,
                       read_batch_size=read_batch_size, skip_bad_rows=skip_bad_rows,
                       rows=rows)
    if not features:
        _warn_time_columns(reader.schema.keys)
    with Progress(TextColumn("[bold]sketching[/]"), BarColumn(), TextColumn("{task.fields[ids]}"),
                  TimeElapsedColumn(), disable=not show_progress, transient=True,
                  console=_stderr_console()) as prog:
        task = prog.add_task("sketch", total=None, ids="0 IDs")
        for batch in reader:
            stats.update(batch)
            prog.update(task, ids=f"{stats.ids:,} IDs")
    return stats, time.perf_counter() - t0, reader.skipped


def _stats_rows(logs: List[Path], features: Optional[List[str]], mode: Optional[IdMode]):
    """The RowMap of ``stats --ids``: None for raw IDs; every feature ``ROWS`` rows with
    ``hash:ROWS`` (stats has no tables file, so plain ``hash`` has nothing to hash into)."""
    if mode is None or not mode.hashed:
        return None
    if mode.rows is None:
        raise ConfigError("stats has no tables to hash into: give the rows, --ids hash:ROWS")
    from .sources.ids import RowMap
    from .sources.logs import inspect_log
    schema = inspect_log([str(p) for p in logs], features)
    return RowMap({f: mode.rows for f in schema.keys}, mode)


def _print_stats(stats, topk: int, seconds: float) -> None:
    """Per table: lookups, distinct rows, mode, IDs per sample, the top-k share; then the
    top-k rows of each table (all k of them)."""
    rate = stats.ids / max(seconds, 1e-9) / 1e6
    _say(f"{stats.ids:,} IDs in {stats.samples:,} samples, {seconds:.2f} s ({rate:.1f} M IDs/s "
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
    _say()
    typer.echo(_text_table(["table", "lookups", "distinct", "mode", "IDs/sample p50/p90/p99",
                            f"top-{topk} share"], rows, left={0, 3}))
    if topk:
        for name, (ids, est, exact) in tops.items():
            _say()
            _say(f"top {len(ids)} rows of {name} (ID: lookups{'' if exact else ', estimates'}):")
            typer.echo(_packed([f"{int(i)}: {int(e):,}" for i, e in zip(ids, est)]))


def _packed(items: Sequence[str], indent: str = "  ") -> str:
    """Items in aligned columns, as many per line as fit in 80 columns."""
    if not items:
        return indent + "(none)"
    w = max(len(x) for x in items) + 3
    per = max(1, (_WIDTH - len(indent)) // w)
    lines = [indent + "".join(x.ljust(w) for x in items[i:i + per]).rstrip()
             for i in range(0, len(items), per)]
    return "\n".join(lines)


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
          ids: Optional[str] = typer.Option(None, "--ids", callback=_ids_option,
                                            help=_IDS_HELP + " stats takes hash:ROWS."),
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
        rows = _stats_rows(logs, feats, ids)
        st, secs, skipped = _sketch_logs(logs, feats, read_batch_size, show_progress=not json_out,
                                         rows=rows, skip_bad_rows=skip_bad_rows)
        if save is not None:
            st.save(save)
    except FlexShardError as e:
        _fail(e)
    if any(skipped.values()):
        _warn(f"skipped {sum(skipped.values()):,} bad rows ("
              + ", ".join(f"{k} {v:,}" for k, v in skipped.items() if v) + ")")
    if json_out:
        d = st.to_json(topk)
        typer.echo(json.dumps(d))
    else:
        _print_stats(st, topk, secs)


# ============================================================================ tables
def _table_kinds(logs: List[Path], features: Optional[List[str]]) -> dict[str, str]:
    from .sources.logs import inspect_log
    return dict(inspect_log([str(p) for p in logs], features).features)


def _print_sizing(sizing, mode: IdMode, headroom: float, samples: int, logs: List[Path]) -> None:
    """The sized tables, what each size rests on, and notes on sparse IDs."""
    t0 = sizing[0].table
    how = ("ROWS rows each" if mode.rows is not None else
           f"{headroom:g} x distinct IDs" if mode.hashed else f"{headroom:g} x (largest ID + 1)")
    _say(f"tables for {', '.join(p.name for p in logs)} ({samples:,} samples): IDs {mode}, "
         f"num_rows = {how}; dim {t0.dim} {t0.dtype}")
    rows = []
    for s in sizing:
        t = s.table
        rows.append([t.name, t.kind, f"{s.lookups:,}", f"~{s.distinct[0]:,.0f}",
                     fmt_count(s.max_id), fmt_count(t.num_rows), fmt_bytes(t.table_bytes)])
    _say()
    typer.echo(_text_table(["table", "kind", "lookups", "distinct", "largest ID", "num_rows",
                            "size"], rows))
    if mode.hashed:
        _print_collisions(sizing)
    for s in sizing:
        if s.sparse and not mode.hashed:
            hashed = math.ceil(headroom * s.distinct[2])
            _say(f"- {s.table.name}: sparse IDs (~{s.distinct[0]:,.0f} distinct up to "
                 f"{s.max_id:,}): a raw table holds {fmt_rows(s.table.num_rows)} rows "
                 f"({fmt_bytes(s.table.table_bytes)}); --ids hash would need about "
                 f"{hashed:,}.")


def _print_collisions(sizing) -> None:
    """Hash modes: the tables whose IDs collide noticeably (ID mod num_rows), or one line
    saying none does."""
    shares = [(s.table.name, s.collision_share, s.table.num_rows) for s in sizing
              if s.collision_share is not None]
    big = [x for x in shares if x[1] >= 0.005]
    for name, share, rows in big:
        _say(f"- {name}: about {share:.0%} of its distinct IDs share a row with another ID "
             f"(ID mod {rows:,}); a larger --headroom lowers it.")
    if shares and not big:
        _say("- fewer than 0.5% of any table's distinct IDs share a row (ID mod num_rows).")


def _command_hint(text: str, command: str) -> None:
    """A sentence, then a command indented on lines of its own, continued with a backslash
    beyond 80 columns (it still pastes into a shell as one command)."""
    _say(text)
    lines, line = [], " "
    for word in command.split():
        if len(line) + 1 + len(word) > _WIDTH - 2 and line.strip():
            lines.append(line)
            line = "   "
        line += " " + word
    typer.echo(" \\\n".join(lines + [line]))


@app.command("tables")
def tables_cmd(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs to size the "
                                                 "tables for."),
               out: Optional[Path] = typer.Option(None, "--out", help="Tables file (TOML) to "
                                                  "write; edit its dims and dtypes, then pass it "
                                                  "as --tables."),
               ids: Optional[str] = typer.Option(None, "--ids", callback=_ids_option,
                                                 help=_IDS_HELP + " With hash, num_rows comes "
                                                 "from the distinct IDs."),
               headroom: float = typer.Option(DEFAULT_HEADROOM, help="num_rows = headroom x "
                                              "what the log needs (largest ID + 1, or the "
                                              "distinct IDs when hashed): room for the IDs the "
                                              "next log adds."),
               dim: int = typer.Option(128, help="D, elements per row, of every table."),
               dtype: str = typer.Option("fp32", help="Element type: fp32, fp16 or bf16."),
               optimizer_state_bytes: int = typer.Option(0, help="s, optimizer state bytes per "
                                                         "row."),
               features: Optional[str] = typer.Option(None, help="Comma-separated feature "
                                                      "columns (default: every ID column)."),
               json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Size one table per log feature (rows, kind, dim) and write a tables file."""
    from .plans.tables import save_tables, size_tables

    feats = [f.strip() for f in features.split(",") if f.strip()] if features else None
    mode = ids or IdMode()
    try:
        kinds = _table_kinds(logs, feats)
        if feats is None:
            _warn_time_columns(list(kinds))
        st, _, _ = _sketch_logs(logs, list(kinds), 65536, show_progress=not json_out)
        sizing = size_tables(st.tables, kinds, headroom=headroom, ids=mode, dim=dim,
                             dtype=dtype.lower(), optimizer_state_bytes=optimizer_state_bytes)
        if out is not None:
            save_tables([s.table for s in sizing], out, notes={s.table.name: s.note()
                                                               for s in sizing},
                        header=[f"Sized by flexshard-stream tables from "
                                f"{', '.join(str(p) for p in logs)} ({st.samples:,} samples); "
                                f"use with --ids {mode}."])
    except FlexShardError as e:
        _fail(e, ("--ids",))
    if json_out:
        typer.echo(json.dumps({"out": None if out is None else str(out), "ids": str(mode),
                               "headroom": headroom, "tables": [
                                   {**s.table.to_dict(), "lookups": s.lookups,
                                    "distinct": list(s.distinct), "max_id": s.max_id,
                                    "basis": s.basis, "sparse": s.sparse,
                                    "collision_share": s.collision_share} for s in sizing]}))
        return
    _print_sizing(sizing, mode, headroom, st.samples, logs)
    _say()
    if out is None:
        _say("Nothing written: pass --out tables.toml to write these tables.")
    else:
        ids_flag = "" if not mode.hashed else f" --ids {mode}"
        _command_hint(f"written to {out}. Next:", f"flexshard-stream plan --log LOG --tables "
                      f"{out}{ids_flag} --topology 2x8 --out plan/")


# ============================================================================ plan settings
def _record_settings(plan, *, batch_size: int, model, ids: IdMode, requested: str,
                     tables_source: str) -> None:
    """Write into ``plan.meta`` how the plan was made (its topology is in the plan itself): B,
    de-duplication, the whole cost model (any execution profile it has), the ID mode, the
    strategy asked for and where the tables came from. ``evaluate`` and ``replay --plan``
    default to these."""
    plan.meta.update({"batch_size": int(batch_size), "dedup": bool(model.dedup),
                      "model": dataclasses.asdict(model), "ids": str(ids),
                      "requested_strategy": requested, "tables_source": tables_source})


def _recorded(plan) -> dict[str, Any]:
    """What ``plan`` records of how it was made (None for what a plan made elsewhere lacks)."""
    m = plan.meta
    ids = m.get("ids")
    model = m.get("model") or {}
    return {"batch_size": m.get("batch_size"), "dedup": m.get("dedup"),
            "ids": None if ids is None else IdMode.parse(ids), "model": model,
            "profile": model.get("profile") if model else None,
            "requested": m.get("requested_strategy") or plan.strategy}


def _spell(name: str, value: Any) -> str:
    """A setting as the user reads it."""
    if name == "batch_size":
        return f"B = {value}"
    if name == "dedup":
        return f"de-duplication {'on' if value else 'off'}"
    if name == "ids":
        return f"IDs {value}"
    if name == "profile":
        return f"the {value} profile"
    return f"{name} {value}"


def _setting(name: str, flag: str, given: Any, recorded: Any, where: str, default: Any) -> Any:
    """The value of one setting: ``given`` on the command line, else what the plan records,
    else ``default``. A given value that differs from the recorded one is used, with a warning
    naming both (the figures then describe a plan made for something else)."""
    if given is None:
        return recorded if recorded is not None else default
    if recorded is not None and given != recorded:
        _warn(f"{flag}: {_spell(name, given)} differs from {_spell(name, recorded)} that "
              f"{where} was made for; using {_spell(name, given)}. Re-plan with it for a "
              f"like-for-like figure.")
    return given


def _cost_model(recorded_model: Mapping[str, Any], dedup: bool, profile: Optional[str] = None):
    """The plan's cost model (every recorded field this version knows) with ``dedup`` and the
    execution ``profile`` as resolved (a plan recorded before profiles existed was priced
    ``ideal``; the caller resolves that default)."""
    from .placement.cost import CostModel

    known = {f.name for f in dataclasses.fields(CostModel)}
    kept = {k: v for k, v in recorded_model.items()
            if k in known and k not in ("dedup", "profile")}
    return CostModel(**kept, dedup=bool(dedup), profile=profile or "torchrec")


def _profile_label(profile: str) -> str:
    """How figures under ``profile`` are labelled ("TorchRec 1.8" or "idealized")."""
    from .placement.profiles import execution_profile

    return execution_profile(profile).label


def _torchrec_issues(plan) -> list[str]:
    """What TorchRec 1.8 cannot run of ``plan`` as planned (empty: it runs it)."""
    from .placement.profiles import execution_profile

    return execution_profile("torchrec").issues(plan)


# ============================================================================ plan
def _resolve_tables(logs: List[Path], tables: Optional[Path], mode: IdMode):
    """The tables (a file, or inferred from the log with the default headroom) and a phrase
    saying where they came from."""
    from .plans.tables import infer_tables, load_tables

    if tables is not None:
        return load_tables(tables), str(tables)
    tabs = infer_tables([str(p) for p in logs], ids=mode, headroom=DEFAULT_HEADROOM)
    _warn_time_columns([t.name for t in tabs])
    if mode.rows is not None:
        return tabs, f"inferred from the log, {mode.rows:,} rows each (--ids {mode})"
    return tabs, (f"inferred from the log, num_rows = {DEFAULT_HEADROOM:g} x (largest ID + 1); "
                  f"flexshard-stream tables writes them to a file")


_TIME_LIKE = re.compile(r"(?i)^(time|timestamp|datetime|date|epoch|event_?time|"
                        r".+_(time|timestamp|ts|date|at))$")


def _time_like(names: Sequence[str]) -> list[str]:
    """Feature columns whose name says sample time (``timestamp``, ``event_time``, ...): read as
    ID columns (tables) unless named ``ts``."""
    return [n for n in names if _TIME_LIKE.match(n)]


def _time_column_hint(names: Sequence[str]) -> str:
    """How to keep time-like columns ``names`` out of the tables (empty when there are none)."""
    cols = _time_like(names)
    if not cols:
        return ""
    return (f"{', '.join(repr(c) for c in cols)} looks like the sample time, read here as an ID "
            f"column (a table): rename it ts (the timestamp column), or name the ID columns with "
            f"--features (stats, tables) and plan with the tables file `flexshard-stream tables "
            f"LOG --features A,B --out tables.toml` writes")


def _warn_time_columns(names: Sequence[str]) -> None:
    """The :func:`_time_column_hint` of the feature columns ``names`` as a warning, if any."""
    hint = _time_column_hint(names)
    if hint:
        _warn(hint)


def _memory_hints(big: Sequence[str], host_memory: bool = False, factor: float = 1.0) -> str:
    """The ways out of a plan that does not fit: hashing the IDs of the ``big`` tables, the host
    memory tier (unless used), more GPUs (unless ``factor``, the excess, is beyond them), smaller
    tables."""
    ways = [_time_column_hint(big)] if _time_like(big) else []
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
                      + f") but the {topo.num_gpus} GPUs of {_topo_name(topo)} have {where} "
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
        _warn(f"{label} plan: our model puts GPU {g} at {fmt_bytes(cost.peak_memory_per_gpu[g])} "
              f"(rows and buffers), over its {fmt_bytes(p.topology.hbm_bytes[g])} of HBM; "
              f"TorchRec's own storage model admitted it")


def _topo_name(topo) -> str:
    return topo.name or f"{topo.nodes}x{topo.gpus_per_node}"


def _memory_policy(tabs, topo, memory_bytes: Optional[float], baseline: str,
                   host_memory: bool):
    """FlexShard's memory policy. With ``--host-memory`` and no ``--memory-bytes``, tables that
    row-wise could not fit in HBM get the HBM of a GPU as the budget (the rest to host memory)."""
    from .placement.planner import MemoryPolicy

    if host_memory and memory_bytes is None:
        rw_rows = float(sum(t.table_bytes for t in tabs)) / topo.num_gpus
        hbm = float(topo.hbm_bytes.min())
        if rw_rows >= hbm:
            memory_bytes = hbm
            _note(f"--host-memory: budget = the HBM of a GPU ({fmt_bytes(hbm)}); row-wise would "
                  f"store {fmt_bytes(rw_rows)} of rows per GPU")
    return MemoryPolicy(bytes_per_gpu=memory_bytes, baseline=baseline, host_memory=host_memory)


def _warn_sparse_inferred(tabs, st, inferred: bool, mode: IdMode) -> list[str]:
    """Inferred raw tables of sparse IDs (far more rows than distinct IDs, over 1 GB): warned,
    named."""
    from .plans.tables import SPARSE_FACTOR

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
            _warn(f"table {t.name}: sparse IDs (~{d[0]:,.0f} distinct up to {ts.max_id:,}) give "
                  f"{fmt_rows(t.num_rows)} rows ({fmt_bytes(t.table_bytes)}); hash them with "
                  f"--ids hash:ROWS, or size tables with `flexshard-stream tables LOG --ids "
                  f"hash --out tables.toml`")
    return out


def _profile(logs: List[Path], tables, rows=None, skip_bad_rows: bool = False,
             read_batch_size: int = 65536):
    """Sketch the log with the tables' row counts, IDs mapped by ``rows``; returns the
    StreamStats and the reader (its ``skipped`` counts)."""
    from .sources.logs import LogReader
    from .stats.config import TableConfig
    from .stats.stream import StreamStats

    st = StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tables])
    reader = LogReader([str(p) for p in logs], features=[t.feature for t in tables],
                       read_batch_size=read_batch_size, skip_bad_rows=skip_bad_rows, rows=rows)
    for b in reader:
        st.update(b)
    return st, reader


def _make_plan(strategy: str, tabs, topo, st, summaries, batch_size: int, memory, model,
               target: Optional[str] = None):
    """(planner result or None, plan) for ``strategy`` (FlexShard for the ``target`` runtime)."""
    if strategy == "flexshard":
        from .placement.planner import plan_flexshard
        result = plan_flexshard(tabs, topo, summaries, batch_size, memory, model, target=target)
        return result, result.plan
    if strategy == "torchrec":
        from .placement.references import plan_torchrec
        return None, plan_torchrec(tabs, topo, batch_size, summaries=summaries, model=model).plan
    from .placement.baselines import build_baseline

    iterations = max(1, st.samples // (topo.num_gpus * batch_size))
    lookups = {n: s.total / iterations for n, s in summaries.items()}
    return None, build_baseline(strategy, tabs, topo, summaries=summaries,
                                iterations=iterations, lookups=lookups)


def _plan_label(requested: str, strategy: str) -> str:
    """``flexshard (= rw)`` when FlexShard was asked for and row-wise won; else the strategy."""
    return requested if requested == strategy else f"{requested} (= {strategy})"


_SHORT_KIND = {"table_wise": "tw", "column_wise": "cw", "table_column_wise": "twcw",
               "row_wise": "rw", "table_row_wise": "twrw", "data_parallel": "dp"}


def _sharding(tp, topo) -> str:
    """How a table is sharded, in TorchRec's short words (tw, cw, twcw, rw, twrw, dp), with
    ``(hashed)`` for hashed rows, ``, n GPUs`` when row-wise spans part of the cluster and
    ``+host`` with a host-memory tier (replicated and placed rows are counted beside it)."""
    kind = tp.sharding_kind(topo)
    base = _SHORT_KIND.get(kind, kind)
    c = tp.cold
    n = int(c.gpus.size)
    if kind == "row_wise" and n != topo.num_gpus:
        base += f", {n} GPUs"
    if c.kind == "hash":
        base += " (hashed)"
    return base + (" +host" if tp.has_host_tier else "")


def _table_shardings(p) -> list[dict[str, Any]]:
    """Per table: sharding, GPUs holding shards, shard rows per GPU (min, max over those GPUs;
    cold rows and rows placed by load), replicated rows (on every GPU, on every node), placed
    rows, table bytes."""
    import numpy as np

    from .plans.plan import Plan

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
        out.append({"table": name, "sharding": _sharding(tp, topo), "gpus": gpus,
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
    typer.echo(_text_table(["table", "sharding", "GPUs", "shard rows/GPU", "replicated rows",
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
        typer.echo(_text_table(["GPU", "node"] + names, rows, left=0))
        return
    rows = []
    for n in range(G // gpus_per_node):
        sl = slice(n * gpus_per_node, (n + 1) * gpus_per_node)
        rows.append([n, f"{sl.start}-{sl.stop - 1}"] + [fmt_bytes(max(g[c][sl])) for c in cols])
    typer.echo(_text_table(["node", "GPUs"] + [f"max {x}" for x in names], rows, left=0))
    _say("(per GPU: --json, key per_gpu)")


def _print_plan(doc: Mapping[str, Any], p, result) -> None:
    """Human summary: what was written and how it was made, per table, per GPU, and the
    modelled figures per iteration (against the baseline for FlexShard)."""
    topo = p.topology
    s = doc["settings"]
    hbm = fmt_bytes(float(topo.hbm_bytes.max()))
    _say(f"{doc['label']} plan for {len(p.tables)} table(s) on {doc['topology']} "
         f"({topo.num_gpus} GPUs, {hbm} HBM each) written to {doc['out']}")
    _say(f"made for B = {s['batch_size']} samples per GPU, de-duplication "
         f"{'on' if s['dedup'] else 'off'}, IDs {s['ids']}; tables {s['tables_source']}; "
         f"{_profile_label(doc['profile'])} figures.")
    for issue in doc["torchrec_issues"]:
        _warn(f"TorchRec 1.8 cannot run this as planned: {issue}")
    if doc.get("equals"):
        _say(f"FlexShard found no plan better than {doc['equals']} within the budget: the plan "
             f"written is {doc['equals']}'s placement (labelled {doc['label']}).")
    _say()
    _print_tables_of_plan(doc)
    _say()
    _say("per GPU, modelled per iteration (analytic):")
    _print_gpus_of_plan(doc, topo.gpus_per_node)
    _say()
    entries = [(doc["label"], doc["cost"])]
    if result is not None:
        entries = [(result.baseline.strategy, result.baseline_cost.to_json())] + entries
        _say(f"modelled per iteration (analytic) against {result.baseline.strategy}, at a "
             f"budget of {fmt_bytes(result.budget_bytes)} per GPU:")
    else:
        _say("modelled per iteration (analytic):")
    typer.echo(_cost_rows(entries))
    if result is not None:
        c, b = result.cost, result.baseline_cost
        room = doc["estimate"]["memory_room"]
        freed, extra = room.get("buffers_freed", 0), room.get("extra_rows", 0)
        _say(f"speed-up {b.iteration_time_s / max(c.iteration_time_s, 1e-30):.2f}x over "
             f"{result.baseline.strategy}, {_vs_best_text(doc['estimate'])} (chosen from "
             f"{p.meta.get('chosen_from', 'flexshard')}); at the peak GPU: {fmt_bytes(freed)} "
             f"of buffers freed, {fmt_bytes(extra)} more rows, "
             f"{fmt_bytes(room.get('headroom', 0))} headroom.")
    if "torchrec_estimate" in doc:
        _print_torchrec_estimate(doc["torchrec_estimate"], doc["cost"], doc["profile"])
    _say(_CROSSING_NOTE)
    _say()
    _command_hint("Next (B, de-duplication and the ID mode default to this plan's):",
                  f"flexshard-stream evaluate --plan {doc['out']} --log OTHER_LOG")


def _print_torchrec_estimate(e: Mapping[str, Any], cost: Mapping[str, Any], profile: str
                             ) -> None:
    """TorchRec's own estimate of its plan beside ours."""
    c = e["critical_rank_ms"]
    compute = c["fwd_compute"] + c["bwd_compute"] + c["prefetch_compute"]
    comms = c["fwd_comms"] + c["bwd_comms"]
    _say(f"TorchRec {e['version']}'s own estimate (planned in {fmt_seconds(e['planning_seconds'])}"
         f"): {e['perf_rating_ms']:.4g} ms per iteration on its slowest rank "
         f"({e['critical_rank']}): compute {compute:.4g} ms + comms {comms:.4g} ms, uniform "
         f"access, no de-duplication, index bytes left out; ours ({_profile_label(profile)}): "
         f"communication {1e3 * cost['comm_time_s_per_iter']:.4g} ms.")
    for note in e["notes"]:
        _note(note)


@app.command()
def plan(log: List[Path] = typer.Option(..., "--log", help="Log files to profile (parquet/CSV)."),
         topology: str = typer.Option(..., help="Topology TOML file or preset name (2x8, 16x8, "
                                      "16x8_skewed)."),
         strategy: str = typer.Option("rw", callback=_choice(STRATEGIES, "--strategy"),
                                      help=" | ".join(STRATEGIES) + " (any case)."),
         out: Path = typer.Option(..., help="Plan directory to write."),
         tables: Optional[Path] = typer.Option(None, help="Tables file (TOML; `flexshard-stream "
                                               "tables` writes one). Default: inferred from the "
                                               f"log, rows = {DEFAULT_HEADROOM:g} x (largest ID "
                                               "+ 1), dim 128."),
         ids: Optional[str] = typer.Option(None, "--ids", callback=_ids_option, help=_IDS_HELP),
         batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, help="Samples per GPU per iteration "
                                        "(B), recorded in the plan; hugectr counts profiled "
                                        "iterations with it."),
         dedup: bool = typer.Option(True, help="Plan for in-batch de-duplication (recorded)."),
         profile: str = typer.Option("torchrec", callback=_choice(PROFILES, "--profile"),
                                     help=_PROFILE_HELP + " The planner prices its candidates "
                                          "under it (recorded)."),
         target: Optional[str] = typer.Option(None, callback=_choice(PROFILES, "--target"),
                                              help="Runtime the flexshard plan must run on: "
                                                   "torchrec | ideal (default: the profile)."),
         memory_bytes: Optional[float] = typer.Option(None, help="Per-GPU memory budget in bytes "
                                                      "(flexshard; default: no more peak memory "
                                                      "than row-wise)."),
         memory_baseline: str = typer.Option("rw", callback=_choice(MEMORY_BASELINES,
                                                                    "--memory-baseline"),
                                             help="Baseline whose peak memory is the budget "
                                                  "(flexshard): " + " | ".join(MEMORY_BASELINES)
                                                  + "."),
         topk: int = typer.Option(1 << 20, help="Top rows per table the planner may replicate."),
         host_memory: bool = typer.Option(False, "--host-memory", help="RecShard tier (flexshard):"
                                          " cold rows that do not fit the memory budget (then HBM "
                                          "bytes per GPU) go to host memory, the hottest kept in "
                                          "HBM; host lookups at UVM bandwidth."),
         skip_bad_rows: bool = typer.Option(False, help="Drop and count bad rows (IDs out of "
                                            "the tables' range included) instead of stopping."),
         json_out: bool = typer.Option(False, "--json", help="Print the plan summary as JSON.")):
    """Write a plan (FlexShard or a baseline) for the tables of a log."""
    from .placement.cost import CostModel, evaluate_analytic
    from .plans.tables import row_map, summaries_by_table
    from .plans.topology import Topology

    mode = ids or IdMode()
    model = CostModel(dedup=dedup, profile=profile)
    try:
        topo = Topology.load(topology)
        tabs, source = _resolve_tables(log, tables, mode)
        _refuse_impossible(tabs, topo, host_memory and strategy == "flexshard")
        st, reader = _profile(log, tabs, row_map(tabs, mode), skip_bad_rows)
        sparse = _warn_sparse_inferred(tabs, st, tables is None, mode)
        summaries = summaries_by_table(tabs, st.summary(k=topk))
        memory = _memory_policy(tabs, topo, memory_bytes, memory_baseline, host_memory)
        result, p = _make_plan(strategy, tabs, topo, st, summaries, batch_size, memory, model,
                               target)
        cost = result.cost if result is not None else evaluate_analytic(p, summaries,
                                                                          batch_size, model)
        label = _plan_label(strategy, p.strategy)
        if strategy == "torchrec":   # TorchRec checked its own plan against its memory model
            _warn_over_memory(label, p, cost)
        else:
            _refuse_over_memory(label, p, cost, sparse)
        _record_settings(p, batch_size=batch_size, model=model, ids=mode, requested=strategy,
                         tables_source=source)
        p.save(out)
    except FlexShardError as e:
        _fail(e)
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
           "out": str(out), "topology": _topo_name(p.topology),
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


# ============================================================================ evaluate
def _common_setting(name: str, flag: str, given: Any, plans: Sequence[tuple[Path, Any]],
                    default: Any) -> Any:
    """One value for every plan: ``given``, else the first recorded one, else ``default``; each
    plan made for another value is named in a warning with both values."""
    recs = [(d, _recorded(p)[name]) for d, p in plans]
    value = given if given is not None else next((r for _, r in recs if r is not None), default)
    why = f"({flag})" if given is not None else "(the first plan's)"
    for d, r in recs:
        if r is not None and r != value:
            _warn(f"{flag}: plan {d} was made for {_spell(name, r)}; evaluating it at "
                  f"{_spell(name, value)} {why}. Re-plan with it for a like-for-like figure.")
    if all(r is None for _, r in recs) and given is None:
        _note(f"the plans record no {flag}: using {_spell(name, value)}")
    return value


def _check_plan_against(d: Path, p, topology: Optional[str], tables: Optional[Path]) -> None:
    """``evaluate --topology/--tables``: the plan must have been made for them."""
    from .plans.tables import load_tables
    from .plans.topology import Topology

    if topology is not None and Topology.load(topology) != p.topology:
        raise ConfigError(f"plan {d} was made for topology {_topo_name(p.topology)}, not "
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
    from .placement.cost import evaluate_trace
    from .plans.tables import row_map
    from .sources.logs import LogReader

    tabs = [tp.table for tp in p.tables.values()]
    reader = LogReader([str(x) for x in logs], features=[t.feature for t in tabs],
                       read_batch_size=65536, skip_bad_rows=skip_bad_rows,
                       rows=row_map(tabs, mode))
    model = _cost_model(_recorded(p)["model"], dedup, profile)
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
              "label": _plan_label(_recorded(p)["requested"], p.strategy)})
    hbm = float(p.topology.hbm_bytes.min())
    if r["peak_memory_bytes"] > hbm:
        _warn(f"plan {d}: peak memory {fmt_bytes(r['peak_memory_bytes'])} per GPU exceeds the "
              f"{fmt_bytes(hbm)} of HBM of its topology")
    return r


def _print_evaluation(results: Mapping[str, Mapping[str, Any]], plans) -> None:
    first = next(iter(results.values()))
    topo = plans[0][1].topology
    _say(f"per iteration: {topo.num_gpus} GPUs x B = {first['batch_size']} samples, "
         f"de-duplication {'on' if first['dedup'] else 'off'}, "
         f"{_profile_label(first['profile'])} figures; "
         + "; ".join(f"{r['label']}: {r['iterations']:,} iterations, IDs {r['ids']}"
                     for r in results.values()))
    labels = [r["label"] for r in results.values()]
    typer.echo(_cost_rows([(r["label"] if labels.count(r["label"]) == 1 else k, r)
                           for k, r in results.items()]))
    for k, r in results.items():
        if r["skipped"]:
            _say(f"{k}: skipped {sum(r['skipped'].values()):,} bad rows ("
                 + ", ".join(f"{why} {n:,}" for why, n in r["skipped"].items()) + ")")
        if r.get("dropped_samples"):
            _say(f"{k}: the last {r['dropped_samples']:,} samples did not fill an iteration "
                 f"and were not evaluated")
    _say(_CROSSING_NOTE)


@app.command()
def evaluate(plan_dirs: List[Path] = typer.Option(..., "--plan", help="Plan directory (repeat "
                                                  "to compare several)."),
             log: List[Path] = typer.Option(..., "--log", help="Log files to replay."),
             batch_size: Optional[int] = typer.Option(None, help="Samples per GPU per iteration "
                                                      "(B). Default: the plan's (a different "
                                                      "value is used with a warning)."),
             dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup",
                                                  help="In-batch de-duplication of IDs. "
                                                       "Default: the plan's."),
             profile: Optional[str] = typer.Option(None, callback=_choice(PROFILES, "--profile"),
                                                   help=_PROFILE_HELP + " Default: the plan's."),
             ids: Optional[str] = typer.Option(None, "--ids", callback=_ids_option,
                                               help=_IDS_HELP + " Default: the plan's."),
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
    from .plans.plan import Plan

    if batch_size is not None and batch_size < 1:
        raise typer.BadParameter("must be >= 1 sample per GPU", param_hint="--batch-size")
    results: dict[str, dict[str, Any]] = {}
    try:
        plans = [(d, Plan.load(d)) for d in plan_dirs]
        B = _common_setting("batch_size", "--batch-size", batch_size, plans, DEFAULT_BATCH_SIZE)
        D = _common_setting("dedup", "--dedup/--no-dedup", dedup, plans, True)
        P = _common_setting("profile", "--profile", profile, plans, "torchrec")
        for d, p in plans:
            _check_plan_against(d, p, topology, tables)
            mode = _setting("ids", "--ids", ids, _recorded(p)["ids"], f"plan {d}", IdMode())
            r = _evaluate_one(d, p, log, B, D, mode, skip_bad_rows, max_iterations, P)
            key = _recorded(p)["requested"]
            results[key if key not in results else f"{key}:{d}"] = r
    except FlexShardError as e:
        _fail(e)
    if json_out:
        typer.echo(json.dumps(results))
    else:
        _print_evaluation(results, plans)


# ============================================================================ replay, demo, report
class _ReplayProgress:
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



def _print_sketch(stats, topk: int) -> None:
    """A short per-table sketch summary of the whole log."""
    _say(f"the whole log: {stats.ids:,} lookups in {stats.samples:,} samples")
    rows = []
    for name, ts in stats.tables.items():
        sm = ts.summary(max(topk, 1))
        share = float(sm.top_est[:topk].sum()) / sm.total if sm.total else 0.0
        rows.append([name, f"{sm.total:,}", f"{sm.distinct_estimate:,.0f}",
                     f"{sm.mean_length:.1f}", f"{share:.1%}", "exact" if sm.exact else "sketch"])
    typer.echo(_text_table(["table", "lookups", "distinct rows", "IDs/sample", f"top-{topk} share",
                            "mode"], rows))


def _print_replay(res) -> None:
    """Per strategy: bytes per iteration, crossing nodes, comm time, peak memory, speed-up vs
    rw; then what the re-sharder did, skipped rows and warnings."""
    from .online.replay import STRATEGIES as REPLAYED

    s = res.summary
    tot = s["totals"]
    st = tot["strategies"]
    _say(f"{tot['windows']} window(s) of {s['window']['describe']}, {tot['iterations']:,} "
         f"iteration(s) x {s['samples_per_iteration']:,} samples (B = {s['batch_size']}), "
         f"de-duplication {'on' if s['model']['dedup'] else 'off'}; per iteration, "
         f"{_profile_label(s['model'].get('profile', 'ideal'))} figures:")
    typer.echo(_cost_rows([(n, st[n]) for n in REPLAYED], vs_rw=True))
    rs, sta = st["resharder"].get("speedup_vs_rw"), st["static"].get("speedup_vs_rw")
    _say(f"rw: row-wise; twrw: table-row-wise; static: a FlexShard plan made on the first "
         f"window; resharder: that plan moved online by the re-sharder "
         f"({st['resharder']['deltas']} plan change(s) in {tot['checks']} checks, "
         f"{fmt_bytes(st['resharder']['migration_bytes'])} moved). FlexShard replicates the "
         f"rows that carry most lookups (on every GPU or once per node) within row-wise's "
         f"memory ({fmt_bytes(s['budget_bytes'])} per GPU)"
         + (f": {rs:.2f}x less communication time per iteration than row-wise with the "
            f"re-sharder, {sta:.2f}x static; {_vs_best_text(st['resharder'])} with the "
            f"re-sharder ({_vs_best_text(st['static'])} static)."
            if rs is not None and sta is not None else "."))
    if rs is not None and sta is not None and max(rs, sta) < 1.005:
        _say(f"Here FlexShard gains under 0.5% over row-wise: under "
             f"{_profile_label(s['model'].get('profile', 'ideal'))} exchanges at B = "
             f"{s['batch_size']}, within row-wise's memory less the margin the planner keeps "
             f"free for the next window (3 standard deviations of the statistics' and buffers' "
             f"uncertainty; wide on short windows), nothing it tried saves more.")
    _say(_CROSSING_NOTE)
    if tot.get("skipped_rows"):
        _say(f"skipped {tot['skipped_rows']:,} bad rows: "
             + ", ".join(f"{k} {v:,}" for k, v in tot["skipped"].items() if v))
    for w in s.get("warnings") or []:
        _warn(w)
    if tot.get("dropped_samples") and not s.get("warnings"):
        _say(f"{tot['dropped_samples']:,} samples at window ends did not fill an iteration: "
             f"counted and fed to the statistics, not evaluated.")


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
         profile: str = typer.Option("torchrec", callback=_choice(PROFILES, "--profile"),
                                     help=_PROFILE_HELP),
         report: bool = typer.Option(True, help="Write report.html and the PNGs (matplotlib).")):
    """Replay the embedded default trace through four placements and write the HTML report."""
    from .online.replay import replay as run_replay
    from .placement.cost import CostModel

    try:
        path = _default_trace()
        _say(f"flexshard-stream demo: replaying the embedded default trace {path.name} (seeded "
             f"synthetic, production-like skew, 30 s of samples) in windows of {window} on "
             f"{topology}, B = {batch_size}")
        t0 = time.perf_counter()
        with _ReplayProgress() as prog:
            res = run_replay([path], topology, window=window, out_dir=out, batch_size=batch_size,
                             model=CostModel(dedup=dedup, profile=profile), progress=prog)
        _print_sketch(res.stats, topk)
        _say()
        _print_replay(res)
        _say()
        _finish_demo(out, report)
        _say(f"{time.perf_counter() - t0:.1f} s. Next: flexshard-stream replay LOG... --topology "
             f"2x8 --window 30m --out DIR on your own logs, then flexshard-stream report DIR.")
    except FlexShardError as e:
        _fail(e)


def _finish_demo(out: Path, report: bool) -> None:
    """The demo's report (when matplotlib is installed) and where everything is."""
    where = out.resolve()
    if report and importlib.util.find_spec("matplotlib") is None:
        report = False
        _say("report skipped: matplotlib is not installed (pip install "
             "'flexshard-stream[report]')")
    if report:
        from .report import build_report
        html = build_report(out)
        _say(f"Report: {html.resolve()} (open it in a browser; the pictures and summary.json "
             f"are beside it in {where})")
    else:
        _say(f"Replay written to {where} (summary.json, cdf.json, plans/, traffic/); "
             f"`flexshard-stream report {out}` draws it")


def _replay_settings(plan_dir: Optional[Path], topology: Optional[str], tables: Optional[Path],
                     ids: Optional[IdMode], batch_size: Optional[int], dedup: Optional[bool],
                     profile: Optional[str] = None) -> dict[str, Any]:
    """Topology, tables, ID mode, B and cost model of a replay: the options, else the plan's
    (``--plan``), else the defaults; a topology is needed from one of them."""
    from .placement.cost import CostModel
    from .plans.plan import Plan
    from .plans.topology import Topology

    if plan_dir is None:
        if topology is None:
            raise ConfigError("replay needs a topology: --topology (a preset such as 2x8, or a "
                              "TOML file), or --plan DIR to take it from a plan")
        return {"topology": Topology.load(topology), "tables": tables, "ids": ids or IdMode(),
                "batch_size": batch_size or DEFAULT_BATCH_SIZE,
                "model": CostModel(dedup=True if dedup is None else dedup,
                                   profile=profile or "torchrec")}
    p = Plan.load(plan_dir)
    rec = _recorded(p)
    where = f"plan {plan_dir}"
    topo = p.topology if topology is None else Topology.load(topology)
    if topo != p.topology:
        _warn(f"--topology {topology} differs from {_topo_name(p.topology)} that {where} was "
              f"made for; replaying on {topology}")
    return {"topology": topo,
            "tables": tables if tables is not None else [tp.table for tp in p.tables.values()],
            "ids": _setting("ids", "--ids", ids, rec["ids"], where, IdMode()),
            "batch_size": _setting("batch_size", "--batch-size", batch_size, rec["batch_size"],
                                   where, DEFAULT_BATCH_SIZE),
            "model": _cost_model(rec["model"], _setting("dedup", "--dedup/--no-dedup", dedup,
                                                        rec["dedup"], where, True),
                                 _setting("profile", "--profile", profile, rec["profile"], where,
                                          "torchrec"))}


def _fit_windows(logs: List[Path], window: Optional[str], topo, B: int
                 ) -> tuple[Optional[str], Optional[str]]:
    """The window to replay with and a note for the user: ``window`` if each can fill an
    iteration of ``G x B`` samples (ConfigError with the numbers otherwise); by default fewer
    equal windows when ten would not fill one (the note says so; printed once the arguments
    have all been checked). Duration windows are checked after the replay."""
    from .online.replay import DEFAULT_WINDOWS
    from .sources.logs import LogReader
    from .sources.windows import parse_window

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


@app.command("replay")
def replay_cmd(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs, one row per "
                                                 "sample, in time order."),
               out: Path = typer.Option(..., help="Directory to write (summary.json, cdf.json, "
                                        "plans/, traffic/); replaced atomically."),
               plan_dir: Optional[Path] = typer.Option(None, "--plan", help="Take the topology, "
                                                       "tables, ID mode, B and de-duplication "
                                                       "from this plan (flexshard-stream plan); "
                                                       "options given win, with a warning."),
               topology: Optional[str] = typer.Option(None, help="Topology TOML file or preset "
                                                      "name (2x8, 16x8, 16x8_skewed); needed "
                                                      "without --plan."),
               tables: Optional[Path] = typer.Option(None, help="Tables file (default: the "
                                                     "plan's, or inferred from the log: rows = "
                                                     "largest ID + 1, dim 128)."),
               ids: Optional[str] = typer.Option(None, "--ids", callback=_ids_option,
                                                 help=_IDS_HELP),
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
               profile: Optional[str] = typer.Option(None, callback=_choice(PROFILES,
                                                                            "--profile"),
                                                     help=_PROFILE_HELP + " Default: the "
                                                          "plan's, else torchrec."),
               skip_bad_rows: bool = typer.Option(False, help="Drop and count bad rows (IDs out "
                                                  "of the tables' range included) instead of "
                                                  "stopping at the first."),
               top_k: int = typer.Option(4096, help="Rows per table summarized for the planner "
                                         "and the re-sharder."),
               engine: str = typer.Option("local", callback=_choice(ENGINES, "--engine"),
                                          help="Where the window statistics are computed: local "
                                               "(this process), process (worker processes) or "
                                               "ray (Ray tasks; needs the ray extra)."),
               evaluation: str = typer.Option("trace", callback=_choice(EVALUATIONS,
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
               json_out: bool = typer.Option(False, "--json", help="Print the totals as one JSON "
                                             "object.")):
    """Replay logs in windows through rw, twrw, a static FlexShard plan and the re-sharder."""
    from .online.replay import replay as run_replay

    if batch_size is not None and batch_size < 1:
        raise typer.BadParameter("must be >= 1 sample per GPU", param_hint="--batch-size")
    try:
        cfg = _replay_settings(plan_dir, topology, tables, ids, batch_size, dedup, profile)
        win, note = _fit_windows(logs, window, cfg["topology"], cfg["batch_size"])
        with _ReplayProgress(enabled=not json_out) as prog:
            res = run_replay(logs, cfg["topology"], tables=cfg["tables"], window=win,
                             out_dir=out, batch_size=cfg["batch_size"], model=cfg["model"],
                             skip_bad_rows=skip_bad_rows, top_k=top_k, progress=prog,
                             engine=engine, evaluation=evaluation, address=address,
                             num_workers=workers, ids=cfg["ids"])
        if note:
            _note(note)
        _check_replayed(res, cfg["batch_size"])
    except FlexShardError as e:
        _fail(e)
    except OSError as e:
        _fail(f"cannot write {out}: {e}")
    if json_out:
        typer.echo(json.dumps({"out": str(out), "profile": cfg["model"].profile,
                               "engine": res.summary["engine"],
                               "evaluation": res.summary["evaluation"],
                               "workers": res.summary["workers"], "totals": res.totals,
                               "warnings": res.summary.get("warnings", [])}))
        return
    _print_replay(res)
    s = res.summary
    nw = s["workers"]
    how = f"engine {s['engine']}" + (f", {nw} worker{'' if nw == 1 else 's'}" if nw else "")
    _say(f"written to {out}; draw it with `flexshard-stream report {out}` "
         f"({res.elapsed_s:.1f} s, {how}, {s['evaluation']} evaluation)")


@app.command("report")
def report_cmd(directory: Path = typer.Argument(..., help="A directory written by "
                                                "`flexshard-stream replay`.")):
    """Write DIR/report.html and its PNG pictures from a replay directory (needs matplotlib)."""
    from .report import PICTURES, build_report

    try:
        html = build_report(directory)
    except FlexShardError as e:
        _fail(e)
    except OSError as e:
        _fail(f"cannot write the report into {directory}: {e}")
    _say(f"report written to {html.resolve()} with {len(PICTURES)} pictures: "
         + ", ".join(PICTURES))


#: ``export_torchrec.COLD_SHARDINGS`` and ``NODE_REPLICAS`` (spelled here: the module is imported
#: only when the command runs; tests/test_export_torchrec.py checks they agree).
EXPORT_COLD_SHARDINGS = ("auto", "row_wise", "table_row_wise", "table_wise")
EXPORT_NODE_REPLICAS = ("hot", "cold")


@app.command("export")
def export_command(
        plan_dir: Path = typer.Option(..., "--plan", help="Plan directory (flexshard-stream plan "
                                      "--out)."),
        out: Path = typer.Option(..., "--out", help="Export directory to write (an export there "
                                 "is replaced; a file or another non-empty directory is "
                                 "refused)."),
        cold_sharding: str = typer.Option("auto", callback=_choice(EXPORT_COLD_SHARDINGS,
                                                                   "--cold-sharding"),
                                          help="TorchRec sharding of the cold rows: auto | "
                                          "row_wise | table_row_wise | table_wise."),
        node_replicas: str = typer.Option("hot", callback=_choice(EXPORT_NODE_REPLICAS,
                                                                  "--node-replicas"),
                                          help="Node replicas (no TorchRec equivalent): hot "
                                          "(replicated on every GPU) | cold."),
        json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON.")) -> None:
    """Export a plan for TorchRec 1.8: tables, constraints, ShardingPlan, ID remap
    (docs/TORCHREC_EXPORT.md). Needs no torch."""
    from .bridge.export import describe_export, export_torchrec
    from .plans.plan import Plan

    manifest = export_torchrec(Plan.load(plan_dir), out, cold_sharding=cold_sharding,
                               node_replicas=node_replicas)
    typer.echo(json.dumps(manifest) if json_out
               else "\n".join(describe_export(manifest) + [f"written to {out}"]))


@app.command("merge")
def merge_command(
        snapshots: List[Path] = typer.Argument(..., help="Snapshot files (or plain statistics "
                                               "files) from many hosts or windows."),
        out: Path = typer.Option(..., "-o", "--out", help="Merged snapshot to write (atomic; "
                                 "not written if any input is incompatible)."),
        json_out: bool = typer.Option(False, "--json", help="Print a JSON summary.")) -> None:
    """Merge statistics snapshots from many sidecars into one (for the planner)."""
    from .sources.distributed import load_snapshot, merge_snapshots

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
        unit: str = typer.Option("batches", callback=_choice(("batches", "seconds"), "--unit"),
                                 help="batches | seconds"),
        half_life: Optional[float] = typer.Option(None, help="Decayed statistics with this "
                                                  "half-life (--unit); default: the re-sharder's "
                                                  "sliding window of 8 checks."),
        top_k: int = typer.Option(4096, help="Rows per table summarized for the planner."),
        horizon: Optional[float] = typer.Option(None, help="Iterations over which a saving "
                                                "must beat the migration and pause (default: "
                                                "from the measured drift rate)."),
        pause: Optional[float] = typer.Option(None, help="Seconds a training job stalls per "
                                              "applied plan change, whatever it moves (default: "
                                              "the re-sharder's, docs/RESHARDER.md)."),
        memory_bytes: Optional[float] = typer.Option(None, help="Per-GPU memory budget (bytes; "
                                                     "default: row-wise peak)."),
        dedup: bool = typer.Option(True, help="Plan for in-batch de-duplication."),
        profile: str = typer.Option("torchrec", callback=_choice(PROFILES, "--profile"),
                                    help=_PROFILE_HELP),
        ids: Optional[str] = typer.Option(None, "--ids", callback=_ids_option,
                                          help="How the ring's IDs become rows of the --tables: "
                                               "raw (as written), hash (ID mod the table's "
                                               "num_rows, for producers that write raw sparse or "
                                               "hashed IDs) or hash:ROWS."),
        checkpoint_every: float = typer.Option(60.0, help="Seconds between checkpoints (0: only "
                                               "at shutdown)."),
        queue_batches: int = typer.Option(64, help="In-process queue between the ring and the "
                                          "statistics (batches)."),
        resume: bool = typer.Option(True, help="Resume from the last good checkpoint in --out."),
        status_every: float = typer.Option(0.0, help="Print a status line every this many "
                                           "seconds (0: never)."),
        unlink: bool = typer.Option(False, help="At shutdown, drain the ring and remove it."),
        cpu_budget: float = typer.Option(0.5, help="Cores the ingestion may use: above it the "
                                         "sidecar samples one ID in k, k chosen from the offered "
                                         "rate (0: never sample; docs/SIDECAR.md)."),
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
                        top_k=top_k, **({} if pause is None else {"pause_s": pause}))
    warnings.simplefilter("default", SidecarWarning)
    return run_ring(ring, tables, topology, out, batch_size=batch_size, ring_dir=ring_dir,
                    slots=slots, capacity_bytes=int(capacity_mb * (1 << 20)), checksum=checksum,
                    config=cfg, half_life=half_life,
                    memory=MemoryPolicy(bytes_per_gpu=memory_bytes),
                    model=CostModel(dedup=dedup, profile=profile),
                    checkpoint_every_s=checkpoint_every or None, queue_batches=queue_batches,
                    resume=resume, status_every_s=status_every, unlink=unlink, ids=ids,
                    cpu_budget=cpu_budget or None)


def main() -> None:
    try:
        app()
    except FlexShardError as e:
        typer.echo(f"error: {_cli_message(e)}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # python -m flexshard_stream.cli ...
    main()
