"""The statistics sidecar: live statistics and re-sharding next to a training job.

In process (docs/SIDECAR.md)::

    with Sidecar(tables, topology, batch_size=512, out_dir="run/sidecar") as sc:
        for batch in sc.attach(loader):      # every batch the loader yields is submitted
            train_step(batch)
    sc.stats()                               # counters: batches, IDs, drops, lag

``submit(batch)`` puts the batch on a bounded queue (bounded in batches, IDs and bytes) and returns
at once: when the queue is full the batch is dropped and counted (``policy="drop"``, the default),
or ``submit`` waits for room, up to a timeout (``policy="block"``). Two background threads do the
rest: the *ingest* thread feeds the statistics (the Numba kernels release the GIL) and, every
``config.check_every`` batches or seconds, hands a frequency summary to the *planner* thread, which
runs :meth:`Resharder.check <flexshard_stream.online.resharder.Resharder.check>` (planning never stalls
ingestion; a check due while the previous one still runs replaces the one waiting, counted as
``checks_coalesced``). Every applied change is published atomically under ``out_dir``::

    out_dir/state.json            pointer: {"seq", "plan", "plan_fingerprint", "delta", ...}
    out_dir/plan -> plans/NNNNNN  symlink to the current plan directory (Plan.load)
    out_dir/plans/NNNNNN/         the last few published plans (Plan.save)
    out_dir/deltas/NNNNNN.delta   PlanDelta from plan NNNNNN-1 to plan NNNNNN (PlanDelta.load)
    out_dir/decisions.jsonl       one line per check (Decision.to_json)
    out_dir/counters.json         cumulative counters, rewritten every ``counters_every_s``
    out_dir/checkpoints/ckpt-NNNNNNNN/   the last ``keep_checkpoints`` checkpoints

and passed to ``callback(decision, plan)`` (on the planner thread). Errors in the background threads
are logged and re-raised, as :class:`SidecarError`, by the next ``submit``/``flush``/
``checkpoint``/``close``; the sidecar keeps running after a bad batch or a failing callback.

Checkpoints (statistics, plan, re-sharder state, manifest with a sha256 per file, a checksum and
the batch counts) are written every ``checkpoint_every_s`` seconds and on ``close``. With
``resume=True`` the sidecar restarts from the newest good checkpoint (a damaged one is skipped with a
:class:`SidecarWarning` naming the file) and reports in :attr:`Sidecar.resume_report` how many
batches were lost since it.

Out of process: ``flexshard-stream sidecar --ring NAME ...`` (:func:`sidecar_command`) reads batches
that DataLoader workers write into a shared-memory ring (:mod:`flexshard_stream.online.ring`), feeds the same
machinery and shuts down cleanly (final checkpoint) on SIGTERM/SIGINT. With the ring the loss after a
crash is exact: the ring's read counters live in shared memory.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
)

import numpy as np
import typer

from ..errors import ConfigError, FlexShardError, FormatError
from ..formats.container import write_atomic
from ..stats.batch import Batch

if TYPE_CHECKING:  # heavy modules (planner, cost model) are imported when a Sidecar is built
    from ..placement.plan import Plan
    from ..placement.tables import EmbeddingTable
    from ..placement.topology import Topology
    from .resharder import Decision, ReshardConfig, Resharder

__all__ = ["AttachedLoader", "ResumeReport", "Sidecar", "SidecarError", "SidecarStats",
           "SidecarWarning", "list_checkpoints", "read_checkpoint", "run_ring", "sidecar_command",
           "to_batch"]

log = logging.getLogger(__name__)

CKPT_FORMAT = "flexshard-sidecar-checkpoint"
STATE_FORMAT = "flexshard-sidecar-state"
FORMAT_VERSION = 1
_UNSET: Any = object()


class SidecarError(FlexShardError):
    """An error in a sidecar background thread, re-raised in the caller (``__cause__`` is the
    original exception), or a call on a closed sidecar."""


class SidecarWarning(UserWarning):
    """A damaged checkpoint or published file was skipped, or a restart could not account for
    every batch."""


# ------------------------------------------------------------------------------- conversion


def _np(x: Any) -> Any:
    """A numpy view of a CPU tensor / DLPack array (zero-copy), or ``x`` unchanged."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def to_batch(item: Any) -> Batch:
    """Convert what a data loader yields into a :class:`Batch`.

    Accepted: a ``Batch``; a TorchRec ``KeyedJaggedTensor`` (anything with ``keys()``,
    ``values()``, ``lengths()``), through :meth:`Batch.from_kjt` (zero-copy for int64 CPU
    tensors); an object with a ``sparse_features`` KJT (TorchRec's ``datasets.utils.Batch``); a
    mapping ``{feature: ids}`` (one ID per sample; torch tensors, numpy or lists) or
    ``{feature: (values, lengths)}``; a tuple or list holding one of these (the first found).
    Tensors must be on the CPU. Raises TypeError otherwise (pass ``convert=`` to
    :meth:`Sidecar.attach`).
    """
    if isinstance(item, Batch):
        return item
    if all(callable(getattr(item, a, None)) for a in ("keys", "values", "lengths")) \
            and not isinstance(item, Mapping):
        return Batch.from_kjt(item)
    sf = getattr(item, "sparse_features", None)
    if sf is not None:
        return to_batch(sf)
    if isinstance(item, Mapping) and item:
        if all(isinstance(v, tuple) and len(v) == 2 for v in item.values()):
            return Batch.from_features({k: _np(v[0]) for k, v in item.items()},
                                       {k: _np(v[1]) for k, v in item.items()})
        return Batch.from_features({k: np.ravel(_np(v)) for k, v in item.items()})
    if isinstance(item, (tuple, list)):
        for x in item:
            try:
                return to_batch(x)
            except TypeError:
                continue
    raise TypeError(f"cannot make a flexshard_stream Batch from a {type(item).__name__}: expected "
                    "a Batch, a KeyedJaggedTensor, {feature: ids}, or a tuple holding one; pass "
                    "convert= to Sidecar.attach for other layouts")


def _batch_bytes(b: Batch) -> int:
    n = b.values.nbytes + b.lengths.nbytes
    if b.weights is not None:
        n += b.weights.nbytes
    if b.timestamp is not None:
        n += b.timestamp.nbytes
    return int(n)


def _copy_batch(b: Batch) -> Batch:
    return Batch(b.keys, b.values.copy(), b.lengths.copy(),
                 None if b.weights is None else b.weights.copy(),
                 None if b.timestamp is None else b.timestamp.copy())


