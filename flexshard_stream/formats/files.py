"""Atomic file writes and checked reads: the one helper behind every file the project writes.

Plans, plan deltas, checkpoints, exports, replay directories, snapshots and the sidecar's status
files all go through here, so a reader sees the old file or the new one, never half of one, and a
damaged or foreign file is a :class:`~flexshard_stream.errors.FormatError` naming it.

- :func:`write_atomic`: bytes to a temp file in the same folder, fsync, optional read-back check,
  rename, fsync of the folder.
- :func:`write_json` / :func:`read_json`: JSON documents (no NaN, no infinity) through the same path.
- :func:`write_npy` / :func:`read_npy`: numpy arrays as ``.npy`` files (no pickles) with the SHA-256
  a manifest records, checked on reading.
- :func:`staging_directory`: build a directory in a temp sibling and publish it with
  :func:`replace_directory` (all or nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError

__all__ = ["fsync_directory", "jsonable", "read_json", "read_npy", "replace_directory",
           "staging_directory", "write_atomic", "write_json", "write_npy"]


def fsync_directory(path: str | os.PathLike) -> None:
    """Flush a folder's entries to disk (after a rename into it); best effort where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes,
                 verify: Callable[[bytes], Any] | None = None, *, fsync: bool = True,
                 mode: int = 0o600) -> Path:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, verify, rename.

    ``verify`` is called with the bytes read back from the temp file before it replaces ``path``
    (it raises to refuse them); a failed write leaves any previous file untouched. ``fsync=False``
    skips the file and folder fsyncs (still atomic for readers, not durable across a power loss):
    for files rewritten often. ``mode``: the file's permission bits (saved state is private by
    default; configuration files a user shares pass ``0o644``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode != 0o600:
            os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if verify is not None:
            back = Path(tmp).read_bytes()
            if back != data:
                raise FormatError(f"{path}: verification failed: bytes read back differ")
            verify(back)
        os.replace(tmp, path)
        if fsync:
            fsync_directory(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def jsonable(x: Any, *, nonfinite_as_none: bool = True) -> Any:
    """``x`` with numpy scalars and arrays as Python values, tuples as lists, keys and paths as
    strings; non-finite floats become ``None`` (JSON has no NaN) unless ``nonfinite_as_none`` is
    false (then they stay floats, for digests and comparisons)."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v, nonfinite_as_none=nonfinite_as_none) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, nonfinite_as_none=nonfinite_as_none) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist(), nonfinite_as_none=nonfinite_as_none)
    if isinstance(x, np.generic):
        return jsonable(x.item(), nonfinite_as_none=nonfinite_as_none)
    if isinstance(x, float) and nonfinite_as_none and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: str | os.PathLike, doc: Any, *, fsync: bool = True, indent: int | None = 1,
               sort_keys: bool = False, allow_nonfinite: bool = False, mode: int = 0o600) -> Path:
    """Write ``doc`` (made :func:`jsonable`) as UTF-8 JSON atomically; returns the path.

    Non-finite floats become ``null``, unless ``allow_nonfinite`` (then they are written as
    ``NaN`` / ``Infinity``, Python's JSON extension, for documents whose readers expect them:
    plan metadata). ``mode``: the file's permission bits (:func:`write_atomic`).
    """
    data = json.dumps(jsonable(doc, nonfinite_as_none=not allow_nonfinite), indent=indent,
                      allow_nan=allow_nonfinite, sort_keys=sort_keys)
    return write_atomic(path, data.encode() + b"\n", fsync=fsync, mode=mode)


def read_json(path: str | os.PathLike, what: str = "JSON file", *,
              allow_nonfinite: bool = False) -> Any:
    """Read a JSON document; a missing, unreadable or malformed file is a FormatError naming it
    (``what`` says what was expected, e.g. ``"plan.json"``). ``NaN`` / ``Infinity`` are refused
    unless ``allow_nonfinite``."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file (expected a {what})") from None
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory (expected a {what})") from None
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); "
                          f"expected a {what}") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot be read ({e.strerror}); expected a {what}") from None
    try:
        return json.loads(text, parse_constant=None if allow_nonfinite else _refuse_constant)
    except (json.JSONDecodeError, ValueError) as e:
        raise FormatError(f"{path}: not valid JSON ({e}); expected a {what}") from None


def write_npy(path: str | os.PathLike, array: np.ndarray, *, fsync: bool = True,
              mode: int = 0o600) -> str:
    """Write ``array`` as a ``.npy`` file atomically (:func:`write_atomic`, no pickles); returns
    the SHA-256 (hex) of the file's bytes, for the manifest that lists it (:func:`read_npy`)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    write_atomic(path, data, fsync=fsync, mode=mode)
    return hashlib.sha256(data).hexdigest()


def read_npy(directory: str | os.PathLike, name: str, sha256: str,
             what: str = "array file") -> np.ndarray:
    """Read ``directory / name`` written by :func:`write_npy`, checking its SHA-256; ``name`` must
    be a plain file name (a manifest may not point outside its directory). A bad name, a missing,
    damaged or foreign file is a FormatError naming it (``what``: e.g. ``"remap file"``)."""
    directory = Path(directory)
    if Path(name).name != name:
        raise FormatError(f"{directory}: {what} {name!r} is not a plain name")
    path = directory / name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(f"{directory}: missing {what} {name}") from None
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise FormatError(f"{path}: checksum mismatch: the {what} is damaged")
    try:
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, EOFError) as e:
        raise FormatError(f"{path}: not a .npy {what} ({e})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def replace_directory(tmp: Path, target: Path) -> None:
    """Publish the finished directory ``tmp`` as ``target``: an existing ``target`` is moved aside
    first and removed only after the new one is in place (plan and export directories)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.replace(target, old / target.name)
    os.replace(tmp, target)
    fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staging_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp sibling of ``target`` to fill; on normal exit it replaces ``target``
    (:func:`replace_directory`), on an exception it is removed and ``target`` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
