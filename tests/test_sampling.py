"""Sampled ingestion whose rate changes mid-stream (``resample``), and the controller that picks the
rate from a CPU budget (the sidecar's; docs/SIDECAR.md, docs/STATISTICS.md).

The controller is driven by a simulated ingest thread (cost per ID ``a + b / k``, one core, a
bounded queue): no timing, no threads."""
import itertools
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import zipf_stream

from flexshard_stream.errors import ConfigError, FormatError, IncompatibleError
from flexshard_stream.formats.container import pack, unpack
from flexshard_stream.online.sidecar.rate import Interval, RateController
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.config import SketchConfig
from flexshard_stream.stats.stream import StreamStats
from flexshard_stream.stats.table_stats import TableStats, sampled_count_bounds
from flexshard_stream.stats.window import DecayedStats, WindowedStats

ROWS = 1 << 40   # far beyond any exact-count limit: every table is sketched


def zipf_ids(n, seed=0):
    return zipf_stream(n, 1_000_000, 1.1, seed)


def true_top(ids, k):
    u, c = np.unique(ids, return_counts=True)
    order = np.lexsort((u, -c))[:k]
    return u[order], c[order].astype(np.float64)


def assert_same_statistics(a: bytes, b: bytes, kind="StreamStats"):
    """Two containers hold the same statistics: headers and arrays equal, except the length
    sketches (DataSketches' KLL compacts at random), of which the sizes (kept samples) are
    compared."""
    import datasketches as ds
    (ma, xa), (mb, xb) = unpack(a, kind), unpack(b, kind)
    assert ma == mb and xa.keys() == xb.keys()
    for name in xa:
        if name.endswith("lengths"):
            ka, kb = (ds.kll_ints_sketch.deserialize(x[name].tobytes()) for x in (xa, xb))
            assert ka.n == kb.n, name             # (short lengths: in length_hist, compared)
            if ka.n:
                assert (ka.get_min_value(), ka.get_max_value()) == \
                    (kb.get_min_value(), kb.get_max_value()), name
        else:
            np.testing.assert_array_equal(xa[name], xb[name], err_msg=name)


