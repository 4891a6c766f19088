"""The FlexShard planner: per-row tiered replication on skewed networks, within the GPUs' memory.

:func:`plan_flexshard` runs three stages (docs/PLANNER.md gives the reasoning and where it departs
from the paper's abstract; TorchRec's planner separates its stages the same way):

1. **propose** (``placement.candidates``): order each table's summarized rows by estimated access
   probability (:class:`~flexshard_stream.placement.candidates.BenefitCurve`; the tail stays cold);
   generate promotion moves jointly across all tables on a load-aware model of the evaluator
   (``move_sequence``: a block of rows moves cold -> node replicas, or node -> global replicas,
   only while it pays for its sync); take a fixed grid of prefixes of that sequence, tier sizes cut
   at shared marginal values per byte, scaled variants (few tables) and the fastest candidates with
   their hottest cold rows placed by load; every candidate is built as a plan whose cold rows are
   in equal or bandwidth-weighted ranges (``PlanBuilder``);
2. **price** (``placement.pricing.CandidatePricer``): every candidate under every cold layout with
   the exact analytic evaluator, fitted to the HBM budget with the host memory tier when asked;
3. **select** (``placement.pricing.select_within_budget``): the fastest candidate whose peak
   per-GPU memory fits the budget; the row-wise baseline is always a candidate, so the result is
   never worse than it in the model, and the candidates do not depend on the budget, so more
   memory is never worse.
"""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from ..errors import ConfigError
from ..plans.plan import ColdSharding, Plan, TablePlan
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .baselines import BASELINES, baseline_plans, build_baseline, rows_lower_bound
from .candidates import (
    PlanBuilder,
    benefit_curves,
    coarse_search,
    cold_layouts,
    move_sequence,
    placement_states,
    prefix_grid,
    prefix_states,
    refinement_states,
    threshold_levels,
    threshold_states,
)
from .cost import Cost, CostModel
from .holdout import HoldoutChoice, holdout_pricing, select_on_holdout
from .partition import memory_caps, partition_plans, table_options
from .pricing import (
    AnalyticPricing,
    Candidate,
    CandidatePricer,
    StatisticalMargin,
    select_within_budget,
)
from .profiles import execution_profile
from .workload import Workload, workload_of

__all__ = ["MemoryPolicy", "PlannerConfig", "PlanResult", "plan_flexshard", "MEMORY_BASELINES",
           "TORCHREC_RESERVATION"]

#: The share of HBM TorchRec's planner reserves by default (``HeuristicalStorageReservation``,
#: ``percentage=0.15``, torchrec/distributed/planner/storage_reservations.py).
TORCHREC_RESERVATION = 0.15
#: Baselines a memory-neutral budget may be taken from.
MEMORY_BASELINES = ("rw", "rw-hash", "twrw", "tw")


