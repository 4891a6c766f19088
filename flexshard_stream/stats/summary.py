"""The frequency summary of one table: what the planner consumes.

Explicit top rows (IDs with estimates and bounds, in lookups) and a model of the tail: the lookups not
in the top and the number of distinct rows they spread over. The tail model used downstream is uniform
over ``tail_rows`` rows (each tail row carries ``tail_mass / tail_rows`` lookups); the top rows'
estimates already cover the skewed head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FrequencySummary"]


@dataclass(frozen=True, eq=False)
class FrequencySummary:
    """Per-table frequency summary (counts are lookups, i.e. ID occurrences).

    Attributes
    ----------
    table : str
    total : int                 lookups counted (N)
    top_ids : int64[k]          row IDs, by decreasing estimate (ties by ID)
    top_est, top_lower, top_upper : float64[k]   lookups; ``lower <= true <= upper`` (sketch guarantee)
    distinct_estimate : float   rows touched at least once (exact when ``exact``)
    distinct_lower, distinct_upper : float  about 95% bounds (equal to the estimate when exact)
    tail_mass : float           lookups not on top rows, ``>= 0``
    tail_rows : float           distinct rows not in the top, ``>= 0``
    num_rows : int | None       table size when known
    exact : bool                counted exactly (no sketch error)
    samples : int               samples (bags) seen
    mean_length : float         mean IDs per sample
    length_quantiles : dict     {"0.5": .., "0.9": .., "0.99": ..} IDs per sample
    """

    table: str
    total: int
    top_ids: np.ndarray
    top_est: np.ndarray
    top_lower: np.ndarray
    top_upper: np.ndarray
    distinct_estimate: float
    distinct_lower: float
    distinct_upper: float
    tail_mass: float
    tail_rows: float
    num_rows: int | None = None
    exact: bool = False
    samples: int = 0
    mean_length: float = 0.0
    length_quantiles: dict[str, float] = field(default_factory=dict)

    @property
    def k(self) -> int:
        """Explicit top rows."""
        return int(self.top_ids.size)

    def top_probabilities(self) -> np.ndarray:
        """Estimated access probability of each top row (estimate / total)."""
        return self.top_est / self.total if self.total else np.zeros_like(self.top_est)

    def hottest_first(self, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The top rows inside ``[0, num_rows)`` and their estimates by decreasing estimate, ties
        by ID (``np.lexsort((ids, -est))`` of them), read-only, computed once per ``num_rows``.
        A summary already in that order (as :attr:`top_ids` documents) is checked in one pass
        and not sorted again; the planner's benefit curves and HugeCTR's baseline both read it."""
        cache = self.__dict__.setdefault("_hottest_first", {})
        key = int(num_rows)
        found = cache.get(key)
        if found is None:
            found = cache[key] = _hottest_first(self.top_ids, self.top_est, key)
        return found

    def tail_probability(self) -> float:
        """Modelled access probability of one tail row (uniform tail)."""
        if self.total == 0 or self.tail_rows <= 0:
            return 0.0
        return self.tail_mass / self.total / self.tail_rows

    def probabilities(self, ids: np.ndarray) -> np.ndarray:
        """Estimated access probability of each of ``ids`` (float64): its estimate / total for a
        top row, the tail probability for any other row; zeros when nothing was seen."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.total == 0 or ids.size == 0:
            return np.zeros(ids.size)
        if self.top_ids.size == 0:
            return np.full(ids.size, self.tail_probability())
        order = np.argsort(self.top_ids, kind="stable")
        top = self.top_ids[order]
        pos = np.clip(np.searchsorted(top, ids), 0, top.size - 1)
        return np.where(top[pos] == ids, self.top_est[order][pos] / self.total,
                        self.tail_probability())

    def to_dict(self, topk: int | None = None) -> dict[str, Any]:
        """The JSON form used by ``flexshard-stream stats --json``."""
        k = self.k if topk is None else min(topk, self.k)
        top = [[int(i), float(e), float(lo), float(hi)] for i, e, lo, hi in
               zip(self.top_ids[:k], self.top_est[:k], self.top_lower[:k], self.top_upper[:k])]
        return {"total": int(self.total), "distinct_estimate": float(self.distinct_estimate),
                "distinct_bounds": [float(self.distinct_lower), float(self.distinct_upper)],
                "exact": bool(self.exact), "num_rows": self.num_rows, "samples": int(self.samples),
                "mean_length": float(self.mean_length), "tail_mass": float(self.tail_mass),
                "tail_rows": float(self.tail_rows), "top": top,
                "length_quantiles": dict(self.length_quantiles)}


def _hottest_first(ids: np.ndarray, est: np.ndarray, num_rows: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`FrequencySummary.hottest_first`: the rows inside the table, the sort skipped when
    they already are in order (estimates not increasing, IDs increasing among equal estimates:
    then ``lexsort`` is the identity; a NaN fails the check and is sorted as before)."""
    ids, est = np.asarray(ids, np.int64), np.asarray(est, np.float64)
    ok = (ids >= 0) & (ids < num_rows)
    if not ok.all():
        ids, est = ids[ok], est[ok]
    a, b = est[:-1], est[1:]
    if not (np.all(b <= a) and np.all((b < a) | (ids[1:] > ids[:-1]))):
        order = np.lexsort((ids, -est))
        ids, est = ids[order], est[order]
    ids, est = ids.copy(), est.copy()
    ids.flags.writeable = False
    est.flags.writeable = False
    return ids, est
