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


@given(streams, st.sampled_from(["plain", "conservative", "off"]))
def test_heavy_hitter_bounds_hold_for_every_item(ids, mode):
    cfg = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, cms_mode=mode, hh_lg_size=5, hll_p=8)
    t = TableStats("t", None, cfg).update(ids)
    probe = np.arange(int(ids.max()) + 2, dtype=np.int64)
    true = np.bincount(ids, minlength=probe.size)
    est, lo, hi = t.bounds(probe)
    assert np.all(lo <= true) and np.all(true <= hi)
    assert np.all((lo <= est) & (est <= hi))
    # no row above the threshold is missing from the table
    tracked = np.zeros(probe.size, bool)
    tracked[t.top(t.tracked_capacity)[0]] = True
    assert np.all(tracked[true > t.max_error])
    # the a-posteriori bound stays within the Misra-Gries one: N / (counters / 2)
    assert t.max_error <= ids.size / (cfg.hh_capacity / 2) + 1


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


# ------------------------------------------------------------ heavy hitters: invariants and gate
def hh_state(t):
    """Copies of a table's heavy-hitter arrays (keys, counts, errors, meta)."""
    return t._mg_keys.copy(), t._mg_vals.copy(), t._mg_errs.copy(), t._mg_meta.copy()


@given(streams, st.integers(0, 20000))
def test_heavy_hitter_invariants_after_updates_and_merge(ids, cut):
    """Every tracked row: count <= true <= count + error, error <= threshold < count + error;
    every untracked row: true <= threshold; merging adds thresholds."""
    cut = min(cut, ids.size)
    a = TableStats("t", None, SMALL).update(ids[:cut])
    b = TableStats("t", None, SMALL).update(ids[cut:])
    thresholds = int(a._mg_meta[1]) + int(b._mg_meta[1])
    m = a.copy().merge(b)
    assert int(m._mg_meta[1]) >= thresholds
    for t, part in ((a, ids[:cut]), (b, ids[cut:]), (m, ids)):
        keys, counts, errs, meta = hh_state(t)
        live = counts > 0
        true = np.bincount(part, minlength=int(ids.max()) + 1) if part.size else np.zeros(1, int)
        k = keys[live]
        tk = true[k] if k.size else k
        assert np.all(counts[live] <= tk) and np.all(tk <= counts[live] + errs[live])
        assert np.all(errs[live] <= meta[1]) and np.all(counts[live] + errs[live] > meta[1])
        assert int(meta[0]) == int(live.sum()) <= t.tracked_capacity
        untracked = np.setdiff1d(np.flatnonzero(true), k)
        assert np.all(true[untracked] <= meta[1])


def test_gate_keeps_tail_ids_out_and_counts_the_head_exactly():
    """On a skewed stream the count-min gate admits few rows beyond the head; the head's counts
    are exact up to the error bound of their admission, far tighter than Misra-Gries' offset."""
    ids = zipf_stream(400_000, 200_000, 1.1, 5)
    t = TableStats("t", None, SketchConfig(cms_epsilon=1e-3, hh_lg_size=10)).update(ids)
    true = np.bincount(ids)
    top = np.argsort(-true, kind="stable")[:50]
    est, lo, hi = t.bounds(top)
    assert np.all(lo <= true[top]) and np.all(true[top] <= hi)
    assert np.all(hi - lo <= t.max_error)
    # the threshold is a small fraction of the Misra-Gries bound N / (capacity / 2)
    assert t.max_error < 0.5 * ids.size / (t.config.hh_capacity / 2)


def test_kernel_survives_a_table_with_every_slot_live():
    """A table whose metadata claims fewer live rows than it holds, every slot live: the update
    terminates, writes nothing out of bounds and repairs the count (the hardening issue)."""
    from flexshard_stream.kernels.pipeline import update_table
    size = 1 << SMALL.hh_lg_size
    keys = np.arange(1000, 1000 + size, dtype=np.int64)   # no probe finds these where it looks
    counts = np.full(size, 7, np.int64)
    errs = np.zeros(size, np.int64)
    meta = np.array([1, 0, 7 * size], np.int64)              # claims one live row
    cms = np.zeros((SMALL.cms_depth, SMALL.cms_width), np.uint32)
    ids = zipf_stream(5000, 300, 1.2, 1)
    update_table(ids, SMALL.seed, cms, False, keys, counts, errs, meta,
                 np.zeros(1 << SMALL.hll_p, np.uint8), SMALL.hll_p, np.zeros(0, np.uint32),
                 1, 0, np.array([-1, 0], np.int64))
    assert int(meta[0]) == int((counts > 0).sum()) <= SMALL.hh_capacity
    assert (counts == 0).any()


