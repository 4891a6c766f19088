"""Top-k recall of the default sketches on the real streams in ../shared/data, against exact counts."""
import numpy as np
import pytest

from flexshard_stream import StreamStats, TableStats
from flexshard_stream.stats.batch import Batch


def _streams(shared_data):
    from flexshard_stream.sources import datasets
    return {"movielens_movies": datasets.movielens_stream(),
            "amazon_beauty_items": datasets.amazon_stream("Beauty"),
            "amazon_sports_items": datasets.amazon_stream("Sports"),
            "amazon_toys_items": datasets.amazon_stream("Toys"),
            "criteo_categorical": datasets.criteo_stream()}


def recall_at(ts, ids, k):
    true = np.bincount(ids) if ids.max() < 10**8 else None
    if true is None:
        u, c = np.unique(ids, return_counts=True)
        order = np.lexsort((u, -c))
        kth = c[order[k - 1]]
        got = ts.top(k)[0]
        lookup = dict(zip(u.tolist(), c.tolist()))
        return float(np.mean([lookup.get(int(g), 0) >= kth for g in got]))
    order = np.argsort(-true, kind="stable")
    kth = true[order[k - 1]]
    got = ts.top(k)[0]
    return float(np.mean(true[got] >= kth))  # ties at the k-th count: any of them is correct


@pytest.mark.parametrize("name", ["movielens_movies", "amazon_beauty_items", "amazon_sports_items",
                                  "amazon_toys_items", "criteo_categorical"])
def test_topk_recall_default_sizes(shared_data, name):
    ids = np.ascontiguousarray(_streams(shared_data)[name], dtype=np.int64)
    ts = TableStats(name).update(ids)        # row count unknown: sketched with the defaults
    assert not ts.exact
    assert ts.exact_phase                    # 7,639-18,357 rows: all fit, all counted exactly
    assert np.array_equal(ts.estimate(np.unique(ids)), np.unique(ids, return_counts=True)[1])
    k = min(1000, np.unique(ids).size)
    assert recall_at(ts, ids, k) >= 0.99
    # bounds hold for every row, and no row above the heavy-hitter threshold is missing
    u, c = np.unique(ids, return_counts=True)
    _, lo, hi = ts.bounds(u)
    assert np.all(lo <= c) and np.all(c <= hi)
    tracked = np.isin(u, ts.top(ts.tracked_capacity)[0])
    assert np.all(tracked[c > ts.max_error])
    d = ts.distinct()[0]
    assert abs(d - u.size) / u.size < 0.05


def test_movielens_through_batches_and_windows(shared_data):
    from flexshard_stream import WindowedStats
    from flexshard_stream.sources import datasets
    df = datasets.movielens_ratings()
    movies = df["movie"].to_numpy().astype(np.int64)
    ts = df["ts"].to_numpy()
    st = StreamStats({"movie": None})
    win = WindowedStats({"movie": None}, window=365 * 86400, slots=12, unit="seconds")
    for s in range(0, movies.size, 4096):
        b = Batch(["movie"], movies[s:s + 4096], np.ones(min(4096, movies.size - s), np.int64),
                  timestamp=ts[s:s + 4096])
        st.update(b)
        win.update(b)
    assert st["movie"].total == movies.size
    recent = win.view()
    last_year = movies[ts > ts.max() - 365 * 86400 + 365 * 86400 / 12]
    assert recent["movie"].total >= last_year.size
    assert recent["movie"].total < movies.size / 2
    # the window's hottest movies are the recent ones, not the all-time ones
    w_top = set(recent["movie"].top(20)[0].tolist())
    u, c = np.unique(last_year, return_counts=True)
    recent_top = set(u[np.argsort(-c)[:20]].tolist())
    assert len(w_top & recent_top) >= 15
