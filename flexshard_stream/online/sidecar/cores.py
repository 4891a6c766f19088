"""More than one core for ingestion: threads that update the tables of a batch in parallel, and
the CPU time the ingest threads use (what the sidecar's CPU budget is measured against).

Per-table ownership: within one batch each table is updated by one thread, and the batches are
taken one after the other, so every table sees its IDs in stream order and the statistics are
exactly those of one thread (``StreamStats.set_executor``). The Numba kernels release the GIL, so
the threads run on separate cores; the Python around them (validation, decay, windows) stays on
the ingest thread.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor

from ...errors import ConfigError
from .common import renice

__all__ = ["TableThreads"]


class TableThreads:
    """``threads`` threads (1: none besides the ingest thread) at ``nice``, for the tables of a
    batch; :meth:`cpu_seconds` adds their CPU time to the calling (ingest) thread's."""

    def __init__(self, threads: int, nice: int):
        if isinstance(threads, bool) or int(threads) != threads or threads < 1:
            raise ConfigError(f"ingest_threads must be an integer >= 1, got {threads!r}")
        self.threads = int(threads)
        self._nice = nice
        self._idents: list[int] = []
        self._lock = threading.Lock()
        # threads start when first used, each at ``nice``, and end at close()
        self._pool = (ThreadPoolExecutor(self.threads, thread_name_prefix="fss-sidecar-table",
                                         initializer=self._started)
                      if self.threads > 1 else None)

    @property
    def executor(self) -> Executor | None:
        """The pool for ``StreamStats.set_executor`` (None with one thread)."""
        return self._pool

    def _started(self) -> None:
        renice(self._nice)
        with self._lock:
            self._idents.append(threading.get_ident())

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the calling thread and the pool's threads (call it from
        the ingest thread, before :meth:`close`)."""
        with self._lock:
            idents = list(self._idents)
        return time.thread_time() + sum(
            time.clock_gettime(time.pthread_getcpuclockid(i)) for i in idents)

    def close(self) -> None:
        """End the pool's threads (waits for a running update)."""
        with self._lock:
            self._idents = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