def test_kernel_survives_negative_counts_and_rejects_odd_sizes():
    from flexshard_stream.kernels.frequent import hh_count_passing, hh_update
    size = 32
    keys, counts = np.zeros(size, np.int64), np.full(size, -3, np.int64)
    errs, meta = np.zeros(size, np.int64), np.zeros(3, np.int64)
    ids = np.arange(100, dtype=np.int64)
    hh_update(keys, counts, errs, meta, ids, 1)      # a table of "occupied" garbage is purged
    assert int(meta[0]) == int((counts > 0).sum()) and (counts >= 0).all()
    sel = np.arange(10)
    with pytest.raises(ValueError, match="power-of-two"):
        hh_count_passing(np.zeros(12, np.int64), np.zeros(12, np.int64), np.zeros(12, np.int64),
                         meta, ids, np.zeros(10, np.uint64), np.zeros(10, np.int64), sel, 10, 1)


def _repacked(t, **changes):
    """``t.to_bytes()`` with some arrays or meta fields replaced (a crafted, damaged blob)."""
    from flexshard_stream.formats.container import pack, unpack
    meta, arrays = unpack(t.to_bytes(), "TableStats")
    for k, v in changes.items():
        if k in arrays:
            arrays[k] = v
        else:
            meta[k] = v
    return pack("TableStats", meta, arrays)


def test_loaded_heavy_hitter_state_is_validated():
    from flexshard_stream import FormatError
    t = TableStats("t", None, SMALL).update(zipf_stream(20_000, 3000, 1.2, 2))
    vals = np.stack([t._mg_vals, t._mg_errs])
    live = np.flatnonzero(t._mg_vals > 0)
    meta = t._mg_meta.copy()

    def damaged(field, **changes):
        with pytest.raises(FormatError, match=field):
            TableStats.from_bytes(_repacked(t, **changes), "crafted.fss")

    fewer = meta.copy()
    fewer[0] -= 1
    damaged(r"mg_meta\[0\] \(live rows\)", mg_meta=fewer)
    full = vals.copy()
    full[0] = 5
    full[1] = 0
    damaged("no empty slot", mg_vals=full, mg_meta=np.array([full[0].size, meta[1], 10**6]))
    neg = vals.copy()
    neg[0, live[0]] = -1
    damaged("negative count", mg_vals=neg)
    big_err = vals.copy()
    big_err[1, live[0]] = meta[1] + 5
    damaged("mg_errs", mg_vals=big_err)
    keys = t._mg_keys.copy()
    keys[live[0]] = keys[live[1]]
    damaged("repeated or not reachable", mg_keys=keys)
    low = meta.copy()
    low[2] = 0
    damaged(r"mg_meta\[2\]", mg_meta=low)
    damaged("sample_state", sample_state=np.array([-5, 0], np.int64))
    damaged("statistics version 9", stats_version=9)
    assert TableStats.from_bytes(_repacked(t), "intact.fss").to_bytes() == t.to_bytes()


def test_reads_version_1_files():
    """A file written by the Misra-Gries version (stats version 1) loads: each tracked row takes
    the old offset as its error, the bounds still hold, and it saves as version 2."""
    from pathlib import Path

    from flexshard_stream import StreamStats
    from flexshard_stream.formats.container import unpack
    path = Path(__file__).parent / "data" / "stream_stats_v1.fss"
    old_meta, old_arrays = unpack(path.read_bytes(), "StreamStats")
    assert "stats_version" not in old_meta["tables"][0]
    old_offset = float(old_arrays["0.mg_meta"][1])
    assert old_offset > 0                            # the old table did purge
    st = StreamStats.load(path)
    seq, one = zipf_stream(6000, 2000, 1.2, 11), zipf_stream(600, 50, 1.1, 12)
    probe = np.arange(2001)
    _, lo, hi = st["seq"].bounds(probe)
    true = np.bincount(seq, minlength=probe.size)
    assert np.all(lo <= true) and np.all(true <= hi)
    assert st["seq"].max_error == old_offset
    assert np.array_equal(st["one"].estimate(np.arange(50)), np.bincount(one, minlength=50))
    more = zipf_stream(3000, 2000, 1.2, 13)
    st["seq"].update(more)  # keeps counting with the converted state
    _, lo, hi = st["seq"].bounds(probe)
    true += np.bincount(more, minlength=probe.size)
    assert np.all(lo <= true) and np.all(true <= hi)
    new_meta, _ = unpack(st.to_bytes(), "StreamStats")
    assert new_meta["tables"][0]["stats_version"] == 2
    assert StreamStats.from_bytes(st.to_bytes()).to_bytes() == st.to_bytes()


# ------------------------------------------------------------------------ sampled ingestion
SAMPLED = SketchConfig(cms_epsilon=1e-3, hh_lg_size=10, sample_k=4, sample_seed=3)


def test_sampling_config_is_validated_and_refuses_mismatched_merges():
    from flexshard_stream import ConfigError, IncompatibleError
    for bad in (0, -1, 2.5, True, 2**21):
        with pytest.raises(ConfigError, match="sample_k"):
            SketchConfig(sample_k=bad)
    with pytest.raises(ConfigError, match="sample_seed"):
        SketchConfig(sample_seed=-1)
    assert SketchConfig(sample_k=np.int64(4)).sample_k == 4
    ids = zipf_stream(5000, 1000, 1.2, 1)
    a = TableStats("t", None, SAMPLED).update(ids)
    before = a.to_bytes()
    for other in (SketchConfig(cms_epsilon=1e-3, hh_lg_size=10, sample_k=8, sample_seed=3),
                  SketchConfig(cms_epsilon=1e-3, hh_lg_size=10, sample_k=4, sample_seed=4),
                  SketchConfig(cms_epsilon=1e-3, hh_lg_size=10)):
        with pytest.raises(IncompatibleError, match="sampled ingestion differs"):
            a.merge(TableStats("t", None, other).update(ids))
    assert a.to_bytes() == before


