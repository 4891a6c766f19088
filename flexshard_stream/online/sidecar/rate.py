"""The sidecar's sampling rate: one ID occurrence in ``k`` kept, ``k`` chosen so that ingestion
stays within a CPU budget at the offered load, without dropping batches.

:class:`RateController` is the decision alone (no threads, no clocks): the ingest thread hands it
one :class:`Interval` of measurements about every half second (``ingest.SAMPLING_INTERVAL_S``)
and applies the ``k`` it returns between two batches (``resample``, docs/STATISTICS.md). The model: ingesting one ID costs
``a + b / k`` CPU seconds (``a``: what every ID costs: validation, its hash, the HyperLogLog
register; ``b``: what only kept IDs cost: count-min, heavy hitters, and one sample in ``k`` of the
length sketch), fitted on the costs measured at the rates used recently. The load is the CPU the
offered IDs would need at the rate in force, as a fraction of the budget (or the fraction of the
ingest thread's wall time they would take, if that is larger: a thread that waits for a core keeps
up with less than its budget).

Hysteresis: ``k`` goes up at once when the load passes ``high`` (or batches were dropped, or the
queue is half full), to the smallest ``k`` the model predicts to bring it to ``target``; it comes
down one halving at a time, and only after ``settle`` intervals in a row in which the load at half
the rate stays under ``low`` (by the cost measured there lately, or else by twice the load: the
cost per ID at most doubles when ``k`` halves). A step down thus lands under ``low`` and is undone
only when the offered rate grows by ``high / low`` (1.8x); a step up lands near ``target`` and is
undone only when the load falls below ``low`` at half the rate. A steady load settles.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ...errors import ConfigError
from ...stats.config import MAX_SAMPLE_K

__all__ = ["Interval", "RateController"]

#: Weight of the newest measurement in the running cost per ID at one rate.
_EWMA = 0.5
#: A rate's cost measurement older than this is left out of the fit (seconds).
_MEMORY_S = 60.0
#: ``k`` goes no sparser than the first rate whose predicted cost is within this fraction of the
#: sparsest rate's (the accuracy a sparser rate loses would buy almost no CPU).
_DIMINISHING = 0.1
#: The sampled rates measured must span this factor before ``a + b / k`` is fitted on them.
_SPAN = 4


class Interval(NamedTuple):
    """What the ingest threads did during one control interval."""

    seconds: float        # wall time of the interval
    cpu_s: float          # CPU seconds the ingest threads spent updating the statistics
    busy_s: float         # wall seconds the ingest thread spent updating them
    processed_ids: int    # IDs taken into the statistics
    offered_ids: int      # IDs offered to ``submit`` (accepted or dropped)
    dropped_ids: int      # IDs dropped by the queue
    backlog: float        # fill of the queue at the end (0: empty, 1: full, by its tightest bound)


class RateController:
    """Chooses the sampling rate ``k`` (one ID in ``k``; powers of two times the starting rate).

    Parameters
    ----------
    cpu_budget : float
        Cores the ingestion may use (0.5: half of one core).
    k : int
        The rate in force at the start.
    max_k : int
        The sparsest rate it may choose.
    high, target, low : float
        Fractions of the budget: go up above ``high``, to ``target``; go down when the halved
        rate is predicted under ``low``.
    settle : int
        Intervals in a row the step down must be predicted safe before it is taken.
    """

    def __init__(self, cpu_budget: float, *, k: int = 1, max_k: int = 1024, high: float = 0.9,
                 target: float = 0.7, low: float = 0.5, settle: int = 3):
        if not (isinstance(cpu_budget, (int, float)) and math.isfinite(cpu_budget)
                and cpu_budget > 0):
            raise ConfigError(f"cpu_budget must be a positive number of cores (0.5: half a "
                              f"core), got {cpu_budget!r}")
        if not 1 <= max_k <= MAX_SAMPLE_K:
            raise ConfigError(f"max_sample_k must be in [1, {MAX_SAMPLE_K}], got {max_k!r}")
        if not 0 < low < target < high:
            raise ConfigError(f"expected 0 < low < target < high, got {low}, {target}, {high}")
        if settle < 1:
            raise ConfigError(f"settle must be >= 1 interval, got {settle}")
        self.cpu_budget, self.max_k = float(cpu_budget), int(max_k)
        self.high, self.target, self.low, self.settle = high, target, low, int(settle)
        self.k = 1
        self.over_budget = False
        self.load = 0.0                # the last interval's load (fraction of the budget)
        self.offered_ids_per_s = 0.0   # the last interval's offered rate
        self.cpu_share = 0.0           # the last interval's CPU use (cores)
        self._cost: dict[int, tuple[float, float]] = {}   # k -> (CPU s per ID, when measured)
        self._wall_ratio = 1.0         # busy wall time per CPU second (running average)
        self._clock = 0.0              # seconds of intervals observed
        self._calm = 0
        self.start(k)

    def start(self, k: int) -> None:
        """Begin (again) at rate ``k`` (the statistics' after a restart); costs measured so far
        are forgotten."""
        if not 1 <= k <= MAX_SAMPLE_K:
            raise ConfigError(f"sample_k must be in [1, {MAX_SAMPLE_K}], got {k!r}")
        self.k, self._cost, self._calm, self.over_budget = int(k), {}, 0, False

    # ------------------------------------------------------------------ the decision
    def observe(self, m: Interval) -> int | None:
        """Take one interval's measurements; the new ``k`` when the rate should change, else
        None."""
        if m.seconds <= 0:
            return None
        self._clock += m.seconds
        self.offered_ids_per_s = m.offered_ids / m.seconds
        self.cpu_share = m.cpu_s / m.seconds
        self._learn(m)
        cost = self._cost.get(self.k)
        load = None if cost is None else self._load(cost[0])
        if self.offered_ids_per_s == 0:
            load = 0.0
        self.load = self.load if load is None else load
        pressure = m.dropped_ids > 0 or m.backlog >= 0.5
        if pressure or (load is not None and load > self.high):
            return self._go_up(load)
        self.over_budget = False
        if load is not None and self.k > 1 and self._halved_load(load) <= self.low:
            self._calm += 1
            if self._calm >= self.settle:
                return self._change(self._halved())
        else:
            self._calm = 0
        return None

    def _learn(self, m: Interval) -> None:
        if m.processed_ids <= 0 or m.cpu_s <= 0:
            return
        c = m.cpu_s / m.processed_ids
        old = self._cost.get(self.k)
        self._cost[self.k] = (c if old is None else _EWMA * c + (1 - _EWMA) * old[0], self._clock)
        self._wall_ratio = _EWMA * (m.busy_s / m.cpu_s) + (1 - _EWMA) * self._wall_ratio

    def _load(self, cost_per_id: float) -> float:
        """The load at a CPU cost per ID: the larger of the CPU the offered rate needs over the
        budget, and the fraction of the ingest thread's wall time it needs."""
        cpu = self.offered_ids_per_s * cost_per_id
        return max(cpu / self.cpu_budget, cpu * self._wall_ratio)

    def _go_up(self, load: float | None) -> int | None:
        """The smallest doubling of ``k`` predicted to bring ``load`` to ``target`` (one doubling
        without a measured load), never sparser than where sparser rates stop paying (what every
        ID costs dominates: :meth:`_useful`); ``over_budget`` when no rate is enough."""
        self._calm = 0
        rates = [self.k << j for j in range(1, 64) if self.k << j <= self.max_k]
        useful = self._useful([self.k, *rates])
        rates = [k for k in rates if k <= useful]
        self.over_budget = not rates
        if not rates:
            return None
        if load is None:
            return self._change(rates[0])
        for k in rates:
            if load * self._ratio(k) <= self.target:
                return self._change(k)
        self.over_budget = True
        return self._change(rates[-1])

    def _useful(self, rates: list[int]) -> int:
        """The first of ``rates`` whose predicted cost is within ``_DIMINISHING`` of the
        sparsest's: going further would lose accuracy for (almost) no CPU."""
        floor = self._predict(rates[-1])
        return next(k for k in rates if self._predict(k) <= floor * (1 + _DIMINISHING))

    def _halved_load(self, load: float) -> float:
        """The load at half the rate: from the cost measured there lately, else twice this one
        (``a + b / k`` at most doubles when ``k`` halves): a step down never overshoots, so it is
        not undone while the offered rate stays within ``high / low`` of what it was."""
        fresh = self._fresh()
        half = self._halved()
        if half in fresh and self.k in fresh:
            return load * fresh[half] / fresh[self.k]
        return 2 * load

    def _change(self, k: int) -> int | None:
        if k == self.k:
            return None
        self.k, self._calm = k, 0
        return k

    def _halved(self) -> int:
        return max(1, self.k // 2)

    # ------------------------------------------------------------------ the cost model
    def _ratio(self, k: int) -> float:
        """Predicted cost per ID at ``k`` over the cost at the rate in force."""
        return self._predict(k) / self._predict(self.k)

    def _predict(self, k: int) -> float:
        """``a + b / k`` fitted (least squares in ``1 / k``, both >= 0) on the recent costs; with
        costs at one rate only, ``a = 0`` (all of the cost scales with ``k``: optimistic for a
        step up, which the next interval corrects, pessimistic for a step down). ``k = 1`` is the
        unsampled kernel, which draws no random gaps: its own measured cost when known."""
        if k == 1 and 1 in self._fresh():
            return self._fresh()[1]
        a, b = self.model()
        return a + b / k

    def _fresh(self) -> dict[int, float]:
        return {k: c for k, (c, t) in self._cost.items() if self._clock - t <= _MEMORY_S}

    def model(self) -> tuple[float, float]:
        """``(a, b)``: CPU seconds per ID every ID costs, and per ID kept, for sampled rates.

        Fitted on the sampled rates (``k >= 2``: sampling draws a random gap per kept ID, which
        the unsampled kernel does not, so ``k = 1`` is off the curve) once they span a factor of
        ``_SPAN`` (closer rates differ by less than the noise of a shared machine); until then
        ``a = 0`` through the sparsest rate measured (or ``k = 1``)."""
        fresh = self._fresh()
        sampled = {k: c for k, c in fresh.items() if k > 1}
        if not fresh:
            return 0.0, 1.0
        if not sampled or max(sampled) < _SPAN * min(sampled):
            k = max(sampled or fresh)
            return 0.0, fresh[k] * k
        xs = [1.0 / k for k in sampled]
        ys = list(sampled.values())
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        a = my - b * mx
        if b <= 0:     # the cost does not fall with k: all of it is fixed
            return my, 0.0
        if a < 0:      # no fixed part: fit the line through the origin
            return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        return a, b