# ------------------------------------------------------------------------------- small I/O


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become None, numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, Path):
        return str(x)
    return x


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    with open(path, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def _write_json_atomic(path: Path, doc: Any, *, fsync: bool = True) -> None:
    """Write JSON atomically (``container.write_atomic``)."""
    data = json.dumps(_clean(doc), indent=1, allow_nan=False).encode() + b"\n"
    write_atomic(path, data, fsync=fsync)


def _read_json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise FormatError(f"{path}: expected a JSON object")
    return doc


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------- checkpoints


def _stats_state(stats: Any) -> tuple[dict, dict[str, bytes]]:
    """What to save of a statistics object: (JSON state, {file name: container bytes})."""
    from ..stats.stream import StreamStats
    from ..stats.window import DecayedStats, WindowedStats
    if isinstance(stats, DecayedStats):
        return ({"kind": "decayed", "half_life": stats.half_life, "period": stats.period,
                 "unit": stats.clock.unit, "seen": stats._seen, "next": stats._next,
                 "decays": stats.decays}, {"stats.fss": stats.stats.to_bytes()})
    if isinstance(stats, WindowedStats):
        files = {f"window-{i}.fss": s.to_bytes() for i, (_, s) in enumerate(stats._ring)}
        return ({"kind": "windowed", "window": stats.window, "slots": stats.slots,
                 "unit": stats.clock.unit, "seen": stats._seen,
                 "starts": [float(start) for start, _ in stats._ring]}, files)
    if isinstance(stats, StreamStats):
        return {"kind": "stream"}, {"stats.fss": stats.to_bytes()}
    raise ConfigError(f"the sidecar checkpoints StreamStats, DecayedStats or WindowedStats, not "
                      f"{type(stats).__name__}")


def _stats_is_empty(stats: Any) -> bool:
    from ..stats.window import DecayedStats, WindowedStats
    if isinstance(stats, DecayedStats):
        return stats.stats.batches == 0
    if isinstance(stats, WindowedStats):
        return not stats._ring
    return stats.batches == 0


def _restore_stats(stats: Any, state: Mapping[str, Any], blobs: Mapping[str, bytes],
                   where: Path) -> None:
    """Load checkpointed statistics into the (empty) ``stats`` object, in place."""
    from ..stats.stream import StreamStats
    from ..stats.window import DecayedStats, WindowedStats
    kind = ("decayed" if isinstance(stats, DecayedStats) else
            "windowed" if isinstance(stats, WindowedStats) else "stream")
    if state.get("kind") != kind:
        raise ConfigError(f"checkpoint {where} holds {state.get('kind')} statistics but the "
                          f"sidecar was given {kind} statistics ({type(stats).__name__})")

    def load(name: str, target_configs: Mapping[str, Any], cfg: Any) -> StreamStats:
        loaded = StreamStats.from_bytes(blobs[name], str(where / "stats" / name))
        if loaded.table_configs != dict(target_configs) or loaded.config != cfg:
            raise ConfigError(
                f"checkpoint {where} has statistics for tables "
                f"{sorted(loaded.table_configs)} with sketch config {loaded.config.to_dict()}; the "
                f"sidecar is configured for {sorted(target_configs)} with {cfg.to_dict()}: use a "
                "new out_dir (or resume=False) after changing tables or sketch sizes")
        return loaded

    if kind == "decayed":
        loaded = load("stats.fss", stats.stats.table_configs, stats.stats.config)
        for k in ("half_life", "period", "unit"):
            have = stats.clock.unit if k == "unit" else getattr(stats, k)
            if state[k] != have:
                msg = (f"checkpoint {where}: decayed statistics were made with {k}={state[k]!r}, "
                       f"the sidecar now uses {have!r}; continuing with the new setting")
                log.warning(msg)
                warnings.warn(msg, SidecarWarning, stacklevel=4)
        loaded.threads = stats.stats.threads
        stats.stats = loaded
        stats._seen, stats._next, stats.decays = int(state["seen"]), state["next"], \
            int(state["decays"])
    elif kind == "windowed":
        probe = stats._new()
        ring = collections.deque()
        for i, start in enumerate(state["starts"]):
            ring.append((float(start), load(f"window-{i}.fss", probe.table_configs,
                                            probe.config)))
        stats._ring = ring
        stats._seen = int(state["seen"])
    else:  # in place: the object may be a subclass the caller holds on to
        loaded = load("stats.fss", stats.table_configs, stats.config)
        keep = ("threads", "_pool")
        stats.__dict__.update({k: v for k, v in vars(loaded).items() if k not in keep})


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint directories under ``out_dir/checkpoints``, newest (highest number) first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("ckpt-") and p.name[5:].isdigit():
            found.append((int(p.name[5:]), p))
    return [p for _, p in sorted(found, reverse=True)]


def _manifest_checksum(manifest: Mapping[str, Any]) -> str:
    return _sha256(_canonical({k: v for k, v in manifest.items() if k != "checksum"}))


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, Plan, Plan | None, dict[str, bytes]]:
    """Read and verify one checkpoint directory: ``(manifest, plan, prev_target, stats blobs)``.

    Verifies the manifest's checksum, then the size and sha256 of every file it lists; raises
    :class:`FormatError` naming the damaged or missing file.
    """
    from ..placement.plan import Plan
    path = Path(path)
    mpath = path / "manifest.json"
    m = _read_json(mpath)
    if m.get("format") != CKPT_FORMAT:
        raise FormatError(f"{mpath}: not a sidecar checkpoint manifest")
    if m.get("version") != FORMAT_VERSION:
        raise FormatError(f"{mpath}: checkpoint version {m.get('version')} is not supported "
                          f"(this flexshard_stream reads version {FORMAT_VERSION})")
    try:
        good = m.get("checksum") == _manifest_checksum(m)
    except ValueError:
        good = False
    if not good:
        raise FormatError(f"{mpath}: manifest checksum mismatch: the checkpoint is damaged")
    files = m.get("files")
    if not isinstance(files, dict):
        raise FormatError(f"{mpath}: no file list")
    blobs: dict[str, bytes] = {}
    for rel, spec in files.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts:
            raise FormatError(f"{mpath}: file name {rel!r} leaves the checkpoint")
        f = path / rel
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            raise FormatError(f"{f}: missing (listed in {mpath})") from None
        if len(data) != spec.get("bytes") or _sha256(data) != spec.get("sha256"):
            raise FormatError(f"{f}: checksum mismatch ({len(data)} bytes, manifest says "
                              f"{spec.get('bytes')}): the checkpoint is damaged")
        if parts[0] == "stats":
            blobs[parts[-1]] = data
    plan = Plan.load(path / "plan")
    prev = Plan.load(path / "prev_target") if m.get("has_prev_target") else None
    return m, plan, prev, blobs


@dataclass
class ResumeReport:
    """What a restart found (``Sidecar.resume_report``; also logged).

    checkpoint : str | None       the checkpoint resumed from (None: started empty)
    skipped : list[str]           damaged checkpoints skipped, each with the reason (file named)
    batches_in_checkpoint : int   batches whose statistics the checkpoint holds
    lost_batches, lost_ids : int | None   batches (IDs) accepted after the checkpoint whose
                                  statistics were lost with the previous process; None: unknown
    dropped_after_checkpoint : int | None  batches dropped by the queue policy after the checkpoint
    exact : bool                  True when the counts are exact (ring counters in shared memory);
                                  False: from ``counters.json`` (a lower bound: batches submitted
                                  after its last write, at most ``counters_every_s`` before the
                                  crash, are not counted)
    counted_at : float | None     unix time (s) of the counter record used
    source : str | None           "ring" or "counters"
    plan_seq : int                published plan sequence number in force after the restart
    plan_from : str               "published" (out_dir/plan), "checkpoint" or "initial"
    message : str                 all of the above in one sentence
    """

    checkpoint: str | None = None
    skipped: list[str] = field(default_factory=list)
    batches_in_checkpoint: int = 0
    lost_batches: int | None = None
    lost_ids: int | None = None
    dropped_after_checkpoint: int | None = None
    exact: bool = False
    counted_at: float | None = None
    source: str | None = None
    plan_seq: int = 0
    plan_from: str = "initial"
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _clean(dataclasses.asdict(self))


# ------------------------------------------------------------------------------- counters


@dataclass(frozen=True)
class SidecarStats:
    """A snapshot of the sidecar's counters (this process, unless marked cumulative).

    submitted, accepted, dropped : batches offered to ``submit`` / queued / dropped (policy)
    submitted_ids, accepted_ids, dropped_ids : the same in IDs
    processed, processed_ids : batches (IDs) the ingest thread took off the queue
    rejected : batches the statistics rejected (bad IDs or keys); also in ``errors``
    errors : exceptions in the background threads
    queued_batches, queued_ids, queued_bytes : what waits in the queue now (the lag)
    max_queued_batches, max_queued_ids, max_queued_bytes : high-water marks of the queue
    lag_s : seconds the oldest queued batch has waited (0 when the queue is empty)
    blocked_s : seconds ``submit`` spent waiting for room (block policy)
    ingest_s : seconds the ingest thread spent updating statistics
    checks, checks_coalesced : re-sharder checks run / replaced by a newer one while waiting
    plans_published : plans published after the initial one (one delta each)
    checkpoints : checkpoints written
    batches_in_stats : batches in the statistics (cumulative: restored ones included)
    plan_seq : sequence number of the published plan
    """

    submitted: int
    accepted: int
    dropped: int
    submitted_ids: int
    accepted_ids: int
    dropped_ids: int
    processed: int
    processed_ids: int
    rejected: int
    errors: int
    queued_batches: int
    queued_ids: int
    queued_bytes: int
    max_queued_batches: int
    max_queued_ids: int
    max_queued_bytes: int
    lag_s: float
    blocked_s: float
    ingest_s: float
    checks: int
    checks_coalesced: int
    plans_published: int
    checkpoints: int
    batches_in_stats: int
    plan_seq: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_COUNTER_KEYS = ("submitted", "accepted", "dropped", "submitted_ids", "accepted_ids",
                 "dropped_ids", "processed", "processed_ids")


# ------------------------------------------------------------------------------- the sidecar