def fed(rates, ids, lengths_per_sample=1):
    """A TableStats fed ``ids`` in equal parts, resampled to each rate of ``rates`` in turn."""
    t = TableStats("t", ROWS, SketchConfig(sample_k=rates[0]))
    for k, part in zip(rates, np.array_split(ids, len(rates))):
        t.resample(k)
        t.update(part, np.full(part.size // lengths_per_sample, lengths_per_sample, np.int64))
    return t


# ----------------------------------------------------------------------------- resample


@pytest.mark.parametrize("rates", [[1, 8], [8, 1], [4, 16, 2], [2, 2, 32]])
def test_a_change_of_rate_keeps_estimates_unbiased_and_bounds_true(rates):
    ids = zipf_ids(1_200_000)
    rows, truth = true_top(ids, 300)
    t = fed(rates, ids)
    est, lo, hi = t.bounds(rows)
    assert np.mean((lo <= truth) & (truth <= hi)) >= 0.97      # z = 3 per row
    assert abs(np.mean(est / truth) - 1) < 0.05                 # no bias over the head
    assert t.config.sample_k == rates[-1]
    assert t.sample_variance == max(r - 1 for r in rates)      # the widest rate still counted


def test_resample_keeps_every_estimate_up_to_rounding():
    ids = zipf_ids(300_000)
    for k_from, k_to in [(2, 8), (8, 2), (4, 1), (1, 16)]:
        t = TableStats("t", ROWS, SketchConfig(sample_k=k_from)).update(ids)
        rows = t.top(200)[0]
        before = t.bounds(rows)[0]
        after = t.resample(k_to).bounds(rows)[0]
        # count-min counters are rounded up to whole counts at the new rate, the threshold gains
        # one: an estimate moves by at most two counts at the new rate
        assert np.all(np.abs(after - before) <= 2 * k_to), (k_from, k_to)
        assert t.config.sample_k == k_to


def test_a_lower_rate_after_a_higher_one_keeps_the_wider_bounds_until_decayed():
    ids = zipf_ids(200_000)
    t = TableStats("t", ROWS, SketchConfig(sample_k=8)).update(ids)
    t.resample(1)
    assert t.config.sample_k == 1 and t.sample_variance == 7
    rows = t.top(50)[0]
    _, lo, hi = t.bounds(rows)
    assert np.all(hi - lo > 0)                 # not the unsampled bounds of a count
    for _ in range(40):                        # the old counts decay away: V falls to k - 1 = 0
        t.scale(0.8)
    assert t.sample_variance == 0
    est, lo, hi = t.bounds(rows)
    assert np.all(lo <= est) and np.all(est <= hi)


def test_variance_is_saved_only_when_it_says_more_than_the_rate():
    ids = zipf_ids(100_000)
    plain = TableStats("t", ROWS, SketchConfig(sample_k=4)).update(ids)
    meta, _ = unpack(plain.to_bytes(), "TableStats")
    assert meta["stats_version"] == 2 and "sample_variance" not in meta
    mixed = TableStats("t", ROWS, SketchConfig(sample_k=8)).update(ids).resample(2)
    meta, arrays = unpack(mixed.to_bytes(), "TableStats")
    assert meta["stats_version"] == 3 and meta["sample_variance"] == 7
    back = TableStats.from_bytes(mixed.to_bytes())
    rows = mixed.top(100)[0]
    for a, b in zip(back.bounds(rows), mixed.bounds(rows)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(FormatError, match="sample_variance"):
        TableStats.from_bytes(pack("TableStats", {**meta, "sample_variance": 0.5}, arrays))


def test_different_rates_do_not_merge_until_resampled():
    a = StreamStats({"t": None}, SketchConfig(sample_k=2))
    b = StreamStats({"t": None}, SketchConfig(sample_k=8))
    ids = zipf_ids(50_000)
    a.update(Batch(["t"], ids, np.ones(ids.size, np.int64)))
    b.update(Batch(["t"], ids, np.ones(ids.size, np.int64)))
    with pytest.raises(IncompatibleError, match="resample one side first"):
        a.merge(b)
    a.resample(8).merge(b)
    assert a["t"].config.sample_k == 8 and a["t"].total == 2 * ids.size
    with pytest.raises(ConfigError, match="sample_k"):
        a.resample(0)
    assert a.config.sample_k == 8


def test_sampled_lengths_are_the_same_however_the_stream_is_cut():
    lengths = np.random.default_rng(3).integers(1, 7, 40_000)
    ids = zipf_ids(int(lengths.sum()))
    whole = TableStats("t", ROWS, SketchConfig(sample_k=4)).update(ids, lengths)
    cut = TableStats("t", ROWS, SketchConfig(sample_k=4))
    ends = np.cumsum(lengths)
    for s in np.array_split(np.arange(lengths.size), 7):
        lo = 0 if s[0] == 0 else ends[s[0] - 1]
        cut.update(ids[lo:ends[s[-1]]], lengths[s])
    assert_same_statistics(cut.to_bytes(), whole.to_bytes(), "TableStats")
    assert whole.samples == lengths.size                     # the mean length stays exact
    q = whole.length_quantiles((0.5,))["0.5"]
    assert abs(q - np.median(lengths)) <= 1


def test_state_restore_takes_the_states_rate():
    ids = zipf_ids(20_000)
    batch = Batch(["t"], ids, np.ones(ids.size, np.int64))
    for make in (lambda k: StreamStats({"t": None}, SketchConfig(sample_k=k)),
                 lambda k: DecayedStats({"t": None}, SketchConfig(sample_k=k), half_life=10),
                 lambda k: WindowedStats({"t": None}, SketchConfig(sample_k=k), window=10)):
        src = make(1)
        src.update(batch)
        src.resample(8)
        src.update(batch)
        dst = make(1)
        assert dst.restore(src.state()) == []
        assert dst.config.sample_k == 8
        dst.update(batch)                                  # goes on at the state's rate
        assert dst.view()["t"].config.sample_k == 8
    with pytest.raises(ConfigError):                       # other sketch sizes still refuse
        StreamStats({"t": None}, SketchConfig(sample_k=8, hll_p=10)).restore(
            StreamStats({"t": None}, SketchConfig(sample_k=2)).state())


def test_a_windowed_view_merges_after_a_change_of_rate():
    w = WindowedStats({"t": None}, SketchConfig(sample_k=2), window=4, slots=4)
    ids = zipf_ids(40_000)
    for i, part in enumerate(np.array_split(ids, 6)):
        if i == 3:
            w.resample(16)
        w.update(Batch(["t"], part, np.ones(part.size, np.int64)))
    view = w.view()
    assert view["t"].config.sample_k == 16 and w.live_slots == 4


def test_tables_on_an_executor_give_the_statistics_of_one_thread():
    ids = [zipf_ids(60_000, seed=s) for s in range(3)]
    batches = [Batch(["a", "b", "c"], np.concatenate([x[i::4] for x in ids]),
                     np.ones(3 * ids[0][i::4].size, np.int64)) for i in range(4)]
    one = StreamStats({"a": None, "b": None, "c": 5_000_000}, SketchConfig(sample_k=4))
    many = StreamStats({"a": None, "b": None, "c": 5_000_000}, SketchConfig(sample_k=4))
    with ThreadPoolExecutor(3) as pool:
        many.set_executor(pool)
        for b in batches:
            one.update(b)
            many.update(b)
    assert_same_statistics(many.to_bytes(), one.to_bytes())


# ----------------------------------------------------------------------------- the controller


class World:
    """A simulated ingest thread: ``cost(k)`` CPU seconds per ID (``a + (b + gap) / k``; the
    unsampled kernel ``a + b``), one core, a queue of ``queue_ids``; ``noise``: relative error of
    each interval's cost measurement."""

    def __init__(self, a, b, *, gap=0.0, queue_ids=64 << 19, noise=0.0, seed=0, dt=0.5):
        self.a, self.b, self.gap, self.queue_ids, self.noise, self.dt = a, b, gap, queue_ids, \
            noise, dt
        self.backlog = 0.0
        self.rng = np.random.default_rng(seed)

    def cost(self, k):
        """``gap``: what drawing the random gap to the next kept ID costs (sampled rates only)."""
        return self.a + self.b if k == 1 else self.a + (self.b + self.gap) / k

    def interval(self, k, rate):
        offered = rate * self.dt
        c = self.cost(k)
        done = min(self.backlog + offered, self.dt / c)
        self.backlog += offered - done
        dropped = max(0.0, self.backlog - self.queue_ids)
        self.backlog -= dropped
        measured = c * (1 + self.noise * self.rng.uniform(-1, 1))
        return Interval(self.dt, done * measured, done * measured, int(done), int(offered),
                        int(dropped), self.backlog / self.queue_ids)


def run(ctrl, world, rate, intervals):
    """Drive ``ctrl``; returns the rates in force after each interval and the IDs dropped."""
    ks, dropped = [], 0
    for _ in range(intervals):
        m = world.interval(ctrl.k, rate)
        dropped += m.dropped_ids
        ctrl.observe(m)
        ks.append(ctrl.k)
    return ks, dropped


def test_settles_within_the_budget_and_does_not_flap_under_noise():
    world = World(a=2e-9, b=30e-9, noise=0.25)
    ctrl = RateController(0.5, max_k=1024)
    ks, _ = run(ctrl, world, 100e6, 20)                    # converge
    k = ctrl.k
    assert 100e6 * world.cost(k) <= 0.5                     # within the budget
    assert 100e6 * world.cost(max(1, k // 2)) > 0.5 * ctrl.low   # and not needlessly sparse
    ks, dropped = run(ctrl, world, 100e6, 400)             # 200 s of a steady load
    assert dropped == 0
    changes = [b for a, b in zip([k] + ks, ks) if a != b]
    assert len(changes) <= 2                                 # a correction or two, no return:
    assert all(b >= a for a, b in zip([k] + ks, ks))         # (600 seeds tried: at most 2)
    assert 100e6 * world.cost(ks[-1]) <= 0.5


def test_follows_the_offered_rate_up_at_once_and_down_after_settling():
    world = World(a=2e-9, b=30e-9)
    ctrl = RateController(0.5)
    run(ctrl, world, 20e6, 20)
    k_low = ctrl.k
    ks, _ = run(ctrl, world, 160e6, 3)
    assert ks[0] > k_low                                    # the first interval already acts
    run(ctrl, world, 160e6, 20)
    k_high = ctrl.k
    assert 160e6 * world.cost(k_high) <= 0.5
    ks, _ = run(ctrl, world, 20e6, 60)
    assert ks[ctrl.settle - 2] == k_high                    # not before `settle` calm intervals
    assert all(b in (a, a // 2) for a, b in itertools.pairwise(ks))   # one halving at a time
    assert k_low <= ctrl.k <= 2 * k_low and not ctrl.over_budget
    assert 20e6 * world.cost(ctrl.k) <= 0.5 * ctrl.target


def test_an_impossible_budget_is_reported_and_k_stops_where_sampling_stops_paying():
    world = World(a=10e-9, b=30e-9)                        # 100 M IDs/s: 1 core for `a` alone
    ctrl = RateController(0.5, max_k=1 << 16)
    run(ctrl, world, 100e6, 30)
    assert ctrl.over_budget
    assert ctrl.k < 1 << 16                                 # no point in k beyond a + b/k ~ a
    assert world.cost(ctrl.k) <= 1.1 * world.cost(1 << 16) + 1e-12
    k = ctrl.k
    ks, dropped = run(ctrl, world, 100e6, 30)              # drops go on: k stays where it is
    assert dropped > 0 and set(ks) == {k} and ctrl.over_budget


def test_a_sparse_rate_that_costs_more_than_no_sampling_does_not_stop_the_climb():
    # at k = 2 the random gaps cost more than they save: k = 1 is cheaper than k = 2
    world = World(a=3e-9, b=20e-9, gap=25e-9)
    assert world.cost(2) > world.cost(1)
    ctrl = RateController(0.5)
    ks, _ = run(ctrl, world, 25e6, 20)
    assert ks[0] == 2                          # the first step lands on the costlier rate
    assert 25e6 * world.cost(ctrl.k) <= 0.5 and not ctrl.over_budget
    assert run(ctrl, world, 25e6, 20)[1] == 0


def test_an_idle_stream_returns_to_counting_every_id():
    world = World(a=2e-9, b=30e-9)
    ctrl = RateController(0.5)
    run(ctrl, world, 200e6, 20)
    assert ctrl.k > 1
    run(ctrl, world, 0.0, 200)
    assert ctrl.k == 1


def test_drops_or_a_filling_queue_raise_k_without_a_cost_measurement():
    ctrl = RateController(0.5, k=4)
    assert ctrl.observe(Interval(0.5, 0.0, 0.0, 0, 10_000, 5_000, 1.0)) == 8
    assert ctrl.observe(Interval(0.5, 0.0, 0.0, 0, 10_000, 0, 0.6)) == 16


@pytest.mark.parametrize("kw", [{"cpu_budget": 0}, {"cpu_budget": -1},
                                {"cpu_budget": math.nan}, {"cpu_budget": 0.5, "max_k": 0},
                                {"cpu_budget": 0.5, "low": 0.8, "target": 0.7},
                                {"cpu_budget": 0.5, "settle": 0}])
def test_controller_settings_are_checked(kw):
    with pytest.raises(ConfigError):
        RateController(**kw)


def test_sampled_bounds_with_a_variance_and_no_sampling():
    lo, hi = sampled_count_bounds(np.array([100.0]), np.array([100.0]), 1, variance=0)
    assert lo[0] == hi[0] == 100
    lo, hi = sampled_count_bounds(np.array([100.0]), np.array([100.0]), 1, variance=7)
    assert lo[0] < 100 < hi[0]
    lo8, hi8 = sampled_count_bounds(np.array([100.0]), np.array([100.0]), 8)
    lo8v, hi8v = sampled_count_bounds(np.array([100.0]), np.array([100.0]), 8, variance=7)
    assert lo8[0] == lo8v[0] and hi8[0] == hi8v[0]
