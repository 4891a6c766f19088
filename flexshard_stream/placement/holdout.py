"""Plans chosen for the next window, not the last: selection on a held-out part of the profile.

A plan fitted to a profile is judged in sample by the statistics it was fitted on; the hot set
drifts, so in-sample figures flatter the candidates fitted hardest (the most replicas, rows
placed by load, ranges weighted by the profile's load). :func:`select_on_holdout` re-prices the
planner's most promising candidates, every whole plan (the baselines, the partitions, TorchRec's
plan when given) and row-wise on a held-out part of the profile that none of them was fitted on
(the last quarter in time, ``docs/PLANNER.md`` "Chosen for the next window"), and returns the one
fastest there among those that fit the budget on both parts. What ``plan`` prints is then the
held-out figure: what the next window sees, as far as the profile can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..stats.summary import FrequencySummary
from .cost import Cost
from .pricing import AnalyticPricing, Candidate, fits_budget
from .workload import Workload

__all__ = ["HoldoutChoice", "select_on_holdout", "HOLDOUT_SHARE", "holdout_pricing"]

#: The share of the profile's samples, its last in time (or in row order), held out by default.
HOLDOUT_SHARE = 0.25
# relative slack on "faster": ties go to the candidate listed first (row-wise first)
_REL = 1e-12


@dataclass(frozen=True)
class HoldoutChoice:
    """The candidate chosen on the held-out statistics.

    candidate : the chosen one (its ``cost`` is the in-sample cost, on the fitted part)
    holdout_cost : its cost on the held-out part
    priced : how many candidates were priced on the held-out part
    costs : {origin: held-out iteration time (seconds)} of the fastest candidate of each origin
    """

    candidate: Candidate
    holdout_cost: Cost
    priced: int
    costs: Mapping[str, float]


def holdout_pricing(pricing: AnalyticPricing,
                    holdout: Mapping[str, FrequencySummary]) -> AnalyticPricing:
    """The fitted part's pricing (its workload's B and cost model) on the held-out summaries (one
    per table name, as ``pricing.summaries``), with the held-out mean lengths (the fitted ones
    where the held-out part saw none)."""
    missing = sorted(set(pricing.summaries) - set(holdout))
    if missing:
        raise ConfigError(f"held-out statistics miss table(s) {missing}")
    sums = {n: holdout[n] for n in pricing.summaries}
    lengths = {n: float(s.mean_length or pricing.mean_lengths.get(n, 1.0) or 1.0)
               for n, s in sums.items()}
    return AnalyticPricing(sums, Workload(pricing.batch_size, pricing.model, lengths))


def _shortlist(candidates: Sequence[Candidate], budget_bytes: float, top: int
               ) -> list[Candidate]:
    """Row-wise (the first), every whole plan, and the ``top`` fastest tier candidates in
    sample, each once, in that order; only those that fit the budget in sample."""
    fit = [c for c in candidates if c.fits(budget_bytes)]
    whole = [c for c in fit if c.state is None]
    tiers = sorted((c for c in fit if c.state is not None),
                   key=lambda c: c.cost.iteration_time_s)[:top]
    out, seen = [], set()
    for c in [*whole, *tiers]:
        if id(c) not in seen:
            seen.add(id(c))
            out.append(c)
    return out


def select_on_holdout(candidates: Sequence[Candidate], budget_bytes: float,
                      pricing: AnalyticPricing, *, top: int = 16) -> HoldoutChoice | None:
    """The candidate fastest on the held-out statistics (``pricing``) among the whole plans and
    the ``top`` fastest tier candidates in sample, each fitting ``budget_bytes`` per GPU (plus its
    margin) in sample and on the held-out part; ties go to the first listed (``candidates[0]``,
    row-wise, first). None when no candidate fits."""
    best: tuple[Candidate, Cost] | None = None
    costs: dict[str, float] = {}
    shortlist = _shortlist(candidates, budget_bytes, top)
    for c in shortlist:
        cost = pricing.cost(c.plan)
        if not fits_budget(cost, budget_bytes - c.margin_bytes):
            continue
        t = cost.iteration_time_s
        costs[c.origin] = min(costs.get(c.origin, t), t)
        if best is None or t < best[1].iteration_time_s * (1 - _REL):
            best = (c, cost)
    if best is None:
        return None
    return HoldoutChoice(best[0], best[1], len(shortlist), costs)
