"""What every part of the sidecar shares: its errors and warning, the file-format names, the
lock, conditions and error slot of its threads (:class:`Coordination`), the base of its two
threads (:class:`BackgroundThread`) and small helpers (deadlines, temp-file clean-up, nice values).

Imports nothing else of the sidecar, so every part can import it without a cycle.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import FlexShardError

__all__ = ["BackgroundThread", "CHECKPOINT_FORMAT", "CheckpointLostError", "COUNTERS_FORMAT", "COUNTER_KEYS", "CheckJob",
           "Coordination", "FORMAT_VERSION", "STATE_FORMAT", "SidecarError", "SidecarWarning",
           "deadline_after", "remove_temp_entries", "renice", "warn"]

log = logging.getLogger("flexshard_stream.online.sidecar")

CHECKPOINT_FORMAT = "flexshard-sidecar-checkpoint"   # ckpt-NNNNNNNN/manifest.json
STATE_FORMAT = "flexshard-sidecar-state"             # out_dir/state.json
COUNTERS_FORMAT = "flexshard-sidecar-counters"       # out_dir/counters.json
FORMAT_VERSION = 1

#: the cumulative counters persisted in counters.json and in checkpoints (batches and IDs)
COUNTER_KEYS = ("submitted", "accepted", "dropped", "submitted_ids", "accepted_ids",
                "dropped_ids", "processed", "processed_ids")


class SidecarError(FlexShardError):
    """An error in a sidecar background thread, re-raised in the caller (``__cause__`` is the
    original exception), or a call on a closed sidecar."""


class CheckpointLostError(SidecarError):
    """The final checkpoint failed: what the statistics took in since the last good checkpoint
    is not on disk, so a restart cannot resume it (``lost_batches``, ``lost_ids``)."""

    def __init__(self, message: str, lost_batches: int, lost_ids: int):
        super().__init__(message)
        self.lost_batches, self.lost_ids = lost_batches, lost_ids


class SidecarWarning(UserWarning):
    """A damaged checkpoint or published file was skipped, or a restart could not account for
    every batch."""


class CheckJob(NamedTuple):
    """A due check, handed by the ingest thread to the planner thread."""

    summaries: Mapping[str, Any]   # the statistics' frequency summaries per table
    position: float                # batches or seconds (the check schedule's unit)
    batches_in_stats: int          # batches in the statistics summarized (cumulative)


def renice(nice: int) -> None:
    """Add ``nice`` to the calling thread's nice value (Linux: per thread; capped at 19)."""
    if not nice:
        return
    try:
        tid = threading.get_native_id()
        cur = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(-20, min(19, cur + nice)))
    except (OSError, AttributeError) as e:  # not Linux, or not allowed (negative values)
        log.warning("sidecar: cannot change the thread priority by %+d: %s", nice, e)


