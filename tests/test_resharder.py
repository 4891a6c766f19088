"""The incremental re-sharder: convergence, tracking under drift, safety, budgets."""

import numpy as np
import pytest

from flexshard_stream.sources import drift
from flexshard_stream.errors import ConfigError
from flexshard_stream.online.resharder import ReshardConfig, Resharder
from flexshard_stream.placement.cost import CostModel, evaluate_analytic
from flexshard_stream.placement.delta import PlanDelta
from flexshard_stream.placement.planner import MemoryPolicy
from flexshard_stream.placement.tables import EmbeddingTable
from flexshard_stream.placement.topology import Topology
from flexshard_stream.sources.synth import TableSpec
from flexshard_stream.stats.window import DecayedStats
from flexshard_stream.testing import check_plan

H = 50_000
SPECS = [TableSpec("hist", H, 1.1, "sequence", "fixed", 20)]
TABLES = [EmbeddingTable("hist", H, 32, "fp32", "sequence", optimizer_state_bytes=4)]
TOPO = Topology.uniform(2, 4)
B = 16
MODEL = CostModel(dedup=False)
SPW = TOPO.num_gpus * B * 8          # samples per window: 8 iterations


def _resharder(**kw):
    cfg = kw.pop("config", ReshardConfig(check_every=4, horizon_iterations=1000, top_k=2048))
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
    rs = _resharder()
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
    rs = _resharder()
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
    cfg = ReshardConfig(check_every=4, horizon_iterations=1000, top_k=2048,
                        migration_budget_bytes=budget)
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
                                {"unit": "hours"}])
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
