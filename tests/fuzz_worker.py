"""The fuzz harness: mutated files through every decoder, malformed logs through every CLI command
that reads logs, each case in a worker process of its own (tests/test_fuzz.py drives it).

A case is ``(target, seed, knobs)``: the worker builds the target's pristine artifact once (a
statistics file, a snapshot, a plan directory, ...), derives a mutated copy from the seed
(byte-level damage, or structure-aware damage with every checksum recomputed, as an adversary
would), and runs the decoder and then the code that uses what it decoded. Outcomes:

- ``ok``: accepted and used without error; ``refused``: a project error (``FlexShardError``), or
  for a command exit status 2 with one ``error:`` line;
- failures: ``error`` (any other exception: a traceback), ``memory`` (``MemoryError``: an
  allocation beyond the worker's address-space limit), ``crash`` (the worker died: a signal or an
  abort), ``hang`` (no answer within the case's time limit).

The parent side is :class:`Worker`; ``python tests/fuzz_worker.py --survey TARGET N`` runs N cases
of a target and prints the outcome counts (without stopping at a failure).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FAILURES = ("error", "memory", "crash", "hang")
#: Address space the worker may grow by after its warm-up (bytes): an allocation beyond it is a
#: MemoryError, reported as an unbounded allocation.
MEMORY_BYTES = int(os.environ.get("FLEXSHARD_FUZZ_MEMORY_MB", "3072")) << 20


# ====================================================================== the parent side
class Worker:
    """A fuzz worker process: :meth:`run` sends one case and returns its outcome dict; a crash or
    a hang is an outcome too (the process is then replaced on the next call)."""

    def __init__(self, timeout: float = 120.0, log_dir: str | None = None):
        self.timeout = float(os.environ.get("FLEXSHARD_FUZZ_TIMEOUT", timeout))
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="fss-fuzz-"))
        self.proc: subprocess.Popen | None = None
        self.tally: Counter = Counter()
        self.failures: list[dict] = []
        self.distinct: dict[str, set] = {}         # target -> the distinct cases run
        self.journal = os.environ.get("FLEXSHARD_FUZZ_REPORT")  # + .failures.jsonl, .progress

    def _start(self) -> None:
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        self.log = self.log_dir / f"worker-{time.time_ns()}.log"
        env = {**os.environ, "FSS_FUZZ_FDS": f"{req_r},{rep_w}",
               "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p])}
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], env=env,
                                         stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         pass_fds=(req_r, rep_w), start_new_session=True)
        os.close(req_r)
        os.close(rep_w)
        self._buf = b""
        ready = self._reply(900.0)
        if ready is None or ready.get("outcome") != "ready":
            raise RuntimeError(f"fuzz worker did not start: {ready}; log {self.log}:\n"
                               f"{self._log_tail()}")

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def _reply(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._rep_r], [], [], left)[0]:
                return None
            chunk = os.read(self._rep_r, 1 << 20)
            if not chunk:
                return {"outcome": "eof"}
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for fd in (self._req_w, self._rep_r):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.proc = None

    def run(self, target: str, case: dict) -> dict:
        """The outcome of one case (``{"outcome": ..., "detail": ...}``)."""
        if self.proc is None:
            self._start()
        msg = json.dumps({"target": target, "case": case}).encode() + b"\n"
        try:
            os.write(self._req_w, msg)
            out = self._reply(self.timeout * TARGET_TIME.get(target, 1.0))
        except (BrokenPipeError, OSError):
            out = {"outcome": "eof"}
        if out is None:
            self._kill()
            out = {"outcome": "hang", "detail": f"no answer within "
                   f"{self.timeout * TARGET_TIME.get(target, 1.0):.0f} s"}
        elif out["outcome"] == "eof":
            code = self.proc.wait(30)
            tail = self._log_tail()
            self._kill()
            out = {"outcome": "crash", "detail": f"worker exit status {code}; log tail:\n{tail}"}
        out.update(target=target, case=case)
        self.tally[(target, out["outcome"])] += 1
        self.distinct.setdefault(target, set()).add(json.dumps(case, sort_keys=True))
        if self.journal:
            self._write_journal(out)
        if out["outcome"] in FAILURES:
            self.failures.append(out)
        return out

    def _write_journal(self, out: dict) -> None:
        """As the run goes: each failure appended to ``<report>.failures.jsonl``, the counts so
        far in ``<report>.progress`` (a long run shows what it found before it ends)."""
        if out["outcome"] in FAILURES:
            with open(self.journal + ".failures.jsonl", "a") as f:
                f.write(json.dumps(out, default=str) + "\n")
        counts = {f"{t}:{o}": n for (t, o), n in sorted(self.tally.items())}
        Path(self.journal + ".progress").write_text(json.dumps(counts) + "\n")

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                os.write(self._req_w, b'{"target": "quit"}\n')
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            self._kill()


#: Per-target multiple of the case time limit (the sidecar and the commands do more per case).
TARGET_TIME = {"checkpoint": 2.0, "report": 2.0, "cli_plan": 2.0, "cli_replay": 2.0}


# ====================================================================== mutation engine
INTERESTING_INTS = [0, 1, -1, 2, 7, 8, 255, 256, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62,
                    2**63 - 1, 2**63, 2**64, -2**31, -2**63, -2**63 - 1, 10**30]
INTERESTING = INTERESTING_INTS + [0.5, -0.0, 1e-300, 1e308, -1e308, float("nan"),
                                  float("inf"), float("-inf"), "", "x", "0", "-1", "1e400",
                                  "..", "../../x", "a" * 300, "\u00e9\u0000", None, True,
                                  False, [], {}, [1], [[]], {"a": 1}, [0] * 40]


def pick(rng: np.random.Generator, seq: list) -> Any:
    return seq[int(rng.integers(len(seq)))]


def mutate_bytes(data: bytes, rng: np.random.Generator, n_ops: int | None = None) -> bytes:
    """1-4 byte-level damages: set a byte, an 8-byte word to an interesting integer, insert,
    delete, duplicate a range, truncate."""
    b = bytearray(data)
    for _ in range(n_ops or int(rng.integers(1, 5))):
        op = int(rng.integers(6))
        n = len(b)
        pos = int(rng.integers(n + 1))
        if op == 0 and n:
            b[min(pos, n - 1)] = int(rng.integers(256))
        elif op == 1 and n >= 8:
            v = pick(rng, INTERESTING_INTS) & 0xFFFFFFFFFFFFFFFF
            p = min(pos, n - 8)
            b[p:p + 8] = struct.pack("<Q", v)
        elif op == 2:
            b[pos:pos] = rng.bytes(int(rng.integers(1, 17)))
        elif op == 3 and n:
            del b[pos:pos + int(rng.integers(1, 65))]
        elif op == 4 and n:
            k = int(rng.integers(1, 65))
            b[pos:pos] = b[pos:pos + k]
        elif op == 5:
            del b[pos:]
    return bytes(b)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:64]):
            out += _paths(v, prefix + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_json(doc: Any, rng: np.random.Generator) -> Any:
    """A structure-aware damage of a JSON document: a value replaced by an interesting one (or by
    a value of another type, or a nearby number), a key deleted or added, a list item duplicated
    or removed."""
    doc = copy.deepcopy(doc)
    for _ in range(int(rng.integers(1, 4))):
        paths = _paths(doc)
        path = pick(rng, paths)
        if not path:
            # a copy: a caller filling in the document must not change INTERESTING itself
            doc = copy.deepcopy(pick(rng, INTERESTING)) if rng.random() < 0.1 else doc
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        old = parent[key]
        op = int(rng.integers(6))
        if op == 0:
            new = pick(rng, INTERESTING)
        elif op == 1 and isinstance(old, (int, float)) and not isinstance(old, bool):
            new = pick(rng, [old + 1, old - 1, -old, old * 2, old * 2**32, old / 3,
                             str(old), float(old)])
        elif op == 2 and isinstance(old, list) and old:
            new = old + [old[int(rng.integers(len(old)))]] if rng.random() < 0.5 else old[1:]
        elif op == 3 and isinstance(parent, dict):
            del parent[key]
            continue
        elif op == 4 and isinstance(old, dict):
            old[pick(rng, ["x", "kind", "version", "name", "", "extra"])] = \
                copy.deepcopy(pick(rng, INTERESTING))
            continue
        else:
            new = pick(rng, INTERESTING)
        parent[key] = copy.deepcopy(new)
    return doc


def damaged(case: dict, data: bytes, rng: np.random.Generator,
            mutate: Callable[[bytes, np.random.Generator], bytes]) -> bytes:
    """``data`` damaged by ``mutate``, or as it is for the warm-up case."""
    return data if case.get("warm") else mutate(data, rng)


def dump_json(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


# -------------------------------------------------------------------- containers
def split_container(data: bytes) -> tuple[dict, bytes] | None:
    """(header, payload) of a well-formed container (no checks beyond parsing), else None."""
    if len(data) < 32 or data[:8] != b"FSSTREAM":
        return None
    (hlen,) = struct.unpack_from("<Q", data, 12)
    if 20 + hlen > len(data) - 12:
        return None
    try:
        header = json.loads(data[20:20 + hlen])
    except ValueError:
        return None
    return header, data[20 + hlen:len(data) - 12]


def seal_container(header: Any, payload: bytes, version: int = 1) -> bytes:
    """A container with ``header`` and ``payload`` whose lengths and CRC-32 are right."""
    h = dump_json(header)
    body = b"FSSTREAM" + struct.pack("<HHQ", version, 0, len(h)) + h + payload
    return body + struct.pack("<I", zlib.crc32(body)) + b"FSEND\0\0\0"


def _array_entries(header: Any) -> list[dict]:
    arrays = header.get("arrays") if isinstance(header, dict) else None
    return [e for e in arrays if isinstance(e, dict)] if isinstance(arrays, list) else []


def _mutate_array(header: dict, payload: bytearray, rng: np.random.Generator,
                  depth: int) -> None:
    entries = [e for e in _array_entries(header)
               if isinstance(e.get("offset"), int) and isinstance(e.get("nbytes"), int)
               and 0 <= e["offset"] and e["offset"] + e["nbytes"] <= len(payload)]
    if not entries:
        payload[:] = mutate_bytes(bytes(payload), rng)
        return
    e = pick(rng, entries)
    lo, n = e["offset"], e["nbytes"]
    region = bytes(payload[lo:lo + n])
    dt = np.dtype(e["dtype"]) if e.get("dtype") in ("int64", "uint64", "uint32", "uint8",
                                                     "int32", "float64", "float32") else None
    op = int(rng.integers(5))
    if e.get("dtype") == "uint8" and op < 2 and depth < 2:
        inner = mutate_container(region, rng, depth + 1) if region[:8] == b"FSSTREAM" \
            else mutate_kll(region, rng)
        payload[lo:lo + n] = inner[:n].ljust(n, b"\0") if rng.random() < 0.5 else region
        if len(inner) != n:                      # a different length: rewrite the layout
            _replace_region(header, payload, e, inner)
        return
    if dt is None or not n:
        payload[lo:lo + n] = mutate_bytes(region, rng, 2)[:n].ljust(n, b"\0")
        return
    a = np.frombuffer(region, dt.newbyteorder("<")).copy()
    if op == 2 and a.size:                       # fill the whole array with one value
        a[:] = _fit(pick(rng, INTERESTING_INTS + [1, 3]), dt)
    elif op == 3 and a.size:                     # a few elements to interesting values
        for _ in range(int(rng.integers(1, 4))):
            a.flat[int(rng.integers(a.size))] = _fit(pick(rng, INTERESTING_INTS), dt)
    else:
        a = np.frombuffer(mutate_bytes(region, rng, 2)[:n].ljust(n, b"\0"),
                          dt.newbyteorder("<")).copy()
    payload[lo:lo + n] = a.astype(dt.newbyteorder("<")).tobytes()


def _fit(v: int, dt: np.dtype) -> Any:
    if dt.kind == "f":
        return float(v) if abs(v) < 1e300 else np.inf
    info = np.iinfo(dt)
    return (v - info.min) % (int(info.max) - int(info.min) + 1) + info.min


def _replace_region(header: dict, payload: bytearray, entry: dict, new: bytes) -> None:
    """Put ``new`` (another length) in place of ``entry``'s bytes, moving the later arrays."""
    lo, n = entry["offset"], entry["nbytes"]
    pad = (-len(new)) % 8
    old_total = n + ((-n) % 8)
    payload[lo:lo + old_total] = new + b"\0" * pad
    shift = len(new) + pad - old_total
    for e in _array_entries(header):
        if e is not entry and isinstance(e.get("offset"), int) and e["offset"] > lo:
            e["offset"] += shift
    entry["nbytes"] = len(new)
    entry["shape"] = [len(new)]


