"""Shared-memory ring: :class:`Batch`es from several producer processes to one consumer.

Producers are, in real use, PyTorch DataLoader workers; the consumer is the statistics sidecar::

    ring = Ring.create("train", slots=8, capacity_bytes=64 << 20)  # sidecar (or trainer)
    producer = ring.producer(lazy=True)      # pass to the Dataset; each worker claims a slot
    producer.submit(Batch.from_kjt(kjt))     # in a worker: True, or False if dropped (counted)
    for batch in ring.poll(timeout=0.1):     # in the sidecar
        stats.update(batch)
    ring.stats().total.batches_dropped

Design
------
One file (by default ``/dev/shm/flexshard-ring-<name>``, mode 0600, owner checked on attach) holds
one single-producer/single-consumer byte ring per *slot*. A producer claims a free slot with a
Linux open-file-description lock (``F_OFD_SETLK``) on byte ``1 + slot`` of the file; the consumer
holds byte ``0``. The kernel drops these locks when the process dies (also on ``kill -9``), so a
dead producer's slot can be claimed again: the new owner continues after the last *published*
record, and the records the dead producer published are still drained. Each slot has exactly one
writer (its owner) and one reader (the consumer), so no compare-and-swap is needed.

* ``submit`` never waits by default: a record that does not fit in the free space is dropped and
  counted (batches, IDs, bytes) in the slot's counters; ``block=True`` waits (with an optional
  timeout) instead. A record larger than a slot is an error (:class:`RecordTooLargeError`).
* A producer killed mid-write leaves bytes beyond the published write index: invisible to the
  consumer and overwritten by the next owner of the slot. A consumer killed mid-poll leaves the read
  index after the last record it fully copied out: the next consumer continues there, so no record
  is delivered twice (records handed to the dead consumer's Python code are lost with it).
* Memory is fixed at creation (``posix_fallocate``): ``capacity_bytes`` plus a small header, no
  matter how far the consumer falls behind. Reserving it up front also turns a full tmpfs into a
  clean error at creation instead of a SIGBUS in a producer.

Layout (little endian; offsets in bytes)
----------------------------------------
::

    0     header (one page, 4096 bytes or more)
          0   8s   magic b"FSSHMRNG"
          8   u32  format version (1)          12  u32  data offset D (page multiple)
          16  u32  slots S                     20  u32  flags (bit 0: producers write CRC-32)
          24  u64  slot capacity C (bytes, page multiple)
          32  u64  file size = D + S * C       40  u64  ring id (random, tells rings apart)
          48  u64  owner uid                   56  f64  created (unix seconds)
          64  u32  control offset (256)        68  u32  control stride (256)
          72  u32  CRC-32 of bytes [0, 72)
          128 u64  consumer pid                136 u64  consumer attaches
    256   control block of slot i at 256 + 256 * i, 32 u64 words:
          producer line   0 write index (bytes, monotonic)   1 next record seq
                          2 batches written  3 IDs written   4 batches dropped
                          5 IDs dropped      6 bytes dropped
          producer (cold) 8 owner pid        9 claims (times the slot was taken)
          consumer line  16 read index (bytes, monotonic)   17 batches read  18 IDs read
                         19 records discarded (damaged)     20 bytes discarded
    D + i * C   data of slot i: records back to back, wrapping at C

    record = 64-byte header + body, padded to a multiple of 64 bytes (so a header never wraps;
    the body may wrap at the end of the slot):
          u32 tag b"FSRC"   u32 flags (1 weights, 2 timestamp, 4 crc)
          u64 record bytes  u64 seq (per slot, continues across owners)
          u32 keys          u32 key-table bytes   u64 lengths   u64 values
          u32 timestamps    u32 CRC-32 (header with crc 0, then body)   f64 submit time (unix s)
    body  = key table (per key: u32 length + UTF-8, padded to 8) | lengths int64 | values int64
            | weights float32 (padded to 8) | timestamps float64

What this relies on (memory ordering)
-------------------------------------
A record is copied in first, the slot's 8-byte write index is stored last; the consumer loads the
write index first, copies the record out, then stores the 8-byte read index. Index words are
8-byte aligned (the mapping is page aligned). Python has no memory barriers, so the index stores
and loads are done by two tiny functions compiled at first use with llvmlite (already installed
with Numba): ``fence seq_cst`` then ``store atomic release``; and ``load atomic acquire``; called
through ctypes (about 0.2 us each). That is correct on any architecture LLVM supports (x86-64,
AArch64, ...). If llvmlite cannot build them, plain aligned 8-byte ctypes stores/loads are used,
which is correct on x86-64 (TSO: stores are seen in program order, loads are not reordered with
older loads; the stores of glibc's non-temporal ``memcpy`` path end with ``sfence``) but not on
weakly ordered CPUs; :func:`memory_ordering` tells which is in use. The compiler cannot move the copies
across the index accesses: they are separate opaque C calls.

Also relied on: Linux (``F_OFD_SETLK`` locks, ``/dev/shm``), a 64-bit little-endian host, and that
nothing else writes into the file (the consumer checks record framing and discards, counts and
warns about damaged records rather than crashing; ``checksum=True`` also verifies every body).
A :class:`Producer` is for one process: after ``fork`` the child claims a slot of its own on its
first ``submit``; pickling it (``spawn`` workers) gives an unclaimed producer that does the same.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import re
import secrets
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, FlexShardError, FormatError
from ..stats.batch import Batch

__all__ = ["Producer", "RecordTooLargeError", "Ring", "RingBusyError",
           "RingCorruptionWarning", "RingError", "RingFormatError", "RingPermissionError",
           "RingRecord", "RingStats", "SlotStats", "memory_ordering", "ring_path",
           "ring_throughput"]

# ------------------------------------------------------------------------------------ errors


class RingError(FlexShardError):
    """A ring cannot be created, attached or used as asked."""


class RingBusyError(RingError):
    """No free producer slot, or the ring already has a live consumer."""


class RingPermissionError(RingError, PermissionError):
    """The ring file belongs to another user, is accessible to others, or is not a plain file."""


class RingFormatError(RingError, FormatError):
    """The ring file is damaged, foreign, or of an unknown version. Nothing was attached."""


class RecordTooLargeError(RingError, ValueError):
    """A batch does not fit in one ring slot even when the slot is empty. Nothing was written."""


class RingCorruptionWarning(RuntimeWarning):
    """The consumer found damaged records and discarded (and counted) them."""


# ------------------------------------------------------------------------------------ layout

MAGIC = b"FSSHMRNG"
VERSION = 1
PAGE = 4096
MAX_SLOTS = 1024
PREFIX = "flexshard-ring-"
_HDR = struct.Struct("<8sIIIIQQQQdII")  # up to byte 72
_HDR_CRC = 72
_W_CONSUMER_PID, _W_CONSUMER_ATTACHES = 16, 17  # u64 words of the header
_CTRL_OFF, _CTRL_STRIDE, _CTRL_WORDS = 256, 256, 32
(P_WRITE, P_NEXT_SEQ, P_BATCHES, P_IDS, P_DROP_BATCHES, P_DROP_IDS, P_DROP_BYTES) = range(7)
P_OWNER, P_CLAIMS = 8, 9
C_READ, C_BATCHES, C_IDS, C_DISC_RECORDS, C_DISC_BYTES = 16, 17, 18, 19, 20
_REC = struct.Struct("<IIQQIIQQIId")
assert _REC.size == 64
_TAG = int.from_bytes(b"FSRC", "little")
F_WEIGHTS, F_TIMESTAMP, F_CRC = 1, 2, 4
_RING_CRC = 1
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")
_FLOCK = "@hhqqi0q"  # struct flock on 64-bit Linux: type, whence, start, len, pid (+ padding)


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _euid() -> int:
    return os.geteuid()


def _default_directory() -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    import tempfile
    return Path(tempfile.gettempdir())


def ring_path(name: str, directory: str | os.PathLike | None = None) -> Path:
    """The file of ring ``name``: ``<directory or /dev/shm>/flexshard-ring-<name>``."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"ring name {name!r} is not valid: expected 1-200 characters from "
                          "[A-Za-z0-9._-], starting with a letter or digit")
    d = Path(directory) if directory is not None else _default_directory()
    return d / (PREFIX + name)


