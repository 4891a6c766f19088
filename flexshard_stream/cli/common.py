"""What several commands share: option values and parsing, error, warning and note lines, plain
text output that fits 80 columns, the settings a plan records, and reading logs for the sketch.

Imports only typer and standard-library-only modules at the top (``--help`` stays light); what a
helper needs beyond them it imports inside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

import typer

from ..bridge.limits import TORCHREC_REFERENCE_TABLES
from ..errors import ConfigError, FlexShardError
from ..formats.units import fmt_bytes, fmt_seconds
from ..sources.ids import IdMode

# ============================================================================ constants
#: ``--profile`` values: the cost model's execution profiles (placement.profiles).
PROFILES = ("torchrec", "ideal")
#: Defaults when neither the command line nor a plan gives them.
DEFAULT_BATCH_SIZE = 512
#: Columns of the text output (prose, tables and commands fit in them).
WIDTH = 80
#: Help of every command's ``--profile`` and ``--ids`` (commands append their default).
PROFILE_HELP = ("Execution profile of the cost model: torchrec (what TorchRec 1.8 sends for the "
                "plan) or ideal (the project's own model: what a custom runtime could reach; "
                "figures labelled 'idealized').")
TS_HELP = ("The time column (seconds or datetimes). Default: ts, else timestamp, time or "
           "event_time: a column named like time is never read as a table of IDs.")
IDS_HELP = ("How log IDs become table rows: raw (an ID is its row), hash (row = ID mod the "
            "table's num_rows) or hash:ROWS (ID mod ROWS; inferred tables get ROWS rows). "
            "hash is the modulo TorchRec users apply to raw sparse or 64-bit hashed IDs.")


# ============================================================================ options
def choice(valid: Sequence[str], flag: str):
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


def ids_option(value: Optional[str]) -> Optional[IdMode]:
    """``--ids`` parsed (None when not given, so a plan's recorded mode can apply)."""
    if value is None:
        return None
    try:
        return IdMode.parse(value)
    except FlexShardError as e:
        raise typer.BadParameter(str(e), param_hint="--ids") from None


# ============================================================================ errors, warnings
#: The library's spelling of a way out -> the flag that does it on the command line.
_FLAG_SPELLING = (("skip_bad_rows=True", "--skip-bad-rows"), ("ids='hash:ROWS'", "--ids hash:ROWS"),
                  ("ids='hash'", "--ids hash"), ("null_as_empty=True", "null_as_empty (Python)"))
#: Ways out only the Python API has (no command has a flag for them): left out of messages.
_PYTHON_ONLY = ("ts=False", "features={")


def _drop_way_out(msg: str, lib: str) -> str:
    """``msg`` without its "pass <lib> ..." / "declare it with <lib> ..." clause."""
    return re.sub(rf";? ?(pass|declare it with) {re.escape(lib)}[^;]*", "", msg)


def cli_message(e: BaseException | str, flags: Optional[Sequence[str]] = None) -> str:
    """``e`` as one line for a command-line user: library keywords become the flags that do the
    same; with ``flags`` (the command's own), a way out through a flag it lacks is left out."""
    msg = " ".join(str(e).split())
    for lib, flag in _FLAG_SPELLING:
        lacking = flags is not None and flag.startswith("--") and flag.split()[0] not in flags
        msg = _drop_way_out(msg, lib) if lacking else msg.replace(lib, flag)
    for lib in _PYTHON_ONLY:
        msg = _drop_way_out(msg, lib)
    return msg


def fail(e: BaseException | str, flags: Optional[Sequence[str]] = None) -> None:
    """One clean error line on stderr, exit status 2 (no traceback); library keywords in the
    message become the flags that do the same here (only ``flags``, when given)."""
    typer.echo(f"error: {cli_message(e, flags)}", err=True)
    raise typer.Exit(2)


def os_reason(e: OSError) -> str:
    """What went wrong in ``e``, in the operating system's words ("No space left on device")."""
    return e.strerror or str(e)


@contextlib.contextmanager
def writing(path: Any):
    """Inside: an OS error (a full disk, a read-only file system, no permission, a name too long,
    a file where a directory goes) is one line, ``error: cannot write PATH: reason``, exit 2;
    library errors are :func:`fail` lines too."""
    try:
        yield
    except FlexShardError as e:
        fail(e)
    except OSError as e:
        fail(f"cannot write {_failed_path(e, path)}: {os_reason(e)}")


def _failed_path(e: OSError, path: Any) -> Any:
    """The path an OS error names: ``path`` when the file it failed on is ``path``'s or sits
    beside it (a temp file, the hidden versions area), else that file (a ring, a lock)."""
    if e.filename is None:
        return path
    parent = os.path.dirname(os.path.abspath(path))
    return path if os.path.abspath(e.filename).startswith(parent + os.sep) else e.filename


def require_logs(paths) -> None:
    """Fail at once (before polars and Numba are imported) when ``paths`` name no log file: a
    missing file, a glob matching nothing, a directory without logs, an unknown extension."""
    from ..errors import LogError
    from ..sources.paths import expand_log_paths
    try:
        expand_log_paths([str(x) for x in paths])
    except LogError as e:
        fail(e)


def warn(msg: str) -> None:
    """A warning on stderr, wrapped at 80 columns."""
    typer.echo(_wrap(f"warning: {msg}", "  "), err=True)


def note(msg: str) -> None:
    """A note on stderr (what a default turned into), wrapped at 80 columns."""
    typer.echo(_wrap(f"note: {msg}", "  "), err=True)


# ============================================================================ plain text output
def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: Any = 1) -> str:
    """Columns of text, two spaces apart, widths from the content (nothing is truncated or
    wrapped): left-aligned are the first ``left`` columns (an int) or the columns in ``left``
    (a set of indices), the rest right-aligned. A header cell with line breaks spans as many
    header lines (each aligned as its column)."""
    heads = [str(c).split("\n") for c in header]
    depth = max(len(h) for h in heads)
    head_lines = [[(h[len(h) - depth + k] if k >= depth - len(h) else "") for h in heads]
                  for k in range(depth)]
    cells = head_lines + [[str(c) for c in r] for r in rows]
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
    return textwrap.fill(" ".join(text.split()), WIDTH, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def say(text: str = "") -> None:
    """Print a paragraph wrapped at 80 columns (an empty line for "")."""
    typer.echo(_wrap(text) if text else "")


def command_hint(text: str, command: str) -> None:
    """A sentence, then a command indented on lines of its own, continued with a backslash
    beyond 80 columns (it still pastes into a shell as one command)."""
    say(text)
    lines, line = [], " "
    for word in command.split():
        if len(line) + 1 + len(word) > WIDTH - 2 and line.strip():
            lines.append(line)
            line = "   "
        line += " " + word
    typer.echo(" \\\n".join(lines + [line]))


def _crossing(b: Mapping[str, Any]) -> tuple[float, float, float]:
    """Bytes crossing between nodes per iteration from a ``bytes_per_iter`` dict: (all, the
    all-to-all part, the replica-sync part)."""
    a2a = float(b.get("inter_node") or 0.0)
    sync = float(b.get("sync_inter_node") or 0.0)
    return a2a + sync, a2a, sync


def cost_rows(entries: Sequence[tuple[str, Mapping[str, Any]]], vs_rw: bool = False) -> str:
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
    extra = ["vs rw"] if vs_rw else []
    table = text_table(["", "all-to-all", "crossing nodes", "incl. sync", "comm time",
                        "peak/GPU"] + extra, rows)
    if max(len(line) for line in table.splitlines()) <= WIDTH:
        return table
    # long labels: the headers on two lines, so the columns are as wide as their figures
    return text_table(["", "all-to-all", "crossing\nnodes", "incl.\nsync", "comm\ntime",
                       "peak/\nGPU"] + extra, rows)


def vs_best_text(r: Mapping[str, Any]) -> str:
    """``"<x>x over <name>, the best baseline"`` from a summary with ``speedup_vs_best_baseline``
    and ``best_baseline``."""
    sp, name = r.get("speedup_vs_best_baseline"), r.get("best_baseline")
    return "no baseline fits" if sp is None or not name else \
        f"{sp:.2f}x over {name}, the best baseline that fits"


CROSSING_NOTE = ("crossing nodes: every byte sent between nodes per iteration, the all-to-all's "
                 "and the replica sync's (gradients of replicated rows; incl. sync gives that "
                 "part); comm time: the slowest GPU's; peak/GPU: rows + buffers.")


# ============================================================================ plans
def load_plan(path: Path, flag: str = "--plan"):
    """The plan directory ``path`` given as ``flag``, loaded; a clear error otherwise: it does
    not exist, or it is a directory holding plans (a replay's ``plans/``, a sidecar's ``plan``
    link) rather than a plan, or it is damaged (the loader's error)."""
    from ..formats.directories import directory_kind
    from ..plans.plan import Plan

    if not os.path.lexists(path):
        raise ConfigError(f"{flag} {path}: does not exist (a plan directory is what "
                          f"`flexshard-stream plan --out` writes)")
    kind = directory_kind(path) if os.path.isdir(path) else None
    if kind == "replay":
        names = sorted(p.name for p in (Path(path) / "plans").iterdir()
                       if not p.name.startswith(".")) if (Path(path) / "plans").is_dir() else []
        raise ConfigError(f"{flag} {path}: a replay directory, not a plan; its plans are in "
                          f"{Path(path) / 'plans'}/ ({', '.join(names)}): for example {flag} "
                          f"{Path(path) / 'plans' / 'static'}")
    if kind == "sidecar":
        raise ConfigError(f"{flag} {path}: a sidecar's directory, not a plan; its published "
                          f"plan is {flag} {Path(path) / 'plan'}")
    return Plan.load(path)


# ============================================================================ a plan's settings
def recorded_settings(plan) -> dict[str, Any]:
    """What ``plan`` records of how it was made (None for what a plan made elsewhere lacks)."""
    m = plan.meta
    ids = m.get("ids")
    model = m.get("model") or {}
    return {"batch_size": m.get("batch_size"), "dedup": m.get("dedup"),
            "ids": None if ids is None else IdMode.parse(ids), "model": model,
            "profile": model.get("profile") if model else None,
            "requested": m.get("requested_strategy") or plan.strategy}


def spell_setting(name: str, value: Any) -> str:
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


def resolve_setting(name: str, flag: str, given: Any, recorded: Any, where: str,
                    default: Any) -> Any:
    """The value of one setting: ``given`` on the command line, else what the plan records,
    else ``default``. A given value that differs from the recorded one is used, with a warning
    naming both (the figures then describe a plan made for something else)."""
    if given is None:
        return recorded if recorded is not None else default
    if recorded is not None and given != recorded:
        warn(f"{flag}: {spell_setting(name, given)} differs from "
             f"{spell_setting(name, recorded)} that {where} was made for; using "
             f"{spell_setting(name, given)}. Re-plan with it for a like-for-like figure.")
    return given




def torchrec_reference_ok(profile: Optional[str], where: str, tables: Optional[int] = None,
                          *, show=None) -> bool:
    """Whether TorchRec's own plan can be among the plans ``where`` ("compared", "replayed"):
    under the torchrec profile, TorchRec installed and at most
    :data:`TORCHREC_REFERENCE_TABLES` tables (``tables`` None: not known yet); otherwise False,
    with a note (``show``, default :func:`note`) saying why, except for another profile."""
    import importlib.util

    show = show or note
    if (profile or "torchrec") != "torchrec":
        return False
    if importlib.util.find_spec("torchrec") is None:
        show(f"TorchRec is not installed: its own plan is not among the plans {where} (make "
             "install-dev, or pip install 'flexshard-stream[torchrec]')")
        return False
    if tables is not None and tables > TORCHREC_REFERENCE_TABLES:
        show(f"{tables} tables: TorchRec's own plan is not among the plans {where} (its planner "
             f"takes minutes above {TORCHREC_REFERENCE_TABLES}; --strategy torchrec makes it)")
        return False
    return True


def default_dedup(profile: Optional[str]) -> bool:
    """In-batch de-duplication when neither an option nor a plan says: what the runtime does by
    default. Off under the ``torchrec`` profile (TorchRec 1.8 requests every occurrence; its
    ``use_index_dedup`` is opt-in), on under ``ideal``."""
    return (profile or "torchrec") != "torchrec"


DEDUP_HELP = ("In-batch de-duplication of IDs (recorded). Default: off under the torchrec "
              "profile (TorchRec's own default: every occurrence requested), on under ideal.")


def cost_model(recorded_model: Mapping[str, Any], dedup: bool, profile: Optional[str] = None):
    """The plan's cost model (every recorded field this version knows) with ``dedup`` and the
    execution ``profile`` as resolved (a plan recorded before profiles existed was priced
    ``ideal``; the caller resolves that default)."""
    from ..placement.cost import CostModel

    known = {f.name for f in dataclasses.fields(CostModel)}
    kept = {k: v for k, v in recorded_model.items()
            if k in known and k not in ("dedup", "profile")}
    return CostModel(**kept, dedup=bool(dedup), profile=profile or "torchrec")


def profile_label(profile: str) -> str:
    """How figures under ``profile`` are labelled ("TorchRec 1.8" or "idealized")."""
    from ..placement.profiles import execution_profile

    return execution_profile(profile).label


def plan_name(plan) -> str:
    """What a plan is, in the words of ``plan --strategy``: ``rw-hash`` for hashed row-wise (its
    plan type says ``rw``), the baseline or TorchRec's plan when FlexShard chose one unchanged
    (``tw``, ``torchrec``), else its strategy."""
    if plan.strategy == "rw" and plan.meta.get("mode") == "hash":
        return "rw-hash"
    chosen = plan.meta.get("chosen_from")
    if plan.strategy == "flexshard" and chosen in WHOLE_PLAN_NAMES:
        return str(chosen)
    return plan.strategy


#: Plans FlexShard may choose unchanged, named as ``plan --strategy`` names them.
WHOLE_PLAN_NAMES = ("rw", "rw-hash", "tw", "twrw", "cw", "twcw", "dp", "hugectr", "torchrec")


def plan_label(requested: str, plan_or_strategy) -> str:
    """``flexshard (= rw-hash)`` when FlexShard was asked for and chose a plan named otherwise;
    else the strategy asked for. ``plan_or_strategy``: the plan (:func:`plan_name` says what it
    is) or its strategy name."""
    name = plan_or_strategy if isinstance(plan_or_strategy, str) else plan_name(plan_or_strategy)
    return requested if requested == name else f"{requested} (= {name})"


def topology_name(topo) -> str:
    return topo.name or f"{topo.nodes}x{topo.gpus_per_node}"


# ============================================================================ reading logs
_TIME_LIKE = re.compile(r"(?i)^(time|timestamp|datetime|date|epoch|event_?time|"
                        r".+_(time|timestamp|ts|date|at))$")


def time_like(names: Sequence[str]) -> list[str]:
    """Feature columns whose name says sample time (``timestamp``, ``event_time``, ...): read as
    ID columns (tables) unless named ``ts``."""
    return [n for n in names if _TIME_LIKE.match(n)]


def time_column_hint(names: Sequence[str]) -> str:
    """How to keep time-like columns ``names`` out of the tables (empty when there are none)."""
    cols = time_like(names)
    if not cols:
        return ""
    return (f"{', '.join(repr(c) for c in cols)} looks like the sample time, read here as an ID "
            f"column (a table): pass --ts {cols[0]} (stats, tables, plan), rename it ts, or name "
            f"the ID columns with --features (stats, tables) and plan with the tables file "
            f"`flexshard-stream tables LOG --features A,B --out tables.toml` writes")


def warn_time_columns(names: Sequence[str]) -> None:
    """The :func:`time_column_hint` of the feature columns ``names`` as a warning, if any."""
    hint = time_column_hint(names)
    if hint:
        warn(hint)


def stderr_console():
    from rich.console import Console
    return Console(stderr=True)


def sketch_logs(paths: List[Path], features: Optional[List[str]], read_batch_size: int,
                show_progress: bool, rows: Any = None, skip_bad_rows: bool = False,
                ts_column: Optional[str] = None):
    """Sketch ``paths`` with every feature's table found on first sight; ``rows`` maps IDs to
    rows first (hash modes). Returns the StreamStats, the seconds taken and the bad rows skipped
    per reason (all zero unless ``skip_bad_rows``)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..sources.logs import LogReader
    from ..stats.stream import StreamStats

    stats = StreamStats(auto_tables=True)
    t0 = time.perf_counter()
    reader = LogReader([str(p) for p in paths], features=features,
                       read_batch_size=read_batch_size, skip_bad_rows=skip_bad_rows,
                       rows=rows, ts_column=ts_column)
    if not features:
        warn_time_columns(reader.schema.keys)
    with Progress(TextColumn("[bold]sketching[/]"), BarColumn(), TextColumn("{task.fields[ids]}"),
                  TimeElapsedColumn(), disable=not show_progress, transient=True,
                  console=stderr_console()) as prog:
        task = prog.add_task("sketch", total=None, ids="0 IDs")
        for batch in reader:
            stats.update(batch)
            prog.update(task, ids=f"{stats.ids:,} IDs")
    return stats, time.perf_counter() - t0, reader.skipped
