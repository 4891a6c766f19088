"""The :class:`Sidecar`: the bounded queue, the ingest and planner threads, the publisher and the
checkpoints (each in a module of this package) composed behind the training loop's few calls."""

from __future__ import annotations

import atexit
import functools
import math
import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...plans.plan import Plan
from ...plans.tables import EmbeddingTable, load_tables, row_map
from ...plans.topology import Topology
from ...stats.batch import Batch
from ...stats.config import TableConfig
from ...stats.stream import StreamStats
from ...stats.window import DecayedStats, WindowedStats
from ..resharder import (
    CheckSchedule,
    Decision,
    ReshardConfig,
    Resharder,
    default_stats,
    made_for,
)
from .checkpoint import ResumeReport, holds_previous_run, resume
from .common import (
    CheckpointLostError,
    Coordination,
    SidecarError,
    deadline_after,
    log,
    remove_temp_entries,
)
from .config import SidecarConfig
from .cores import TableThreads
from .ingest import BoundedQueue, IngestWorker, Sampling, SidecarStats
from .ledger import Ledger
from .loader import AttachedLoader, copy_batch, to_batch
from .planning import PlanningWorker
from .outdir import lock_directory, prepare_out_dir
from .publisher import Publisher
from .rate import RateController

__all__ = ["Sidecar"]

_UNSET: Any = object()


def _from_config(name: str) -> property:
    """A read-only attribute of the sidecar holding ``config.<name>`` (the names it has always
    had: ``sc.policy``, ``sc.checkpoint_every_s``, ...)."""
    return property(lambda self: getattr(self.config, name),
                    doc=f"``config.{name}`` (:class:`SidecarConfig`).")


