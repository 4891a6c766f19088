"""The sidecar out of process: batches that DataLoader workers write into a shared-memory ring
(:mod:`flexshard_stream.sources.ring`) feed a :class:`Sidecar` until SIGTERM/SIGINT, then a clean
shutdown (final checkpoint). With the ring the loss after a crash is exact: its read counters live
in shared memory. The command line is ``flexshard-stream sidecar`` (:mod:`flexshard_stream.cli`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError, FlexShardError
from ...formats.files import jsonable, read_json
from ...plans.tables import load_tables, row_map
from ...plans.topology import Topology
from ...sources.ring import Ring
from ...stats.batch import Batch
from ..resharder import ReshardConfig
from .common import CheckpointLostError, SidecarError, log
from .config import RING_MODE, SidecarConfig
from .core import Sidecar
from .outdir import prepare_out_dir

__all__ = ["run_ring"]

_IDLE_NAP_S = (1e-3, 0.02)  # first and longest wait between polls of an empty ring (seconds)


def _emit(doc: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(jsonable(dict(doc))) + "\n")
    sys.stdout.flush()


def run_ring(ring: str, tables: Any, topology: Any, out: str | os.PathLike, *,
             batch_size: int = 512, config: SidecarConfig | ReshardConfig | None = None,
             memory: Any = None, model: Any = None, resume: bool = True,
             ring_dir: str | os.PathLike | None = None, slots: int = 8,
             capacity_bytes: int = 64 << 20, checksum: bool = False, ids: Any = None,
             status_every_s: float = 0.0, unlink: bool = False,
             stop: threading.Event | None = None,
             emit: Callable[[Mapping[str, Any]], None] = _emit,
             handle_signals: bool = True, **settings: Any) -> dict[str, Any]:
    """Consume ring ``ring`` (created if missing) into a :class:`Sidecar` until ``stop`` is set
    or SIGTERM/SIGINT arrives; then close it (final checkpoint). Returns the final report. A
    failed final checkpoint is :class:`~.common.CheckpointLostError` (the ``stopped`` event,
    emitted first, carries ``lost_batches``, ``lost_ids`` and ``error``).

    ``config`` (:class:`SidecarConfig`; default :meth:`SidecarConfig.for_ring`) and
    ``**settings`` (its fields by name, over it: ``checkpoint_every_s=``, ``half_life=``,
    ``cpu_budget=``, ``queue_batches=``, ``reshard=``, ...) are the sidecar's settings, as for
    :class:`Sidecar` (a ReshardConfig as ``config`` is the ring defaults' ``reshard``). The ring
    is the buffer: the config must keep :data:`~.config.RING_MODE`'s block policy and unbounded
    IDs and bytes (ConfigError). ``memory``, ``model``, ``resume``: as for :class:`Sidecar`
    (``resume`` True by default: a restarted ring command goes on).

    ``ring_dir``, ``slots``, ``capacity_bytes`` (shared by the slots), ``checksum`` (CRC-32 per
    record): the ring's geometry when it is created. ``emit`` receives JSON-able events:
    ``resume``, ``ready``, ``status`` (every ``status_every_s`` seconds, 0: never) and
    ``stopped``. Records left in the ring at shutdown stay there for the next run (unless
    ``unlink``: then they are drained first and the ring file removed).

    ``ids`` (``"raw"``, ``"hash"`` or ``"hash:ROWS"``, :class:`~flexshard_stream.sources.logs.
    IdMode`): with a hash mode every batch read from the ring has its IDs taken modulo the
    tables' rows before the statistics see it (producers writing raw IDs).
    """
    cfg = _ring_config(config, settings)
    stop = stop or threading.Event()
    got_signal: list[str] = []
    with _stopping_on_signals(stop, got_signal, handle_signals):
        tabs = load_tables(tables) if isinstance(tables, (str, os.PathLike)) else list(tables)
        rows = row_map(tabs, ids)
        topo = topology if isinstance(topology, Topology) else Topology.load(topology)
        prepare_out_dir(out)   # before the ring: a refused --out leaves no ring behind
        r = Ring.create(ring, slots=slots, capacity_bytes=capacity_bytes, directory=ring_dir,
                        checksum=checksum, exist_ok=True)
        try:
            before = r.stats()
            if before.consumer_alive:
                raise FlexShardError(f"ring {r.path} already has a live consumer (pid "
                                     f"{before.consumer_pid}); one sidecar per ring")
            read0, ids0 = before.total.batches_read, before.total.ids_read
            src = {"kind": "ring", "path": str(r.path), "ring_id": r.ring_id}
            sc = Sidecar(tabs, topo, batch_size, out_dir=out, config=cfg, memory=memory,
                         model=model, resume=resume, source=src, source_batches=read0,
                         source_ids=ids0)
            _ring_loss(sc, r, read0, ids0)
            emit({"event": "resume", **sc.resume_report.to_dict()})
            emit({"event": "ready", "ring": str(r.path), "pid": os.getpid(), "slots": r.slots,
                  "slot_capacity": r.slot_capacity, "out": str(out),
                  "ring_batches_read": read0})
            feed = _HashedRing(r, rows) if rows.mode.hashed else r
            errors, lost = _consume(sc, feed, stop, emit, status_every_s, unlink)
            doc = _stopped(sc, r, got_signal, errors)
            if lost is not None:
                doc.update(lost_batches=lost.lost_batches, lost_ids=lost.lost_ids,
                           error=str(lost))
            emit(doc)
            if lost is not None:   # the stopped event said it; the caller must see it too
                raise lost
            return doc
        finally:
            r.close()
            if unlink:
                r.unlink()


def _ring_config(config: Any, settings: Mapping[str, Any]) -> SidecarConfig:
    """The sidecar's config for a ring feed: :meth:`SidecarConfig.build` over the ring defaults;
    ConfigError if it leaves :data:`~.config.RING_MODE`'s queue (block policy, no bound in IDs or
    bytes): the feed polls only what the queue has room for, and every batch read must be
    accepted, or the ring's exact loss count would not hold."""
    cfg = SidecarConfig.build(config, settings, ring=True)
    wrong = {k: getattr(cfg, k) for k in ("policy", "queue_ids", "queue_bytes")
             if getattr(cfg, k) != RING_MODE[k]}
    if wrong:
        raise ConfigError(f"the ring feed needs policy='block' and no queue_ids or queue_bytes "
                          f"bound (the ring is the buffer), got {wrong}; build the config with "
                          f"SidecarConfig.for_ring(...)")
    return cfg