class Sidecar:
    """Statistics and re-sharding in background threads, fed by a training loop.

    Parameters
    ----------
    tables : list of EmbeddingTable, or a table TOML file
    topology : Topology, or a topology TOML file / preset name
    batch_size : samples per GPU per iteration (the planner's B)
    out_dir : where plans, deltas, counters and checkpoints are written (created)
    stats : StreamStats | DecayedStats | WindowedStats (default: DecayedStats with a half-life of
        4 checks, keyed by the tables' features). Owned by the sidecar's ingest thread from now on.
    config, memory, model, planner, plan : as for :class:`~flexshard_stream.online.resharder.Resharder`
        (``plan``: the initial plan, default row-wise; ignored when resuming)
    queue_batches : most batches waiting in the queue (>= 1)
    queue_ids, queue_bytes : most IDs / bytes (values, lengths, weights, timestamps) waiting;
        None: no bound. A single batch larger than a bound is accepted only into an empty queue.
    policy : "drop" (``submit`` never waits; a batch that does not fit is dropped and counted) or
        "block" (``submit`` waits for room up to ``block_timeout`` seconds, None: forever, then
        drops and counts)
    checkpoint_every_s : seconds between periodic checkpoints (None or 0: only on close)
    counters_every_s : seconds between rewrites of ``out_dir/counters.json`` (the persisted
        submitted-batches counter that lets a restart count its losses)
    keep_checkpoints, keep_plans, keep_deltas : how many of each to keep on disk
    callback : ``callback(decision, plan)`` after each published change (planner thread)
    resume : restart from the newest good checkpoint in ``out_dir`` (starts empty when there is
        none); with False, ``out_dir`` must not hold a previous run's state
    copy : copy each submitted batch (when the loader reuses its buffers)
    nice : added to the nice value of the two background threads (Linux sets it per thread;
        threads they start inherit it; capped at 19). The default, 19, makes them yield the CPU
        to the training loop (and everything else) when cores are scarce: they fall behind
        instead, and the queue drops and counts. With an idle core it changes nothing. 0: same
        priority as the caller.
    source, source_batches, source_ids : where the batches come from (JSON-able, stored in
        checkpoints) and how many of its batches (IDs) were consumed before this process started
        (the ring command's exact loss accounting)
    """

    def __init__(self, tables: Sequence[EmbeddingTable] | str | os.PathLike,
                 topology: Topology | str | os.PathLike, batch_size: int, *,
                 out_dir: str | os.PathLike, stats: Any = None,
                 config: ReshardConfig | None = None, memory: Any = None, model: Any = None,
                 planner: Any = None, plan: Plan | None = None,
                 queue_batches: int = 64, queue_ids: int | None = 1 << 24,
                 queue_bytes: int | None = 512 << 20, policy: str = "drop",
                 block_timeout: float | None = None, checkpoint_every_s: float | None = 300.0,
                 counters_every_s: float = 1.0, keep_checkpoints: int = 2, keep_plans: int = 4,
                 keep_deltas: int | None = 1000,
                 callback: Callable[[Decision, Plan], None] | None = None,
                 resume: bool = False, copy: bool = False, nice: int = 19,
                 source: Mapping[str, Any] | None = None, source_batches: int = 0,
                 source_ids: int = 0):
        from ..placement.tables import load_tables
        from ..placement.topology import Topology
        from ..stats.config import TableConfig
        from ..stats.window import DecayedStats
        from .resharder import CheckSchedule, ReshardConfig

        if policy not in ("drop", "block"):
            raise ConfigError(f"policy must be 'drop' or 'block', got {policy!r}")
        if isinstance(queue_batches, bool) or int(queue_batches) != queue_batches \
                or queue_batches < 1:
            raise ConfigError(f"queue_batches must be an integer >= 1, got {queue_batches!r}")
        for nm, v in (("queue_ids", queue_ids), ("queue_bytes", queue_bytes)):
            if v is not None and not v >= 1:
                raise ConfigError(f"{nm} must be >= 1 (or None), got {v!r}")
        if block_timeout is not None and not block_timeout >= 0:
            raise ConfigError(f"block_timeout must be >= 0 seconds (or None), got {block_timeout}")
        if not counters_every_s > 0:
            raise ConfigError(f"counters_every_s must be > 0 seconds, got {counters_every_s}")
        if checkpoint_every_s is not None and checkpoint_every_s < 0:
            raise ConfigError(f"checkpoint_every_s must be >= 0 seconds (or None), got "
                              f"{checkpoint_every_s}")
        if keep_checkpoints < 1 or keep_plans < 1 or (keep_deltas is not None and keep_deltas < 1):
            raise ConfigError("keep_checkpoints, keep_plans and keep_deltas must be >= 1")

        self.tables = (load_tables(tables) if isinstance(tables, (str, os.PathLike))
                       else list(tables))
        self.topology = (topology if isinstance(topology, Topology)
                         else Topology.load(topology))
        self.batch_size = int(batch_size)
        self.config = config or ReshardConfig()
        self.out_dir = Path(out_dir)
        self.queue_batches = int(queue_batches)
        self.queue_ids = None if queue_ids is None else int(queue_ids)
        self.queue_bytes = None if queue_bytes is None else int(queue_bytes)
        self.policy = policy
        self.block_timeout = block_timeout
        self.checkpoint_every_s = checkpoint_every_s or None
        self.counters_every_s = float(counters_every_s)
        self.keep_checkpoints, self.keep_plans, self.keep_deltas = \
            int(keep_checkpoints), int(keep_plans), keep_deltas
        self.callback = callback
        self.copy = bool(copy)
        self.nice = int(nice)
        self.source = dict(source or {})
        self._source_base = int(source_batches)
        self._source_ids_base = int(source_ids)

        if stats is None:
            stats = DecayedStats([TableConfig(t.name, t.num_rows, t.feature) for t in self.tables],
                                 half_life=4 * self.config.check_every, unit=self.config.unit)
        from ..stats.stream import StreamStats
        from ..stats.window import WindowedStats
        if not isinstance(stats, (StreamStats, DecayedStats, WindowedStats)):
            raise ConfigError(f"stats must be a StreamStats, DecayedStats or WindowedStats (the "
                              f"sidecar checkpoints them), got {type(stats).__name__}")
        self._stats = stats

        # ---- state shared between threads (guarded by _lock)
        self._lock = threading.Lock()
        self._cv_items = threading.Condition(self._lock)   # ingest thread waits for work
        self._cv_room = threading.Condition(self._lock)    # blocked submitters wait for room
        self._cv_idle = threading.Condition(self._lock)    # flush/checkpoint wait for progress
        self._cv_plan = threading.Condition(self._lock)    # planner thread waits for a check
        self._q: collections.deque = collections.deque()
        self._q_ids = self._q_bytes = 0
        self._c = dict.fromkeys(_COUNTER_KEYS, 0)
        self._c.update(rejected=0, errors=0, checks=0, checks_coalesced=0, plans_published=0,
                       checkpoints=0, max_queued_batches=0, max_queued_ids=0, max_queued_bytes=0)
        self._base = dict.fromkeys(_COUNTER_KEYS, 0)    # cumulative counters of earlier runs
        self._blocked_s = self._ingest_s = 0.0
        self._inflight = False
        self._pending_check: tuple | None = None
        self._planning = False
        self._closing = self._closed = False
        self._stop_ingest = self._stop_plan = False
        self._final_checkpoint = True
        self._ckpt_req = self._ckpt_done = 0
        self._last_ckpt: Path | None = None
        self._error: BaseException | None = None
        self._error_what = ""
        self._more_errors = 0
        self._fatal: BaseException | None = None
        self._dirty = True

        # ---- ingest-thread state
        self._in_stats = 0          # batches in the statistics (cumulative)
        self._in_stats_ids = 0
        self._position = 0          # batches counted for the check schedule (cumulative)
        self._schedule = CheckSchedule(self.config.check_every, self.config.unit)
        self._clock_unit = self.config.unit
        from ..stats.window import Clock
        self._clock = Clock(self.config.unit)
        self._ckpt_seq = 0
        self._ckpt_marker: tuple | None = None
        self._lost_before = 0       # batches lost in earlier crashes (from the checkpoint)
        self._lost_total = 0

        # ---- publishing state (planner thread)
        self._seq = 0
        self._published: Plan | None = None
        self._published_fp: str | None = None
        self._unpublished = False
        self._checks_before = 0

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock_out_dir()
        try:
            self._start(resume, plan, memory, model, planner)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _lock_out_dir(self) -> int:
        """One sidecar per out_dir: an exclusive lock on ``out_dir/.lock`` (released by the
        kernel when the process dies)."""
        import fcntl
        fd = os.open(self.out_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"{self.out_dir} is in use by another sidecar (lock "
                              f"{self.out_dir / '.lock'} held)") from None
        return fd

    def _start(self, resume: bool, plan: Any, memory: Any, model: Any, planner: Any) -> None:
        from .resharder import Resharder
        self._cleanup_tmp()
        self.resume_report = ResumeReport()
        restored = self._resume() if resume else self._fresh_check()
        self.resharder: Resharder = Resharder(
            self.tables, self.topology, self.batch_size, stats=self._stats, memory=memory,
            model=model, planner=planner, config=self.config,
            plan=restored["plan"] if restored else plan, on_change=self._on_change)
        if restored:
            rs = self.resharder
            if restored.get("budget_bytes") is not None and rs.budget_bytes is None:
                rs.budget_bytes = float(restored["budget_bytes"])
            rs.migrated_bytes = float(restored.get("migrated_bytes", 0.0))
            rs._prev_target = restored.get("prev_target")
        if self._published is None:
            self._publish_full(self.resharder.plan, reset=bool(restored))
        self._rs_state = self._snapshot_rs()
        self._write_counters()

        self._t_ingest = threading.Thread(target=self._ingest_main, name="fss-sidecar-ingest",
                                          daemon=True)
        self._t_plan = threading.Thread(target=self._plan_main, name="fss-sidecar-plan",
                                        daemon=True)
        self._t_ingest.start()
        self._t_plan.start()
        # a safety net: drain and checkpoint at interpreter exit if the caller never closed
        self._atexit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)

    # ================================================================== the training-loop side
    def submit(self, batch: Any, *, block: bool | None = None,
               timeout: Any = _UNSET) -> bool:
        """Queue ``batch`` (a Batch, or anything :func:`to_batch` converts) for the statistics.

        Returns True if queued, False if dropped (counted). Never waits under the drop policy;
        under the block policy (or ``block=True``) waits for room up to ``timeout`` seconds
        (default: ``block_timeout``; None: forever). Raises :class:`SidecarError` for a pending
        background error (the batch is then not submitted) or after ``close``.
        """
        if self._error is not None or self._fatal is not None:
            self._raise_pending()
        b = batch if isinstance(batch, Batch) else to_batch(batch)
        if self.copy:
            b = _copy_batch(b)
        nids, nbytes = b.num_values, _batch_bytes(b)
        blk = (self.policy == "block") if block is None else bool(block)
        tmo = self.block_timeout if timeout is _UNSET else timeout
        with self._lock:
            if self._closing:
                raise SidecarError("submit on a closed sidecar")
            c = self._c
            c["submitted"] += 1
            c["submitted_ids"] += nids
            if not self._fits(nids, nbytes) and blk:
                t0 = time.monotonic()
                deadline = None if tmo is None else t0 + tmo
                while not self._fits(nids, nbytes) and not self._closing \
                        and self._fatal is None:
                    wait = None if deadline is None else deadline - time.monotonic()
                    if wait is not None and wait <= 0:
                        break
                    self._cv_room.wait(wait)
                self._blocked_s += time.monotonic() - t0
            if self._closing or not self._fits(nids, nbytes):
                c["dropped"] += 1
                c["dropped_ids"] += nids
                self._dirty = True
                return False
            self._q.append((b, nids, nbytes, time.monotonic()))
            self._q_ids += nids
            self._q_bytes += nbytes
            c["accepted"] += 1
            c["accepted_ids"] += nids
            n = len(self._q)
            c["max_queued_batches"] = max(c["max_queued_batches"], n)
            c["max_queued_ids"] = max(c["max_queued_ids"], self._q_ids)
            c["max_queued_bytes"] = max(c["max_queued_bytes"], self._q_bytes)
            self._dirty = True
            self._cv_items.notify()
        return True

    def _fits(self, nids: int, nbytes: int) -> bool:
        if not self._q:
            return True
        return (len(self._q) < self.queue_batches
                and (self.queue_ids is None or self._q_ids + nids <= self.queue_ids)
                and (self.queue_bytes is None or self._q_bytes + nbytes <= self.queue_bytes))

    def room(self) -> int:
        """Batches the queue can take now (bounds in IDs and bytes not considered)."""
        with self._lock:
            return self.queue_batches - len(self._q)

    def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until the queue has room for one batch (seconds; None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._q) >= self.queue_batches and self._fatal is None \
                    and not self._closing:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return False
                self._cv_room.wait(wait)
            return len(self._q) < self.queue_batches

    def attach(self, loader: Iterable[Any], *,
               convert: Callable[[Any], Batch] | None = None) -> AttachedLoader:
        """Wrap an iterable (e.g. a DataLoader): iterating it yields the loader's items unchanged
        and submits each one (converted by ``convert`` or :func:`to_batch`)."""
        return AttachedLoader(self, loader, convert)

    def _not_from_worker(self, what: str) -> None:
        if threading.current_thread() in (self._t_ingest, self._t_plan):
            raise SidecarError(f"{what} from the sidecar's own thread (e.g. in the callback) "
                               "would wait for itself")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued batch is in the statistics and no check is pending or
        running (seconds; None: forever). True when done, False on timeout. Then raises the
        pending background error, if any."""
        self._not_from_worker("flush")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while (self._q or self._inflight or self._pending_check is not None
                   or self._planning) and self._fatal is None:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return False
                self._cv_idle.wait(wait)
        self._raise_pending()
        return True

    def checkpoint(self, timeout: float | None = None) -> Path:
        """Write a checkpoint now (on the ingest thread, between batches) and return its
        directory. Batches still queued are not in it."""
        self._not_from_worker("checkpoint")
        self._raise_pending()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._closing:
                raise SidecarError("checkpoint on a closed sidecar")
            self._ckpt_req += 1
            want = self._ckpt_req
            self._cv_items.notify()
            while self._ckpt_done < want and self._fatal is None:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"no checkpoint within {timeout} s")
                self._cv_idle.wait(wait)
        self._raise_pending()
        assert self._last_ckpt is not None
        return self._last_ckpt

    def close(self, timeout: float | None = None, *, checkpoint: bool = True) -> None:
        """Stop accepting batches, drain the queue, let a pending check finish, write a final
        checkpoint (unless ``checkpoint=False``) and the counters, stop the threads. Raises a
        pending background error after shutting down. Idempotent."""
        if self._closed:
            return
        self._not_from_worker("close")
        with self._lock:
            self._closing = True
            self._cv_room.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._lock:  # drain
            while (self._q or self._inflight or self._pending_check is not None
                   or self._planning) and self._fatal is None:
                w = left()
                if w == 0.0:
                    break
                self._cv_idle.wait(w)
            self._final_checkpoint = checkpoint
            self._stop_ingest = True
            self._cv_items.notify_all()
        self._t_ingest.join(left())
        with self._lock:
            self._stop_plan = True
            self._cv_plan.notify_all()
        self._t_plan.join(left())
        self._closed = True
        atexit.unregister(self._atexit)
        if not (self._t_ingest.is_alive() or self._t_plan.is_alive()):
            os.close(self._lock_fd)
        if self._t_ingest.is_alive() or self._t_plan.is_alive():
            log.warning("sidecar threads did not finish within %s s; the final checkpoint may "
                        "be missing", timeout)
        self._raise_pending()

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # do not mask the exception in flight
            self.close()
        except Exception:
            log.exception("error while closing the sidecar (after another exception)")

    # ------------------------------------------------------------------ observing
    def stats(self) -> SidecarStats:
        """A snapshot of the counters (:class:`SidecarStats`)."""
        with self._lock:
            c = self._c
            lag = time.monotonic() - self._q[0][3] if self._q else 0.0
            return SidecarStats(
                submitted=c["submitted"], accepted=c["accepted"], dropped=c["dropped"],
                submitted_ids=c["submitted_ids"], accepted_ids=c["accepted_ids"],
                dropped_ids=c["dropped_ids"], processed=c["processed"],
                processed_ids=c["processed_ids"], rejected=c["rejected"], errors=c["errors"],
                queued_batches=len(self._q), queued_ids=self._q_ids, queued_bytes=self._q_bytes,
                max_queued_batches=c["max_queued_batches"], max_queued_ids=c["max_queued_ids"],
                max_queued_bytes=c["max_queued_bytes"], lag_s=lag, blocked_s=self._blocked_s,
                ingest_s=self._ingest_s, checks=c["checks"],
                checks_coalesced=c["checks_coalesced"], plans_published=c["plans_published"],
                checkpoints=c["checkpoints"], batches_in_stats=self._in_stats,
                plan_seq=self._seq)

    @property
    def counters(self) -> dict[str, Any]:
        """:meth:`stats` as a dict."""
        return self.stats().to_dict()

    @property
    def plan(self) -> Plan:
        """The plan in force (the last one published)."""
        return self.resharder.plan

    @property
    def history(self) -> list:
        """The re-sharder's decisions of this process (deltas kept on the last 8 only)."""
        return self.resharder.history

    @property
    def stats_object(self) -> Any:
        """The statistics object (read it only after :meth:`flush` or :meth:`close`)."""
        return self._stats

    def pop_error(self) -> BaseException | None:
        """Take the pending background error without raising it (None if there is none)."""
        with self._lock:
            e, self._error, self._more_errors = self._error, None, 0
            return e

    def _raise_pending(self) -> None:
        if self._fatal is not None:
            raise SidecarError(f"the sidecar's background thread died: "
                               f"{type(self._fatal).__name__}: {self._fatal}") from self._fatal
        with self._lock:
            e, what, more = self._error, self._error_what, self._more_errors
            self._error, self._more_errors = None, 0
        if e is not None:
            extra = f" (and {more} more, see the log)" if more else ""
            raise SidecarError(f"sidecar background error in {what}: "
                               f"{type(e).__name__}: {e}{extra}") from e

    def _record_error(self, e: BaseException, what: str) -> None:
        log.error("sidecar %s failed: %s: %s", what, type(e).__name__, e,
                  exc_info=(type(e), e, e.__traceback__))
        with self._lock:
            self._c["errors"] += 1
            if self._error is None:
                self._error, self._error_what = e, what
            else:
                self._more_errors += 1

    # ================================================================== ingest thread
    def _renice(self) -> None:
        if not self.nice:
            return
        try:
            tid = threading.get_native_id()
            cur = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, max(-20, min(19, cur + self.nice)))
        except (OSError, AttributeError) as e:  # not Linux, or not allowed (negative values)
            log.warning("sidecar: cannot change the thread priority by %+d: %s", self.nice, e)

    def _ingest_main(self) -> None:
        self._renice()
        try:
            self._ingest_loop()
        except BaseException as e:  # a bug: make every waiter see it
            log.critical("sidecar ingest thread died", exc_info=True)
            with self._lock:
                self._fatal = e
                self._cv_room.notify_all()
                self._cv_idle.notify_all()
                self._cv_plan.notify_all()

    def _ingest_loop(self) -> None:
        now = time.monotonic()
        next_counters = now + self.counters_every_s
        next_ckpt = None if self.checkpoint_every_s is None else now + self.checkpoint_every_s
        while True:
            with self._lock:
                while (not self._q and not self._stop_ingest
                       and self._ckpt_req <= self._ckpt_done):
                    now = time.monotonic()
                    due = min(next_counters, next_ckpt if next_ckpt is not None else math.inf)
                    if now >= due:
                        break
                    self._cv_items.wait(due - now)
                item = None
                if self._q:
                    item = self._q.popleft()
                    self._q_ids -= item[1]
                    self._q_bytes -= item[2]
                    self._inflight = True
                    self._cv_room.notify_all()
                stop = self._stop_ingest and not self._q and item is None
                want_ckpt = self._ckpt_req > self._ckpt_done
            if item is not None:
                self._ingest(item)
            now = time.monotonic()
            if want_ckpt or (next_ckpt is not None and now >= next_ckpt) \
                    or (stop and self._final_checkpoint):
                self._do_checkpoint(force=want_ckpt)
                now = time.monotonic()
                if next_ckpt is not None:
                    next_ckpt = now + self.checkpoint_every_s
            if stop or now >= next_counters:
                try:
                    self._write_counters(closed=stop)
                except Exception as e:  # noqa: BLE001
                    self._record_error(e, "writing counters.json")
                next_counters = now + self.counters_every_s
            if stop:
                return

    def _ingest(self, item: tuple) -> None:
        from ..errors import BatchError
        b, nids = item[0], item[1]
        t0 = time.perf_counter()
        ok = False
        try:
            self._stats.update(b)
            ok = True
        except BatchError as e:
            self._record_error(e, "statistics update (batch rejected, skipped)")
            with self._lock:
                self._c["rejected"] += 1
        except Exception as e:  # noqa: BLE001
            self._record_error(e, "statistics update")
        job = None
        if ok:
            self._in_stats += 1
            self._in_stats_ids += nids
            self._position += 1
            try:
                job = self._check_due(b, self._clock)
            except Exception as e:  # noqa: BLE001
                self._record_error(e, "summarizing the statistics for a check")
        dt = time.perf_counter() - t0
        with self._lock:
            self._ingest_s += dt
            self._c["processed"] += 1
            self._c["processed_ids"] += nids
            if job is not None:
                if self._pending_check is not None:
                    self._c["checks_coalesced"] += 1
                self._pending_check = job
                self._cv_plan.notify()
            self._inflight = False
            self._dirty = True
            self._cv_idle.notify_all()

    def _check_due(self, b: Batch, clock: Any) -> tuple | None:
        """The Resharder's schedule (every ``check_every`` batches or seconds): the summary and
        position of a due check, else None."""
        cfg = self.config
        pos = clock.position(b, self._position)
        if not self._schedule.due(pos):
            return None
        s = self._stats
        view = s.view() if hasattr(s, "view") else s
        return view.summary(cfg.top_k), float(pos), self._in_stats

    # ================================================================== planner thread
    def _plan_main(self) -> None:
        self._renice()
        try:
            self._plan_loop()
        except BaseException as e:
            log.critical("sidecar planner thread died", exc_info=True)
            with self._lock:
                self._fatal = e
                self._cv_room.notify_all()
                self._cv_idle.notify_all()

    def _plan_loop(self) -> None:
        rs = self.resharder
        while True:
            with self._lock:
                while self._pending_check is None and not self._stop_plan:
                    self._cv_plan.wait()
                stop = self._pending_check is None
                job, self._pending_check = self._pending_check, None
                self._planning = not stop
            if stop:
                self._retry_publish()
                return
            sums, pos, in_stats = job
            try:
                self._retry_publish()
                n0 = len(rs.history)
                d = rs.check(sums, position=pos)
                with self._lock:
                    self._c["checks"] += 1
                try:
                    with open(self.out_dir / "decisions.jsonl", "a") as f:
                        doc = _clean(d.to_json())
                        doc["batches_in_stats"] = in_stats
                        doc["time"] = time.time()
                        f.write(json.dumps(doc) + "\n")
                except Exception as e:  # noqa: BLE001
                    self._record_error(e, "writing decisions.jsonl")
                for old in rs.history[max(0, n0 - 8):-8]:
                    old.delta = None  # bounded memory on long runs
                if d.delta is not None and self.callback is not None:
                    try:
                        self.callback(d, rs.plan)
                    except Exception as e:  # noqa: BLE001
                        self._record_error(e, "callback")
            except Exception as e:  # noqa: BLE001
                self._record_error(e, "re-sharder check / publishing")
            finally:
                snap = self._snapshot_rs()
                with self._lock:
                    self._rs_state = snap
                    self._planning = False
                    self._cv_idle.notify_all()

    def _snapshot_rs(self) -> dict:
        rs = self.resharder
        return {"plan": rs.plan, "prev_target": rs._prev_target,
                "budget_bytes": rs.budget_bytes, "migrated_bytes": rs.migrated_bytes,
                "checks": self._checks_before + len(rs.history), "plan_seq": self._seq,
                "plan_fingerprint": self._published_fp}

    # ================================================================== publishing
    def _on_change(self, decision: Decision, plan: Plan) -> None:
        """Resharder hook (planner thread): publish the new plan and its delta."""
        from ..placement.delta import PlanDelta
        delta = decision.delta
        if delta is None or delta.base_fingerprint != self._published_fp:
            delta = PlanDelta.between(self._published, plan)  # a publish failed before
        self._unpublished = True
        self._publish(plan, delta, decision)
        self._unpublished = False

    def _retry_publish(self) -> None:
        """The re-sharder moved to a plan whose publication failed: publish it now."""
        from ..placement.delta import PlanDelta
        if not self._unpublished:
            return
        try:
            plan = self.resharder.plan
            self._publish(plan, PlanDelta.between(self._published, plan), None)
            self._unpublished = False
        except Exception as e:  # noqa: BLE001
            self._record_error(e, "publishing (retry)")

    def _publish(self, plan: Plan, delta: Any, decision: Any) -> None:
        from ..placement.delta import plan_fingerprint
        seq = self._seq + 1
        (self.out_dir / "deltas").mkdir(exist_ok=True)
        rel_delta = f"deltas/{seq:06d}.delta"
        delta.save(self.out_dir / rel_delta)
        fp = plan_fingerprint(plan)
        rel_plan = f"plans/{seq:06d}"
        plan.save(self.out_dir / rel_plan)
        _write_json_atomic(self.out_dir / "state.json", {
            "format": STATE_FORMAT, "version": FORMAT_VERSION, "seq": seq, "plan": rel_plan,
            "plan_fingerprint": fp, "delta": rel_delta, "base_fingerprint": self._published_fp,
            "reset": False, "time": time.time(), "pid": os.getpid(),
            "batches_in_stats": self._in_stats,
            "decision": None if decision is None else decision.to_json()})
        self._seq, self._published, self._published_fp = seq, plan, fp
        self._link_plan(rel_plan)
        with self._lock:
            self._c["plans_published"] += 1
        self._prune(self.out_dir / "deltas", self.keep_deltas, ".delta")
        log.info("sidecar published plan %d (%s)", seq, decision.reason if decision else "")

    def _publish_full(self, plan: Plan, *, reset: bool) -> None:
        """Publish ``plan`` without a delta: the first plan of a run (seq 0), or after a restart
        that could not trust the published state (``reset``: readers reload the plan)."""
        from ..placement.delta import plan_fingerprint
        seq = self._next_free_seq() if reset else 0
        fp = plan_fingerprint(plan)
        rel_plan = f"plans/{seq:06d}"
        plan.save(self.out_dir / rel_plan)
        _write_json_atomic(self.out_dir / "state.json", {
            "format": STATE_FORMAT, "version": FORMAT_VERSION, "seq": seq, "plan": rel_plan,
            "plan_fingerprint": fp, "delta": None, "base_fingerprint": None, "reset": reset,
            "time": time.time(), "pid": os.getpid(), "batches_in_stats": self._in_stats,
            "decision": None})
        self._seq, self._published, self._published_fp = seq, plan, fp
        self._link_plan(rel_plan)

    def _next_free_seq(self) -> int:
        seqs = [self._seq]
        for sub, suf in (("deltas", ".delta"), ("plans", "")):
            d = self.out_dir / sub
            if d.is_dir():
                for p in d.iterdir():
                    stem = p.name[:-len(suf)] if suf and p.name.endswith(suf) else p.name
                    if stem.isdigit():
                        seqs.append(int(stem))
        return max(seqs) + 1

    def _link_plan(self, rel: str) -> None:
        """Point ``out_dir/plan`` at ``rel`` (atomic rename of a new symlink), prune old plans."""
        link = self.out_dir / "plan"
        tmp = self.out_dir / f".plan.{os.getpid()}.link.tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.symlink(rel, tmp)
        if link.exists() and not link.is_symlink():  # a real directory from elsewhere
            shutil.rmtree(link)
        os.replace(tmp, link)  # readers see the old plan or the new one, never none
        _fsync_dir(self.out_dir)
        self._prune(self.out_dir / "plans", self.keep_plans, "")

    @staticmethod
    def _prune(d: Path, keep: int | None, suffix: str) -> None:
        if keep is None or not d.is_dir():
            return
        items = []
        for p in d.iterdir():
            stem = p.name[:-len(suffix)] if suffix and p.name.endswith(suffix) else p.name
            if stem.isdigit():
                items.append((int(stem), p))
        for _, p in sorted(items)[:-keep]:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    # ================================================================== counters / checkpoints
    def _cumulative(self) -> dict[str, int]:
        """Counters of this run plus those of earlier runs (call with the lock held)."""
        return {k: self._base[k] + self._c[k] for k in _COUNTER_KEYS}

    def _write_counters(self, closed: bool = False) -> None:
        with self._lock:
            if not self._dirty and not closed:
                return
            self._dirty = False
            doc = self._cumulative()
            q = len(self._q)
            doc.update(format="flexshard-sidecar-counters", version=FORMAT_VERSION,
                       time=time.time(), pid=os.getpid(), queued=q,
                       batches_in_stats=self._in_stats, checkpoint_seq=self._ckpt_seq,
                       lost=self._lost_total, closed=closed, source=dict(self.source),
                       source_batches=self._source_base + self._c["processed"])
        # no fsync: it survives the process (kill -9), not necessarily a power loss
        _write_json_atomic(self.out_dir / "counters.json", doc, fsync=False)

    def _do_checkpoint(self, force: bool) -> None:
        with self._lock:
            marker = (self._c["processed"], self._rs_state["plan_seq"], self._c["checks"])
        path = None
        if force or marker != self._ckpt_marker:  # nothing new: no new checkpoint
            try:
                path = self._write_checkpoint()
                self._ckpt_marker = marker
            except Exception as e:  # noqa: BLE001
                self._record_error(e, "checkpoint")
        with self._lock:
            if path is not None:
                self._last_ckpt = path
                self._c["checkpoints"] += 1
            self._ckpt_done = self._ckpt_req
            self._cv_idle.notify_all()

    def _write_checkpoint(self) -> Path:
        root = self.out_dir / "checkpoints"
        root.mkdir(exist_ok=True)
        seq = self._ckpt_seq + 1
        tmp = Path(tempfile.mkdtemp(prefix=f".ckpt-{seq:08d}.", suffix=".tmp", dir=root))
        try:
            state, blobs = _stats_state(self._stats)
            (tmp / "stats").mkdir()
            for name, data in blobs.items():
                _write_bytes(tmp / "stats" / name, data)
            with self._lock:
                rs = dict(self._rs_state)
                cum = self._cumulative()
                source_batches = self._source_base + self._c["processed"]
                source_ids = self._source_ids_base + self._c["processed_ids"]
            rs["plan"].save(tmp / "plan")
            if rs["prev_target"] is not None:
                rs["prev_target"].save(tmp / "prev_target")
            files = {}
            for p in sorted(tmp.rglob("*")):
                if p.is_file():
                    data = p.read_bytes()
                    files[p.relative_to(tmp).as_posix()] = {"bytes": len(data),
                                                            "sha256": _sha256(data)}
            m = {"format": CKPT_FORMAT, "version": FORMAT_VERSION, "seq": seq,
                 "created": time.time(), "pid": os.getpid(),
                 "batches": self._in_stats, "ids": self._in_stats_ids,
                 "counters": cum, "lost": self._lost_total,
                 "source": dict(self.source), "source_batches": source_batches,
                 "source_ids": source_ids,
                 "stats": state,
                 "schedule": {"position": self._position, "next_check": self._schedule.next,
                              "unit": self._clock_unit},
                 "resharder": {"budget_bytes": rs["budget_bytes"],
                               "migrated_bytes": rs["migrated_bytes"], "checks": rs["checks"]},
                 "plan_seq": rs["plan_seq"], "plan_fingerprint": rs["plan_fingerprint"],
                 "has_prev_target": rs["prev_target"] is not None, "files": files}
            m = _clean(m)
            m["checksum"] = _manifest_checksum(m)
            _write_bytes(tmp / "manifest.json", json.dumps(m, indent=1).encode() + b"\n")
            _fsync_dir(tmp)
            final = root / f"ckpt-{seq:08d}"
            os.replace(tmp, final)
            _fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._ckpt_seq = seq
        for old in list_checkpoints(self.out_dir)[self.keep_checkpoints:]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("sidecar checkpoint %s: %d batches", final, self._in_stats)
        return final

    def _cleanup_tmp(self) -> None:
        """Remove temp files and directories a killed process left behind (hidden entries of the
        sidecar's own subdirectories, and its own temp files in ``out_dir``)."""
        for d in (self.out_dir, self.out_dir / "checkpoints", self.out_dir / "plans",
                  self.out_dir / "deltas"):
            if not d.is_dir():
                continue
            for p in d.iterdir():
                ours = p.name.startswith(".") and p.name != ".lock" and (
                    d != self.out_dir or p.name.startswith((".state.json.", ".counters.json.",
                                                            ".plan.")))
                if ours:
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)

    # ================================================================== start / resume
    def _fresh_check(self) -> None:
        if (self.out_dir / "state.json").exists() or list_checkpoints(self.out_dir):
            raise ConfigError(f"{self.out_dir} holds the state of a previous sidecar run; pass "
                              "resume=True to continue it, or use an empty directory")

    def _warn(self, msg: str) -> None:
        log.warning(msg)
        warnings.warn(msg, SidecarWarning, stacklevel=5)

    def _resume(self) -> dict | None:
        """Restore the newest good checkpoint and the published plan; fill ``resume_report``."""
        from ..placement.delta import plan_fingerprint
        from ..placement.plan import Plan
        rep = self.resume_report
        ckpt = None
        for path in list_checkpoints(self.out_dir):
            try:
                m, plan, prev, blobs = read_checkpoint(path)
            except FormatError as e:
                rep.skipped.append(f"{path.name}: {e}")
                continue
            self._check_compatible(plan, path)
            ckpt = (path, m, plan, prev, blobs)
            break
        if rep.skipped:
            where = f"resuming from {ckpt[0].name}" if ckpt else "no good checkpoint left"
            self._warn("skipped damaged checkpoint(s): " + "; ".join(rep.skipped) + f"; {where}")
        restored: dict = {}
        if ckpt is not None:
            path, m, plan, prev, blobs = ckpt
            if not _stats_is_empty(self._stats):
                raise ConfigError("resume=True needs empty statistics: the checkpoint's are "
                                  "loaded into them")
            _restore_stats(self._stats, m["stats"], blobs, path)
            self._in_stats, self._in_stats_ids = int(m["batches"]), int(m["ids"])
            sch = m["schedule"]
            self._position = int(sch["position"])
            if sch["unit"] == self.config.unit:
                self._schedule.next = sch["next_check"]
            self._ckpt_seq = int(m["seq"])
            self._checks_before = int(m["resharder"]["checks"])
            self._lost_before = int(m.get("lost", 0))
            restored = {"plan": plan, "prev_target": prev,
                        "budget_bytes": m["resharder"]["budget_bytes"],
                        "migrated_bytes": m["resharder"]["migrated_bytes"],
                        "fingerprint": m.get("plan_fingerprint"), "plan_seq": m["plan_seq"]}
            rep.checkpoint = str(path)
            rep.batches_in_checkpoint = int(m["batches"])
            rep.plan_from = "checkpoint"
        else:
            m = None
        for p in list_checkpoints(self.out_dir):
            self._ckpt_seq = max(self._ckpt_seq, int(p.name[5:]))

        # ---- the published plan: what the training job has; prefer it when it is intact
        state = None
        try:
            state = _read_json(self.out_dir / "state.json")
            if state.get("format") != STATE_FORMAT:
                raise FormatError(f"{self.out_dir / 'state.json'}: not a sidecar state file")
            pub = Plan.load(self.out_dir / state["plan"])
            fp = plan_fingerprint(pub)
            if fp != state.get("plan_fingerprint"):
                raise FormatError(f"{self.out_dir / state['plan']}: does not match the "
                                  "fingerprint in state.json")
            self._check_compatible(pub, self.out_dir / state["plan"])
            self._seq, self._published, self._published_fp = int(state["seq"]), pub, fp
            if not restored:
                restored = {"plan": pub, "prev_target": None}
            elif plan_fingerprint(restored["plan"]) != fp:
                # plans moved on after the checkpoint: the training job has the published one
                restored.update(plan=pub, prev_target=None)
            rep.plan_from = "published"
            link = self.out_dir / "plan"
            if not link.is_symlink() or os.readlink(link) != state["plan"]:
                self._link_plan(state["plan"])  # a crash between state.json and the link
        except FormatError as e:
            if (self.out_dir / "state.json").exists() or state is not None:
                self._warn(f"the published plan cannot be used ({e}); republishing the "
                           f"{'checkpoint' if ckpt else 'initial'} plan as a reset")
            if state is not None and isinstance(state.get("seq"), int):
                self._seq = max(self._seq, int(state["seq"]))
        except KeyError as e:
            self._warn(f"{self.out_dir / 'state.json'} lacks {e}; republishing the plan as a "
                       "reset")
        rep.plan_seq = self._seq

        # ---- cumulative counters and the loss since the checkpoint
        cnt = None
        try:
            cnt = _read_json(self.out_dir / "counters.json")
            if not all(isinstance(cnt.get(k), int) for k in _COUNTER_KEYS):
                raise FormatError(f"{self.out_dir / 'counters.json'}: counters missing")
        except FormatError as e:
            if (self.out_dir / "counters.json").exists():
                self._warn(f"counters file unusable ({e}); the loss since the checkpoint is "
                           "unknown")
            cnt = None
        mc = m["counters"] if m is not None else dict.fromkeys(_COUNTER_KEYS, 0)
        if cnt is not None and cnt["accepted"] >= mc["accepted"] \
                and cnt["processed"] >= mc["processed"]:
            rep.lost_batches = cnt["accepted"] - mc["processed"]
            rep.lost_ids = cnt["accepted_ids"] - mc["processed_ids"]
            rep.dropped_after_checkpoint = cnt["dropped"] - mc["dropped"]
            rep.counted_at = float(cnt["time"])
            rep.source = "counters"
            # written at a clean shutdown (nothing was accepted after it): the count is exact
            rep.exact = bool(cnt.get("closed"))
            base = {k: int(cnt[k]) for k in _COUNTER_KEYS}
        else:
            base = {k: int(mc[k]) for k in _COUNTER_KEYS}
        # lost batches count as processed: the queue of the dead process is gone
        base["processed"], base["processed_ids"] = base["accepted"], base["accepted_ids"]
        self._base = base
        self._lost_total = self._lost_before + (rep.lost_batches or 0)
        rep.message = self._resume_message()
        (log.warning if (rep.lost_batches or rep.skipped) else log.info)("%s", rep.message)
        return restored or None

    def _resume_message(self) -> str:
        r = self.resume_report
        if r.checkpoint is None:
            head, since = "no usable checkpoint: statistics start empty", "the previous run(s)"
        else:
            head = (f"resumed from {Path(r.checkpoint).name} ({r.batches_in_checkpoint} batches "
                    "in its statistics)")
            since = "it"
        if r.lost_batches is None:
            loss = (f"batches accepted after {since} are lost; how many is unknown (no usable "
                    "counters)")
        else:
            when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.counted_at))
                    if r.counted_at else "?")
            kind = "exactly" if r.exact else "at least"
            ids = "" if r.lost_ids is None else f" ({r.lost_ids} IDs)"
            loss = (f"{kind} {r.lost_batches} batches{ids} accepted after {since} were lost" +
                    ("" if r.exact else f" (counted up to {when}; batches submitted after that "
                     "are not counted)"))
            if r.dropped_after_checkpoint:
                loss += f"; {r.dropped_after_checkpoint} were dropped by the queue policy"
        return f"{head}; {loss}; plan {r.plan_seq} from the {r.plan_from} state"

    def _check_compatible(self, plan: Plan, where: Path) -> None:
        have = {n: tp.table for n, tp in plan.tables.items()}
        want = {t.name: t for t in self.tables}
        if plan.topology != self.topology or have != want:
            raise ConfigError(f"{where} was made for other tables or another topology than this "
                              "sidecar's; use a new out_dir (or resume=False) after changing them")

    def __repr__(self) -> str:
        s = self.stats()
        return (f"Sidecar({str(self.out_dir)!r}, policy={self.policy!r}, "
                f"accepted={s.accepted}, dropped={s.dropped}, queued={s.queued_batches}, "
                f"plan_seq={s.plan_seq}{', closed' if self._closed else ''})")