def _check_platform() -> None:
    if sys.byteorder != "little" or struct.calcsize("P") != 8:
        raise RingError("the shared-memory ring needs a 64-bit little-endian host")
    if not hasattr(fcntl, "F_OFD_SETLK"):
        raise RingError("the shared-memory ring needs Linux open-file-description locks "
                        "(F_OFD_SETLK, Linux >= 3.15)")


# ------------------------------------------------------------------- atomics (index words)


class _Atomics:
    """Release store and acquire load of aligned u64 words at raw addresses."""

    def __init__(self) -> None:
        self.kind = "plain"
        self._engine = None
        try:
            self._build()
            self.kind = "llvm"
        except Exception:  # pragma: no cover - llvmlite is a dependency of numba
            self.store_release = self._plain_store
            self.load_acquire = self._plain_load

    @staticmethod
    def _plain_store(addr: int, value: int) -> None:
        ctypes.c_uint64.from_address(addr).value = value

    @staticmethod
    def _plain_load(addr: int) -> int:
        return ctypes.c_uint64.from_address(addr).value

    def _build(self) -> None:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        p = "ptr" if llvm.llvm_version_info[0] >= 15 else "i64*"
        ir = f"""
define void @fs_store_release({p} %p, i64 %v) nounwind {{
  fence seq_cst
  store atomic i64 %v, {p} %p release, align 8
  ret void
}}
define i64 @fs_load_acquire({p} %p) nounwind {{
  %v = load atomic i64, {p} %p acquire, align 8
  ret i64 %v
}}
"""
        mod = llvm.parse_assembly(ir)
        mod.verify()
        tm = llvm.Target.from_default_triple().create_target_machine()
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
        self._engine = engine  # keeps the code alive
        self.store_release = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)(
            engine.get_function_address("fs_store_release"))
        self.load_acquire = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)(
            engine.get_function_address("fs_load_acquire"))
        # self-test on private memory
        cell = (ctypes.c_uint64 * 1)()
        self.store_release(ctypes.addressof(cell), 0x0123456789ABCDEF)
        if self.load_acquire(ctypes.addressof(cell)) != 0x0123456789ABCDEF:
            raise RuntimeError("atomic self-test failed")


_ATOMICS: _Atomics | None = None
_ATOMICS_LOCK = threading.Lock()


def _atomics() -> _Atomics:
    global _ATOMICS
    if _ATOMICS is None:
        with _ATOMICS_LOCK:
            if _ATOMICS is None:
                _ATOMICS = _Atomics()
    return _ATOMICS


def memory_ordering() -> str:
    """How ring index words are accessed in this process: ``"llvm"`` (release/acquire atomics,
    correct on any CPU) or ``"plain"`` (aligned 8-byte stores/loads, correct on x86-64 only)."""
    return _atomics().kind