@dataclass(frozen=True)
class MemoryPolicy:
    """Per-GPU memory budget (bytes), in this order: explicit ``bytes_per_gpu``; no more peak
    memory than ``baseline`` ("rw", "rw-hash", "twrw", "tw") on the same workload, times
    ``factor`` (the paper's memory-neutral setting); by default what a user has: each GPU's HBM
    less ``reservation`` (TorchRec's planner reserves 15%, ``HeuristicalStorageReservation``)
    less ``dense_bytes_per_gpu`` (the dense model and its optimizer state), the least over GPUs.

    host_memory : bool   the RecShard tier: a candidate whose peak HBM exceeds the budget keeps its
                         hottest cold rows in HBM and the rest in host memory (frequency-aware,
                         ``recshard.split_cold``), host lookups charged at UVM bandwidth; the
                         budget is then HBM bytes per GPU and may be below what row-wise needs.
    """

    bytes_per_gpu: float | None = None
    baseline: str | None = None
    factor: float | None = None
    host_memory: bool = False
    reservation: float = TORCHREC_RESERVATION
    dense_bytes_per_gpu: float = 0.0

    def __post_init__(self) -> None:
        if self.bytes_per_gpu is not None and not (0 < self.bytes_per_gpu < float("inf")):
            raise ConfigError(f"memory budget must be > 0 bytes per GPU, got {self.bytes_per_gpu}")
        if self.factor is not None and not 0 < self.factor < float("inf"):
            raise ConfigError(f"memory factor must be > 0, got {self.factor}")
        if self.baseline is not None and self.baseline not in MEMORY_BASELINES:
            raise ConfigError(f"memory baseline must be one of {', '.join(MEMORY_BASELINES)} (or "
                              f"None: the GPUs' HBM less the reservation), got {self.baseline!r}")
        if not 0 <= self.reservation < 1:
            raise ConfigError(f"memory reservation must be a share of HBM in [0, 1), got "
                              f"{self.reservation}")
        if not 0 <= self.dense_bytes_per_gpu < float("inf"):
            raise ConfigError(f"dense_bytes_per_gpu must be >= 0 bytes, got "
                              f"{self.dense_bytes_per_gpu}")

    @property
    def kind(self) -> str:
        """``"bytes"`` (explicit), ``"baseline"`` (against a baseline's peak: ``baseline`` or
        ``factor`` given; a factor alone scales row-wise's) or ``"hbm"`` (the default)."""
        if self.bytes_per_gpu is not None:
            return "bytes"
        return "baseline" if self.baseline is not None or self.factor is not None else "hbm"

    @property
    def baseline_factor(self) -> float:
        """The factor on the baseline's peak (1 unless ``factor`` says)."""
        return 1.0 if self.factor is None else float(self.factor)

    @property
    def baseline_name(self) -> str:
        """The baseline the budget is measured against (row-wise unless ``baseline`` says)."""
        return self.baseline or "rw"

    def hbm_budget(self, topo: Topology) -> float:
        """The default budget on ``topo``: the least HBM of a GPU less the reservation and the
        dense part (bytes per GPU); ConfigError when nothing is left."""
        hbm = float(np.min(topo.hbm_bytes))
        budget = hbm * (1 - self.reservation) - self.dense_bytes_per_gpu
        if not budget > 0:
            raise ConfigError(f"no memory left for embeddings: {hbm:.4g} bytes of HBM per GPU less "
                              f"the {self.reservation:.0%} reservation less "
                              f"{self.dense_bytes_per_gpu:.4g} bytes of dense model is "
                              f"{budget:.4g}")
        return budget

    def describe(self) -> str:
        """One line: what the budget is."""
        if self.kind == "bytes":
            return f"{self.bytes_per_gpu:.4g} bytes per GPU (set)"
        if self.kind == "baseline":
            return (f"no more peak memory than {self.baseline_name}"
                    + (f" x {self.baseline_factor:g}" if self.baseline_factor != 1 else ""))
        return (f"HBM less {self.reservation:.0%} reservation"
                + (f" and {self.dense_bytes_per_gpu:.4g} bytes dense" if self.dense_bytes_per_gpu
                   else ""))


@dataclass(frozen=True)
class PlannerConfig:
    """Planner knobs.

    blocks : int            rows of a table's top list are promoted in about this many blocks
    max_placed : int        hottest cold rows placed by load per table (0: none)
    prefix_candidates : int plans evaluated exactly along the move sequence
    bandwidth_aware : bool  weighted cold ranges and load-per-bandwidth placement
    variant_tables : int    up to this many tables, each prefix is also tried with its global
                            boundary and replicated prefix scaled (``refinement_states``)
    thresholds : int        shared marginal-value thresholds: every pair ``th0 >= th1`` of this
                            many levels (plus "none") cuts every table at the same expected
                            requests per byte; priced exactly when tables x GPUs <= 2^14, with
                            fewer levels when pairs x summarized rows exceed 2^25 (0: off)
    partition_tables : int  up to this many tables, every table is also priced alone under every
                            sharding kind the target runs and partitioned (``placement.partition``)
                            (0: off; whole-plan baselines are candidates always)
    kind_bases : int        tiers are also searched on top of this many of the fastest whole
                            plans other than row-wise (not when the search is coarse)
    margin_sigmas : float   standard deviations of the out-of-sample margin of tier candidates
                            (``pricing.StatisticalMargin``; 0: none)
    holdout_candidates : int with held-out statistics, the tier candidates fastest in sample
                            priced on them too (every whole plan is)
    """

    blocks: int = 64
    max_placed: int = 4096
    prefix_candidates: int = 16
    bandwidth_aware: bool = True
    variant_tables: int = 8
    thresholds: int = 10
    partition_tables: int = 64
    kind_bases: int = 2
    margin_sigmas: float = 3.0
    holdout_candidates: int = 16


