"""Drift-aware views of the statistics: a sliding window (ring of sub-windows) or exponential decay.

Both take batches through ``update(batch)`` like :class:`StreamStats` and expose ``view()``: a
:class:`StreamStats` of what they currently remember, which the planner and re-sharder consume.
Progress is counted in batches, or in seconds of the batches' timestamps (wall-clock time when a
batch carries none).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import ConfigError
from .batch import Batch
from .config import SketchConfig, TableConfig
from .stream import StreamStats, validate_batch

__all__ = ["Clock", "WindowedStats", "DecayedStats"]


@dataclass(frozen=True)
class Clock:
    """How progress is measured: ``unit`` is "batches" or "seconds"."""

    unit: str = "batches"

    def __post_init__(self) -> None:
        if self.unit not in ("batches", "seconds"):
            raise ConfigError(f"window unit must be 'batches' or 'seconds', got {self.unit!r}")

    def position(self, batch: Batch, batches_so_far: int) -> float:
        if self.unit == "batches":
            return float(batches_so_far)
        if batch.timestamp is not None:
            return float(batch.timestamp.max())
        return time.time()


class WindowedStats:
    """Statistics of the last ``window`` batches or seconds, as a ring of ``slots`` sub-windows.

    Each sub-window spans ``window / slots``; when the stream moves past it, the oldest sub-window is
    dropped whole, so the view covers between ``window - window/slots`` and ``window`` of history.
    Every sketch forgets exactly (the view is the merge of the live sub-windows). Memory: ``slots``
    times one :class:`StreamStats`.
    """

    def __init__(self, tables: Mapping[str, int | None] | Sequence[TableConfig | str] | None = None,
                 config: SketchConfig | None = None, *, window: float, slots: int = 4,
                 unit: str = "batches", auto_tables: bool = False):
        if not window > 0:
            raise ConfigError(f"window must be > 0 {unit}, got {window}")
        if not (1 <= slots <= 1024):
            raise ConfigError(f"slots must be in [1, 1024], got {slots}")
        self.clock = Clock(unit)
        self.window = float(window)
        self.slots = int(slots)
        self.span = self.window / self.slots
        self._tables = tables
        self.config = config or SketchConfig()
        self.auto_tables = auto_tables
        self._ring: deque[tuple[float, StreamStats]] = deque()
        self._seen = 0

    def _new(self) -> StreamStats:
        return StreamStats(self._tables, self.config, auto_tables=self.auto_tables)

    def update(self, batch: Batch) -> "WindowedStats":
        probe = self._ring[-1][1] if self._ring else self._new()
        validate_batch(batch, probe.table_configs, allow_new=probe.auto_tables)
        if batch.batch_size == 0:
            return self
        pos = self.clock.position(batch, self._seen)
        slot_start = pos - (pos % self.span) if self.clock.unit == "batches" else None
        if not self._ring or pos >= self._ring[-1][0] + self.span:
            start = slot_start if slot_start is not None else pos
            self._ring.append((start, self._new()))
        while self._ring and self._ring[0][0] + self.window <= pos:
            self._ring.popleft()
        self._ring[-1][1].update(batch)
        self._seen += 1
        return self

    def view(self) -> StreamStats:
        """Merged statistics of the live sub-windows (a new object)."""
        out = self._new()
        for _, s in self._ring:
            out.merge(s)
        return out

    @property
    def live_slots(self) -> int:
        return len(self._ring)


class DecayedStats:
    """Exponentially decayed statistics: every ``period`` batches or seconds all counts are scaled by
    ``0.5 ** (period / half_life)``, so a lookup ``t`` ago weighs about ``0.5 ** (t / half_life)``.

    Cheaper than a window (one set of sketches); distinct counts and length quantiles are not decayed.
    """

    def __init__(self, tables: Mapping[str, int | None] | Sequence[TableConfig | str] | None = None,
                 config: SketchConfig | None = None, *, half_life: float, period: float | None = None,
                 unit: str = "batches", auto_tables: bool = False):
        if not half_life > 0:
            raise ConfigError(f"half_life must be > 0 {unit}, got {half_life}")
        self.clock = Clock(unit)
        self.half_life = float(half_life)
        self.period = float(period) if period is not None else self.half_life / 4
        if not self.period > 0:
            raise ConfigError(f"period must be > 0 {unit}, got {period}")
        self.stats = StreamStats(tables, config, auto_tables=auto_tables)
        self._seen = 0
        self._next: float | None = None
        self.decays = 0

    def update(self, batch: Batch) -> "DecayedStats":
        validate_batch(batch, self.stats.table_configs, allow_new=self.stats.auto_tables)
        if batch.batch_size == 0:
            return self
        pos = self.clock.position(batch, self._seen)
        if self._next is None:
            self._next = pos + self.period
        steps = 0
        while pos >= self._next:
            steps += 1
            self._next += self.period
        if steps:
            self.stats.scale(0.5 ** (steps * self.period / self.half_life))
            self.decays += steps
        self.stats.update(batch)
        self._seen += 1
        return self

    def view(self) -> StreamStats:
        """The decayed statistics (live object; copy before mutating)."""
        return self.stats
