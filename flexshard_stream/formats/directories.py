"""Output directories: kinds, versions behind an atomic pointer, one writer at a time.

Plans, exports, replays and checkpoints are directories of several files; a reader must see the
old output or the new one, never none and never a mix. :func:`staging_directory` builds the new
one in a temporary directory and publishes it:

- **A new output** (nothing, or an empty directory, at ``PARENT/NAME``): the finished directory is
  renamed into place (``os.replace``, atomic).
- **Replacing an output** publishes a *version*: the finished directory becomes
  ``PARENT/.flexshard-versions/NAME/vNNNNNN`` (:data:`VERSIONS_AREA`, the parent's hidden area) and
  ``PARENT/NAME`` a relative symlink to it, swapped by renaming a new symlink over the old one
  (atomic on POSIX). The previous version stays until the next successful write, so a reader that
  resolved it can finish; older ones are removed (unless another symlink in ``PARENT`` still names
  one: an output moved with ``mv``).
- **An output written as a real directory** (the first write, or an earlier release) becomes a
  version on its first replacement: it is renamed into the hidden area and the symlink put in its
  place. For the instant between the two, the record ``publishing`` in the hidden area names the
  new version: readers use it, and the next writer completes the switch when a writer was killed
  there.

Readers resolve the path once (:func:`resolve_directory`) and read every file of one version;
:func:`read_directory` reads again from the new version when a write replaced the one being read.

One writer per output: ``fcntl.flock`` on ``.flexshard-versions/NAME/lock``, which holds the
writer's pid; a second writer gets a ConfigError naming the path and that pid. A writer holding the
lock first finishes an interrupted switch and removes what an interrupted writer left (its
temporary directories and links); after publishing it removes the unpublished versions and the
``.NAME.XXXXXXXX`` / ``.NAME.old.XXXXXXXX`` directories of earlier releases' interrupted writes.
The hidden area goes when it holds nothing but the lock.

Writers never delete what they did not write: every directory carries a marker file
(:data:`KIND_MARKER`, one line: its kind, e.g. ``plan``), and :func:`check_output_directory` lets a
writer replace only an absent path, an empty directory, or a directory of its own kind (its marker,
or, for directories written before markers, one of the files that kind always held) holding only
the files that kind writes (``owns``: patterns of relative paths). Anything else is a ConfigError
naming the path and what a user put there.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import ConfigError, FormatError
from .atomic import fsync_directory, write_atomic

__all__ = ["KIND_MARKER", "VERSIONS_AREA", "check_output_directory", "claim_directory",
           "directory_kind", "directory_lock", "read_directory", "remove_output_directory",
           "replace_directory", "resolve_directory", "staging_directory"]

#: The marker file of every directory the project writes: one line, the directory's kind.
KIND_MARKER = ".flexshard-kind"
#: The hidden area of a parent directory: per output ``NAME``, its lock, versions and temporaries.
VERSIONS_AREA = ".flexshard-versions"
_MARKER_MAX_BYTES = 256
_LOCK, _RECORD = "lock", "publishing"
_VERSION = re.compile(r"v[0-9]{6,12}")
#: Entries a writer makes in an output's hidden area besides versions: removed when interrupted.
_TEMP_PREFIXES = ("tmp-", "link-")
#: The temporary files :func:`~flexshard_stream.formats.files.write_atomic` makes.
_WRITE_TEMPS = (".*.tmp",)
_READ_ATTEMPTS = 8
_T = TypeVar("_T")


# ------------------------------------------------------------------------------ the hidden area
class _Area:
    """Where the versions, the lock and the temporaries of the output ``target`` live."""

    def __init__(self, target: Path):
        if target.name in ("", ".", ".."):              # "." : the working directory, by name
            target = Path(os.path.abspath(target))
        if target.name in ("", VERSIONS_AREA):
            raise ConfigError(f"{target}: not a name an output directory can have (choose a "
                              f"named path, not {VERSIONS_AREA!r} or the root)")
        self.target = target
        self.parent = target.parent
        self.root = self.parent / VERSIONS_AREA
        self.dir = self.root / target.name
        self.lock = self.dir / _LOCK
        self.record = self.dir / _RECORD

    def version(self, name: str) -> Path:
        return self.dir / name

    def link_text(self, name: str) -> str:
        """The pointer's target, relative to the parent (the tree can be moved whole)."""
        return f"{VERSIONS_AREA}/{self.target.name}/{name}"


