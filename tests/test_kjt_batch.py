"""Batch.from_kjt on real TorchRec KeyedJaggedTensors: zero-copy where the dtype allows (same data
pointer), int32 widened, weights, KJTs built from offsets, and a variable batch per feature (refused
with the features' batch sizes unless the features of one batch size are taken on their own).
Skipped without TorchRec."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import SHARED
from flexshard_stream.errors import BatchError
from flexshard_stream.sources import datasets
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.stream import StreamStats

torch = pytest.importorskip("torch")
jagged = pytest.importorskip("torchrec.sparse.jagged_tensor")
KJT = jagged.KeyedJaggedTensor


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.fixture(scope="module")
def movielens():
    """Users' last 5 movies (sequence) and the user (one ID) of 16 MovieLens users."""
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    r = datasets.movielens_ratings(SHARED / "movielens-latest-small")
    users = r.get_column("user").to_numpy()
    movies = r.get_column("movie").to_numpy()
    hist, lens = [], []
    for u in np.unique(users)[:16]:
        h = movies[users == u][-5:]
        hist.append(h)
        lens.append(h.size)
    return np.concatenate(hist), np.array(lens), np.unique(users)[:16]


def _kjt(movielens, dtype=torch.int64, weights=True):
    hist, lens, users = movielens
    values = torch.from_numpy(np.concatenate([hist, users]).astype(np.int64)).to(dtype)
    lengths = torch.from_numpy(np.concatenate([lens, np.ones(users.size, np.int64)])).to(dtype)
    w = torch.rand(values.numel()) + 0.5 if weights else None
    return KJT(keys=["movie", "user"], values=values, lengths=lengths, weights=w)


def test_int64_kjt_is_viewed_not_copied(movielens):
    kjt = _kjt(movielens)
    b = Batch.from_kjt(kjt)
    assert _ptr(b.values) == kjt.values().data_ptr()
    assert _ptr(b.lengths) == kjt.lengths().data_ptr()
    assert _ptr(b.weights) == kjt.weights().data_ptr()
    assert b.keys == ("movie", "user") and b.batch_size == 16
    np.testing.assert_array_equal(b.feature_values("user"), movielens[2])
    kjt.values()[0] = 7          # the same memory
    assert b.values[0] == 7


def test_int32_kjt_is_widened(movielens):
    kjt = _kjt(movielens, torch.int32, weights=False)
    b = Batch.from_kjt(kjt)
    assert b.values.dtype == np.int64 and b.lengths.dtype == np.int64
    assert _ptr(b.values) != kjt.values().data_ptr()          # one copy: int32 -> int64
    np.testing.assert_array_equal(b.values, kjt.values().numpy())
    assert b.weights is None


def test_kjt_from_offsets(movielens):
    """A KJT built from offsets: TorchRec computes the lengths (a copy); values stay shared."""
    full = _kjt(movielens)
    kjt = KJT(keys=full.keys(), values=full.values(), offsets=full.offsets())
    b = Batch.from_kjt(kjt)
    assert _ptr(b.values) == full.values().data_ptr()
    np.testing.assert_array_equal(b.lengths, full.lengths().numpy())


def test_variable_batch_per_feature(movielens):
    """A KJT whose features have different batch sizes (TorchRec's variable stride per key) is
    refused naming each feature's batch size, even when its lengths happen to split evenly;
    the features of one batch size convert on their own (adjacent ones as views)."""
    hist, lens, users = movielens
    values = torch.from_numpy(np.concatenate([hist, users[:4]]))
    lengths = torch.from_numpy(np.concatenate([lens, np.ones(4, np.int64)]))
    kjt = KJT(keys=["movie", "user"], values=values, lengths=lengths,
              stride_per_key_per_rank=[[16], [4]])
    assert lengths.numel() % 2 == 0          # 20 lengths: 2 x 10 would be a wrong reading
    with pytest.raises(BatchError, match=r"variable batch size per feature \(movie: 16, user: 4 "
                                         r"samples\).*Batch.from_kjt\(kjt, keys="):
        Batch.from_kjt(kjt)
    movie = Batch.from_kjt(kjt, keys=["movie"])
    user = Batch.from_kjt(kjt, keys=["user"])
    assert movie.batch_size == 16 and user.batch_size == 4
    np.testing.assert_array_equal(user.values, users[:4])
    assert _ptr(movie.values) == values.data_ptr()
    assert _ptr(user.values) == values.data_ptr() + 8 * hist.size     # a view, not a copy
    with pytest.raises(BatchError, match=r"keys \['item'\] are not in"):
        Batch.from_kjt(kjt, keys=["item"])


def test_kjt_subset_and_order(movielens):
    kjt = _kjt(movielens)
    b = Batch.from_kjt(kjt, keys=["user", "movie"])            # not adjacent in order: a copy
    assert b.keys == ("user", "movie")
    np.testing.assert_array_equal(b.feature_values("movie"), movielens[0])
    np.testing.assert_array_equal(b.weights[:16], kjt.weights().numpy()[-16:])


def test_kjt_on_another_device_is_refused():
    kjt = KJT(keys=["a"], values=torch.empty(3, dtype=torch.int64, device="meta"),
              lengths=torch.empty(3, dtype=torch.int64, device="meta"))
    with pytest.raises(BatchError, match="on meta; give the CPU tensors"):
        Batch.from_kjt(kjt)


def test_kjt_feeds_the_statistics(movielens):
    stats = StreamStats(auto_tables=True)
    stats.update(Batch.from_kjt(_kjt(movielens, torch.int32)))
    assert stats.samples == 16 and stats.ids == movielens[0].size + 16
