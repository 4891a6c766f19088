"""Atomic file writes and checked reads: the one helper behind every file the project writes.

Plans, plan deltas, checkpoints, exports, replay directories, snapshots and the sidecar's status
files all go through here, so a reader sees the old file or the new one, never half of one, and a
damaged or foreign file is a :class:`~flexshard_stream.errors.FormatError` naming it.

- :func:`write_atomic`: bytes to a temp file in the same folder, fsync, optional read-back check,
  rename, fsync of the folder.
- :func:`write_json` / :func:`read_json`: JSON documents (no NaN, no infinity) through the same path.
- :func:`write_npy` / :func:`read_npy`: numpy arrays as ``.npy`` files (no pickles) with the SHA-256
  a manifest records, checked on reading.
- Directories of several files (staging, publishing as versions behind an atomic pointer, the
  writer's lock, kind markers, what a writer may replace) are :mod:`.directories`'; their names
  (:func:`staging_directory`, :func:`check_output_directory`, ...) are still importable from here.

Writers never delete what they did not write. A file output replaces only a file of its own kind
(:func:`check_output_file`: a container of the same kind, a TOML file of the same kind), never a
directory, a special file or a file of anything else.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
import struct
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, FormatError
from .atomic import fsync_directory, write_atomic

__all__ = ["KIND_MARKER", "check_json_digest", "check_output_directory", "check_output_file",
           "claim_directory",
           "directory_kind", "fsync_directory", "json_digest", "jsonable", "npy_array",
           "file_stems", "read_bytes", "read_json", "read_npy", "read_npz", "replace_directory",
           "staging_directory", "write_atomic", "write_json", "write_npy"]

#: Names that live in :mod:`.directories` since directories are published as versions, still
#: importable from here (the module loads them when first asked: it imports this one).
_DIRECTORY_NAMES = frozenset({"KIND_MARKER", "VERSIONS_AREA", "check_output_directory",
                              "claim_directory", "directory_kind", "directory_lock",
                              "read_directory", "remove_output_directory", "replace_directory",
                              "resolve_directory", "staging_directory"})


def __getattr__(name: str) -> Any:
    if name in _DIRECTORY_NAMES:
        from . import directories
        return getattr(directories, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: A name that is its own file stem: letters, digits, ``_ . -``, not starting with ``.`` or ``-``.
_SAFE_STEM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
#: Longest stem (characters): with a suffix such as ``.remap_exceptions.npy`` far below the 255
#: bytes a file name may have.
MAX_STEM = 64
_HASH_CHARS = 12


def _hashed_stem(name: str) -> str:
    """``name`` made safe and short: its safe characters (others ``_``), cut, then ``-`` and 12
    hex digits of its SHA-256 (distinct names, distinct stems)."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in name)
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return f"{safe.lstrip('.-')[:MAX_STEM - _HASH_CHARS - 1]}-{digest}"


def file_stems(names: Any) -> dict[str, str]:
    """A file stem per name (table or feature names), unique even where the file system ignores
    case: a short safe name is its own stem; a long or unsafe one (``a/b``, 240 characters) is
    :func:`_hashed_stem`, and so is every name whose stem another name's would equal (``t1``
    beside an unsafe name, ``a_b`` beside ``a/b``, ``A`` beside ``a``)."""
    names = list(dict.fromkeys(names))
    stems = {n: n if len(n) <= MAX_STEM and _SAFE_STEM.fullmatch(n) else _hashed_stem(n)
             for n in names}
    while True:
        by_stem: dict[str, list[str]] = {}
        for n in names:
            by_stem.setdefault(stems[n].lower(), []).append(n)
        clash = [n for group in by_stem.values() if len(group) > 1 for n in group
                 if stems[n] != _hashed_stem(n)]
        if not clash:
            break
        for n in clash:
            stems[n] = _hashed_stem(n)
    if len({s.lower() for s in stems.values()}) != len(names):   # SHA-256 prefixes alike
        raise ConfigError(f"cannot give {len(names)} names distinct file names")
    return stems


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