def _real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (not a symlink to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _pointer_version(target: Path) -> str | None:
    """The version named by the pointer at ``target``; None when ``target`` is not a symlink
    into its own hidden area (a real directory, a user's symlink, nothing)."""
    try:
        text = os.readlink(target)
    except (OSError, ValueError):
        return None
    prefix = f"{VERSIONS_AREA}/{target.name}/"
    name = text[len(prefix):] if text.startswith(prefix) else ""
    return name if _VERSION.fullmatch(name) else None


def _pending_version(target: Path) -> str | None:
    """The version the ``publishing`` record of ``target``'s hidden area names (a switch from a
    real directory under way, or interrupted), when it is a well-formed name of an existing
    version directory; None otherwise (no record, or a damaged one: never a path elsewhere)."""
    record = target.parent / VERSIONS_AREA / target.name / _RECORD
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        name = os.read(fd, 64).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    if _VERSION.fullmatch(name) and _real_dir(record.parent / name):
        return name
    return None


# ------------------------------------------------------------------------------ readers
def resolve_directory(path: str | os.PathLike) -> Path:
    """The directory to read the output at ``path`` from, resolved once: the version a pointer
    names, the new version while a real directory is being switched to one, the real path of a
    user's symlink, else ``path`` itself (a real directory, or nothing: the reader then says what
    is missing). Read every file of an output from what this returns, never through ``path``
    again (a writer may replace it in between)."""
    path = Path(path)
    for _ in range(3):
        name = _pointer_version(path)
        if name is not None:
            version = path.parent / VERSIONS_AREA / path.name / name
            return version if _real_dir(version) else path
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            name = _pending_version(path) if path.name else None
            if name is not None:
                return path.parent / VERSIONS_AREA / path.name / name
            if not os.path.lexists(path):
                return path
            continue                                  # it appeared meanwhile: look again
        except (OSError, ValueError):
            return path
        if not stat.S_ISLNK(mode):
            return path
        if _pointer_version(path) is None:
            return Path(os.path.realpath(path))
    return path


def read_directory(path: str | os.PathLike, read: Callable[[Path], _T]) -> _T:
    """``read(directory)`` of the output at ``path`` (:func:`resolve_directory`); when it raises a
    FormatError and ``path`` meanwhile resolves elsewhere (a writer replaced the version being
    read and removed it), read again from the new one, a few times. Any other FormatError is
    raised as it is."""
    path = Path(path)
    attempts = 0
    while True:
        directory = resolve_directory(path)
        try:
            return read(directory)
        except FormatError:
            attempts += 1
            if attempts == _READ_ATTEMPTS or resolve_directory(path) == directory:
                raise
        time.sleep(0.001 * attempts)


# -------------------------------------------------------------------------- what may be replaced
def directory_kind(path: str | os.PathLike) -> str | None:
    """The kind named by the marker of directory ``path`` (:data:`KIND_MARKER`); None when there
    is no marker or it is not a small regular file of one line of text."""
    marker = Path(path) / KIND_MARKER
    try:
        st = marker.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MARKER_MAX_BYTES:
            return None
        return marker.read_bytes().decode("utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _output_now(target: Path, kind: str) -> Path | None:
    """The directory holding what is published at ``target`` now (a version, the real directory,
    the version a switch under way publishes); None when nothing is (or a pointer of ours whose
    version is gone: replaced like nothing). A ConfigError naming ``target`` when it is not a
    directory: a file, a user's symlink, a device."""
    name = _pointer_version(target)
    if name is not None:
        version = target.parent / VERSIONS_AREA / target.name / name
        return version if _real_dir(version) else None
    if not os.path.lexists(target):
        name = _pending_version(target) if target.name else None
        return None if name is None else target.parent / VERSIONS_AREA / target.name / name
    if target.is_symlink() or not target.is_dir():
        raise ConfigError(f"{target}: exists and is not a directory; refusing to replace it "
                          f"(choose another output path for the {kind} directory)")
    return target


def check_output_directory(target: str | os.PathLike, kind: str, *,
                           legacy: tuple[str, ...] = (),
                           owns: tuple[str, ...] | None = None) -> None:
    """Refuse to write a ``kind`` directory at ``target`` unless nothing a user owns is there.

    Allowed: ``target`` absent, an empty directory, or a directory of this kind (its marker says
    ``kind``; or it has no marker and holds one of the ``legacy`` entries, what directories of
    this kind held before markers existed) that holds only what this kind writes: ``owns``, the
    patterns (``fnmatch``, on relative POSIX paths; ``"plans/*"`` is a whole folder) of its files
    (None: anything in a directory of this kind). A published version is checked through its
    pointer. Refused with a ConfigError naming the path: a file (or a user's symlink, a device,
    ...), a directory of another kind, any other non-empty directory, and a directory of this kind
    holding a file the user put there (named in the message: replacing it would delete it).
    """
    target = Path(target)
    current = _output_now(target, kind)
    if current is None:
        return
    found = directory_kind(current)
    if found is not None and found != kind:
        raise ConfigError(f"{target}: holds a flexshard_stream {found} directory, not a {kind} "
                          "directory; refusing to replace it (choose another output path)")
    if found is None and not (legacy and any(os.path.lexists(current / n) for n in legacy)):
        if any(current.iterdir()):
            raise ConfigError(f"{target}: a non-empty directory that is not a {kind} directory "
                              f"(no {KIND_MARKER} marker saying {kind!r}: flexshard_stream did "
                              "not write it); refusing to write into it: choose another output "
                              "path, or an empty or new directory")
        return
    if owns is not None:
        _refuse_strangers(target, current, kind, owns)


def _owned(rel: str, owns: tuple[str, ...]) -> bool:
    return rel == KIND_MARKER or any(fnmatch.fnmatchcase(rel, p) for p in owns)


def _strangers(directory: Path, owns: tuple[str, ...], prefix: str = "") -> list[str]:
    """The entries under ``directory`` (relative paths; a folder with a trailing ``/``) that no
    pattern of ``owns`` covers: what a user put there. A folder is covered whole when
    ``folder/`` matches a pattern, looked into when a pattern starts with ``folder/``."""
    out: list[str] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return [prefix or "./"]
    for e in entries:
        rel = prefix + e.name
        if not e.is_dir(follow_symlinks=False):
            if not _owned(rel, owns):
                out.append(rel)
        elif not _owned(rel + "/", owns):
            if any(p.startswith(rel + "/") for p in owns):
                out += _strangers(Path(e.path), owns, rel + "/")
            else:
                out.append(rel + "/")
    return out


def _refuse_strangers(target: Path, current: Path, kind: str, owns: tuple[str, ...]) -> None:
    strangers = _strangers(current, owns)
    if not strangers:
        return
    shown = ", ".join(strangers[:5]) + (f" and {len(strangers) - 5} more"
                                        if len(strangers) > 5 else "")
    them = "it" if len(strangers) == 1 else "them"
    raise ConfigError(f"{target}: holds {shown}, which flexshard_stream did not write; refusing "
                      f"to replace the {kind} directory (that would delete {them}): move {them} "
                      "elsewhere, or choose another output path")


def _write_marker(directory: Path, kind: str) -> None:
    write_atomic(directory / KIND_MARKER, kind.encode("utf-8") + b"\n", fsync=False,
                 mode=0o644)


def claim_directory(target: str | os.PathLike, kind: str, *,
                    legacy: tuple[str, ...] = ()) -> Path:
    """Make ``target`` a ``kind`` directory to write into (a long-lived output such as the
    sidecar's): :func:`check_output_directory`, then create it and its marker if missing."""
    target = Path(target)
    check_output_directory(target, kind, legacy=legacy)
    target.mkdir(parents=True, exist_ok=True)
    if directory_kind(target) != kind:
        _write_marker(target, kind)
    return target


# ------------------------------------------------------------------------------ the writer's lock
def _make_area(area: _Area) -> None:
    """Create the hidden area of ``area.target`` (and the parent); ConfigError when something
    that is not a directory is in the way. FileNotFoundError when a writer of a sibling removed
    the area meanwhile (the caller tries again)."""
    try:
        area.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{area.target}: a parent of it is not a directory; cannot write "
                          "it") from None
    for d in (area.root, area.dir):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
        if not _real_dir(d):
            raise ConfigError(f"{d}: is not a directory (flexshard_stream keeps the versions and "
                              f"the writer lock of {area.target} there); refusing to write "
                              f"{area.target}: remove or rename {d}")


def _holder(fd: int) -> str:
    """Who holds the lock ``fd`` is open on: ``pid N`` as its holder wrote it."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return f"pid {text}"
    return "pid unknown"


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _try_lock(area: _Area) -> int | None:
    """One attempt at the lock: its descriptor, or None when the lock file went away meanwhile."""
    try:
        _make_area(area)
        fd = os.open(area.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot write {area.target}: {e.strerror} (opening its writer lock "
                          f"{area.lock})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{area.lock}: the writer lock of {area.target} is not a regular "
                              "file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{area.target}: another process ({_holder(fd)}) is writing it "
                              f"(lock {area.lock}); refusing to write it at the same time: wait "
                              "for it to finish, or choose another output path") from None
        except OSError as e:
            raise ConfigError(f"{area.target}: cannot lock {area.lock} ({e.strerror})") from None
        if not _same_file(fd, area.lock):               # removed by its last holder: again
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def _acquire(area: _Area) -> int:
    for _ in range(16):
        fd = _try_lock(area)
        if fd is not None:
            return fd
    raise ConfigError(f"{area.target}: its writer lock {area.lock} keeps disappearing; "
                      "try again")


def _release(area: _Area, fd: int) -> None:
    """Unlock; the hidden area goes when nothing but the lock is left in it (the lock file is
    removed while still held: a writer that opened it meanwhile sees it gone and starts over)."""
    try:
        if sorted(os.listdir(area.dir)) == [_LOCK]:
            os.unlink(area.lock)
            with contextlib.suppress(OSError):
                os.rmdir(area.dir)
                os.rmdir(area.root)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """Remove ``path`` (a directory's tree, or a file or symlink itself), quietly."""
    if _real_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _recover(area: _Area) -> None:
    """Finish a switch from a real directory that a killed writer left half done (the pointer
    missing, the record naming the new version), then drop the record."""
    if not os.path.lexists(area.record):
        return
    name = _pending_version(area.target)
    if name is not None and not os.path.lexists(area.target):
        _link(area, name)
    _remove(area.record)
    fsync_directory(area.dir)


def _remove_temporaries(area: _Area) -> None:
    """What an interrupted writer left in the hidden area: temporary directories, links and
    files."""
    for e in os.scandir(area.dir):
        if e.name.startswith(_TEMP_PREFIXES) or (e.name.startswith(".")
                                                 and e.name.endswith(".tmp")):
            _remove(Path(e.path))


@contextlib.contextmanager
def _writing(target: Path) -> Iterator[_Area]:
    area = _Area(target)
    fd = _acquire(area)
    try:
        _recover(area)
        _remove_temporaries(area)
        yield area
    finally:
        _release(area, fd)


@contextlib.contextmanager
def directory_lock(target: str | os.PathLike) -> Iterator[Path]:
    """Hold the writer's lock of the output directory ``target`` for the block (the one every
    writer of ``target`` takes): ConfigError naming ``target`` and the holder's pid when another
    process holds it. On entry an interrupted writer's leftovers are cleaned up. Yields the
    directory to write into (:func:`resolve_directory`): for a writer that adds files to a
    published output, as ``report`` adds its pictures to a replay directory."""
    with _writing(Path(target)):
        yield resolve_directory(target)


# ------------------------------------------------------------------------------ publishing
def _link(area: _Area, name: str) -> None:
    """Point ``area.target`` at version ``name``: a new symlink renamed over the old one."""
    tmp = area.dir / f"link-{os.getpid()}-{secrets.token_hex(4)}"
    os.symlink(area.link_text(name), tmp)
    try:
        os.replace(tmp, area.target)
    except BaseException:
        _remove(tmp)
        raise
    fsync_directory(area.parent)


def _next_version(area: _Area, current: str | None) -> int:
    numbers = [int(e.name[1:]) for e in os.scandir(area.dir) if _VERSION.fullmatch(e.name)]
    if current is not None:
        numbers.append(int(current[1:]))
    return max(numbers, default=0) + 1


def _linked_versions(area: _Area) -> set[str]:
    """Versions some symlink in the parent names (the pointer, or an output moved with ``mv``)."""
    prefix = f"{VERSIONS_AREA}/{area.target.name}/"
    out = set()
    with contextlib.suppress(OSError):
        for e in os.scandir(area.parent):
            if e.is_symlink():
                with contextlib.suppress(OSError):
                    text = os.readlink(e.path)
                    if text.startswith(prefix):
                        out.add(text[len(prefix):])
    return out


def _prune(area: _Area, keep: set[str]) -> None:
    """Remove every version but ``keep`` and those a symlink in the parent names."""
    keep = keep | _linked_versions(area)
    for e in os.scandir(area.dir):
        if _VERSION.fullmatch(e.name) and e.name not in keep:
            _remove(Path(e.path))


def _remove_old_release_leftovers(area: _Area, owns: tuple[str, ...] | None) -> None:
    """The directories an interrupted write of an earlier release left beside the output: the
    old output moved aside (``.NAME.old.XXXXXXXX/NAME``) and the new one being built
    (``.NAME.XXXXXXXX``, only when it holds nothing but what the writer writes: ``owns``)."""
    name = area.target.name
    pattern = re.compile(re.escape(f".{name}.") + r"(old\.)?[a-z0-9_]{8}")
    for e in list(os.scandir(area.parent)):
        m = pattern.fullmatch(e.name)
        if m is None or not e.is_dir(follow_symlinks=False):
            continue
        p = Path(e.path)
        if m.group(1):
            inside = os.listdir(p)
            ours = inside == [] or (inside == [name] and _real_dir(p / name))
        else:
            ours = owns is not None and not _strangers(p, owns + _WRITE_TEMPS)
        if ours:
            _remove(p)


def _empty_or_absent(target: Path) -> bool:
    if not os.path.lexists(target):
        return True
    try:
        return _real_dir(target) and not any(os.scandir(target))
    except OSError:
        return False


def _publish(area: _Area, tmp: Path, owns: tuple[str, ...] | None) -> None:
    """Publish the finished directory ``tmp`` (on the parent's file system) at ``area.target``;
    the caller holds the lock and has checked what is there."""
    target, current = area.target, _pointer_version(area.target)
    try:
        if current is None and _empty_or_absent(target):
            os.replace(tmp, target)                    # a new directory: one rename
            fsync_directory(area.parent)
            keep: set[str] = set()
        else:
            n = _next_version(area, current)
            real = current is None                      # a real directory: becomes version n
            new = f"v{n + 1 if real else n:06d}"
            os.replace(tmp, area.version(new))
            fsync_directory(area.dir)
            if real:
                current = f"v{n:06d}"
                write_atomic(area.record, new.encode() + b"\n")
                os.replace(target, area.version(current))
                _link(area, new)
                os.unlink(area.record)
                fsync_directory(area.dir)
            else:
                _link(area, new)
            keep = {current, new}
    except OSError as e:
        raise ConfigError(f"{target}: cannot publish the new directory ({e.strerror or e}); "
                          "the previous output stays readable") from None
    _prune(area, keep)
    _remove_old_release_leftovers(area, owns)


@contextlib.contextmanager
def staging_directory(target: str | os.PathLike, *, kind: str, legacy: tuple[str, ...] = (),
                      owns: tuple[str, ...] | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory to fill; on normal exit it gets the ``kind`` marker and
    is published at ``target`` (a new directory, or a new version behind the pointer: see the
    module), on an exception it is removed and ``target`` is untouched. ``target`` must pass
    :func:`check_output_directory` with ``legacy`` and ``owns`` (checked before anything is made,
    and again just before publishing); the writer's lock is held throughout (a second writer
    of ``target`` gets a ConfigError)."""
    target = Path(target)
    check_output_directory(target, kind, legacy=legacy, owns=owns)
    with _writing(target) as area:
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIXES[0]}{os.getpid()}-", dir=area.dir))
        try:
            yield tmp
            _write_marker(tmp, kind)
            check_output_directory(target, kind, legacy=legacy, owns=owns)
            _publish(area, tmp, owns)
        except BaseException:
            _remove(tmp)
            raise


def replace_directory(tmp: Path, target: Path) -> None:
    """Publish the finished directory ``tmp`` (on the file system of ``target``'s parent) at
    ``target``, as :func:`staging_directory` does, under the writer's lock. No check of what is
    at ``target``: the caller has made it (:func:`check_output_directory`)."""
    with _writing(Path(target)) as area:
        _publish(area, Path(tmp), None)


def remove_output_directory(target: str | os.PathLike) -> None:
    """Remove the output directory ``target`` a writer of the project published, with its
    versions (under the writer's lock: ConfigError while another process writes it). Nothing
    happens when ``target`` is absent; a version another symlink in the parent names stays."""
    target = Path(target)
    if not os.path.lexists(target) and not _real_dir(_Area(target).dir):
        return
    with _writing(target) as area:
        if _pointer_version(target) is not None:
            os.unlink(target)
            fsync_directory(area.parent)
        elif _real_dir(target):
            shutil.rmtree(target, ignore_errors=True)
        _prune(area, set())