# ----------------------------------------------------------------------------------- locks


def _flock_arg(ltype: int, start: int) -> bytes:
    return struct.pack(_FLOCK, ltype, os.SEEK_SET, start, 1, 0)


def _try_lock(fd: int, byte: int) -> bool:
    """Take the exclusive OFD lock on one byte; False if someone else holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock_arg(fcntl.F_WRLCK, byte))
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _locked_elsewhere(fd: int, byte: int) -> bool:
    """Whether another open file description holds a lock on ``byte``."""
    res = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock_arg(fcntl.F_WRLCK, byte))
    return struct.unpack(_FLOCK, res)[0] != fcntl.F_UNLCK


# --------------------------------------------------------------------------------- segment


def _open_existing(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RingError(f"no ring at {path} (create it with Ring.create first)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RingPermissionError(f"{path} is a symbolic link; refusing to open it") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise RingPermissionError(f"cannot open ring {path}: {e.strerror}") from None
        raise


def _check_file(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RingPermissionError(f"{path} is not a regular file; refusing to use it as a ring")
    me = _euid()
    if st.st_uid != me:
        raise RingPermissionError(f"ring {path} belongs to uid {st.st_uid}, not to this user "
                                  f"(uid {me}); refusing to attach")
    if st.st_mode & 0o077:
        raise RingPermissionError(f"ring {path} has mode {oct(stat.S_IMODE(st.st_mode))}; "
                                  "expected 0o600 (owner only); refusing to attach")


class _Segment:
    """One mapping of a ring file plus its own open file description (for OFD locks)."""

    def __init__(self, path: Path, fd: int, expect_id: int | None = None):
        self.path, self.fd = path, fd
        self.mm = None
        try:
            st = os.fstat(fd)
            _check_file(path, st)
            self.dev_ino = (st.st_dev, st.st_ino)
            if st.st_size < PAGE:
                raise RingFormatError(f"{path} is not a flexshard ring: {st.st_size} bytes, "
                                      f"shorter than the {PAGE}-byte header")
            self.mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
            self._parse(st.st_size, expect_id)
        except BaseException:
            if self.mm is not None:
                self.mm.close()
            os.close(fd)
            raise
        self.u8 = np.frombuffer(self.mm, dtype=np.uint8)
        self.hdr = self.u8[:_CTRL_OFF].view("<u8")
        self.ctrl = self.u8[_CTRL_OFF:_CTRL_OFF + _CTRL_STRIDE * self.slots].view("<u8") \
            .reshape(self.slots, _CTRL_WORDS)
        self.base = self.u8.ctypes.data
        self.atomics = _atomics()

    def _parse(self, size: int, expect_id: int | None) -> None:
        mm, path = self.mm, self.path
        (magic, version, data_off, slots, flags, cap, total, ring_id, uid, created, ctrl_off,
         ctrl_stride) = _HDR.unpack_from(mm, 0)
        if magic != MAGIC:
            raise RingFormatError(f"{path} is not a flexshard ring (magic {magic!r}, expected "
                                  f"{MAGIC!r})")
        if version != VERSION:
            raise RingFormatError(f"ring {path} has format version {version}; this library "
                                  f"reads version {VERSION}")
        (crc,) = struct.unpack_from("<I", mm, _HDR_CRC)
        if crc != zlib.crc32(mm[:_HDR_CRC]):
            raise RingFormatError(f"the header of ring {path} is damaged (checksum mismatch); "
                                  "unlink the file and create the ring again")
        ok = (1 <= slots <= MAX_SLOTS and cap > 0 and cap % PAGE == 0
              and ctrl_off == _CTRL_OFF and ctrl_stride == _CTRL_STRIDE
              and data_off == _pad(_CTRL_OFF + _CTRL_STRIDE * slots, PAGE)
              and total == data_off + slots * cap)
        if not ok:
            raise RingFormatError(f"the header of ring {path} is inconsistent (slots={slots}, "
                                  f"slot capacity={cap}, data offset={data_off}, size={total})")
        if total != size:
            raise RingFormatError(f"ring {path} is {size} bytes but its header says {total}; "
                                  "the file was truncated or extended")
        if uid != _euid():
            raise RingPermissionError(f"ring {path} was created by uid {uid}, not by this user "
                                      f"(uid {_euid()}); refusing to attach")
        if expect_id is not None and ring_id != expect_id:
            raise RingError(f"{path} is now a different ring (id {ring_id:#x}, expected "
                            f"{expect_id:#x}): it was unlinked and created again")
        self.slots, self.cap, self.data_off, self.flags = slots, cap, data_off, flags
        self.ring_id, self.created = ring_id, created

    def write_addr(self, slot: int) -> int:
        return self.base + _CTRL_OFF + _CTRL_STRIDE * slot + 8 * P_WRITE

    def read_addr(self, slot: int) -> int:
        return self.base + _CTRL_OFF + _CTRL_STRIDE * slot + 8 * C_READ

    def slot_data(self, slot: int) -> np.ndarray:
        o = self.data_off + slot * self.cap
        return self.u8[o:o + self.cap]

    def close(self) -> None:
        self.u8 = self.hdr = self.ctrl = None
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view is still alive somewhere; the GC unmaps it later
                pass
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _init_file(fd: int, slots: int, cap: int, flags: int) -> tuple[int, int]:
    data_off = _pad(_CTRL_OFF + _CTRL_STRIDE * slots, PAGE)
    total = data_off + slots * cap
    try:
        os.posix_fallocate(fd, 0, total)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise
        os.ftruncate(fd, total)  # filesystem without fallocate
    if os.fstat(fd).st_size != total:
        os.ftruncate(fd, total)
    ring_id = secrets.randbits(64) | 1
    mm = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        _HDR.pack_into(mm, 0, MAGIC, VERSION, data_off, slots, flags, cap, total, ring_id,
                       _euid(), time.time(), _CTRL_OFF, _CTRL_STRIDE)
        struct.pack_into("<I", mm, _HDR_CRC, zlib.crc32(mm[:_HDR_CRC]))
    finally:
        mm.close()
    return ring_id, total


# ------------------------------------------------------------------------------ records


def _encode_keys(keys: tuple[str, ...]) -> bytes:
    parts = []
    for k in keys:
        b = k.encode("utf-8")
        parts.append(struct.pack("<I", len(b)) + b)
    blob = b"".join(parts)
    return blob + b"\0" * (-len(blob) % 8)


def _decode_keys(blob: bytes, nkeys: int) -> tuple[str, ...]:
    keys, p = [], 0
    for _ in range(nkeys):
        if p + 4 > len(blob):
            raise ValueError("key table too short")
        (n,) = struct.unpack_from("<I", blob, p)
        if p + 4 + n > len(blob):
            raise ValueError("key table too short")
        keys.append(blob[p + 4:p + 4 + n].decode("utf-8"))
        p += 4 + n
    if _pad(p, 8) != len(blob):
        raise ValueError("key table size mismatch")
    return tuple(keys)


@dataclass(frozen=True)
class RingRecord:
    """One received record: which slot, its sequence number in that slot, submit time (unix
    seconds), its size in the ring (bytes, header and padding included) and the batch (a copy)."""

    slot: int
    seq: int
    t_submit: float
    nbytes: int
    batch: Batch


# ------------------------------------------------------------------------------ producer


class Producer:
    """The writing end of one ring slot. Create with :meth:`Ring.producer`.

    ``submit`` copies a batch into the slot and returns True, or drops it (False, counted) when it
    does not fit; with ``block=True`` it waits up to ``timeout`` seconds (None: forever) first.
    Attributes ``submitted``, ``accepted``, ``dropped`` count this process's calls.
    """

    def __init__(self, path: Path, ring_id: int, *, block: bool = False,
                 timeout: float | None = None, lazy: bool = False):
        self.path, self.ring_id = Path(path), ring_id
        self.block, self.timeout = block, timeout
        self.submitted = self.accepted = self.dropped = 0
        self._seg: _Segment | None = None
        self._pid: int | None = None
        self._slot: int | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._keys: tuple[str, ...] | None = None
        self._kb = np.zeros(0, np.uint8)
        self._damaged_warned = False
        if not lazy:
            self._claim()

    # -------------------------------------------------------------- slot ownership
    @property
    def slot(self) -> int | None:
        """The claimed slot in this process, or None before the first submit of a lazy producer."""
        return self._slot if self._pid == os.getpid() else None

    def _claim(self) -> None:
        _check_platform()
        seg = _Segment(self.path, _open_existing(self.path), expect_id=self.ring_id)
        slot = next((i for i in range(seg.slots) if _try_lock(seg.fd, 1 + i)), None)
        if slot is None:
            n = seg.slots
            seg.close()
            raise RingBusyError(f"all {n} producer slots of ring {self.path} are taken by live "
                                "processes; create the ring with more slots (at least the number "
                                "of DataLoader workers)")
        c = seg.ctrl[slot]
        pid = os.getpid()
        c[P_OWNER] = pid
        c[P_CLAIMS] += 1
        self._pid, self._slot = pid, slot
        self._c = c
        self._data = seg.slot_data(slot)
        self._mm = seg.mm
        self._data_base = seg.data_off + slot * seg.cap
        self._cap = seg.cap
        self._waddr, self._raddr = seg.write_addr(slot), seg.read_addr(slot)
        self._store, self._load = seg.atomics.store_release, seg.atomics.load_acquire
        self._crc = bool(seg.flags & _RING_CRC)
        self._w = int(c[P_WRITE])
        self._seq = int(c[P_NEXT_SEQ])
        self._seg = seg  # last: a set _seg with a foreign _pid means "inherited through fork"
        used = self._w - self._load(self._raddr)
        if not 0 <= used <= self._cap:
            warnings.warn(f"slot {slot} of ring {self.path} has inconsistent indices; its "
                          "records will be dropped until the consumer resets it",
                          RingCorruptionWarning, stacklevel=3)

    def _forget(self) -> None:
        """Drop state inherited through fork without touching the parent's slot."""
        seg = self._seg
        self._seg = self._slot = None
        self._pid = None
        self._c = self._data = self._mm = None
        if seg is not None:
            seg.close()  # closes our copy of the fd; the parent's lock stays

    # ------------------------------------------------------------------ writing
    def _put(self, p: int, src: np.ndarray) -> int:
        n = src.size
        if n == 0:
            return p
        cap, d = self._cap, self._data
        end = p + n
        if end <= cap:
            d[p:end] = src
            return end if end < cap else 0
        k = cap - p
        d[p:] = src[:k]
        d[:n - k] = src[k:]
        return n - k

    def submit(self, batch: Batch, *, block: bool | None = None,
               timeout: float | None = None) -> bool:
        """Copy ``batch`` into the ring. True if written, False if dropped (no room).

        Never waits unless ``block`` (default: the producer's policy); then waits up to
        ``timeout`` seconds (default: the producer's; None = forever) for room before dropping.
        Raises :class:`RecordTooLargeError` if the batch cannot fit even in an empty slot.
        """
        if self._closed:
            raise RingError("this producer is closed")
        if not isinstance(batch, Batch):
            raise TypeError(f"submit expects a Batch, got {type(batch).__name__}")
        if self._pid != os.getpid():  # lazy, unpickled, or inherited through fork
            if self._seg is not None and self._pid not in (None, os.getpid()):
                self._forget()  # in a fork child (only this thread exists there)
                self._lock = threading.Lock()
            with self._lock:
                if self._pid != os.getpid():
                    self._claim()
        with self._lock:
            return self._submit(batch, self.block if block is None else block,
                                self.timeout if timeout is None else timeout)

    def _submit(self, batch: Batch, block: bool, timeout: float | None) -> bool:
        vals, lens, wts, ts = batch.values, batch.lengths, batch.weights, batch.timestamp
        if batch.keys != self._keys:
            self._kb = np.frombuffer(_encode_keys(batch.keys), np.uint8)
            self._keys = batch.keys
        kb = self._kb
        nv, nl = vals.size, lens.size
        flags, wbytes, nts = 0, 0, 0
        if wts is not None:
            flags |= F_WEIGHTS
            wts = np.ascontiguousarray(wts, dtype=np.float32)
            wbytes = _pad(4 * nv, 8)
        if ts is not None:
            flags |= F_TIMESTAMP
            ts = np.ascontiguousarray(ts, dtype=np.float64)
            nts = ts.size
        body = kb.size + 8 * nl + 8 * nv + wbytes + 8 * nts
        rec = _pad(64 + body, 64)
        cap = self._cap
        if rec > cap:
            raise RecordTooLargeError(
                f"a batch of {nv} IDs needs a {rec}-byte record but a slot of ring {self.path} "
                f"holds {cap} bytes; create the ring with capacity_bytes >= "
                f"{_pad(rec, PAGE) * self._seg.slots} for {self._seg.slots} slots")
        self.submitted += 1
        c, w = self._c, self._w
        used = w - self._load(self._raddr)
        if not 0 <= used <= cap or cap - used < rec:
            if block and 0 <= used <= cap:
                used = self._wait_for_room(rec, timeout)
            if not 0 <= used <= cap or cap - used < rec:
                c[P_DROP_BATCHES] += 1
                c[P_DROP_IDS] += nv
                c[P_DROP_BYTES] += rec
                self.dropped += 1
                return False
        # ---- copy the record in (invisible to the consumer until the write index moves)
        seq, pos, t = self._seq, w % cap, time.time()
        vals_u8 = np.ascontiguousarray(vals).view(np.uint8)
        lens_u8 = np.ascontiguousarray(lens).view(np.uint8)
        crc = 0
        if self._crc:
            flags |= F_CRC
            parts = [kb, lens_u8, vals_u8]
            if wts is not None:
                parts += [wts.view(np.uint8), np.zeros(wbytes - 4 * nv, np.uint8)]
            if ts is not None:
                parts.append(ts.view(np.uint8))
            crc = zlib.crc32(_REC.pack(_TAG, flags, rec, seq, len(batch.keys), kb.size, nl, nv,
                                       nts, 0, t))
            for part in parts:
                crc = zlib.crc32(part, crc)
        _REC.pack_into(self._mm, self._data_base + pos, _TAG, flags, rec, seq, len(batch.keys),
                       kb.size, nl, nv, nts, crc, t)
        p = pos + 64 if pos + 64 < cap else 0
        p = self._put(p, kb)
        p = self._put(p, lens_u8)
        p = self._put(p, vals_u8)
        if wts is not None:
            p = self._put(p, wts.view(np.uint8))
            if wbytes != 4 * nv:
                p = self._put(p, np.zeros(4, np.uint8))
        if ts is not None:
            p = self._put(p, ts.view(np.uint8))
        self._publish(c, seq, w + rec, nv)
        self.accepted += 1
        return True

    def _publish(self, c: np.ndarray, seq: int, new_w: int, nv: int) -> None:
        c[P_NEXT_SEQ] = seq + 1
        self._store(self._waddr, new_w)  # the record becomes visible here
        self._w, self._seq = new_w, seq + 1
        c[P_BATCHES] += 1
        c[P_IDS] += nv

    def _wait_for_room(self, rec: int, timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = 20e-6
        while True:
            used = self._w - self._load(self._raddr)
            if self._cap - used >= rec or not 0 <= used <= self._cap:
                return used
            if deadline is not None and time.monotonic() >= deadline:
                return used
            time.sleep(nap)
            nap = min(nap * 2, 1e-3)

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Give the slot back (its published records stay for the consumer)."""
        if self._closed:
            return
        self._closed = True
        if self._seg is None:
            return
        if self._pid != os.getpid():
            self._forget()
            return
        with self._lock:
            self._c[P_OWNER] = 0
            seg = self._seg
            self._c = self._data = self._mm = None
            self._seg = None
            seg.close()  # closing the description releases the slot lock

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __reduce__(self):
        return (_unpickle_producer, (str(self.path), self.ring_id, self.block, self.timeout))

    def __repr__(self) -> str:
        return f"Producer({str(self.path)!r}, slot={self.slot}, closed={self._closed})"


def _unpickle_producer(path: str, ring_id: int, block: bool, timeout: float | None) -> Producer:
    return Producer(Path(path), ring_id, block=block, timeout=timeout, lazy=True)


# ------------------------------------------------------------------------------- stats


@dataclass(frozen=True)
class SlotStats:
    """Counters of one slot (cumulative over all its owners). ``bytes_*`` are ring bytes
    (record headers and padding included); ``lag_bytes`` = published but not yet read.
    ``alive``: a live process holds the slot. ``slot`` is -1 and ``owner_pid`` 0 in totals."""

    slot: int
    owner_pid: int
    alive: bool
    claims: int
    batches_written: int
    ids_written: int
    bytes_written: int
    batches_dropped: int
    ids_dropped: int
    bytes_dropped: int
    batches_read: int
    ids_read: int
    bytes_read: int
    lag_bytes: int
    records_discarded: int
    bytes_discarded: int


@dataclass(frozen=True)
class RingStats:
    """A snapshot of a ring's counters: ``slots`` (one :class:`SlotStats` each) and ``total``."""

    slots: tuple[SlotStats, ...]
    total: SlotStats
    slot_capacity: int
    consumer_pid: int
    consumer_alive: bool


# --------------------------------------------------------------------------------- ring


class Ring:
    """A shared-memory ring; this object is the consumer end (``poll``) and hands out producers.

    Create with :meth:`create`, open an existing one with :meth:`attach`. The consumer role is
    taken on the first ``poll`` (one live consumer per ring). Picklable (re-attaches by name).
    """

    def __init__(self, seg: _Segment, name: str, directory: Path):
        self._seg = seg
        self.name, self.directory, self.path = name, directory, seg.path
        self.slots, self.slot_capacity = seg.slots, seg.cap
        self.ring_id = seg.ring_id
        self.checksum = bool(seg.flags & _RING_CRC)
        self._dev_ino = seg.dev_ino
        self._consumer_pid: int | None = None
        self._rr = 0
        self._keys_cache: dict[bytes, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    @property
    def capacity_bytes(self) -> int:
        """Data bytes of the whole ring (slots x slot capacity)."""
        return self.slots * self.slot_capacity

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, name: str, slots: int = 8, capacity_bytes: int = 64 << 20,
               directory: str | os.PathLike | None = None, *, checksum: bool = False,
               exist_ok: bool = False) -> Ring:
        """Create ring ``name`` with ``slots`` producer slots sharing ``capacity_bytes`` bytes
        (each slot gets ``capacity_bytes // slots`` rounded down to 4096; memory is reserved now).

        ``checksum``: producers add a CRC-32 to every record, the consumer verifies it.
        ``exist_ok``: attach to an existing ring of the same geometry instead of failing (e.g.
        one left by a dead consumer).
        """
        _check_platform()
        path = ring_path(name, directory)
        if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) \
                or not 1 <= slots <= MAX_SLOTS:
            raise ConfigError(f"slots must be an integer in [1, {MAX_SLOTS}], got {slots!r}")
        slots = int(slots)
        cap = int(capacity_bytes) // slots // PAGE * PAGE
        if cap < PAGE:
            raise ConfigError(f"capacity_bytes={capacity_bytes} is too small for {slots} slots: "
                              f"each slot needs at least {PAGE} bytes")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        linked = False
        try:
            os.fchmod(fd, 0o600)
            try:
                ring_id, _ = _init_file(fd, slots, cap, _RING_CRC if checksum else 0)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    need = _pad(_CTRL_OFF + _CTRL_STRIDE * slots, PAGE) + slots * cap
                    raise RingError(f"not enough space in {path.parent} for a {need}-byte ring "
                                    "(tmpfs full or small, e.g. Docker's 64 MB /dev/shm): use a "
                                    "smaller capacity_bytes, --shm-size, or directory=") from None
                raise
            try:
                os.link(tmp, path)  # atomic: nobody ever sees a half-initialized ring
                linked = True
            except FileExistsError:
                pass
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.unlink(tmp)
        if not linked:
            os.close(fd)
            if not exist_ok:
                raise RingError(f"a file already exists at {path}; attach to it with "
                                "Ring.attach, pass exist_ok=True, or unlink it first")
            ring = cls.attach(name, directory)
            if (ring.slots, ring.slot_capacity, ring.checksum) != (slots, cap, bool(checksum)):
                got = (ring.slots, ring.slot_capacity, ring.checksum)
                ring.close()
                raise RingError(f"ring {path} exists with (slots, slot capacity, checksum) = "
                                f"{got}, not {(slots, cap, bool(checksum))}; unlink it first")
            return ring
        seg = _Segment(path, fd, expect_id=ring_id)
        return cls(seg, name, path.parent)

    @classmethod
    def attach(cls, name: str, directory: str | os.PathLike | None = None) -> Ring:
        """Open the existing ring ``name`` (same user only; the header is verified)."""
        _check_platform()
        path = ring_path(name, directory)
        seg = _Segment(path, _open_existing(path))
        return cls(seg, name, path.parent)

    def producer(self, *, block: bool = False, timeout: float | None = None,
                 lazy: bool = False) -> Producer:
        """A producer on a free slot (claimed now, or at its first submit if ``lazy``).

        Raises :class:`RingBusyError` when every slot is held by a live process.
        """
        self._check_open()
        return Producer(self.path, self.ring_id, block=block, timeout=timeout, lazy=lazy)

    def _check_open(self) -> None:
        if self._seg is None:
            raise RingError(f"ring {self.path} is closed")

    # ------------------------------------------------------------------ consumer
    def _ensure_consumer(self) -> None:
        self._check_open()
        pid = os.getpid()
        if self._consumer_pid == pid:
            return
        if self._consumer_pid is not None:
            raise RingError(f"this Ring object is the consumer of pid {self._consumer_pid}; "
                            "after fork, attach the ring anew in the child")
        seg = self._seg
        if not _try_lock(seg.fd, 0):
            raise RingBusyError(f"ring {self.path} already has a live consumer "
                                f"(pid {int(seg.hdr[_W_CONSUMER_PID])})")
        seg.hdr[_W_CONSUMER_PID] = pid
        seg.hdr[_W_CONSUMER_ATTACHES] += 1
        self._consumer_pid = pid

    def poll(self, max_batches: int | None = None, timeout: float = 0.0) -> list[Batch]:
        """Received batches (copies), at most ``max_batches``; waits up to ``timeout`` seconds
        for the first one. Takes the consumer role on first use."""
        return [r.batch for r in self.poll_records(max_batches, timeout)]

    def poll_records(self, max_batches: int | None = None,
                     timeout: float = 0.0) -> list[RingRecord]:
        """Like :meth:`poll`, with slot, sequence number, submit time and size of each record."""
        self._ensure_consumer()
        out: list[RingRecord] = []
        if max_batches is not None and max_batches <= 0:
            return out
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                start = self._rr
                self._rr = (start + 1) % self.slots
                for j in range(self.slots):
                    quota = None if max_batches is None else max_batches - len(out)
                    if quota == 0:
                        break
                    self._drain_slot((start + j) % self.slots, quota, out)
                now = time.monotonic()
                if out or now >= deadline:
                    return out
                time.sleep(min(1e-3, deadline - now))

    def _drain_slot(self, i: int, quota: int | None, out: list[RingRecord]) -> None:
        seg = self._seg
        cap, mm, c = seg.cap, seg.mm, seg.ctrl[i]
        base = seg.data_off + i * cap
        raddr = seg.read_addr(i)
        store = seg.atomics.store_release
        w = seg.atomics.load_acquire(seg.write_addr(i))
        r = int(c[C_READ])
        if not 0 <= w - r <= cap:
            self._discard(i, r, w, f"indices inconsistent (write {w}, read {r})")
            return
        while r < w and (quota is None or quota > 0):
            pos = r % cap
            (tag, flags, rec, seq, nkeys, kbytes, nl, nv, nts, crc,
             t) = _REC.unpack_from(mm, base + pos)
            body = kbytes + 8 * nl + 8 * nv + (_pad(4 * nv, 8) if flags & F_WEIGHTS else 0) \
                + 8 * nts
            if tag != _TAG or rec != _pad(64 + body, 64) or rec > w - r:
                self._discard(i, r, w, "record framing is damaged")
                return
            try:
                batch = self._decode(i, base, pos, flags, nkeys, kbytes, nl, nv, nts, crc,
                                     (tag, flags, rec, seq, nkeys, kbytes, nl, nv, nts, 0, t))
            except (ValueError, FlexShardError) as e:
                c[C_DISC_RECORDS] += 1
                c[C_DISC_BYTES] += rec
                store(raddr, r + rec)
                warnings.warn(f"ring {self.path} slot {i}: discarded a damaged record "
                              f"(seq {seq}, {rec} bytes): {e}", RingCorruptionWarning,
                              stacklevel=4)
                r += rec
                continue
            r += rec
            store(raddr, r)  # the space is free for the producer from here on
            c[C_BATCHES] += 1
            c[C_IDS] += nv
            out.append(RingRecord(i, seq, t, rec, batch))
            if quota is not None:
                quota -= 1

    def _discard(self, i: int, r: int, w: int, why: str) -> None:
        seg = self._seg
        c = seg.ctrl[i]
        lost = w - r if w >= r else 0
        c[C_DISC_RECORDS] += 1
        c[C_DISC_BYTES] += lost
        seg.atomics.store_release(seg.read_addr(i), w)
        warnings.warn(f"ring {self.path} slot {i}: {why}; discarded the {lost} unread bytes of "
                      "the slot", RingCorruptionWarning, stacklevel=4)

    def _take(self, base: int, p: int, n: int) -> tuple[np.ndarray, bool, int]:
        """n ring bytes at slot offset p: (array, is_view, next offset)."""
        cap, u8 = self._seg.cap, self._seg.u8
        end = p + n
        if end <= cap:
            return u8[base + p:base + end], True, (end if end < cap else 0)
        k = cap - p
        return np.concatenate([u8[base + p:base + cap], u8[base:base + n - k]]), False, n - k

    def _decode(self, i: int, base: int, pos: int, flags: int, nkeys: int, kbytes: int, nl: int,
                nv: int, nts: int, crc: int, hdr0: tuple) -> Batch:
        cap = self._seg.cap
        p = pos + 64 if pos + 64 < cap else 0
        check = bool(flags & F_CRC)
        acc = zlib.crc32(_REC.pack(*hdr0)) if check else 0

        def take(n: int, dtype: Any) -> np.ndarray:
            nonlocal p, acc
            raw, view, p = self._take(base, p, n)
            if check:
                acc = zlib.crc32(raw, acc)
            arr = raw.view(dtype)
            return arr.copy() if view else arr

        kb = take(kbytes, np.uint8).tobytes()
        keys = self._keys_cache.get(kb)
        if keys is None:
            keys = _decode_keys(kb, nkeys)
            if len(self._keys_cache) > 256:
                self._keys_cache.clear()
            self._keys_cache[kb] = keys
        lengths = take(8 * nl, np.int64)
        values = take(8 * nv, np.int64)
        weights = None
        if flags & F_WEIGHTS:
            wb = _pad(4 * nv, 8)
            weights = take(wb, np.float32)[:nv]
        timestamp = take(8 * nts, np.float64) if flags & F_TIMESTAMP else None
        if check and acc != crc:
            raise ValueError("CRC-32 mismatch")
        return Batch(keys, values, lengths, weights, timestamp)

    # ------------------------------------------------------------------ stats
    def stats(self) -> RingStats:
        """A snapshot of all counters (see :class:`SlotStats`); does not take the consumer role."""
        self._check_open()
        seg = self._seg
        ctrl = seg.ctrl.copy()
        rows = []
        for i in range(seg.slots):
            c = [int(x) for x in ctrl[i]]
            rows.append(SlotStats(
                slot=i, owner_pid=c[P_OWNER], alive=_locked_elsewhere(seg.fd, 1 + i),
                claims=c[P_CLAIMS], batches_written=c[P_BATCHES], ids_written=c[P_IDS],
                bytes_written=c[P_WRITE], batches_dropped=c[P_DROP_BATCHES],
                ids_dropped=c[P_DROP_IDS], bytes_dropped=c[P_DROP_BYTES],
                batches_read=c[C_BATCHES], ids_read=c[C_IDS], bytes_read=c[C_READ],
                lag_bytes=max(c[P_WRITE] - c[C_READ], 0), records_discarded=c[C_DISC_RECORDS],
                bytes_discarded=c[C_DISC_BYTES]))
        sums = {f.name: sum(getattr(s, f.name) for s in rows) for f in fields(SlotStats)
                if f.name not in ("slot", "owner_pid", "alive")}
        total = SlotStats(slot=-1, owner_pid=0, alive=any(s.alive for s in rows), **sums)
        alive = self._consumer_pid == os.getpid() or _locked_elsewhere(seg.fd, 0)
        return RingStats(tuple(rows), total, seg.cap, int(seg.hdr[_W_CONSUMER_PID]), alive)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Unmap; gives up the consumer role. The ring file stays (see :meth:`unlink`)."""
        seg, self._seg = self._seg, None
        if seg is None:
            return
        if self._consumer_pid == os.getpid():
            seg.hdr[_W_CONSUMER_PID] = 0
        self._consumer_pid = None
        seg.close()  # closing the description releases the consumer lock

    def unlink(self) -> None:
        """Remove the ring file (if it is still this ring). Mappings stay valid until closed."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self._dev_ino:
            os.unlink(self.path)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __reduce__(self):
        return (_reattach, (self.name, str(self.directory), self.ring_id))

    def __repr__(self) -> str:
        return (f"Ring({str(self.path)!r}, slots={self.slots}, slot_capacity={self.slot_capacity}"
                f"{', closed' if self._seg is None else ''})")