def mutate_kll(image: bytes, rng: np.random.Generator) -> bytes:
    """Damage a KLL image: its preamble and level offsets mostly, its items sometimes."""
    b = bytearray(image)
    for _ in range(int(rng.integers(1, 4))):
        if not b:
            break
        head = min(len(b), 48)
        pos = int(rng.integers(head)) if rng.random() < 0.8 else int(rng.integers(len(b)))
        if rng.random() < 0.5:
            b[pos] = int(rng.integers(256))
        else:
            v = pick(rng, [0, 1, 2, 5, 8, 15, 61, 62, 200, 255, 0xFFFF, 0xFFFFFFFF])
            b[pos:pos + 4] = struct.pack("<I", v & 0xFFFFFFFF)[:len(b) - pos]
    if rng.random() < 0.1:
        del b[int(rng.integers(len(b) + 1)):]
    return bytes(b)


def mutate_container(data: bytes, rng: np.random.Generator, depth: int = 0) -> bytes:
    """Damage a container: its JSON header or one array (nested containers and KLL images
    included) with the lengths and CRC recomputed (90%), or its raw bytes."""
    parts = split_container(data)
    r = rng.random()
    if parts is None or r < 0.15:
        return mutate_bytes(data, rng)
    header, payload = parts
    payload = bytearray(payload)
    if r < 0.55:
        header = mutate_json(header, rng)
    else:
        _mutate_array(header, payload, rng, depth)
    if rng.random() < 0.1:
        return mutate_bytes(seal_container(header, bytes(payload)), rng, 1)
    return seal_container(header, bytes(payload))


