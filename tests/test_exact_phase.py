"""The exact phase of a sketched table: every row seen counted exactly while the rows fit, then the
sketches, as if they had counted from the first ID (docs/STATISTICS.md, "Exact phase")."""
import numpy as np
import pytest
from conftest import zipf_stream
from hypothesis import given
from hypothesis import strategies as st

from flexshard_stream import FormatError, SketchConfig, TableStats
from flexshard_stream.kernels.countmin import cms_update
from flexshard_stream.kernels.hashing import hash_ids
from flexshard_stream.kernels.hll import hll_update_hashed

# count-min 512 x 3; heavy hitters 2**5 slots (24 rows); exact phase 2**7 slots (96 rows)
SMALL = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, hh_lg_size=5, hll_p=8)
EXACT_ROWS = 96

streams = st.builds(lambda n, rows, alpha, seed: zipf_stream(n, rows, alpha, seed),
                    st.integers(1, 6000), st.integers(1, 400),
                    st.sampled_from([0.0, 1.05, 1.3]), st.integers(0, 2**31))


def sketched_from_the_start(ids, config):
    """The plain count-min table and HyperLogLog registers of ``ids`` counted one at a time."""
    cms = np.zeros((config.cms_depth, config.cms_width), np.uint32)
    cms_update(cms, ids, config.seed, False)
    regs = np.zeros(1 << config.hll_p, np.uint8)
    h = hash_ids(ids, config.seed, np.empty(ids.size, np.uint64))
    hll_update_hashed(regs, config.hll_p, h, h.size)
    return cms, regs


def test_sizes_follow_the_sketch_memory():
    c = SketchConfig()
    assert c.exact_phase_lg_size == 16
    assert 16 << c.exact_phase_lg_size <= c.sketch_bytes        # keys and counts: 1 MiB of 1.4
    assert SMALL.exact_phase_lg_size == 7
    assert not SketchConfig(sample_k=4).uses_exact_phase(None)
    assert not c.uses_exact_phase(1000) and c.uses_exact_phase(None)


@given(streams)
def test_counts_are_exact_while_the_rows_fit_then_bounds_hold(ids):
    t = TableStats("t", None, SMALL).update(ids)
    true = np.bincount(ids, minlength=int(ids.max()) + 2)
    probe = np.arange(true.size)
    est, lo, hi = t.bounds(probe)
    distinct = np.unique(ids).size
    assert t.exact_phase == (distinct <= EXACT_ROWS)
    assert np.all(lo <= true) and np.all(true <= hi)
    if t.exact_phase:
        assert np.array_equal(est, true) and np.array_equal(hi, true)
        assert t.distinct() == (distinct, distinct, distinct) and t.max_error == 0
        assert t.summary(10).exact and not t._cms.any() and not t._hll.any()
    else:
        cms, regs = sketched_from_the_start(ids, SMALL)
        assert np.array_equal(t._cms, cms) and np.array_equal(t._hll, regs)
        assert not t.summary(10).exact


def test_the_phase_ends_once_in_the_batch_that_overflows_it():
    ids = np.repeat(np.arange(200, dtype=np.int64), 3)
    t = TableStats("t", None, SMALL)
    t.update(ids[:EXACT_ROWS * 3])                      # 96 rows: fits
    assert t.exact_phase and t.tracked_capacity == EXACT_ROWS
    t.update(ids[EXACT_ROWS * 3:])
    assert not t.exact_phase and t.tracked_capacity == SMALL.hh_capacity
    _, lo, hi = t.bounds(np.arange(200))
    assert np.all(lo <= 3) and np.all(hi >= 3)
    assert int(t._mg_meta[2]) == t.total == ids.size


@given(streams, st.integers(0, 6000))
def test_merge_equals_the_whole_stream_and_leaves_other_unchanged(ids, cut):
    cut = min(cut, ids.size)
    whole = TableStats("t", None, SMALL).update(ids)
    a = TableStats("t", None, SMALL).update(ids[:cut])
    b = TableStats("t", None, SMALL).update(ids[cut:])
    before = b.to_bytes()
    a.merge(b)
    assert b.to_bytes() == before
    assert a.exact_phase == whole.exact_phase
    assert np.array_equal(a._cms, whole._cms) and np.array_equal(a._hll, whole._hll)
    true = np.bincount(ids, minlength=int(ids.max()) + 1)
    est, lo, hi = a.bounds(np.arange(true.size))
    assert np.all(lo <= true) and np.all(true <= hi)
    if a.exact_phase:
        assert np.array_equal(est, true)
    assert a.total == int(a._mg_meta[2]) == ids.size