def remove_temp_entries(directory: Path, prefixes: tuple[str, ...] = (".",)) -> None:
    """Remove what a killed process left half-written in ``directory``: the hidden entries whose
    names start with one of ``prefixes`` (temp files and directories), never ``.lock``."""
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        if p.name.startswith(prefixes) and p.name != ".lock":
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` deadline ``timeout`` seconds from now (None: no deadline)."""
    return None if timeout is None else time.monotonic() + timeout


def warn(message: str) -> None:
    """Log ``message`` and issue it as a :class:`SidecarWarning` attributed to the first caller
    outside the sidecar package (the line that built or drove the sidecar)."""
    log.warning(message)
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of warn()
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, SidecarWarning, stacklevel=level)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Coordination:
    """The one lock of a sidecar, the conditions its threads wait on, and its error slot.

    The lock is re-entrant: every part's public methods take it, and the sidecar holds it around
    several calls where it needs one consistent view (``flush`` waits on the queue and both threads
    together). Conditions: ``work`` (the ingest thread: batches, checkpoint requests, stop),
    ``room`` (blocked submitters), ``idle`` (``flush``, ``checkpoint``, ``close``: progress) and
    ``planning`` (the planner thread: a check to run, stop).

    Errors: a background error is logged and kept (the first one; later ones counted) until
    :meth:`raise_pending` raises it as :class:`SidecarError` or :meth:`pop_error` takes it. A
    background thread that dies sets :attr:`fatal` and wakes every waiter.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.work = threading.Condition(self.lock)
        self.room = threading.Condition(self.lock)
        self.idle = threading.Condition(self.lock)
        self.planning = threading.Condition(self.lock)
        self.fatal: BaseException | None = None
        self.errors = 0               # exceptions in the background threads (this process)
        self._error: BaseException | None = None
        self._error_where = ""
        self._more_errors = 0

    def record_error(self, error: BaseException, where: str) -> None:
        """Log ``error`` (raised in ``where``, a few words) and keep it for the caller."""
        log.error("sidecar %s failed: %s: %s", where, type(error).__name__, error,
                  exc_info=(type(error), error, error.__traceback__))
        with self.lock:
            self.errors += 1
            if self._error is None:
                self._error, self._error_where = error, where
            else:
                self._more_errors += 1

    def pop_error(self) -> BaseException | None:
        """Take the pending background error without raising it (None if there is none)."""
        with self.lock:
            error, self._error, self._more_errors = self._error, None, 0
            return error

    def has_error(self) -> bool:
        """Whether an error is pending or a background thread died."""
        return self._error is not None or self.fatal is not None

    def raise_pending(self) -> None:
        """Raise :class:`SidecarError` for a dead background thread or a pending error (which is
        then cleared: reported once)."""
        if self.fatal is not None:
            raise SidecarError(f"the sidecar's background thread died: "
                               f"{type(self.fatal).__name__}: {self.fatal}") from self.fatal
        with self.lock:
            error, where, more = self._error, self._error_where, self._more_errors
            self._error, self._more_errors = None, 0
        if error is not None:
            extra = f" (and {more} more, see the log)" if more else ""
            raise SidecarError(f"sidecar background error in {where}: "
                               f"{type(error).__name__}: {error}{extra}") from error

    def die(self, error: BaseException, thread: str) -> None:
        """A background thread's last act: record ``error`` as fatal and wake every waiter."""
        log.critical("sidecar thread %s died", thread, exc_info=error)
        with self.lock:
            self.fatal = error
            for cv in (self.work, self.room, self.idle, self.planning):
                cv.notify_all()

    def wait(self, cv: threading.Condition, busy: Callable[[], bool], deadline: float | None, *,
             until_fatal: bool = True) -> bool:
        """With the lock held: wait on ``cv`` while ``busy()`` (and, with ``until_fatal``, no
        thread died), up to the ``time.monotonic()`` ``deadline`` (None: forever). Returns False
        on timeout."""
        while busy() and not (until_fatal and self.fatal is not None):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            cv.wait(left)
        return True


class BackgroundThread:
    """One of the sidecar's two threads (daemon, named ``fss-sidecar-<name>``): it runs
    :meth:`_loop` at ``nice`` (see :func:`renice`); an exception escaping it is a bug, made fatal
    for every waiter (:meth:`Coordination.die`)."""

    def __init__(self, sync: Coordination, name: str, nice: int):
        self._sync, self._nice = sync, nice
        self._thread = threading.Thread(target=self._main, name=f"fss-sidecar-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_current(self) -> bool:
        """Whether the caller runs on this thread."""
        return threading.current_thread() is self._thread

    def join(self, timeout: float | None) -> bool:
        """Wait for the thread to end (seconds; None: forever); True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        renice(self._nice)
        try:
            self._loop()
        except BaseException as e:  # a bug: make every waiter see it
            self._sync.die(e, self._thread.name)

    def _loop(self) -> None:
        raise NotImplementedError
