"""Tests of flexshard_stream.sources.datasets against the facts in ../shared/data/README.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flexshard_stream import LogError
from flexshard_stream.sources import datasets as ds
from flexshard_stream.sources.logs import LogReader, inspect_log, log_max_ids, read_log

try:
    DATA = ds.shared_data_dir()
except ds.DatasetNotFoundError as e:  # the real data sits beside the repository in CI
    pytest.skip(f"shared data absent: {e}", allow_module_level=True)


def top1_share(ids: np.ndarray) -> float:
    """Share of accesses that go to the top 1% of distinct IDs."""
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    k = max(1, round(0.01 * counts.size))
    return float(counts[:k].sum() / counts.sum())


def flatten(batches: list) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    keys = batches[0].keys
    return {k: (np.concatenate([b.feature_values(k) for b in batches]),
                np.concatenate([b.feature_lengths(k) for b in batches])) for k in keys}


# ----------------------------------------------------------------------------- location
def test_shared_data_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ds.ENV_VAR, str(DATA))
    assert ds.shared_data_dir() == DATA
    monkeypatch.setenv(ds.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(ds.DatasetNotFoundError, match="FLEXSHARD_SHARED_DATA"):
        ds.shared_data_dir()
    monkeypatch.setenv(ds.ENV_VAR, str(tmp_path))             # exists but holds no data
    with pytest.raises(FileNotFoundError, match="ratings.csv"):
        ds.movielens_ratings()
    monkeypatch.delenv(ds.ENV_VAR)
    assert (ds.shared_data_dir() / "movielens-latest-small" / "ratings.csv").is_file()


# ----------------------------------------------------------------------------- MovieLens
def test_movielens_counts_and_time_order() -> None:
    df = ds.movielens_ratings()
    assert df.columns == ["ts", "user", "movie"]
    assert [str(t) for t in df.dtypes] == ["Float64", "Int64", "Int64"]
    assert df.height == 100_836
    assert df["movie"].n_unique() == 9_724 and df["user"].n_unique() == 610
    ts = df["ts"].to_numpy()
    assert np.all(np.diff(ts) >= 0)
    assert 820e6 < ts[0] < 830e6 and 1.53e9 < ts[-1] < 1.54e9       # 1996 .. 2018
    # the file is ordered by user, not time: sorting changed the order
    raw = np.loadtxt(DATA / "movielens-latest-small" / "ratings.csv", delimiter=",",
                     skiprows=1, usecols=(1, 3), dtype=np.int64)
    assert not np.all(np.diff(raw[:, 1]) >= 0)
    stream = ds.movielens_stream()
    assert stream.dtype == np.int64 and stream.size == 100_836
    order = np.argsort(raw[:, 1], kind="stable")
    assert np.array_equal(stream, raw[order, 0])
    assert 0.14 < top1_share(stream) < 0.18                         # README: 16%


# ----------------------------------------------------------------------------- Amazon
@pytest.mark.parametrize("name,events,users", [("Beauty", 198_502, 22_363),
                                               ("Sports_and_Outdoors", 296_337, 35_598),
                                               ("Toys_and_Games", 167_597, 19_412)])
def test_amazon_counts(name: str, events: int, users: int) -> None:
    values, lengths = ds.amazon_sequences(name)
    assert values.dtype == np.int64 and lengths.dtype == np.int64
    assert values.size == events and lengths.size == users and lengths.sum() == events
    assert 8 <= values.size / lengths.size <= 10                    # README: mean history 8-10
    items = np.unique(values)
    assert 11_500 <= items.size <= 18_500                           # README: 12k-18k items
    assert items[0] == 1 and items[-1] == items.size                # item IDs are 1..N
    assert np.array_equal(ds.amazon_stream(name), values)


def test_amazon_matches_plain_parse_and_aliases() -> None:
    lines = (DATA / "amazon-reviews-sequences" / "Toys_and_Games.txt").read_text().splitlines()
    seqs = [[int(x) for x in line.split()[1:]] for line in lines if line.strip()]
    values, lengths = ds.amazon_sequences("toys")
    assert lengths.tolist() == [len(s) for s in seqs]
    assert values.tolist() == [x for s in seqs for x in s]
    assert 0.06 < top1_share(values) < 0.14                         # README: about 10%
    with pytest.raises(ValueError, match="unknown Amazon"):
        ds.amazon_sequences("Books")


# ----------------------------------------------------------------------------- Criteo
def plain_criteo() -> list[list[str]]:
    rows = []
    for line in (DATA / "criteo-1k" / "train.txt").read_text().split("\n"):
        if line:
            f = line.split("\t")
            rows.append(f + [""] * (40 - len(f)))
    return rows


def test_criteo_categorical() -> None:
    rows = plain_criteo()
    assert len(rows) == 1_000
    cats = ds.criteo_categorical()
    assert list(cats) == [f"C{i}" for i in range(1, 27)]
    for j, c in enumerate(cats):
        expect = [int(r[14 + j], 16) for r in rows if r[14 + j]]
        assert cats[c].dtype == np.int64 and cats[c].tolist() == expect, c
    assert any(cats[c].size < 1_000 for c in cats)                 # some fields have gaps
    frame = ds.criteo_frame()
    assert frame.height == 1_000 and frame.width == 40
    assert frame["label"].to_list() == [int(r[0]) for r in rows]


def test_criteo_stream_pooled_distinct_per_field() -> None:
    rows = plain_criteo()
    expect = [(j << 32) | int(r[14 + j], 16) for r in rows for j in range(26) if r[14 + j]]
    stream = ds.criteo_stream()
    assert stream.tolist() == expect                                 # row-major, time order
    fields = stream >> 32
    assert fields.min() == 0 and fields.max() == 25
    # the same hash in two fields stays two IDs
    cats = ds.criteo_categorical()
    assert np.unique(stream).size == sum(np.unique(v).size for v in cats.values())
    assert 0.40 < top1_share(stream) < 0.52                          # README: 46%


# ----------------------------------------------------------------------------- logs
@pytest.mark.parametrize("ext", [".parquet", ".csv"])
def test_movielens_log(tmp_path: Path, ext: str) -> None:
    p = ds.write_dataset_log("movielens", tmp_path / f"ml{ext}")
    reader = LogReader(p, read_batch_size=30_000)
    assert reader.schema.features == {"movie": "single", "user": "single"}
    batches = list(reader)
    assert [b.batch_size for b in batches] == [30_000] * 3 + [10_836]
    got = flatten(batches)
    df = ds.movielens_ratings()
    assert np.array_equal(got["movie"][0], df["movie"].to_numpy())
    assert np.array_equal(got["user"][0], df["user"].to_numpy())
    ts = np.concatenate([b.timestamp for b in batches])
    assert np.array_equal(ts, df["ts"].to_numpy())
    assert log_max_ids(p) == {"movie": int(df["movie"].max()), "user": 610}


@pytest.mark.parametrize("ext", [".parquet", ".csv"])
def test_amazon_log(tmp_path: Path, ext: str) -> None:
    p = ds.write_dataset_log("amazon-sports", tmp_path / f"az{ext}")
    assert inspect_log(p).features == {"item": "sequence"}
    got = flatten(list(read_log(p, read_batch_size=10_000)))
    values, lengths = ds.amazon_sequences("Sports_and_Outdoors")
    assert np.array_equal(got["item"][0], values)
    assert np.array_equal(got["item"][1], lengths)


@pytest.mark.parametrize("ext", [".parquet", ".csv"])
def test_criteo_log(tmp_path: Path, ext: str) -> None:
    p = ds.write_dataset_log("criteo", tmp_path / f"cr{ext}")
    cats = ds.criteo_categorical()
    got = flatten(list(read_log(p, read_batch_size=300, null_as_empty=True)))
    assert list(got) == list(cats)
    for c in cats:
        assert np.array_equal(got[c][0], cats[c]), c
        assert got[c][1].size == 1_000 and got[c][1].sum() == cats[c].size
    with pytest.raises(LogError, match="null ID"):
        list(read_log(p))
    reader = LogReader(p, skip_bad_rows=True)
    rows = sum(b.batch_size for b in reader)
    assert rows + reader.skipped["null_id"] == 1_000 and 0 < rows < 1_000


def test_write_dataset_log_rejects_unknown(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown data set"):
        ds.write_dataset_log("netflix", tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="extension"):
        ds.write_dataset_log("criteo", tmp_path / "x.json")