@contextlib.contextmanager
def _stopping_on_signals(stop: threading.Event, got: list[str], handle: bool) -> Iterator[None]:
    """While inside: SIGTERM and SIGINT set ``stop`` (their names appended to ``got``); only on
    the main thread, and only with ``handle``. The previous handlers come back afterwards."""
    old = {}
    if handle and threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, _frame: Any) -> None:
            got.append(signal.Signals(signum).name)
            stop.set()
        for s in (signal.SIGTERM, signal.SIGINT):
            old[s] = signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _consume(sc: Sidecar, ring: Ring, stop: threading.Event,
             emit: Callable[[Mapping[str, Any]], None], status_every_s: float,
             unlink: bool) -> tuple[int, CheckpointLostError | None]:
    """Feed ``sc`` from ``ring`` until ``stop`` (then drain the ring if ``unlink``) and close
    it; returns the background errors reported (already logged) and the failure of the final
    checkpoint (None when it was written)."""
    errors, lost = 0, None
    next_status = time.monotonic() + status_every_s if status_every_s else math.inf
    nap = _IDLE_NAP_S[0]
    try:
        while not stop.is_set():
            errors += _log_errors(sc)
            room = sc.room()
            if room <= 0:
                sc.wait_for_room(0.2)
                continue
            got = ring.poll(max_batches=room)
            if got:
                errors += _submit_all(sc, got)
                nap = _IDLE_NAP_S[0]
            else:  # idle: back off to 20 ms between polls (about 50 wake-ups/s)
                stop.wait(nap)
                nap = min(2 * nap, _IDLE_NAP_S[1])
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + status_every_s
                emit({"event": "status", **sc.stats().to_dict(),
                      "ring_dropped": ring.stats().total.batches_dropped, "cost": sc.cost})
        if unlink:
            errors += _drain(sc, ring)
    finally:
        try:
            sc.close()
        except CheckpointLostError as e:
            errors, lost = errors + 1, e
            log.error("%s", e)
        except SidecarError as e:
            errors += 1
            log.error("%s", e)
    return errors + _log_errors(sc), lost


def _drain(sc: Sidecar, ring: Ring) -> int:
    """Submit every record left in ``ring``; returns the background errors reported."""
    errors = 0
    while True:
        room = sc.room()
        if room <= 0:
            sc.wait_for_room(1.0)
            continue
        got = ring.poll(max_batches=room)
        if not got:
            return errors
        errors += _submit_all(sc, got)


def _stopped(sc: Sidecar, ring: Ring, got_signal: list[str], errors: int) -> dict[str, Any]:
    """The ``stopped`` event: the signal, the last checkpoint, the counters, the ring's counts."""
    rst = ring.stats().total
    return {"event": "stopped", "signal": got_signal[0] if got_signal else None,
            "checkpoint": str(sc.last_checkpoint) if sc.last_checkpoint else None,
            **sc.stats().to_dict(), "errors_reported": errors, "cost": sc.cost,
            "ring": {"batches_written": rst.batches_written, "batches_read": rst.batches_read,
                     "batches_dropped": rst.batches_dropped, "ids_dropped": rst.ids_dropped,
                     "records_discarded": rst.records_discarded, "lag_bytes": rst.lag_bytes}}


class _HashedRing:
    """A ring whose polled batches have their IDs mapped to table rows (``RowMap.map_batch``);
    everything else is the ring's."""

    def __init__(self, ring: Ring, rows: Any):
        self._ring = ring
        self._rows = rows

    def poll(self, **kwargs: Any) -> list[Batch]:
        return [self._rows.map_batch(b) for b in self._ring.poll(**kwargs)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ring, name)


def _submit_all(sc: Sidecar, batches: list[Batch]) -> int:
    """Submit every batch (block policy, room reserved: always accepted). A background error
    raised by ``submit`` (already logged) is counted and the batch submitted again."""
    errors = 0
    for b in batches:
        try:
            sc.submit(b)
        except SidecarError:
            if sc.fatal is not None:
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


def _ring_loss(sc: Sidecar, ring: Ring, read0: int, ids0: int) -> None:
    """Exact loss with a ring: ring batches read (shared-memory counter) minus those in the
    checkpoint. Replaces the counters-based estimate when the checkpoint was made on this ring."""
    rep = sc.resume_report
    if rep.checkpoint is None:
        return
    m = read_json(Path(rep.checkpoint) / "manifest.json", "sidecar checkpoint manifest")
    src = m.get("source") or {}
    if src.get("kind") == "ring" and src.get("ring_id") == ring.ring_id \
            and read0 >= int(m["source_batches"]):
        sc.record_exact_loss(read0 - int(m["source_batches"]),
                             ids0 - int(m.get("source_ids", 0)), "ring")
    elif src.get("kind") == "ring":
        rep.message = rep.describe() + ("; the ring was created anew since the checkpoint, so "
                                        "its counters cannot tell the loss")
