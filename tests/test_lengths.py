"""Sequence lengths: short lengths counted exactly in a histogram, long ones in the KLL sketch, one
quantile over both (docs/STATISTICS.md, "Sequence lengths")."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexshard_stream import FormatError, SketchConfig, TableStats
from flexshard_stream.formats.container import pack, unpack
from flexshard_stream.stats.table_stats import LENGTH_HISTOGRAM

QS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


def kll_quantile(lengths, q):
    """The smallest length with more than ``q`` of the samples at or below it (KLL's definition,
    the largest for ``q = 1``), exactly."""
    v = np.sort(lengths)
    return float(v[min(int(np.floor(q * v.size)), v.size - 1)])


def table_of(lengths, config=None, batches=1):
    """A table fed ``lengths`` (one ID per length unit: IDs 0..), in ``batches`` batches."""
    t = TableStats("t", 1000, config)
    for part in np.array_split(np.asarray(lengths, np.int64), batches):
        t.update(np.zeros(int(part.sum()), np.int64), part)
    return t


@given(st.lists(st.integers(0, LENGTH_HISTOGRAM - 1), min_size=1, max_size=3000),
       st.integers(1, 5))
def test_short_lengths_give_exact_quantiles_however_batched(lengths, batches):
    t = table_of(lengths, batches=min(batches, len(lengths)))
    got = t.length_quantiles(QS)
    assert got == {str(q): kll_quantile(np.array(lengths), q) for q in QS}
    assert t.mean_length == pytest.approx(np.mean(lengths))


def test_mixed_lengths_are_exact_below_the_histogram_and_near_beyond():
    rng = np.random.default_rng(3)
    lengths = np.concatenate([rng.integers(0, 10, 70_000), rng.integers(64, 500, 30_000)])
    rng.shuffle(lengths)
    got = table_of(lengths, batches=10).length_quantiles(QS)
    for q in QS:
        want = kll_quantile(lengths, q)
        if q < 0.7:
            assert got[str(q)] == want
        else:   # the KLL part: rank within its error (1.65% at k = 200), 3x for safety
            rank = np.mean(lengths <= got[str(q)])
            assert abs(rank - q) <= 0.05 or got[str(q)] == want


def test_a_kll_only_file_stays_version_2_and_a_histogram_makes_it_4():
    long_only = table_of(np.full(100, 80))
    assert unpack(long_only.to_bytes(), "TableStats")[0]["stats_version"] == 2
    short = table_of(np.full(100, 3))
    meta, arrays = unpack(short.to_bytes(), "TableStats")
    assert meta["stats_version"] == 4 and meta["exact_phase"] is False
    assert int(arrays["length_hist"][3]) == 100
    back = TableStats.from_bytes(short.to_bytes())
    assert back.to_bytes() == short.to_bytes()
    assert back.length_quantiles() == short.length_quantiles() == {"0.5": 3.0, "0.9": 3.0,
                                                                   "0.99": 3.0}


def test_merge_adds_the_histograms():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 64, 5000), rng.integers(0, 40, 3000)
    merged = table_of(a).merge(table_of(b))
    assert merged.length_quantiles(QS) == table_of(np.concatenate([a, b])).length_quantiles(QS)


def test_sampled_ingestion_counts_one_sample_in_k():
    t = table_of(np.full(40_000, 2), SketchConfig(sample_k=8))
    assert int(t._length_hist.sum()) == 40_000 // 8 and t.samples == 40_000
    assert t.length_quantiles() == {"0.5": 2.0, "0.9": 2.0, "0.99": 2.0}


def test_loaded_histogram_is_validated():
    t = table_of(np.full(50, 3))

    def repacked(**changes):
        meta, arrays = unpack(t.to_bytes(), "TableStats")
        for k, v in changes.items():
            (arrays if k in arrays else meta)[k] = v
        return pack("TableStats", meta, arrays)

    with pytest.raises(FormatError, match="'length_hist' has shape"):
        TableStats.from_bytes(repacked(length_hist=np.zeros(8, np.uint64)), "crafted.fss")
    with pytest.raises(FormatError, match="'exact_phase' is None"):
        TableStats.from_bytes(repacked(exact_phase=None), "crafted.fss")
