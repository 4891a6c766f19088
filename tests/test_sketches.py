"""Properties of the sketches on random skewed streams (hypothesis)."""
import math

import datasketches as ds
import numpy as np
import pytest
from conftest import zipf_stream
from hypothesis import given
from hypothesis import strategies as st

from flexshard_stream import SketchConfig, TableStats
from flexshard_stream.stats.table_stats import hll_estimate

SMALL = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, hh_lg_size=5, hll_p=8)  # 512 x 3, 24 counters

streams = st.builds(lambda n, rows, alpha, seed: zipf_stream(n, rows, alpha, seed),
                    st.integers(1, 20000), st.integers(1, 5000),
                    st.sampled_from([0.0, 1.05, 1.3, 2.0]), st.integers(0, 2**31))


@given(streams, st.sampled_from(["plain", "conservative"]))
def test_countmin_never_underestimates_and_meets_epsilon_delta(ids, mode):
    cfg = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, cms_mode=mode, hh_lg_size=5)
    t = TableStats("t", None, cfg).update(ids)
    rows = np.unique(ids)
    true = np.bincount(ids)[rows]
    est = t.cms_estimate(rows)
    assert np.all(est >= true)
    # Per query P(err > eps * N) <= delta; allow 3 standard deviations of binomial slack.
    bad = np.mean(est - true > cfg.cms_epsilon * ids.size)
    slack = 3 * math.sqrt(cfg.cms_delta * (1 - cfg.cms_delta) / rows.size)
    assert bad <= cfg.cms_delta + slack


@given(streams)
def test_heavy_hitter_bounds_hold_for_every_item(ids):
    t = TableStats("t", None, SMALL).update(ids)
    probe = np.arange(int(ids.max()) + 2, dtype=np.int64)
    true = np.bincount(ids, minlength=probe.size)
    est, lo, hi = t.bounds(probe)
    assert np.all(lo <= true) and np.all(true <= hi)
    assert np.all((lo <= est) & (est <= hi))
    # Misra-Gries a-posteriori bound: offset <= N / (counters / 2) for the median purge.
    assert t.max_error <= ids.size / (SMALL.hh_capacity / 2) + 1


@given(streams, st.integers(0, 20000))
def test_merge_of_halves(ids, cut):
    cut = min(cut, ids.size)
    a, b = ids[:cut], ids[cut:]
    whole = TableStats("t", None, SMALL).update(ids)
    merged = TableStats("t", None, SMALL).update(a).merge(TableStats("t", None, SMALL).update(b))
    # linear sketches: identical
    assert np.array_equal(merged._cms, whole._cms)
    assert np.array_equal(merged._hll, whole._hll)
    assert merged.total == whole.total == ids.size
    # heavy hitters: still valid bounds for every item
    probe = np.arange(int(ids.max()) + 1, dtype=np.int64)
    true = np.bincount(ids, minlength=probe.size)
    _, lo, hi = merged.bounds(probe)
    assert np.all(lo <= true) and np.all(true <= hi)


