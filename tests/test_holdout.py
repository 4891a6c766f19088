"""Plans chosen for the next window: candidates fitted on one part of the profile, the one fastest
on a held-out later part chosen (placement/holdout.py, docs/PLANNER.md "Chosen for the next
window")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexshard_stream import testing as fst
from flexshard_stream.errors import ConfigError
from flexshard_stream.placement.baselines import baseline_plans
from flexshard_stream.placement.cost import CostModel, evaluate_analytic
from flexshard_stream.placement.holdout import HALVES_MARGIN, lead_on_both_halves
from flexshard_stream.placement.planner import MemoryPolicy, plan_flexshard
from flexshard_stream.placement.profiles import execution_profile
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.stream import StreamStats

#: What docs/PLANNER.md states: out of sample, when the held-out part and the next window come
#: from the same distribution, the chosen plan is within this share of the best baseline (the
#: sampling noise between two draws of one distribution).
OUT_OF_SAMPLE_MARGIN = 0.02


def _summaries(tables, sums, topo, B, iterations, seed):
    """Summaries counted from ``iterations`` sampled iterations of ``sums``' distributions."""
    return _stats(tables, sums, topo, B, iterations, seed).summary(k=4096)


def _stats(tables, sums, topo, B, iterations, seed):
    """StreamStats counted from ``iterations`` sampled iterations of ``sums``' distributions."""
    stats = StreamStats({t.feature: t.num_rows for t in tables})
    for b in fst.sample_batches(tables, sums, topo, B, iterations, seed=seed):
        stats.update(b)
    return stats


def _drifted(tables, alpha, seed_fit, seed_next, length):
    """Per table: the fitted part's distribution (hot rows of ``seed_fit``) and the next one's
    (the same skew over other rows: the hot set moved)."""
    fit = {t.name: fst.zipf_summary(t, alpha, total=10**6, top_k=t.num_rows, seed=seed_fit,
                                    mean_length=length) for t in tables}
    nxt = {t.name: fst.zipf_summary(t, alpha, total=10**6, top_k=t.num_rows, seed=seed_next,
                                    mean_length=length) for t in tables}
    return fit, nxt


def test_the_held_out_choice_is_the_fastest_there_and_is_recorded():
    """When the hot set moves between the fitted part and the held-out part, the replicas the
    fitted part asks for are useless later; selection on the held-out part does not take them."""
    topo = Topology.uniform(2, 2, hbm_bytes_per_gpu=8e9)
    t = EmbeddingTable("items", 4000, 64, kind="sequence")
    fit, nxt = _drifted([t], 1.2, 1, 2, 30.0)
    model = CostModel(dedup=False)
    in_sample = plan_flexshard([t], topo, fit, 64, model=model)
    held = plan_flexshard([t], topo, fit, 64, model=model, holdout=nxt)
    sel = held.plan.meta["selection"]
    assert sel["method"] == "held-out part of the profile" and sel["priced"] >= 2
    assert in_sample.plan.meta["selection"] == "in sample"
    # the reported cost is the held-out one, and it is the best of the candidates there
    again = evaluate_analytic(held.plan, nxt, 64, model)
    assert again.iteration_time_s == pytest.approx(held.cost.iteration_time_s, rel=1e-9)
    assert min(sel["holdout_iteration_time_s"].values()) == pytest.approx(
        again.iteration_time_s, rel=1e-9)
    on_next = evaluate_analytic(in_sample.plan, nxt, 64, model).iteration_time_s
    assert again.iteration_time_s <= on_next * (1 + 1e-9)
    # the best baseline is judged on the held-out part too
    assert held.best_baseline and held.best_baseline_cost is not None
    assert held.cost.iteration_time_s <= held.best_baseline_cost.iteration_time_s * (1 + 1e-9)


