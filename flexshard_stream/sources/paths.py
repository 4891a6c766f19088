"""Which files a log argument names: files, directories of logs, glob patterns. Standard library
only, so the command line can refuse a missing log before it imports polars and Numba."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Iterable, Union

from ..errors import LogError

__all__ = ["PARQUET_EXT", "CSV_DELIMITERS", "log_format", "expand_log_paths"]

#: File extensions read as parquet.
PARQUET_EXT = (".parquet", ".pq")
#: File extensions read as CSV, with their delimiter.
CSV_DELIMITERS = {".csv": ",", ".tsv": "\t"}

Paths = Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]]


def log_format(path: Path) -> tuple[str, str]:
    """``("parquet", "")`` or ``("csv", delimiter)`` by the file's extension; LogError otherwise."""
    ext = path.suffix.lower()
    if ext in PARQUET_EXT:
        return "parquet", ""
    if ext in CSV_DELIMITERS:
        return "csv", CSV_DELIMITERS[ext]
    raise LogError(f"{path}: unknown log file extension {ext or '(none)'!r}; expected .parquet, "
                   f".pq, .csv or .tsv")


def expand_log_paths(paths: Paths) -> list[Path]:
    """The log files ``paths`` name, in order: a file as is, a directory's .parquet / .pq /
    .csv / .tsv files sorted, a glob pattern's matches sorted. LogError for a pattern matching
    nothing, a directory without logs, a file that does not exist or has another extension."""
    items: list[Any] = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for item in items:
        s = os.fspath(item)
        if any(ch in s for ch in "*?["):
            found = sorted(glob.glob(s))
            if not found:
                raise LogError(f"no log file matches {s!r}")
            out.extend(Path(f) for f in found)
        elif os.path.isdir(s):
            found = sorted(p for p in Path(s).iterdir()
                           if p.is_file() and p.suffix.lower() in PARQUET_EXT + tuple(CSV_DELIMITERS))
            if not found:
                raise LogError(f"{s}: directory holds no .parquet, .pq, .csv or .tsv file")
            out.extend(found)
        else:
            out.append(Path(s))
    if not out:
        raise LogError("no log files given")
    for p in out:
        log_format(p)
        if not p.is_file():
            raise LogError(f"{p}: no such log file")
    return out
