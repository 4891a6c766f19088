"""``flexshard-stream tables``: one table per log feature, sized for the log, written as a tables
file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import FlexShardError
from ..formats.units import fmt_bytes, fmt_count, fmt_rows
from ..sources.ids import DEFAULT_HEADROOM, IdMode
from .common import (
    IDS_HELP,
    TS_HELP,
    command_hint,
    fail,
    ids_option,
    require_logs,
    say,
    sketch_logs,
    text_table,
    warn_time_columns,
    writing,
)


def _table_kinds(logs: List[Path], features: Optional[List[str]],
                 ts_column: Optional[str] = None) -> dict[str, str]:
    from ..sources.logs import inspect_log
    return dict(inspect_log([str(p) for p in logs], features, ts_column=ts_column).features)


def _print_sizing(sizing, mode: IdMode, headroom: float, samples: int, logs: List[Path]) -> None:
    """The sized tables, what each size rests on, and notes on sparse IDs."""
    t0 = sizing[0].table
    how = ("ROWS rows each" if mode.rows is not None else
           f"{headroom:g} x distinct IDs" if mode.hashed else f"{headroom:g} x (largest ID + 1)")
    say(f"tables for {', '.join(p.name for p in logs)} ({samples:,} samples): IDs {mode}, "
        f"num_rows = {how}; dim {t0.dim} {t0.dtype}")
    rows = []
    for s in sizing:
        t = s.table
        rows.append([t.name, t.kind, f"{s.lookups:,}", f"~{s.distinct[0]:,.0f}",
                     fmt_count(s.max_id), fmt_count(t.num_rows), fmt_bytes(t.table_bytes)])
    say()
    typer.echo(text_table(["table", "kind", "lookups", "distinct", "largest ID", "num_rows",
                           "size"], rows))
    if mode.hashed:
        _print_collisions(sizing)
    for s in sizing:
        if s.sparse and not mode.hashed:
            hashed = math.ceil(headroom * s.distinct[2])
            say(f"- {s.table.name}: sparse IDs (~{s.distinct[0]:,.0f} distinct up to "
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
        say(f"- {name}: about {share:.0%} of its distinct IDs share a row with another ID "
            f"(ID mod {rows:,}); a larger --headroom lowers it.")
    if shares and not big:
        say("- fewer than 0.5% of any table's distinct IDs share a row (ID mod num_rows).")


def tables_cmd(logs: List[Path] = typer.Argument(..., help="Parquet or CSV logs to size the "
                                                 "tables for."),
               out: Optional[Path] = typer.Option(None, "--out", help="Tables file (TOML) to "
                                                  "write; edit its dims and dtypes, then pass it "
                                                  "as --tables."),
               ids: Optional[str] = typer.Option(None, "--ids", callback=ids_option,
                                                 help=IDS_HELP + " With hash, num_rows comes "
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
               ts: Optional[str] = typer.Option(None, "--ts", metavar="COLUMN", help=TS_HELP),
               json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Size one table per log feature (rows, kind, dim) and write a tables file."""
    require_logs(logs)
    from ..plans.tables import save_tables, size_tables

    feats = [f.strip() for f in features.split(",") if f.strip()] if features else None
    mode = ids or IdMode()
    try:
        kinds = _table_kinds(logs, feats, ts)
        if feats is None:
            warn_time_columns(list(kinds))
        st, _, _ = sketch_logs(logs, list(kinds), 65536, show_progress=not json_out,
                               ts_column=ts)
        sizing = size_tables(st.tables, kinds, headroom=headroom, ids=mode, dim=dim,
                             dtype=dtype.lower(), optimizer_state_bytes=optimizer_state_bytes)
        if out is not None:
            with writing(out):
                save_tables([s.table for s in sizing], out,
                            notes={s.table.name: s.note() for s in sizing},
                            header=[f"Sized by flexshard-stream tables from "
                                    f"{', '.join(str(p) for p in logs)} ({st.samples:,} "
                                    f"samples); use with --ids {mode}."])
    except FlexShardError as e:
        fail(e, ("--ids",))
    if json_out:
        typer.echo(json.dumps({"out": None if out is None else str(out), "ids": str(mode),
                               "headroom": headroom, "tables": [
                                   {**s.table.to_dict(), "lookups": s.lookups,
                                    "distinct": list(s.distinct), "max_id": s.max_id,
                                    "basis": s.basis, "sparse": s.sparse,
                                    "collision_share": s.collision_share} for s in sizing]}))
        return
    _print_sizing(sizing, mode, headroom, st.samples, logs)
    say()
    if out is None:
        say("Nothing written: pass --out tables.toml to write these tables.")
    else:
        ids_flag = "" if not mode.hashed else f" --ids {mode}"
        command_hint(f"written to {out}. Next:", f"flexshard-stream plan --log LOG --tables "
                     f"{out}{ids_flag} --topology 2x8 --out plan/")