def test_sampling_is_deterministic_and_independent_of_batching():
    """The kept IDs depend on the seed and the stream only: one batch or many, saved and loaded
    in between, the state is the same; another seed keeps other IDs."""
    ids = zipf_stream(50_000, 5000, 1.1, 4)
    whole = TableStats("t", None, SAMPLED).update(ids)
    parts = TableStats("t", None, SAMPLED)
    for cut in np.array_split(ids, 7):
        parts = TableStats.from_bytes(parts.update(cut).to_bytes())
    assert parts.to_bytes() == whole.to_bytes()
    other = TableStats("t", None, SketchConfig(cms_epsilon=1e-3, hh_lg_size=10, sample_k=4,
                                               sample_seed=5)).update(ids)
    assert not np.array_equal(other._cms, whole._cms)
    # about one ID in k reaches the sketches: binomial, within 5 standard deviations
    kept = int(whole._mg_meta[2])
    assert abs(kept - ids.size / 4) < 5 * np.sqrt(ids.size * 0.25 * 0.75)


def test_sampled_estimates_are_scaled_and_bounds_widened():
    ids = zipf_stream(400_000, 20_000, 1.1, 6)
    t = TableStats("t", None, SAMPLED).update(ids)
    full = TableStats("t", None, SketchConfig(cms_epsilon=1e-3, hh_lg_size=10)).update(ids)
    true = np.bincount(ids)
    top = np.argsort(-true, kind="stable")[:200]
    est, lo, hi = t.bounds(top)
    inside = (lo <= true[top]) & (true[top] <= hi)
    assert inside.mean() >= 0.98                     # z = 3 normal bounds, per row
    # errors in standard deviations of k * Binomial(f, 1/k): unbiased, |z| about 0.8 on average
    z = (est - true[top]) / np.sqrt(3 * true[top])
    assert abs(z.mean()) < 0.3 and np.abs(z).mean() < 1.0
    assert np.all(hi - lo > 0)
    # totals and HyperLogLog see every ID: the distinct count equals the unsampled one
    assert t.total == ids.size and t.distinct() == full.distinct()
    s = t.summary(100)
    assert s.tail_mass == pytest.approx(ids.size - s.top_est.sum())
    # an exact table ignores sampling
    e = TableStats("e", 20_000, SAMPLED).update(ids)
    assert e.exact and np.array_equal(e.estimate(top), true[top])


def test_sampled_count_bounds_formula():
    from flexshard_stream.stats.table_stats import sampled_count_bounds
    lo, hi = sampled_count_bounds(np.array([0.0, 100.0]), np.array([0.0, 100.0]), 1)
    assert lo.tolist() == [0, 100] and hi.tolist() == [0, 100]
    lo, hi = sampled_count_bounds(np.array([0.0, 100.0]), np.array([0.0, 100.0]), 4, z=3.0)
    # solve f -/+ 3 sqrt(3 f) = 400
    for f, sign in ((lo[1], 1), (hi[1], -1)):
        assert f + sign * 3 * np.sqrt(3 * f) == pytest.approx(400)
    assert lo[0] == 0 and hi[0] == pytest.approx(27)   # never sampled: f up to z^2 (k - 1)
    assert np.isinf(sampled_count_bounds(np.array([1.0]), np.array([np.inf]), 4)[1][0])


def test_sampled_frequent_items_image_is_valid():
    ids = zipf_stream(200_000, 10_000, 1.2, 8)
    t = TableStats("t", None, SAMPLED).update(ids)
    fi = ds.frequent_items_sketch.deserialize(t.to_datasketches_frequent_items(), ds.PyLongsSerDe())
    assert fi.total_weight == ids.size
    top_ids, est, lo, hi = t.top(50)
    for i, l, h in zip(top_ids, lo, hi):
        assert fi.get_lower_bound(int(i)) == np.floor(l)
        assert fi.get_upper_bound(int(i)) >= h
        assert fi.get_upper_bound(int(i)) == np.floor(l) + t.max_error


def test_decay_of_exact_counts_leaves_no_phantom_tail():
    """Exact counts round down under decay; the total must follow them, or the rounded-off
    lookups reappear in the summary as tail mass on a made-up row."""
    t = TableStats("t", 1000, SMALL)
    ids = np.concatenate([np.arange(1000), np.full(500, 7)])    # 999 rows once, row 7 501 times
    t.update(ids, np.full(300, 5, np.int64))
    t.scale(0.5)
    s = t.summary(10)
    assert t.total == int(t.bounds(np.arange(1000))[0].sum()) == 250
    assert s.tail_mass == 0.0 and s.distinct_estimate == 1
    assert s.mean_length == pytest.approx(5.0, rel=0.01)