# -------------------------------------------------------------------- .npy and directories
def mutate_npy(data: bytes, rng: np.random.Generator) -> bytes:
    """Damage a .npy file: its header dictionary (shape, dtype, order) or its data."""
    if rng.random() < 0.3 or len(data) < 16 or not data.startswith(b"\x93NUMPY"):
        return mutate_bytes(data, rng)
    hl = struct.unpack_from("<H", data, 8)[0]
    head, body = data[10:10 + hl].decode("latin1"), data[10 + hl:]
    choice = int(rng.integers(4))
    if choice == 0:
        shape = pick(rng, ["(1099511627776,)", "(-1,)", "(3, 0)", "()", "(2**40,)",
                           "(4611686018427387904, 4)", "(0,)", "('a',)", "(1.5,)"])
        head = _replace_field(head, "shape", shape)
    elif choice == 1:
        head = _replace_field(head, "descr", pick(rng, ["'|O'", "'<U8'", "'|V8'", "'>i8'",
                                                        "'<f2'", "'<c16'", "[('a', '<i8')]",
                                                        "'|b1'", "'<m8[s]'"]))
    elif choice == 2:
        head = _replace_field(head, "fortran_order", pick(rng, ["True", "1", "None"]))
    else:
        body = mutate_bytes(body, rng)
    raw = head.encode("latin1")
    return data[:8] + struct.pack("<H", len(raw)) + raw + body


def mutate_npz(data: bytes, rng: np.random.Generator) -> bytes:
    """Damage one member of an .npz archive (rewritten, stored), or the archive's bytes."""
    import zipfile
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError):
        return mutate_bytes(data, rng)
    if not members:
        return mutate_bytes(data, rng)
    name = pick(rng, sorted(members))
    members[name] = mutate_npy(members[name], rng)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for k, v in members.items():
            z.writestr(k, v)
    return buf.getvalue()


def _replace_field(head: str, key: str, value: str) -> str:
    start = head.find(f"'{key}':")
    if start < 0:
        return head
    end = head.find(", '", start + 1)
    if key == "shape":
        end = head.find(")", start) + 1
    elif end < 0:
        end = head.rfind("}")
    return head[:start] + f"'{key}': {value}" + head[end:]


def regular_bytes(path: Path) -> bytes:
    """The bytes of a regular file (the damage may have left a FIFO or a device); OSError else."""
    if not path.is_file() or path.is_symlink():
        raise OSError(f"{path} is not a regular file")
    return path.read_bytes()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_digest(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                             allow_nan=True).encode())


def mutate_file(path: Path, rng: np.random.Generator) -> None:
    """Damage one file by what it is: JSON, .npy, container, or raw bytes."""
    data = path.read_bytes()
    if path.suffix == ".json" and rng.random() < 0.85:
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if doc is not None:
            path.write_bytes(dump_json(mutate_json(doc, rng)))
            return
    if path.suffix == ".npy":
        path.write_bytes(mutate_npy(data, rng))
    elif path.suffix == ".npz" and rng.random() < 0.7:
        path.write_bytes(mutate_npz(data, rng))
    elif data[:8] == b"FSSTREAM":
        path.write_bytes(mutate_container(data, rng))
    else:
        path.write_bytes(mutate_bytes(data, rng))


def mutate_tree(root: Path, rng: np.random.Generator, files: list[Path]) -> None:
    """Damage a directory: one of ``files`` (or a marker, a new file, a file removed or replaced
    by a directory, a symlink, a FIFO)."""
    if not files:
        return
    f = pick(rng, files)
    op = rng.random()
    if op < 0.8:
        mutate_file(f, rng)
    elif op < 0.85:
        f.unlink()
    elif op < 0.9:
        f.unlink()
        f.mkdir()
    elif op < 0.93:
        f.unlink()
        os.symlink("/dev/zero", f)
    elif op < 0.96:
        f.unlink()
        os.mkfifo(f)
    else:
        (f.parent / pick(rng, ["extra.npy", ".flexshard-kind", "x.json"])).write_bytes(
            rng.bytes(int(rng.integers(0, 64))))


def reseal_plan_dir(d: Path) -> None:
    """Recompute what a plan directory's checksums cover (array SHA-256 in plan.json, then the
    plan.json checksum), as an adversary editing it would."""
    pj = d / "plan.json"
    try:
        doc = json.loads(regular_bytes(pj))
    except (OSError, ValueError):
        return
    if not isinstance(doc, dict):
        return
    for entry in doc.get("tables", []) if isinstance(doc.get("tables"), list) else []:
        arrays = entry.get("arrays") if isinstance(entry, dict) else None
        for spec in arrays.values() if isinstance(arrays, dict) else []:
            if isinstance(spec, dict) and isinstance(spec.get("file"), str):
                with contextlib.suppress(OSError, ValueError):
                    spec["sha256"] = sha256(regular_bytes(d / spec["file"]))
    if "checksum" in doc:
        doc["checksum"] = json_digest(doc)
    pj.write_bytes(json.dumps(doc, indent=1, allow_nan=True).encode())


def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# ====================================================================== the fixtures
class Fixtures:
    """Pristine artifacts, built once per worker under ``base``."""

    def __init__(self, base: Path):
        from flexshard_stream.plans.tables import EmbeddingTable
        from flexshard_stream.plans.topology import Topology
        from flexshard_stream.stats.config import SketchConfig
        self.base = base
        self.small = SketchConfig(cms_epsilon=0.02, cms_delta=0.05, hh_lg_size=6, hll_p=6,
                                  length_k=16, exact_memory_limit=8000)
        self.tables = [EmbeddingTable("a", 1000, 8, feature="a"),
                       EmbeddingTable("b", 5000, 8, kind="pooled", feature="b")]
        self.topo = Topology.uniform(1, 2, hbm_bytes_per_gpu=1e9)
        self._cache: dict[str, Any] = {}

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def batches(self, seed: int = 0, n: int = 12, ts0: float = 1.7e9) -> list:
        from flexshard_stream import Batch
        rng = np.random.default_rng(seed)
        out = []
        for i in range(n):
            k = 16
            a = np.minimum(rng.zipf(1.3, k), 1000) - 1
            lens_b = rng.integers(0, 4, k)
            b = np.minimum(rng.zipf(1.2, int(lens_b.sum())), 5000) - 1
            out.append(Batch(["a", "b"], np.concatenate([a, b]),
                             np.concatenate([np.ones(k, np.int64), lens_b]),
                             timestamp=ts0 + i + np.arange(k) / k))
        return out

    def stream_stats(self, variant: int):
        from flexshard_stream.stats.config import TableConfig
        from flexshard_stream.stats.stream import StreamStats

        def build():
            cfg = self.small if variant == 0 else None
            s = StreamStats([TableConfig("a", 1000), TableConfig("b", None),
                             TableConfig("c", 10**6)], cfg, auto_tables=True)
            for b in self.batches():
                s.update(b)
            return s
        return self.cached(f"stats{variant}", build)

    def plans(self):
        def build():
            from flexshard_stream.placement.baselines import row_wise
            from flexshard_stream.placement.planner import MemoryPolicy, plan_flexshard
            st = self.stream_stats(0)
            sums = {t.name: st[t.feature].summary(200) for t in self.tables}
            rw = row_wise(self.tables, self.topo)
            flex = plan_flexshard(self.tables, self.topo, sums, 4,
                                  MemoryPolicy(host_memory=True)).plan
            return rw, flex, sums
        return self.cached("plans", build)

    def file(self, key: str, write: Callable[[Path], Any]) -> Path:
        def build():
            p = self.base / key
            write(p)
            return p
        return self.cached("file:" + key, build)