@given(streams)
def test_saved_and_loaded_exactly_in_any_phase(ids):
    t = TableStats("t", None, SMALL).update(ids, np.ones(ids.size, np.int64))
    data = t.to_bytes()
    u = TableStats.from_bytes(data)
    assert u.to_bytes() == data and u.exact_phase == t.exact_phase
    probe = np.unique(ids)
    for x, y in zip(t.bounds(probe), u.bounds(probe)):
        assert np.array_equal(x, y)
    more = zipf_stream(3000, 400, 1.1, 9)
    assert t.update(more).to_bytes() == u.update(more).to_bytes()


def test_decay_rounds_down_as_exact_counts_do():
    ids = np.repeat(np.arange(10, dtype=np.int64), np.arange(1, 11))   # row r: r + 1 lookups
    t = TableStats("t", None, SMALL).update(ids, np.ones(ids.size, np.int64))
    t.scale(0.5)
    assert t.exact_phase
    want = np.floor(np.arange(1, 11) * 0.5)
    assert np.array_equal(t.estimate(np.arange(10)), want)
    assert t.total == int(want.sum()) == int(t._mg_meta[2]) and t.distinct()[0] == 9


def test_resampling_ends_the_phase_and_keeps_the_estimates():
    ids = zipf_stream(4000, 60, 1.1, 3)
    t = TableStats("t", None, SMALL).update(ids)
    assert t.exact_phase
    top = t.top(5)[0]
    before = t.estimate(top)
    t.resample(4)
    assert not t.exact_phase
    est, lo, hi = t.bounds(top)
    assert np.all(np.abs(est - before) <= 4)       # counts rescaled by 1/4, rounded
    true = np.bincount(ids)[top]
    assert np.all((lo <= true) & (true <= hi))


def _repacked(t, **changes):
    from flexshard_stream.formats.container import pack, unpack
    meta, arrays = unpack(t.to_bytes(), "TableStats")
    for k, v in changes.items():
        (arrays if k in arrays else meta)[k] = v
    return pack("TableStats", meta, arrays)


def test_loaded_exact_phase_is_validated():
    t = TableStats("t", None, SMALL).update(zipf_stream(2000, 50, 1.2, 2))
    assert t.exact_phase

    def damaged(match, **changes):
        with pytest.raises(FormatError, match=match):
            TableStats.from_bytes(_repacked(t, **changes), "crafted.fss")

    meta = t._mg_meta.copy()
    meta[1] = 3
    damaged(r"threshold", mg_meta=meta)
    cms = t._cms.copy()
    cms[0, 0] = 1
    damaged("cms is not empty", cms=cms)
    damaged("total", total=t.total + 1)
    damaged("bytes of counters", mg_keys=np.zeros(48, np.int64))
    damaged(r"'mg_keys' has shape \(256,\)", mg_keys=np.zeros(256, np.int64))
    damaged("'exact_phase' is true", config={**SMALL.to_dict(), "sample_k": 4})
    damaged("'exact_phase' is 1", exact_phase=1)
    assert TableStats.from_bytes(_repacked(t)).to_bytes() == t.to_bytes()


def test_datasketches_image_of_an_exact_phase():
    import datasketches as ds
    ids = np.repeat(np.arange(60, dtype=np.int64), np.arange(60, 0, -1))  # 60 rows > 24 tracked
    t = TableStats("t", None, SMALL).update(ids)
    assert t.exact_phase
    sk = ds.frequent_items_sketch.deserialize(t.to_datasketches_frequent_items(), ds.PyLongsSerDe())
    assert sk.get_lower_bound(0) == 60 and sk.get_upper_bound(0) == 60 + 36
    assert sk.get_upper_bound(59) == 36 and sk.get_lower_bound(59) == 0
    assert sk.total_weight == ids.size and sk.num_active_items == SMALL.hh_capacity
    # every row left out counts at most the offset: the 25th largest count, 36
