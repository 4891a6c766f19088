"""A log profiled for planning: its statistics, with its last part held out.

The planner fits its candidates on the first part of a profile and chooses among them on the rest
(``placement.holdout``): the plan a user gets is the one that did best on data it was not fitted
on. :func:`profile_batches` reads batches in log order into two statistics, the fitted part (the
first ``1 - holdout_share`` of the samples) and the held-out part (the last ``holdout_share``),
splitting the batch that crosses the boundary, and the held-out part once more into its two
halves in log order (:attr:`Profile.holdout_halves`: the held-out choice asks a candidate to lead
on both, ``placement.holdout``). Logs are written in time order; a log whose ``ts`` goes back in
time is still split in row order, and :attr:`Profile.time_ordered` says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..stats.batch import Batch, slice_batch
from ..stats.config import TableConfig
from ..stats.stream import StreamStats

__all__ = ["Profile", "profile_batches", "DEFAULT_HOLDOUT_SHARE"]

#: The share of a profile's samples held out by default: its last quarter.
DEFAULT_HOLDOUT_SHARE = 0.25


@dataclass
class Profile:
    """Statistics of a log, split in log order.

    fit : the first samples (all of them without a held-out part)
    holdout : the last ``holdout_share`` of the samples, or None (too few samples, or share 0)
    time_ordered : whether the batches' ``ts`` never went back in time (True without ``ts``)
    holdout_halves : the held-out part's first and second half of its samples in log order
        (counted apart, ``holdout`` counts them together), or None (no held-out part, or one
        sample in it); whether they hold enough samples to judge a plan is the planner's call
        (``placement.holdout.halves_usable``)
    """

    fit: StreamStats
    holdout: StreamStats | None
    time_ordered: bool = True
    holdout_halves: tuple[StreamStats, StreamStats] | None = None

    @property
    def whole(self) -> StreamStats:
        """Both parts merged (a new object; the parts are left as they are)."""
        if self.holdout is None:
            return self.fit
        return self.fit.copy().merge(self.holdout)

    @property
    def samples(self) -> int:
        """Samples in both parts."""
        return int(self.fit.samples + (self.holdout.samples if self.holdout else 0))


def _check_share(holdout_share: float) -> float:
    share = float(holdout_share)
    if not 0 <= share < 1 or math.isnan(share):
        raise ConfigError(f"holdout_share must be in [0, 1), got {holdout_share}")
    return share


def profile_batches(batches: Iterable[Batch], tables: Sequence[TableConfig], total_samples: int,
                    holdout_share: float = DEFAULT_HOLDOUT_SHARE, *,
                    min_holdout_samples: int = 1) -> Profile:
    """Read ``batches`` (log order) into a :class:`Profile`: the first
    ``total_samples * (1 - holdout_share)`` samples into :attr:`Profile.fit`, the rest into
    :attr:`Profile.holdout`.

    Parameters
    ----------
    batches : the log's batches, in order
    tables : the statistics' tables (``TableConfig``)
    total_samples : samples the batches hold (rows of the log; bad rows skipped by the reader make
        the held-out part a little smaller than its share)
    holdout_share : the share held out, in [0, 1)
    min_holdout_samples : a held-out part smaller than this is folded into the fitted part
        (``holdout`` None): one training iteration, G x B samples, at least
    """
    share = _check_share(holdout_share)
    cut = int(total_samples) - int(round(int(total_samples) * share))
    held_out = share > 0 and int(total_samples) - cut >= max(1, int(min_holdout_samples))
    mid = cut + (int(total_samples) - cut) // 2
    fit = StreamStats(list(tables))
    hold = StreamStats(list(tables)) if held_out else None
    halves = (StreamStats(list(tables)), StreamStats(list(tables))) if held_out else None
    seen, last_ts, ordered = 0, -math.inf, True
    for b in batches:
        if b.timestamp is not None and b.batch_size:
            ts = np.asarray(b.timestamp)
            ordered = ordered and bool(ts[0] >= last_ts and np.all(np.diff(ts) >= 0))
            last_ts = float(ts[-1])
        n = b.batch_size
        if hold is None or seen + n <= cut:
            fit.update(b)
        else:
            _count_held_out(b, seen, cut, mid, fit, hold, halves)
        seen += n
    if hold is not None and hold.samples == 0:
        hold = None
    if hold is None or min(h.samples for h in halves) == 0:
        halves = None
    return Profile(fit, hold, ordered, halves)


def _count_held_out(b: Batch, seen: int, cut: int, mid: int, fit: StreamStats,
                    hold: StreamStats, halves: tuple[StreamStats, StreamStats]) -> None:
    """Count ``b`` (its first sample the log's ``seen``-th) into the fitted part before ``cut``,
    the held-out part after it and each held-out half (``mid`` between them), cut by samples."""
    n = b.batch_size
    if seen < cut:
        fit.update(slice_batch(b, 0, cut - seen))
    lo = max(seen, cut)
    part = b if lo == seen else slice_batch(b, lo - seen, n)
    hold.update(part)
    for h, a, z in ((halves[0], lo, min(seen + n, mid)), (halves[1], max(lo, mid), seen + n)):
        if z > a:
            h.update(part if (a, z) == (lo, seen + n) else slice_batch(b, a - seen, z - seen))