@given(alpha=st.floats(0.8, 1.5), rows=st.integers(500, 4000), dim=st.sampled_from([16, 64]),
       length=st.floats(2.0, 40.0), kind=st.sampled_from(["sequence", "pooled"]),
       dedup=st.booleans(), moved=st.booleans(), seed=st.integers(0, 10**6),
       halves=st.booleans())
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
def test_out_of_sample_never_slower_than_the_best_baseline_beyond_the_margin(
        alpha, rows, dim, length, kind, dedup, moved, seed, halves):
    """Drifting traces: the fitted part's hot set is (``moved``) or is not the held-out part's;
    the next window is a fresh sample of the held-out part's distribution. Judged on that next
    window, the chosen plan is never slower than the fastest baseline fitted on the same part
    that fits the budget, beyond :data:`OUT_OF_SAMPLE_MARGIN`: chosen on the whole held-out
    part, or (``halves``) by the lead on both of its halves, one iteration each."""
    topo = Topology.uniform(2, 2, hbm_bytes_per_gpu=8e9)
    t = EmbeddingTable("items", rows, dim, kind=kind)
    B, model = 32, CostModel(dedup=dedup)
    fit_dist, next_dist = _drifted([t], alpha, seed, seed + (1 if moved else 0), length)
    fit = _summaries([t], fit_dist, topo, B, 6, seed)
    parts = [_stats([t], next_dist, topo, B, 1, seed + 7 + i) for i in range(2)]
    held = parts[0].copy().merge(parts[1]).summary(k=4096)
    nxt = _summaries([t], next_dist, topo, B, 4, seed + 11)
    r = plan_flexshard([t], topo, fit, B, MemoryPolicy(), model, holdout=held,
                       holdout_halves=[p.summary(k=4096) for p in parts] if halves else None)
    assert r.plan.meta["selection"]["rule"] == ("lead on both halves" if halves
                                                else "fastest on the held-out part")
    mine = evaluate_analytic(r.plan, nxt, B, model).iteration_time_s
    runtime = execution_profile(r.plan.meta["target"])
    best = np.inf
    for name, p in baseline_plans([t], topo, fit, B).items():
        c = evaluate_analytic(p, nxt, B, model)
        if c.peak_memory_bytes <= r.budget_bytes and runtime.can_run(p):
            best = min(best, c.iteration_time_s)
    assert mine <= best * (1 + OUT_OF_SAMPLE_MARGIN), (mine, best, r.plan.meta["chosen_from"])


def _noisy_lead():
    """A held-out part whose first half still has the fitted part's hot set and whose second
    half (and the next window) has another: on the whole held-out part, replicas of the old hot
    set lead; on the second half they do not."""
    topo = Topology.uniform(2, 2, hbm_bytes_per_gpu=8e9)
    t = EmbeddingTable("items", 4000, 64, kind="sequence")
    old, new = _drifted([t], 1.2, 1, 2, 30.0)
    B = 32
    fit = _summaries([t], old, topo, B, 6, 3)
    parts = [_stats([t], old, topo, B, 2, 4), _stats([t], new, topo, B, 2, 5)]
    held = parts[0].copy().merge(parts[1]).summary(k=4096)
    nxt = _summaries([t], new, topo, B, 4, 6)
    return topo, t, B, fit, held, [p.summary(k=4096) for p in parts], nxt


def test_a_lead_on_one_half_only_does_not_displace_the_fastest_whole_plan():
    """The lead of a tier candidate on the whole held-out part comes from its first half alone:
    chosen on the whole part the tier candidate wins, and is slower on the next window than the
    fastest whole plan; chosen by the lead on both halves the whole plan stays, recorded."""
    from flexshard_stream.placement.baselines import BASELINES

    topo, t, B, fit, held, halves, nxt = _noisy_lead()
    model = CostModel(dedup=True)
    whole = plan_flexshard([t], topo, fit, B, MemoryPolicy(), model, holdout=held)
    robust = plan_flexshard([t], topo, fit, B, MemoryPolicy(), model, holdout=held,
                            holdout_halves=halves)
    assert whole.plan.meta["chosen_from"] not in BASELINES        # the noisy lead wins there
    sel = robust.plan.meta["selection"]
    assert sel["rule"] == "lead on both halves"
    assert robust.plan.meta["chosen_from"] == sel["halves"]["incumbent"] in BASELINES
    assert sel["halves"]["worse_half_ratio"] == 1.0
    assert sel["halves"]["samples"] >= topo.num_gpus * B
    on_next = {n: evaluate_analytic(r.plan, nxt, B, model).iteration_time_s
               for n, r in (("whole", whole), ("robust", robust))}
    assert on_next["robust"] < on_next["whole"]
    # what is reported is the chosen plan's cost on the whole held-out part
    assert robust.cost.iteration_time_s == pytest.approx(
        evaluate_analytic(robust.plan, held, B, model).iteration_time_s, rel=1e-9)


