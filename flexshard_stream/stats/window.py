"""Drift-aware views of the statistics: a sliding window (ring of sub-windows) or exponential decay.

Both take batches through ``update(batch)`` like :class:`StreamStats` (validated once, at this
edge) and expose ``view()``: a :class:`StreamStats` of what they currently remember, which the
planner and re-sharder consume. Both offer the state protocol (``state()`` / ``restore(state)``,
:mod:`flexshard_stream.stats.state`).
Progress is counted in batches, or in seconds of the batches' timestamps (wall-clock time when a
batch carries none).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import ConfigError, FormatError
from .batch import Batch
from .config import SketchConfig, TableConfig
from .state import NUMBER, OPTIONAL_NUMBER, check_state, state_blob
from .stream import StreamStats, stream_state, validate_batch

__all__ = ["Clock", "DecayedStats", "MIN_DECAY_FACTOR", "WindowedStats", "decay_factor"]

#: The smallest factor a decay scales counts by: ``2 ** -64`` already takes every count (below
#: ``2 ** 63``) to zero, as counts are rounded down, while upper bounds are rounded up and stay
#: valid. A longer gap forgets no more, and the factor never underflows to 0.0.
MIN_DECAY_FACTOR = 2.0 ** -64


def decay_factor(elapsed: float, half_life: float) -> float:
    """``0.5 ** (elapsed / half_life)`` in closed form, clamped to ``[MIN_DECAY_FACTOR, 1]``
    (``elapsed`` and ``half_life`` in the same unit: batches, seconds or windows). No loop, no
    underflow: a gap of any length (even an infinite one) gives a factor
    :meth:`~flexshard_stream.stats.stream.StreamStats.scale` accepts."""
    if not elapsed > 0:
        return 1.0
    exponent = elapsed / half_life
    if not exponent < 64:
        return MIN_DECAY_FACTOR
    return max(MIN_DECAY_FACTOR, 0.5 ** exponent)


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
        self._executor: Executor | None = None

    def _new(self) -> StreamStats:
        s = StreamStats(self._tables, self.config, auto_tables=self.auto_tables)
        s.set_executor(self._executor)
        return s

    def set_executor(self, executor: Executor | None) -> None:
        """Update the tables of a batch in parallel on ``executor`` (every sub-window, present
        and future; :meth:`StreamStats.set_executor`)."""
        self._executor = executor
        for _, s in self._ring:
            s.set_executor(executor)

    def resample(self, k: int) -> "WindowedStats":
        """Sample one ID occurrence in ``k`` from now on, in every live sub-window (rescaled,
        :meth:`TableStats.resample`: the view merges sub-windows of one rate) and in the next."""
        config = dataclasses.replace(self.config, sample_k=k)
        for _, s in self._ring:
            s.resample(config.sample_k)
        self.config = config
        return self

    def update(self, batch: Batch) -> "WindowedStats":
        """Validate ``batch`` (once), then count it in the current sub-window."""
        probe = self._ring[-1][1] if self._ring else self._new()
        parts = validate_batch(batch, probe.table_configs, allow_new=probe.auto_tables)
        if batch.batch_size == 0:
            return self
        pos = self.clock.position(batch, self._seen)
        slot_start = pos - (pos % self.span) if self.clock.unit == "batches" else None
        if not self._ring or pos >= self._ring[-1][0] + self.span:
            start = slot_start if slot_start is not None else pos
            self._ring.append((start, self._new()))
        while self._ring and self._ring[0][0] + self.window <= pos:
            self._ring.popleft()
        self._ring[-1][1].update_validated(batch, parts)
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

    # ------------------------------------------------------- state protocol
    def state(self) -> dict[str, Any]:
        """The live sub-windows as a plain dict (torch: ``state_dict``)::

            {"kind": "windowed", "version": 1, "window": float, "slots": int, "unit": str,
             "seen": int (batches), "starts": [float, ...] (sub-window starts, in ``unit``),
             "blobs": {"window-<i>.fss": bytes}}   # one StreamStats container per sub-window
        """
        return {"kind": "windowed", "version": _STATE_VERSION, "window": self.window,
                "slots": self.slots, "unit": self.clock.unit, "seen": self._seen,
                "starts": [float(start) for start, _ in self._ring],
                "blobs": {f"window-{i}.fss": s.to_bytes() for i, (_, s) in enumerate(self._ring)}}

    def restore(self, state: Mapping[str, Any]) -> list[str]:
        """Replace the sub-windows by those of ``state`` (from :meth:`state`; torch:
        ``load_state_dict``).

        Tables and sketch config must be this object's, and so must the unit (the starts are
        positions in it): ConfigError otherwise; a malformed state is a FormatError; either way
        nothing changes. The sampling rate is the state's (:meth:`StreamStats.restore`). A
        different ``window`` or ``slots`` is allowed: this object's are kept, and each difference
        is returned as a note.
        """
        check_state(state, "windowed", _STATE_VERSION,
                    {"window": NUMBER, "slots": int, "unit": str, "seen": int, "starts": list})
        if state["unit"] != self.clock.unit:
            raise ConfigError(f"the windowed state's unit is {state['unit']!r}, this object's "
                              f"{self.clock.unit!r}: its sub-window starts cannot be carried over")
        starts = state["starts"]
        if not all(isinstance(x, NUMBER) and not isinstance(x, bool) and math.isfinite(x)
                   for x in starts) or state["seen"] < 0:
            raise FormatError("windowed state: 'starts' must be finite numbers and 'seen' >= 0")
        ring: deque[tuple[float, StreamStats]] = deque()
        for i, start in enumerate(starts):
            window = self._new()
            window.restore(stream_state(state_blob(state, "windowed", f"window-{i}.fss")))
            ring.append((float(start), window))
        rates = {s.config.sample_k for _, s in ring}
        if len(rates) > 1:
            raise FormatError(f"windowed state: sub-windows sampled at different rates "
                              f"{sorted(rates)}; they do not merge")
        notes = _setting_notes(state, {"window": self.window, "slots": self.slots})
        self._ring, self._seen = ring, int(state["seen"])
        if ring:
            self.config = ring[0][1].config
        return notes


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

    @property
    def config(self) -> SketchConfig:
        """The sketch config of the statistics (its ``sample_k``: the rate in force)."""
        return self.stats.config

    def set_executor(self, executor: Executor | None) -> None:
        """Update the tables of a batch in parallel on ``executor``
        (:meth:`StreamStats.set_executor`)."""
        self.stats.set_executor(executor)

    def resample(self, k: int) -> "DecayedStats":
        """Sample one ID occurrence in ``k`` from now on (:meth:`StreamStats.resample`)."""
        self.stats.resample(k)
        return self

    def update(self, batch: Batch) -> "DecayedStats":
        """Validate ``batch`` (once), decay what is due, then count it."""
        parts = validate_batch(batch, self.stats.table_configs, allow_new=self.stats.auto_tables)
        if batch.batch_size == 0:
            return self
        pos = self.clock.position(batch, self._seen)
        if self._next is None:
            self._next = pos + self.period
        if pos >= self._next:
            self._decay_to(pos)
        self.stats.update_validated(batch, parts)
        self._seen += 1
        return self

    def _decay_to(self, pos: float) -> None:
        """Apply every decay due up to ``pos`` (at or past the next one) at once, in closed form:
        the periods elapsed are one factor (:func:`decay_factor`), and the next decay moves to
        the first period boundary after ``pos``. A jump of any length costs the same."""
        nxt = pos + (self.period - (pos - self._next) % self.period)
        if not nxt > pos:          # rounding at a huge position (then possibly pos itself)
            nxt = pos + self.period
        elapsed = nxt - self._next
        self.stats.scale(decay_factor(elapsed, self.half_life))
        periods = elapsed / self.period
        self.decays += int(round(periods)) if periods < 2 ** 62 else 2 ** 62
        self._next = nxt

    def view(self) -> StreamStats:
        """The decayed statistics (live object; copy before mutating)."""
        return self.stats

    # ------------------------------------------------------- state protocol
    def state(self) -> dict[str, Any]:
        """The decayed counts and the decay clock as a plain dict (torch: ``state_dict``)::

            {"kind": "decayed", "version": 1, "half_life": float, "period": float, "unit": str,
             "seen": int (batches), "next": float | None (position of the next decay, in ``unit``),
             "decays": int, "blobs": {"stats.fss": bytes}}   # the StreamStats container
        """
        return {"kind": "decayed", "version": _STATE_VERSION, "half_life": self.half_life,
                "period": self.period, "unit": self.clock.unit, "seen": self._seen,
                "next": self._next, "decays": self.decays,
                "blobs": {"stats.fss": self.stats.to_bytes()}}

    def restore(self, state: Mapping[str, Any]) -> list[str]:
        """Replace the counts and the decay clock by those of ``state`` (from :meth:`state`; torch:
        ``load_state_dict``), in place.

        Tables and sketch config must be this object's (ConfigError); a malformed state is a
        FormatError; either way nothing changes. ``half_life``, ``period`` and ``unit`` may differ:
        this object's are kept, each difference is returned as a note, and with another unit the
        next decay is scheduled afresh (the state's position is in the other unit).
        """
        check_state(state, "decayed", _STATE_VERSION,
                    {"half_life": NUMBER, "period": NUMBER, "unit": str, "seen": int,
                     "next": OPTIONAL_NUMBER, "decays": int})
        nxt = state["next"]
        if state["seen"] < 0 or state["decays"] < 0 or (nxt is not None and not math.isfinite(nxt)):
            raise FormatError("decayed state: 'seen' and 'decays' must be >= 0 and 'next' finite")
        notes = _setting_notes(state, {"half_life": self.half_life, "period": self.period,
                                       "unit": self.clock.unit})
        same_unit = state["unit"] == self.clock.unit
        notes += self.stats.restore(stream_state(state_blob(state, "decayed", "stats.fss")))
        self._seen, self.decays = int(state["seen"]), int(state["decays"])
        self._next = (None if nxt is None else float(nxt)) if same_unit else None
        return notes


_STATE_VERSION = 1


def _setting_notes(state: Mapping[str, Any], have: Mapping[str, Any]) -> list[str]:
    """One note per setting in which ``state`` differs from this object (which keeps its own)."""
    return [f"{k}: the state was made with {state[k]!r}, this object uses {v!r} (kept)"
            for k, v in have.items() if state[k] != v]
