"""The binary container of saved state: magic, version, JSON header, raw arrays, checksum.

Layout (little endian)::

    b"FSSTREAM"                      8 bytes magic
    u16 format version, u16 0        4 bytes
    u64 header length H              8 bytes
    header: UTF-8 JSON               H bytes  {"kind", "meta", "arrays": [{name, dtype, shape, offset}]}
    payload: arrays, 8-byte aligned
    u32 CRC-32 of all of the above, b"FSEND\\0\\0\\0"

Nothing is unpickled: arrays are read with an explicit dtype from an allow-list. Files are written
atomically (temp file, fsync, rename) and read back to verify before the rename; a file written
with a kind replaces only a container of that kind (:func:`check_output_file`).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import FormatError
from . import files
from .files import replace_directory

MAGIC = b"FSSTREAM"
END = b"FSEND\0\0\0"
VERSION = 1
_DTYPES = {"int64", "uint64", "uint32", "uint8", "int32", "float64", "float32"}
_MAX_BYTES = 1 << 48          # no array of a state file is this large; larger numbers are damage

__all__ = ["check_output_file", "header_kind", "pack", "unpack", "write_atomic", "read_file",
           "replace_directory"]
#: Longest header :func:`check_output_file` reads to tell a file's kind (bytes).
_MAX_PEEK = 64 << 20


def pack(kind: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialize ``meta`` (JSON-able) and named numpy arrays into one checksummed blob."""
    entries, blobs, off = [], [], 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.name not in _DTYPES:
            raise TypeError(f"array {name!r}: dtype {a.dtype} not serializable")
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        entries.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape),
                        "offset": off, "nbytes": len(raw)})
        pad = (-len(raw)) % 8
        blobs.append(raw + b"\0" * pad)
        off += len(raw) + pad
    header = json.dumps({"kind": kind, "meta": meta, "arrays": entries},
                        separators=(",", ":")).encode()
    body = MAGIC + struct.pack("<HHQ", VERSION, 0, len(header)) + header + b"".join(blobs)
    return body + struct.pack("<I", zlib.crc32(body)) + END


def unpack(data: bytes, kind: str, source: str = "<bytes>") -> tuple[dict, dict[str, np.ndarray]]:
    """Verify and decode a blob made by :func:`pack`; ``kind`` must match. Raises FormatError."""
    mv = memoryview(data)
    if len(data) < 8 or bytes(mv[:8]) != MAGIC:
        raise FormatError(f"{source}: not a flexshard_stream state file (bad magic "
                          f"{bytes(mv[:8])!r}, expected {MAGIC!r})")
    if len(data) < 20 + 12:
        raise FormatError(f"{source}: truncated ({len(data)} bytes)")
    version, _, hlen = struct.unpack_from("<HHQ", data, 8)
    if version != VERSION:
        raise FormatError(f"{source}: format version {version} is not supported "
                          f"(this flexshard_stream reads version {VERSION})")
    if bytes(mv[-8:]) != END:
        raise FormatError(f"{source}: truncated or damaged (end marker missing)")
    body_len = len(data) - 12
    (crc,) = struct.unpack_from("<I", data, body_len)
    if zlib.crc32(mv[:body_len]) != crc:
        raise FormatError(f"{source}: checksum mismatch: the file is damaged")
    if 20 + hlen > body_len:
        raise FormatError(f"{source}: header length {hlen} exceeds the file")
    header = _parse_header(bytes(mv[20:20 + hlen]), kind, source)
    base = 20 + hlen
    arrays: dict[str, np.ndarray] = {}
    for i, e in enumerate(header["arrays"]):
        name, dt, shape, start, n = _array_entry(e, i, base, body_len, source)
        if name in arrays:
            raise FormatError(f"{source}: array {name!r} appears twice in the header")
        arrays[name] = np.frombuffer(data, dtype=np.dtype(dt).newbyteorder("<"),
                                     count=n // np.dtype(dt).itemsize,
                                     offset=start).astype(dt).reshape(shape)
    return header["meta"], arrays


def _json_header(raw: bytes, source: str) -> dict:
    """The JSON header as an object (no NaN or infinity); FormatError otherwise."""
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"{source}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{source}: header must be a JSON object, got "
                          f"{type(header).__name__}")
    return header


