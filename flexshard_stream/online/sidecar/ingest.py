"""The training-loop side of the sidecar and its ingest thread.

:class:`BoundedQueue`: the batches waiting, bounded in batches, IDs and bytes, with the counts of
what was offered, accepted and dropped. :class:`IngestWorker`: the thread that takes them into the
statistics, hands a check to the planner thread when the schedule says so, and runs the periodic
checkpoints and counter-file writes. Both guard their state with the sidecar's one lock
(:class:`~.common.Coordination`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import BatchError, ConfigError
from ...stats.batch import Batch
from ...stats.window import Clock
from ..resharder import CheckSchedule
from .common import BackgroundThread, CheckJob, Coordination, SidecarError, deadline_after, log
from .cores import TableThreads
from .loader import batch_bytes
from .rate import Interval, RateController

__all__ = ["BoundedQueue", "IngestWorker", "Ingested", "Sampling", "SidecarStats"]

_QUEUE_COUNTS = ("submitted", "accepted", "dropped", "submitted_ids", "accepted_ids",
                 "dropped_ids", "max_queued_batches", "max_queued_ids", "max_queued_bytes")
#: Seconds between two looks at the sampling rate (sooner when the queue is half full, but not
#: sooner than the second figure after the last look).
SAMPLING_INTERVAL_S = (0.5, 0.1)


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
    sample_k : the sampling rate in force: one ID occurrence in ``sample_k`` reaches the
        count-min sketch and the heavy hitters of the sketched tables (1: every one)
    sample_k_changes : changes of the rate (this process)
    cpu_budget : cores the ingestion may use (None: the rate is fixed)
    over_budget : no rate up to ``max_sample_k`` brings the ingestion within the budget
    ingest_threads : threads updating the statistics (1: the ingest thread alone)
    cpu_s : CPU seconds the ingest threads spent updating the statistics
    cpu_share : the same over the last interval (about 0.5 s) per wall second: cores in use
    offered_ids_per_s : IDs offered to ``submit`` per second over the last interval
    cpu_ns_per_id : CPU nanoseconds per ID ingested over the last interval (at ``sample_k``)
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
    sample_k: int
    sample_k_changes: int
    cpu_budget: float | None
    over_budget: bool
    ingest_threads: int
    cpu_s: float
    cpu_share: float
    offered_ids_per_s: float
    cpu_ns_per_id: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class BoundedQueue:
    """Batches waiting for the ingest thread, at most ``max_batches`` batches, ``max_ids`` IDs and
    ``max_bytes`` bytes (None: no bound); a batch larger than a bound on its own is accepted only
    into an empty queue."""

    def __init__(self, sync: Coordination, *, max_batches: int, max_ids: int | None,
                 max_bytes: int | None):
        if isinstance(max_batches, bool) or int(max_batches) != max_batches or max_batches < 1:
            raise ConfigError(f"queue_batches must be an integer >= 1, got {max_batches!r}")
        for name, v in (("queue_ids", max_ids), ("queue_bytes", max_bytes)):
            if v is not None and not v >= 1:
                raise ConfigError(f"{name} must be >= 1 (or None), got {v!r}")
        self.max_batches = int(max_batches)
        self.max_ids = None if max_ids is None else int(max_ids)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self._sync = sync
        self._items: collections.deque = collections.deque()  # (batch, ids, bytes, t queued)
        self._ids = self._bytes = 0
        self._counts = dict.fromkeys(_QUEUE_COUNTS, 0)
        self._blocked_s = 0.0
        self.closed = False

    def put(self, batch: Batch, *, block: bool, timeout: float | None) -> bool:
        """Queue ``batch``: True if queued, False if dropped (counted). With ``block``, wait for
        room up to ``timeout`` seconds (None: forever) first. Raises SidecarError once closed."""
        nids, nbytes = batch.num_values, batch_bytes(batch)
        sync = self._sync
        with sync.lock:
            if self.closed:
                raise SidecarError("submit on a closed sidecar")
            c = self._counts
            c["submitted"] += 1
            c["submitted_ids"] += nids
            if block and not self._fits(nids, nbytes):
                t0 = time.monotonic()
                sync.wait(sync.room, lambda: not (self.closed or self._fits(nids, nbytes)),
                          deadline_after(timeout))
                self._blocked_s += time.monotonic() - t0
            if self.closed or not self._fits(nids, nbytes):
                c["dropped"] += 1
                c["dropped_ids"] += nids
                return False
            self._items.append((batch, nids, nbytes, time.monotonic()))
            self._ids += nids
            self._bytes += nbytes
            c["accepted"] += 1
            c["accepted_ids"] += nids
            c["max_queued_batches"] = max(c["max_queued_batches"], len(self._items))
            c["max_queued_ids"] = max(c["max_queued_ids"], self._ids)
            c["max_queued_bytes"] = max(c["max_queued_bytes"], self._bytes)
            sync.work.notify()
        return True

    def _fits(self, nids: int, nbytes: int) -> bool:
        if not self._items:
            return True
        return (len(self._items) < self.max_batches
                and (self.max_ids is None or self._ids + nids <= self.max_ids)
                and (self.max_bytes is None or self._bytes + nbytes <= self.max_bytes))

    def take(self) -> tuple[Batch, int] | None:
        """The oldest batch and its IDs, or None when empty (wakes blocked submitters)."""
        with self._sync.lock:
            if not self._items:
                return None
            batch, nids, nbytes, _ = self._items.popleft()
            self._ids -= nids
            self._bytes -= nbytes
            self._sync.room.notify_all()
            return batch, nids

    def __len__(self) -> int:
        return len(self._items)

    def fill(self) -> float:
        """How full the queue is by its tightest bound (0: empty, 1: full)."""
        with self._sync.lock:
            f = len(self._items) / self.max_batches
            if self.max_ids is not None:
                f = max(f, self._ids / self.max_ids)
            if self.max_bytes is not None:
                f = max(f, self._bytes / self.max_bytes)
            return f

    def room(self) -> int:
        """Batches the queue can take now (bounds in IDs and bytes not considered)."""
        with self._sync.lock:
            return self.max_batches - len(self._items)

    def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until the queue has room for one batch (seconds; None: forever)."""
        sync = self._sync
        with sync.lock:
            sync.wait(sync.room, lambda: len(self._items) >= self.max_batches and not self.closed,
                      deadline_after(timeout))
            return len(self._items) < self.max_batches

    def close(self) -> None:
        """Refuse further batches; blocked submitters give up (their batch is dropped)."""
        with self._sync.lock:
            self.closed = True
            self._sync.room.notify_all()

    def counters(self) -> dict[str, Any]:
        """The counts of this process, what waits now (``queued_*``), the age of the oldest batch
        (``lag_s``, seconds) and the seconds ``put`` waited (``blocked_s``)."""
        with self._sync.lock:
            lag = time.monotonic() - self._items[0][3] if self._items else 0.0
            return {**self._counts, "queued_batches": len(self._items), "queued_ids": self._ids,
                    "queued_bytes": self._bytes, "lag_s": lag, "blocked_s": self._blocked_s}


