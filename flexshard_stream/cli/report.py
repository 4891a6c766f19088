"""``flexshard-stream report``: the HTML report and PNG pictures of a replay directory."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from ..errors import FlexShardError
from .common import fail, say


def report_cmd(directory: Path = typer.Argument(..., help="A directory written by "
                                                "`flexshard-stream replay`.")):
    """Write DIR/report.html and its PNG pictures from a replay directory (needs matplotlib)."""
    from ..report import PICTURES, build_report

    try:
        html = build_report(directory)
    except FlexShardError as e:
        fail(e)
    except OSError as e:
        fail(f"cannot write the report into {directory}: {e}")
    say(f"report written to {os.path.abspath(html)} with {len(PICTURES)} pictures: "
        + ", ".join(PICTURES))
