"""The sidecar's output directory: claimed (its kind marker), checked so that another user cannot
turn it against the sidecar (owner, mode, no symlinked entries), probed for writing, and locked
(one sidecar per directory).

A sidecar often runs as root or as a service user; a directory someone else prepared (world-
writable, a ``plans`` symlink to their files, a ``.lock`` symlink to a file to create) would make
it prune, create or append through those links. Every check runs before anything is written, so a
refused directory is left as it was; the sidecar's own files are then opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from pathlib import Path

from ...errors import ConfigError
from ...formats.directories import check_output_directory, claim_directory

__all__ = ["OWN_ENTRIES", "lock_directory", "prepare_out_dir"]

#: The entries of ``out_dir`` the sidecar writes as files or folders: never a symlink.
OWN_ENTRIES = (".flexshard-kind", ".lock", "state.json", "counters.json", "decisions.jsonl",
               "plans", "deltas", "checkpoints")
#: The folders among them (checked like ``out_dir`` itself: owner and mode).
OWN_FOLDERS = ("plans", "deltas", "checkpoints")
#: The one symlink of ``out_dir``, the published plan (``plans/NNNNNN``), written by the sidecar.
PLAN_LINK = "plan"
#: What ``out_dir`` held before kind markers existed (sidecar directories of earlier releases).
LEGACY = (".lock", "state.json", "counters.json", "checkpoints")
_PLAN_TARGET = re.compile(r"plans/[0-9]{6,}")


def prepare_out_dir(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` checked, claimed (created with its marker if missing) and probed for writing:
    ConfigError naming the path and the reason when it belongs to another user, is writable by
    group or others, holds a symlink where the sidecar keeps its own files, a real directory at
    ``plan``, or when the operating system refuses the write (``cannot write PATH: reason``:
    a full disk, a read-only file system, a name too long, a file where a folder goes)."""
    out_dir = Path(out_dir)
    try:
        check_output_directory(out_dir, "sidecar", legacy=LEGACY)   # a user's: not written
        check_out_dir(out_dir)
        claim_directory(out_dir, "sidecar", legacy=LEGACY)
        _probe(out_dir)
    except OSError as e:
        raise ConfigError(f"cannot write {out_dir}: {e.strerror or e}") from None
    return out_dir


def check_out_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` (or a folder of it) another user could write into, and any symlink
    among :data:`OWN_ENTRIES` or a real directory at :data:`PLAN_LINK`; nothing is written."""
    for path in [out_dir] + [out_dir / n for n in OWN_FOLDERS]:
        _check_private(path)
    for name in OWN_ENTRIES:
        if (out_dir / name).is_symlink():
            raise ConfigError(f"{out_dir / name}: a symlink where the sidecar keeps its own "
                              f"{name}; refusing to write through it (remove it, or choose "
                              "another --out)")
    link = out_dir / PLAN_LINK
    if link.is_symlink():
        if _PLAN_TARGET.fullmatch(os.readlink(link)) is None:
            raise ConfigError(f"{link}: a symlink to {os.readlink(link)!r}, not one the sidecar "
                              "wrote (plans/NNNNNN); refusing to replace it")
    elif os.path.lexists(link):
        raise ConfigError(f"{link}: not the symlink the sidecar publishes its plan as (a real "
                          f"file or directory the sidecar did not write); move it away")


def _check_private(path: Path) -> None:
    """``path``, when it exists, is a real directory of this user that only this user can write
    into (as the ring's file: owner checked; no write bit for others, nor for a group other than
    this user's)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        return   # named by check_out_dir (a folder of its own) or check_output_directory
    if not stat.S_ISDIR(st.st_mode):
        if path.name in OWN_FOLDERS:
            raise ConfigError(f"{path}: a file where the sidecar keeps a folder of its own; "
                              "refusing to write there (remove it, or choose another --out)")
        return
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, not to this user (uid "
                          f"{os.geteuid()}); the sidecar writes only into its own directories")
    # others' write bit, or a group's that is not this user's own (a umask of 002 with a
    # private group per user leaves g+w on every directory: that group is only this user)
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid()):
        raise ConfigError(f"{path} has mode {oct(stat.S_IMODE(st.st_mode))}: others can write "
                          f"into it; the sidecar needs a directory only its owner writes "
                          f"(chmod go-w {path})")


def _probe(out_dir: Path) -> None:
    """Write, flush and remove one hidden byte in ``out_dir``: OSError when it cannot be written
    (before the ring or the threads start). A killed probe's file is a temp entry, cleaned."""
    probe = out_dir / f".probe.{os.getpid()}.tmp"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, b"\0")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


def lock_directory(out_dir: Path) -> int:
    """One sidecar per ``out_dir``: an exclusive lock on ``out_dir/.lock`` (released by the kernel
    when the process dies; never through a symlink). Returns the file descriptor to close when
    done."""
    lock = out_dir / ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(f"cannot write {lock}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(f"{out_dir} is in use by another sidecar (lock {lock} held)") from None
    return fd