@given(streams)
def test_exact_merge_and_counts(ids):
    rows = int(ids.max()) + 1
    a = TableStats("t", rows).update(ids[: ids.size // 2])
    b = TableStats("t", rows).update(ids[ids.size // 2:])
    assert a.exact
    a.merge(b)
    est, lo, hi = a.bounds(np.arange(rows))
    assert np.array_equal(est, np.bincount(ids, minlength=rows))
    assert a.distinct()[0] == np.unique(ids).size


@given(streams)
def test_serialize_round_trip(ids):
    t = TableStats("t", None, SMALL).update(ids, np.ones(ids.size, np.int64))
    u = TableStats.from_bytes(t.to_bytes())
    assert u.to_bytes() == t.to_bytes()
    probe = np.unique(ids)
    for x, y in zip(t.bounds(probe), u.bounds(probe)):
        assert np.array_equal(x, y)
    assert u.length_quantiles() == t.length_quantiles()


def test_sequential_ids_hash_well():
    """Sequential row IDs must spread over count-min columns like random ones."""
    cfg = SketchConfig(cms_epsilon=0.01, cms_delta=0.05)
    t = TableStats("t", None, cfg).update(np.arange(100_000, dtype=np.int64))
    row = t._cms[0].astype(np.float64)
    expected = 100_000 / row.size
    chi2 = ((row - expected) ** 2 / expected).sum()
    dof = row.size - 1
    assert abs(chi2 - dof) < 5 * math.sqrt(2 * dof)
    est = t.cms_estimate(np.arange(100_000))
    assert np.mean(est - 1 > cfg.cms_epsilon * 100_000) <= cfg.cms_delta


def test_conservative_is_more_accurate_on_skew():
    ids = zipf_stream(200_000, 100_000, 1.1, 3)
    true = np.bincount(ids)
    top = np.argsort(-true)[:200]
    errs = {}
    for mode in ("plain", "conservative"):
        t = TableStats("t", None, SketchConfig(cms_epsilon=1e-3, cms_mode=mode)).update(ids)
        errs[mode] = np.mean((t.cms_estimate(top) - true[top]) / true[top])
    assert errs["conservative"] < errs["plain"]


def test_exact_counter_saturates_instead_of_wrapping():
    t = TableStats("t", 4)
    t._counts[1] = np.uint32(2**32 - 2)
    t.update(np.array([1, 1, 1, 2], np.int64))
    assert int(t._counts[1]) == 2**32 - 1
    assert t.saturated == 2


def test_cms_counter_saturates_instead_of_wrapping():
    t = TableStats("t", None, SMALL)
    t._cms[:] = np.uint32(2**32 - 1)
    t.update(np.array([5, 5], np.int64))
    assert t._cms.max() == np.uint32(2**32 - 1) and t._cms.min() == np.uint32(2**32 - 1)
    assert t.cms_saturated
    assert np.isinf(t.bounds(np.array([5]))[2][0]) or t.bounds(np.array([5]))[2][0] >= 2


@pytest.mark.parametrize("n", [0, 10, 1000, 50_000, 2_000_000])
def test_hll_estimate_accuracy(n):
    rng = np.random.default_rng(n)
    p = 12
    errs = []
    for rep in range(5):
        ids = rng.choice(2**40, size=n, replace=False) if n < 100_000 else \
            np.arange(n, dtype=np.int64) + rep * 10 * n
        t = TableStats("t", None, SketchConfig(hll_p=p, seed=rep + 1)).update(np.asarray(ids, np.int64))
        errs.append(t.distinct()[0] - n)
    if n == 0:
        assert all(e == 0 for e in errs)
    else:
        rse = 1.04 / math.sqrt(2**p)
        assert abs(np.mean(errs)) / n < 3 * rse / math.sqrt(5) + 0.002
        assert max(abs(e) for e in errs) / n < 4 * rse


def test_hll_estimator_on_empty_and_full_registers():
    assert hll_estimate(np.zeros(4096, np.uint8)) == 0.0
    assert hll_estimate(np.full(4096, 20, np.uint8)) > 1e6


def test_frequent_items_image_reads_in_datasketches():
    ids = zipf_stream(100_000, 50_000, 1.1, 7)
    cfg = SketchConfig(hh_lg_size=8)
    t = TableStats("t", None, cfg).update(ids)
    fi = ds.frequent_items_sketch.deserialize(t.to_datasketches_frequent_items(), ds.PyLongsSerDe())
    assert fi.total_weight == ids.size
    assert fi.get_maximum_error() if hasattr(fi, "get_maximum_error") else True
    top_ids, est, lo, hi = t.top(20)
    for i, l, h in zip(top_ids, lo, hi):
        assert fi.get_lower_bound(int(i)) == l
        assert fi.get_upper_bound(int(i)) == l + t.max_error
    # DataSketches' own query of frequent items agrees with our bounds
    rows = fi.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES)
    true = np.bincount(ids)
    for item, e, lb, ub in rows:
        assert lb <= true[item] <= ub
    # and it merges with a sketch DataSketches built itself
    other = ds.frequent_items_sketch(8)
    for i in ids[:1000]:
        other.update(int(i))
    fi.merge(other)
    assert fi.total_weight == ids.size + 1000


def test_frequent_items_image_of_exact_and_empty_tables():
    t = TableStats("t", 1000).update(np.array([3, 3, 5], np.int64))
    fi = ds.frequent_items_sketch.deserialize(t.to_datasketches_frequent_items(), ds.PyLongsSerDe())
    assert fi.get_estimate(3) == 2 and fi.get_estimate(5) == 1
    e = TableStats("e", None, SMALL)
    fi = ds.frequent_items_sketch.deserialize(e.to_datasketches_frequent_items(), ds.PyLongsSerDe())
    assert fi.is_empty()


def test_decay_scales_and_keeps_bounds():
    ids = zipf_stream(50_000, 10_000, 1.2, 1)
    t = TableStats("t", None, SMALL).update(ids)
    t.scale(0.5)
    probe = np.arange(10_000)
    true = np.bincount(ids, minlength=10_000) * 0.5
    _, lo, hi = t.bounds(probe)
    assert np.all(lo <= true) and np.all(true <= hi + 1e-9)
    assert t.total == ids.size // 2


def test_decay_keeps_the_mean_length():
    t = TableStats("t", 1000, SMALL)
    lengths = np.full(400, 5, np.int64)
    t.update(np.arange(2000) % 1000, lengths)
    before = t.summary(10).mean_length
    for _ in range(6):
        t.scale(0.5)
        t.update(np.arange(2000) % 1000, lengths)
    assert before == pytest.approx(5.0)
    assert t.summary(10).mean_length == pytest.approx(5.0, rel=0.01)