def _close_at_exit(ref: weakref.ref[Sidecar]) -> None:
    sc = ref()
    if sc is not None and not sc._closed:
        log.warning("sidecar %s was not closed: closing it at exit (final checkpoint)",
                    sc.out_dir)
        try:
            sc.close(timeout=60)
        except Exception:
            log.exception("closing the sidecar at exit failed")


class AttachedLoader:
    """An iterable wrapping a data loader: yields its items unchanged, submitting each one to the
    sidecar first. ``len()`` and other attributes are the loader's."""

    def __init__(self, sidecar: Sidecar, loader: Iterable[Any],
                 convert: Callable[[Any], Batch] | None = None):
        self.sidecar, self.loader, self.convert = sidecar, loader, convert or to_batch

    def __iter__(self) -> Iterator[Any]:
        for item in self.loader:
            self.sidecar.submit(self.convert(item))
            yield item

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


# ------------------------------------------------------------------------------- ring command


def _emit(doc: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(_clean(dict(doc))) + "\n")
    sys.stdout.flush()


def run_ring(ring: str, tables: Any, topology: Any, out: str | os.PathLike, *,
             batch_size: int = 512, ring_dir: str | os.PathLike | None = None, slots: int = 8,
             capacity_bytes: int = 64 << 20, checksum: bool = False,
             config: ReshardConfig | None = None, half_life: float | None = None,
             memory: Any = None, model: Any = None, checkpoint_every_s: float | None = 60.0,
             queue_batches: int = 64, resume: bool = True, status_every_s: float = 0.0,
             unlink: bool = False, stop: threading.Event | None = None,
             emit: Callable[[Mapping[str, Any]], None] = _emit,
             handle_signals: bool = True) -> dict[str, Any]:
    """Consume ring ``ring`` (created if missing) into a :class:`Sidecar` until ``stop`` is set
    or SIGTERM/SIGINT arrives; then close it (final checkpoint). Returns the final report.

    ``emit`` receives JSON-able events: ``resume``, ``ready``, ``status`` (every
    ``status_every_s`` seconds, 0: never) and ``stopped``. Records left in the ring at shutdown
    stay there for the next run (unless ``unlink``: then they are drained first and the ring file
    removed).
    """
    from ..placement.tables import load_tables
    from ..placement.topology import Topology
    from ..stats.config import TableConfig
    from ..stats.window import DecayedStats
    from .resharder import ReshardConfig
    from .ring import Ring

    stop = stop or threading.Event()
    got_signal: list[str] = []
    old_handlers = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, _frame: Any) -> None:
            got_signal.append(signal.Signals(signum).name)
            stop.set()
        for s in (signal.SIGTERM, signal.SIGINT):
            old_handlers[s] = signal.signal(s, on_signal)
    try:
        tabs = load_tables(tables) if isinstance(tables, (str, os.PathLike)) else list(tables)
        topo = topology if isinstance(topology, Topology) else Topology.load(topology)
        cfg = config or ReshardConfig()
        stats = DecayedStats([TableConfig(t.name, t.num_rows, t.feature) for t in tabs],
                             half_life=half_life or 4 * cfg.check_every, unit=cfg.unit)
        r = Ring.create(ring, slots=slots, capacity_bytes=capacity_bytes, directory=ring_dir,
                        checksum=checksum, exist_ok=True)
        try:
            before = r.stats()
            if before.consumer_alive:
                raise FlexShardError(f"ring {r.path} already has a live consumer (pid "
                                     f"{before.consumer_pid}); one sidecar per ring")
            read0, ids0 = before.total.batches_read, before.total.ids_read
            src = {"kind": "ring", "path": str(r.path), "ring_id": r.ring_id}
            sc = Sidecar(tabs, topo, batch_size, out_dir=out, stats=stats, config=cfg,
                         memory=memory, model=model, queue_batches=queue_batches, queue_ids=None,
                         queue_bytes=None, policy="block", checkpoint_every_s=checkpoint_every_s,
                         resume=resume, nice=0, source=src, source_batches=read0, source_ids=ids0)
            _ring_loss(sc, r, read0, ids0)
            emit({"event": "resume", **sc.resume_report.to_dict()})
            emit({"event": "ready", "ring": str(r.path), "pid": os.getpid(), "slots": r.slots,
                  "slot_capacity": r.slot_capacity, "out": str(out),
                  "ring_batches_read": read0})
            errors = 0
            next_status = time.monotonic() + status_every_s if status_every_s else math.inf
            nap = 1e-3
            try:
                while not stop.is_set():
                    errors += _log_errors(sc)
                    room = sc.room()
                    if room <= 0:
                        sc.wait_for_room(0.2)
                        continue
                    got = r.poll(max_batches=room)
                    if got:
                        errors += _submit_all(sc, got)
                        nap = 1e-3
                    else:  # idle: back off to 20 ms between polls (about 50 wake-ups/s)
                        stop.wait(nap)
                        nap = min(2 * nap, 0.02)
                    if time.monotonic() >= next_status:
                        next_status = time.monotonic() + status_every_s
                        emit({"event": "status", **sc.stats().to_dict(),
                              "ring_dropped": r.stats().total.batches_dropped})
                if unlink:
                    while True:
                        room = sc.room()
                        if room <= 0:
                            sc.wait_for_room(1.0)
                            continue
                        got = r.poll(max_batches=room)
                        if not got:
                            break
                        errors += _submit_all(sc, got)
            finally:
                close_err = None
                try:
                    sc.close()
                except SidecarError as e:
                    close_err = e
                    log.error("%s", e)
            errors += _log_errors(sc) + (close_err is not None)
            rst = r.stats().total
            doc = {"event": "stopped", "signal": got_signal[0] if got_signal else None,
                   "checkpoint": str(sc._last_ckpt) if sc._last_ckpt else None,
                   **sc.stats().to_dict(), "errors_reported": errors,
                   "ring": {"batches_written": rst.batches_written,
                            "batches_read": rst.batches_read,
                            "batches_dropped": rst.batches_dropped,
                            "ids_dropped": rst.ids_dropped,
                            "records_discarded": rst.records_discarded,
                            "lag_bytes": rst.lag_bytes}}
            emit(doc)
            return doc
        finally:
            r.close()
            if unlink:
                r.unlink()
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)