@dataclass
class PlanResult:
    """The chosen plan with its modelled cost, the baseline's, and the budget.

    plan, cost : the chosen plan ("flexshard", or "rw" when row-wise won) and its analytic cost
    baseline, baseline_cost : the memory policy's baseline plan and its cost
    budget_bytes : the per-GPU memory budget (HBM bytes with the host memory tier)
    moves_applied : the prefix of the move sequence the plan comes from (0: none; -1: a
                    shared-threshold candidate)
    moves_generated : the length of the move sequence
    best_baseline, best_baseline_cost : the fastest baseline (``baselines.BASELINES``) that fits
                    the budget and runs on the target, and its cost ("" and None when none does)
    """

    plan: Plan
    cost: Cost
    baseline: Plan
    baseline_cost: Cost
    budget_bytes: float
    moves_applied: int
    moves_generated: int
    best_baseline: str = ""
    best_baseline_cost: Cost | None = None

    def summary(self) -> dict[str, Any]:
        c, b, bb = self.cost, self.baseline_cost, self.best_baseline_cost
        sel = self.plan.meta.get("selection")
        held = sel.get("holdout_iteration_time_s", {}) if isinstance(sel, dict) else {}
        tr = held.get("torchrec")
        return {"strategy": self.plan.strategy, "tiers": self.plan.tier_sizes(),
                "selection": {"holdout": bool(held), **(sel if isinstance(sel, dict) else {})},
                "speedup_vs_torchrec": (tr / c.iteration_time_s
                                        if tr and c.iteration_time_s > 0 else None),
                "budget_bytes": self.budget_bytes, "peak_memory_bytes": c.peak_memory_bytes,
                "baseline_peak_memory_bytes": b.peak_memory_bytes,
                "comm_time_s": c.comm_time_s, "baseline_comm_time_s": b.comm_time_s,
                "a2a_bytes": c.a2a_bytes, "baseline_a2a_bytes": b.a2a_bytes,
                "inter_node_bytes": c.inter_node_bytes,
                "baseline_inter_node_bytes": b.inter_node_bytes,
                "memory_room": self.plan.meta.get("memory_room", {}),
                "moves_applied": self.moves_applied, "moves_generated": self.moves_generated,
                "chosen_from": self.plan.meta.get("chosen_from"),
                "best_baseline": self.best_baseline or None,
                "best_baseline_iteration_time_s": bb.iteration_time_s if bb else None,
                "speedup_vs_best_baseline": (bb.iteration_time_s / c.iteration_time_s
                                             if bb and c.iteration_time_s > 0 else None)}


_F = TypeVar("_F", bound=Callable[..., Any])


