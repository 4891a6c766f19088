"""The sidecar's planner thread: runs the re-sharder's checks that the ingest thread hands over,
publishes the decisions that move the plan, logs every decision and calls the callback.

Planning never stalls ingestion: a check handed over while the previous one still runs waits, and
a newer one replaces it (counted in ``coalesced``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...plans.plan import Plan
from ..resharder import Decision, Resharder
from .common import BackgroundThread, CheckJob, Coordination
from .publisher import Publisher

__all__ = ["PlanningWorker"]

_DELTAS_KEPT = 8  # decisions in the history that keep their delta (bounded memory on long runs)


class PlanningWorker(BackgroundThread):
    """The planner thread of a sidecar.

    ``callback(decision, plan)`` runs after each published change (on this thread);
    ``batches_in_stats()`` is what ``state.json`` records with a published plan. Counters:
    ``checks`` (run by this process), ``coalesced`` (replaced while waiting). :meth:`snapshot`
    is the re-sharder's ``state()`` and the published plan's number after the last check: what a
    checkpoint, written on the ingest thread, saves.
    """

    def __init__(self, sync: Coordination, resharder: Resharder, publisher: Publisher, *,
                 callback: Callable[[Decision, Plan], None] | None,
                 batches_in_stats: Callable[[], int], nice: int):
        super().__init__(sync, "plan", nice)
        self._rs, self._publisher = resharder, publisher
        self._batches_in_stats = batches_in_stats
        self._batches_at_start = 0
        self.callback = callback
        self.checks = self.coalesced = 0
        self._batches_at_check: int | None = None   # batches in the statistics at the last check
        self._pending: CheckJob | None = None
        self._running = False
        self._stop = False
        self._snapshot: dict[str, Any] = {}

    # ------------------------------------------------------------------ from other threads
    def offer(self, job: CheckJob) -> None:
        """Hand over a due check (a waiting one is replaced)."""
        with self._sync.lock:
            if self._pending is not None:
                self.coalesced += 1
            self._pending = job
            self._sync.planning.notify()

    def idle(self) -> bool:
        """No check waiting or running (call with the lock held for a consistent answer)."""
        return self._pending is None and not self._running

    def snapshot(self) -> dict[str, Any]:
        """``{"resharder": state(), "plan_seq", "plan_fingerprint"}`` after the last check."""
        with self._sync.lock:
            return self._snapshot

    def start_counting(self, batches_in_stats: int) -> None:
        """The batches already in the statistics when the thread starts (restored ones): the
        first check counts its iterations from there."""
        self._batches_at_start = int(batches_in_stats)

    def take_snapshot(self) -> None:
        """Record :meth:`snapshot` now (this thread, or before it starts)."""
        snap = {"resharder": self._rs.state(), "plan_seq": self._publisher.seq,
                "plan_fingerprint": self._publisher.fingerprint}
        with self._sync.lock:
            self._snapshot = snap

    def stop(self) -> None:
        """Run the check waiting (if any), retry a failed publication, then end."""
        with self._sync.lock:
            self._stop = True
            self._sync.planning.notify_all()

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        sync = self._sync
        while True:
            with sync.lock:
                sync.wait(sync.planning, lambda: self._pending is None and not self._stop,
                          None, until_fatal=False)
                job, self._pending = self._pending, None
                self._running = job is not None
            if job is None:
                self._retry_publish()
                return
            try:
                self._check(job)
            except Exception as e:  # noqa: BLE001
                sync.record_error(e, "re-sharder check / publishing")
            finally:
                self.take_snapshot()
                with sync.lock:
                    self._running = False
                    sync.idle.notify_all()

    def _check(self, job: CheckJob) -> None:
        rs, pub = self._rs, self._publisher
        self._retry_publish()
        rs.count_iterations(self._iterations(job))
        d = rs.check(job.summaries, position=job.position)
        if d.delta is not None:
            pub.publish_change(d, rs.plan, self._batches_in_stats())
        with self._sync.lock:
            self.checks += 1
        try:
            pub.append_decision(d, job.batches_in_stats)
        except Exception as e:  # noqa: BLE001
            self._sync.record_error(e, "writing decisions.jsonl")
        rs.forget_old_deltas(_DELTAS_KEPT)
        if d.delta is not None and self.callback is not None:
            try:
                self.callback(d, rs.plan)
            except Exception as e:  # noqa: BLE001
                self._sync.record_error(e, "callback")

    def _iterations(self, job: CheckJob) -> int:
        """Training iterations since the previous check: the batches that reached the statistics
        since then (a submitted batch is one step of the training loop that feeds the sidecar;
        coalesced checks included). The re-sharder prices them unless its configuration fixes
        the iterations per check (:meth:`Resharder.count_iterations`)."""
        last, self._batches_at_check = self._batches_at_check, job.batches_in_stats
        base = last if last is not None else self._batches_at_start
        return max(0, int(job.batches_in_stats) - base)

    def _retry_publish(self) -> None:
        """The re-sharder moved to a plan whose publication failed: publish it now."""
        try:
            self._publisher.retry(self._rs.plan, self._batches_in_stats())
        except Exception as e:  # noqa: BLE001
            self._sync.record_error(e, "publishing (retry)")
