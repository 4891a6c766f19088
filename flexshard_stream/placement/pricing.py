"""The planner's price and select stages: candidates priced by the one evaluator, the fastest that
fits the memory budget chosen.

- :class:`AnalyticPricing`: the workload every candidate is priced on, and
  :meth:`AnalyticPricing.cost`, the one evaluator
  (:func:`~flexshard_stream.placement.cost.evaluate_analytic`) on it;
- :class:`CandidatePricer`: builds each proposed candidate under every cold layout
  (``placement.candidates``), fits it to the HBM budget with the host memory tier when asked
  (:func:`~flexshard_stream.placement.recshard.split_cold`), prices it, and keeps every priced
  :class:`Candidate` (each priced once);
- :func:`select_within_budget`: the fastest candidate whose peak per-GPU memory fits the budget, or
  the error with the numbers.

docs/PLANNER.md, "Steps" 3 and 6, gives the reasoning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..plans.plan import Plan
from ..stats.summary import FrequencySummary
from .candidates import BenefitCurve, PlanBuilder, State
from .cost import Cost, CostModel, TopRowCache, analytic_summaries, evaluate_analytic
from .recshard import TopRows, split_cold
from .workload import Workload, workload_of

__all__ = ["AnalyticPricing", "Candidate", "CandidatePricer", "StatisticalMargin", "fits_budget",
           "select_within_budget"]

# relative slack on the budget and on "faster": absorbs the rounding of the evaluator's sums
_REL = 1e-12


def fits_budget(cost: Cost, budget_bytes: float) -> bool:
    """Whether the plan's peak per-GPU memory (bytes) fits ``budget_bytes`` per GPU (relative
    slack 1e-12)."""
    return cost.peak_memory_bytes <= budget_bytes * (1 + _REL)


class AnalyticPricing:
    """The workload candidates are priced on: the statistics and the one :class:`Workload`.

    summaries : {table name: FrequencySummary}, one per table
    workload : the :class:`~flexshard_stream.placement.workload.Workload` (B, cost model, mean
        lengths, iterations profiled); ``AnalyticPricing(summaries, batch_size, model,
        mean_lengths)``, the form before it, builds one
        (:func:`~flexshard_stream.placement.workload.workload_of`)

    ``batch_size``, ``model`` and ``mean_lengths`` read the workload's.
    """

    def __init__(self, summaries: Mapping[str, FrequencySummary], workload: Workload | int,
                 model: CostModel | None = None,
                 mean_lengths: Mapping[str, float] | None = None):
        self._summaries = summaries
        self._workload = workload_of(workload, model, mean_lengths, where="AnalyticPricing")
        self._top_rows: dict = {}
        self._summary_arrays: dict = {}

    @property
    def summaries(self) -> Mapping[str, FrequencySummary]:
        """{table name: FrequencySummary} the candidates are priced on."""
        return self._summaries

    @property
    def workload(self) -> Workload:
        """The workload the candidates are priced on."""
        return self._workload

    @property
    def batch_size(self) -> int:
        """B, samples per GPU per iteration (the workload's)."""
        return self._workload.batch_size

    @property
    def model(self) -> CostModel:
        """The cost model (the workload's)."""
        return self._workload.model

    @property
    def mean_lengths(self) -> Mapping[str, float]:
        """{table name: IDs per sample} (the workload's)."""
        return self._workload.mean_lengths

    def cost(self, plan: Plan) -> Cost:
        """The analytic evaluator's cost of ``plan`` (no per-GPU traffic matrices); the
        summaries' side of the kernel computed once per table order (every candidate of a
        planning run has the same), with its :class:`~.cost.TopRowCache` (top rows' requests and
        cold owners, shared by the plans with the same layouts)."""
        names = tuple(plan.tables)
        found = self._summary_arrays.get(names)
        if found is None:
            found = self._summary_arrays[names] = (analytic_summaries(
                [tp.table for tp in plan.tables.values()], self._summaries, self._workload),
                TopRowCache())
        arrays, top_rows = found
        return evaluate_analytic(plan, self._summaries, workload=self._workload,
                                 want_matrices=False, summary_arrays=arrays, top_rows=top_rows)

    def split_cold(self, plan: Plan, budget_bytes: float, cost: Cost) -> Plan:
        """``recshard.split_cold`` of ``plan`` (analytic ``cost``) under ``budget_bytes`` per GPU,
        with the summaries' top rows gathered once per table order (every candidate of a planning
        run shares them)."""
        names = tuple(plan.tables)
        top = self._top_rows.get(names)
        if top is None:
            top = self._top_rows[names] = TopRows.gather(
                list(plan.tables.values()), self._summaries, self._workload)
        return split_cold(plan, self._summaries, hbm_budget=budget_bytes, cost=cost,
                          top_rows=top, workload=self._workload)


@dataclass
class Candidate:
    """A priced candidate.

    plan, cost : the plan (host tier included when it was fitted) and its modelled cost
    moves_applied : the prefix of the move sequence it comes from (0: none; -1: a shared-threshold
                    candidate)
    state : per-table tier sizes ``(k0, k1)`` (None for a baseline)
    weights : the cold ranges' weights per GPU (None: equal ranges)
    origin : where it comes from: a baseline's name ("rw", "tw", ...), "partition" (sharding
             kinds per table), "flexshard" (tiers on row-wise ranges) or "tiers on <origin>"
    margin_bytes : memory kept free below the budget for it to hold out of sample (bytes per GPU,
             ``margin.py``; 0 for baselines and partitions, which replicate nothing on statistics)
    """

    plan: Plan
    cost: Cost
    moves_applied: int
    state: list[tuple[int, int]] | None
    weights: np.ndarray | None
    origin: str = "flexshard"
    margin_bytes: float = 0.0

    def fits(self, budget_bytes: float) -> bool:
        """Whether its peak per-GPU memory plus its margin fits ``budget_bytes`` per GPU."""
        return self.cost.peak_memory_bytes + self.margin_bytes <= budget_bytes * (1 + _REL)


class CandidatePricer:
    """Prices candidate tier sizes under every cold layout; each (state, layout, placement) once.

    Parameters
    ----------
    builder : turns tier sizes into plans (owns the plan caches)
    layouts : the cold range weights to try (``candidates.cold_layouts``; None: equal ranges)
    pricing : the workload and the evaluator
    budget_bytes : the per-GPU memory budget (HBM bytes with the host tier)
    host_memory : fit a candidate over the budget by moving cold rows to host memory
    node_replicas : whether the target runtime runs node replicas; without, a state's node
        replicas are made global (``(k0 + k1, 0)``)
    origin : the :attr:`Candidate.origin` of the tier candidates it prices
    margin : ``margin(state, cost) -> bytes`` kept free below the budget (None: no margin)
    """

    def __init__(self, builder: PlanBuilder, layouts: Sequence[np.ndarray | None],
                 pricing: AnalyticPricing, budget_bytes: float, host_memory: bool, *,
                 node_replicas: bool = True, origin: str = "flexshard", margin=None):
        self.builder = builder
        self.layouts = list(layouts) if builder.base is None else [None]
        self.pricing = pricing
        self.budget_bytes = budget_bytes
        self.host_memory = host_memory
        self.node_replicas = node_replicas
        self.origin = origin
        self.margin = margin
        self._priced: dict[tuple, Candidate] = {}

    def fit(self, plan: Plan, cost: Cost) -> tuple[Plan, Cost]:
        """With the host tier: a plan over the budget keeps its hottest cold rows in HBM and the
        rest in host memory, then is priced again; unchanged when it fits, without the host tier,
        or when even its replicas and buffers exceed the budget (then infeasible)."""
        if not self.host_memory or fits_budget(cost, self.budget_bytes):
            return plan, cost
        p = self.pricing
        try:
            split = p.split_cold(plan, self.budget_bytes, cost)
        except ConfigError:
            return plan, cost
        return split, p.cost(split)

    def baseline(self, plan: Plan, cost: Cost, origin: str = "rw") -> Candidate:
        """A baseline plan with its cost, fitted (:meth:`fit`) as every candidate is."""
        plan, cost = self.fit(plan, cost)
        return Candidate(plan, cost, 0, None, None, origin)

    def price_plan(self, plan: Plan, origin: str) -> Candidate:
        """A whole plan (a baseline, a partition) priced, fitted and kept as a candidate; each
        ``origin`` once."""
        key = ("plan", origin)
        cand = self._priced.get(key)
        if cand is None:
            cand = self._priced[key] = self.baseline(plan, self.pricing.cost(plan), origin)
        return cand

    def runnable_state(self, state: State) -> list[tuple[int, int]]:
        """``state`` as the builder and the target runtime can build it (node replicas made
        global without ``node_replicas``)."""
        st = self.builder.runnable_state(state)
        return st if self.node_replicas else [(k0 + k1, 0) for k0, k1 in st]

    def price(self, state: State, moves_applied: int, *, place: bool = False) -> Cost:
        """Price tier sizes ``state`` under every cold layout (``place``: with the hottest cold
        rows placed by load); returns the fastest cost (least ``iteration_time_s``)."""
        best = None
        state = self.runnable_state(state)
        for li, weights in enumerate(self.layouts):
            key = (tuple(state), li, place)
            cand = self._priced.get(key)
            if cand is None:
                plan = self.builder.build(state, place=place, weights=weights)
                plan, cost = self.fit(plan, self.pricing.cost(plan))
                margin = self.margin(state, cost) if self.margin is not None else 0.0
                cand = self._priced[key] = Candidate(plan, cost, moves_applied, list(state),
                                                     weights, self.origin, margin)
            if best is None or cand.cost.iteration_time_s < best.iteration_time_s:
                best = cand.cost
        return best

    @property
    def candidates(self) -> list[Candidate]:
        """Every priced candidate, in the order first priced."""
        return list(self._priced.values())

    def fastest(self, n: int) -> list[Candidate]:
        """The ``n`` fastest priced candidates (least ``iteration_time_s``, then first priced),
        feasible or not."""
        cands = self.candidates
        order = sorted((c.cost.iteration_time_s, i) for i, c in enumerate(cands))
        return [cands[i] for _, i in order[:n]]


class StatisticalMargin:
    """Memory a tier candidate keeps free below the budget so that its peak holds out of sample
    (docs/PLANNER.md, "Budgets that hold out of sample").

    Two sources, independent, added in quadrature and scaled by ``sigmas``:

    - the statistics: the buffers the replicas free (against ``reference``, row-wise, at the
      candidate's peak GPU) are proportional to the replicated rows' lookups, estimated from
      ``C`` counted lookups, Poisson relative error ``1 / sqrt(C)``;
    - the buffers' own variance: a GPU's buffer is a sum of per-lookup items of at most the
      largest embedding's bytes ``b``; Poisson, standard deviation ``sqrt(buffer * b)``. The
      out-of-sample peak is the largest over GPUs and iterations, about ``sqrt(2 ln(G I))``
      standard deviations above the mean: ``sigmas`` (3 by default) covers G I up to ~90.
      ``relative`` charges only the replicated lookups' noise, ``sqrt(freed * b)``, as if the
      baseline's peak moved with the candidate's; measured, it does not hold (see
      docs/PLANNER.md step 9), so the planner does not use it.

    A candidate without replicas gets no margin (it replicates nothing on the statistics).
    """

    def __init__(self, curves: Sequence[BenefitCurve], summaries: Mapping[str, FrequencySummary],
                 reference: Cost, sigmas: float, *, relative: bool = False):
        self.curves = list(curves)
        self.totals = np.array([float(summaries[c.table.name].total) for c in curves])
        self.reference = reference
        self.sigmas = float(sigmas)
        self.relative = bool(relative)
        self.item_bytes = max((c.eb for c in curves), default=0.0)

    def bytes_for(self, state: State, cost: Cost) -> float:
        """The margin (bytes per GPU) of a candidate with tier sizes ``state`` and ``cost``."""
        if self.sigmas <= 0 or not any(k0 or k1 for k0, k1 in state):
            return 0.0
        g = int(np.argmax(cost.peak_memory_per_gpu))
        freed = max(0.0, float(self.reference.buffer_bytes.max() - cost.buffer_bytes[g]))
        counted = sum(float(c.P[k0 + k1]) * n
                      for c, (k0, k1), n in zip(self.curves, state, self.totals))
        stat = freed / math.sqrt(counted) if counted > 0 else 0.0
        varying = freed if self.relative else max(0.0, float(cost.buffer_bytes[g]))
        noise = math.sqrt(varying * self.item_bytes)
        return self.sigmas * math.hypot(stat, noise)


def select_within_budget(candidates: Sequence[Candidate], budget_bytes: float, *,
                         need_bytes: float, host_memory: bool) -> Candidate:
    """The fastest candidate (least ``iteration_time_s``: communication plus host-memory lookups)
    whose peak per-GPU memory plus its margin (:meth:`Candidate.fits`) fits ``budget_bytes``; the
    first of equally fast ones (relative 1e-12).

    Raises
    ------
    ConfigError
        No candidate fits: names the budget and ``need_bytes`` (what the row-wise plan needs per
        GPU at its peak), or, with the host tier, says the buffers alone do not fit.
    """
    best = None
    for c in candidates:
        faster = best is None or c.cost.iteration_time_s < best.cost.iteration_time_s * (1 - _REL)
        if faster and c.fits(budget_bytes):
            best = c
    if best is not None:
        return best
    if host_memory:
        raise ConfigError(f"memory budget {budget_bytes:.4g} bytes per GPU is impossible even with "
                          "cold rows in host memory: the row-wise plan's communication "
                          "buffers and reservation alone do not fit")
    raise ConfigError(f"memory budget {budget_bytes:.4g} bytes per GPU is impossible: even the "
                      f"row-wise plan needs {need_bytes:.4g} bytes per GPU at its peak (the host "
                      "memory tier, MemoryPolicy(host_memory=True), can hold cold rows)")