class Sampling:
    """The statistics' sampling rate and what ingesting costs, on the ingest thread.

    :meth:`update` times each statistics update in CPU seconds of the ingest threads
    (:class:`~.cores.TableThreads`) and wall seconds; every ``SAMPLING_INTERVAL_S`` (sooner when
    the queue is half full) :meth:`look` sums up the interval, and with a ``controller`` applies
    the rate it chooses between two batches (``stats.resample(k)``: docs/STATISTICS.md). The
    figures (``cpu_share``, ``offered_ids_per_s``, ``cpu_ns_per_id``) are the last interval's.
    """

    def __init__(self, stats: Any, threads: TableThreads, controller: RateController | None):
        self._stats, self.threads, self.controller = stats, threads, controller
        self.changes = 0
        self.cpu_s = self.busy_s = 0.0      # cumulative, in statistics updates
        self.figures = {"cpu_share": 0.0, "offered_ids_per_s": 0.0, "cpu_ns_per_id": 0.0}
        self._mark: tuple[float, float, float, int, int, int] = (0.0, 0.0, 0.0, 0, 0, 0)
        self.next_look = math.inf

    @property
    def k(self) -> int:
        """The rate in force: the statistics' (restored ones' after a restart)."""
        return int(self._stats.config.sample_k)

    @property
    def over_budget(self) -> bool:
        return self.controller is not None and self.controller.over_budget

    def begin(self, now: float, queue: dict[str, Any], processed_ids: int) -> None:
        """Start measuring (the ingest thread's start: after a restart the rate is the restored
        statistics')."""
        if self.controller is not None:
            self.controller.start(self.k)
        self._stats.set_executor(self.threads.executor)
        self._set_mark(now, queue, processed_ids)

    def update(self, batch: Batch) -> None:
        """``stats.update(batch)``, timed."""
        c0, t0 = self.threads.cpu_seconds(), time.perf_counter()
        try:
            self._stats.update(batch)
        finally:
            self.busy_s += time.perf_counter() - t0
            self.cpu_s += self.threads.cpu_seconds() - c0

    def due(self, now: float, fill: float) -> bool:
        return now >= self.next_look or (fill >= 0.5
                                         and now - self._mark[0] >= SAMPLING_INTERVAL_S[1])

    def look(self, now: float, queue: dict[str, Any], processed_ids: int, fill: float
             ) -> int | None:
        """Sum up the interval ending ``now`` (``queue``: the queue's counters, ``fill``: its
        :meth:`BoundedQueue.fill`); returns the new rate when it changed."""
        t, cpu, busy, ids, offered, dropped = self._mark
        m = Interval(now - t, self.cpu_s - cpu, self.busy_s - busy, processed_ids - ids,
                     queue["submitted_ids"] - offered, queue["dropped_ids"] - dropped, fill)
        self._set_mark(now, queue, processed_ids)
        if m.seconds > 0:
            self.figures = {"cpu_share": m.cpu_s / m.seconds,
                            "offered_ids_per_s": m.offered_ids / m.seconds,
                            "cpu_ns_per_id": (1e9 * m.cpu_s / m.processed_ids
                                              if m.processed_ids else 0.0)}
        k = None if self.controller is None else self.controller.observe(m)
        if k is None:
            return None
        try:
            self._stats.resample(k)
        except BaseException:
            self.controller.start(self.k)   # the statistics kept their rate
            raise
        self.changes += 1
        log.info("sidecar sampling: 1 in %d from now on (%.3g M IDs/s offered, %.2f cores in "
                 "use, budget %.2f)", k, m.offered_ids / max(m.seconds, 1e-9) / 1e6,
                 m.cpu_s / max(m.seconds, 1e-9), self.controller.cpu_budget)
        return k

    def _set_mark(self, now: float, queue: dict[str, Any], processed_ids: int) -> None:
        self._mark = (now, self.cpu_s, self.busy_s, processed_ids, queue["submitted_ids"],
                      queue["dropped_ids"])
        self.next_look = now + SAMPLING_INTERVAL_S[0]

    def report(self) -> dict[str, Any]:
        """The rate and the cost, for :class:`SidecarStats`."""
        c = self.controller
        return {"sample_k": self.k, "sample_k_changes": self.changes,
                "cpu_budget": None if c is None else c.cpu_budget,
                "over_budget": self.over_budget, "ingest_threads": self.threads.threads,
                "cpu_s": self.cpu_s, **self.figures}