class Sidecar:
    """Statistics and re-sharding in background threads, fed by a training loop.

    Parameters
    ----------
    tables : list of EmbeddingTable, or a table TOML file
    topology : Topology, or a topology TOML file / preset name
    batch_size : samples per GPU per iteration (the planner's B)
    out_dir : where plans, deltas, counters and checkpoints are written (created)
    config : SidecarConfig, every setting with its default and unit: the queue's bounds and
        policy, the checkpoint and counter periods, what is kept on disk, the CPU budget and
        sampling, the threads' nice value, the default statistics (``half_life``) and the
        re-sharder's :class:`~flexshard_stream.online.resharder.ReshardConfig` (``reshard``).
        Default ``SidecarConfig()``. A ReshardConfig here is the ``reshard`` of the default
        config (what ``config=`` meant before SidecarConfig).
    **settings : SidecarConfig fields by name (``queue_batches=8``, ``checkpoint_every_s=None``,
        ``cpu_budget=None``, ``reshard=ReshardConfig(...)``, ...), applied over ``config``
        (TypeError for a name that is no setting). The result is :attr:`config`.
    stats : StreamStats | DecayedStats | WindowedStats (default: ``config.half_life``'s, else the
        re-sharder's :func:`~flexshard_stream.online.resharder.default_stats`, keyed by the
        tables' features). Owned by the sidecar's ingest thread from now on (with a
        ``cpu_budget`` it changes their sampling rate: ``resample``).
    memory, model, planner, plan : as for
        :class:`~flexshard_stream.online.resharder.Resharder` (``plan``: the initial plan, default
        row-wise; ignored when resuming)
    callback : ``callback(decision, plan)`` after each published change (planner thread)
    resume : restart from the newest good checkpoint in ``out_dir`` (starts empty when there is
        none); with False, ``out_dir`` must not hold a previous run's state
    source, source_batches, source_ids : where the batches come from (JSON-able, stored in
        checkpoints) and how many of its batches (IDs) were consumed before this process started
        (the ring command's exact loss accounting)
    ids : how submitted IDs become table rows (``"raw"``, the default: as given; ``"hash"``: ID
        mod the table's ``num_rows``; ``"hash:ROWS"``), as the ring command's ``--ids``: for
        loaders that yield raw sparse or 64-bit hashed IDs. Mapped in ``submit``.

    The CPU budget (``cpu_budget``, half a core by default): the ingest thread measures its CPU
    seconds per ID and the offered rate and samples one ID occurrence in ``k`` (count-min and
    heavy hitters of the sketched tables, and the length sketches) so that the CPU the offered
    IDs need stays within the budget, without dropping batches; ``k`` adapts as the rate
    changes, with hysteresis (docs/SIDECAR.md, "Sampling within a CPU budget"). ``nice`` (19 by
    default) makes the background threads yield the CPU to the training loop when cores are
    scarce: they fall behind instead, and the queue drops and counts.
    """

    queue_batches = _from_config("queue_batches")
    queue_ids = _from_config("queue_ids")
    queue_bytes = _from_config("queue_bytes")
    policy = _from_config("policy")
    block_timeout = _from_config("block_timeout")
    copy = _from_config("copy")
    keep_checkpoints = _from_config("keep_checkpoints")
    checkpoint_every_s = _from_config("checkpoint_every_s")
    counters_every_s = _from_config("counters_every_s")
    cpu_budget = _from_config("cpu_budget")

    def __init__(self, tables: Sequence[EmbeddingTable] | str | os.PathLike,
                 topology: Topology | str | os.PathLike, batch_size: int, *,
                 out_dir: str | os.PathLike, config: SidecarConfig | ReshardConfig | None = None,
                 stats: Any = None, memory: Any = None, model: Any = None, planner: Any = None,
                 plan: Plan | None = None,
                 callback: Callable[[Decision, Plan], None] | None = None,
                 resume: bool = False, source: Mapping[str, Any] | None = None,
                 source_batches: int = 0, source_ids: int = 0, ids: Any = None,
                 **settings: Any):
        cfg = self.config = SidecarConfig.build(config, settings)
        self._sync = Coordination()
        self._queue = BoundedQueue(self._sync, max_batches=cfg.queue_batches,
                                   max_ids=cfg.queue_ids, max_bytes=cfg.queue_bytes)
        self.tables = (load_tables(tables) if isinstance(tables, (str, os.PathLike))
                       else list(tables))
        self.topology = topology if isinstance(topology, Topology) else Topology.load(topology)
        self.batch_size = int(batch_size)
        self._rows = row_map(self.tables, ids)   # ConfigError for a bad mode, before any thread
        self.out_dir = Path(out_dir)
        self.source = dict(source or {})
        self._stats = self._statistics(stats)
        self._closed = False
        self._publisher = Publisher(self.out_dir, keep_plans=cfg.keep_plans,
                                    keep_deltas=cfg.keep_deltas)
        self._build(memory, model, planner, plan, callback)
        self._ledger = Ledger(self._sync, self.out_dir, queue=self._queue,
                              planning=self._planning, publisher=self._publisher,
                              stats=self._stats, keep_checkpoints=cfg.keep_checkpoints,
                              source=self.source,
                              source_before=(int(source_batches), int(source_ids)))
        self._ingest = IngestWorker(
            self._sync, self._queue, self._stats, top_k=cfg.reshard.top_k,
            schedule=CheckSchedule(cfg.reshard.check_every, cfg.reshard.unit),
            hand_over=self._planning.offer, checkpoint=self._ledger.checkpoint,
            write_counters=self._ledger.write_counters,
            checkpoint_every_s=cfg.checkpoint_every_s, counters_every_s=cfg.counters_every_s,
            nice=cfg.nice, sampling=self._sampling())
        # refuses a file or a non-empty directory a sidecar did not write (nothing of the user's
        # is overwritten or pruned), another user's or a world-writable one, symlinked entries
        prepare_out_dir(self.out_dir)
        self._lock_fd = lock_directory(self.out_dir)
        try:
            self._start(resume)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _statistics(self, stats: Any) -> Any:
        """``stats``, else the statistics ``config`` asks for (``half_life``: decayed; None: the
        re-sharder's default window)."""
        cfg = self.config
        if stats is None:
            if cfg.half_life is None:
                return default_stats(self.tables, cfg.reshard)
            return DecayedStats([TableConfig(t.name, t.num_rows, t.feature) for t in self.tables],
                                half_life=cfg.half_life, unit=cfg.reshard.unit)
        if cfg.half_life is not None:
            raise ConfigError("half_life chooses the statistics the sidecar builds; with stats= "
                              "given, build them with their half-life instead")
        if not isinstance(stats, (StreamStats, DecayedStats, WindowedStats)):
            raise ConfigError(f"stats must be a StreamStats, DecayedStats or WindowedStats (the "
                              f"sidecar checkpoints them), got {type(stats).__name__}")
        return stats

    def _sampling(self) -> Sampling:
        """The ingest threads and, with a budget, the controller of the sampling rate."""
        cfg = self.config
        k = self._stats.config.sample_k
        controller = (None if cfg.cpu_budget is None
                      else RateController(cfg.cpu_budget, k=k, max_k=cfg.max_sample_k))
        threads = cfg.ingest_threads
        if threads is None:
            threads = max(1, min(math.ceil(cfg.cpu_budget or 1), os.cpu_count() or 1,
                                 len(self.tables)))
        self._configured_k = k
        return Sampling(self._stats, TableThreads(threads, cfg.nice), controller)

    def _build(self, memory: Any, model: Any, planner: Any, plan: Plan | None,
               callback: Any) -> None:
        self.resharder = Resharder(self.tables, self.topology, self.batch_size, stats=self._stats,
                                   memory=memory, model=model, planner=planner,
                                   config=self.config.reshard, plan=plan)
        self._planning = PlanningWorker(self._sync, self.resharder, self._publisher,
                                        callback=callback, nice=self.config.nice,
                                        batches_in_stats=lambda: self._ingest.batches_in_stats)

    def _start(self, resume: bool) -> None:
        self._publisher.remove_temp_files()
        remove_temp_entries(self.out_dir / "checkpoints")
        self.resume_report = ResumeReport()
        if not resume and holds_previous_run(self.out_dir):
            raise ConfigError(f"{self.out_dir} holds the state of a previous sidecar run; pass "
                              "resume=True to continue it, or use an empty directory")
        taken_up = resume and self._resume()
        if self._publisher.plan is None:
            self._publisher.publish_full(self.resharder.plan, reset=taken_up,
                                         batches_in_stats=self._ingest.batches_in_stats)
        self._planning.take_snapshot()
        self._planning.start_counting(self._ingest.batches_in_stats)
        self._ledger.write_counters(False, self._ingest.ingested())
        self._ingest.start()
        self._planning.start()
        # a safety net: drain and checkpoint at interpreter exit if the caller never closed
        self._atexit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)

    # ================================================================== the training-loop side
    def submit(self, batch: Any, *, block: bool | None = None, timeout: Any = _UNSET) -> bool:
        """Queue ``batch`` (a Batch, or anything :func:`to_batch` converts) for the statistics.

        Returns True if queued, False if dropped (counted). Never waits under the drop policy;
        under the block policy (or ``block=True``) waits for room up to ``timeout`` seconds
        (default: ``block_timeout``; None: forever). Raises :class:`SidecarError` for a pending
        background error (the batch is then not submitted) or after ``close``.
        """
        if self._sync.has_error():
            self._sync.raise_pending()
        b = batch if isinstance(batch, Batch) else to_batch(batch)
        if self._rows.mode.hashed:
            b = self._rows.map_batch(b)
        return self._queue.put(copy_batch(b) if self.copy else b,
                               block=(self.policy == "block") if block is None else bool(block),
                               timeout=self.block_timeout if timeout is _UNSET else timeout)

    def room(self) -> int:
        """Batches the queue can take now (bounds in IDs and bytes not considered)."""
        return self._queue.room()

    def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until the queue has room for one batch (seconds; None: forever)."""
        return self._queue.wait_for_room(timeout)

    def attach(self, loader: Iterable[Any], *,
               convert: Callable[[Any], Batch] | None = None) -> AttachedLoader:
        """Wrap an iterable (e.g. a DataLoader): iterating it yields the loader's items unchanged
        and submits each one (converted by ``convert`` or :func:`to_batch`)."""
        return AttachedLoader(self, loader, convert)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued batch is in the statistics and no check is pending or
        running (seconds; None: forever). True when done, False on timeout. Then raises the
        pending background error, if any."""
        self._not_from_worker("flush")
        with self._sync.lock:
            if not self._sync.wait(self._sync.idle, self._busy, deadline_after(timeout)):
                return False
        self._sync.raise_pending()
        return True

    def checkpoint(self, timeout: float | None = None) -> Path:
        """Write a checkpoint now (on the ingest thread, between batches) and return its
        directory. Batches still queued are not in it."""
        self._not_from_worker("checkpoint")
        self._sync.raise_pending()
        if self._queue.closed:
            raise SidecarError("checkpoint on a closed sidecar")
        return self._ingest.request_checkpoint(timeout)

    def close(self, timeout: float | None = None, *, checkpoint: bool = True) -> None:
        """Stop accepting batches, drain the queue, let a pending check finish, write a final
        checkpoint (unless ``checkpoint=False``) and the counters, stop the threads. Raises a
        pending background error after shutting down; :class:`CheckpointLostError`, naming the
        batches a restart loses, when the final checkpoint failed. Idempotent."""
        if self._closed:
            return
        self._not_from_worker("close")
        self._queue.close()
        deadline = deadline_after(timeout)
        with self._sync.lock:  # drain
            self._sync.wait(self._sync.idle, self._busy, deadline)
        self._ingest.stop(final_checkpoint=checkpoint)
        ended = self._ingest.join(_left(deadline))
        self._planning.stop()
        ended = self._planning.join(_left(deadline)) and ended
        self._closed = True
        atexit.unregister(self._atexit)
        if ended:
            os.close(self._lock_fd)
        else:
            log.warning("sidecar threads did not finish within %s s; the final checkpoint may "
                        "be missing", timeout)
        self._log_outcome()
        self._raise_if_lost()
        self._sync.raise_pending()

    def _log_outcome(self) -> None:
        """At close: a warning when batches were dropped or no plan was published, with the
        numbers and the reason (the last check's, or why no check ran); info otherwise."""
        st = self.stats()
        dropped = (f"dropped {st.dropped:,} of {st.submitted:,} submitted batches "
                   f"({st.dropped / st.submitted:.0%}, {self.policy} policy, queue of "
                   f"{self.config.queue_batches} batches)" if st.dropped else "dropped none")
        if st.plans_published:
            published = f"published {st.plans_published} plan change(s)"
        else:
            published = f"published no plan change: {self._why_no_plan(st)}"
        msg = f"sidecar closing: {dropped}; {published}"
        if st.dropped or not st.plans_published:
            log.warning("%s", msg)
        else:
            log.info("%s", msg)

    def _why_no_plan(self, st: SidecarStats) -> str:
        """Why no plan change was published: the last check's reason, or why none ran."""
        history = self.resharder.history
        if history:
            d = history[-1]
            return f"{st.checks} check(s) ran, the last one {d.action}: {d.reason}"
        cfg = self.config.reshard
        return (f"no check ran (one every {cfg.check_every:g} {cfg.unit}; "
                f"{st.batches_in_stats:,} batches reached the statistics)")

    def _raise_if_lost(self) -> None:
        """After the threads ended: CheckpointLostError when the final checkpoint failed,
        naming the batches and IDs no checkpoint holds and the last one that a restart uses."""
        ing = self._ingest
        if ing.final_error is None:
            return
        errors = self._sync.errors
        self._sync.pop_error()
        batches, ids = ing.batches_in_stats - ing.saved[0], ing.ids_in_stats - ing.saved[1]
        last = (f"the last good checkpoint, {ing.last_checkpoint}, holds {ing.saved[0]:,}"
                if ing.last_checkpoint is not None else
                f"no checkpoint of this run was written (a restart resumes {ing.saved[0]:,})")
        err = ing.final_error
        raise CheckpointLostError(
            f"the final checkpoint failed ({type(err).__name__}: {err}): {batches:,} of the "
            f"{ing.batches_in_stats:,} batches in the statistics ({ids:,} IDs) are in no "
            f"checkpoint and are lost for a restart; {last}; {errors} background error(s) in "
            f"this run, see the log", batches, ids) from err

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

    def _busy(self) -> bool:
        return bool(len(self._queue)) or not (self._ingest.idle() and self._planning.idle())

    def _not_from_worker(self, what: str) -> None:
        if self._ingest.is_current() or self._planning.is_current():
            raise SidecarError(f"{what} from the sidecar's own thread (e.g. in the callback) "
                               "would wait for itself")

    # ================================================================== observing
    def stats(self) -> SidecarStats:
        """A snapshot of the counters (:class:`SidecarStats`)."""
        ing, pl = self._ingest, self._planning
        with self._sync.lock:
            return SidecarStats(
                **self._queue.counters(), processed=ing.processed,
                processed_ids=ing.processed_ids, rejected=ing.rejected, errors=self._sync.errors,
                ingest_s=ing.ingest_s, checks=pl.checks, checks_coalesced=pl.coalesced,
                plans_published=self._publisher.plans_published, checkpoints=ing.checkpoints,
                batches_in_stats=ing.batches_in_stats, plan_seq=self._publisher.seq,
                **ing.sampling.report())

    @property
    def counters(self) -> dict[str, Any]:
        """:meth:`stats` as a dict."""
        return self.stats().to_dict()

    @property
    def plan(self) -> Plan:
        """The plan in force (the last one published)."""
        return self.resharder.plan

    @property
    def cost(self) -> dict[str, float]:
        """The run's total cost so far in the cost model's seconds, restored runs included
        (:class:`~flexshard_stream.online.resharder.CostLedger` as a dict: communication of the
        plans in force, migration transfer, pauses, total, bytes, deltas, iterations). Read it
        after :meth:`flush` for a consistent value."""
        return self._planning.snapshot()["resharder"]["cost"]

    @property
    def history(self) -> list:
        """The re-sharder's decisions of this process (deltas kept on the last 8 only)."""
        return self.resharder.history

    @property
    def stats_object(self) -> Any:
        """The statistics object (read it only after :meth:`flush` or :meth:`close`)."""
        return self._stats

    @property
    def callback(self) -> Callable[[Decision, Plan], None] | None:
        """``callback(decision, plan)`` after each published change (may be replaced)."""
        return self._planning.callback

    @callback.setter
    def callback(self, fn: Callable[[Decision, Plan], None] | None) -> None:
        self._planning.callback = fn

    @property
    def last_checkpoint(self) -> Path | None:
        """The directory of the last checkpoint this process wrote (None: none yet)."""
        return self._ingest.last_checkpoint

    @property
    def fatal(self) -> BaseException | None:
        """The exception that killed a background thread (None while both run)."""
        return self._sync.fatal

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def pop_error(self) -> BaseException | None:
        """Take the pending background error without raising it (None if there is none)."""
        return self._sync.pop_error()

    def __repr__(self) -> str:
        s = self.stats()
        return (f"Sidecar({str(self.out_dir)!r}, policy={self.policy!r}, "
                f"accepted={s.accepted}, dropped={s.dropped}, queued={s.queued_batches}, "
                f"plan_seq={s.plan_seq}, sample_k={s.sample_k}"
                f"{', closed' if self._closed else ''})")

    # ================================================================== start / resume
    def _resume(self) -> bool:
        """Take up the newest good checkpoint and the published plan (``resume_report``)."""
        r = resume(self.out_dir, self.resume_report, stats=self._stats, resharder=self.resharder,
                   ingest=self._ingest, publisher=self._publisher, check_plan=self._check_plan)
        self._ledger.go_on(r)
        k = self._stats.config.sample_k
        if self.cpu_budget is None and k != self._configured_k:
            # a fixed rate is the configured one: the restored counts are rescaled to it
            log.info("sidecar: the checkpoint was sampled 1 in %d; going on at the configured "
                     "1 in %d", k, self._configured_k)
            self._stats.resample(self._configured_k)
        return r.taken_up

    def _check_plan(self, plan: Plan, where: Path) -> None:
        if not made_for(plan, self.tables, self.topology):
            raise ConfigError(f"{where} was made for other tables or another topology than this "
                              "sidecar's; use a new out_dir (or resume=False) after changing them")

    def record_exact_loss(self, batches: int, ids: int, source: str) -> None:
        """Replace the counters-based count of the batches lost since the checkpoint by an exact
        one (``source``: where it comes from, e.g. the ring's read counter in shared memory)."""
        self._ledger.set_lost_since_checkpoint(int(batches))
        self.resume_report.count_exactly(batches, ids, source)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _close_at_exit(ref: weakref.ref[Sidecar]) -> None:
    sc = ref()
    if sc is not None and not sc.closed:
        log.warning("sidecar %s was not closed: closing it at exit (final checkpoint)",
                    sc.out_dir)
        try:
            sc.close(timeout=60)
        except Exception:
            log.exception("closing the sidecar at exit failed")
