"""The one Workload (issue 21): validated fields, one definition of the iterations profiled, built
once at the API edge and passed down, so that every entry point prices the same workload."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flexshard_stream.errors import ConfigError
from flexshard_stream.placement import planner as planner_mod
from flexshard_stream.placement.baselines import (
    baseline_plans,
    build_baseline,
    profiled_iterations,
)
from flexshard_stream.placement.cost import CostModel, evaluate_analytic, evaluate_trace
from flexshard_stream.placement.planner import plan_flexshard
from flexshard_stream.placement.workload import (
    Workload,
    iterations_from_samples,
    profiled_samples,
    workload_of,
)
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources.logs import LogReader
from flexshard_stream.stats.config import TableConfig
from flexshard_stream.stats.stream import StreamStats
from flexshard_stream.testing import sample_batches, zipf_summary

TOPO = Topology.uniform(2, 4)
TABLES = [EmbeddingTable("a", 5000, 16), EmbeddingTable("b", 3000, 8, kind="pooled")]


def _sums(samples: int = 1000):
    return {t.name: zipf_summary(t, 1.1, total=samples * L, top_k=200, mean_length=L)
            for t, L in zip(TABLES, (6.0, 2.0))}


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "64", None, math.nan, math.inf])
def test_batch_size_must_be_a_whole_positive_number(bad):
    with pytest.raises(ConfigError, match=r"Workload\.batch_size"):
        Workload(bad)


def test_whole_numbers_are_kept_as_int():
    w = Workload(np.int64(64), iterations_profiled=3.0)
    assert w.batch_size == 64 and type(w.batch_size) is int
    assert w.iterations_profiled == 3 and type(w.iterations_profiled) is int
    assert Workload(64.0).batch_size == 64


@pytest.mark.parametrize("bad", [0, -1, 2.5, False, "2"])
def test_iterations_profiled_must_be_none_or_a_whole_positive_number(bad):
    with pytest.raises(ConfigError, match=r"Workload\.iterations_profiled"):
        Workload(8, iterations_profiled=bad)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "x", None, True])
def test_mean_lengths_name_the_table(bad):
    with pytest.raises(ConfigError, match=r"Workload\.mean_lengths\['a'\]"):
        Workload(8, mean_lengths={"a": bad})


def test_mean_lengths_must_be_a_mapping_and_model_a_cost_model():
    with pytest.raises(ConfigError, match=r"Workload\.mean_lengths"):
        Workload(8, mean_lengths=[("a", 1.0)])
    with pytest.raises(ConfigError, match=r"Workload\.model"):
        Workload(8, model="torchrec")


def test_frozen_hashable_and_read_only():
    w = Workload(8, CostModel(dedup=False), {"a": 3})
    with pytest.raises(AttributeError):
        w.batch_size = 4
    with pytest.raises(TypeError):
        w.mean_lengths["a"] = 1.0
    assert w == Workload(8, CostModel(dedup=False), {"a": 3.0})
    assert hash(w) == hash(Workload(8, CostModel(dedup=False), {"a": 3.0}))
    assert w.dedup is False and w.profile == "torchrec"


def test_cost_model_keeps_its_old_path_and_checks():
    from flexshard_stream.placement import cost, workload
    assert cost.CostModel is workload.CostModel
    assert CostModel(dedup=False, profile="ideal").execution.label == "idealized"
    with pytest.raises(ConfigError, match="execution profile"):
        CostModel(profile="fast")


# ----------------------------------------------------------------------------- iterations
def test_iterations_from_samples_rounds_to_the_nearest_whole_iteration():
    assert iterations_from_samples(3000, 160) == 19         # 18.75: a floor would say 18
    assert iterations_from_samples(3000, 128) == 23         # 23.4
    assert iterations_from_samples(250, 100) == 2           # 2.5: half to even
    assert iterations_from_samples(350, 100) == 4           # 3.5: half to even
    assert iterations_from_samples(0, 100) == 1             # at least one
    assert iterations_from_samples(10, 100) == 1
    with pytest.raises(ConfigError, match="samples_per_iteration"):
        iterations_from_samples(10, 0)


def test_profiled_samples_is_the_most_any_table_saw():
    sums = _sums(1000)
    assert profiled_samples(sums) == 1000
    s = zipf_summary(TABLES[0], 1.1, total=6000, top_k=50, mean_length=6.0)
    no_count = {"a": dataclasses.replace(s, samples=0)}   # then lookups over mean length
    assert profiled_samples(no_count) == pytest.approx(1000)
    assert profiled_samples({}) == 0.0


def test_from_stats_binds_every_table_and_the_iterations():
    sums = _sums(1000)
    w = Workload.from_stats(TABLES, TOPO, sums, 16, mean_lengths={"b": 3.0})
    assert dict(w.mean_lengths) == {"a": 6.0, "b": 3.0}
    assert w.iterations_profiled == iterations_from_samples(1000, 8 * 16) == 8
    assert w.iterations_profiled == profiled_iterations(sums, TOPO, 16)
    assert w.lookups_per_iteration(sums) == {n: s.total / 8 for n, s in sums.items()}
    # for_stats keeps what is set, fills the rest from the new statistics
    again = w.for_stats(TABLES, TOPO, _sums(4000))
    assert again.iterations_profiled == 8 and dict(again.mean_lengths) == dict(w.mean_lengths)
    fresh = Workload(16, mean_lengths={"b": 3.0}).for_stats(TABLES, TOPO, _sums(4000))
    assert fresh.iterations_profiled == 31           # 4000 / 128 = 31.25
    with pytest.raises(ConfigError, match="profiled iterations"):
        Workload(16).lookups_per_iteration(sums)


def test_mean_length_zero_or_missing_is_priced_as_one():
    s = zipf_summary(TABLES[0], 1.1, total=100, top_k=10, mean_length=0.0)
    assert Workload(8).mean_length("a", s) == 1.0
    assert Workload(8, mean_lengths={"a": 0}).mean_length("a", _sums()["a"]) == 1.0
    assert Workload(8).mean_length("a", _sums()["a"]) == 6.0


def test_workload_of_one_or_the_other():
    w = Workload(8, CostModel(dedup=False), {"a": 2.0})
    assert workload_of(workload=w) is w
    assert workload_of(w) is w                              # in the place of batch_size
    assert workload_of(8, CostModel(dedup=False), {"a": 2.0}, w) is w   # agreeing: fine
    assert workload_of(8) == Workload(8, CostModel())
    with pytest.raises(ConfigError, match="batch_size"):
        workload_of(16, workload=w, where="plan_flexshard")
    with pytest.raises(ConfigError, match="model"):
        workload_of(model=CostModel(), workload=w)
    with pytest.raises(ConfigError, match="mean_lengths"):
        workload_of(mean_lengths={"a": 3.0}, workload=w)
    with pytest.raises(ConfigError, match="evaluate_analytic: give batch_size"):
        workload_of(where="evaluate_analytic")
    with pytest.raises(ConfigError, match="must be a Workload"):
        workload_of(workload=8)


# ----------------------------------------------------------------------------- entry points
@pytest.mark.parametrize("profile", ["torchrec", "ideal"])
def test_entry_points_price_the_same_workload_either_way(profile):
    sums = _sums(2000)
    model = CostModel(profile=profile, dedup=profile == "ideal")
    loose = plan_flexshard(TABLES, TOPO, sums, 16, model=model, mean_lengths={"a": 4.0})
    w = Workload.from_stats(TABLES, TOPO, sums, 16, model=model, mean_lengths={"a": 4.0})
    named = plan_flexshard(TABLES, TOPO, sums, workload=w)
    assert named.plan == loose.plan and named.cost.to_json() == loose.cost.to_json()
    a = evaluate_analytic(loose.plan, sums, 16, model, mean_lengths={"a": 4.0})
    b = evaluate_analytic(loose.plan, sums, workload=w)
    assert a.to_json() == b.to_json()
    for c in ("index", "forward", "backward", "sync"):
        assert np.array_equal(a.send[c], b.send[c]) and np.array_equal(a.recv[c], b.recv[c])
    batches = sample_batches(TABLES, sums, TOPO, 16, iterations=2, seed=1)
    ta = evaluate_trace(loose.plan, batches, 16, model)
    tb = evaluate_trace(loose.plan, batches, workload=Workload(16, model))
    assert ta.to_json() == tb.to_json()
    with pytest.raises(ConfigError, match="batch_size"):
        evaluate_analytic(loose.plan, sums, 8, workload=w)
    with pytest.raises(ConfigError, match="give batch_size"):
        plan_flexshard(TABLES, TOPO, sums)


def test_planner_hugectr_candidate_uses_the_workload_iterations(monkeypatch):
    """The planner's hugectr candidate and build_baseline(..., workload=Workload.from_stats(...)),
    the constructor the command line calls, threshold over the same iterations."""
    sums = _sums(3000)
    topo = Topology.uniform(2, 8)
    seen = {}
    real = planner_mod.baseline_plans

    def spy(*args, **kwargs):
        seen.update(real(*args, **kwargs))
        return seen

    monkeypatch.setattr(planner_mod, "baseline_plans", spy)
    plan_flexshard(TABLES, topo, sums, 10)
    w = Workload.from_stats(TABLES, topo, sums, 10)
    direct = build_baseline("hugectr", TABLES, topo, summaries=sums, workload=w)
    assert seen["hugectr"].meta["iterations"] == direct.meta["iterations"] == 19
    assert seen["hugectr"] == direct
    assert baseline_plans(TABLES, topo, sums, 10)["hugectr"] == direct


# ----------------------------------------------------------------------------- the command line
def test_cli_hugectr_plan_and_planner_candidate_count_the_same_iterations(tmp_path, monkeypatch):
    from flexshard_stream.cli import app

    rng = np.random.default_rng(0)
    n = 3000                                    # 3000 / (16 x 10) = 18.75 iterations
    seq = [list(rng.zipf(1.3, size=rng.integers(1, 20)) % 500) for _ in range(n)]
    log = tmp_path / "log.parquet"
    pl.DataFrame({"hist": pl.Series(seq, dtype=pl.List(pl.Int64)),
                  "user": rng.integers(0, 300, size=n)}).write_parquet(log)
    r = CliRunner().invoke(app, ["plan", "--log", str(log), "--topology", "2x8", "--strategy",
                                 "hugectr", "--out", str(tmp_path / "h"), "--batch-size", "10",
                                 "--json"])
    assert r.exit_code == 0, r.output
    cli_plan = Plan.load(tmp_path / "h")
    tabs = [tp.table for tp in cli_plan.tables.values()]
    st = StreamStats([TableConfig(t.name, t.num_rows, t.feature) for t in tabs])
    for b in LogReader([str(log)], features=[t.feature for t in tabs]):
        st.update(b)
    seen = {}
    real = planner_mod.baseline_plans

    def spy(*args, **kwargs):
        seen.update(real(*args, **kwargs))
        return seen

    monkeypatch.setattr(planner_mod, "baseline_plans", spy)
    plan_flexshard(tabs, cli_plan.topology, st.summary(k=1 << 20), 10)
    assert cli_plan.meta["iterations"] == seen["hugectr"].meta["iterations"] == 19
    for name, tp in seen["hugectr"].tables.items():
        assert np.array_equal(cli_plan.tables[name].global_ids, tp.global_ids), name