def _cyclic_gc_paused(fn: _F) -> _F:
    """``fn`` run with Python's cyclic garbage collector paused (enabled again after, if it
    was). A planning run allocates tens of thousands of small objects that outlive its first
    collections (table plans, their arrays and caches, candidates), so the collector ran full
    passes over the whole process (Numba's objects included) during it: ~10% of the CPU
    seconds at 1,000 tables, for no garbage (the planner's objects form no reference cycles
    that outlive it; reference counting frees them as before). Whatever cycles a run leaves
    are collected once the collector runs again."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return run  # type: ignore[return-value]


@_cyclic_gc_paused
def plan_flexshard(tables: Sequence[EmbeddingTable], topo: Topology,
                   summaries: Mapping[str, FrequencySummary], batch_size: int | None = None,
                   memory: MemoryPolicy | None = None, model: CostModel | None = None, *,
                   mean_lengths: Mapping[str, float] | None = None,
                   config: PlannerConfig | None = None, target: str | None = None,
                   holdout: Mapping[str, FrequencySummary] | None = None,
                   references: Mapping[str, Plan] | None = None,
                   workload: Workload | None = None,
                   refit: Mapping[str, FrequencySummary] | None = None,
                   holdout_halves: Sequence[Mapping[str, FrequencySummary]] | None = None
                   ) -> PlanResult:
    """Plan every table's sharding kind and FlexShard tiers for ``tables`` on ``topo`` from
    per-table frequency summaries: propose (``placement.candidates``, ``placement.partition``)
    -> price -> select (``placement.pricing``), docs/PLANNER.md.

    Parameters
    ----------
    tables : the embedding tables
    topo : the cluster
    summaries : {table name or feature: FrequencySummary}
    batch_size : samples per GPU per iteration (B)
    memory : per-GPU budget (default ``MemoryPolicy()``: each GPU's HBM less TorchRec's reservation)
    model : the cost model options (de-duplication on, ``torchrec`` profile by default)
    mean_lengths : IDs per sample per table (default: from the summaries)
    config : the planner's knobs (default ``PlannerConfig()``)
    target : the runtime the plan must run on, "torchrec" or "ideal" (default: the model's
        profile); only plans its capability query accepts are candidates
    holdout : {table name or feature: FrequencySummary} of a held-out part of the profile (its
        last quarter in time; ``summaries`` then cover the rest): the candidates are fitted on
        ``summaries`` and the one fastest on ``holdout`` is chosen (``placement.holdout``); the
        result's cost is then the held-out cost
    references : {name: plan} more whole plans to choose among (TorchRec's own plan:
        ``placement.references.plan_torchrec``), priced like the baselines
    refit : {table name or feature: FrequencySummary} of the whole profile (``summaries`` and
        ``holdout`` together): with ``holdout``, the chosen candidate's recipe (its origin, tier
        sizes, cold layout) is built again on these statistics, so that its replicas are the
        hottest rows of the whole profile, the freshest the planner has (docs/PLANNER.md)
    holdout_halves : the held-out part's first and second half in time order (two summaries
        like ``holdout``; ``sources.profile.Profile.holdout_halves``): with ``holdout``, when each
        holds one iteration (G x B samples) at least, a candidate displaces the fastest whole
        plan only when it is faster on both (``placement.holdout.lead_on_both_halves``)
    workload : the :class:`~flexshard_stream.placement.workload.Workload` instead of
        ``batch_size``, ``model`` and ``mean_lengths`` (loose arguments given beside it must
        agree); bound to ``summaries`` here (``Workload.for_stats``: every table's mean length,
        the iterations profiled, unless it has them) and passed down to every stage

    Raises ConfigError for an impossible budget (below what the tables need at all), missing
    statistics or an unknown target; nothing is half-built.
    """
    memory, cfg = memory or MemoryPolicy(), config or PlannerConfig()
    unbound = workload_of(batch_size, model, mean_lengths, workload, where="plan_flexshard")
    sums = summaries_by_table(tables, summaries)
    work = unbound.for_stats(tables, topo, sums)
    model = work.model
    runtime = execution_profile(model.profile if target is None else target)
    pricing = AnalyticPricing(sums, work)
    base = _Baselines.build(tables, topo, memory, pricing)
    curves = benefit_curves(tables, sums, topo, work)
    search = _Search(tables, topo, curves, pricing, base, memory, cfg, runtime)
    search.references = tuple(references or ())
    unfit = search.cannot_fit(holdout is not None)
    priced = [b for b in BASELINES if b not in unfit]
    row_wise = search.whole_plans({**baseline_plans(tables, topo, sums, work, priced,
                                                    row_wise_plan=base.row_wise),
                                   **(references or {})})
    moves = search.tiers_on_row_wise()
    search.tiers_on_kinds()
    # select: the fastest candidate the target runs that fits (row-wise first: it wins ties)
    need = min(row_wise.cost.peak_memory_bytes, base.cost.peak_memory_bytes)
    pool = search.runnable([row_wise, *search.candidates()])
    best = select_within_budget(pool, base.budget_bytes, need_bytes=need,
                                host_memory=memory.host_memory)
    choice, held = None, None
    if holdout is not None:
        held = holdout_pricing(pricing, holdout)
        halves = (None if holdout_halves is None else
                  [holdout_pricing(pricing, h) for h in holdout_halves])
        choice = select_on_holdout(pool, base.budget_bytes, held, top=cfg.holdout_candidates,
                                   halves=halves)
        best = choice.candidate if choice is not None else best
    is_row_wise = best is row_wise
    if choice is not None and refit is not None:
        best = _refit(best, _Refit(tables, topo, refit, unbound, memory, cfg, runtime,
                                   references or {}))
    base_cost = base.cost if choice is None else held.cost(base.plan)
    result = _result(best, is_row_wise, base, memory, work, len(moves), runtime.name,
                     choice, base_cost)
    fastest = search.best_baseline([row_wise, *search.whole.candidates],
                                   None if choice is None else held)
    if fastest is not None:
        result.best_baseline, result.best_baseline_cost = fastest
    if choice is not None:
        result.plan.meta["selection"]["refit"] = best is not choice.candidate
    return result


@dataclass(frozen=True)
class _Refit:
    """What rebuilding a chosen candidate on the whole profile needs."""

    tables: Sequence[EmbeddingTable]
    topo: Topology
    summaries: Mapping[str, FrequencySummary]
    workload: Workload
    memory: "MemoryPolicy"
    cfg: "PlannerConfig"
    runtime: Any
    references: Mapping[str, Plan]


def _refit(chosen: Candidate, r: _Refit) -> Candidate:
    """``chosen``'s recipe built on the whole profile's statistics: a whole plan rebuilt by its
    name (a reference kept as it is), tiers of the same sizes, cold layout and placement on the
    same base. ``chosen`` itself when the rebuilt plan does not fit the budget (with its
    margin) or the recipe cannot be rebuilt; the rebuilt candidate keeps ``chosen``'s origin."""
    sums = summaries_by_table(r.tables, r.summaries)
    work = r.workload.for_stats(r.tables, r.topo, sums)
    pricing = AnalyticPricing(sums, work)
    base = _Baselines.build(r.tables, r.topo, r.memory, pricing)
    search = _Search(r.tables, r.topo, benefit_curves(r.tables, sums, r.topo, work), pricing,
                     base, r.memory, r.cfg, r.runtime)
    whole = search.rebuild_whole(chosen.origin.removeprefix("tiers on "), r.references)
    if whole is None:
        return chosen
    if chosen.state is None:
        new = whole
    else:
        new = search.rebuild_tiers(chosen, None if chosen.origin == "flexshard" else whole.plan)
    return new if search.runnable([new]) and new.fits(base.budget_bytes) else chosen


