"""The whole-batch checks (kernels/batchcheck.py) against numpy references, and what Batch and
validate_batch make of them: offsets computed once, no copies of int64 (or fitting uint64) input,
errors naming the first problem, int64's extremes."""

import numpy as np
import pytest
from conftest import FakeKJT
from hypothesis import given
from hypothesis import strategies as st

from flexshard_stream import Batch, BatchError, StreamStats
from flexshard_stream.kernels.batchcheck import (NEGATIVE, OK, SUM_MISMATCH, TOO_LARGE,
                                                 check_ids, check_lengths)
from flexshard_stream.stats.stream import validate_batch

I64 = np.iinfo(np.int64)


def lengths_reference(lengths, nkeys, num_values):
    """check_lengths' answer from numpy (Python ints: no overflow)."""
    if lengths.size and lengths.min() < 0:
        return NEGATIVE, None
    if lengths.size and lengths.max() > num_values:
        return TOO_LARGE, None
    per_key = [sum(int(x) for x in part) for part in np.split(lengths, nkeys)] if nkeys else []
    if sum(per_key) != num_values:
        return SUM_MISMATCH, None
    return OK, np.concatenate([[0], np.cumsum(per_key)])


@given(st.integers(1, 4), st.integers(0, 6), st.data())
def test_check_lengths_matches_numpy(nkeys, samples, data):
    lengths = np.array(data.draw(st.lists(st.integers(-3, 6), min_size=nkeys * samples,
                                          max_size=nkeys * samples)), np.int64)
    num_values = data.draw(st.integers(0, 30))
    offsets = np.full(nkeys + 1, -7, np.int64)
    code, _ = check_lengths(lengths, nkeys, num_values, offsets)
    want, want_offsets = lengths_reference(lengths, nkeys, num_values)
    assert code == want
    if code == OK:
        assert offsets.tolist() == want_offsets.tolist()


def test_check_lengths_huge_lengths_do_not_wrap():
    # five lengths of 2**62 sum to 2**62 in wrapping int64 arithmetic: clamped, not a match
    n = 2 ** 62
    assert check_lengths(np.full(5, n, np.int64), 1, n, np.zeros(2, np.int64))[0] == SUM_MISMATCH
    assert check_lengths(np.full(5, n, np.int64), 5, n, np.zeros(6, np.int64))[0] == SUM_MISMATCH
    assert check_lengths(np.array([I64.max, I64.max, 2], np.int64), 1, 0,
                         np.zeros(2, np.int64))[0] == TOO_LARGE


def ids_reference(values, offsets, limits):
    for s in range(len(offsets) - 1):
        seg = values[offsets[s]:offsets[s + 1]]
        if seg.size and seg.min() < 0:
            return s, NEGATIVE
        if seg.size and limits[s] >= 0 and seg.max() >= limits[s]:
            return s, TOO_LARGE
    return -1, OK


@given(st.lists(st.integers(-2, 40), max_size=60), st.data())
def test_check_ids_matches_numpy(ids, data):
    values = np.array(ids, np.int64)
    cuts = sorted(data.draw(st.lists(st.integers(0, values.size), max_size=3)))
    offsets = np.array([0, *cuts, values.size], np.int64)
    limits = np.array(data.draw(st.lists(st.sampled_from([-1, 5, 20, 41]),
                                         min_size=offsets.size - 1,
                                         max_size=offsets.size - 1)), np.int64)
    maxs = np.full(offsets.size - 1, -9, np.int64)
    got = check_ids(values, offsets, limits, maxs)
    assert tuple(got) == ids_reference(values, offsets, limits)
    if got[1] == OK:
        want = [int(values[a:b].max()) if b > a else -1 for a, b in zip(offsets, offsets[1:])]
        assert maxs.tolist() == want


def test_check_ids_extremes():
    maxs = np.zeros(1, np.int64)
    ends = np.array([0, 2], np.int64)
    assert tuple(check_ids(np.array([I64.max, 0], np.int64), ends, np.array([-1]), maxs)) \
        == (-1, OK)
    assert maxs[0] == I64.max
    assert tuple(check_ids(np.array([5, I64.min], np.int64), ends, np.array([-1]), maxs)) \
        == (0, NEGATIVE)


def test_offsets_computed_once_and_read_only():
    b = Batch(["a", "b", "c"], np.arange(6), [2, 0, 0, 1, 3, 0])
    off = b.key_offsets()
    assert off.tolist() == [0, 2, 3, 6] and off is b.key_offsets()
    with pytest.raises(ValueError):
        off[1] = 0
    assert b.feature_values("c").tolist() == [3, 4, 5]
    assert b.feature_values("b").tolist() == [2]


def test_int64_and_fitting_uint64_are_not_copied():
    v = np.arange(10, dtype=np.int64)
    assert np.shares_memory(Batch(["a"], v, [10]).values, v)
    u = np.arange(10, dtype=np.uint64)
    b = Batch(["a"], u, np.array([10], np.uint64))
    assert b.values.dtype == np.int64 and np.shares_memory(b.values, u)
    with pytest.raises(BatchError, match="does not fit in int64"):
        Batch(["a"], np.array([2 ** 63], np.uint64), [1])
    strided = np.arange(20, dtype=np.int64)[::2]
    assert Batch(["a"], strided, [10]).values.flags.c_contiguous