def _reattach(name: str, directory: str, ring_id: int) -> Ring:
    ring = Ring.attach(name, directory)
    if ring.ring_id != ring_id:
        ring.close()
        raise RingError(f"{ring.path} is now a different ring: it was unlinked and created again")
    return ring


# --------------------------------------------------------------------------- throughput


def _throughput_producer(name: str, directory: str, seconds: float, batch_ids: int,
                         num_keys: int) -> None:
    """Producer side of :func:`ring_throughput` (runs in its own process)."""
    ring = Ring.attach(name, directory)
    rng = np.random.default_rng(0)
    per_key = batch_ids // num_keys
    batch = Batch([f"f{k}" for k in range(num_keys)],
                  rng.integers(0, 1 << 40, size=per_key * num_keys),
                  np.ones(per_key * num_keys, np.int64))
    with ring.producer(block=True, timeout=1.0) as p:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            p.submit(batch)
    ring.close()


def ring_throughput(seconds: float = 1.0, *, batch_ids: int = 1 << 16, num_keys: int = 4,
                    capacity_bytes: int = 16 << 20,
                    directory: str | os.PathLike | None = None) -> float:
    """Bytes per second from one producer process to a consumer (this process) through a ring.

    The producer submits one pre-built batch of ``batch_ids`` IDs (one ID per sample, so 16 bytes
    per ID with the lengths) in blocking mode for ``seconds``; the rate counts ring bytes of the
    records received between the first and the last one.
    """
    name = f"bench-{os.getpid()}-{secrets.token_hex(4)}"
    ring = Ring.create(name, slots=1, capacity_bytes=capacity_bytes, directory=directory)
    code = ("import sys; from flexshard_stream.sources.ring import _throughput_producer as f; "
            "f(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))")
    proc = subprocess.Popen([sys.executable, "-c", code, name, str(ring.directory), str(seconds),
                             str(batch_ids), str(num_keys)])
    try:
        nbytes, t0, t1, first = 0, 0.0, 0.0, True
        while True:
            recs = ring.poll_records(timeout=0.05)
            now = time.perf_counter()
            if recs:
                if first:  # the first poll's records only start the clock
                    first, t0 = False, now
                else:
                    nbytes += sum(r.nbytes for r in recs)
                t1 = now
            elif proc.poll() is not None:
                break
        if proc.returncode != 0:
            raise RingError(f"throughput producer exited with status {proc.returncode}")
        return nbytes / (t1 - t0) if t1 > t0 else 0.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ring.close()
        ring.unlink()