# ====================================================================== format targets
def use_stats(s, fx: Fixtures, work: Path) -> None:
    """What a user does with loaded statistics: summaries, an update, merges, decay, saving."""
    from flexshard_stream import Batch
    from flexshard_stream.stats.stream import StreamStats
    s.summary(50)
    s.to_json(5)
    keys, vals, lens = [], [], []
    rng = np.random.default_rng(1)
    for f, t in list(s.tables.items())[:8]:
        hi = min(t.num_rows or 2**40, 2**40)
        keys.append(f)
        vals.append(rng.integers(0, hi, 6))
        lens.append(np.full(3, 2))
    if keys:
        s.update(Batch(keys, np.concatenate(vals), np.concatenate(lens)))
    c = s.copy()
    c.merge(s)
    c.scale(0.3)
    c.summary(20)
    for t in list(s.tables.values())[:8]:
        t.to_datasketches_frequent_items()
        t.length_quantiles()
        t.distinct()
    s.save(work / "again.fss")
    StreamStats.load(work / "again.fss")


def target_stats(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.stats.stream import StreamStats
    variant = case.get("variant", 0) % 2
    src = fx.file(f"stats{variant}.fss", lambda p: fx.stream_stats(variant).save(p))
    rng = np.random.default_rng(case["seed"])
    p = work / "x.fss"
    p.write_bytes(damaged(case, src.read_bytes(), rng, mutate_container))
    use_stats(StreamStats.load(p), fx, work)


def target_snapshot(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.sources.distributed import (
        export_datasketches,
        load_snapshot,
        merge_snapshots,
        save_snapshot,
    )
    src = fx.file("snap.fss", lambda p: save_snapshot(fx.stream_stats(0), p, host="h1"))
    rng = np.random.default_rng(case["seed"])
    p = work / "x.fss"
    p.write_bytes(damaged(case, src.read_bytes(), rng, mutate_container))
    load_snapshot(p)
    merged = merge_snapshots([src, p], work / "merged.fss")
    export_datasketches(merged, work / "ds")
    use_stats(merged, fx, work)


def target_delta(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.plans.delta import PlanDelta
    rw, flex, _ = fx.plans()
    src = fx.file("x.delta", lambda p: PlanDelta.between(rw, flex).save(p))
    rng = np.random.default_rng(case["seed"])
    p = work / "x.delta"
    p.write_bytes(damaged(case, src.read_bytes(), rng, mutate_container))
    d = PlanDelta.load(p)
    d.summary()
    d.migration_time_s()
    d.invert()
    d.then(d.invert())
    d.check_base(rw)
    d.apply(rw)
    d.save(work / "again.delta")


def _dir_copy(fx: Fixtures, key: str, build: Callable[[Path], Any], work: Path) -> Path:
    src = fx.file(key, build)
    dst = work / key
    shutil.copytree(src, dst, symlinks=True)
    return dst


def target_plan(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.bridge.export import export_torchrec
    from flexshard_stream.placement.cost import (
        CostModel,
        evaluate_analytic,
        evaluate_trace,
    )
    from flexshard_stream.plans.delta import PlanDelta
    from flexshard_stream.plans.plan import Plan
    from flexshard_stream.testing import check_plan
    rw, flex, sums = fx.plans()
    d = _dir_copy(fx, "plan", lambda p: flex.save(p), work)
    rng = np.random.default_rng(case["seed"])
    if not case.get("warm"):
        mutate_tree(d, rng, tree_files(d))
        if rng.random() < 0.8:
            reseal_plan_dir(d)
    p = Plan.load(d)
    for name, tp in p.tables.items():
        ids = np.arange(min(tp.table.num_rows, 64), dtype=np.int64)
        p.route(name, ids, 0)
    p.tier_sizes()
    p.row_bytes_per_gpu
    evaluate_analytic(p, sums, 4, CostModel())
    evaluate_trace(p, fx.batches(), 4, CostModel())
    check_plan(p, full_route_limit=1 << 16)
    PlanDelta.between(rw, p).summary()
    p.save(work / "copy")
    export_torchrec(p, work / "export")


def target_export(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.bridge.export import (
        export_torchrec,
        load_torchrec_export,
        plan_from_export,
    )
    from flexshard_stream.placement.cost import evaluate_analytic
    rw, flex, sums = fx.plans()
    d = _dir_copy(fx, "export", lambda p: export_torchrec(flex, p, summaries=sums), work)
    _damage_export(d, case)
    ex = load_torchrec_export(d)
    for e in ex.manifest["tables"]:
        ex.split(e["table"], np.arange(8))
        ex.split_jagged(e["table"], np.arange(8), [3, 5])
        ex.hot_rows(e["table"])
    evaluate_analytic(plan_from_export(ex), sums, 4)


def target_export_live(fx: Fixtures, case: dict, work: Path) -> None:
    """A live export (``hot_capacity``: slot capacity, every row in the cold tables, the plan's
    hot IDs file) damaged and loaded: the live readers (hot IDs, ``split_rows``) or a clean
    refusal."""
    from flexshard_stream.bridge.export import export_torchrec, load_torchrec_export
    rw, flex, sums = fx.plans()
    d = _dir_copy(fx, "export_live",
                  lambda p: export_torchrec(flex, p, summaries=sums, hot_capacity="auto"), work)
    _damage_export(d, case)
    ex = load_torchrec_export(d)
    for e in ex.manifest["tables"]:
        rows = int(e["source_table"]["num_rows"])
        ex.split_rows(e["table"], np.zeros((rows, 2), np.float32))
    ex.live


def _damage_export(d: Path, case: dict) -> None:
    """Unless the case is warm: damage the export in ``d``, then, most of the time, seal its
    checksums again (so that the damage reaches the readers behind them)."""
    rng = np.random.default_rng(case["seed"])
    if not case.get("warm"):
        mutate_tree(d, rng, tree_files(d))
        if rng.random() < 0.8:
            _reseal_export(d)


def _reseal_export(d: Path) -> None:
    from flexshard_stream.bridge.export import MANIFEST_FILE
    pj = d / MANIFEST_FILE
    try:
        doc = json.loads(regular_bytes(pj))
        for e in doc["tables"]:
            e["remap"]["sha256"] = sha256(regular_bytes(d / e["remap"]["file"]))
            if isinstance(e.get("live"), dict) and isinstance(e["live"].get("hot_ids"), dict):
                h = e["live"]["hot_ids"]
                h["sha256"] = sha256(regular_bytes(d / h["file"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    pj.write_bytes(json.dumps(doc, allow_nan=True).encode())


def _toml_dump(doc: Any) -> str:
    """A small TOML writer for mutated documents (values TOML cannot hold become strings)."""
    from flexshard_stream.formats.toml import toml_value

    def val(v: Any) -> str:
        if isinstance(v, (bool, int, float, str)):
            if isinstance(v, float) and not math.isfinite(v):
                return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            return toml_value(v)
        if isinstance(v, list) and all(not isinstance(x, dict) for x in v):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return toml_value(json.dumps(v, allow_nan=True))

    lines: list[str] = []

    def table(prefix: str, d: dict, array: bool = False) -> None:
        lines.append(f"[[{prefix}]]" if array else f"[{prefix}]")
        subs = []
        for k, v in d.items():
            key = json.dumps(str(k))
            if isinstance(v, dict):
                subs.append((f"{prefix}.{key}", v, False))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                subs += [(f"{prefix}.{key}", x, True) for x in v]
            else:
                lines.append(f"{key} = {val(v)}")
        for p, x, arr in subs:
            table(p, x, arr)

    if not isinstance(doc, dict):
        return f"x = {val(doc)}\n"
    for k, v in doc.items():
        key = json.dumps(str(k))
        if isinstance(v, dict):
            table(key, v)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                table(key, x, True)
        else:
            lines.insert(0, f"{key} = {val(v)}")
    return "\n".join(lines) + "\n"


def _mutate_toml(src: Path, dst: Path, rng: np.random.Generator) -> None:
    import tomllib
    text = src.read_text()
    if rng.random() < 0.7:
        dst.write_text(_toml_dump(mutate_json(tomllib.loads(text), rng)))
    else:
        dst.write_bytes(mutate_bytes(text.encode(), rng))


def target_topology(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.placement.baselines import row_wise
    from flexshard_stream.placement.cost import evaluate_analytic, evaluate_trace
    from flexshard_stream.placement.planner import plan_flexshard
    from flexshard_stream.plans.topology import Topology
    _, _, sums = fx.plans()
    src = fx.file("topo.toml", lambda p: Topology.uniform(2, 2).to_toml(p))
    rng = np.random.default_rng(case["seed"])
    p = work / "topo.toml"
    _mutate_toml(src, p, rng) if not case.get("warm") else shutil.copy(src, p)
    topo = Topology.load(p)
    topo.summary()
    plan = row_wise(fx.tables, topo)
    evaluate_analytic(plan, sums, 4)
    evaluate_trace(plan, fx.batches(n=2), 1)
    if topo.num_gpus <= 64:
        plan_flexshard(fx.tables, topo, sums, 4)


def target_tables(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.placement.baselines import build_baseline
    from flexshard_stream.placement.cost import evaluate_analytic
    from flexshard_stream.plans.tables import load_tables, save_tables
    from flexshard_stream.stats.config import TableConfig
    from flexshard_stream.stats.stream import StreamStats
    _, _, sums = fx.plans()
    src = fx.file("tables.toml", lambda p: save_tables(fx.tables, p))
    rng = np.random.default_rng(case["seed"])
    p = work / "tables.toml"
    _mutate_toml(src, p, rng) if not case.get("warm") else shutil.copy(src, p)
    tables = load_tables(p)
    StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tables])
    for strategy in ("rw", "tw", "dp"):
        plan = build_baseline(strategy, tables, fx.topo)
        evaluate_analytic(plan, sums, 4)


def target_state(fx: Fixtures, case: dict, work: Path) -> None:
    """The state protocol: a decayed or windowed statistics' state() damaged, then restored."""
    from flexshard_stream.stats.config import TableConfig
    from flexshard_stream.stats.window import DecayedStats, WindowedStats
    rng = np.random.default_rng(case["seed"])
    configs = [TableConfig("a", 1000), TableConfig("b", None)]

    def make(kind: int):
        if kind == 0:
            return DecayedStats(configs, fx.small, half_life=4.0, unit="seconds")
        return WindowedStats(configs, fx.small, window=8.0, slots=4, unit="seconds")

    kind = case.get("variant", 0) % 2
    src = make(kind)
    for b in fx.batches():
        src.update(b)
    state = src.state()
    if case.get("warm"):
        make(kind).restore(state)
        return
    blobs = state.pop("blobs")
    state = mutate_json(state, rng) if rng.random() < 0.5 else state
    if isinstance(state, dict):
        state["blobs"] = {k: mutate_container(v, rng) if rng.random() < 0.5 else v
                          for k, v in blobs.items()}
    dst = make(kind)
    dst.restore(state)
    for b in fx.batches(seed=2, ts0=1.7e9 + 5):
        dst.update(b)
    dst.view().summary(20)


def target_checkpoint(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.online.resharder import ReshardConfig
    from flexshard_stream.online.sidecar import Sidecar

    def run(out: Path, resume: bool, batches: list) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sc = Sidecar(fx.tables, fx.topo, 4, out_dir=out, resume=resume,
                         config=ReshardConfig(check_every=4, top_k=64), checkpoint_every_s=None)
            try:
                for b in batches:
                    sc.submit(b)
                sc.flush(60)
            finally:
                sc.close(60)

    d = _dir_copy(fx, "sidecar", lambda p: run(p, False, fx.batches(n=16)), work)
    rng = np.random.default_rng(case["seed"])
    files = [f for f in tree_files(d) if f.name != ".lock"]
    ckpt = [f for f in files if "checkpoints" in f.parts]
    if not case.get("warm"):
        mutate_tree(d, rng, ckpt if rng.random() < 0.8 else files)
        if rng.random() < 0.8:
            _reseal_checkpoints(d)
    run(d, True, fx.batches(seed=3, n=4))


def _reseal_checkpoints(d: Path) -> None:
    for ck in (d / "checkpoints").glob("ckpt-*"):
        for sub in ("plan", "prev_target"):
            if (ck / sub).is_dir():
                reseal_plan_dir(ck / sub)
        mp = ck / "manifest.json"
        try:
            m = json.loads(regular_bytes(mp))
            for rel, spec in m["files"].items():
                with contextlib.suppress(OSError):
                    data = regular_bytes(ck / rel)
                    spec["bytes"], spec["sha256"] = len(data), sha256(data)
            m["checksum"] = json_digest(m)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        mp.write_bytes(json.dumps(m, allow_nan=True).encode())


def target_ring(fx: Fixtures, case: dict, work: Path) -> None:
    from flexshard_stream.sources.ring import Ring
    from flexshard_stream.stats.stream import StreamStats
    rng = np.random.default_rng(case["seed"])
    name = f"fuzz{os.getpid()}x{case['seed'] % 10**9}"
    ring = Ring.create(name, slots=2, capacity_bytes=2 * 16384, directory=work,
                       checksum=bool(case.get("variant", 0) % 2))
    try:
        prod = ring.producer()
        for b in fx.batches(n=6):
            prod.submit(b)
        prod.close()
        path = ring.path
        ring.close()
        raw = bytearray(path.read_bytes())
        region = rng.random()
        lo, hi = ((0, 128) if region < 0.1 else (256, 4096) if region < 0.4
                  else (4096, len(raw)))
        for _ in range(0 if case.get("warm") else int(rng.integers(1, 6))):
            p = int(rng.integers(lo, hi - 8))
            if rng.random() < 0.5:
                raw[p] = int(rng.integers(256))
            else:
                raw[p:p + 8] = struct.pack("<Q", pick(rng, INTERESTING_INTS) & (2**64 - 1))
        if region < 0.1 and rng.random() < 0.7:      # the header's CRC recomputed
            struct.pack_into("<I", raw, 72, zlib.crc32(bytes(raw[:72])))
        with open(path, "r+b") as f:
            f.write(raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r2 = Ring.attach(name, directory=work)
            try:
                stats = StreamStats(auto_tables=True)
                for _ in range(3):
                    for b in r2.poll(timeout=0.01):
                        stats.update(b)
                r2.stats()
            finally:
                r2.close()
    finally:
        with contextlib.suppress(Exception):
            Ring.attach(name, directory=work).unlink()
        for p in work.glob("*ring*"):
            with contextlib.suppress(OSError):
                p.unlink()


def target_report(fx: Fixtures, case: dict, work: Path) -> None:
    """A replay directory damaged, then drawn by ``build_report``."""
    from flexshard_stream.online.replay import replay
    from flexshard_stream.report import build_report

    def build(out: Path) -> None:
        log = fx.base / "replay_log.csv"
        rng = np.random.default_rng(5)
        rows = ["ts,a,b"] + [f"{1.7e9 + i * 0.05:.2f},{min(int(rng.zipf(1.3)), 999)},"
                             f"{min(int(rng.zipf(1.2)), 4999)}" for i in range(400)]
        log.write_text("\n".join(rows) + "\n")
        replay(log, fx.topo, window="5s", out_dir=out, batch_size=2, top_k=64)

    d = _dir_copy(fx, "replay", build, work)
    rng = np.random.default_rng(case["seed"])
    if not case.get("warm"):
        mutate_tree(d, rng, [f for f in tree_files(d) if "plans" not in f.parts])
    build_report(d)


#: Symlink texts a damaged pointer may hold: other versions, none, paths out of the hidden area
#: and out of the tree, a loop, a device, the lock.
_POINTER_TEXTS = [".flexshard-versions/out/v000002", ".flexshard-versions/out/v999999",
                  ".flexshard-versions/out/v000003/../../../outside", "../outside", "outside",
                  "/dev/zero", "out", ".flexshard-versions/out/lock", ".flexshard-versions/out",
                  ".flexshard-versions/out/v1", ".flexshard-versions/other/v000003"]
#: Contents of a damaged ``publishing`` record.
_RECORD_TEXTS = [b"v000002\n", b"v000003", b"v999999\n", b"../../outside", b"/etc", b"v1",
                 b"v000002/..", b"v000002\x00", b"", b"\xff" * 70, b"v" + b"0" * 200]


def _versions_tree(fx: Fixtures, kind: str, base: Path) -> None:
    """``base/out`` written three times: the pointer to v000003, v000002 kept, the lock."""
    rw, flex, sums = fx.plans()
    for plan in (rw, flex, rw):
        _write_output(kind, base / "out", plan, sums)


def _write_output(kind: str, target: Path, plan: Any, sums: Any) -> None:
    from flexshard_stream.bridge.export import export_torchrec
    if kind == "plan":
        plan.save(target)
    else:
        export_torchrec(plan, target, summaries=sums)


def _read_output(kind: str, target: Path) -> Any:
    from flexshard_stream.bridge.export import load_torchrec_export, plan_from_export
    from flexshard_stream.plans.plan import Plan
    return Plan.load(target) if kind == "plan" else plan_from_export(load_torchrec_export(target))


def _damage_versions(root: Path, rng: np.random.Generator) -> None:
    """One to three kinds of damage to an output's pointer and hidden area, as a crash, a user
    or an adversary might leave them, some with links to ``root/../outside`` (which must
    survive); a damage an earlier one made impossible is skipped."""
    for _ in range(int(rng.integers(1, 4))):
        with contextlib.suppress(OSError):
            _damage_once(root, rng, int(rng.integers(0, 9)))


def _replace_entry(p: Path, how: str, rng: np.random.Generator) -> None:
    """``p`` removed, then (``how``) a file of random bytes, a directory, a FIFO, a symlink out
    of the tree, or nothing. OSError when a parent of ``p`` is a symlink (an earlier damage):
    the damage stays inside the tree."""
    if any(q.is_symlink() for q in p.parents):
        raise OSError(f"{p}: under a symlink")
    if os.path.lexists(p):
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if how == "file":
        p.write_bytes(rng.bytes(int(rng.integers(0, 40))))
    elif how == "dir":
        p.mkdir()
    elif how == "fifo":
        os.mkfifo(p)
    elif how == "outside":
        os.symlink(_outside_link(p, rng), p)


def _outside_link(p: Path, rng: np.random.Generator) -> str:
    """A link text from ``p`` to the case's ``outside/``: absolute, or relative."""
    work = next(q for q in p.parents if (q / "outside").is_dir())
    absolute = str(work / "outside")
    return absolute if rng.random() < 0.5 else os.path.relpath(absolute, p.parent)


def _damage_once(root: Path, rng: np.random.Generator, op: int) -> None:
    out, area = root / "out", root / ".flexshard-versions" / "out"
    if op == 0:                                  # the pointer names something else
        _replace_entry(out, "", rng)
        os.symlink(pick(rng, _POINTER_TEXTS), out)
    elif op == 1:                                # killed mid-switch: no pointer, a record
        _replace_entry(out, "", rng)
        _replace_entry(area / "publishing", "", rng)
        (area / "publishing").write_bytes(pick(rng, _RECORD_TEXTS))
    elif op == 2:                                # a version replaced
        _replace_entry(area / pick(rng, ["v000002", "v000003"]),
                       pick(rng, ["file", "dir", "fifo", "outside", ""]), rng)
    elif op == 3:                                # the lock replaced
        _replace_entry(area / "lock", pick(rng, ["dir", "fifo", "outside", "file", ""]), rng)
    elif op == 4:                                # the hidden area (or the output's part of it)
        _replace_entry(area if rng.random() < 0.5 else area.parent,
                       pick(rng, ["file", "outside", "dir"]), rng)
    elif op == 5:                                # an interrupted writer's leftovers, odd ones
        for name in ("tmp-7-x", "link-7-y", "v000009", ".publishing.z.tmp"):
            _replace_entry(area / name, pick(rng, ["outside", "dir", "file", "fifo"]), rng)
    elif op == 6:                                # an earlier release's leftovers, odd ones
        for name in (".out.old.abcdefgh", ".out.abcdefgh"):
            _replace_entry(root / name, pick(rng, ["outside", "dir"]), rng)
            if (root / name).is_dir() and not (root / name).is_symlink():
                os.symlink(_outside_link(root / name / "x", rng),
                           root / name / pick(rng, ["out", "plan.json"]))
    elif op == 7:                                # the record replaced
        _replace_entry(area / "publishing", pick(rng, ["outside", "dir", "fifo"]), rng)
    else:                                        # a version's files damaged
        version = area / pick(rng, ["v000002", "v000003"])
        if version.is_dir() and not any(q.is_symlink() for q in (version, *version.parents)):
            mutate_tree(version, rng, tree_files(version))


def target_versions(fx: Fixtures, case: dict, work: Path) -> None:
    """An output replaced twice (a plan directory, variants 0 and 1; an export, 2 and 3), its
    pointer and hidden area damaged; then read, written twice and read again. Ends in success or
    a project error, reads back what was written, and never touches anything outside the output
    (``outside/`` keeps its one file whatever the links point at)."""
    from flexshard_stream.errors import FlexShardError
    rw, flex, sums = fx.plans()
    kind = "plan" if case.get("variant", 0) % 4 < 2 else "export"
    src = fx.file(f"versions-{kind}", lambda p: _versions_tree(fx, kind, p))
    root = work / "tree"
    shutil.copytree(src, root, symlinks=True)
    outside = work / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    if not case.get("warm"):
        _damage_versions(root, np.random.default_rng(case["seed"]))
    before = _snapshot(outside)
    try:
        with contextlib.suppress(FlexShardError):
            _read_output(kind, root / "out")
        for plan in (flex, rw):
            _write_output(kind, root / "out", plan, sums)
            got = _read_output(kind, root / "out")
            if kind == "plan" and got != plan:
                raise AssertionError("the plan read back is not the plan written")
    finally:
        if _snapshot(outside) != before:
            raise AssertionError(f"outside the output was touched: {os.listdir(outside)}")


def _snapshot(d: Path) -> list[tuple[str, bytes | None]]:
    """What ``d`` holds: each entry's name and, for a regular file, its bytes."""
    return [(e.name, Path(e.path).read_bytes() if e.is_file(follow_symlinks=False) else None)
            for e in sorted(os.scandir(d), key=lambda e: e.name)]


FORMAT_TARGETS: dict[str, Callable[[Fixtures, dict, Path], None]] = {
    "stats": target_stats, "snapshot": target_snapshot, "delta": target_delta,
    "plan": target_plan, "export": target_export, "export_live": target_export_live,
    "topology": target_topology,
    "tables": target_tables, "state": target_state, "checkpoint": target_checkpoint,
    "ring": target_ring, "report": target_report, "versions": target_versions}


# ====================================================================== log targets
BAD_CELLS = ["", " ", "x", "1.5", "-3", "1e3", "9223372036854775807", "9223372036854775808",
             "18446744073709551616", "-9223372036854775809", "0x10", "NaN", "inf", "1 2",
             " 7 ", "\"4\"", "1,2", "\u00e9", "12 -4 5", "3\t4", "nul\x00l", "+5", "007",
             "99999999999999999999999999999"]
BAD_TS = ["", "x", "nan", "inf", "-inf", "1e300", "-1e300", "2024-01-01T00:00:00",
          "2024-13-45", "1e18", "-5", "0", "1.7e9", "9" * 40]


def _csv_log(rng: np.random.Generator, path: Path, case: dict) -> None:
    n = int(rng.geometric(0.05)) if rng.random() < 0.9 else 0
    cols = ["a"] + (["b"] if rng.random() < 0.7 else []) + (["c"] if rng.random() < 0.3 else [])
    has_ts = rng.random() < 0.6
    if has_ts:
        cols.insert(int(rng.integers(len(cols) + 1)), "ts")
    if rng.random() < 0.2:
        cols.append(pick(rng, ["label", "a", "", "ts", "b c", "\u00e9"]))
    p_bad = pick(rng, [0.0, 0.0, 0.01, 0.05, 0.3, 1.0])
    seq = {c: rng.random() < 0.4 for c in cols}
    t = pick(rng, [0.0, 1.7e9, 1e12, -100.0])
    gap = pick(rng, [0.01, 0.5, 1.0, 3600.0, 1e9])
    lines = [",".join(cols)]
    for _ in range(n):
        cells = []
        t += float(rng.exponential(gap))
        if rng.random() < 0.02:
            t += pick(rng, [-1e6, 1e15, 1e300, -t])
        for c in cols:
            if rng.random() < p_bad:
                cells.append(pick(rng, BAD_TS if c == "ts" else BAD_CELLS))
            elif c == "ts":
                cells.append(repr(t))
            elif seq[c]:
                cells.append(" ".join(str(int(x)) for x in
                                      np.minimum(rng.zipf(1.3, int(rng.integers(0, 5))), 900)))
            else:
                cells.append(str(int(min(rng.zipf(1.3), 900))))
        if rng.random() < 0.02:
            cells = cells[:-1] if rng.random() < 0.5 else cells + ["9"]
        lines.append(",".join(f'"{x}"' if "," in x else x for x in cells))
    text = "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")
    if rng.random() < 0.05:
        text = "\ufeff" + text
    if rng.random() < 0.05:
        text = text.replace("\n", "\r\n")
    raw = text.encode("utf-8")
    if rng.random() < 0.1:
        raw = mutate_bytes(raw, rng)
    path.write_bytes(raw)


def _parquet_log(rng: np.random.Generator, path: Path, case: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = int(rng.geometric(0.05)) if rng.random() < 0.9 else 0
    cols: dict[str, pa.Array] = {}
    for name in ["a", "b", "c"][:int(rng.integers(1, 4))]:
        cols[name] = _arrow_ids(rng, n)
    if rng.random() < 0.6:
        cols["ts"] = _arrow_ts(rng, n)
    if rng.random() < 0.2:
        cols["label"] = pa.array(rng.random(n))
    table = pa.table(cols)
    pq.write_table(table, path, row_group_size=int(rng.integers(1, 64)))
    if rng.random() < 0.1:
        path.write_bytes(mutate_bytes(path.read_bytes(), rng))


def _arrow_ids(rng: np.random.Generator, n: int):
    import pyarrow as pa
    ids = (np.minimum(rng.zipf(1.3, n), 900)).astype(np.int64)
    kind = int(rng.integers(9))
    if rng.random() < 0.3 and n:
        ids[int(rng.integers(n))] = pick(rng, [-1, 2**62, 2**63 - 1, -2**63, 0])
    mask = rng.random(n) < pick(rng, [0.0, 0.0, 0.1, 1.0])
    if kind == 0:
        return pa.array(ids, mask=mask)
    if kind == 1:
        u = ids.astype(np.uint64)
        if n and rng.random() < 0.5:
            u[0] = np.uint64(2**63 + 5)
        return pa.array(u)
    if kind == 2:
        return pa.array(ids.astype(np.int8 if rng.random() < 0.5 else np.int32))
    if kind == 3:
        return pa.array(ids.astype(np.float64))
    if kind == 4:
        return pa.array([pick(rng, BAD_CELLS) if rng.random() < 0.1 else str(x) for x in ids])
    if kind == 5:
        lens = rng.integers(0, 4, n)
        vals = np.minimum(rng.zipf(1.3, int(lens.sum())), 900).astype(np.int64)
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(off), pa.array(vals))
    if kind == 6:
        return pa.array([[int(x), None] if rng.random() < 0.1 else [int(x)] for x in ids],
                        type=pa.large_list(pa.int64()))
    if kind == 7:
        return pa.nulls(n)
    return pa.array(rng.random(n) < 0.5)


def _arrow_ts(rng: np.random.Generator, n: int):
    import pyarrow as pa
    t = pick(rng, [0.0, 1.7e9, 1e15]) + np.cumsum(rng.exponential(pick(rng, [0.1, 10.0, 1e9]), n))
    kind = int(rng.integers(5))
    if n and rng.random() < 0.2:
        t[int(rng.integers(n))] = pick(rng, [np.nan, np.inf, -np.inf, 1e300, -1e18])
    if kind == 0:
        return pa.array(t)
    if kind == 1:
        return pa.array(np.nan_to_num(t, posinf=0, neginf=0).astype(np.int64) % (2**40) * 1000,
                        type=pa.timestamp("ms"))
    if kind == 2:
        return pa.array([str(x) for x in t])
    if kind == 3:
        return pa.array((np.nan_to_num(t) % 20000).astype(np.int32), type=pa.date32())
    return pa.array(np.nan_to_num(t).astype(np.int64))


def make_log(case: dict, work: Path) -> Path:
    rng = np.random.default_rng(case["seed"])
    if rng.random() < 0.6:
        p = work / pick(rng, ["log.csv", "log.csv", "log.tsv"])
        _csv_log(rng, p, case)
        if p.suffix == ".tsv":
            p.write_bytes(p.read_bytes().replace(b",", b"\t"))
    else:
        p = work / "log.parquet"
        _parquet_log(rng, p, case)
    return p


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``flexshard-stream argv`` in this process: (exit status, stdout, stderr); an exception
    that escapes the command propagates."""
    from flexshard_stream import cli
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["flexshard-stream"] + argv
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


class CommandFailed(Exception):
    """A command ended otherwise than with success or one clean error line."""


def check_cli(argv: list[str]) -> str:
    code, out, err = run_cli(argv)
    if code == 0:
        return "ok"
    lines = [x for x in err.splitlines() if x.strip()]
    clean = code == 2 and lines and (lines[-1].startswith("error: ")
                                     or any(x.lstrip("│ ").startswith("Error") for x in lines))
    if clean and "Traceback" not in err:
        return "refused"
    raise CommandFailed(f"exit status {code}; stderr:\n{err[-3000:]}")


def _topology_file(fx: Fixtures) -> Path:
    return fx.file("cli_topo.toml", lambda p: fx.topo.to_toml(p))


def target_cli_stats(fx: Fixtures, case: dict, work: Path) -> str:
    log = make_log(case, work)
    rng = np.random.default_rng(case["seed"] + 1)
    argv = ["stats", str(log), "--json"]
    if rng.random() < 0.3:
        argv.append("--skip-bad-rows")
    if rng.random() < 0.3:
        argv += ["--save", str(work / "out.fss")]
    if rng.random() < 0.2:
        argv += ["--features", pick(rng, ["a", "a,b", "b,c", "ts", "zz"])]
    if rng.random() < 0.2:
        argv += ["--read-batch-size", str(pick(rng, [1, 3, 1000]))]
    return check_cli(argv)


def target_cli_plan(fx: Fixtures, case: dict, work: Path) -> str:
    log = make_log(case, work)
    rng = np.random.default_rng(case["seed"] + 1)
    strategy = pick(rng, ["rw", "flexshard", "hugectr", "tw", "twrw", "dp", "rw-hash"])
    argv = ["plan", "--log", str(log), "--topology", str(_topology_file(fx)), "--strategy",
            strategy, "--out", str(work / "plan"), "--batch-size", "4", "--json",
            "--topk", "256"]
    return check_cli(argv)


def target_cli_evaluate(fx: Fixtures, case: dict, work: Path) -> str:
    _, flex, _ = fx.plans()
    plan = fx.file("cli_plan", lambda p: flex.save(p))
    log = make_log(case, work)
    return check_cli(["evaluate", "--plan", str(plan), "--log", str(log), "--batch-size", "2",
                      "--json"])


def target_cli_replay(fx: Fixtures, case: dict, work: Path) -> str:
    log = make_log(case, work)
    rng = np.random.default_rng(case["seed"] + 1)
    argv = ["replay", str(log), "--topology", str(_topology_file(fx)), "--out",
            str(work / "replay"), "--batch-size", "2", "--top-k", "64", "--json"]
    if rng.random() < 0.7:
        argv += ["--window", pick(rng, ["20", "7", "1s", "30s", "1h", "1d"])]
    if rng.random() < 0.3:
        argv.append("--skip-bad-rows")
    if rng.random() < 0.3:
        argv += ["--evaluation", "analytic"]
    return check_cli(argv)


CLI_TARGETS: dict[str, Callable[[Fixtures, dict, Path], str]] = {
    "cli_stats": target_cli_stats, "cli_plan": target_cli_plan,
    "cli_evaluate": target_cli_evaluate, "cli_replay": target_cli_replay}
TARGETS = sorted(FORMAT_TARGETS) + sorted(CLI_TARGETS)


# ====================================================================== the worker side
def _outcome(fx: Fixtures, target: str, case: dict, scratch: Path) -> dict:
    from flexshard_stream.errors import FlexShardError
    work = Path(tempfile.mkdtemp(dir=scratch))
    try:
        if target in CLI_TARGETS:
            return {"outcome": CLI_TARGETS[target](fx, case, work)}
        FORMAT_TARGETS[target](fx, case, work)
        return {"outcome": "ok"}
    except FlexShardError as e:
        return {"outcome": "refused", "detail": f"{type(e).__name__}: {str(e)[:300]}"}
    except MemoryError:
        return {"outcome": "memory", "detail": traceback.format_exc()[-3000:]}
    except CommandFailed as e:
        return {"outcome": "error", "detail": str(e)}
    except Exception:
        return {"outcome": "error", "detail": traceback.format_exc()[-4000:]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _warm_up(fx: Fixtures, scratch: Path) -> None:
    """Build the pristine artifacts and compile the kernels before the memory limit is set."""
    for target in FORMAT_TARGETS:
        out = _outcome(fx, target, {"seed": 0, "warm": True}, scratch)
        print(f"warm-up {target}: {out}", file=sys.stderr, flush=True)
    for target in CLI_TARGETS:
        out = _outcome(fx, target, {"seed": 12345}, scratch)
        print(f"warm-up {target}: {out}", file=sys.stderr, flush=True)


def worker_main() -> None:
    rfd, wfd = (int(x) for x in os.environ["FSS_FUZZ_FDS"].split(","))
    warnings.simplefilter("ignore")
    scratch = Path(tempfile.mkdtemp(prefix="fss-fuzz-work-"))
    fx = Fixtures(scratch)
    reader = os.fdopen(rfd, "rb")
    try:
        _warm_up(fx, scratch)
        limit = _vm_size() + MEMORY_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.write(wfd, json.dumps({"outcome": "ready", "vm_limit": limit}).encode() + b"\n")
        for line in reader:
            req = json.loads(line)
            if req["target"] == "quit":
                break
            out = _outcome(fx, req["target"], req["case"], scratch)
            os.write(wfd, json.dumps(out).encode() + b"\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def survey(target: str, n: int, start: int = 0) -> int:
    """Run ``n`` cases of ``target`` (seeds ``start..start+n-1``); print the counts and each
    failure. Returns the number of failures."""
    w = Worker()
    t0 = time.time()
    try:
        for seed in range(start, start + n):
            out = w.run(target, {"seed": seed, "variant": seed})
            if out["outcome"] in FAILURES:
                print(f"--- {target} seed {seed}: {out['outcome']}\n{out.get('detail', '')}",
                      flush=True)
    finally:
        w.close()
    counts = {k[1]: v for k, v in w.tally.items()}
    print(json.dumps({"target": target, "cases": n, "seconds": round(time.time() - t0, 1),
                      "outcomes": counts}), flush=True)
    return sum(v for k, v in counts.items() if k in FAILURES)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main()
    elif sys.argv[1:2] == ["--one"]:             # debug one case in this process
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ.get("FLEXSHARD_FUZZ_TIMEOUT", 60)))
        _scratch = Path(tempfile.mkdtemp(prefix="fss-fuzz-one-"))
        print(_outcome(Fixtures(_scratch), sys.argv[2],
                       {"seed": int(sys.argv[3]), "variant": int(sys.argv[3])}, _scratch))
    elif sys.argv[1:2] == ["--survey"]:
        start = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        sys.exit(1 if survey(sys.argv[2], int(sys.argv[3]), start) else 0)
    else:
        print(__doc__)