def test_length_errors_name_the_first_problem():
    with pytest.raises(BatchError, match=r"feature 'b'.*position 3.*length 9 \(sample 1\) "
                                         r"exceeds the 5 values"):
        Batch(["a", "b"], np.arange(5), [1, 2, 1, 9])
    with pytest.raises(BatchError, match=r"feature 'a'.*position 1.*negative length -1"):
        Batch(["a", "b"], np.arange(5), [1, -1, 1, 9])     # negative before too large
    with pytest.raises(BatchError, match="lengths sum to 12 but there are 4 values"):
        Batch(["a", "b", "c"], np.arange(4), [4, 4, 4])


def test_validation_names_the_first_bad_key_negative_first():
    s = StreamStats({"a": 10, "b": 10, "c": None})
    b = Batch(["a", "b", "c"], [1, 2, 30, -4, 5, -6], [2, 2, 2])
    with pytest.raises(BatchError, match=r"feature 'b'.*position 1.*negative ID -4 \(sample 0\)"):
        s.update(b)   # 'c' has a negative too, 'b' an ID out of range too: 'b', negative first
    ok = Batch(["a", "b", "c"], [1, 2, 9, 0, 5, I64.max], [2, 2, 2])
    parts = validate_batch(ok, s.table_configs)
    assert [(k, mx) for k, _, _, mx in parts] == [("a", 2), ("b", 9), ("c", I64.max)]
    assert all(np.shares_memory(ids, ok.values) for _, ids, _, _ in parts)
    with pytest.raises(BatchError, match=r"feature 'b'.*position 0.*ID 10 \(sample 0\) out of "
                                         r"range; expected < num_rows 10"):
        s.update(Batch(["a", "b", "c"], [1, 2, 10, 0, 5, 6], [2, 2, 2]))
    assert s.batches == 0 and s["a"].total == 0


def test_validation_with_empty_keys_and_new_keys():
    s = StreamStats({"a": 3}, auto_tables=True)
    b = Batch(["a", "new"], [7], [0, 1])
    with pytest.raises(BatchError, match=r"feature 'new'.*negative ID -7") as e:
        s.update(Batch(["a", "new"], [-7], [0, 1]))
    assert e.value is not None
    parts = validate_batch(b, s.table_configs, allow_new=True)
    assert [(k, ids.tolist(), mx) for k, ids, _, mx in parts] == [("a", [], -1), ("new", [7], 7)]
    with pytest.raises(BatchError, match=r"feature 'new'.*key not configured"):
        validate_batch(b, s.table_configs)


def test_weight_and_timestamp_errors_after_an_empty_key():
    with pytest.raises(BatchError, match=r"feature 'c'.*weights.*position 1.*NaN"):
        Batch(["a", "b", "c"], [1, 2], [1, 0, 1], weights=[1.0, np.nan])
    with pytest.raises(BatchError, match=r"feature 'a'.*position 0.*negative"):
        Batch(["a", "b", "c"], [1, 2], [1, 0, 1], weights=[-0.5, 1.0])
    for bad in (np.inf, -np.inf, np.nan):
        with pytest.raises(BatchError, match=r"timestamp.*position 1.*not a finite"):
            Batch(["a"], [1, 2, 3], [1, 1, 1], timestamp=[1.0, bad, 2.0])
    b = Batch(["a"], [1, 2], [1, 1], weights=[0.0, 2.0], timestamp=[1e308, -1e308])
    assert b.weights.dtype == np.float32 and b.timestamp.tolist() == [1e308, -1e308]


class _KJT(FakeKJT):
    """Three keys, two samples each, with weights and ``stride_per_key``."""

    def __init__(self, lengths=(1, 2, 0, 1, 3, 1)):
        n = int(np.sum(lengths))
        super().__init__(["a", "b", "c"], np.arange(n, dtype=np.int64) * 10,
                         np.array(lengths, np.int64), np.arange(n, dtype=np.float32))

    def stride_per_key(self):
        return [2, 2, 2]


def test_from_kjt_whole_views_subset_in_order():
    kjt = _KJT()
    whole = Batch.from_kjt(kjt)
    assert np.shares_memory(whole.values, kjt._v) and np.shares_memory(whole.lengths, kjt._l)
    assert whole.key_offsets().tolist() == [0, 3, 4, 8]
    sub = Batch.from_kjt(kjt, keys=["c", "a"])
    assert sub.keys == ("c", "a")
    assert sub.values.tolist() == [40, 50, 60, 70, 0, 10, 20]
    assert sub.lengths.tolist() == [3, 1, 1, 2]
    assert sub.weights.tolist() == [4, 5, 6, 7, 0, 1, 2]
    adjacent = Batch.from_kjt(kjt, keys=["b", "c"])
    assert adjacent.values.tolist() == [30, 40, 50, 60, 70]
    assert np.shares_memory(adjacent.values, kjt._v)
    with pytest.raises(BatchError, match=r"feature 'b'.*negative length"):
        Batch.from_kjt(_KJT((1, 2, 0, -1, 3, 1)))