def read_bytes(path: str | os.PathLike, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (symlinks followed); a missing path, a directory, a
    FIFO, a device (``/dev/zero`` would never end) or an unreadable file is a FormatError naming
    it (``what`` says what was expected, e.g. ``"statistics file"``)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file (expected a {what})") from None
    except OSError as e:
        raise FormatError(f"{path}: cannot be read ({e.strerror}); expected a {what}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise FormatError(f"{path}: is {kind} (expected a {what})")
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read()
        except OSError as e:
            raise FormatError(f"{path}: cannot be read ({e.strerror}); expected a {what}") \
                from None


def read_json(path: str | os.PathLike, what: str = "JSON file", *,
              allow_nonfinite: bool = False) -> Any:
    """Read a JSON document; a missing, unreadable or malformed file is a FormatError naming it
    (``what`` says what was expected, e.g. ``"plan.json"``). ``NaN`` / ``Infinity`` are refused
    unless ``allow_nonfinite``."""
    path = Path(path)
    raw = read_bytes(path, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); "
                          f"expected a {what}") from None
    try:
        return json.loads(text, parse_constant=None if allow_nonfinite else _refuse_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"{path}: not valid JSON ({e}); expected a {what}") from None


def json_digest(doc: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``doc`` without its ``"checksum"`` entry, as canonical JSON (sorted keys,
    no spaces; ``NaN`` / ``Infinity`` as Python writes them): what :func:`check_json_digest`
    compares. The same after a write and a read, whatever the indentation."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError, RecursionError) as e:
        raise FormatError(f"cannot digest the document ({e})") from None
    return hashlib.sha256(text.encode()).hexdigest()


def check_json_digest(doc: Mapping[str, Any], path: str | os.PathLike, what: str, *,
                      required: bool = True) -> bool:
    """Verify ``doc["checksum"]`` (:func:`json_digest`) of the document read from ``path``; a
    mismatch is a FormatError naming the file. A document without a checksum is a FormatError
    too, unless ``required`` is false (documents written before they carried one); returns
    whether a checksum was there."""
    if "checksum" not in doc and not required:
        return False
    try:
        good = doc.get("checksum") == json_digest(doc)
    except FormatError:
        good = False
    if not good:
        raise FormatError(f"{path}: checksum mismatch: the {what} is damaged or was edited")
    return True


def write_npy(path: str | os.PathLike, array: np.ndarray, *, fsync: bool = True,
              mode: int = 0o600) -> str:
    """Write ``array`` as a ``.npy`` file atomically (:func:`write_atomic`, no pickles); returns
    the SHA-256 (hex) of the file's bytes, for the manifest that lists it (:func:`read_npy`)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    write_atomic(path, data, fsync=fsync, mode=mode)
    return hashlib.sha256(data).hexdigest()


def read_npy(directory: str | os.PathLike, name: str, sha256: str, what: str = "array file", *,
             dtype: Any = None, shape: Any = None) -> np.ndarray:
    """Read ``directory / name`` written by :func:`write_npy`, checking its SHA-256; ``name`` must
    be a plain file name (a manifest may not point outside its directory). The ``.npy`` header is
    checked before any array is made (:func:`npy_array`), also against ``dtype`` (a name, e.g.
    ``"int64"``) and ``shape`` (a list) when given. A bad name, a missing, damaged or foreign file
    is a FormatError naming it (``what``: e.g. ``"remap file"``)."""
    directory = Path(directory)
    if not isinstance(name, str) or not isinstance(sha256, str) or Path(name).name != name \
            or name in ("", ".", ".."):
        raise FormatError(f"{directory}: {what} {name!r} is not a plain name (with its SHA-256)")
    path = directory / name
    if not os.path.lexists(path):
        raise FormatError(f"{directory}: missing {what} {name}")
    raw = read_bytes(path, what)
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise FormatError(f"{path}: checksum mismatch: the {what} is damaged")
    return npy_array(raw, str(path), what, dtype=dtype, shape=shape)


def read_npz(path: str | os.PathLike, what: str = "array archive") -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive written by ``np.savez`` (stored, not compressed), each
    member's ``.npy`` header checked before its array is made (:func:`npy_array`): a member may
    not claim more bytes than the archive holds. FormatError naming the file otherwise."""
    raw = read_bytes(path, what)
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            for info in z.infolist():
                name = info.filename
                if not name.endswith(".npy") or info.compress_type != zipfile.ZIP_STORED \
                        or info.file_size > len(raw) or name[:-4] in out:
                    raise FormatError(f"{path}: {what} member {name!r} is not a stored .npy "
                                      "array (or appears twice)")
                out[name[:-4]] = npy_array(z.read(info), f"{path}:{name}", what)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        if isinstance(e, FormatError):
            raise
        raise FormatError(f"{path}: damaged {what} ({type(e).__name__}: {e})") from None
    return out


#: dtype kinds a ``.npy`` file of the project may hold: booleans, integers, floats (no objects,
#: strings, structures).
_NPY_KINDS = "biuf"
_NPY_MAGIC = b"\x93NUMPY"
#: The header dictionary ``np.save`` writes (versions 1 and 2), and nothing else: parsed here,
#: never by ``ast.literal_eval`` (numpy's reader raises what its tokenizer raises on damage).
_NPY_HEADER = re.compile(
    r"\{\s*'descr'\s*:\s*'([<>|=]?[a-z]\d{1,2})'\s*,\s*'fortran_order'\s*:\s*(True|False)\s*,"
    r"\s*'shape'\s*:\s*\(\s*((?:\d{1,20}\s*,\s*)*(?:\d{1,20})?)\s*\)\s*,?\s*\}\s*")


def npy_array(raw: bytes, source: str, what: str = "array file", *, dtype: Any = None,
              shape: Any = None) -> np.ndarray:
    """The array of the ``.npy`` bytes ``raw`` (native byte order, writable). Its header is
    checked first: version, a plain numeric dtype, a shape whose size in bytes is exactly what
    follows the header (so nothing is allocated that the file does not hold), and ``dtype`` /
    ``shape`` when given. FormatError naming ``source`` otherwise."""
    got_dtype, fortran, got_shape, start = _npy_header(raw, source, what)
    count = math.prod(got_shape)
    if count * got_dtype.itemsize != len(raw) - start:
        raise FormatError(f"{source}: {what} of shape {got_shape} {got_dtype} needs "
                          f"{count * got_dtype.itemsize} bytes, the file holds "
                          f"{len(raw) - start} after its header")
    if (dtype is not None and got_dtype.name != dtype) or \
            (shape is not None and list(got_shape) != shape):
        raise FormatError(f"{source}: shape {got_shape} {got_dtype.name} does not match its "
                          f"manifest ({shape} {dtype})")
    arr = np.frombuffer(raw, got_dtype, count, start)
    arr = arr.reshape(got_shape, order="F" if fortran else "C")
    return arr.astype(got_dtype.newbyteorder("="), order="C")


def _npy_header(raw: bytes, source: str, what: str
                ) -> tuple[np.dtype, bool, tuple[int, ...], int]:
    """``(dtype, fortran_order, shape, data offset)`` of ``.npy`` bytes (versions 1 and 2: a
    little-endian header length, then the header dictionary :data:`_NPY_HEADER` matches); a plain
    numeric dtype only. FormatError otherwise."""
    if raw[:6] != _NPY_MAGIC or len(raw) < 10 or raw[6:8] not in (b"\x01\x00", b"\x02\x00"):
        raise FormatError(f"{source}: not a .npy {what} (bad magic or version {raw[6:8]!r})")
    if raw[6] == 1:
        hlen, start = struct.unpack_from("<H", raw, 8)[0], 10
    elif len(raw) < 12:
        raise FormatError(f"{source}: not a .npy {what} (truncated header)")
    else:
        hlen, start = struct.unpack_from("<I", raw, 8)[0], 12
    m = _NPY_HEADER.fullmatch(raw[start:start + hlen].decode("latin1"))
    if m is None or start + hlen > len(raw):
        raise FormatError(f"{source}: not a .npy {what} (damaged header)")
    try:
        dt = np.dtype(m.group(1))
    except TypeError:
        raise FormatError(f"{source}: {what} has an unknown dtype {m.group(1)!r}") from None
    if dt.kind not in _NPY_KINDS or dt.hasobject or dt.fields or dt.subdtype is not None:
        raise FormatError(f"{source}: {what} has dtype {dt}; expected a plain integer, float or "
                          "boolean dtype")
    shape = tuple(int(x) for x in re.findall(r"\d+", m.group(3)))
    return dt, m.group(2) == "True", shape, start + hlen


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _present(path: Path, kind: str) -> bool:
    """Whether an output file ``path`` exists (a symlink not followed); a ConfigError naming it
    when it is not a regular file (a directory, a symlink, a FIFO, a device)."""
    if not os.path.lexists(path):
        return False
    if path.is_symlink() or not path.is_file():
        raise ConfigError(f"{path}: exists and is not a regular file; refusing to replace it "
                          f"(choose another output path for the {kind} file)")
    return True


def check_output_file(path: str | os.PathLike, kind: str,
                      kind_of: Callable[[Path], str | None]) -> None:
    """Refuse to replace anything at ``path`` but a ``kind`` file: the file outputs' rule, as
    :func:`~flexshard_stream.formats.directories.check_output_directory` is the
    directories'.

    Allowed: ``path`` absent, or a regular file ``kind_of(path)`` recognizes as ``kind`` (what
    the same writer writes: a container's header kind, a TOML file's top-level key). Refused with
    a ConfigError naming the path: a directory, a symlink, a FIFO or a device, a file of another
    kind or of none (a user's CSV at a ``--save`` path). ``kind_of`` may raise OSError or
    FormatError for a file it cannot read: not of the kind.
    """
    path = Path(path)
    if not _present(path, kind):
        return
    try:
        found = kind_of(path)
    except (OSError, FormatError):
        found = None
    if found != kind:
        what = f"a {found} file" if found else "not a file flexshard_stream wrote"
        raise ConfigError(f"{path}: exists and is {what}, not a {kind} file; refusing to "
                          "replace it (choose another output path, or remove the file)")