class _Search:
    """The candidates of one planning run: whole plans (baselines, partitions), tiers on row-wise
    ranges (the FlexShard search), tiers on the fastest sharding kinds; each priced once."""

    def __init__(self, tables, topo, curves, pricing, base, memory, cfg, runtime):
        self.tables, self.topo, self.curves, self.pricing = tables, topo, curves, pricing
        self.base, self.memory, self.cfg, self.runtime = base, memory, cfg, runtime
        self.coarse = coarse_search(len(curves), topo.num_gpus, cfg.variant_tables)
        self.node_ok = runtime.name == "ideal" or not any(
            runtime.table_issues(_with_node_replica(t), topo) for t in tables[:1])
        self.margin = StatisticalMargin(curves, pricing.summaries, base.row_wise_cost,
                                        cfg.margin_sigmas)
        self.whole = self._pricer(PlanBuilder(curves, topo, 0), "whole plans")
        self.tier_pricers: list[CandidatePricer] = []
        self.references: tuple[str, ...] = ()

    def _pricer(self, builder: PlanBuilder, origin: str, layouts=None) -> CandidatePricer:
        return CandidatePricer(builder, layouts or [None], self.pricing, self.base.budget_bytes,
                               self.memory.host_memory, node_replicas=self.node_ok,
                               origin=origin, margin=self.margin.bytes_for)

    def whole_plans(self, baselines: Mapping[str, Plan]) -> Candidate:
        """Row-wise (returned), every other baseline and the partitions (sharding kinds per
        table), priced as whole plans."""
        row_wise = self.whole.baseline(self.base.row_wise, self.base.row_wise_cost)
        for name, plan in baselines.items():
            if name != "rw":
                self.whole.price_plan(plan, name)
        if self.cfg.partition_tables and len(self.tables) <= self.cfg.partition_tables:
            opts = table_options(self.tables, self.topo, self.pricing.cost, self.runtime)
            caps = memory_caps(opts, self.topo.num_gpus)
            for i, plan in enumerate(partition_plans(self.tables, self.topo, opts, caps)):
                self.whole.price_plan(plan, "partition" if i == 0 else f"partition {i}")
        return row_wise

    def cannot_fit(self, holdout: bool) -> set[str]:
        """The baselines that provably cannot be chosen, so need not be built or priced: their
        rows alone (``baselines.rows_lower_bound``) plus the reservation exceed the budget (a
        plan's peak is its rows, its buffers, never negative, and the reservation; the slack,
        1e-6 of the budget, is far above the rounding of either sum). Only where a priced
        baseline that does not fit is read by nothing: without the host memory tier (which
        fits plans over the budget), without held-out statistics (their shortlist, the
        refit), and when no tiers are searched on other sharding kinds (their bases are the
        fastest whole plans, fitting or not: a coarse search, or ``kind_bases`` 0)."""
        if self.memory.host_memory or holdout or not (self.coarse or not self.cfg.kind_bases):
            return set()
        lookups = self.pricing.workload.lookups_per_iteration(self.pricing.summaries)
        room = self.base.budget_bytes * (1 + 1e-6) - self.pricing.model.reservation_bytes
        out = set()
        for name in BASELINES:
            bound = rows_lower_bound(name, self.tables, self.topo, lookups=lookups)
            if bound is not None and bound > room:
                out.add(name)
        return out

    def tiers_on_row_wise(self) -> list:
        """The FlexShard search: tiers of the greedy move sequence, shared thresholds,
        refinements and placement, on row-wise ranges; returns the move sequence."""
        cfg, curves, topo = self.cfg, self.curves, self.topo
        moves = move_sequence(curves, topo, self.pricing.model, cfg.blocks)
        few = len(curves) <= cfg.variant_tables
        self.prefixes = prefix_states(moves, prefix_grid(len(moves), cfg.prefix_candidates,
                                                         self.coarse), len(curves))
        builder = PlanBuilder(curves, topo, cfg.max_placed, reuse_tables=True)
        builder.share_cold_ranges(self.base.row_wise)
        pricer = self._pricer(builder, "flexshard", cold_layouts(topo, cfg.bandwidth_aware))
        self.tier_pricers.append(pricer)
        at_grid = [(pricer.price(st, g).iteration_time_s, g, st) for g, st in self.prefixes]
        if not self.coarse:
            for st in self._thresholds():
                pricer.price(st, -1)
        if few:
            for st, g in refinement_states(at_grid, curves):
                pricer.price(st, g)
        if cfg.max_placed > 0:
            fastest = [(c.state, c.moves_applied) for c in pricer.fastest(1 if self.coarse else 3)]
            for st, g in placement_states(fastest, self.prefixes if few else ()):
                pricer.price(st, g, place=True)
        return moves

    def _thresholds(self) -> list:
        if not hasattr(self, "_threshold_cache"):
            self._threshold_cache = threshold_states(
                self.curves, threshold_levels(self.curves, self.cfg.thresholds))
        return self._threshold_cache

    def tiers_on_kinds(self) -> None:
        """Global replicas (and node replicas on row-wise tables) on top of the fastest whole
        plans other than row-wise (``PlannerConfig.kind_bases``): the grid prefixes and shared
        thresholds, not when the search is coarse."""
        if self.coarse or not self.cfg.kind_bases:
            return
        wholes = [c for c in self.runnable(self.whole.candidates)
                  if c.origin != "rw" and any(not tp.replicated for tp in c.plan.tables.values())]
        wholes.sort(key=lambda c: c.cost.iteration_time_s)
        for c in wholes[: self.cfg.kind_bases]:
            pricer = self._pricer(PlanBuilder(self.curves, self.topo, 0, base=c.plan,
                                              reuse_tables=True),
                                  f"tiers on {c.origin}")
            self.tier_pricers.append(pricer)
            for g, st in self.prefixes:
                pricer.price(st, g)
            for st in self._thresholds():
                pricer.price(st, -1)

    def rebuild_whole(self, origin: str, references: Mapping[str, Plan]) -> Candidate | None:
        """The whole plan named ``origin`` (row-wise, a baseline, a partition, a reference) on
        this search's statistics, priced; None when there is no such plan."""
        if origin in ("rw", "flexshard"):
            return self.whole.baseline(self.base.row_wise, self.base.row_wise_cost)
        if origin in references:
            return self.whole.price_plan(references[origin], origin)
        if origin in BASELINES:
            plan = baseline_plans(self.tables, self.topo, self.pricing.summaries,
                                  self.pricing.workload, (origin,))[origin]
            return self.whole.price_plan(plan, origin)
        if origin.startswith("partition"):
            self.whole_plans({})
            return next((c for c in self.whole.candidates if c.origin == origin), None)
        return None

    def rebuild_tiers(self, chosen: Candidate, base: Plan | None) -> Candidate:
        """``chosen``'s tier sizes, cold layout and placement on this search's statistics: on
        row-wise ranges (``base`` None) or on ``base``'s sharding kinds."""
        if base is None:
            builder = PlanBuilder(self.curves, self.topo, self.cfg.max_placed)
            builder.share_cold_ranges(self.base.row_wise)
        else:
            builder = PlanBuilder(self.curves, self.topo, 0, base=base)
        pricer = self._pricer(builder, chosen.origin, [chosen.weights])
        place = any(tp.placed_ids.size for tp in chosen.plan.tables.values())
        pricer.price(chosen.state, chosen.moves_applied, place=place)
        return pricer.candidates[-1]

    def candidates(self) -> list[Candidate]:
        """Every priced candidate but row-wise, whole plans first, in the order priced."""
        out = [c for c in self.whole.candidates]
        for p in self.tier_pricers:
            out += p.candidates
        return out

    def best_baseline(self, cands: Sequence[Candidate], holdout: AnalyticPricing | None = None
                      ) -> tuple[str, Cost] | None:
        """The fastest of the baselines (and references) among ``cands`` that the target runs
        and that fit, with its cost: in sample, or on ``holdout`` when given."""
        named = (*BASELINES, *self.references)
        fit = [c for c in self.runnable(cands)
               if c.origin in named and c.fits(self.base.budget_bytes)]
        costs = [(c.origin, c.cost if holdout is None else holdout.cost(c.plan)) for c in fit]
        return min(costs, key=lambda oc: oc[1].iteration_time_s, default=None)

    def runnable(self, cands: Sequence[Candidate]) -> list[Candidate]:
        """The candidates the target runtime executes as planned (a host memory tier is planned
        as the policy asks, whatever the runtime's cache would do)."""
        if self.memory.host_memory:
            return list(cands)
        return [c for c in cands if self.runtime.can_run(c.plan)]


