"""Tests of the drift scenarios (flexshard_stream.sources.drift)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from flexshard_stream import Batch, ConfigError
from flexshard_stream.sources import drift as D
from flexshard_stream.sources import synth as S

ITEMS = S.TableSpec("items", 100_000, 1.1)

#: One small instance of every scenario (fits tables of >= 400 rows).
SMALL = {
    "stationary": D.scenario("stationary"),
    "rotating": D.scenario("rotating", k=50, rate=0.2),
    "zipf_shift": D.scenario("zipf_shift", alpha1=1.5, span=3),
    "flash_crowd": D.scenario("flash_crowd", start=1, duration=1, share=0.3, size=40, fade=1),
    "daily_cycle": D.scenario("daily_cycle", period=4, sets=3, depth=0.8),
}


def windows(spec, num_windows, samples, table=ITEMS, seed=0):
    """The IDs of ``table`` per window (one batch per window)."""
    return [w[0].feature_values(table.name)
            for w in D.generate_windows([table], spec, num_windows, samples, samples, seed)]


def top(ids, k):
    """The k most frequent IDs (ties by ID)."""
    u, c = np.unique(ids, return_counts=True)
    return u[np.lexsort((u, -c))[:k]]


def overlap(a, b):
    return len(np.intersect1d(a, b)) / len(a)


def flat(window, key):
    return np.concatenate([b.feature_values(key) for b in window])


def test_scenarios_tuple():
    assert D.SCENARIOS == tuple(SMALL)
    for name in D.SCENARIOS:
        if name != "zipf_shift":
            assert D.scenario(name).name == name  # defaults exist for all but alpha1


# ------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("name", D.SCENARIOS)
def test_determinism_and_invariances(name):
    spec = SMALL[name]
    a = S.TableSpec("a", 2000, 1.0)
    b = S.TableSpec("b", 5000, 0.9, kind="sequence", length="poisson", mean_length=3.0)

    def run(tables, seed=7, num_windows=3, samples_per_batch=1000):
        return list(D.generate_windows(tables, spec, num_windows, 3000, samples_per_batch, seed))

    ref = run([a, b])
    again = run([a, b])
    assert len(ref) == 3 and all(len(w) == 3 for w in ref)
    for w1, w2 in zip(ref, again):
        for x, y in zip(w1, w2):
            assert x.keys == y.keys == ("a", "b")
            assert np.array_equal(x.values, y.values)
            assert np.array_equal(x.lengths, y.lengths)
            assert np.array_equal(x.timestamp, y.timestamp)
    other = run([a, b], seed=8)
    for w1, w2 in zip(ref, other):
        assert not np.array_equal(flat(w1, "a"), flat(w2, "a"))
        # the draws change with the seed, not only the rank -> ID permutation
        assert not np.array_equal(np.concatenate([x.feature_lengths("b") for x in w1]),
                                  np.concatenate([x.feature_lengths("b") for x in w2]))
    # ... and with the window
    assert not np.array_equal(ref[0][0].feature_lengths("b"), ref[1][0].feature_lengths("b"))
    # the window's content does not depend on the samples per batch, the window count or the
    # other tables
    for w1, w2 in zip(ref, run([a, b], samples_per_batch=777)):
        assert [x.batch_size for x in w2] == [777, 777, 777, 669]
        for key in ("a", "b"):
            assert np.array_equal(flat(w1, key), flat(w2, key))
    for w1, w2 in zip(ref, run([a, b], num_windows=2)):
        assert np.array_equal(flat(w1, "b"), flat(w2, "b"))
    for w1, w2 in zip(ref, run([a])):
        assert np.array_equal(flat(w1, "a"), flat(w2, "a"))


def test_old_batch_size_keyword_means_samples_per_batch():
    """``batch_size`` (deprecated for one release) still sets the samples per batch."""
    spec = SMALL["rotating"]
    new = list(D.generate_windows([ITEMS], spec, 2, 1000, samples_per_batch=300, seed=3))
    with pytest.warns(DeprecationWarning, match="'batch_size' is deprecated, use "
                                                "'samples_per_batch'"):
        old = list(D.generate_windows([ITEMS], spec, 2, 1000, batch_size=300, seed=3))
    for w_old, w_new in zip(old, new, strict=True):
        assert [b.batch_size for b in w_old] == [b.batch_size for b in w_new] == [300, 300, 300,
                                                                                 100]
        assert all(np.array_equal(a.values, b.values) for a, b in zip(w_old, w_new))


def test_generation_is_lazy_and_validates_eagerly():
    t0 = time.perf_counter()
    gen = D.generate_windows([ITEMS], SMALL["rotating"], 10 ** 9, 1000, 500, seed=1)
    assert len(next(gen)) == 2 and len(next(gen)) == 2
    assert time.perf_counter() - t0 < 2.0
    with pytest.raises(ConfigError, match="samples_per_window"):
        D.generate_windows([ITEMS], SMALL["rotating"], 10, 0, 500)  # raised before any next()


def test_stationary_uses_synth_permutation():
    ids, probs = D.true_top(ITEMS, D.scenario("stationary"), 5, 50, seed=3)
    assert np.array_equal(ids, ITEMS.permutation(3).forward(np.arange(50)))
    assert np.allclose(probs, S.zipf_pmf_head(50, ITEMS.num_rows, ITEMS.alpha))


# ------------------------------------------------------------------------------ oracles
@pytest.mark.parametrize("name", D.SCENARIOS)
def test_samples_match_true_probabilities(name):
    spec, table = SMALL[name], S.TableSpec("small", 400, 1.0)
    all_ids = np.arange(table.num_rows)
    for w, ids in enumerate(windows(spec, 4, 100_000, table, seed=3)):
        p = D.true_prob(table, spec, w, all_ids, seed=3)
        assert abs(p.sum() - 1.0) < 1e-9
        emp = np.bincount(ids, minlength=table.num_rows) / ids.size
        # sampling noise alone gives TV ~ 0.02 here; a wrong rank -> ID map gives > 0.2
        assert 0.5 * np.abs(emp - p).sum() < 0.035, w
        top_ids, top_p = D.true_top(table, spec, w, 30, seed=3)
        assert np.allclose(top_p, D.true_prob(table, spec, w, top_ids, seed=3))
        assert np.all(np.diff(top_p) <= 0) and len(set(top_ids.tolist())) == 30
        assert np.allclose(top_p, np.sort(p)[::-1][:30])


# ------------------------------------------------------------------------------ scenarios
def test_stationary_top_overlap_high():
    spec = D.scenario("stationary")
    tops = [top(x, 100) for x in windows(spec, 4, 200_000)]
    truth = D.true_top(ITEMS, spec, 0, 100)[0]
    for i in range(3):
        assert overlap(tops[i], tops[i + 1]) >= 0.9
        assert overlap(tops[i], truth) >= 0.9


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_rotation_replaces_hot_rows_with_cold_ones(rate):
    k = 100
    spec = D.scenario("rotating", k=k, rate=rate)
    wins = windows(spec, 5, 200_000)
    tops = [top(x, k) for x in wins]
    measured = [overlap(tops[i], tops[i + 1]) for i in range(4)]
    assert abs(np.mean(measured) - (1 - rate)) < 0.06, measured
    assert all(abs(m - (1 - rate)) < 0.1 for m in measured), measured
    m = round(rate * k)
    for i in range(4):
        before = D.true_top(ITEMS, spec, i, k)[0]
        after = D.true_top(ITEMS, spec, i + 1, k)[0]
        entrants = np.setdiff1d(after, before)
        assert entrants.size == m
        # the entrants were cold (the coldest rows: about 0.1 lookups each expected) in the window
        # before, and are hot now
        before_counts = np.bincount(np.searchsorted(entrants, wins[i][np.isin(wins[i], entrants)]),
                                    minlength=m)
        assert before_counts.max() <= 3, before_counts
        assert np.isin(wins[i + 1], entrants).sum() > 100 * max(1, before_counts.sum())
        assert np.isin(entrants, tops[i + 1]).mean() >= 0.8


@pytest.mark.parametrize("alpha0, alpha1", [(0.8, 1.3), (1.2, 0.7)])
def test_zipf_shift_moves_head_slope(alpha0, alpha1):
    spec = D.scenario("zipf_shift", alpha0=alpha0, alpha1=alpha1, span=4)
    slopes = []
    for ids in windows(spec, 6, 150_000):
        counts = np.sort(np.bincount(ids))[::-1][:30].astype(float)
        slopes.append(-np.polyfit(np.log(np.arange(1, 31)), np.log(counts), 1)[0])
    expected = [spec.alpha_at(ITEMS, w) for w in range(6)]
    assert expected[0] == alpha0 and expected[4] == expected[5] == alpha1
    assert np.allclose(slopes, expected, atol=0.06), (slopes, expected)
    steps = np.diff(slopes[:5]) * np.sign(alpha1 - alpha0)
    assert np.all(steps > 0), slopes  # moves in the right direction every window


def test_flash_crowd_new_ids_and_share():
    share, start, duration, fade = 0.25, 3, 2, 2
    spec = D.scenario("flash_crowd", start=start, duration=duration, share=share, size=500,
                      fade=fade, crowd_alpha=0.9)
    crowd = D.crowd_ids(ITEMS, spec)
    assert crowd.size == 500 and np.unique(crowd).size == 500
    assert crowd.min() >= 0 and crowd.max() < ITEMS.num_rows
    n = 50_000
    wins = windows(spec, 9, n)
    measured = [np.isin(x, crowd).mean() for x in wins]
    expected = [spec.crowd_share(w) for w in range(9)]
    assert np.allclose(expected, [0, 0, 0, share, share, share * 2 / 3, share / 3, 0, 0])
    for w in range(9):
        if expected[w] == 0:
            assert measured[w] == 0.0, w  # never seen before the crowd (nor after it)
        else:
            assert abs(measured[w] - expected[w]) < 0.012, (w, measured[w])
    # the crowd's IDs are brand-new: none of them was drawn in any window before the start
    seen = np.unique(np.concatenate(wins[:start]))
    new_at_start = np.setdiff1d(np.unique(wins[start]), seen)
    assert np.isin(np.intersect1d(wins[start], crowd), new_at_start).all()
    # the oracle agrees: the crowd's hottest IDs lead the true top rows during the crowd
    ids = D.true_top(ITEMS, spec, start, 20)[0]
    assert np.isin(crowd[:3], ids).all()
    assert not np.isin(crowd, D.true_top(ITEMS, spec, 0, 1000)[0]).any()


def test_daily_cycle_is_periodic():
    period = 4
    spec = D.scenario("daily_cycle", period=period, sets=2)
    wins = windows(spec, 7, 50_000)
    tops = [top(x, 100) for x in wins]
    for w in range(3):
        assert overlap(tops[w], tops[w + period]) >= 0.85, w
    for w in (0, 2, 4):  # cos = +-1: one hot set each, opposite at half a period
        assert overlap(tops[w], tops[w + period // 2]) <= 0.15, w
    # the weight of hot set 0 follows (1 + cos(2 pi w / P)) / 2
    set0 = D.true_top(ITEMS, spec, 0, 2000)[0]  # window 0: set 1 has weight 0
    mass0 = D.true_prob(ITEMS, spec, 0, set0).sum()
    for w, ids in enumerate(wins):
        weight = (1 + np.cos(2 * np.pi * w / period)) / 2
        assert np.isclose(spec.cycle_weights(w)[0], weight)
        assert abs(np.isin(ids, set0).mean() - weight * mass0) < 0.02, w


def test_daily_cycle_three_sets_are_distinct():
    spec = D.scenario("daily_cycle", period=6, sets=3)  # set h peaks at window 2 h (mod 6)
    tops = [D.true_top(ITEMS, spec, w, 100)[0] for w in (0, 2, 4, 6)]
    assert np.array_equal(tops[0], tops[3])
    for i in range(3):
        for j in range(i):
            assert overlap(tops[i], tops[j]) < 0.7  # 0.54: the off-peak sets still weigh 1/6


def test_ids_in_range_and_batch_layout():
    tables = [S.TableSpec("tiny", 64, 1.2),
              S.TableSpec("seq", 3000, 0.9, kind="sequence", length="lognormal", mean_length=6,
                          max_length=40),
              S.TableSpec("bag", 1000, 0.0, length="poisson", mean_length=2.0)]
    specs = {**SMALL, "rotating": D.scenario("rotating", k=10, rate=0.3),
             "flash_crowd": D.scenario("flash_crowd", start=1, share=0.5, size=8)}
    for name, spec in specs.items():
        sample = 0
        for w, window in enumerate(D.generate_windows(tables, spec, 6, 700, 256, seed=2,
                                                      start_ts=100.0, samples_per_second=50.0)):
            assert [b.batch_size for b in window] == [256, 256, 188]
            for b in window:
                assert isinstance(b, Batch) and b.keys == ("tiny", "seq", "bag")
                assert b.values.dtype == np.int64
                for t in tables:
                    v = b.feature_values(t.name)
                    assert v.size == 0 or (v.min() >= 0 and v.max() < t.num_rows), (name, t.name)
                assert b.feature_lengths("seq").max() <= 40
                assert np.allclose(b.timestamp,
                                   100.0 + np.arange(sample, sample + b.batch_size) / 50.0)
                sample += b.batch_size


def test_generation_speed():
    table = S.TableSpec("big", 10_000_000, 1.05)
    gen = D.generate_windows([table], D.scenario("rotating", k=10_000, rate=0.2), 2, 1_000_000,
                             65536, seed=0)
    next(gen)  # warm-up
    t0 = time.perf_counter()
    window = next(gen)
    elapsed = time.perf_counter() - t0
    assert sum(b.num_values for b in window) == 1_000_000
    assert elapsed < 3.0  # about 0.3 s on the 2-core machine; a per-ID Python loop takes minutes


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("name, params, needle", [
    ("steady", {}, "unknown drift scenario"),
    ("stationary", {"rate": 0.1}, "'rate'"),
    ("rotating", {"rate": 1.5}, "'rate'"),
    ("rotating", {"rate": -0.1}, "'rate'"),
    ("rotating", {"rate": float("nan")}, "'rate'"),
    ("rotating", {"rate": "fast"}, "'rate'"),
    ("rotating", {"k": 0}, "'k'"),
    ("rotating", {"k": 2.5}, "'k'"),
    ("rotating", {"k": True}, "'k'"),
    ("rotating", {"hot": 10}, "'hot'"),
    ("zipf_shift", {}, "'alpha1'"),
    ("zipf_shift", {"alpha1": -1}, "'alpha1'"),
    ("zipf_shift", {"alpha1": 1.0, "alpha0": float("inf")}, "'alpha0'"),
    ("zipf_shift", {"alpha1": 1.0, "span": 0}, "'span'"),
    ("flash_crowd", {"share": 0.0}, "'share'"),
    ("flash_crowd", {"share": 1.01}, "'share'"),
    ("flash_crowd", {"start": -1}, "'start'"),
    ("flash_crowd", {"duration": 0}, "'duration'"),
    ("flash_crowd", {"size": 0}, "'size'"),
    ("flash_crowd", {"fade": -2}, "'fade'"),
    ("flash_crowd", {"crowd_alpha": -0.5}, "'crowd_alpha'"),
    ("daily_cycle", {"period": 1}, "'period'"),
    ("daily_cycle", {"sets": 1}, "'sets'"),
    ("daily_cycle", {"depth": 1.5}, "'depth'"),
])
def test_bad_parameters_raise_config_error(name, params, needle):
    with pytest.raises(ConfigError, match=needle):
        D.scenario(name, **params)


def test_table_dependent_and_call_errors():
    small = S.TableSpec("small", 100, 1.0)
    with pytest.raises(ConfigError, match="'small'.*'k'"):
        D.generate_windows([small], D.scenario("rotating", k=90, rate=0.2), 2, 10, 10)
    with pytest.raises(ConfigError, match="'small'.*'size'"):
        D.generate_windows([small], D.scenario("flash_crowd", size=100), 2, 10, 10)
    with pytest.raises(ConfigError, match="'size'"):
        D.true_top(small, D.scenario("flash_crowd", size=100), 0, 5)
    ok = D.scenario("stationary")
    for kwargs, needle in [({"num_windows": -1}, "num_windows"),
                           ({"samples_per_batch": 0}, "samples_per_batch"),
                           ({"seed": -1}, "seed"), ({"samples_per_second": 0}, "samples_per_second")]:
        args = {"num_windows": 2, "samples_per_window": 10, "samples_per_batch": 10, **kwargs}
        with pytest.raises(ConfigError, match=needle):
            D.generate_windows([small], ok, **args)
    with pytest.raises(ConfigError, match="DriftSpec"):
        D.generate_windows([small], "rotating", 2, 10, 10)
    with pytest.raises(ConfigError, match="duplicate"):
        D.generate_windows([small, small], ok, 2, 10, 10)
    with pytest.raises(ConfigError, match="window"):
        D.true_top(small, ok, -1, 5)
    with pytest.raises(ConfigError, match="k"):
        D.true_top(small, ok, 0, 101)
    with pytest.raises(ConfigError, match="ids"):
        D.true_prob(small, ok, 0, [100])
    with pytest.raises(ConfigError, match="flash_crowd"):
        D.crowd_ids(small, ok)


# ----------------------------------------------------------------------- the drift bench (issue 14)


def _bench():
    """bench/drift.py as a module (it is a script, not part of the package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "drift.py"
    spec = importlib.util.spec_from_file_location("bench_drift", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_bench_charges_every_strategy_transfer_and_pauses():
    from argparse import Namespace

    from flexshard_stream.placement.cost import CostModel
    from flexshard_stream.plans.tables import EmbeddingTable
    from flexshard_stream.plans.topology import Topology

    bench = _bench()
    spec = S.TableSpec("items", 20_000, 1.1, "pooled", "fixed", 4)
    topo, B = Topology.uniform(2, 2), 8
    scen = D.scenario("rotating", k=100, rate=0.5)
    wins = list(D.generate_windows([spec], scen, 4, topo.num_gpus * B * 8, topo.num_gpus * B,
                                   seed=1))
    tables = [EmbeddingTable("items", 20_000, 16, "fp32", "pooled", optimizer_state_bytes=4)]
    sc = bench.Scenario("tiny", tables, wins, topo, B)
    args = Namespace(quick=True, iterations_per_window=5_000.0, top_k=512, checks_per_window=2,
                     stats="windowed", window_checks=None, dedup=False)
    pauses = [0.0, 0.5]
    res = bench.run_scenario(sc, CostModel(dedup=False), args, pauses)
    refs = res["references"]
    for p in pauses:
        for name in ("static", "online", "oracle", "resharder"):
            t = refs[name][str(p)] if name != "resharder" else res["resharder"][str(p)]
            assert t["total_s"] == pytest.approx(t["comm_s"] + t["transfer_s"] + t["pause_s"])
            assert t["pause_s"] == pytest.approx(p * t["deltas"])
        assert refs["static"][str(p)]["deltas"] == 0
        # re-planning every window one window late moves what the oracle moved, a window later
        assert refs["online"][str(p)]["deltas"] == refs["oracle"][str(p)]["deltas"] - 1
        k = res["keys"][str(p)]
        best = min(refs["static"][str(p)]["total_s"], refs["online"][str(p)]["total_s"])
        assert k["total_vs_best_online_reference"] == pytest.approx(
            res["resharder"][str(p)]["total_s"] / best)
    assert refs["oracle"]["0.5"]["deltas"] >= 2      # the hot set moves: the references move
    agg = bench.aggregate({"tiny": res}, 0.5)
    assert agg["total_vs_best_online_reference"] == res["keys"]["0.5"][
        "total_vs_best_online_reference"]
    assert bench.targets(agg)["deltas_per_window_max"]["met"] == (agg["deltas_per_window_max"]
                                                                  <= 1)
