"""Tests of the synthetic trace generator (flexshard_stream.sources.synth)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexshard_stream import Batch, ConfigError, FormatError, LogError
from flexshard_stream.sources import synth as S

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FLEXSHARD_SHARED_DATA", REPO.parent / "shared" / "data"))
STATS_2022 = SHARED / "dlrm-locality-stats" / "locality_stats_2022.txt"


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) by Wilson-Hilferty; z = 3.719 is the 1 - 1e-4 normal
    quantile, so a correct sampler fails a seeded test with probability about 1e-4."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi2_head(ranks: np.ndarray, k: int, num_rows: int, alpha: float) -> float:
    """Chi-square statistic of the k head ranks plus one 'rest' bin against the exact pmf."""
    p = S.zipf_pmf_head(k, num_rows, alpha)
    p = np.append(p, 1.0 - p.sum())
    obs = np.bincount(np.minimum(ranks, k), minlength=k + 1).astype(float)
    exp = p * ranks.size
    return float(((obs - exp) ** 2 / exp).sum())


# ------------------------------------------------------------------------------------------ Zipf
@pytest.mark.parametrize("alpha", [0.8, 1.05, 1.2])
def test_zipf_matches_exact_pmf_on_head(alpha):
    # 2,000,000 draws, 30 head ranks + rest (df = 30): every expected count is >= 4,000, so the
    # chi-square approximation holds; the critical value is the 1 - 1e-4 quantile. This many draws
    # also catch a sampler that skips the rejection step (plain inversion of the continuous hat puts
    # about 1-2% too much mass on ranks 1 and 2).
    n, k, rows = 2_000_000, 30, 1_000_000
    r = S.zipf_ranks(n, rows, alpha, np.random.default_rng(123))
    crit = chi2_critical(k)
    assert chi2_head(r, k, rows, alpha) < crit
    # ... and the same statistic does detect a sampler that is off by 0.03 in the exponent
    assert chi2_head(r, k, rows, alpha + 0.03) > crit
    # rank 0 within 5 standard errors of its exact probability
    p0 = S.zipf_pmf_head(1, rows, alpha)[0]
    assert abs(np.mean(r == 0) - p0) < 5 * math.sqrt(p0 * (1 - p0) / n)


def test_zipf_small_table_whole_support():
    rows, alpha, n = 7, 0.5, 100_000
    r = S.zipf_ranks(n, rows, alpha, np.random.default_rng(5))
    p = S.zipf_pmf_head(rows, rows, alpha)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    obs = np.bincount(r, minlength=rows)
    assert obs.size == rows  # nothing out of range
    stat = float(((obs - n * p) ** 2 / (n * p)).sum())
    assert stat < chi2_critical(rows - 1)


def test_zipf_huge_table_tail():
    # num_rows = 1e10 with O(1) memory; for alpha = 0.8 a third of the mass lies beyond rank 1e9:
    # P(rank >= 1e9) = 1 - H(1e9) / H(1e10), checked to 5 standard errors.
    rows, alpha, n = 10 ** 10, 0.8, 100_000
    r = S.zipf_ranks(n, rows, alpha, np.random.default_rng(9))
    assert r.dtype == np.int64 and r.min() >= 0 and r.max() < rows
    q = 1.0 - S.zipf_normalizer(10 ** 9, alpha) / S.zipf_normalizer(rows, alpha)
    assert 0.3 < q < 0.45
    assert abs(np.mean(r >= 10 ** 9) - q) < 5 * math.sqrt(q * (1 - q) / n)
    assert chi2_head(r, 10, rows, alpha) < chi2_critical(10)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), rows=st.integers(1, 2 ** 62), alpha=st.floats(0.0, 4.0),
       seed=st.integers(0, 2 ** 32))
def test_zipf_in_range_and_seeded(n, rows, alpha, seed):
    r = S.zipf_ranks(n, rows, alpha, np.random.default_rng(seed))
    assert r.shape == (n,) and r.dtype == np.int64
    if n:
        assert r.min() >= 0 and r.max() < rows
    assert np.array_equal(r, S.zipf_ranks(n, rows, alpha, np.random.default_rng(seed)))


def test_zipf_normalizer_euler_maclaurin_matches_exact_sum():
    for alpha in (0.0, 0.5, 0.8, 1.0, 1.05, 1.2, 2.5):
        exact = S.zipf_normalizer(2_000_000, alpha, head=1 << 20)   # summed term by term
        approx = S.zipf_normalizer(2_000_000, alpha, head=100)      # head + Euler-Maclaurin tail
        assert approx == pytest.approx(exact, rel=1e-12)
    # harmonic number asymptotics: H(1e10, 1) = ln(1e10) + gamma + 1/(2e10) - ...
    euler_gamma = 0.5772156649015329
    assert S.zipf_normalizer(10 ** 10, 1.0) == pytest.approx(
        math.log(1e10) + euler_gamma + 0.5e-10, rel=1e-14)


def test_zipf_bad_parameters():
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="alpha"):
        S.zipf_ranks(10, 100, -0.1, rng)
    with pytest.raises(ConfigError, match="num_rows"):
        S.zipf_ranks(10, 0, 1.0, rng)
    with pytest.raises(ConfigError, match="num_rows"):
        S.zipf_ranks(10, -5, 1.0, rng)
    with pytest.raises(ConfigError, match="n "):
        S.zipf_ranks(-1, 100, 1.0, rng)
    with pytest.raises(ConfigError, match="alpha"):
        S.zipf_pmf_head(3, 10, float("nan"))
    with pytest.raises(ConfigError, match="k "):
        S.zipf_pmf_head(11, 10, 1.0)


# ----------------------------------------------------------------------------------- permutation
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 100, 1000, 1024, 1025, 4097, 65536])
def test_permutation_is_a_bijection(rows):
    p = S.IdPermutation(rows, seed=42)
    x = np.arange(rows)
    f = p.forward(x)
    assert f.dtype == np.int64
    assert np.array_equal(np.sort(f), x)
    assert np.array_equal(p.inverse(f), x)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3000), seed=st.integers(0, 2 ** 63))
def test_permutation_bijection_property(rows, seed):
    p = S.IdPermutation(rows, seed)
    f = p.forward(np.arange(rows))
    assert np.array_equal(np.bincount(f, minlength=rows), np.ones(rows, dtype=np.int64))
    assert np.array_equal(p.inverse(f), np.arange(rows))


@pytest.mark.parametrize("rows", [10 ** 10, 2 ** 62, 2 ** 61 + 12345])
def test_permutation_huge_round_trip(rows):
    p = S.IdPermutation(rows, seed=3)
    x = np.random.default_rng(1).integers(0, rows, 50_000)
    f = p.forward(x)
    assert f.min() >= 0 and f.max() < rows
    assert np.array_equal(p.inverse(f), x)
    assert np.unique(f).size == np.unique(x).size


def test_permutation_scatters_hot_rows_and_depends_on_seed():
    rows = 1_000_000
    hot = S.IdPermutation(rows, seed=1).forward(np.arange(1000))
    # identity would put all 1000 hot rows below 1000; a random map puts about 1 there
    assert np.sum(hot < 10_000) < 40
    assert 0.3 * rows < np.median(hot) < 0.7 * rows
    other = S.IdPermutation(rows, seed=2).forward(np.arange(1000))
    assert np.mean(hot == other) < 0.01
    with pytest.raises(ConfigError, match="ranks must be in"):
        S.IdPermutation(rows, 1).forward(np.array([rows]))
    with pytest.raises(ConfigError, match="ids must be in"):
        S.IdPermutation(rows, 1).inverse(np.array([-1]))


# ---------------------------------------------------------------------------------------- lengths
@pytest.mark.parametrize("dist,mean,cap", [("fixed", 3, None), ("geometric", 6.0, None),
                                           ("poisson", 2.5, None), ("lognormal", 40.0, 10_000)])
def test_length_means(dist, mean, cap):
    n = 200_000
    lens = S.sample_lengths(n, dist, mean, np.random.default_rng(0), cap, sigma=0.8)
    assert lens.dtype == np.int64 and lens.min() >= (0 if dist == "poisson" else 1)
    # the standard error of the mean is below mean / 100 for every case; allow 5 of them
    assert abs(lens.mean() - mean) < 5 * lens.std() / math.sqrt(n) + 0.01
    if dist == "fixed":
        assert np.all(lens == mean)


def test_length_cap_and_bad_parameters():
    lens = S.sample_lengths(50_000, "lognormal", 500.0, np.random.default_rng(1), max_length=600)
    assert lens.max() == 600 and lens.min() >= 1
    for kw in ({"dist": "lognormal", "mean": 0.0}, {"dist": "poisson", "mean": -1.0},
               {"dist": "fixed", "mean": 2.5}, {"dist": "geometric", "mean": 0.5},
               {"dist": "zipf", "mean": 3.0}, {"dist": "lognormal", "mean": 3.0, "sigma": 0.0},
               {"dist": "poisson", "mean": 3.0, "max_length": 0}):
        with pytest.raises(ConfigError):
            S.sample_lengths(10, rng=0, **kw)


def test_table_spec_validation():
    with pytest.raises(ConfigError, match="num_rows"):
        S.TableSpec("t", -10, 1.0)
    with pytest.raises(ConfigError, match="alpha"):
        S.TableSpec("t", 10, -0.5)
    with pytest.raises(ConfigError, match="mean length"):
        S.TableSpec("t", 10, 1.0, "sequence", "lognormal", 0.0)
    with pytest.raises(ConfigError, match="kind"):
        S.TableSpec("t", 10, 1.0, "dense")
    with pytest.raises(ConfigError, match="name"):
        S.TableSpec("", 10, 1.0)
    with pytest.raises(ConfigError, match="table 'x'"):
        S.TableSpec("x", 10, 1.0, length="weibull")
    assert S.TableSpec("t", 10, 1.0).single_id
    assert not S.TableSpec("t", 10, 1.0, "sequence").single_id


# ------------------------------------------------------------------------------------- generation
TABLES = (
    S.TableSpec("hist", 100_000, 1.05, "sequence", "lognormal", 20.0, 64, 0.8),
    S.TableSpec("tok", 5_000, 0.9, "sequence", "poisson", 3.0, 16),
    S.TableSpec("ad", 10 ** 10, 0.8, "pooled", "fixed", 1.0),
)


def concat(batches):
    bs = list(batches)
    keys = bs[0].keys
    return {k: (np.concatenate([b.feature_values(k) for b in bs]),
                np.concatenate([b.feature_lengths(k) for b in bs])) for k in keys}, \
        np.concatenate([b.timestamp for b in bs]), [b.batch_size for b in bs]


def test_generate_layout_and_ranges():
    batches = list(S.generate(TABLES, 2500, 1000, seed=7, start_ts=100.0, samples_per_second=50.0))
    assert [b.batch_size for b in batches] == [1000, 1000, 500]
    for b in batches:
        assert isinstance(b, Batch) and b.keys == ("hist", "tok", "ad")
        assert b.values.dtype == np.int64 and b.timestamp.shape == (b.batch_size,)
        for t in TABLES:
            v = b.feature_values(t.name)
            assert v.size == b.feature_lengths(t.name).sum()
            if v.size:
                assert v.min() >= 0 and v.max() < t.num_rows
        assert np.all(b.feature_lengths("ad") == 1)
        assert b.feature_lengths("hist").max() <= 64
    _, ts, _ = concat(batches)
    assert np.array_equal(ts, 100.0 + np.arange(2500) / 50.0)
    # hot rows are permuted: the most frequent 'hist' ID is not one of the smallest IDs
    v = np.concatenate([b.feature_values("hist") for b in batches])
    ids, counts = np.unique(v, return_counts=True)
    top = ids[np.argsort(-counts)[:5]]
    assert np.all(top > 1000)
    assert S.IdPermutation(100_000, 0).num_rows == 100_000
    assert np.array_equal(TABLES[0].permutation(7).inverse(top[:1]), [0])  # hottest ID = rank 0


def test_generate_same_seed_same_stream_and_batch_size_independent():
    ref, ts_ref, _ = concat(S.generate(TABLES, 3000, 1000, seed=11))
    for bs in (100, 337, 1024, 5000):
        got, ts, sizes = concat(S.generate(TABLES, 3000, bs, seed=11))
        assert sum(sizes) == 3000 and all(s == bs for s in sizes[:-1])
        assert np.array_equal(ts, ts_ref)
        for k in ref:
            assert np.array_equal(got[k][0], ref[k][0]) and np.array_equal(got[k][1], ref[k][1])
    other, _, _ = concat(S.generate(TABLES, 3000, 1000, seed=12))
    assert not np.array_equal(other["hist"][0][:100], ref["hist"][0][:100])
    # a table's stream does not depend on the other tables
    alone, _, _ = concat(S.generate(TABLES[1:2], 3000, 700, seed=11))
    assert np.array_equal(alone["tok"][0], ref["tok"][0])
    # a prefix of the trace is the prefix of a longer trace
    short, _, _ = concat(S.generate(TABLES, 1500, 256, seed=11))
    for k in ref:
        assert np.array_equal(short[k][1], ref[k][1][:1500])
        assert np.array_equal(short[k][0], ref[k][0][:short[k][0].size])


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2200), bs=st.integers(1, 2500), seed=st.integers(0, 1000))
def test_generate_batch_size_property(n, bs, seed):
    tables = TABLES[1:]
    ref, _, _ = concat(S.generate(tables, n, n, seed))
    got, _, sizes = concat(S.generate(tables, n, bs, seed))
    assert sizes == [bs] * (n // bs) + ([n % bs] if n % bs else [])
    for k in ref:
        assert np.array_equal(got[k][0], ref[k][0]) and np.array_equal(got[k][1], ref[k][1])


def test_generate_bad_parameters():
    with pytest.raises(ConfigError, match="samples_per_batch"):
        S.generate(TABLES, 10, 0)
    with pytest.raises(ConfigError, match="num_samples"):
        S.generate(TABLES, -1, 10)
    with pytest.raises(ConfigError, match="at least one table"):
        S.generate([], 10, 10)
    with pytest.raises(ConfigError, match="duplicate"):
        S.generate([TABLES[0], TABLES[0]], 10, 10)
    with pytest.raises(ConfigError, match="samples_per_second"):
        S.generate(TABLES, 10, 10, samples_per_second=0.0)
    assert list(S.generate(TABLES, 0, 10)) == []


def test_old_batch_size_names_still_mean_samples_per_batch(tmp_path):
    """``batch_size`` (deprecated for one release): keyword of the generators and the specs'
    constructors, attribute of the specs and reports, flag of the command line."""
    ref, _, sizes = concat(S.generate(TABLES, 700, samples_per_batch=300, seed=4))
    with pytest.warns(DeprecationWarning, match="'batch_size' is deprecated, use "
                                                "'samples_per_batch'"):
        got, _, old_sizes = concat(S.generate(TABLES, 700, batch_size=300, seed=4))
    assert old_sizes == sizes == [300, 300, 100]
    for k in ref:
        assert np.array_equal(got[k][0], ref[k][0]) and np.array_equal(got[k][1], ref[k][1])
    with pytest.raises(TypeError, match="both 'batch_size'"):
        S.generate(TABLES, 700, batch_size=300, samples_per_batch=300)
    spec = S.preset("default")
    with pytest.warns(DeprecationWarning, match="samples_per_batch"):
        assert spec.batch_size == spec.samples_per_batch == 1024
    with pytest.warns(DeprecationWarning, match="samples_per_batch"):
        assert [b.batch_size for b in spec.generate(5, batch_size=2)] == [2, 2, 1]
    with pytest.warns(DeprecationWarning, match="samples_per_batch"):
        old = S.TraceSpec("t", spec.tables, batch_size=64)
    assert old == S.TraceSpec("t", spec.tables, samples_per_batch=64)
    with pytest.warns(DeprecationWarning, match="samples_per_batch"):
        assert S.PUBLISHED_2022.batch_size == S.PUBLISHED_2022.samples_per_batch == 131072
    # the command line's hidden --batch-size is --samples-per-batch
    for flag in ("--samples-per-batch", "--batch-size"):
        out = tmp_path / f"{flag.strip('-')}.parquet"
        assert S.main(["preset", "default", str(out), "--samples", "300", flag, "7"]) == 0
    assert pl.read_parquet(tmp_path / "batch-size.parquet").equals(
        pl.read_parquet(tmp_path / "samples-per-batch.parquet"))


# ------------------------------------------------------------------------------------ parquet log
def test_write_log_round_trip(tmp_path):
    path = tmp_path / "log.parquet"
    batches = list(S.generate(TABLES, 2100, 300, seed=3, start_ts=5.0))
    out = S.write_log(batches, path, TABLES, row_group_size=1000, metadata={"seed": 3})
    assert out == {"samples": 2100, "ids": sum(b.num_values for b in batches), "row_groups": 3}
    df = pl.read_parquet(path)
    assert df.columns == ["ts", "hist", "tok", "ad"]
    assert df.schema["ts"] == pl.Float64
    assert df.schema["hist"] == pl.List(pl.Int64) and df.schema["tok"] == pl.List(pl.Int64)
    assert df.schema["ad"] == pl.Int64
    ref, ts, _ = concat(batches)
    assert np.array_equal(df["ts"].to_numpy(), ts)
    assert np.array_equal(df["ad"].to_numpy(), ref["ad"][0])
    for k in ("hist", "tok"):
        assert np.array_equal(df[k].list.len().to_numpy(), ref[k][1])
        assert np.array_equal(df[k].explode().drop_nulls().to_numpy(), ref[k][0])
    f = pq.ParquetFile(path)
    assert [f.metadata.row_group(i).num_rows for i in range(3)] == [1000, 1000, 100]
    meta = json.loads(f.schema_arrow.metadata[b"flexshard_stream"])
    assert meta["seed"] == 3 and [t["name"] for t in meta["tables"]] == ["hist", "tok", "ad"]


def test_write_log_infers_types_and_rejects_bad_batches(tmp_path):
    b1 = Batch(["a", "b"], [1, 2, 3, 4], [1, 1, 2, 0], timestamp=[0.0, 1.0])
    S.write_log([b1], tmp_path / "x.parquet")
    df = pl.read_parquet(tmp_path / "x.parquet")
    assert df.schema["a"] == pl.Int64 and df.schema["b"] == pl.List(pl.Int64)
    assert df["b"].to_list() == [[3, 4], []]
    b2 = Batch(["a", "b"], [1, 2, 3], [2, 0, 1, 0], timestamp=[2.0, 3.0])
    with pytest.raises(LogError, match="single-ID"):
        S.write_log([b1, b2], tmp_path / "y.parquet")
    assert not (tmp_path / "y.parquet").exists()  # partial file removed
    with pytest.raises(LogError, match="timestamp"):
        S.write_log([Batch(["a"], [1], [1])], tmp_path / "z.parquet")
    with pytest.raises(LogError, match="keys"):
        S.write_log([b1, Batch(["a"], [1], [1], timestamp=0.0)], tmp_path / "w.parquet")
    with pytest.raises(LogError, match="no batches"):
        S.write_log([], tmp_path / "v.parquet")
    # with table specs an empty trace still gets its schema
    assert S.write_log(S.generate(TABLES, 0, 10), tmp_path / "e.parquet", TABLES)["samples"] == 0
    empty = pl.read_parquet(tmp_path / "e.parquet")
    assert empty.height == 0 and empty.schema["ad"] == pl.Int64


# ------------------------------------------------------------------------- published histograms
def test_reuse_histogram_by_hand():
    ids = np.array([7, 7, 8] + [9] * 4 + [10] * 5 + [11] * 40000)
    rows = S.reuse_histogram(ids)
    expect = np.zeros(17)
    expect[[0, 1, 2, 3, 16]] = 0.2      # counts 1, 2, 4, 5, 40000
    assert np.allclose(rows, expect)
    lk = S.reuse_histogram(ids, weight="lookups")
    assert np.allclose(lk[[0, 1, 2, 3, 16]], np.array([1, 2, 4, 5, 40000]) / ids.size)
    # in a batch, equal IDs of two features are two rows
    b = Batch(["f", "g"], [5, 5, 5], [2, 1])
    assert np.allclose(S.reuse_histogram(b)[:2], [0.5, 0.5])
    assert S.tv_distance([1, 0], [0, 1]) == 1.0 and S.tv_distance([1, 1], [2, 2]) == 0.0


@pytest.mark.skipif(not STATS_2022.exists(), reason=f"published data not found at {STATS_2022}")
def test_load_published_histogram_matches_file_and_embedded_copy():
    pub = S.load_published_histogram(STATS_2022)
    assert len(pub.batches) == 16 and pub.samples_per_batch == 131072 and pub.num_tables == 788
    assert pub.lookups == pytest.approx(1.405e9, rel=1e-3)
    assert pub.unique_rows == pytest.approx(110.26e6, rel=1e-3)
    assert pub.once_fraction == pytest.approx(0.342)
    assert pub.mean_reuse == pytest.approx(12.7, abs=0.1)
    assert pub.rows.sum() == pytest.approx(1.0, abs=0.005)
    assert np.allclose(pub.rows, S.PUBLISHED_2022.rows)
    assert np.allclose(pub.lookups_by_bucket, S.PUBLISHED_2022.lookups_by_bucket)
    assert pub.lookups == S.PUBLISHED_2022.lookups and pub.unique_rows == S.PUBLISHED_2022.unique_rows


def test_load_published_histogram_rejects_damaged_files(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\n")
    with pytest.raises(FormatError, match="no 'fbgemm"):
        S.load_published_histogram(bad)
    bad.write_text("fbgemm_t2_bs8.pt\nAvg # of indices: 10\nAvg # of unique cols: 5\n"
                   "Histogram of col sizes:\n(0, 1]: 0.5\n(1, 2]: 0.5\n")
    with pytest.raises(FormatError, match="buckets"):
        S.load_published_histogram(bad)
    with pytest.raises(FormatError, match="cannot read"):
        S.load_published_histogram(tmp_path / "missing.txt")


def test_production_preset_is_calibrated():
    # Stated bounds (docs/SYNTHETIC.md): TV(rows) < 0.015 and TV(lookups) < 0.06 at scale 1/32
    # (4096 samples); TV(rows) < 0.025 at 1/128 (1024 samples). Measured over seeds 0-2:
    # 0.003-0.005, 0.021-0.023 and 0.006-0.011.
    rep = S.calibration_distance(scale=1 / 32, seed=0)
    assert rep.samples_per_batch == 4096
    assert rep.tv_rows < 0.015 and rep.tv_lookups < 0.06
    assert abs(rep.rows[0] - 0.342) < 0.015
    assert rep.mean_reuse == pytest.approx(12.75, rel=0.05)
    assert S.calibration_distance(scale=1 / 128, seed=1).tv_rows < 0.025
    # the distance does discriminate: one uncalibrated Zipf table is far from the target
    b = next(S.generate([S.TableSpec("z", 10 ** 6, 1.05, "pooled", "poisson", 100.0)], 4096, 4096))
    assert S.tv_distance(S.reuse_histogram(b), S.PUBLISHED_2022.rows) > 0.2
    assert "| (0, 1] |" in rep.to_markdown()


def test_presets_scale_and_validate():
    tiny = S.preset("production", 1 / 256)
    assert tiny.samples_per_batch == 512 and len(tiny.tables) == 32
    big = S.preset("production", 1.0)
    assert big.samples_per_batch == 131072
    assert sum(t.num_rows for t in big.tables) > 100 * sum(t.num_rows for t in tiny.tables)
    seq = S.preset("sequence", 0.001)
    assert all(t.kind == "sequence" and t.mean_length >= 100 for t in seq.tables)
    b = next(seq.generate(64, 64, seed=1))
    per_sample = b.lengths.reshape(len(seq.tables), -1)
    assert per_sample.max() <= 1024 and np.median(per_sample[0]) > 300
    with pytest.raises(ConfigError, match="unknown preset"):
        S.preset("nope")
    with pytest.raises(ConfigError, match="scale"):
        S.preset("sequence", 0)


# ---------------------------------------------------------------------------------- default trace
def test_default_trace_is_reproducible_from_its_readme_command(tmp_path):
    shipped = REPO / "data" / "default_trace.parquet"
    readme = (REPO / "data" / "README.md").read_text()
    assert "python -m flexshard_stream.sources.synth default data/default_trace.parquet" in readme
    out = tmp_path / "default_trace.parquet"
    assert S.main(["default", str(out)]) == 0
    new = pl.read_parquet(out)
    assert new.height == 30000 and new.schema["ad_id"] == pl.Int64
    assert new.schema["item_history"] == pl.List(pl.Int64)
    assert 1e6 < out.stat().st_size < 20e6
    assert new.equals(pl.read_parquet(shipped))
