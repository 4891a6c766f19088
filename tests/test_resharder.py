"""The incremental re-sharder: convergence, tracking under drift, safety, budgets, and the
decision on total cost (communication + migration transfer + pauses)."""

import dataclasses
import math

import numpy as np
import pytest

from flexshard_stream.errors import ConfigError, FormatError
from flexshard_stream.online.resharder import (
    DriftMeter,
    ReshardConfig,
    Resharder,
    default_stats,
    plan_share,
)
from flexshard_stream.placement.baselines import build_baseline
from flexshard_stream.placement.cost import CostModel, evaluate_analytic
from flexshard_stream.placement.planner import MemoryPolicy
from flexshard_stream.plans.delta import (
    DEFAULT_PAUSE_S,
    MigrationCost,
    PlanDelta,
    migration_cost,
    plan_fingerprint,
)
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources import drift
from flexshard_stream.sources.synth import TableSpec
from flexshard_stream.stats.summary import FrequencySummary
from flexshard_stream.stats.window import DecayedStats, WindowedStats
from flexshard_stream.testing import check_plan

H = 50_000
SPECS = [TableSpec("hist", H, 1.1, "sequence", "fixed", 20)]
TABLES = [EmbeddingTable("hist", H, 32, "fp32", "sequence", optimizer_state_bytes=4)]
TOPO = Topology.uniform(2, 4)
B = 16
MODEL = CostModel(dedup=False)
SPW = TOPO.num_gpus * B * 8          # samples per window: 8 iterations
# a check stands for this many training iterations (the statistics see a sample of them): the
# savings of this small model, microseconds per iteration, then weigh against the default pause
ITERATIONS = 10_000


def _config(**kw):
    return ReshardConfig(**{"check_every": 4, "top_k": 2048, "iterations_per_check": ITERATIONS,
                            **kw})


def _resharder(**kw):
    cfg = kw.pop("config", _config())
    stats = DecayedStats({"hist": H}, half_life=16, unit="batches")
    return Resharder(TABLES, TOPO, B, stats=stats, model=MODEL, config=cfg, **kw)


def _feed(rs, scen, windows, seed=3, changes=None):
    """Feed ``windows`` windows of ``scen``; every decision that moved the plan is appended to
    ``changes`` as ``(decision, plan after it)``."""
    for batches in drift.generate_windows(SPECS, scen, windows, SPW, TOPO.num_gpus * B // 2,
                                          seed=seed):
        for b in batches:
            d = rs.update(b)
            if changes is not None and d is not None and d.delta is not None:
                changes.append((d, rs.plan))