def header_kind(data: bytes, source: str = "<bytes>") -> str:
    """The kind a container's header names, read without verifying the checksum (to dispatch
    on it; :func:`unpack` verifies). FormatError when ``data`` does not start like a container."""
    if len(data) < 20 or bytes(data[:8]) != MAGIC:
        raise FormatError(f"{source}: not a flexshard_stream state file (bad magic "
                          f"{bytes(data[:8])!r}, expected {MAGIC!r})")
    (hlen,) = struct.unpack_from("<Q", data, 12)
    if 20 + hlen > len(data):
        raise FormatError(f"{source}: header length {hlen} exceeds the file")
    kind = _json_header(bytes(data[20:20 + hlen]), source).get("kind")
    if not isinstance(kind, str):
        raise FormatError(f"{source}: header field 'kind' must be a string, got {kind!r}")
    return kind


def check_output_file(path: str | os.PathLike, kind: str) -> None:
    """Refuse to replace anything at ``path`` but a container of ``kind`` (what the same writer
    wrote): :func:`.files.check_output_file` with the kind a container's header names."""
    files.check_output_file(path, kind, _container_kind)


def _container_kind(path: Path) -> str:
    """The kind in the header of the container at ``path`` (reading the header only)."""
    with open(path, "rb") as f:
        head = f.read(20)
        hlen = struct.unpack_from("<Q", head, 12)[0] if len(head) == 20 else 0
        return header_kind(head + f.read(min(hlen, _MAX_PEEK)), str(path))


def _parse_header(raw: bytes, kind: str, source: str) -> dict:
    """The JSON header, checked for shape: an object with ``kind`` (the expected one), ``meta`` (an
    object) and ``arrays`` (a list). Anything else is a FormatError naming the field."""
    header = _json_header(raw, source)
    if header.get("kind") != kind:
        raise FormatError(f"{source}: holds {header.get('kind')!r}, expected {kind!r}")
    if not isinstance(header.get("meta"), dict):
        raise FormatError(f"{source}: header field 'meta' must be an object, got "
                          f"{type(header.get('meta')).__name__}")
    if not isinstance(header.get("arrays", []), list):
        raise FormatError(f"{source}: header field 'arrays' must be a list")
    header.setdefault("arrays", [])
    return header


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _header_int(e: Mapping[str, Any], key: str, i: int, source: str) -> int:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > _MAX_BYTES:
        raise FormatError(f"{source}: array entry {i} field {key!r} must be an integer in "
                          f"[0, {_MAX_BYTES}], got {v!r}")
    return v


def _array_entry(e: Any, i: int, base: int, body_len: int,
                 source: str) -> tuple[str, str, tuple[int, ...], int, int]:
    """Validate one array entry of the header against the bytes present: (name, dtype, shape,
    start offset, byte count)."""
    if not isinstance(e, dict):
        raise FormatError(f"{source}: array entry {i} must be an object")
    name, dt = e.get("name"), e.get("dtype")
    if not isinstance(name, str):
        raise FormatError(f"{source}: array entry {i} has no string 'name'")
    if not isinstance(dt, str) or dt not in _DTYPES:
        raise FormatError(f"{source}: array {name!r} has unsupported dtype {dt!r}")
    shape = e.get("shape")
    if (not isinstance(shape, list) or len(shape) > 8
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in shape)):
        raise FormatError(f"{source}: array {name!r} has an invalid shape {shape!r} (a list of at "
                          f"most 8 non-negative integers)")
    offset = _header_int(e, "offset", i, source)
    nbytes = _header_int(e, "nbytes", i, source)
    count = 1
    for x in shape:
        count *= x
        if count * np.dtype(dt).itemsize > body_len:
            raise FormatError(f"{source}: array {name!r} of shape {shape} does not fit the file "
                              f"({body_len} bytes)")
    n = count * np.dtype(dt).itemsize
    start = base + offset
    if n != nbytes or start + n > body_len:
        raise FormatError(f"{source}: array {name!r} does not fit the file (offset {offset}, "
                          f"{nbytes} bytes declared, {n} by its shape, {body_len - base} present)")
    return name, dt, tuple(shape), start, n


def write_atomic(path: str | os.PathLike, data: bytes, verify_kind: str | None = None, *,
                 fsync: bool = True) -> Path:
    """Write ``data`` atomically (:func:`.files.write_atomic`); with ``verify_kind`` an existing
    ``path`` must be a container of that kind (:func:`check_output_file`), and the bytes read
    back are decoded as a container of that kind before they replace it."""
    if verify_kind is not None:
        check_output_file(path, verify_kind)
    verify = None if verify_kind is None else (lambda back: unpack(back, verify_kind, str(path)))
    return files.write_atomic(path, data, verify, fsync=fsync)


def read_file(path: str | os.PathLike, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and verify a container file. Raises FormatError naming the file (also when it is
    missing or not a regular file: :func:`.files.read_bytes`)."""
    return unpack(files.read_bytes(path, f"{kind} file"), kind, str(path))
