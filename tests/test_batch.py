import numpy as np
import pytest
from conftest import FakeKJT

from flexshard_stream import Batch, BatchError, StreamStats


def make(**kw):
    d = dict(keys=["a", "b"], values=np.array([1, 2, 3, 4, 5], np.int64),
             lengths=np.array([1, 2, 1, 1], np.int64))
    d.update(kw)
    return Batch(d.pop("keys"), d.pop("values"), d.pop("lengths"), **d)


def test_layout_views():
    b = make()
    assert b.batch_size == 2
    assert list(b.feature_values("a")) == [1, 2, 3]
    assert list(b.feature_values("b")) == [4, 5]
    assert list(b.feature_lengths("b")) == [1, 1]
    assert list(b.key_offsets()) == [0, 3, 5]


def test_int32_widened():
    b = make(values=np.array([1, 2, 3, 4, 5], np.int32))
    assert b.values.dtype == np.int64


@pytest.mark.parametrize("values,match", [
    (np.array([1.0, 2, 3, 4, 5]), "must be integers"),
    (np.array([1, 2, 3, 4, "x"], dtype=object), "must be integers"),
])
def test_float_and_object_ids_rejected(values, match):
    with pytest.raises(BatchError, match=match):
        make(values=values)


def test_negative_length():
    with pytest.raises(BatchError, match=r"feature 'b'.*position 3.*negative length"):
        make(lengths=np.array([1, 2, 3, -1]))


def test_lengths_do_not_add_up():
    with pytest.raises(BatchError, match="lengths sum to 6 but there are 5 values"):
        make(lengths=np.array([1, 2, 2, 1]))


def test_lengths_not_multiple_of_keys():
    with pytest.raises(BatchError, match="not a multiple of 2 keys"):
        make(lengths=np.array([1, 2, 2]))


def test_weights_checked():
    with pytest.raises(BatchError, match=r"feature 'b'.*weights.*position 4.*NaN"):
        make(weights=np.array([1, 1, 1, 1, np.nan], np.float32))
    with pytest.raises(BatchError, match=r"feature 'a'.*position 1.*negative"):
        make(weights=np.array([1, -1, 1, 1, 1], np.float32))
    with pytest.raises(BatchError, match="4 weights for 5 values"):
        make(weights=np.ones(4))


def test_timestamp_shape():
    make(timestamp=3.0)
    make(timestamp=[1.0, 2.0])
    with pytest.raises(BatchError, match="timestamp"):
        make(timestamp=[1.0, 2.0, 3.0])


def test_duplicate_key():
    with pytest.raises(BatchError, match="duplicate key"):
        make(keys=["a", "a"])


def test_negative_id_names_feature_position_sample():
    s = StreamStats({"a": None, "b": None})
    with pytest.raises(BatchError, match=r"feature 'b'.*values.*position 1.*negative ID -5 \(sample 1\)"):
        s.update(make(values=np.array([1, 2, 3, 4, -5])))


def test_id_out_of_range():
    s = StreamStats({"a": 3, "b": None})
    with pytest.raises(BatchError, match=r"feature 'a'.*position 2.*ID 3 \(sample 1\) out of range.*< num_rows 3"):
        s.update(make())


def test_key_not_configured():
    s = StreamStats({"a": None})
    with pytest.raises(BatchError, match=r"feature 'b'.*key not configured"):
        s.update(make())


def test_rejected_batch_changes_nothing():
    s = StreamStats({"a": 100, "b": None})
    s.update(make())
    before = s.to_bytes()
    for bad in (make(values=np.array([1, 2, 3, 4, -1])),
                make(values=np.array([1, 2, 300, 4, 5])),
                make(keys=["a", "zz"])):
        with pytest.raises(BatchError):
            s.update(bad)
        assert s.to_bytes() == before


def test_empty_batch_is_noop():
    s = StreamStats({"a": None, "b": None})
    before = s.to_bytes()
    s.update(Batch.empty(["a", "b"]))
    s.update(Batch.empty())
    assert s.to_bytes() == before
    assert s.batches == 0


def test_from_features_and_kjt_like():
    b = Batch.from_features({"seq": [[1, 2], [3]], "one": np.array([7, 8])})
    assert list(b.lengths) == [2, 1, 1, 1]

    # the KeyedJaggedTensor accessors, backed by DLPack-capable numpy arrays
    k = FakeKJT(["seq", "one"], np.array([1, 2, 3, 7, 8], np.int64),
                np.array([2, 1, 1, 1], np.int64))
    vals = k.values()
    b2 = Batch.from_dlpack(k.keys(), vals, k.lengths())
    assert np.shares_memory(b2.values, vals)  # zero-copy for int64
    b3 = Batch.from_kjt(k)
    assert list(b3.values) == list(b.values)


def test_from_torch_kjt_zero_copy():
    torch = pytest.importorskip("torch")
    v = torch.tensor([1, 2, 3], dtype=torch.int64)
    b = Batch.from_dlpack(["a"], v, torch.tensor([2, 1]))
    v[0] = 42
    assert b.values[0] == 42


def test_read_only_arrays_are_accepted():
    """Arrays from arrow/polars or loaders are often read-only views; updates must not need to write."""
    v = np.array([1, 2, 3], np.int64)
    lens = np.array([2, 1], np.int64)
    v.setflags(write=False)
    lens.setflags(write=False)
    s = StreamStats()
    s.update(Batch(["a"], v, lens))
    assert s["a"].total == 3 and s["a"].length_quantiles()["0.5"] in (1.0, 2.0)