def test_stationary_converges_then_stays_still():
    seen = []
    rs = _resharder()
    _feed(rs, drift.scenario("stationary"), 8, changes=seen)
    checks = rs.history
    assert len(checks) >= 12
    assert any(d.delta is not None for d in checks[:4]), "the first checks move off row-wise"
    late = [d for d in checks[len(checks) // 2:] if d.delta is not None]
    assert late == [], [(d.check, d.reason) for d in late]
    # every decision exposes the threshold per table
    assert all("hist" in d.thresholds for d in checks)
    assert checks[-1].thresholds["hist"]["node_rows"] + checks[-1].thresholds["hist"][
        "global_rows"] > 0


def test_every_intermediate_plan_is_valid_and_fits():
    plans = []
    rs = _resharder(config=_config(pause_s=0.0))   # no pause: more plans to look at
    _feed(rs, drift.scenario("rotating", k=300, rate=0.3), 5, changes=plans)
    assert len(plans) >= 3
    view = rs.stats.view().summary(2048)
    for d, p in plans:
        check_plan(p)  # routing, structure, file round trip; raises on any violation
        assert d.peak_memory_bytes <= d.budget_bytes * (1 + 1e-9)
        assert d.applied_s <= d.current_s or "exceeds the memory budget" in d.reason
        assert d.migration_bytes >= 0
    # the plan in force fits the memory-neutral budget on the statistics it was made from
    c = evaluate_analytic(rs.plan, view, B, MODEL, want_matrices=False)
    rw = evaluate_analytic(Resharder(TABLES, TOPO, B).plan, view, B, MODEL, want_matrices=False)
    assert c.peak_memory_bytes <= rw.peak_memory_bytes * 1.05


def test_follows_a_rotating_hot_set_within_a_few_checks():
    scen = drift.scenario("rotating", k=200, rate=0.5)
    rs = _resharder(config=_config(pause_s=0.0))   # within a window: moves that pay no pause
    windows = list(drift.generate_windows(SPECS, scen, 5, SPW, TOPO.num_gpus * B // 2, seed=5))
    for w, batches in enumerate(windows):
        for b in batches:
            rs.update(b)
        ids, _ = drift.true_top(SPECS[0], scen, w, 20, seed=5)
        tp = rs.plan["hist"]
        rep = np.concatenate([tp.global_ids, tp.node_ids, tp.placed_ids])
        covered = np.isin(ids, rep).mean()
        if w >= 1:   # within the window's checks (4 per window) the new hot rows are replicated
            assert covered >= 0.8, (w, covered)


def test_failed_replan_keeps_the_plan_and_says_why():
    rs = _resharder(memory=MemoryPolicy(bytes_per_gpu=1.0))  # impossible budget
    start = rs.plan
    _feed(rs, drift.scenario("stationary"), 1)
    assert rs.history and all(d.action == "failed" for d in rs.history)
    assert "impossible" in rs.history[-1].reason
    assert rs.plan is start
    # bad statistics (a table without a summary): kept, with the reason
    rs2 = _resharder()
    _feed(rs2, drift.scenario("stationary"), 2)
    before = rs2.plan
    d = rs2.check(summaries={"other": rs2.stats.view().summary(16)["hist"]})
    assert d.action == "failed" and "no frequency summary" in d.reason
    assert rs2.plan is before


def test_migration_budget_is_respected_and_partial_steps_apply_exactly():
    budget = 20_000.0
    out = []
    cfg = _config(migration_budget_bytes=budget)
    rs = _resharder(config=cfg)
    start = rs.plan
    _feed(rs, drift.scenario("stationary"), 3, changes=out)
    assert out, "some step fits 20 kB"
    prev = start
    for d, p in out:
        assert d.migration_bytes <= budget
        assert d.delta.apply(prev) == p
        prev = p
    assert any(d.action == "partial" for d, _ in out)
    # the chain of deltas composes to the move from start to the end
    assert PlanDelta.between(start, rs.plan).apply(start) == rs.plan


def test_no_statistics_is_skipped():
    rs = _resharder()
    d = rs.check()
    assert d.action == "skipped" and rs.plan is not None


@pytest.mark.parametrize("kw", [{"check_every": 0}, {"hysteresis": -1}, {"min_gain": 1.5},
                                {"capture": 0}, {"migration_budget_bytes": -5}, {"top_k": 0},
                                {"unit": "hours"}, {"pause_s": -1}, {"pause_s": float("nan")},
                                {"horizon_iterations": 0}, {"iterations_per_check": -3},
                                {"max_horizon_checks": 0}])
def test_bad_config(kw):
    with pytest.raises(ConfigError):
        ReshardConfig(**kw)


def test_initial_plan_must_match_tables():
    other = [EmbeddingTable("x", 10, 4)]
    from flexshard_stream.placement.baselines import build_baseline
    with pytest.raises(ConfigError, match="tables"):
        Resharder(TABLES, TOPO, B, plan=build_baseline("rw", other, TOPO))


# ----------------------------------------------------------------------- the state protocol


def test_state_round_trip_makes_the_same_next_decisions():
    scen = drift.scenario("rotating", k=200, rate=0.5)
    windows = list(drift.generate_windows(SPECS, scen, 3, SPW, TOPO.num_gpus * B // 2, seed=7))
    rs = _resharder()
    for b in windows[0] + windows[1]:
        rs.update(b)
    assert rs.history and rs.budget_bytes is not None
    twin = _resharder()
    assert twin.stats.restore(rs.stats.state()) == []
    assert twin.restore(rs.state()) == []
    assert twin.state() == rs.state()           # plans, previous target, budget, schedule
    assert twin.history == [] and twin.checks == rs.checks > 0
    made = []
    for b in windows[2]:
        d, d2 = rs.update(b), twin.update(b)
        assert (d is None) == (d2 is None)
        if d is not None:
            made.append(d.check)
            assert d2.to_json() == d.to_json()
            assert twin.plan == rs.plan
    assert made and made[0] == len(rs.history) - len(made)   # numbered on, not from 0


def test_restore_refuses_a_foreign_state_and_changes_nothing():
    rs = _resharder()
    _feed(rs, drift.scenario("stationary"), 1)
    good = rs.state()
    from flexshard_stream.errors import FormatError
    from flexshard_stream.placement.baselines import build_baseline
    other = [EmbeddingTable("x", 10, 4)]
    fresh = _resharder()
    before = fresh.state()
    for bad, error, match in [
            ({**good, "version": 9}, FormatError, "version 9"),
            ({**good, "kind": "decayed"}, ConfigError, "cannot be restored"),
            ({**good, "plan": build_baseline("rw", other, TOPO)}, ConfigError, "other tables"),
            ({**good, "plan": build_baseline("rw", TABLES, Topology.uniform(1, 4))},
             ConfigError, "topology"),
            ({**good, "migrated_bytes": -1.0}, FormatError, "migrated"),
            ({**good, "checks": "3"}, FormatError, "'checks'")]:
        with pytest.raises(error, match=match):
            fresh.restore(bad)
        assert fresh.state() == before


def test_restore_keeps_an_explicit_memory_budget():
    rs = _resharder()
    _feed(rs, drift.scenario("stationary"), 1)
    fixed = _resharder(memory=MemoryPolicy(bytes_per_gpu=5e6))
    notes = fixed.restore(rs.state())
    assert fixed.budget_bytes == 5e6 and len(notes) == 1 and "budget_bytes" in notes[0]


# ----------------------------------------------------------------------- total cost (issue 14)


def _moved_plans():
    rs = _resharder(config=_config(pause_s=0.0))
    start = rs.plan
    _feed(rs, drift.scenario("stationary"), 1)
    assert rs.plan != start
    return start, rs.plan


def test_migration_cost_is_the_transfer_over_the_links_plus_one_pause():
    a, b = _moved_plans()
    d = PlanDelta.between(a, b)
    c = migration_cost(d, 0.5)
    assert c.bytes == d.migration_bytes > 0
    assert c.transfer_s == d.migration_time_s() > 0
    assert (c.pause_s, c.deltas) == (0.5, 1) and c.total_s == c.transfer_s + 0.5
    assert migration_cost(d).pause_s == DEFAULT_PAUSE_S
    # nothing applied, nothing paid: an empty delta costs no pause
    assert migration_cost(PlanDelta.between(a, a), 0.5) == MigrationCost() == migration_cost(None)
    back = migration_cost(d.invert(), 0.5)
    two = c + back
    assert (two.deltas, two.pause_s) == (2, 1.0)
    assert two.bytes == pytest.approx(c.bytes + back.bytes)
    assert two.to_json()["total_s"] == pytest.approx(c.total_s + back.total_s)
    for bad in (-1.0, float("inf"), "x", True):
        with pytest.raises(ConfigError, match="pause_s"):
            migration_cost(d, bad)


def test_the_ledger_is_communication_plus_transfer_plus_pauses():
    rs = _resharder(config=_config(pause_s=0.05))
    _feed(rs, drift.scenario("rotating", k=300, rate=0.3), 3)
    applied = [d for d in rs.history if d.delta is not None]
    assert applied
    c = rs.cost
    assert c.migration.deltas == len(applied)
    assert c.migration.pause_s == pytest.approx(0.05 * len(applied))
    assert all(d.pause_s == 0.05 and d.cost_s == d.migration_s + 0.05 for d in applied)
    assert c.migration.transfer_s == pytest.approx(sum(d.migration_s for d in applied))
    assert c.migration.bytes == pytest.approx(sum(d.migration_bytes for d in applied))
    assert rs.migrated_bytes == c.migration.bytes
    priced = [d for d in rs.history if math.isfinite(d.current_s)]
    # every check prices the iterations since the previous one with the plan then in force
    assert c.communication_s == pytest.approx(sum(d.current_s * d.iterations for d in priced))
    assert c.iterations == pytest.approx(ITERATIONS * len(priced))
    assert c.total_s == pytest.approx(c.communication_s + c.migration.transfer_s
                                      + c.migration.pause_s)
    assert all(d.pause_s == 0.0 for d in rs.history if d.delta is None)


def test_iterations_come_from_the_samples_fed_unless_told():
    rs = _resharder(config=ReshardConfig(check_every=4, top_k=2048))
    _feed(rs, drift.scenario("stationary"), 2)
    # 4 batches of G * B / 2 samples between checks: 2 iterations of G * B samples
    assert {d.iterations for d in rs.history} == {2.0}
    d = rs.check(iterations=7)
    assert d.iterations == 7.0
    with pytest.raises(ConfigError, match="iterations"):
        rs.check(iterations=-1)


def test_iterations_counted_by_the_caller_are_priced_like_the_samples_fed():
    """count_iterations (a sidecar feeding the statistics itself) prices what check(iterations=)
    prices, and defers to a configured iterations_per_check."""
    told, counted = (_resharder(config=ReshardConfig(check_every=10**9, top_k=2048))
                     for _ in range(2))
    for batches in drift.generate_windows(SPECS, drift.scenario("stationary"), 2, SPW,
                                          TOPO.num_gpus * B // 2, seed=3):
        for b in batches:
            told.update(b)
            counted.stats.update(b)     # fed without update(): nothing counted
    sums = told.stats.view().summary(2048)
    a = told.check(sums, position=1.0, iterations=5)
    counted.count_iterations(5)
    b = counted.check(sums, position=1.0)
    assert (a.iterations, a.current_s, a.action) == (b.iterations, b.current_s, b.action)
    assert counted.cost.to_json() == told.cost.to_json()
    assert counted.state()["samples"] == 0
    fixed = _resharder()     # iterations_per_check = ITERATIONS
    fixed.count_iterations(5)
    assert fixed.check(sums).iterations == ITERATIONS
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="iterations"):
            fixed.count_iterations(bad)


def test_forget_old_deltas_keeps_the_decisions_and_the_last_deltas():
    rs = _resharder(config=_config(pause_s=0.0))
    _feed(rs, drift.scenario("rotating", k=300, rate=0.3), 3)
    moved = [i for i, d in enumerate(rs.history) if d.delta is not None]
    assert len(moved) >= 2, moved
    before = [(d.check, d.action, d.reason, d.migration_bytes) for d in rs.history]
    keep = len(rs.history) - moved[-1]      # the last delta stays, the earlier ones go
    rs.forget_old_deltas(keep)
    assert [i for i, d in enumerate(rs.history) if d.delta is not None] == [moved[-1]]
    assert [(d.check, d.action, d.reason, d.migration_bytes) for d in rs.history] == before
    rs.forget_old_deltas(0)
    assert all(d.delta is None for d in rs.history)
    with pytest.raises(ConfigError, match="keep"):
        rs.forget_old_deltas(-1)


def test_a_change_not_worth_its_pause_waits_and_merges_with_the_next():
    scen = drift.scenario("rotating", k=300, rate=0.3)
    free, dear, never = (_resharder(config=_config(pause_s=p)) for p in (0.0, 0.25, 1e6))
    for rs in (free, dear, never):
        _feed(rs, scen, 4)
    moved = [sum(d.delta is not None for d in rs.history) for rs in (free, dear, never)]
    assert moved[0] > moved[1] > moved[2] == 0, moved
    waiting = [d for d in never.history if "waiting" in d.reason]
    assert waiting and all("pause" in d.reason for d in waiting)
    # between two applied deltas the plan stands still: the changes waited for are applied
    # together, by the next delta, from the same base
    prev = dear.history[0]
    plan_fp = None
    for d in dear.history:
        if d.delta is not None:
            if plan_fp is not None:
                assert d.delta.base_fingerprint == plan_fp
            plan_fp = d.delta.target_fingerprint
    assert plan_fp == plan_fingerprint(dear.plan) and prev is not None
    # and moving less paid: charged the same pause per delta, the one that waited spent less in
    # total (each ledger prices communication on its own statistics, the same stream)
    assert dear.cost.total_s < free.cost.total_s + 0.25 * free.cost.migration.deltas


def _share_summary(share, total=10_000):
    """A summary of table "hist" in which rows 0..9 take ``share`` of the lookups, rows 10..19
    the rest."""
    est = np.array([share * total / 10] * 10 + [(1 - share) * total / 10] * 10)
    return {"hist": FrequencySummary("hist", total, np.arange(20, dtype=np.int64), est, est, est,
                                     20.0, 20.0, 20.0, 0.0, 0.0, num_rows=H, exact=True)}


def test_horizon_and_hysteresis_follow_the_measured_drift_rate():
    rw = build_baseline("rw", TABLES, TOPO)
    plan = Plan("hot", TOPO, [dataclasses.replace(rw["hist"], global_ids=np.arange(10))])
    assert plan_share(plan, _share_summary(0.6)) == pytest.approx(0.6)
    m = DriftMeter()
    assert (m.rate, m.horizon_checks(64), m.hysteresis()) == (None, 64.0, 1.0)
    share = 0.6
    m.rebase(plan, _share_summary(share))
    for _ in range(6):        # the plan's rows lose a tenth of their lookups per check
        share *= 0.9
        m.observe(plan, _share_summary(share))
        m.rebase(plan, _share_summary(share))
    assert m.rate == pytest.approx(0.1) and m.noise == pytest.approx(0.0)
    assert m.horizon_checks(64) == pytest.approx(10.0) and m.hysteresis() == pytest.approx(0.0)
    m.observe(plan, _share_summary(share))     # a check without change
    assert m.rate == pytest.approx(0.05) and m.horizon_checks(64) == pytest.approx(20.0)
    assert m.hysteresis() == pytest.approx(0.5)  # deviation 0.05 against a rate of 0.05
    gaining = DriftMeter()
    gaining.rebase(plan, _share_summary(0.3))
    gaining.observe(plan, _share_summary(0.6))  # the rows gained lookups: nothing lost
    assert gaining.rate < 0 and gaining.horizon_checks(64) == 64.0
    doc = m.state()
    twin = DriftMeter()
    twin.restore(doc)
    assert twin.state() == doc
    with pytest.raises(FormatError, match="drift"):
        twin.restore({**doc, "noise": -1.0})

    # in the re-sharder: every decision is weighed with the meter's horizon and hysteresis
    rs = _resharder(config=_config(pause_s=0.05))
    _feed(rs, drift.scenario("rotating", k=300, rate=0.3), 3)
    measured = [d for d in rs.history if math.isfinite(d.current_s)]
    assert any(d.drift_rate is not None for d in measured)
    for d in measured:
        checks = (64.0 if d.drift_rate is None or d.drift_rate <= 1 / 64
                  else max(1.0, 1 / d.drift_rate))
        assert d.horizon_iterations == pytest.approx(ITERATIONS * checks)
        assert 0.0 <= d.hysteresis <= 1.0
    # unless the configuration fixes them
    fixed = _resharder(config=_config(horizon_iterations=500.0, hysteresis=0.25))
    _feed(fixed, drift.scenario("rotating", k=300, rate=0.3), 2)
    assert {(d.horizon_iterations, d.hysteresis) for d in fixed.history
            if math.isfinite(d.current_s)} == {(500.0, 0.25)}


def test_a_version_1_state_restores_with_a_fresh_ledger_and_meter():
    rs = _resharder(config=_config(pause_s=0.0))
    _feed(rs, drift.scenario("stationary"), 1)
    old = {k: v for k, v in rs.state().items() if k not in ("samples", "cost", "drift")}
    twin = _resharder()
    assert twin.restore({**old, "version": 1}) == []
    assert twin.plan == rs.plan and twin.checks == rs.checks
    assert twin.cost.migration.bytes == rs.migrated_bytes > 0
    assert twin.cost.communication_s == 0 and twin.drift.rate is None
    before = twin.state()
    for bad, match in [({**rs.state(), "cost": {"communication_s": -1}}, "cost"),
                       ({**rs.state(), "drift": {"rate": 0.1, "noise": "x", "saving": None}},
                        "drift")]:
        with pytest.raises(FormatError, match=match):
            twin.restore(bad)
        assert twin.state() == before


def test_one_default_for_the_statistics_of_the_resharder_and_the_sidecar(tmp_path):
    from flexshard_stream.online.sidecar import Sidecar
    cfg = _config()
    st = default_stats(TABLES, cfg)
    assert type(st) is WindowedStats and st.window == 8 * cfg.check_every and st.slots == 4
    rs = Resharder(TABLES, TOPO, B, config=cfg)
    assert type(rs.stats) is WindowedStats and (rs.stats.window, rs.stats.slots) == (
        st.window, st.slots)
    with Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "sc", config=cfg,
                 checkpoint_every_s=None) as sc:
        got = sc.stats_object
        assert type(got) is WindowedStats and (got.window, got.slots) == (st.window, st.slots)
        assert sc.cost["total_s"] == 0.0 and sc.cost["deltas"] == 0
