"""Atomic file writes: a temp file in the same folder, fsync, verify, rename. The one place a file
is replaced; ``formats.files`` and ``formats.directories`` build on it (and ``files`` re-exports
both names)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FormatError

__all__ = ["fsync_directory", "write_atomic"]


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
    default; configuration files a user shares pass ``0o644``). A directory at ``path`` (or a
    file where a parent directory goes) is a ConfigError: nothing is replaced.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{path}: a parent of it is not a directory; cannot write it") from None
    if path.is_dir() and not path.is_symlink():
        raise ConfigError(f"{path}: is a directory; refusing to replace it with a file")
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