def _with_node_replica(table: EmbeddingTable) -> TablePlan:
    """A row-wise table plan of ``table`` with one node replica: the probe of whether a runtime
    runs node replicas (its capability query)."""
    return TablePlan(table, ColdSharding.hashed([0]), node_ids=[0], node_local=[0])


@dataclass(frozen=True)
class _Baselines:
    """The memory policy's baseline, the row-wise plan (the same one when the baseline is
    row-wise), their analytic costs and the per-GPU budget they give (bytes)."""

    plan: Plan
    cost: Cost
    row_wise: Plan
    row_wise_cost: Cost
    budget_bytes: float

    @classmethod
    def build(cls, tables: Sequence[EmbeddingTable], topo: Topology, memory: MemoryPolicy,
              pricing: AnalyticPricing) -> "_Baselines":
        baseline = build_baseline(memory.baseline_name if memory.kind == "baseline" else "rw",
                                  tables, topo)
        base_cost = pricing.cost(baseline)
        budget = {"bytes": lambda: memory.bytes_per_gpu,
                  "baseline": lambda: base_cost.peak_memory_bytes * memory.baseline_factor,
                  "hbm": lambda: memory.hbm_budget(topo)}[memory.kind]()
        if baseline.strategy == "rw":
            return cls(baseline, base_cost, baseline, base_cost, budget)
        rw = build_baseline("rw", tables, topo)
        return cls(baseline, base_cost, rw, pricing.cost(rw), budget)