class Ingested(NamedTuple):
    """Where the ingest thread stands (it hands this to the ledger when it writes)."""

    processed: int               # batches taken off the queue by this process
    processed_ids: int
    batches_in_stats: int        # batches in the statistics (cumulative)
    progress: dict[str, Any]     # IngestWorker.progress(): batches, ids, check schedule


class IngestWorker(BackgroundThread):
    """The ingest thread: batches off ``queue`` into ``stats``; every ``schedule`` step the
    summaries (``top_k`` rows per table) go to ``hand_over`` (the planner thread); every
    ``checkpoint_every_s`` seconds (None or 0: only at the stop) and on request
    ``checkpoint(force, at)`` runs, every ``counters_every_s`` seconds
    ``write_counters(closed, at)`` (``at``: :meth:`ingested`).

    ``checkpoint`` returns the checkpoint written, or None when there was nothing new (unless
    ``force``). Counters: ``processed``/``processed_ids`` (batches taken off the queue),
    ``rejected`` (refused by the statistics), ``ingest_s`` (seconds updating), ``checkpoints``.
    ``sampling`` (:class:`Sampling`) times the updates and changes the sampling rate.
    """

    def __init__(self, sync: Coordination, queue: BoundedQueue, stats: Any, *, top_k: int,
                 schedule: CheckSchedule, hand_over: Callable[[CheckJob], None],
                 checkpoint: Callable[[bool, Ingested], Path | None],
                 write_counters: Callable[[bool, Ingested], None],
                 checkpoint_every_s: float | None,
                 counters_every_s: float, nice: int, sampling: Sampling):
        if not counters_every_s > 0:
            raise ConfigError(f"counters_every_s must be > 0 seconds, got {counters_every_s}")
        if checkpoint_every_s is not None and checkpoint_every_s < 0:
            raise ConfigError(f"checkpoint_every_s must be >= 0 seconds (or None), got "
                              f"{checkpoint_every_s}")
        self.checkpoint_every_s = checkpoint_every_s or None   # 0: only at the stop
        self.counters_every_s = float(counters_every_s)
        super().__init__(sync, "ingest", nice)
        self._queue, self._stats = queue, stats
        self._top_k, self._schedule, self._clock = top_k, schedule, Clock(schedule.unit)
        self._hand_over, self._checkpoint, self._write_counters = \
            hand_over, checkpoint, write_counters
        self.sampling = sampling
        self.processed = self.processed_ids = self.rejected = self.checkpoints = 0
        self.ingest_s = 0.0
        self.batches_in_stats = self.ids_in_stats = 0   # cumulative: restored ones included
        self.position = 0                               # batches counted by the schedule
        self.last_checkpoint: Path | None = None
        self.saved = (0, 0)          # batches and IDs in the statistics the last good checkpoint
        self.final_error: BaseException | None = None   # why the final checkpoint failed
        self._busy = False
        self._requested = self._done = 0
        self._stop = False
        self._final_checkpoint = True

    # ------------------------------------------------------------------ progress
    def progress(self) -> dict[str, Any]:
        """What a checkpoint keeps of the ingestion: batches and IDs in the statistics, the
        check schedule (``position`` in batches, ``next_check`` in its ``unit``) and, for the
        record, the sampling rate (the statistics' state carries it too)."""
        return {"batches": self.batches_in_stats, "ids": self.ids_in_stats,
                "schedule": {"position": self.position, "next_check": self._schedule.next,
                             "unit": self._schedule.unit},
                "sampling": {"sample_k": self.sampling.k, "changes": self.sampling.changes}}

    def ingested(self) -> Ingested:
        """Where ingestion stands (stable on this thread, between two batches)."""
        return Ingested(self.processed, self.processed_ids, self.batches_in_stats,
                        self.progress())

    def restore_progress(self, progress: dict[str, Any]) -> None:
        """Go on from a checkpoint's :meth:`progress` (its schedule only if in the same unit)."""
        self.batches_in_stats, self.ids_in_stats = int(progress["batches"]), int(progress["ids"])
        self.saved = (self.batches_in_stats, self.ids_in_stats)
        sch = progress["schedule"]
        self.position = int(sch["position"])
        if sch["unit"] == self._schedule.unit:
            self._schedule.next = sch["next_check"]

    def idle(self) -> bool:
        """No batch being ingested (call with the lock held for a consistent answer)."""
        return not self._busy

    # ------------------------------------------------------------------ control
    def request_checkpoint(self, timeout: float | None) -> Path:
        """Ask for a checkpoint between two batches and wait for it (seconds; None: forever).
        Raises TimeoutError, or the pending background error."""
        sync = self._sync
        with sync.lock:
            self._requested += 1
            want = self._requested
            sync.work.notify()
            if not sync.wait(sync.idle, lambda: self._done < want, deadline_after(timeout)):
                raise TimeoutError(f"no checkpoint within {timeout} s")
        sync.raise_pending()
        assert self.last_checkpoint is not None
        return self.last_checkpoint

    def stop(self, final_checkpoint: bool) -> None:
        """Finish the queue, write the final checkpoint (if asked) and the counters, then end."""
        with self._sync.lock:
            self._final_checkpoint = final_checkpoint
            self._stop = True
            self._sync.work.notify_all()

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        self.sampling.begin(time.monotonic(), self._queue.counters(), self.processed_ids)
        try:
            self._run()
        finally:
            self.sampling.threads.close()

    def _run(self) -> None:
        now = time.monotonic()
        next_counters = now + self.counters_every_s
        every = self.checkpoint_every_s
        next_ckpt = None if every is None else now + every
        while True:
            due = min(next_counters, math.inf if next_ckpt is None else next_ckpt,
                      self.sampling.next_look)
            item, stop, asked = self._next(due)
            if item is not None:
                self._ingest(*item)
            now = time.monotonic()
            self._look_at_sampling(now)
            if asked or (next_ckpt is not None and now >= next_ckpt) \
                    or (stop and self._final_checkpoint):
                self._run_checkpoint(force=asked, final=stop)
                now = time.monotonic()
                if next_ckpt is not None:
                    next_ckpt = now + every
            if stop or now >= next_counters:
                try:
                    self._write_counters(stop, self.ingested())
                except Exception as e:  # noqa: BLE001
                    self._sync.record_error(e, "writing counters.json")
                next_counters = now + self.counters_every_s
            if stop:
                return

    def _next(self, due: float) -> tuple[tuple[Batch, int] | None, bool, bool]:
        """Wait (up to the monotonic time ``due``) for a batch, a checkpoint request or the stop;
        return ``(batch and IDs or None, stop now, checkpoint asked)``."""
        sync = self._sync
        with sync.lock:
            sync.wait(sync.work, lambda: not (len(self._queue) or self._stop
                                              or self._requested > self._done), due,
                      until_fatal=False)   # the planner's death does not stop ingestion
            item = self._queue.take()
            self._busy = item is not None
            return item, self._stop and item is None and not len(self._queue), \
                self._requested > self._done

    def _look_at_sampling(self, now: float) -> None:
        fill = self._queue.fill()
        if not self.sampling.due(now, fill):
            return
        try:
            self.sampling.look(now, self._queue.counters(), self.processed_ids, fill)
        except Exception as e:  # noqa: BLE001
            self._sync.record_error(e, "changing the sampling rate")

    def _ingest(self, batch: Batch, nids: int) -> None:
        t0 = time.perf_counter()
        job = None
        try:
            self.sampling.update(batch)
        except BatchError as e:
            self._sync.record_error(e, "statistics update (batch rejected, skipped)")
            with self._sync.lock:
                self.rejected += 1
        except Exception as e:  # noqa: BLE001
            self._sync.record_error(e, "statistics update")
        else:
            self.batches_in_stats += 1
            self.ids_in_stats += nids
            self.position += 1
            try:
                job = self._check_due(batch)
            except Exception as e:  # noqa: BLE001
                self._sync.record_error(e, "summarizing the statistics for a check")
        with self._sync.lock:
            self.ingest_s += time.perf_counter() - t0
            self.processed += 1
            self.processed_ids += nids
            if job is not None:
                self._hand_over(job)
            self._busy = False
            self._sync.idle.notify_all()

    def _check_due(self, batch: Batch) -> CheckJob | None:
        """The summaries of a check due at this batch (the re-sharder's schedule), else None."""
        pos = self._clock.position(batch, self.position)
        if not self._schedule.due(pos):
            return None
        return CheckJob(self._stats.view().summary(self._top_k), float(pos),
                        self.batches_in_stats)

    def _run_checkpoint(self, force: bool, final: bool = False) -> None:
        """Write a checkpoint (None from the ledger: nothing changed since the last one, which
        still holds everything); a failure is recorded, the final one's kept in ``final_error``."""
        path, failed = None, None
        try:
            path = self._checkpoint(force, self.ingested())
        except Exception as e:  # noqa: BLE001
            failed = e
            self._sync.record_error(e, "final checkpoint" if final else "checkpoint")
        with self._sync.lock:
            if failed is None:
                self.saved = (self.batches_in_stats, self.ids_in_stats)
            elif final:
                self.final_error = failed
            if path is not None:
                self.last_checkpoint = path
                self.checkpoints += 1
            self._done = self._requested
            self._sync.idle.notify_all()