def _submit_all(sc: Sidecar, batches: list[Batch]) -> int:
    """Submit every batch (block policy, room reserved: always accepted). A background error
    raised by ``submit`` (already logged) is counted and the batch submitted again."""
    errors = 0
    for b in batches:
        try:
            sc.submit(b)
        except SidecarError:
            if sc._fatal is not None:
                raise
            errors += 1
            sc.submit(b)
    return errors


def _log_errors(sc: Sidecar) -> int:
    """Background errors are already logged by the sidecar; the ring loop goes on."""
    n = 0
    while sc.pop_error() is not None:
        n += 1
    return n


def _ring_loss(sc: Sidecar, ring: Any, read0: int, ids0: int) -> None:
    """Exact loss with a ring: ring batches read (shared-memory counter) minus those in the
    checkpoint. Replaces the counters-based estimate when the checkpoint was made on this ring."""
    rep = sc.resume_report
    if rep.checkpoint is None:
        return
    m = _read_json(Path(rep.checkpoint) / "manifest.json")
    src = m.get("source") or {}
    if src.get("kind") == "ring" and src.get("ring_id") == ring.ring_id \
            and read0 >= int(m["source_batches"]):
        rep.lost_batches = read0 - int(m["source_batches"])
        rep.lost_ids = ids0 - int(m.get("source_ids", 0))
        rep.exact, rep.source, rep.counted_at = True, "ring", time.time()
        sc._lost_total = sc._lost_before + rep.lost_batches
        rep.message = sc._resume_message()
        (log.warning if rep.lost_batches else log.info)("%s", rep.message)
        return
    if src.get("kind") == "ring":
        rep.message = sc._resume_message() + ("; the ring was created anew since the checkpoint, "
                                              "so its counters cannot tell the loss")