def _result(best: Candidate, is_row_wise: bool, base: _Baselines, memory: MemoryPolicy,
            workload: Workload, moves_generated: int, target: str,
            choice: HoldoutChoice | None = None, base_cost: Cost | None = None) -> PlanResult:
    """The chosen candidate as the planner's result: its plan renamed and annotated (``meta``);
    with a held-out choice, its cost and the baseline's (``base_cost``) are the held-out ones."""
    cost, budget = (best.cost if choice is None else choice.holdout_cost), base.budget_bytes
    base_cost = base.cost if base_cost is None else base_cost
    meta = {"planner": "flexshard", "batch_size": workload.batch_size, "dedup": workload.dedup,
            "budget_bytes": budget, "memory_policy": {"bytes_per_gpu": memory.bytes_per_gpu,
                                                      "baseline": memory.baseline,
                                                      "factor": memory.factor,
                                                      "host_memory": memory.host_memory,
                                                      "reservation": memory.reservation,
                                                      "dense_bytes_per_gpu":
                                                          memory.dense_bytes_per_gpu,
                                                      "kind": memory.kind,
                                                      "budget": memory.describe()},
            "moves_applied": best.moves_applied, "moves_generated": moves_generated,
            "cold_ranges": "bandwidth-weighted" if best.weights is not None else "equal",
            "estimates": cost.to_json(), "baseline_estimates": base_cost.to_json(),
            "memory_room": _memory_room(cost, base_cost, budget),
            "target": target, "chosen_from": best.origin, "margin_bytes": best.margin_bytes,
            "sharding_kinds": dict(best.plan.sharding_kinds),
            "selection": ("in sample" if choice is None else
                          {"method": "held-out part of the profile", "priced": choice.priced,
                           "rule": choice.rule,
                           **({} if choice.halves is None else {"halves": dict(choice.halves)}),
                           "in_sample_estimates": best.cost.to_json(),
                           "holdout_iteration_time_s": dict(choice.costs)})}
    plan = Plan("rw" if is_row_wise else "flexshard", best.plan.topology,
                best.plan.tables.values(), meta)
    return PlanResult(plan, cost, base.plan, base_cost, budget, best.moves_applied,
                      moves_generated)


def _memory_room(cost: Cost, base: Cost, budget: float) -> dict[str, float]:
    """Where the room for replicas came from, at the plan's peak GPU (bytes)."""
    g = int(np.argmax(cost.peak_memory_per_gpu))
    gb = int(np.argmax(base.peak_memory_per_gpu))
    return {"baseline_peak": float(base.peak_memory_per_gpu[gb]),
            "plan_peak": float(cost.peak_memory_per_gpu[g]),
            "buffers_freed": float(base.buffer_bytes[gb] - cost.buffer_bytes[g]),
            "extra_rows": float(cost.row_bytes[g] - base.row_bytes[gb]),
            "headroom": float(budget - base.peak_memory_per_gpu[gb])}
