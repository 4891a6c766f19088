"""Plans chosen for the next window, not the last: selection on a held-out part of the profile.

A plan fitted to a profile is judged in sample by the statistics it was fitted on; the hot set
drifts, so in-sample figures flatter the candidates fitted hardest (the most replicas, rows
placed by load, ranges weighted by the profile's load). :func:`select_on_holdout` re-prices the
planner's most promising candidates, every whole plan (the baselines, the partitions, TorchRec's
plan when given) and row-wise on a held-out part of the profile that none of them was fitted on
(the last quarter in time, ``docs/PLANNER.md`` "Chosen for the next window"), and returns the one
fastest there among those that fit the budget on both parts, unless the held-out part's two halves
(in time order) are each one iteration at least: then :func:`lead_on_both_halves` chooses, and a
candidate displaces the fastest whole plan only where it is faster on both halves (by
:data:`HALVES_MARGIN`). What ``plan`` prints is then the held-out figure: what the next window
sees, as far as the profile can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..stats.summary import FrequencySummary
from .cost import Cost
from .pricing import AnalyticPricing, Candidate, fits_budget
from .workload import Workload

__all__ = ["HoldoutChoice", "select_on_holdout", "HOLDOUT_SHARE", "holdout_pricing",
           "lead_on_both_halves", "halves_usable", "HALVES_MARGIN"]

#: The share of the profile's samples, its last in time (or in row order), held out by default.
HOLDOUT_SHARE = 0.25
#: How much faster than the incumbent a candidate must be on its worse held-out half to displace
#: it: the sampling noise between two draws of one distribution that docs/PLANNER.md states
#: (a lead under it is no evidence; measured in "Chosen for the next window").
HALVES_MARGIN = 0.02
# relative slack on "faster": ties go to the candidate listed first (row-wise first)
_REL = 1e-12


@dataclass(frozen=True)
class HoldoutChoice:
    """The candidate chosen on the held-out statistics.

    candidate : the chosen one (its ``cost`` is the in-sample cost, on the fitted part)
    holdout_cost : its cost on the held-out part
    priced : how many candidates were priced on the held-out part
    costs : {origin: held-out iteration time (seconds)} of the fastest candidate of each origin
    rule : how it was chosen: ``"fastest on the held-out part"`` or ``"lead on both halves"``
        (:func:`lead_on_both_halves`)
    halves : with the halves' rule, ``{"incumbent": origin of the fastest whole plan,
        "worse_half_ratio": the chosen one's time over the incumbent's on its worse half,
        "samples": samples per half}``; else ``{"why_not": ...}`` when halves were given
    """

    candidate: Candidate
    holdout_cost: Cost
    priced: int
    costs: Mapping[str, float]
    rule: str = "fastest on the held-out part"
    halves: Mapping[str, object] | None = None


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


def _half_samples(halves: Sequence[AnalyticPricing]) -> int:
    """Samples in the smaller half (each half's: its largest table summary's)."""
    return min(max((s.samples for s in h.summaries.values()), default=0) for h in halves)


def halves_usable(halves: Sequence[AnalyticPricing] | None, iteration_samples: int
                  ) -> tuple[bool, str]:
    """Whether the held-out halves can judge a lead: two of them, each holding one iteration
    (``iteration_samples``, G x B) at least (the samples of its largest table's summary); with
    the reason when not."""
    if halves is None:
        return False, "no halves given"
    if len(halves) != 2:
        raise ConfigError(f"held-out halves: expected 2, got {len(halves)}")
    n = _half_samples(halves)
    if n < iteration_samples:
        return False, (f"a half holds {n:,} samples, under one iteration "
                       f"({iteration_samples:,}): the fastest on the whole held-out part")
    return True, ""


def lead_on_both_halves(priced: Sequence[tuple[Candidate, Cost]],
                        halves: Sequence[AnalyticPricing], margin: float = HALVES_MARGIN
                        ) -> tuple[int, int, float]:
    """The held-out choice robust to the held-out part's noise (docs/PLANNER.md "Chosen for the
    next window"). ``priced``: (candidate, held-out cost) of every candidate that fits, in the
    shortlist's order; ``halves``: the held-out part's first and second half (time order).

    The incumbent is the fastest whole plan (``state`` None: a baseline, a partition, a
    reference) on the whole held-out part. Every candidate is priced on each half and its
    time divided by the incumbent's there; its score is the worse (larger) of the two ratios. A
    candidate displaces the incumbent only with a score below ``1 - margin``, faster by the
    margin on both halves, and the lowest score wins (ties to the first listed). Returns (index
    of the chosen one in ``priced``, index of the incumbent, the chosen one's score: 1.0 when
    the incumbent stays)."""
    whole = [i for i, (c, _) in enumerate(priced) if c.state is None]
    pool = whole or range(len(priced))
    inc = min(pool, key=lambda i: (priced[i][1].iteration_time_s, i))
    ref = [h.cost(priced[inc][0].plan).iteration_time_s for h in halves]
    best, score = inc, 1.0
    for i, (c, _) in enumerate(priced):
        if i == inc:
            continue
        r = max(h.cost(c.plan).iteration_time_s / max(t, 1e-300) for h, t in zip(halves, ref))
        if r < min(score, 1.0 - margin) * (1 - _REL):
            best, score = i, r
    return best, inc, score


def select_on_holdout(candidates: Sequence[Candidate], budget_bytes: float,
                      pricing: AnalyticPricing, *, top: int = 16,
                      halves: Sequence[AnalyticPricing] | None = None) -> HoldoutChoice | None:
    """The candidate chosen on the held-out statistics (``pricing``) among the whole plans and
    the ``top`` fastest tier candidates in sample, each fitting ``budget_bytes`` per GPU (plus its
    margin) in sample and on the held-out part: by :func:`lead_on_both_halves` when ``halves``
    (the held-out part's two halves in time order, priced like ``pricing``) each hold one
    iteration (:func:`halves_usable`), else the fastest on ``pricing``, ties to the first
    listed (``candidates[0]``, row-wise, first). None when no candidate fits."""
    costs: dict[str, float] = {}
    shortlist = _shortlist(candidates, budget_bytes, top)
    priced: list[tuple[Candidate, Cost]] = []
    for c in shortlist:
        cost = pricing.cost(c.plan)
        if not fits_budget(cost, budget_bytes - c.margin_bytes):
            continue
        t = cost.iteration_time_s
        costs[c.origin] = min(costs.get(c.origin, t), t)
        priced.append((c, cost))
    if not priced:
        return None
    gb = pricing.batch_size * priced[0][0].plan.topology.num_gpus
    ok, why = halves_usable(halves, gb)
    if not ok:
        best = 0
        for i, (_, cost) in enumerate(priced):
            if cost.iteration_time_s < priced[best][1].iteration_time_s * (1 - _REL):
                best = i
        return HoldoutChoice(*priced[best], len(shortlist), costs,
                             halves=None if halves is None else {"why_not": why})
    best, inc, score = lead_on_both_halves(priced, halves)
    return HoldoutChoice(*priced[best], len(shortlist), costs, "lead on both halves",
                         {"incumbent": priced[inc][0].origin, "worse_half_ratio": score,
                          "samples": _half_samples(halves)})