def test_a_lead_on_both_halves_displaces_and_halves_under_an_iteration_are_not_used():
    """No drift: a tier candidate faster on both halves is chosen, its worse half recorded;
    halves of fewer samples than one iteration (G x B) leave the choice to the whole held-out
    part, and say why."""
    topo = Topology.uniform(2, 2, hbm_bytes_per_gpu=8e9)
    t = EmbeddingTable("items", 4000, 64, kind="sequence")
    dist, _ = _drifted([t], 1.2, 1, 1, 30.0)
    B, model = 32, CostModel(dedup=False)
    fit = _summaries([t], dist, topo, B, 6, 3)
    parts = [_stats([t], dist, topo, B, 2, 4 + i) for i in range(2)]
    held = parts[0].copy().merge(parts[1]).summary(k=4096)
    halves = [p.summary(k=4096) for p in parts]
    r = plan_flexshard([t], topo, fit, B, MemoryPolicy(), model, holdout=held,
                       holdout_halves=halves)
    sel = r.plan.meta["selection"]
    assert sel["rule"] == "lead on both halves" and r.plan.strategy == "flexshard"
    assert r.plan.meta["chosen_from"] != sel["halves"]["incumbent"]
    assert 0 < sel["halves"]["worse_half_ratio"] < 1 - HALVES_MARGIN
    for h in halves:    # the chosen one is faster than the incumbent on each half
        assert evaluate_analytic(r.plan, h, B, model).iteration_time_s <= \
            sel["halves"]["worse_half_ratio"] * min(
                evaluate_analytic(p, h, B, model).iteration_time_s
                for n, p in baseline_plans([t], topo, fit, B).items()
                if n == sel["halves"]["incumbent"]) * (1 + 1e-9)
    # B large enough that a half (two iterations at B = 32) is under one iteration
    big = plan_flexshard([t], topo, fit, 4 * B, MemoryPolicy(), model, holdout=held,
                         holdout_halves=halves)
    sel = big.plan.meta["selection"]
    assert sel["rule"] == "fastest on the held-out part" and "under one iteration" in \
        sel["halves"]["why_not"]
    with pytest.raises(ConfigError, match="halves"):
        plan_flexshard([t], topo, fit, B, MemoryPolicy(), model, holdout=held,
                       holdout_halves=halves[:1])


def test_the_halves_rule_wants_a_lead_beyond_the_margin_on_the_worse_half():
    """lead_on_both_halves on stand-in candidates: the incumbent is the fastest whole plan on the
    whole held-out part; a lead on one half only, or under the margin on the worse half, keeps
    it; the lowest worse-half ratio beyond the margin displaces it."""
    from types import SimpleNamespace as NS

    def cand(name, whole, t, t1, t2):
        return (NS(state=None if whole else [(1, 0)], plan=name), NS(iteration_time_s=t)), \
            {name: t1}, {name: t2}

    rows = [cand("rw", True, 10.0, 10.0, 10.0), cand("inc", True, 8.0, 8.0, 8.0),
            cand("one_half", False, 7.0, 6.0, 8.1),         # faster on the first half only
            cand("small", False, 7.9, 7.9, 7.9),            # 1.25% on both: under the margin
            cand("both", False, 7.5, 7.6, 7.7),             # 3.75% on the worse half
            cand("best", False, 7.6, 7.2, 7.4)]             # 7.5% on the worse half
    halves = [NS(cost=lambda p, i=i: NS(iteration_time_s={k: v for r in rows
                                                          for k, v in r[1 + i].items()}[p]))
              for i in range(2)]
    priced = [r[0] for r in rows]
    assert lead_on_both_halves(priced, halves) == (5, 1, pytest.approx(7.4 / 8))
    assert lead_on_both_halves(priced[:4], halves) == (1, 1, 1.0)       # the incumbent stays
    assert lead_on_both_halves(priced[:4], halves, margin=0.0)[0] == 3  # without a margin
    assert lead_on_both_halves(priced, halves, margin=0.1) == (1, 1, 1.0)
    assert HALVES_MARGIN == OUT_OF_SAMPLE_MARGIN      # the noise the docs state, both places


