"""The sidecar's record across restarts: the cumulative counters of every run, the batches lost in
crashes, and what the ingest thread writes of them (``counters.json``, the checkpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoint import Resumed, write_checkpoint
from .common import COUNTER_KEYS, COUNTERS_FORMAT, FORMAT_VERSION, Coordination, log
from .ingest import BoundedQueue, Ingested
from .planning import PlanningWorker
from .publisher import Publisher

__all__ = ["Ledger"]


class Ledger:
    """Cumulative counters, losses, the counters file and the checkpoints of a sidecar.

    ``source`` (JSON-able) names where the batches come from, ``source_before`` how many of its
    batches and IDs were consumed before this process started. After a restart, :meth:`go_on`
    takes the earlier runs' counters and losses.
    """

    def __init__(self, sync: Coordination, out_dir: Path, *, queue: BoundedQueue,
                 planning: PlanningWorker, publisher: Publisher, stats: Any,
                 keep_checkpoints: int, source: Mapping[str, Any],
                 source_before: tuple[int, int]):
        self._sync, self._out_dir = sync, out_dir
        self._queue, self._planning, self._publisher, self._stats = \
            queue, planning, publisher, stats
        self.keep_checkpoints = keep_checkpoints
        self.source, self._source_before = dict(source), source_before
        self._base = dict.fromkeys(COUNTER_KEYS, 0)   # cumulative counters of earlier runs
        self._lost_before = self.lost_total = 0        # batches lost in crashes
        self.checkpoint_seq = 0
        self._marker: tuple | None = None

    def go_on(self, resumed: Resumed) -> None:
        """Continue the counts of the runs before a restart."""
        with self._sync.lock:
            self._base, self.checkpoint_seq = resumed.counters, resumed.checkpoint_seq
            self._lost_before, self.lost_total = resumed.lost_before, resumed.lost_total

    def set_lost_since_checkpoint(self, batches: int) -> None:
        """An exact count of the batches lost since the checkpoint (replaces the estimate)."""
        with self._sync.lock:
            self.lost_total = self._lost_before + batches

    def cumulative(self, at: Ingested) -> dict[str, int]:
        """Counters of this run (queue counts, and ``at``'s processed ones) plus the earlier
        runs'."""
        now = {**self._queue.counters(), "processed": at.processed,
               "processed_ids": at.processed_ids}
        return {k: self._base[k] + now[k] for k in COUNTER_KEYS}

    def write_counters(self, closed: bool, at: Ingested) -> None:
        """Rewrite ``counters.json`` (``closed``: the last write, at a clean stop)."""
        with self._sync.lock:
            doc = {**self.cumulative(at), "format": COUNTERS_FORMAT, "version": FORMAT_VERSION,
                   "queued": len(self._queue), "batches_in_stats": at.batches_in_stats,
                   "checkpoint_seq": self.checkpoint_seq, "lost": self.lost_total,
                   "sample_k": at.progress["sampling"]["sample_k"],
                   "closed": closed, "source": dict(self.source),
                   "source_batches": self._source_before[0] + at.processed,
                   "cost": dict(self._planning.snapshot()["resharder"]["cost"])}
        self._publisher.write_counters(doc, force=closed)

    def checkpoint(self, force: bool, at: Ingested) -> Path | None:
        """Write a checkpoint (ingest thread, between two batches); None when nothing changed
        since the last one (no new batch, plan or check), unless ``force``."""
        with self._sync.lock:
            snap = self._planning.snapshot()
            marker = (at.processed, snap["plan_seq"], self._planning.checks)
            fields = {**at.progress, "counters": self.cumulative(at), "lost": self.lost_total,
                      "source": dict(self.source),
                      "source_batches": self._source_before[0] + at.processed,
                      "source_ids": self._source_before[1] + at.processed_ids,
                      "plan_seq": snap["plan_seq"], "plan_fingerprint": snap["plan_fingerprint"]}
        if not force and marker == self._marker:
            return None
        path = write_checkpoint(self._out_dir, self.checkpoint_seq + 1, fields,
                                self._stats.state(), snap["resharder"],
                                keep=self.keep_checkpoints)
        self.checkpoint_seq, self._marker = self.checkpoint_seq + 1, marker
        log.info("sidecar checkpoint %s: %d batches", path, at.batches_in_stats)
        return path