def sidecar_command(
        ring: str = typer.Option(..., "--ring", help="Shared-memory ring name (created if "
                                 "missing; DataLoader workers write into it)."),
        tables: Path = typer.Option(..., "--tables", help="Table TOML file."),
        topology: str = typer.Option(..., "--topology", help="Topology TOML file or preset."),
        out: Path = typer.Option(..., "--out", help="Directory for plans, deltas, counters and "
                                 "checkpoints."),
        batch_size: int = typer.Option(512, help="Samples per GPU per iteration (B)."),
        ring_dir: Path | None = typer.Option(None, help="Directory of the ring file "
                                                "(default /dev/shm)."),
        slots: int = typer.Option(8, help="Producer slots when creating the ring (>= number of "
                                  "writer processes)."),
        capacity_mb: float = typer.Option(64.0, help="Ring capacity when creating it (MiB, "
                                          "shared by the slots)."),
        checksum: bool = typer.Option(False, help="CRC-32 on every ring record."),
        check_every: float = typer.Option(64.0, help="Batches (or seconds, --unit seconds) "
                                          "between re-sharder checks."),
        unit: str = typer.Option("batches", help="batches | seconds"),
        half_life: float | None = typer.Option(None, help="Half-life of the decayed "
                                                  "statistics (default 4 checks)."),
        top_k: int = typer.Option(4096, help="Rows per table summarized for the planner."),
        horizon: float = typer.Option(1000.0, help="Iterations over which a saving must beat "
                                      "the migration."),
        memory_bytes: float | None = typer.Option(None, help="Per-GPU memory budget (bytes; "
                                                     "default: row-wise peak)."),
        dedup: bool = typer.Option(True, help="Plan for in-batch de-duplication."),
        checkpoint_every: float = typer.Option(60.0, help="Seconds between checkpoints (0: only "
                                               "at shutdown)."),
        queue_batches: int = typer.Option(64, help="In-process queue between the ring and the "
                                          "statistics (batches)."),
        resume: bool = typer.Option(True, help="Resume from the last good checkpoint in --out."),
        status_every: float = typer.Option(0.0, help="Print a status line every this many "
                                           "seconds (0: never)."),
        unlink: bool = typer.Option(False, help="At shutdown, drain the ring and remove it."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress to stderr.")):
    """Consume a shared-memory ring of batches: statistics, re-sharding, published plans and
    deltas, checkpoints; clean shutdown (final checkpoint) on SIGTERM/SIGINT. Prints JSON lines
    (events resume, ready, status, stopped) on stdout."""
    from ..placement.cost import CostModel
    from ..placement.planner import MemoryPolicy
    from .resharder import ReshardConfig

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
                            stream=sys.stderr)
    cfg = ReshardConfig(check_every=check_every, unit=unit, horizon_iterations=horizon,
                        top_k=top_k)
    warnings.simplefilter("default", SidecarWarning)
    doc = run_ring(ring, tables, topology, out, batch_size=batch_size, ring_dir=ring_dir,
                   slots=slots, capacity_bytes=int(capacity_mb * (1 << 20)), checksum=checksum,
                   config=cfg, half_life=half_life, memory=MemoryPolicy(bytes_per_gpu=memory_bytes),
                   model=CostModel(dedup=dedup), checkpoint_every_s=checkpoint_every or None,
                   queue_batches=queue_batches, resume=resume, status_every_s=status_every,
                   unlink=unlink)
    return doc


def _main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(sidecar_command)
    try:
        app()
    except FlexShardError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    _main()