def test_profile_split_in_log_order_with_the_crossing_batch_cut():
    from flexshard_stream.sources.profile import profile_batches
    from flexshard_stream.stats.batch import Batch
    from flexshard_stream.stats.config import TableConfig

    def batch(first, n, ts0):   # n samples of one ID each: sample i has ID first + i
        return Batch(["f"], np.arange(first, first + n, dtype=np.int64), np.ones(n, np.int64),
                     timestamp=np.arange(ts0, ts0 + n, dtype=np.float64))

    tabs = [TableConfig("f", 1000)]
    p = profile_batches([batch(0, 30, 0), batch(30, 30, 30), batch(60, 40, 60)], tabs, 100)
    assert (p.fit.samples, p.holdout.samples, p.samples) == (75, 25, 100)
    held = p.holdout.summary(k=100)["f"]
    assert held.top_ids.min() == 75 and held.top_ids.max() == 99      # the last quarter, exactly
    assert p.fit.summary(k=100)["f"].top_ids.max() == 74 and p.time_ordered
    assert p.whole.samples == 100 and p.fit.samples == 75       # whole leaves the parts alone
    first, second = (h.summary(k=100)["f"] for h in p.holdout_halves)   # 12 and 13 samples
    assert (first.top_ids.min(), first.top_ids.max()) == (75, 86)
    assert (second.top_ids.min(), second.top_ids.max()) == (87, 99)
    back = profile_batches([batch(50, 10, 50), batch(0, 10, 0)], tabs, 20)
    assert not back.time_ordered
    small = profile_batches([batch(0, 10, 0)], tabs, 10, min_holdout_samples=8)
    assert small.holdout is None and small.fit.samples == 10
    assert small.holdout_halves is None
    one = profile_batches([batch(0, 10, 0)], tabs, 10, holdout_share=0.1)
    assert one.holdout.samples == 1 and one.holdout_halves is None
    none = profile_batches([batch(0, 10, 0)], tabs, 10, holdout_share=0.0)
    assert none.holdout is None
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match="holdout_share"):
            profile_batches([], tabs, 10, holdout_share=bad)


def test_refit_keeps_the_chosen_recipe_and_takes_the_whole_profiles_hot_rows():
    """The held-out choice rebuilt on the whole profile (``refit=``): the same origin and tier
    sizes, replicas from the whole profile's hottest rows, not the fitted part's; without
    ``refit`` the plan is the fitted one, as before."""
    topo = Topology.uniform(2, 2, hbm_bytes_per_gpu=8e9)
    t = EmbeddingTable("items", 4000, 64, kind="sequence")
    fit, nxt = _drifted([t], 1.2, 1, 1, 30.0)           # no drift: replicas are worth keeping
    _, whole = _drifted([t], 1.2, 1, 2, 30.0)           # the whole profile: other hot rows
    model = CostModel(dedup=False)
    held = plan_flexshard([t], topo, fit, 64, model=model, holdout=nxt)
    again = plan_flexshard([t], topo, fit, 64, model=model, holdout=nxt, refit=whole)
    assert held.plan.meta["selection"]["refit"] is False
    chosen, refit = held.plan.tables["items"], again.plan.tables["items"]
    assert again.plan.meta["chosen_from"] == held.plan.meta["chosen_from"]
    assert again.plan.meta["selection"]["refit"] is True
    assert chosen.global_ids.size > 0
    assert refit.global_ids.size + refit.node_ids.size == chosen.global_ids.size + \
        chosen.node_ids.size
    hottest = np.argsort(-whole["items"].top_est, kind="stable")
    top = set(whole["items"].top_ids[hottest[:refit.global_ids.size]].tolist())
    assert set(refit.global_ids.tolist()) == top != set(chosen.global_ids.tolist())


def test_refit_without_a_held_out_part_changes_nothing():
    topo = Topology.uniform(2, 2, hbm_bytes_per_gpu=8e9)
    t = EmbeddingTable("items", 4000, 64, kind="sequence")
    fit, moved = _drifted([t], 1.2, 1, 2, 30.0)
    model = CostModel(dedup=False)
    a = plan_flexshard([t], topo, fit, 64, model=model)
    b = plan_flexshard([t], topo, fit, 64, model=model, refit=moved)
    assert a.plan == b.plan and "refit" not in str(b.plan.meta["selection"])
