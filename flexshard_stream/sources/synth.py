"""Seeded synthetic traces of embedding-row IDs, and their calibration to published reuse statistics.

The pieces, bottom-up:

- :func:`zipf_ranks`: popularity ranks in ``[0, num_rows)`` with ``P(r) ~ (r + 1)^-alpha``, by
  vectorized rejection-inversion (Hörmann & Derflinger 1996), O(1) memory in ``num_rows``.
- :class:`IdPermutation`: a seeded bijection of ``[0, num_rows)`` (Feistel network plus cycle-walking),
  so the hot rows are scattered over the ID space instead of being the small IDs.
- :func:`sample_lengths`: IDs per sample (fixed, geometric, poisson, lognormal; capped).
- :class:`TableSpec` and :func:`generate`: a stream of :class:`~flexshard_stream.stats.batch.Batch` objects.
  The stream is cut into fixed internal blocks of :data:`BLOCK_SAMPLES` samples, each drawn from its own
  seed derived from ``(seed, table name, seed_offset, block index)``: the same seed gives the same
  samples whatever the samples per batch, and adding a table does not change the others.
- :func:`write_log`: a parquet log, one row per sample, streamed in row groups.
- :func:`load_published_histogram`, :func:`reuse_histogram`, :func:`calibration_distance`: Meta's
  published reuse histogram (``dlrm-locality-stats``) and how close the ``"production"`` preset gets.
- :func:`preset` (``"production"``, ``"sequence"``, ``"default"``) and :func:`make_default_trace`.

Run ``python -m flexshard_stream.sources.synth --help`` for the command line. See ``docs/SYNTHETIC.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..compat import REMOVED_IN, renamed_keywords, renamed_property
from ..errors import ConfigError, FormatError, LogError
from ..stats.batch import Batch

__all__ = [
    "BLOCK_SAMPLES", "REUSE_BUCKETS", "LENGTH_DISTRIBUTIONS", "PUBLISHED_2022",
    "zipf_ranks", "zipf_pmf_head", "zipf_normalizer", "IdPermutation", "sample_lengths",
    "TableSpec", "TraceSpec", "generate", "write_log",
    "PublishedHistogram", "load_published_histogram", "reuse_histogram", "tv_distance",
    "CalibrationReport", "calibration_distance", "fit_table_family", "preset", "make_default_trace",
    "main",
]

#: Samples per internal generation block. Part of the stream's definition: changing it changes the
#: IDs generated for a seed (samples per batch do not).
BLOCK_SAMPLES = 1024

#: Largest supported table, rows (the permutation works on at most 62 bits).
MAX_ROWS = 1 << 62

LENGTH_DISTRIBUTIONS = ("fixed", "geometric", "poisson", "lognormal")
KINDS = ("sequence", "pooled")

#: Reuse buckets of the published histogram: a row used c times in a batch falls in
#: (0,1], (1,2], (2,4], ..., (16384,32768], (32768+.
REUSE_BUCKETS = ("(0, 1]", "(1, 2]", "(2, 4]", "(4, 8]", "(8, 16]", "(16, 32]", "(32, 64]",
                 "(64, 128]", "(128, 256]", "(256, 512]", "(512, 1024]", "(1024, 2048]",
                 "(2048, 4096]", "(4096, 8192]", "(8192, 16384]", "(16384, 32768]", "(32768+")
_BUCKET_UPPER = np.array([1 << i for i in range(16)], dtype=np.int64)  # 1, 2, 4, ..., 32768


def checked_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]`` (a whole float is accepted); ConfigError naming
    ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        else:
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"{name} must be {rng}, got {value}")
    return value


def _check_alpha(alpha: Any) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ConfigError(f"alpha (Zipf exponent) must be a number >= 0, got {alpha!r}") from None
    if not math.isfinite(a) or a < 0:
        raise ConfigError(f"alpha (Zipf exponent) must be finite and >= 0, got {alpha!r}")
    return a


# ================================================================== Zipf sampling
def _helper1(x: np.ndarray) -> np.ndarray:
    """log1p(x) / x, accurate near 0."""
    small = np.abs(x) <= 1e-8
    xs = np.where(small, 1.0, x)
    return np.where(small, 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x)), np.log1p(xs) / xs)


def _helper2(x: np.ndarray) -> np.ndarray:
    """expm1(x) / x, accurate near 0."""
    small = np.abs(x) <= 1e-8
    xs = np.where(small, 1.0, x)
    return np.where(small, 1.0 + 0.5 * x * (1.0 + x / 3.0 * (1.0 + 0.25 * x)), np.expm1(xs) / xs)


def _h(x: np.ndarray, a: float) -> np.ndarray:
    return np.exp(-a * np.log(x))


def _hint(x: np.ndarray, a: float) -> np.ndarray:
    """H(x) = (x^(1-a) - 1) / (1 - a), the integral of h from 1 to x (log x when a = 1)."""
    lx = np.log(x)
    return _helper2((1.0 - a) * lx) * lx


def _hint_inv(y: np.ndarray, a: float) -> np.ndarray:
    t = np.maximum(y * (1.0 - a), -1.0)
    return np.exp(_helper1(t) * y)


def zipf_ranks(n: int, num_rows: int, alpha: float, rng: Any = None) -> np.ndarray:
    """Draw ``n`` Zipf-distributed popularity ranks.

    ``P(r) = (r + 1)^-alpha / H(num_rows, alpha)`` for ranks ``r`` in ``[0, num_rows)`` (rank 0 is the
    hottest row). Vectorized rejection-inversion (Hörmann & Derflinger 1996, "Rejection-inversion to
    generate variates from monotone discrete distributions", as in Apache Commons RNG
    ``RejectionInversionZipfSampler``): every round draws one uniform per pending sample and accepts
    over 90% of them, so the loop runs O(log n) rounds. Extra memory is O(n), independent of
    ``num_rows``; ``alpha = 0`` is uniform.

    Parameters
    ----------
    n : int
        Number of ranks to draw, >= 0.
    num_rows : int
        Rows in the table, 1 <= num_rows <= 2**62. Exact up to 2**53 (9e15); above, ranks are
        quantized to float64 resolution (relative 1e-16).
    alpha : float
        Zipf exponent, >= 0. Values <= 1 are fine: the support is finite.
    rng : numpy.random.Generator or int or None
        Source of randomness (passed through :func:`numpy.random.default_rng`).

    Returns
    -------
    ndarray of int64, shape (n,)
        Ranks (0-based, rows).
    """
    n = checked_int(n, "n (number of ranks)", 0)
    num_rows = checked_int(num_rows, "num_rows", 1, MAX_ROWS)
    a = _check_alpha(alpha)
    gen = np.random.default_rng(rng)
    if num_rows == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if a == 0.0:
        return gen.integers(0, num_rows, size=n, dtype=np.int64)
    h_x1 = float(_hint(np.float64(1.5), a)) - 1.0
    h_n = float(_hint(np.float64(num_rows + 0.5), a))
    s = 2.0 - float(_hint_inv(_hint(np.float64(2.5), a) - _h(np.float64(2.0), a), a))
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n, dtype=np.int64)
    while todo.size:
        u = h_n + gen.random(todo.size) * (h_x1 - h_n)  # uniform in (h_x1, h_n]
        x = _hint_inv(u, a)
        k = np.floor(x + 0.5)
        np.clip(k, 1.0, float(num_rows), out=k)
        ok = (k - x <= s) | (u >= _hint(k + 0.5, a) - _h(k, a))
        out[todo[ok]] = k[ok].astype(np.int64) - 1
        todo = todo[~ok]
    if num_rows > 1 << 53:  # float64 spacing exceeds 1 there: ranks are quantized, keep in range
        np.minimum(out, num_rows - 1, out=out)
    return out


def zipf_normalizer(num_rows: int, alpha: float, head: int = 1 << 16) -> float:
    """``H(num_rows, alpha) = sum_{i=1..num_rows} i^-alpha``.

    Exact (summed in chunks, O(head) memory) when ``num_rows <= 4 * head``; otherwise the exact sum of
    the first ``head`` terms plus an Euler-Maclaurin tail (integral, end-point term, and the B2 and B4
    derivative corrections; truncation error below ``1e-20`` relative for the default ``head``).
    """
    num_rows = checked_int(num_rows, "num_rows", 1, MAX_ROWS)
    a = _check_alpha(alpha)
    head = checked_int(head, "head", 16)
    if num_rows <= 4 * head:
        total = 0.0
        for lo in range(1, num_rows + 1, 1 << 20):  # chunks: O(1) memory for any num_rows here
            i = np.arange(lo, min(num_rows, lo + (1 << 20) - 1) + 1, dtype=np.float64)
            total += float(np.sum(i ** -a))
        return total
    i = np.arange(1, head + 1, dtype=np.float64)
    total = float(np.sum(i[::-1] ** -a))  # small terms first
    A, B = float(head + 1), float(num_rows)
    lab = math.log(B / A)
    integral = A ** (1.0 - a) * lab * float(_helper2(np.float64((1.0 - a) * lab)))

    def f1(x: float) -> float:  # first derivative of x^-a
        return -a * x ** (-a - 1.0)

    def f3(x: float) -> float:  # third derivative
        return -a * (a + 1.0) * (a + 2.0) * x ** (-a - 3.0)

    tail = (integral + 0.5 * (A ** -a + B ** -a) + (f1(B) - f1(A)) / 12.0
            - (f3(B) - f3(A)) / 720.0)
    return total + tail


def zipf_pmf_head(k: int, num_rows: int, alpha: float) -> np.ndarray:
    """Exact probabilities of the ``k`` hottest ranks ``0 .. k-1`` of :func:`zipf_ranks`.

    Parameters
    ----------
    k : int
        Number of ranks, 0 <= k <= num_rows.
    num_rows, alpha
        As in :func:`zipf_ranks`.

    Returns
    -------
    ndarray of float64, shape (k,)
        ``(r + 1)^-alpha / H(num_rows, alpha)``; see :func:`zipf_normalizer` for ``H``.
    """
    num_rows = checked_int(num_rows, "num_rows", 1, MAX_ROWS)
    k = checked_int(k, "k (number of head ranks)", 0, num_rows)
    a = _check_alpha(alpha)
    r = np.arange(1, k + 1, dtype=np.float64)
    return r ** -a / zipf_normalizer(num_rows, a)


# ================================================================== ID permutation
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class IdPermutation:
    """A seeded pseudo-random bijection of ``[0, num_rows)`` with O(1) memory.

    A balanced Feistel network with ``rounds`` rounds (SplitMix64 round function, one 64-bit key per
    round drawn from ``numpy.random.SeedSequence(seed)``) permutes ``[0, 2^(2h))``, the smallest
    even-bit-width domain holding ``num_rows``; values that land outside ``[0, num_rows)`` are walked
    along their cycle until they land inside (cycle-walking, Black & Rogaway 2002). The domain is less
    than 4x ``num_rows``, so fewer than 4 walks are expected. Fully vectorized over numpy arrays.

    Parameters
    ----------
    num_rows : int
        Rows in the table, 1 <= num_rows <= 2**62.
    seed : int
        Seed, >= 0.
    rounds : int, default 4
        Feistel rounds (4 make a strong pseudo-random permutation, Luby & Rackoff 1988).
    """

    def __init__(self, num_rows: int, seed: int = 0, rounds: int = 4):
        self.num_rows = checked_int(num_rows, "num_rows", 1, MAX_ROWS)
        self.seed = checked_int(seed, "seed", 0)
        self.rounds = checked_int(rounds, "rounds", 1, 64)
        bits = max(1, (self.num_rows - 1).bit_length())
        self.half_bits = (bits + 1) // 2
        self._h = np.uint64(self.half_bits)
        self._mask = np.uint64((1 << self.half_bits) - 1)
        self._keys = np.random.SeedSequence(self.seed).generate_state(self.rounds, dtype=np.uint64)

    def __repr__(self) -> str:
        return f"IdPermutation(num_rows={self.num_rows}, seed={self.seed}, rounds={self.rounds})"

    def _f(self, x: np.ndarray, i: int) -> np.ndarray:
        return _mix64(x ^ self._keys[i]) & self._mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._h, x & self._mask
        for i in range(self.rounds):
            left, right = right, left ^ self._f(right, i)
        return (left << self._h) | right

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._h, x & self._mask
        for i in reversed(range(self.rounds)):
            left, right = right ^ self._f(left, i), left
        return (left << self._h) | right

    def _walk(self, values: Any, step, what: str) -> np.ndarray:
        arr = np.asarray(values)
        if arr.dtype.kind not in "iu":
            raise ConfigError(f"{what} must be integers, got dtype {arr.dtype}")
        shape = arr.shape
        arr = arr.reshape(-1)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.num_rows):
            bad = int(np.flatnonzero((arr < 0) | (arr >= self.num_rows))[0])
            raise ConfigError(f"{what} must be in [0, {self.num_rows}); got {int(arr[bad])} at "
                              f"position {bad}")
        if self.num_rows == 1:
            return np.zeros(shape, dtype=np.int64)
        x = step(arr.astype(np.uint64))
        n = np.uint64(self.num_rows)
        todo = np.flatnonzero(x >= n)
        while todo.size:
            y = step(x[todo])
            x[todo] = y
            todo = todo[y >= n]
        return x.astype(np.int64).reshape(shape)

    def forward(self, ranks: Any) -> np.ndarray:
        """Map ranks (rows, ``[0, num_rows)``) to IDs; int64 array of the same shape."""
        return self._walk(ranks, self._encrypt, "ranks")

    def inverse(self, ids: Any) -> np.ndarray:
        """Map IDs back to ranks: ``inverse(forward(r)) == r``."""
        return self._walk(ids, self._decrypt, "ids")


# ================================================================== lengths
def sample_lengths(n: int, dist: str, mean: float, rng: Any = None, max_length: int | None = None,
                   sigma: float = 1.0) -> np.ndarray:
    """Draw ``n`` per-sample lengths (IDs per sample).

    Distributions (``mean`` is before the cap ``max_length``):

    - ``"fixed"``: every length is ``mean`` (an integer).
    - ``"geometric"``: 1, 2, ... with ``P(l) = p (1 - p)^(l - 1)``, ``p = 1 / mean`` (mean >= 1).
    - ``"poisson"``: 0, 1, ... Poisson(mean); zero means a missing feature.
    - ``"lognormal"``: ``rint(X)`` floored at 1, ``X`` lognormal with ``E[X] = mean`` and log-space
      standard deviation ``sigma``.

    Returns
    -------
    ndarray of int64, shape (n,)
        Lengths, clipped to ``max_length`` when given.
    """
    n = checked_int(n, "n (number of samples)", 0)
    dist, mean, max_length, sigma = _check_lengths(dist, mean, max_length, sigma)
    gen = np.random.default_rng(rng)
    if dist == "fixed":
        out = np.full(n, int(mean), dtype=np.int64)
    elif dist == "geometric":
        out = gen.geometric(1.0 / mean, size=n).astype(np.int64)
    elif dist == "poisson":
        out = gen.poisson(mean, size=n).astype(np.int64)
    else:
        mu = math.log(mean) - 0.5 * sigma * sigma
        x = gen.lognormal(mu, sigma, size=n)
        out = np.maximum(np.rint(np.minimum(x, 2.0 ** 62)), 1.0).astype(np.int64)
    if max_length is not None:
        np.minimum(out, max_length, out=out)
    return out


def _check_lengths(dist: Any, mean: Any, max_length: Any, sigma: Any, where: str = ""
                   ) -> tuple[str, float, int | None, float]:
    if dist not in LENGTH_DISTRIBUTIONS:
        raise ConfigError(f"{where}length distribution must be one of {LENGTH_DISTRIBUTIONS}, "
                          f"got {dist!r}")
    try:
        m = float(mean)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}mean length must be a number > 0, got {mean!r}") from None
    if not math.isfinite(m) or m <= 0:
        raise ConfigError(f"{where}mean length (IDs per sample) must be finite and > 0, got {mean!r}")
    if dist == "fixed" and not m.is_integer():
        raise ConfigError(f"{where}a fixed length must be an integer, got mean length {mean!r}")
    if dist == "geometric" and m < 1:
        raise ConfigError(f"{where}geometric lengths start at 1, so mean length must be >= 1, "
                          f"got {mean!r}")
    if max_length is not None:
        max_length = checked_int(max_length, f"{where}max_length (IDs per sample)", 1)
        if dist == "fixed" and max_length < m:
            raise ConfigError(f"{where}max_length {max_length} is below the fixed length {int(m)}")
    try:
        s = float(sigma)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}sigma must be a number > 0, got {sigma!r}") from None
    if not math.isfinite(s) or s <= 0:
        raise ConfigError(f"{where}sigma (lognormal log-space std) must be finite and > 0, "
                          f"got {sigma!r}")
    return dist, m, max_length, s


# ================================================================== table and trace specs
@dataclass(frozen=True)
class TableSpec:
    """One embedding table (= one feature) of a synthetic trace.

    Attributes
    ----------
    name : str
        Feature / table name (the batch key and the parquet column).
    num_rows : int
        Rows in the table, 1 .. 2**62.
    alpha : float
        Zipf exponent of row popularity, >= 0 (0 = uniform).
    kind : {"pooled", "sequence"}
        Pooled (IDs of a sample are summed) or sequence (kept in order). Metadata for consumers; a
        pooled table with fixed length 1 is written as a plain int64 column.
    length : {"fixed", "geometric", "poisson", "lognormal"}
        Distribution of IDs per sample, see :func:`sample_lengths`.
    mean_length : float
        Mean IDs per sample (before the cap), > 0.
    max_length : int or None
        Cap on IDs per sample.
    sigma : float
        Log-space standard deviation of the lognormal lengths.
    seed_offset : int
        Mixed into this table's seeds: two tables with equal names and offsets draw equal streams.
    """

    name: str
    num_rows: int
    alpha: float
    kind: str = "pooled"
    length: str = "fixed"
    mean_length: float = 1.0
    max_length: int | None = None
    sigma: float = 1.0
    seed_offset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table name must be a non-empty string, got {self.name!r}")
        w = f"table {self.name!r}: "
        try:
            object.__setattr__(self, "num_rows", checked_int(self.num_rows, "num_rows", 1, MAX_ROWS))
            object.__setattr__(self, "alpha", _check_alpha(self.alpha))
        except ConfigError as e:
            raise ConfigError(w + str(e)) from None
        if self.kind not in KINDS:
            raise ConfigError(f"{w}kind must be one of {KINDS}, got {self.kind!r}")
        dist, m, mx, s = _check_lengths(self.length, self.mean_length, self.max_length, self.sigma,
                                        where=w)
        object.__setattr__(self, "mean_length", m)
        object.__setattr__(self, "max_length", mx)
        object.__setattr__(self, "sigma", s)
        if (isinstance(self.seed_offset, bool) or not isinstance(self.seed_offset, (int, np.integer))
                or self.seed_offset < 0):
            raise ConfigError(f"{w}seed_offset must be an integer >= 0, got {self.seed_offset!r}")
        object.__setattr__(self, "seed_offset", int(self.seed_offset))

    @property
    def single_id(self) -> bool:
        """True when every sample has exactly one ID (pooled, fixed length 1)."""
        return self.kind == "pooled" and self.length == "fixed" and self.mean_length == 1.0

    @property
    def seed_key(self) -> tuple[int, int]:
        """``(crc32(name), seed_offset)``: what this table mixes into every seed it derives (its
        permutation, its blocks, the drift scenarios' windows), so tables draw independent
        streams."""
        return zlib.crc32(self.name.encode("utf-8")), self.seed_offset

    def permutation(self, seed: int) -> IdPermutation:
        """The rank -> ID permutation this table uses under trace seed ``seed``."""
        ss = np.random.SeedSequence(seed, spawn_key=(1, *self.seed_key))
        return IdPermutation(self.num_rows, int(ss.generate_state(1, dtype=np.uint64)[0] >> 1))

    def block_rng(self, seed: int, block: int) -> np.random.Generator:
        """The generator of internal block ``block`` (samples ``block * BLOCK_SAMPLES ...``)."""
        return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, *self.seed_key, block)))

    def sample_block(self, seed: int, block: int, n: int, perm: IdPermutation | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Lengths (n,) and IDs (sum of lengths,) of the first ``n`` samples of block ``block``.

        The whole block is always drawn and then cut, so a shorter trace is a prefix of a longer one.
        """
        rng = self.block_rng(seed, block)
        lens = sample_lengths(BLOCK_SAMPLES, self.length, self.mean_length, rng, self.max_length,
                              self.sigma)
        ranks = zipf_ranks(int(lens.sum()), self.num_rows, self.alpha, rng)
        lens = lens[:n]
        perm = perm if perm is not None else self.permutation(seed)
        return lens, perm.forward(ranks[:int(lens.sum())])


def checked_tables(tables: Any) -> tuple[TableSpec, ...]:
    """``tables`` as a non-empty tuple of uniquely named :class:`TableSpec`; ConfigError otherwise."""
    tables = tuple(tables)
    if not tables:
        raise ConfigError("a trace needs at least one table")
    for t in tables:
        if not isinstance(t, TableSpec):
            raise ConfigError(f"tables must be TableSpec objects, got {type(t).__name__}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"duplicate table name {dup!r}")
    return tables


@renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
def generate(tables: Sequence[TableSpec], num_samples: int, samples_per_batch: int, seed: int = 0,
             start_ts: float = 0.0, samples_per_second: float = 1000.0) -> Iterator[Batch]:
    """Generate a seeded synthetic trace as a stream of batches.

    Sample ``i`` (0-based, over the whole trace) has timestamp ``start_ts + i / samples_per_second``
    seconds and, for each table, a length from the table's length distribution and that many IDs
    ``permutation(zipf rank)``. Samples are drawn in internal blocks of :data:`BLOCK_SAMPLES` with
    per-block seeds, so the concatenation of the batches does not depend on
    ``samples_per_batch``.

    Parameters
    ----------
    tables : sequence of TableSpec
        The features, in key order.
    num_samples : int
        Samples in the trace, >= 0.
    samples_per_batch : int
        Samples per yielded batch, >= 1 (the last batch may be smaller). ``batch_size`` is its
        deprecated name (one release).
    seed : int
        Trace seed, >= 0.
    start_ts : float
        Timestamp of the first sample, seconds.
    samples_per_second : float
        Arrival rate, samples per second, > 0.

    Yields
    ------
    Batch
        Keys = table names, int64 IDs, key-major lengths, float64 timestamps (one per sample).
    """
    tables = checked_tables(tables)
    num_samples = checked_int(num_samples, "num_samples", 0)
    samples_per_batch = checked_int(samples_per_batch, "samples_per_batch", 1)
    seed = checked_int(seed, "seed", 0)
    if not math.isfinite(float(start_ts)):
        raise ConfigError(f"start_ts must be finite seconds, got {start_ts!r}")
    sps = float(samples_per_second)
    if not math.isfinite(sps) or sps <= 0:
        raise ConfigError(f"samples_per_second must be finite and > 0, got {samples_per_second!r}")
    return _generate(tables, num_samples, samples_per_batch, seed, float(start_ts), sps)


def _generate(tables: tuple[TableSpec, ...], num_samples: int, samples_per_batch: int, seed: int,
              start_ts: float, sps: float) -> Iterator[Batch]:
    keys = tuple(t.name for t in tables)
    perms = [t.permutation(seed) for t in tables]
    nt = len(tables)
    pend_lens: list[list[np.ndarray]] = [[] for _ in tables]
    pend_vals: list[list[np.ndarray]] = [[] for _ in tables]
    pending = 0
    emitted = 0
    nblocks = -(-num_samples // BLOCK_SAMPLES)
    for b in range(nblocks):
        n = min(BLOCK_SAMPLES, num_samples - b * BLOCK_SAMPLES)
        for j, t in enumerate(tables):
            lens, vals = t.sample_block(seed, b, n, perms[j])
            pend_lens[j].append(lens)
            pend_vals[j].append(vals)
        pending += n
        last = b == nblocks - 1
        if pending < samples_per_batch and not last:
            continue
        lens_all = [np.concatenate(x) for x in pend_lens]
        vals_all = [np.concatenate(x) for x in pend_vals]
        offs = [np.concatenate([[0], np.cumsum(l)]) for l in lens_all]
        start = 0
        while pending - start >= samples_per_batch or (last and start < pending):
            stop = min(start + samples_per_batch, pending)
            lengths = np.concatenate([lens_all[j][start:stop] for j in range(nt)])
            values = np.concatenate([vals_all[j][offs[j][start]:offs[j][stop]] for j in range(nt)])
            ts = start_ts + np.arange(emitted, emitted + stop - start, dtype=np.float64) / sps
            yield Batch(keys, values, lengths, timestamp=ts)
            emitted += stop - start
            start = stop
        pend_lens = [[l[start:]] for l in lens_all]
        pend_vals = [[v[o[start]:]] for v, o in zip(vals_all, offs)]
        pending -= start


@renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
@dataclass(frozen=True)
class TraceSpec:
    """A named family of tables with its reference batch.

    Attributes
    ----------
    name : str
    tables : tuple of TableSpec
    samples_per_batch : int
        Samples of the reference batch (for ``"production"``: the batch the calibration is made
        at; the default of :meth:`generate`). ``batch_size`` is its deprecated name (one release).
    samples_per_second : float
    description : str
    """

    name: str
    tables: tuple[TableSpec, ...]
    samples_per_batch: int
    samples_per_second: float = 1000.0
    description: str = ""

    batch_size = renamed_property("batch_size", "samples_per_batch", REMOVED_IN)

    @renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
    def generate(self, num_samples: int, samples_per_batch: int | None = None, seed: int = 0,
                 start_ts: float = 0.0) -> Iterator[Batch]:
        """:func:`generate` with this spec's tables (``samples_per_batch`` defaults to the
        reference batch)."""
        return generate(self.tables, num_samples,
                        self.samples_per_batch if samples_per_batch is None else samples_per_batch,
                        seed, start_ts, self.samples_per_second)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (tables as dicts)."""
        d = asdict(self)
        d["tables"] = [asdict(t) for t in self.tables]
        return d


# ================================================================== parquet log
def write_log(batches: Iterable[Batch], path: str | Path, tables: Sequence[TableSpec] | None = None,
              row_group_size: int = 65536, metadata: dict[str, Any] | None = None) -> dict[str, int]:
    """Write batches to a parquet log, one row per sample, streamed in row groups.

    Columns: ``ts`` (float64, seconds), then one column per feature: ``int64`` for single-ID features,
    ``list<int64>`` otherwise. A feature is single-ID when its :class:`TableSpec` says so (pooled,
    fixed length 1) or, without ``tables``, when every sample of the first batch has exactly one ID.
    Every row group but the last has exactly ``row_group_size`` samples; about one row group is held
    in memory. zstd-compressed.

    Parameters
    ----------
    batches : iterable of Batch
        All with the same keys, with per-sample (or per-batch) timestamps.
    path : str or Path
        Output file.
    tables : sequence of TableSpec, optional
        Column types (and JSON metadata) from the specs.
    row_group_size : int
        Samples per parquet row group, >= 1.
    metadata : dict, optional
        Stored as JSON under the ``flexshard_stream`` key of the file's schema metadata.

    Returns
    -------
    dict
        ``{"samples": rows written, "ids": IDs written, "row_groups": row groups}``.

    Raises
    ------
    LogError
        No batches and no ``tables``, keys change between batches, a batch has no timestamp, or
        a single-ID column gets a sample with another number of IDs. The partial file is removed.
    """
    row_group_size = checked_int(row_group_size, "row_group_size", 1)
    spec = {t.name: t for t in checked_tables(tables)} if tables is not None else None
    log = _LogWriter(Path(path), row_group_size, spec, metadata)
    try:
        for i, b in enumerate(batches):
            log.add(i, b)
        log.finish()
    except BaseException:
        log.abort()
        raise
    finally:
        log.close()
    return log.stats


class _LogWriter:
    """The state of one :func:`write_log` call: the parquet writer (opened on the first rows),
    the column layout (fixed by the first batch or the specs) and the rows not yet written.

    Parameters
    ----------
    path : Path
        Output file.
    row_group_size : int
        Samples per row group (every group but the last).
    spec : dict of str to TableSpec, or None
        Column types and metadata by feature.
    metadata : dict or None
        Extra JSON metadata under the ``flexshard_stream`` key.
    """

    def __init__(self, path: Path, row_group_size: int, spec: dict[str, TableSpec] | None,
                 metadata: dict[str, Any] | None):
        self.path = path
        self.row_group_size = row_group_size
        self.spec = spec
        self.metadata = metadata
        self.writer: Any = None                 # pyarrow ParquetWriter once rows are written
        self.keys: tuple[str, ...] | None = None
        self.single: dict[str, bool] = {}       # feature -> written as an int64 column
        self.pending: list[Any] = []            # pyarrow tables not yet written
        self.buffered = 0                       # samples in ``pending``
        self.stats = {"samples": 0, "ids": 0, "row_groups": 0}

    def add(self, i: int, b: Batch) -> None:
        """Buffer batch number ``i`` (checked) and write the whole row groups it completes."""
        if self.keys is None:
            self._set_layout(b)
        elif b.keys != self.keys:
            raise LogError(f"batch {i} has keys {list(b.keys)}, expected {list(self.keys)}")
        if b.batch_size == 0:
            return
        self._check_batch(i, b)
        self.pending.append(self._to_table(b))
        self.buffered += b.batch_size
        self.stats["ids"] += b.num_values
        if self.buffered >= self.row_group_size:
            self._flush(final=False)

    def finish(self) -> None:
        """Write the rows left, or an empty table with the schema when no batch had a sample."""
        if self.keys is None:
            if self.spec is None:
                raise LogError("no batches to write (pass tables= to write an empty log)")
            self.keys = tuple(self.spec)
            self.single.update({k: self.spec[k].single_id for k in self.keys})
        self._flush(final=True)
        if self.writer is None:
            self.pending = [self._to_table(Batch(self.keys, np.zeros(0, np.int64),
                                                 np.zeros(0, np.int64), timestamp=np.zeros(0)))]
            self._flush(final=True)

    def abort(self) -> None:
        """Remove the partial file, if this call created it."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the parquet writer (the file is complete once closed)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _set_layout(self, b: Batch) -> None:
        """Keys and column types from the first batch (and the specs, when given)."""
        self.keys = b.keys
        if "ts" in self.keys:
            raise LogError("a feature may not be called 'ts' (the timestamp column)")
        for k in self.keys:
            if self.spec is not None:
                if k not in self.spec:
                    raise LogError(f"batch feature {k!r} has no TableSpec")
                self.single[k] = self.spec[k].single_id
            else:
                self.single[k] = bool(b.batch_size) and bool(np.all(b.feature_lengths(k) == 1))

    def _check_batch(self, i: int, b: Batch) -> None:
        """A timestamp, and one ID per sample in every single-ID column."""
        if b.timestamp is None:
            raise LogError(f"batch {i} has no timestamp; the log needs one per sample")
        for k in self.keys:
            bad = np.flatnonzero(b.feature_lengths(k) != 1) if self.single[k] else ()
            if len(bad):
                raise LogError(f"feature {k!r} is written as a single-ID int64 column but batch "
                               f"{i} sample {int(bad[0])} has "
                               f"{int(b.feature_lengths(k)[bad[0]])} IDs")

    def _to_table(self, b: Batch) -> Any:
        """The batch as a pyarrow table: ``ts`` then one column per feature."""
        import pyarrow as pa

        ts = b.timestamp if b.timestamp.size == b.batch_size else np.repeat(b.timestamp,
                                                                              b.batch_size)
        cols = [pa.array(ts, type=pa.float64())]
        for k in self.keys:
            vals = b.feature_values(k)
            if self.single[k]:
                cols.append(pa.array(vals, type=pa.int64()))
                continue
            if vals.size >= 2 ** 31:
                raise LogError(f"feature {k!r}: {vals.size} IDs in one batch; list offsets are "
                               f"int32, split the batch")
            offsets = np.zeros(b.batch_size + 1, dtype=np.int32)
            np.cumsum(b.feature_lengths(k), out=offsets[1:])
            cols.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(vals)))
        return pa.Table.from_arrays(cols, names=["ts", *self.keys])

    def _open(self, schema: Any) -> None:
        """Create the file with the schema and the ``flexshard_stream`` JSON metadata."""
        import pyarrow.parquet as pq

        spec = self.spec
        meta = {"flexshard_stream": json.dumps({
            "format": "flexshard_stream.sources.synth log", "version": 1,
            "tables": [asdict(spec[k]) for k in self.keys] if spec else None,
            **(self.metadata or {})})}
        self.writer = pq.ParquetWriter(str(self.path), schema.with_metadata(meta),
                                       compression="zstd")

    def _flush(self, final: bool) -> None:
        """Write the whole row groups buffered (every row when ``final``); keep the rest."""
        import pyarrow as pa

        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        size = self.row_group_size
        n_out = table.num_rows if final else (table.num_rows // size) * size
        if self.writer is None:
            self._open(table.schema)
        for start in range(0, n_out, size):
            self.writer.write_table(table.slice(start, min(size, n_out - start)),
                                    row_group_size=size)
            self.stats["row_groups"] += 1
        self.stats["samples"] += n_out
        rest = table.slice(n_out)
        self.pending, self.buffered = ([rest] if rest.num_rows else []), rest.num_rows


# ================================================================== published statistics
@renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
@dataclass(frozen=True)
class PublishedHistogram:
    """Reuse statistics of the published trace batches (``dlrm-locality-stats``), averaged.

    Attributes
    ----------
    source : str
        File parsed (or ``"embedded"``).
    batches : tuple of str
        Batch file names, e.g. ``fbgemm_t788_bs131072_0.pt``.
    samples_per_batch : int
        Samples per published batch (``batch_size``: its deprecated name, one release).
    num_tables : int
        Tables (features) per batch.
    lookups : float
        Mean IDs (indices) per batch.
    unique_rows : float
        Mean unique (table, row) pairs per batch.
    rows : ndarray, shape (17,)
        Mean fraction of unique rows per reuse bucket (:data:`REUSE_BUCKETS`): "histogram of col
        sizes".
    lookups_by_bucket : ndarray, shape (17,)
        Mean fraction of lookups on rows of each bucket: "ratio of index distribution".
    per_batch_rows, per_batch_lookups : ndarray, shape (batches, 17)
        The same, per batch, as printed (3 decimals).
    """

    source: str
    batches: tuple[str, ...]
    samples_per_batch: int
    num_tables: int
    lookups: float
    unique_rows: float
    rows: np.ndarray = field(repr=False)
    lookups_by_bucket: np.ndarray = field(repr=False)
    per_batch_rows: np.ndarray = field(repr=False)
    per_batch_lookups: np.ndarray = field(repr=False)

    batch_size = renamed_property("batch_size", "samples_per_batch", REMOVED_IN)

    @property
    def once_fraction(self) -> float:
        """Fraction of unique rows used exactly once in the batch."""
        return float(self.rows[0])

    @property
    def mean_reuse(self) -> float:
        """Lookups per unique row."""
        return self.lookups / self.unique_rows


_SECTION = re.compile(r"^(fbgemm_t(\d+)_bs(\d+)\S*\.pt)\s*$", re.M)
_BUCKET_LINE = re.compile(r"^\((\d+)(?:, (\d+)\]|\+):\s*([0-9.]+)\s*$")


def load_published_histogram(path: str | Path) -> PublishedHistogram:
    """Parse a ``locality_stats_*.txt`` file of Meta's ``dlrm-locality-stats`` data.

    Each section (one synthetic batch ``fbgemm_t<tables>_bs<batch>[_i].pt``) gives the lookups ("Avg #
    of indices"), the unique rows ("Avg # of unique cols"), the "Histogram of col sizes" (fraction of
    unique rows whose use count in the batch falls in each power-of-two bucket) and the "Ratio of index
    distribution at different column sizes" (fraction of lookups landing on rows of each bucket).
    Sections with the most common (tables, batch size) are averaged.

    Raises
    ------
    FormatError
        The file has no section, or a section misses a field or a bucket.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise FormatError(f"cannot read published locality stats {path}: {e}") from None
    heads = list(_SECTION.finditer(text))
    if not heads:
        raise FormatError(f"{path}: no 'fbgemm_t<tables>_bs<batch>.pt' section found")
    recs = []
    for i, m in enumerate(heads):
        body = text[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        rec = {"name": m.group(1), "tables": int(m.group(2)), "bs": int(m.group(3))}
        for key, pat in (("lookups", r"Avg # of indices:\s*([0-9.eE+]+)"),
                         ("unique", r"Avg # of unique cols:\s*([0-9.eE+]+)")):
            mm = re.search(pat, body)
            if not mm:
                raise FormatError(f"{path}: section {m.group(1)} has no '{pat.split(':')[0]}'")
            rec[key] = float(mm.group(1))
        for key, title in (("rows", "Histogram of col sizes:"),
                           ("lk", "Ratio of index distribution at different column sizes:")):
            j = body.find(title)
            if j < 0:
                raise FormatError(f"{path}: section {m.group(1)} has no '{title}'")
            vals = []
            for line in body[j + len(title):].strip().splitlines()[:len(REUSE_BUCKETS)]:
                bm = _BUCKET_LINE.match(line.strip())
                if not bm:
                    break
                vals.append(float(bm.group(3)))
            if len(vals) != len(REUSE_BUCKETS):
                raise FormatError(f"{path}: section {m.group(1)} '{title}' has {len(vals)} buckets, "
                                  f"expected {len(REUSE_BUCKETS)}")
            rec[key] = vals
        recs.append(rec)
    shapes = [(r["tables"], r["bs"]) for r in recs]
    common = max(set(shapes), key=shapes.count)
    recs = [r for r in recs if (r["tables"], r["bs"]) == common]
    rows = np.array([r["rows"] for r in recs])
    lk = np.array([r["lk"] for r in recs])
    return PublishedHistogram(
        source=str(path), batches=tuple(r["name"] for r in recs), samples_per_batch=common[1],
        num_tables=common[0], lookups=float(np.mean([r["lookups"] for r in recs])),
        unique_rows=float(np.mean([r["unique"] for r in recs])), rows=rows.mean(axis=0),
        lookups_by_bucket=lk.mean(axis=0), per_batch_rows=rows, per_batch_lookups=lk)


_P22_ROWS = [0.342, 0.144, 0.149, 0.138, 0.112, 0.068, 0.029, 0.010, 0.004, 0.002, 0.001, 0.001,
             0.0, 0.0, 0.0, 0.0, 0.0]
_P22_LOOKUPS = [0.027, 0.023, 0.040, 0.068, 0.105, 0.120, 0.099, 0.070, 0.059, 0.054, 0.040,
                0.07175, 0.064, 0.047, 0.021, 0.017125, 0.0750625]

#: The 2022 published statistics (16 batches of 131,072 samples over 788 tables), as averaged by
#: :func:`load_published_histogram` from ``locality_stats_2022.txt``; embedded so calibration works
#: without the data folder. The tests check it against the file.
PUBLISHED_2022 = PublishedHistogram(
    source="embedded: dlrm-locality-stats/locality_stats_2022.txt", batches=(),
    samples_per_batch=131072,
    num_tables=788, lookups=1405446070.9375, unique_rows=110259894.6875, rows=np.array(_P22_ROWS),
    lookups_by_bucket=np.array(_P22_LOOKUPS), per_batch_rows=np.array([_P22_ROWS]),
    per_batch_lookups=np.array([_P22_LOOKUPS]))


def _bucket_of(counts: np.ndarray) -> np.ndarray:
    return np.searchsorted(_BUCKET_UPPER, counts, side="left")


def reuse_histogram(ids: Any, weight: str = "rows") -> np.ndarray:
    """Reuse histogram of one batch, in the buckets of the published statistics.

    Parameters
    ----------
    ids : ndarray of int or Batch
        IDs of one table, or a :class:`Batch` (rows of different features are different rows).
    weight : {"rows", "lookups"}
        ``"rows"``: fraction of unique rows whose use count falls in each bucket (the published
        "histogram of col sizes"); ``"lookups"``: fraction of lookups landing on rows of each bucket
        (the published "ratio of index distribution").

    Returns
    -------
    ndarray of float64, shape (17,)
        Fractions per :data:`REUSE_BUCKETS` bucket (zeros for no IDs).
    """
    counts = _row_counts(ids)
    if weight not in ("rows", "lookups"):
        raise ConfigError(f"weight must be 'rows' or 'lookups', got {weight!r}")
    w = None if weight == "rows" else counts
    hist = np.bincount(_bucket_of(counts), weights=w, minlength=len(REUSE_BUCKETS)).astype(np.float64)
    total = hist.sum()
    return hist / total if total else hist


def _row_counts(ids: Any) -> np.ndarray:
    if isinstance(ids, Batch):
        parts = [np.unique(ids.feature_values(k), return_counts=True)[1] for k in ids.keys]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        raise ConfigError(f"ids must be integers, got dtype {arr.dtype}")
    return np.unique(arr.reshape(-1), return_counts=True)[1]


def tv_distance(p: Any, q: Any) -> float:
    """Total-variation distance ``0.5 * sum |p - q|`` between two histograms (each normalized)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ConfigError(f"histograms must be 1-D of equal length, got {p.shape} and {q.shape}")
    if p.sum() <= 0 or q.sum() <= 0 or (p < 0).any() or (q < 0).any():
        raise ConfigError("histograms must be non-negative with a positive sum")
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


# ================================================================== presets
#: Calibrated "production" table groups: (tables, Zipf alpha, mean IDs per sample, log2d), where
#: 2**log2d is the mean number of lookups per row in a batch: a table gets
#: ``num_rows = samples_per_batch * mean / 2**log2d`` rows (see :func:`_group_table`), so the
#: expected count of a row depends on its rank quantile, not on the scale. Output of
#: ``fit_table_family()`` (default arguments) against :data:`PUBLISHED_2022`; docs/SYNTHETIC.md.
_PRODUCTION_GROUPS: tuple[tuple[int, float, int, int], ...] = (
    (3, 0.0, 1, 1), (1, 1.1, 1, -2), (1, 1.2, 1, 1),
    (1, 0.0, 4, -1), (2, 0.0, 4, 5), (1, 0.0, 4, 8), (2, 0.3, 4, 4), (1, 0.3, 4, 12),
    (1, 0.3, 4, 13), (2, 0.5, 4, 12), (1, 0.7, 4, 5), (1, 0.9, 4, 2), (1, 1.1, 4, 1),
    (1, 0.3, 16, 4), (1, 0.3, 16, 11), (1, 0.5, 16, 11), (1, 0.7, 16, 5), (1, 0.7, 16, 6),
    (1, 0.8, 16, 2), (1, 0.9, 16, 1), (1, 0.9, 16, 7), (1, 1.0, 16, -1), (1, 1.0, 16, 2),
    (1, 0.7, 64, 3), (1, 0.7, 64, 4), (1, 0.8, 64, 6), (1, 1.7, 64, -2),
)

_PRODUCTION_REF_BATCH = 131072


def _group_table(name: str, alpha: float, mean: int, log2d: int, samples_per_batch: int
                 ) -> TableSpec:
    """One table of a calibrated family: ``num_rows = samples_per_batch * mean / 2**log2d``;
    single ID for mean 1, poisson lengths below 16, lognormal (sigma 1, cap 16 x mean) from 16 IDs
    per sample."""
    dist = "fixed" if mean == 1 else "poisson" if mean < 16 else "lognormal"
    rows = round(samples_per_batch * mean / 2.0 ** log2d)
    return TableSpec(name, int(min(MAX_ROWS, max(1, rows))),
                     float(alpha), "pooled", dist, float(mean), None if mean == 1 else 16 * mean,
                     1.0)


def _nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """Non-negative least squares, Lawson & Hanson (1974) active-set method."""
    n = A.shape[1]
    free = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    for _ in range(max_iter):
        w = A.T @ (b - A @ x)
        if free.all() or w[~free].max() <= 1e-12:
            break
        free[np.argmax(np.where(free, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(A[:, free], b, rcond=None)[0]
            if (z[free] > 0).all():
                break
            neg = free & (z <= 0)
            x = x + np.min(x[neg] / (x[neg] - z[neg])) * (z - x)
            free &= x > 1e-15
            x[~free] = 0.0
        x = z
    return x


@renamed_keywords(REMOVED_IN, batch_sizes="samples_per_batch")
def fit_table_family(target: PublishedHistogram | None = None,
                     samples_per_batch: Sequence[int] = (1024, 4096, 16384),
                     alphas: Sequence[float] = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4,
                                                1.7),
                     log2ds: Sequence[int] = tuple(range(-6, 15)),
                     means: Sequence[int] = (1, 4, 16, 64), max_tables: int = 32,
                     lookup_weight: float = 0.3, table_cost: float = 5e-5, restarts: int = 40,
                     seed: int = 0) -> tuple[tuple[int, float, int, int], ...]:
    """Fit a family of pooled Zipf tables to a published reuse histogram (how the ``"production"``
    preset was made).

    Every candidate table (``alpha`` x ``log2d`` x ``mean``; see :func:`_group_table`) is simulated
    once per batch of each of ``samples_per_batch`` samples (``batch_sizes``: its deprecated name,
    one release). The multiset of tables (at most ``max_tables``) minimizes, summed over the
    batches, ``TV(rows) + lookup_weight * TV(lookups) + table_cost * tables``: a non-negative
    least-squares relaxation (mixed histograms proportional to the targets) is rounded, then improved
    by local search (add, remove or swap one table) with ``restarts`` random kicks (iterated local
    search; swap 3 tables, keep the result when it is better). About a minute on 2 cores.

    Returns
    -------
    tuple of (tables, alpha, mean IDs per sample, log2d)
        The groups, in the format of the production preset.
    """
    cands, H, G = _candidate_histograms(samples_per_batch, alphas, log2ds, means, seed)
    return _search_family(target, cands, H, G, max_tables, lookup_weight, table_cost, restarts,
                          seed)


def _candidate_histograms(samples_per_batch, alphas, log2ds, means, seed):
    import itertools

    cands = list(itertools.product(alphas, log2ds, means))
    rng = np.random.default_rng(seed)
    H = {B: np.zeros((len(cands), len(REUSE_BUCKETS))) for B in samples_per_batch}
    G = {B: np.zeros((len(cands), len(REUSE_BUCKETS))) for B in samples_per_batch}
    for i, (a, ld, m) in enumerate(cands):
        for B in samples_per_batch:
            t = _group_table("c", a, m, ld, B)
            lens = sample_lengths(B, t.length, t.mean_length, rng, t.max_length, t.sigma)
            counts = np.unique(zipf_ranks(int(lens.sum()), t.num_rows, a, rng),
                               return_counts=True)[1]
            b = _bucket_of(counts)
            H[B][i] = np.bincount(b, minlength=len(REUSE_BUCKETS))
            G[B][i] = np.bincount(b, weights=counts, minlength=len(REUSE_BUCKETS))
    return cands, H, G


def _search_family(target, cands, H, G, max_tables, lookup_weight, table_cost, restarts, seed):
    pub = target if target is not None else PUBLISHED_2022
    tr = pub.rows / pub.rows.sum()
    tl = pub.lookups_by_bucket / pub.lookups_by_bucket.sum()
    sizes = list(H)
    rng = np.random.default_rng([seed, 1])

    def tv(X: np.ndarray, t: np.ndarray) -> np.ndarray:
        s = X.sum(axis=1, keepdims=True)
        return 0.5 * np.abs(X / np.where(s > 0, s, 1.0) - t).sum(axis=1)

    def cost(rows: dict, lks: dict, tables: int) -> np.ndarray:
        return sum(tv(rows[B], tr) + lookup_weight * tv(lks[B], tl) for B in sizes) \
            + table_cost * tables

    def descend(n: np.ndarray) -> tuple[float, np.ndarray]:
        while True:
            rows = {B: n @ H[B] for B in sizes}
            lks = {B: n @ G[B] for B in sizes}
            T = int(n.sum())
            best = cost({B: rows[B][None] for B in sizes}, {B: lks[B][None] for B in sizes}, T)[0]
            move = None
            if T < max_tables:
                o = cost({B: rows[B] + H[B] for B in sizes}, {B: lks[B] + G[B] for B in sizes},
                         T + 1)
                j = int(np.argmin(o))
                if o[j] < best - 1e-12:
                    best, move = o[j], (None, j)
            for i in np.flatnonzero(n):
                o = cost({B: rows[B][None] - H[B][i] for B in sizes},
                         {B: lks[B][None] - G[B][i] for B in sizes}, T - 1)[0]
                if o < best - 1e-12:
                    best, move = o, (i, None)
                o = cost({B: rows[B] - H[B][i] + H[B] for B in sizes},
                         {B: lks[B] - G[B][i] + G[B] for B in sizes}, T)
                j = int(np.argmin(o))
                if o[j] < best - 1e-12:
                    best, move = o[j], (i, j)
            if move is None:
                return float(best), n
            if move[0] is not None:
                n[move[0]] -= 1
            if move[1] is not None:
                n[move[1]] += 1

    # relaxation: sum_c n_c H[c] proportional to tr, sum_c n_c G[c] proportional to tl, sum n = T
    blocks = []
    for B in sizes:
        blocks.append((H[B] - np.outer(H[B].sum(axis=1), tr)).T / (B * 16.0))
        blocks.append(lookup_weight * (G[B] - np.outer(G[B].sum(axis=1), tl)).T / (B * 16.0))
    A = np.vstack(blocks + [np.ones((1, len(cands)))])
    rhs = np.zeros(A.shape[0])
    rhs[-1] = max_tables
    n = np.round(_nnls(A, rhs)).astype(np.int64)
    while n.sum() > max_tables:
        n[np.argmax(n)] -= 1
    best, n = descend(n)
    for _ in range(restarts):
        kicked = n.copy()
        for _ in range(3):
            on = np.flatnonzero(kicked)
            if on.size:
                kicked[rng.choice(on)] -= 1
            kicked[rng.integers(len(cands))] += 1
        c, kicked = descend(kicked)
        if c < best - 1e-12:
            best, n = c, kicked
    groups = [(int(n[i]), float(cands[i][0]), int(cands[i][2]), int(cands[i][1]))
              for i in np.flatnonzero(n)]
    return tuple(sorted(groups, key=lambda g: (g[2], g[1], g[3])))


def preset(name: str, scale: float = 1.0) -> TraceSpec:
    """A named table family.

    Parameters
    ----------
    name : {"production", "sequence", "default"}
        ``"production"``: pooled tables calibrated to Meta's 2022 reuse histogram (see
        :func:`calibration_distance`); its reference batch is ``131072 * scale`` samples.
        ``"sequence"``: four long-history sequence tables (hundreds to ~1000 IDs per sample).
        ``"default"``: the four tables of the embedded default trace.
    scale : float
        Multiplies row counts (and the samples of the production reference batch), > 0. Lengths (IDs per
        sample) do not scale.
    """
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise ConfigError(f"scale must be a number > 0, got {scale!r}") from None
    if not math.isfinite(s) or s <= 0:
        raise ConfigError(f"scale must be finite and > 0, got {scale!r}")

    def rows(x: float) -> int:
        return int(min(MAX_ROWS, max(1, round(x * s))))

    if name == "production":
        bs = max(1, round(_PRODUCTION_REF_BATCH * s))
        tables = [_group_table(f"prod_{i:02d}", a, m, log2d, bs)
                  for i, (a, m, log2d) in enumerate(
                      (a, m, log2d) for count, a, m, log2d in _PRODUCTION_GROUPS
                      for _ in range(count))]
        return TraceSpec("production", tuple(tables), bs, 1000.0,
                         "pooled tables calibrated to the 2022 dlrm-locality-stats reuse histogram")
    if name == "sequence":
        tables = (
            TableSpec("click_history", rows(200_000_000), 1.05, "sequence", "lognormal", 800.0,
                      1024, 0.5),
            TableSpec("view_history", rows(500_000_000), 0.95, "sequence", "lognormal", 500.0,
                      1024, 0.7),
            TableSpec("ad_history", rows(50_000_000), 1.1, "sequence", "lognormal", 300.0, 1024,
                      0.8),
            TableSpec("search_history", rows(100_000_000), 0.9, "sequence", "geometric", 150.0,
                      1024),
        )
        return TraceSpec("sequence", tables, 1024, 1000.0,
                         "long user histories for FlexShard-style sequence-table experiments")
    if name == "default":
        # Zipf exponents and lookups per row (2**log2d) of calibrated production groups:
        # (alpha 1.0, log2d 2), (1.1, 1), (0.3, 4) and (1.1, -2); rows = 131072 * mean / 2**log2d.
        ref = _PRODUCTION_REF_BATCH
        tables = (
            TableSpec("item_history", rows(ref * 48 / 4), 1.0, "sequence", "lognormal", 48.0, 256,
                      0.8),
            TableSpec("query_tokens", rows(ref * 6 / 2), 1.1, "sequence", "geometric", 6.0, 32),
            TableSpec("page_topics", rows(ref * 3 / 16), 0.3, "pooled", "poisson", 3.0, 16),
            TableSpec("ad_id", rows(ref * 4), 1.1, "pooled", "fixed", 1.0),
        )
        return TraceSpec("default", tables, 1024, 1000.0,
                         "embedded default trace: long and short sequences, a pooled bag, one ID")
    raise ConfigError(f"unknown preset {name!r}; expected 'production', 'sequence' or 'default'")


@renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
@dataclass(frozen=True)
class CalibrationReport:
    """Generated vs published reuse histograms of one batch of the ``"production"`` preset
    (``samples_per_batch`` samples; ``batch_size`` is its deprecated name, one release)."""

    scale: float
    seed: int
    samples_per_batch: int
    lookups: int
    unique_rows: int
    rows: np.ndarray = field(repr=False)
    published_rows: np.ndarray = field(repr=False)
    tv_rows: float = 0.0
    lookups_by_bucket: np.ndarray = field(repr=False, default=None)
    published_lookups: np.ndarray = field(repr=False, default=None)
    tv_lookups: float = 0.0

    batch_size = renamed_property("batch_size", "samples_per_batch", REMOVED_IN)

    @property
    def mean_reuse(self) -> float:
        """Lookups per unique row."""
        return self.lookups / max(1, self.unique_rows)

    def to_markdown(self) -> str:
        """A markdown table: bucket, generated and published fractions (rows and lookups)."""
        lines = ["| reuse bucket | rows: generated | rows: published | lookups: generated "
                 "| lookups: published |", "|---|---:|---:|---:|---:|"]
        for i, b in enumerate(REUSE_BUCKETS):
            lines.append(f"| {b} | {self.rows[i]:.3f} | {self.published_rows[i]:.3f} | "
                         f"{self.lookups_by_bucket[i]:.3f} | {self.published_lookups[i]:.3f} |")
        lines.append(f"| **TV distance** | **{self.tv_rows:.3f}** | | **{self.tv_lookups:.3f}** | |")
        return "\n".join(lines)


def calibration_distance(scale: float = 1 / 32, seed: int = 0,
                         published: PublishedHistogram | None = None) -> CalibrationReport:
    """Generate one reference batch of ``preset("production", scale)`` and compare its reuse
    histograms with the published ones (total-variation distance, rows and lookups weighted).

    Parameters
    ----------
    scale : float
        Preset scale; the batch has ``round(131072 * scale)`` samples.
    seed : int
    published : PublishedHistogram, optional
        Target; default :data:`PUBLISHED_2022`.
    """
    pub = published if published is not None else PUBLISHED_2022
    spec = preset("production", scale)
    batch = next(spec.generate(spec.samples_per_batch, spec.samples_per_batch, seed))
    counts = _row_counts(batch)
    b = _bucket_of(counts)
    rows = np.bincount(b, minlength=len(REUSE_BUCKETS)) / counts.size
    lk = np.bincount(b, weights=counts, minlength=len(REUSE_BUCKETS)) / counts.sum()
    return CalibrationReport(scale=float(scale), seed=seed,
                             samples_per_batch=spec.samples_per_batch,
                             lookups=int(counts.sum()), unique_rows=int(counts.size), rows=rows,
                             published_rows=pub.rows / pub.rows.sum(),
                             tv_rows=tv_distance(rows, pub.rows), lookups_by_bucket=lk,
                             published_lookups=pub.lookups_by_bucket / pub.lookups_by_bucket.sum(),
                             tv_lookups=tv_distance(lk, pub.lookups_by_bucket))


# ================================================================== default trace and CLI
@renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
def make_default_trace(path: str | Path, num_samples: int = 30000, seed: int = 20240501,
                       samples_per_batch: int = 1024) -> dict[str, int]:
    """Write the embedded default trace (``preset("default")``) to ``path`` (parquet).

    ``samples_per_batch``: samples generated per batch (memory only: the trace does not depend on
    it). Returns :func:`write_log`'s counts.
    """
    spec = preset("default")
    meta = {"preset": "default", "seed": seed, "num_samples": num_samples,
            "samples_per_second": spec.samples_per_second, "block_samples": BLOCK_SAMPLES,
            "command": f"python -m flexshard_stream.sources.synth default {path}"}
    return write_log(spec.generate(num_samples, samples_per_batch, seed), path, spec.tables,
                     row_group_size=8192, metadata=meta)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``default PATH``, ``preset NAME PATH``, ``calibrate``, ``fit``."""
    ap = argparse.ArgumentParser(prog="python -m flexshard_stream.sources.synth",
                                 description="Seeded synthetic embedding-ID traces.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("default", help="write the embedded default trace (parquet)")
    d.add_argument("path")
    d.add_argument("--samples", type=int, default=30000)
    d.add_argument("--seed", type=int, default=20240501)
    p = sub.add_parser("preset", help="write a preset's trace (parquet)")
    p.add_argument("name", choices=["production", "sequence", "default"])
    p.add_argument("path")
    p.add_argument("--scale", type=float, default=None,
                   help="row-count scale (default: 1/32 for production, 1 otherwise)")
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--samples-per-batch", type=int, default=1024,
                   help="samples generated per batch (memory only; the trace does not depend on it)")
    p.add_argument("--batch-size", dest="samples_per_batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    f = sub.add_parser("fit", help="re-run the production calibration search (about a minute)")
    f.add_argument("--published", default=None, help="a locality_stats_*.txt file")
    f.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("calibrate", help="print the production preset's calibration table")
    c.add_argument("--scale", type=float, default=1 / 32)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--published", default=None, help="a locality_stats_*.txt file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "default":
            out = make_default_trace(args.path, args.samples, args.seed)
            print(json.dumps({"path": args.path, **out}))
        elif args.cmd == "preset":
            scale = args.scale if args.scale is not None else (
                1 / 32 if args.name == "production" else 1.0)
            spec = preset(args.name, scale)
            out = write_log(spec.generate(args.samples, args.samples_per_batch, args.seed), args.path,
                            spec.tables, metadata={"preset": args.name, "scale": scale,
                                                   "seed": args.seed})
            print(json.dumps({"path": args.path, **out}))
        elif args.cmd == "fit":
            pub = load_published_histogram(args.published) if args.published else None
            for group in fit_table_family(pub, seed=args.seed):
                print(group)
        else:
            pub = load_published_histogram(args.published) if args.published else None
            rep = calibration_distance(args.scale, args.seed, pub)
            print(rep.to_markdown())
            print(json.dumps({"scale": rep.scale, "samples_per_batch": rep.samples_per_batch,
                              "lookups": rep.lookups, "unique_rows": rep.unique_rows,
                              "mean_reuse": round(rep.mean_reuse, 2), "tv_rows": rep.tv_rows,
                              "tv_lookups": rep.tv_lookups}))
    except (ConfigError, FormatError, LogError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
