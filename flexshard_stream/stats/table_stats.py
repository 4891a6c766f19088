"""Statistics of one embedding table, updated from the ID stream by the Numba kernels.

A :class:`TableStats` holds either exact counts (row count known and small enough) or sketches
(count-min, heavy hitters admitted through the count-min estimate, HyperLogLog), plus the
sequence-length distribution (a DataSketches KLL sketch) and exact totals. With sampled ingestion
(``SketchConfig.sample_k > 1``) the count-min sketch and the heavy hitters see one ID in ``k``, the
length sketch one sample in ``k``, and every reported count is scaled back, its bounds widened by
the sampling error; :meth:`TableStats.resample` changes ``k`` mid-stream. It speaks the DataSketches
verbs: ``update``, ``merge``,
``estimate`` / ``bounds``, ``to_bytes`` / ``from_bytes``. Callers normally go through
:class:`flexshard_stream.stats.stream.StreamStats`, which validates whole batches first.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import datasketches as ds
import numpy as np

from ..errors import BatchError, ConfigError, FormatError, IncompatibleError
from ..formats.container import pack, unpack
from ..formats.fields import INT64_MAX, field_int, field_number, field_str, mapping
from ..formats.interop import check_kll_ints_image
from ..kernels.countmin import cms_add_counts, cms_query
from ..kernels.exact import hashed_exact_update
from ..kernels.frequent import hh_capacity, hh_lookup, hh_misplaced, hh_rebuild, hh_union
from ..kernels.hashing import hash_ids
from ..kernels.hll import hll_update_hashed
from ..kernels.batchcheck import NEGATIVE, TOO_LARGE, check_ids
from ..kernels.pipeline import update_table
from .config import SketchConfig
from .summary import FrequencySummary

__all__ = ["SAMPLE_Z", "TableStats", "checked_table_meta", "hll_estimate",
           "sampled_count_bounds", "sketch_config"]

_U32_MAX = np.uint64(0xFFFFFFFF)
_EMPTY_U32 = np.zeros(0, dtype=np.uint32)
#: Layout of a table inside a saved container: 1 = Misra-Gries with one global offset (read and
#: converted), 2 = heavy hitters with a per-row error and a threshold, plus the sampler's state,
#: 3 = version 2 plus ``sample_variance`` in the header. Version 3 is written only when that
#: variance says more than ``sample_k - 1`` (after a lower rate replaced a higher one,
#: :meth:`TableStats.resample`), so every file a version-2 reader would read right stays version 2.
STATS_VERSION = 2
STATS_VERSION_VARIANCE = 3
#: 4 = version 2 plus: the header's ``exact_phase`` (true: the heavy-hitter arrays, of
#: ``SketchConfig.exact_phase_lg_size`` slots, hold every row seen with its exact count, the
#: count-min and HyperLogLog arrays are still empty), ``sample_variance`` when version 3 would carry
#: it, and the array ``length_hist``: the samples of each length below :data:`LENGTH_HISTOGRAM`
#: (the KLL sketch holds the longer ones). Written only when a table is in its exact phase or has
#: counted a length in the histogram, so a file a version-2 or 3 reader reads right stays that
#: version, and one it would misread is refused by it.
STATS_VERSION_FLAGS = 4
#: Sequence lengths (IDs per sample) below this are counted exactly, one counter per length; a KLL
#: update costs 25-40 ns a sample, more than a one-hot feature's ID costs to count.
LENGTH_HISTOGRAM = 64
#: Normal quantile of the sampling bounds: 3 standard deviations, about 99.7% per row (two-sided).
SAMPLE_Z = 3.0
#: Largest heavy-hitter count or error a loaded table may hold (far beyond any real stream, and
#: far from int64 overflow when two are added).
_HH_VALUE_LIMIT = 1 << 60


def sampled_count_bounds(lower: np.ndarray, upper: np.ndarray, k: int, z: float = SAMPLE_Z,
                         variance: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on true counts from bounds ``[lower, upper]`` on the counts of a 1-in-``k`` sample.

    A row with true count ``f`` has ``Binomial(f, 1/k)`` sampled occurrences, so ``k * s`` has mean
    ``f`` and variance ``(k - 1) f``. The bounds solve ``f -/+ z sqrt(V f) = k * s`` for ``f``::

        L(s) = ((-z a + sqrt(z^2 a^2 + 4 k s)) / 2)^2,   U(s) = ((z a + sqrt(z^2 a^2 + 4 k s)) / 2)^2

    with ``a = sqrt(V)``, ``V = variance`` (default ``k - 1``; larger when part of the counts was
    sampled at a lower rate, :meth:`TableStats.resample`): ``L(lower) <= f <= U(upper)`` with
    probability about that of a normal variable within ``z`` standard deviations (``z = 3``:
    99.7%). ``k = 1`` with no variance returns the inputs.
    """
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    v = float(k - 1) if variance is None else float(variance)
    if v == 0.0:
        return lower * k, upper * k
    za = z * math.sqrt(v)
    with np.errstate(invalid="ignore"):  # an infinite upper bound stays infinite
        lo = ((np.sqrt(za * za + 4.0 * k * lower) - za) / 2.0) ** 2
        hi = ((np.sqrt(za * za + 4.0 * k * upper) + za) / 2.0) ** 2
    return lo, hi


def _slots(lg: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty heavy-hitter arrays (keys, counts, errors) of ``2**lg`` slots."""
    return (np.zeros(1 << lg, dtype=np.int64), np.zeros(1 << lg, dtype=np.int64),
            np.zeros(1 << lg, dtype=np.int64))


def _checked_max(ids: np.ndarray, num_rows: int | None) -> tuple[int, int]:
    """``(code, largest ID)`` of int64 ``ids`` (-1 when empty) by the kernel that validates
    batches (:func:`~flexshard_stream.kernels.batchcheck.check_ids`): ``NEGATIVE``, ``TOO_LARGE``
    (an ID at or above ``num_rows``) or ``OK``."""
    limit = -1 if num_rows is None or num_rows > INT64_MAX else num_rows
    hi = np.empty(1, np.int64)
    _, code = check_ids(ids, np.array([0, ids.size], np.int64), np.array([limit], np.int64), hi)
    return int(code), int(hi[0])


def sketch_config(d: Any, where: str) -> SketchConfig:
    """The :class:`SketchConfig` a saved file describes with ``d``; FormatError naming ``where``
    unless ``d`` is an object of known keys whose integer fields are integers and float fields
    finite numbers (a float ``hh_lg_size`` would pass the range checks and fail in a kernel)."""
    d = mapping(d, f"{where} config")
    fields = SketchConfig.__dataclass_fields__
    for key, value in d.items():
        f = fields.get(key)
        if f is None:
            continue                                   # SketchConfig names unknown keys
        if isinstance(f.default, int):
            field_int(d, key, f"{where} config", lo=-INT64_MAX - 1)
        elif isinstance(f.default, float):
            field_number(d, key, f"{where} config")
        else:
            field_str(d, key, f"{where} config")
    try:
        return SketchConfig.from_dict(d)
    except ConfigError as e:
        raise FormatError(f"{where}: sketch config: {e}") from None


def _saved_bytes(config: SketchConfig, num_rows: int | None, version: int,
                 exact_phase: bool) -> int:
    """Bytes of the count arrays a saved table of ``num_rows`` rows holds under ``config`` (exact
    counts, or count-min, heavy-hitter and HyperLogLog arrays): keys and counts per heavy-hitter
    slot, and from :data:`STATS_VERSION` 2 an error too. Building the table allocates at most 1.5
    times this."""
    if config.uses_exact(num_rows):
        return 4 * num_rows
    lg = config.exact_phase_lg_size if exact_phase else config.hh_lg_size
    return config.sketch_array_bytes(16 if version == 1 else 24, lg)


def checked_table_meta(meta: Any, arrays: dict[str, np.ndarray], source: str
                       ) -> tuple[str, int | None, SketchConfig, int]:
    """``(name, num_rows, config, stats_version)`` of a saved table, checked before anything is
    allocated: field types and ranges, a version this library reads, and that the arrays its
    config implies fit in the bytes the file holds for it (a damaged config or row count cannot
    make loading allocate more than the file holds). FormatError naming the file and field
    otherwise."""
    meta = mapping(meta, f"{source}: table")
    name = field_str(meta, "name", f"{source}: table")
    where = f"{source}: table {name!r}"
    if not name:
        raise FormatError(f"{where}: field 'name' is empty")
    if "num_rows" not in meta:
        raise FormatError(f"{where}: field 'num_rows' is missing")
    num_rows = None if meta["num_rows"] is None else field_int(meta, "num_rows", where, lo=1)
    config = sketch_config(meta.get("config"), where)
    for key in ("total", "samples", "saturated"):
        field_int(meta, key, where)
    field_int(meta, "max_id", where, lo=-1)
    version = field_int(meta, "stats_version", where, default=1)
    if version not in (1, STATS_VERSION, STATS_VERSION_VARIANCE, STATS_VERSION_FLAGS):
        raise FormatError(f"{where}: statistics version {version}; this flexshard_stream reads "
                          f"versions 1 to {STATS_VERSION_FLAGS}")
    exact_phase = _saved_exact_phase(meta, version, where)
    if exact_phase and not config.uses_exact_phase(num_rows):
        raise FormatError(f"{where}: 'exact_phase' is true for a table that has none (exact "
                          f"counts, or sampled ingestion 1 in {config.sample_k})")
    need = _saved_bytes(config, num_rows, version, exact_phase)
    have = sum(a.nbytes for a in arrays.values())
    if need > have:
        raise FormatError(f"{where}: its sketch config and num_rows {num_rows} make "
                          f"{need} bytes of counters; the file holds {have} for the table")
    return name, num_rows, config, version


def _saved_exact_phase(meta: dict[str, Any], version: int, where: str) -> bool:
    """Whether a saved table is in its exact phase: the header's ``exact_phase`` from version 4
    (a boolean, FormatError naming ``where`` otherwise), false before."""
    if version < STATS_VERSION_FLAGS:
        return False
    value = meta.get("exact_phase")
    if not isinstance(value, bool):
        raise FormatError(f"{where}: field 'exact_phase' is {value!r}, expected true or false")
    return value


def _lengths_sketch(blob: np.ndarray, config: SketchConfig, what: str) -> ds.kll_ints_sketch:
    """The sequence-length KLL sketch saved as ``blob`` (uint8), reached by DataSketches only
    after :func:`~flexshard_stream.formats.interop.check_kll_ints_image` accepted the image, and
    refused unless it serializes back to the same bytes (nothing the check missed was
    normalized away). FormatError naming ``what`` otherwise."""
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise FormatError(f"{what}: expected uint8 bytes, got {blob.dtype} of shape {blob.shape}")
    image = blob.tobytes()
    check_kll_ints_image(image, config.length_k, what)
    try:
        sketch = ds.kll_ints_sketch.deserialize(image)
    except (RuntimeError, ValueError, IndexError) as e:
        raise FormatError(f"{what}: DataSketches refused the KLL image ({e})") from None
    if bytes(sketch.serialize()) != image:
        raise FormatError(f"{what}: the KLL image does not serialize back to itself")
    return sketch


def hll_estimate(regs: np.ndarray) -> float:
    """Cardinality from HyperLogLog registers: Ertl's improved estimator (arXiv:1702.01284, eq. 12).

    Unbiased from 0 to far beyond 2**p without empirical bias tables.
    """
    m = regs.size
    p = int(round(math.log2(m)))
    q = 64 - p
    c = np.bincount(regs, minlength=q + 2).astype(np.float64)

    def sigma(x: float) -> float:
        if x == 1.0:
            return math.inf
        y, z = 1.0, x
        while True:
            x *= x
            z_old = z
            z += x * y
            y += y
            if z == z_old:
                return z

    def tau(x: float) -> float:
        if x == 0.0 or x == 1.0:
            return 0.0
        y, z = 1.0, 1.0 - x
        while True:
            x = math.sqrt(x)
            z_old = z
            y *= 0.5
            z -= (1.0 - x) ** 2 * y
            if z == z_old:
                return z / 3.0

    z = m * tau(1.0 - c[q + 1] / m)
    for k in range(q, 0, -1):
        z = 0.5 * (z + c[k])
    z += m * sigma(c[0] / m)
    if math.isinf(z):
        return 0.0
    return m * m / (2.0 * math.log(2.0)) / z


class TableStats:
    """Streaming statistics of one table (lookups, not weights).

    Parameters
    ----------
    name : str
        Table (feature) name, used in messages.
    num_rows : int or None
        Rows in the table when known: IDs must lie in ``[0, num_rows)``.
    config : SketchConfig
    """

    def __init__(self, name: str, num_rows: int | None = None,
                 config: SketchConfig | None = None):
        self.name = name
        self.num_rows = num_rows
        self.config = config or SketchConfig()
        c = self.config
        self.exact = c.uses_exact(num_rows)
        #: sketched table still counting every row seen exactly (docs/STATISTICS.md, "Exact
        #: phase"); it ends, once, when a new row finds the exact table full
        self.exact_phase = c.uses_exact_phase(num_rows)
        if self.exact:
            self._counts = np.zeros(num_rows, dtype=np.uint32)
            self._cms = np.zeros((c.cms_depth, 0), dtype=np.uint32)
            self._mg_keys = np.zeros(0, dtype=np.int64)
            self._mg_vals = np.zeros(0, dtype=np.int64)
            self._mg_errs = np.zeros(0, dtype=np.int64)
            self._hll = np.zeros(0, dtype=np.uint8)
        else:
            self._counts = _EMPTY_U32
            width = c.cms_width if c.cms_mode != "off" else 0
            self._cms = np.zeros((c.cms_depth, width), dtype=np.uint32)
            lg = c.exact_phase_lg_size if self.exact_phase else c.hh_lg_size
            self._mg_keys, self._mg_vals, self._mg_errs = _slots(lg)  # counts 0 = empty slot
            self._hll = np.zeros(1 << c.hll_p, dtype=np.uint8)
        self._mg_meta = np.zeros(3, dtype=np.int64)  # live rows, threshold, occurrences counted
        self._sample_state = np.array([-1, 0], dtype=np.int64)  # IDs to skip, uniforms drawn
        #: V: the variance of a scaled estimate is at most ``V`` times the true count (``k - 1``
        #: unless a lower rate replaced a higher one, :meth:`resample`; it decays with the counts)
        self.sample_variance = self._rate_variance
        self._lengths = ds.kll_ints_sketch(c.length_k)   # lengths >= LENGTH_HISTOGRAM
        self._length_hist = np.zeros(LENGTH_HISTOGRAM, dtype=np.uint64)
        self.total = 0          # lookups
        self.samples = 0        # samples (bags)
        self.saturated = 0      # lookups that hit a saturated exact counter
        self.max_id = -1        # largest ID seen

    # ------------------------------------------------------------- updating
    def update(self, ids: np.ndarray, lengths: np.ndarray | None = None) -> "TableStats":
        """Count ``ids`` (int64) as one lookup each; ``lengths`` (per-sample IDs) feed the length
        distribution. Validates first (dtype, negative, out of range): a rejected update changes
        nothing."""
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise BatchError(f"IDs must be integers, got dtype {ids.dtype}", feature=self.name,
                             field="values")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        code, hi = _checked_max(ids, self.num_rows)
        if code == NEGATIVE:
            p = int(np.flatnonzero(ids < 0)[0])
            raise BatchError(f"negative ID {int(ids[p])}; expected >= 0", feature=self.name,
                             field="values", position=p)
        if code == TOO_LARGE:
            p = int(np.flatnonzero(ids >= self.num_rows)[0])
            raise BatchError(f"ID {int(ids[p])} out of range; expected < num_rows "
                             f"{self.num_rows}", feature=self.name, field="values", position=p)
        if lengths is not None:
            lengths = np.ascontiguousarray(lengths, dtype=np.int64)
            if lengths.size and (lengths.min() < 0 or lengths.sum() != ids.size):
                raise BatchError(f"lengths must be >= 0 and sum to {ids.size}", feature=self.name,
                                 field="lengths")
        self.update_validated(ids, lengths, hi)
        return self

    def update_validated(self, ids: np.ndarray, lengths: np.ndarray | None, max_id: int) -> None:
        """Hot path: count ``ids`` (contiguous int64, already checked: none negative, none at or
        above ``num_rows``) whose largest is ``max_id``; ``lengths`` (int64 IDs per sample, summing
        to ``ids.size``) or None. :meth:`update` and ``StreamStats.update_validated`` call it after
        validating; nothing is checked here. Releases the GIL inside the kernel."""
        if ids.size:
            rest = self._count_exact_phase(ids) if self.exact_phase else ids
            if rest.size:
                self._count(rest)
            self.total += int(ids.size)
            if max_id > self.max_id:
                self.max_id = max_id
        if lengths is not None and lengths.size:
            self._update_lengths(lengths)

    def _count(self, ids: np.ndarray) -> None:
        """The fused kernel over validated ``ids``: exact counts, or the sketches."""
        c = self.config
        self.saturated += int(update_table(ids, c.seed, self._cms, c.cms_mode == "conservative",
                                           self._mg_keys, self._mg_vals, self._mg_errs,
                                           self._mg_meta, self._hll, c.hll_p, self._counts,
                                           c.sample_k, c.sample_seed, self._sample_state))

    def _count_exact_phase(self, ids: np.ndarray) -> np.ndarray:
        """Count ``ids`` in the exact table; returns the IDs left when a new row found it full
        (the phase is then over: count them in the sketches)."""
        done = hashed_exact_update(ids, self.config.seed, self._mg_keys, self._mg_vals,
                                   self._mg_meta)
        rest = ids[int(done):]
        if rest.size:
            self._leave_exact_phase()
        return rest

    def _exact_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, counts)`` of the rows in the exact table (copies)."""
        live = self._mg_vals > 0
        return self._mg_keys[live], self._mg_vals[live]

    def _rebuild_exact(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Refill the heavy-hitter arrays with exact ``keys``/``counts`` (errors 0) under
        threshold 0, raised to the rows' median while more rows remain than the arrays track
        (:func:`hh_rebuild`); the occurrences counted (``mg_meta[2]``) stay."""
        counted = int(self._mg_meta[2])
        hh_rebuild(self._mg_keys, self._mg_vals, self._mg_errs, self._mg_meta, keys, counts,
                   np.zeros_like(counts), 0, self.config.seed)
        self._mg_meta[2] = counted

    def _leave_exact_phase(self) -> None:
        """End the exact phase: every row's exact count goes into the count-min sketch (plain: it
        is then the sketch of the stream counted so far, as if counted there from the start) and
        its hash into the HyperLogLog registers (exactly the registers of that stream: they depend
        only on the rows seen); the heavy-hitter table is rebuilt at its own size from the exact
        counts with threshold 0, raised to the rows' median while more rows remain than it tracks
        (every row dropped counts at most the threshold). All bounds then hold as for a table
        sketched from its first ID."""
        c = self.config
        keys, counts = self._exact_rows()
        cms_add_counts(self._cms, keys, counts, c.seed, c.cms_mode == "conservative")
        hashes = hash_ids(keys, c.seed, np.empty(keys.size, dtype=np.uint64))
        hll_update_hashed(self._hll, c.hll_p, hashes, hashes.size)
        self._mg_keys, self._mg_vals, self._mg_errs = _slots(c.hh_lg_size)
        self._rebuild_exact(keys, counts)
        self.exact_phase = False

    def _update_lengths(self, lengths: np.ndarray) -> None:
        """Feed the length sketch: every sample, or with ``sample_k > 1`` one sample in ``k`` (each
        whose position in the whole stream, offset by ``sample_seed``, is a multiple of ``k``: the
        same samples however the stream is cut into batches). A KLL update costs tens of ns per
        sample, more than the IDs of a one-hot feature cost; the quantiles of a sample of samples
        estimate those of all of them, and ``samples`` (so the mean length) stays exact."""
        k = self.config.sample_k
        if k > 1:
            first = -(self.samples + self.config.sample_seed) % k
            kept = lengths[first::k]
        else:
            kept = lengths
        if kept.size:
            self._count_lengths(kept)
        self.samples += int(lengths.size)

    def _count_lengths(self, kept: np.ndarray) -> None:
        """Lengths below :data:`LENGTH_HISTOGRAM` into the exact histogram (one ``bincount``),
        the others into the KLL sketch (a contiguous writable copy: DataSketches' binding rejects
        read-only arrays)."""
        if int(kept.max()) < LENGTH_HISTOGRAM:
            self._length_hist += np.bincount(kept, minlength=LENGTH_HISTOGRAM).astype(np.uint64)
            return
        short = kept < LENGTH_HISTOGRAM
        if short.any():
            self._length_hist += np.bincount(kept[short],
                                             minlength=LENGTH_HISTOGRAM).astype(np.uint64)
        self._lengths.update(np.ascontiguousarray(kept[~short]))

    # ------------------------------------------------------------- queries
    def bounds(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(estimate, lower, upper)`` lookups for each ID (float64 arrays).

        Sketched tables (docs/STATISTICS.md): a tracked row's lower bound is its heavy-hitter count,
        its upper bound the smaller of count + error and the count-min estimate; an untracked row
        has lower 0 and upper the smaller of the heavy-hitter threshold and the count-min estimate.
        ``lower <= true <= upper`` always; the count-min part exceeds the truth by at most
        ``epsilon * N`` with probability ``1 - delta``. The estimate is the upper bound (count-min
        off: count + error for tracked rows, 0 for the rest). Sampled ingestion scales the estimate
        by ``k`` and widens both bounds with :func:`sampled_count_bounds`. Exact tables, and
        sketched tables in their exact phase, return the counts three times.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if self.exact:
            inside = (ids >= 0) & (ids < self.num_rows)
            c = np.zeros(ids.size, dtype=np.float64)
            c[inside] = self._counts[ids[inside]]
            return c, c.copy(), c.copy()
        count = np.zeros(ids.size, dtype=np.int64)
        err = np.zeros(ids.size, dtype=np.int64)
        hh_lookup(self._mg_keys, self._mg_vals, self._mg_errs, ids, self.config.seed, count, err)
        if self.exact_phase:  # every row seen is in the table, with its exact count
            c = count.astype(np.float64)
            return c, c.copy(), c.copy()
        tracked = err >= 0
        lower = count.astype(np.float64)
        upper = np.where(tracked, count + err, self._mg_meta[1]).astype(np.float64)
        if self._cms.shape[1]:
            cms = cms_query(self._cms, ids, self.config.seed,
                            np.zeros(ids.size, dtype=np.uint64)).astype(np.float64)
            cms[cms >= float(_U32_MAX)] = np.inf  # saturated: no upper bound from the sketch
            upper = np.minimum(upper, cms)
            est = upper.copy()
        else:
            est = np.where(tracked, upper, 0.0)
        k = self.config.sample_k
        if k > 1 or self.sample_variance > 0:
            lower, upper = sampled_count_bounds(lower, upper, k, variance=self.sample_variance)
            est *= k
        return est, lower, upper

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """Point estimates of lookups per ID (see :meth:`bounds`)."""
        return self.bounds(ids)[0]

    def cms_estimate(self, ids: np.ndarray) -> np.ndarray:
        """The count-min sketch's own estimate (never below the truth); exact counts if exact."""
        if self.exact or self.exact_phase or not self._cms.shape[1]:
            return self.bounds(ids)[0]
        return cms_query(self._cms, np.ascontiguousarray(ids, dtype=np.int64), self.config.seed,
                         np.zeros(len(ids), dtype=np.uint64)).astype(np.float64)

    @property
    def tracked_capacity(self) -> int:
        """Rows the heavy-hitter table tracks at most now: ``0.75 * 2**exact_phase_lg_size`` in
        the exact phase, ``0.75 * 2**hh_lg_size`` after it, 0 for exact tables."""
        return 0 if self.exact else int(hh_capacity(self._mg_vals.size))

    @property
    def max_error(self) -> float:
        """The heavy hitters' a-posteriori error (lookups): ``upper - lower`` of any row by the
        heavy-hitter bounds, and the most an untracked row can count (with sampling: widened, as
        the DataSketches image carries it)."""
        return 0.0 if self.exact else float(self._frequent_items()[3])

    def _frequent_items(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Tracked rows as ``(ids, lower, upper, offset)`` in lookups: integer lower bounds, upper
        bounds, and one offset with ``lower + offset >= upper`` for every row and ``offset`` at
        least an untracked row's upper bound (DataSketches' single-offset convention)."""
        live = self._mg_vals > 0
        keys, counts, errs = self._mg_keys[live], self._mg_vals[live], self._mg_errs[live]
        threshold = int(self._mg_meta[1])
        k, v = self.config.sample_k, self.sample_variance
        if k == 1 and v == 0:
            offset = max(threshold, int(errs.max()) if errs.size else 0)
            return keys, counts, counts + errs, offset
        lower = np.floor(sampled_count_bounds(counts, counts, k, variance=v)[0]).astype(np.int64)
        upper = sampled_count_bounds(counts + errs, counts + errs, k, variance=v)[1]
        untracked = sampled_count_bounds(threshold, threshold, k, variance=v)[1]
        gap = float((upper - lower).max()) if counts.size else 0.0
        return keys, lower, upper, int(math.ceil(max(gap, float(untracked))))

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The ``k`` rows with the largest estimates: ``(ids, est, lower, upper)``, sorted."""
        if k <= 0:
            z = np.zeros(0)
            return np.zeros(0, np.int64), z, z, z
        if self.exact:
            nz = np.flatnonzero(self._counts)
            if nz.size > k:
                part = np.argpartition(self._counts[nz], nz.size - k)[nz.size - k:]
                nz = nz[part]
            cand = nz.astype(np.int64)
        else:
            cand = self._mg_keys[self._mg_vals > 0]
        est, lo, hi = self.bounds(cand)
        order = np.lexsort((cand, -est))[:k]
        return cand[order], est[order], lo[order], hi[order]

    def distinct(self) -> tuple[float, float, float]:
        """``(estimate, lower, upper)`` distinct rows touched; bounds about 95% (2 standard errors)."""
        if self.exact or self.exact_phase:
            n = float(np.count_nonzero(self._counts) if self.exact else self._mg_meta[0])
            return n, n, n
        e = hll_estimate(self._hll)
        rse = 1.04 / math.sqrt(self._hll.size)
        e = min(e, float(self.total)) if self.total else 0.0
        return e, max(0.0, e * (1 - 2 * rse)), e * (1 + 2 * rse)

    def length_quantiles(self, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float]:
        """Quantiles of IDs per sample (empty dict before any sample), as DataSketches' KLL
        defines them: the smallest length with more than ``q`` of the samples at or below it (the
        largest for ``q = 1``). Exact while that falls among the lengths below
        :data:`LENGTH_HISTOGRAM` (each counted); beyond, the KLL sketch's quantile of the longer
        lengths at the rank left (its rank error, about 1.65% at ``length_k`` 200, on that
        part)."""
        short = int(self._length_hist.sum())
        long = 0 if self._lengths.is_empty() else int(self._lengths.n)
        if short + long == 0:
            return {}
        cum = np.cumsum(self._length_hist)
        out = {}
        for q in qs:
            rank = q * (short + long)
            if rank < short or not long:
                v = float(np.searchsorted(cum, min(rank, short - 0.5), side="right"))
            else:
                v = float(self._lengths.get_quantile(min(1.0, (rank - short) / long)))
            out[str(q)] = v
        return out

    @property
    def mean_length(self) -> float:
        """Mean IDs per sample (exact)."""
        return self.total / self.samples if self.samples else 0.0

    def summary(self, k: int = 1000) -> FrequencySummary:
        """The planner's view: top ``k`` rows plus a uniform model of the tail."""
        ids, est, lo, hi = self.top(k)
        d, dlo, dhi = self.distinct()
        tail_mass = max(0.0, float(self.total) - float(est.sum()))
        tail_rows = max(0.0, d - ids.size)
        if tail_mass > 0 and tail_rows == 0:
            tail_rows = 1.0
        return FrequencySummary(self.name, int(self.total), ids, est, lo, hi, d, dlo, dhi,
                                tail_mass, tail_rows, self.num_rows,
                                self.exact or self.exact_phase, self.samples,
                                self.mean_length, self.length_quantiles())

    @property
    def state_bytes(self) -> int:
        """Memory held by the statistics of this table (bytes)."""
        return int(sum(a.nbytes for a in (self._counts, self._cms, self._mg_keys, self._mg_vals,
                                          self._mg_errs, self._mg_meta, self._hll,
                                          self._sample_state, self._length_hist))
                   + len(self._lengths.serialize()))

    @property
    def cms_saturated(self) -> bool:
        """Whether any count-min counter has saturated (estimates there are only lower-capped)."""
        return bool(self._cms.size and self._cms.max() == np.uint32(0xFFFFFFFF))

    # ----------------------------------------------------- merge and decay
    def _check_compatible(self, other: "TableStats") -> None:
        if not isinstance(other, TableStats):
            raise IncompatibleError(f"cannot merge TableStats with {type(other).__name__}")
        a, b = self.config, other.config
        if (a.sample_k, a.sample_seed) != (b.sample_k, b.sample_seed):
            raise IncompatibleError(
                f"table {self.name!r}: sampled ingestion differs (1 in {a.sample_k} with "
                f"sample_seed {a.sample_seed} vs 1 in {b.sample_k} with sample_seed "
                f"{b.sample_seed}): counts sampled at different rates or by different samplers "
                "do not add")
        if self.config != other.config:
            diff = {k: (v, other.config.to_dict()[k]) for k, v in self.config.to_dict().items()
                    if other.config.to_dict()[k] != v}
            raise IncompatibleError(f"table {self.name!r}: sketch configs differ: {diff}")
        if self.num_rows != other.num_rows:
            raise IncompatibleError(f"table {self.name!r}: num_rows differ "
                                    f"({self.num_rows} vs {other.num_rows})")

    def merge(self, other: "TableStats") -> "TableStats":
        """Add ``other``'s statistics into this one (what a second host or window produced).

        Count-min, exact counts, HyperLogLog and lengths merge exactly (the result equals the
        statistics of the concatenated stream); heavy hitters merge with the published guarantee:
        counts and errors add, a row tracked on one side only takes the other side's threshold as
        error, thresholds add (then a purge if too many rows), so ``lower <= true <= upper`` still
        holds. Saturating where counters would wrap. Two tables in their exact phase stay in it
        while the rows of both fit; otherwise each leaves it first (the other side on a copy:
        ``other`` is never changed).
        """
        self._check_compatible(other)
        if self.exact:
            s = self._counts.astype(np.uint64) + other._counts
            self.saturated += other.saturated
            self._counts = np.minimum(s, _U32_MAX).astype(np.uint32)
        elif not self._merge_exact_phases(other):
            if other.exact_phase:
                other = other.copy()
                other._leave_exact_phase()
            self._merge_sketches(other)
        self._lengths.merge(other._lengths)
        self._length_hist += other._length_hist
        self.total += other.total
        self.samples += other.samples
        self.max_id = max(self.max_id, other.max_id)
        return self

    def _merge_exact_phases(self, other: "TableStats") -> bool:
        """Add ``other``'s exact counts when both tables are in their exact phase and the rows of
        both fit the exact table; returns whether it did (False: nothing changed)."""
        if not (self.exact_phase and other.exact_phase):
            return False
        (a, ca), (b, cb) = self._exact_rows(), other._exact_rows()
        keys, where = np.unique(np.concatenate([a, b]), return_inverse=True)
        counts = np.bincount(where.ravel(), weights=np.concatenate([ca, cb]),
                             minlength=keys.size).astype(np.int64)
        if keys.size > self.tracked_capacity:
            return False
        self._mg_meta[2] += other._mg_meta[2]
        self._rebuild_exact(keys, counts)
        return True

    def _merge_sketches(self, other: "TableStats") -> None:
        """Add a sketched ``other`` (past any exact phase) into this table, leaving its own exact
        phase first."""
        if self.exact_phase:
            self._leave_exact_phase()
        if self._cms.size:
            s = self._cms.astype(np.uint64) + other._cms
            self._cms = np.minimum(s, _U32_MAX).astype(np.uint32)
        seed = self.config.seed
        thr, othr = int(self._mg_meta[1]), int(other._mg_meta[1])
        rows = hh_union(self._mg_keys, self._mg_vals, self._mg_errs, thr, other._mg_keys,
                        other._mg_vals, other._mg_errs, othr, seed)
        hh_rebuild(self._mg_keys, self._mg_vals, self._mg_errs, self._mg_meta, *rows,
                   thr + othr, seed)
        self._mg_meta[2] += other._mg_meta[2]
        np.maximum(self._hll, other._hll, out=self._hll)
        self.sample_variance = max(self.sample_variance, other.sample_variance)

    def scale(self, factor: float) -> "TableStats":
        """Multiply every count by ``factor`` in (0, 1] (exponential decay).

        Bounds stay valid for the decayed counts: count-min counters, heavy-hitter upper bounds
        (count + error) and the threshold are rounded up (the threshold widened by one lookup),
        heavy-hitter counts and exact counts rounded down, and a row whose count rounds to zero
        leaves the table with the threshold raised to cover it; the sample count is scaled too, so
        the mean IDs per sample stays what it was. Distinct counts and length sketches are not
        decayed (they cannot be). The sampling variance decays with the counts, down to
        ``sample_k - 1``: counts sampled at an earlier, sparser rate weigh less and less.
        """
        if not (0.0 < factor <= 1.0):
            raise ValueError(f"decay factor must be in (0, 1], got {factor}")
        if factor == 1.0:
            return self
        old_total = self.total
        if self.exact:
            self.total = self._scale_exact_counts(factor)
        elif self.exact_phase:
            self.total = self._scale_exact_phase(factor)
        else:
            self._scale_sketched_counts(factor)
            self.total = int(self.total * factor)
        self._decay_sample_variance(factor)
        # samples decay with the lookups: the mean IDs per sample (total / samples) must not drift
        kept = self.total / old_total if old_total else factor
        self.samples = int(round(self.samples * kept))
        return self

    def _scale_exact_counts(self, factor: float) -> int:
        """Exact counts times ``factor``, rounded down; returns the new total (lookups).

        The total loses what the rounding took from the counts, so it stays their sum (plus the
        scaled lookups of saturated counters): a total scaled on its own would leave the rounded-off
        lookups as a phantom tail with no row to carry it."""
        before = float(self._counts.sum(dtype=np.uint64))
        self._counts = np.floor(self._counts * factor).astype(np.uint32)
        after = int(self._counts.sum(dtype=np.uint64))
        beyond_counters = max(0.0, self.total - before) * factor     # saturated lookups
        return after + int(beyond_counters)

    def _scale_exact_phase(self, factor: float) -> int:
        """The exact phase's counts times ``factor``, rounded down as exact counts are (a row
        whose count reaches 0 leaves the table); returns the new total, their sum (lookups)."""
        keys, counts = self._exact_rows()
        counts = np.floor(counts * factor).astype(np.int64)
        keep = counts > 0
        total = int(counts.sum())
        self._mg_meta[2] = total
        self._rebuild_exact(keys[keep], counts[keep])
        return total

    def _decay_sample_variance(self, factor: float) -> None:
        """The variance of counts scaled by ``factor`` is ``factor**2`` times theirs, for
        ``factor`` times the count: the excess of :attr:`sample_variance` over the rate's own
        shrinks by ``factor``. Once it would widen no bound by a whole lookup (a row holding all
        ``total`` lookups: ``z**2 * excess * total < 1``) it is dropped."""
        excess = (self.sample_variance - self._rate_variance) * factor
        if excess * self.total * SAMPLE_Z ** 2 < 1:
            excess = 0.0
        self.sample_variance = self._rate_variance + excess

    def resample(self, k: int) -> "TableStats":
        """Go on counting one ID occurrence in ``k`` (1: every one), keeping what was counted.

        The counts sampled so far are rescaled to the new rate, by ``sample_k / k``: count-min
        counters rounded up, heavy-hitter counts down and count + error up, the threshold up (as
        :meth:`scale` does), so every bound holds for the rescaled counts and every estimate
        (``k`` times a count) stays what it was. The variance of the estimates is that of the rate
        each part was sampled at: :attr:`sample_variance` becomes the larger of its value and
        ``k - 1``, so a lower rate after a higher one keeps the higher rate's wider bounds (they
        narrow as :meth:`scale` decays the old counts). The sampler's next gap is drawn at the new
        rate. Exact tables count every ID whatever ``k`` (only their length sketch samples).
        Statistics merge only at equal rates: resample one side first.
        """
        config = dataclasses.replace(self.config, sample_k=k)   # checks k (ConfigError)
        old = self.config.sample_k
        if config.sample_k == old:
            return self
        if self.exact_phase:    # sampled occurrences are counted in the sketches only
            self._leave_exact_phase()
        if not self.exact:
            self._scale_sketched_counts(old / config.sample_k)
        self.config = config
        self.sample_variance = max(self.sample_variance, self._rate_variance)
        self._sample_state[0] = -1
        return self

    def _scale_sketched_counts(self, factor: float) -> None:
        """Multiply the count-min counters and the heavy hitters by ``factor`` > 0, rounding so
        that every bound holds for the scaled counts (counters saturate at 2**32 - 1)."""
        if self._cms.size:  # round up: the sketch stays an upper bound of the scaled counts
            self._cms = np.minimum(np.ceil(self._cms * factor), float(_U32_MAX)).astype(np.uint32)
        self._scale_heavy_hitters(factor)

    def _scale_heavy_hitters(self, factor: float) -> None:
        live = self._mg_vals > 0
        keys = self._mg_keys[live].copy()
        counts = np.floor(self._mg_vals[live] * factor).astype(np.int64)
        upper = np.ceil((self._mg_vals[live] + self._mg_errs[live]) * factor).astype(np.int64)
        threshold = int(math.ceil(self._mg_meta[1] * factor)) + (1 if self._mg_meta[2] else 0)
        gone = counts == 0
        if gone.any():
            threshold = max(threshold, int(upper[gone].max()))
        keep = ~gone
        self._mg_meta[2] = int(self._mg_meta[2] * factor)
        hh_rebuild(self._mg_keys, self._mg_vals, self._mg_errs, self._mg_meta, keys[keep],
                   counts[keep], upper[keep] - counts[keep], threshold, self.config.seed)

    def copy(self) -> "TableStats":
        """A deep copy."""
        return TableStats.from_bytes(self.to_bytes())

    # ------------------------------------------------------- serialization
    def _meta(self) -> dict[str, Any]:
        meta = {"name": self.name, "num_rows": self.num_rows, "config": self.config.to_dict(),
                "exact": self.exact, "total": self.total, "samples": self.samples,
                "saturated": self.saturated, "max_id": self.max_id,
                "stats_version": self._stats_version()}
        if meta["stats_version"] == STATS_VERSION_FLAGS:
            meta["exact_phase"] = self.exact_phase
        if self.sample_variance > self._rate_variance:
            meta["sample_variance"] = self.sample_variance
        return meta

    def _stats_version(self) -> int:
        """The lowest version that holds this table (:data:`STATS_VERSION_FLAGS`)."""
        if self.exact_phase or self._length_hist.any():
            return STATS_VERSION_FLAGS
        if self.sample_variance > self._rate_variance:
            return STATS_VERSION_VARIANCE
        return STATS_VERSION

    @property
    def _rate_variance(self) -> float:
        """The sampling variance of the rate in force alone: ``sample_k - 1`` (0 when exact)."""
        return 0.0 if self.exact else float(self.config.sample_k - 1)

    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"counts": self._counts, "cms": self._cms, "mg_keys": self._mg_keys,
                  "mg_vals": np.stack([self._mg_vals, self._mg_errs]), "mg_meta": self._mg_meta,
                  "hll": self._hll, "sample_state": self._sample_state,
                  "lengths": np.frombuffer(self._lengths.serialize(), dtype=np.uint8)}
        if self._stats_version() == STATS_VERSION_FLAGS:
            arrays["length_hist"] = self._length_hist
        return arrays

    @classmethod
    def _from_parts(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray],
                    source: str) -> "TableStats":
        try:
            name, num_rows, config, version = checked_table_meta(meta, arrays, source)
            t = cls(name, num_rows, config)
            if t.exact_phase and not _saved_exact_phase(meta, version, source):
                t._mg_keys, t._mg_vals, t._mg_errs = _slots(config.hh_lg_size)
                t.exact_phase = False
            t._load_arrays(arrays, version, source)
            if version == STATS_VERSION_VARIANCE or (version == STATS_VERSION_FLAGS
                                                     and "sample_variance" in meta):
                t._load_sample_variance(meta.get("sample_variance"), source)
            t._lengths = _lengths_sketch(arrays["lengths"], t.config,
                                         f"{source}: table {t.name!r} array 'lengths'")
            t.total = int(meta["total"])
            t.samples = int(meta["samples"])
            t.saturated = int(meta["saturated"])
            t.max_id = int(meta["max_id"])
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise FormatError(f"{source}: table state is inconsistent ({type(e).__name__}: {e})"
                              ) from None
        if not t.exact:
            t._check_heavy_hitters(source)
        if t.exact_phase:
            t._check_exact_phase(source)
        return t

    def _load_arrays(self, arrays: dict[str, np.ndarray], version: int, source: str) -> None:
        """Copy the saved arrays in after checking shapes and dtypes. ``mg_vals`` holds each slot's
        count and error (shape ``(2, slots)``). Version 1 (Misra-Gries with a global offset) had
        counts only and no sampler: every tracked row takes the offset as its error (its bound was
        ``vals <= f <= vals + offset``) and the offset becomes the threshold."""
        wants = {"counts": self._counts, "cms": self._cms, "mg_keys": self._mg_keys,
                 "mg_vals": np.stack([self._mg_vals, self._mg_errs]), "mg_meta": self._mg_meta,
                 "hll": self._hll}
        if version == 1:
            wants["mg_vals"] = self._mg_vals
        else:
            wants["sample_state"] = self._sample_state
        if version == STATS_VERSION_FLAGS:
            wants["length_hist"] = self._length_hist
        got = {}
        for key, want in wants.items():
            a = arrays[key]
            if a.shape != want.shape or a.dtype != want.dtype:
                raise FormatError(f"{source}: table {self.name!r} array {key!r} has shape "
                                  f"{a.shape} {a.dtype}, expected {want.shape} {want.dtype}")
            got[key] = np.array(a, copy=True)
        self._counts, self._cms, self._hll = got["counts"], got["cms"], got["hll"]
        if "length_hist" in got:
            self._length_hist = got["length_hist"]
        self._mg_keys, self._mg_meta = got["mg_keys"], got["mg_meta"]
        if version == 1:
            self._mg_vals = got["mg_vals"]
            self._mg_errs = np.where(self._mg_vals > 0, self._mg_meta[1], 0).astype(np.int64)
        else:
            self._mg_vals, self._mg_errs = (np.ascontiguousarray(r) for r in got["mg_vals"])
            self._sample_state = got["sample_state"]

    def _load_sample_variance(self, value: Any, source: str) -> None:
        """Take a saved :attr:`sample_variance`: a finite number, at least ``sample_k - 1``."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < self._rate_variance:
            raise FormatError(f"{source}: table {self.name!r}: sample_variance is {value!r}, "
                              f"expected a finite number >= sample_k - 1 = {self._rate_variance:g}")
        self.sample_variance = float(value)

    def _check_heavy_hitters(self, source: str) -> None:
        """Validate loaded heavy-hitter state before any kernel sees it; FormatError names the
        field. Checked: live rows equal to ``mg_meta[0]`` and within the capacity (so at least one
        slot is empty), counts and errors in range, every row above the threshold with an error
        within it, rows non-negative and each reachable from its home slot (no repeats), counted
        occurrences at least the counts' sum, the sampler's state."""
        keys, counts, errs, meta = self._mg_keys, self._mg_vals, self._mg_errs, self._mg_meta
        where = f"{source}: table {self.name!r}"
        live = counts > 0
        n_live, threshold = int(live.sum()), int(meta[1])

        def bad(field: str, what: str, mask: np.ndarray | None = None) -> FormatError:
            at = f" (slot {int(np.flatnonzero(mask)[0])})" if mask is not None else ""
            return FormatError(f"{where}: {field} {what}{at}")

        if (counts < 0).any():
            raise bad("mg_vals", "holds a negative count", counts < 0)
        if int(meta[0]) != n_live:
            raise bad("mg_meta[0]", f"(live rows) is {int(meta[0])} but mg_vals holds {n_live} "
                      "non-empty slots")
        if n_live > int(hh_capacity(counts.size)):
            raise bad("mg_vals", f"holds {n_live} rows, more than the capacity "
                      f"{int(hh_capacity(counts.size))} (a full table has no empty slot)")
        if not (0 <= threshold < _HH_VALUE_LIMIT):
            raise bad("mg_meta[1]", f"(threshold) is {threshold}, expected in [0, 2**60)")
        if (counts >= _HH_VALUE_LIMIT).any():
            raise bad("mg_vals", "holds a count of 2**60 or more", counts >= _HH_VALUE_LIMIT)
        if (live & ((errs < 0) | (errs > threshold))).any():
            raise bad("mg_errs", f"holds an error outside [0, threshold = {threshold}]",
                      live & ((errs < 0) | (errs > threshold)))
        if (live & (counts + errs <= threshold)).any():
            raise bad("mg_vals", f"holds a row whose count + error is not above the threshold "
                      f"{threshold}", live & (counts + errs <= threshold))
        if (live & (keys < 0)).any():
            raise bad("mg_keys", "holds a negative row ID", live & (keys < 0))
        slot = int(hh_misplaced(keys, counts, self.config.seed))
        if slot >= 0:
            raise FormatError(f"{where}: mg_keys row {int(keys[slot])} at slot {slot} is repeated "
                              "or not reachable from its home slot")
        if int(meta[2]) < int(counts.sum()):
            raise bad("mg_meta[2]", f"(occurrences counted) is {int(meta[2])}, below the counts' "
                      f"sum {int(counts.sum())}")
        if int(self._sample_state[0]) < -1 or int(self._sample_state[1]) < 0:
            raise bad("sample_state", f"is {self._sample_state.tolist()}, expected "
                      "[skip >= -1, draws >= 0]")

    def _check_exact_phase(self, source: str) -> None:
        """A loaded table in its exact phase: threshold 0, every error 0, count-min and
        HyperLogLog arrays still empty, the counts summing to the lookups counted; FormatError
        naming the field otherwise."""
        where = f"{source}: table {self.name!r} (exact phase)"
        counts = int(self._mg_vals.sum())
        checks = (("mg_meta[1]", "(threshold) is not 0", self._mg_meta[1] != 0),
                  ("mg_errs", "holds a non-zero error", self._mg_errs.any()),
                  ("cms", "is not empty", self._cms.any()),
                  ("hll", "is not empty", self._hll.any()),
                  ("total", f"is {self.total}, not the counts' sum {counts}", self.total != counts),
                  ("mg_meta[2]", f"is {int(self._mg_meta[2])}, not the total {self.total}",
                   int(self._mg_meta[2]) != self.total))
        for field, what, bad in checks:
            if bad:
                raise FormatError(f"{where}: {field} {what}")

    def to_bytes(self) -> bytes:
        """Serialize (magic, version, checksum); see :mod:`flexshard_stream.formats.container`."""
        return pack("TableStats", self._meta(), self._arrays())

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> "TableStats":
        """Inverse of :meth:`to_bytes`; a damaged or foreign blob raises FormatError."""
        meta, arrays = unpack(data, "TableStats", source)
        return cls._from_parts(meta, arrays, source)

    # ------------------------------------------------------------- interop
    def to_datasketches_frequent_items(self) -> bytes:
        """The heavy hitters as a DataSketches frequent-items binary image (``PyLongsSerDe``).

        Java (``ItemsSketch<Long>`` with ``ArrayOfLongsSerDe``), C++ and Python
        (``frequent_items_sketch.deserialize(b, PyLongsSerDe())``) read it: each tracked row's
        lower bound as its weight and one offset covering every row's upper bound (so DataSketches
        reports bounds no tighter than this table's), the total lookups as stream weight. Exact
        tables export their top ``0.75 * 2**hh_lg_size`` rows with zero error; so do tables in
        their exact phase, with the largest count left out as the offset.
        """
        from ..formats.interop import frequent_items_image
        lg = self.config.hh_lg_size
        if self.exact:
            ids, est, _, _ = self.top(self.config.hh_capacity)
            return frequent_items_image(lg, ids, est.astype(np.int64), self.total, 0)
        if self.exact_phase:
            ids, est, _, _ = self.top(self.config.hh_capacity + 1)
            offset = int(est[-1]) if ids.size > self.config.hh_capacity else 0
            cut = self.config.hh_capacity
            return frequent_items_image(lg, ids[:cut], est[:cut].astype(np.int64), self.total,
                                        offset)
        ids, lower, _, offset = self._frequent_items()
        return frequent_items_image(lg, ids, lower, self.total, offset)

    # ------------------------------------------------------------- exact rows (read-only)
    def nonzero_rows(self) -> np.ndarray:
        """Rows looked up at least once (int64, ascending), from the exact counts.

        Exact tables only (a sketched table keeps no per-row counts): raises
        :class:`~flexshard_stream.errors.ConfigError` otherwise.
        """
        if not self.exact:
            from ..errors import ConfigError
            raise ConfigError(f"table {self.name!r} is sketched: it keeps no per-row counts, so "
                              f"its looked-up rows are not known (only exact tables list them)")
        return np.flatnonzero(self._counts).astype(np.int64)

    def __repr__(self) -> str:
        mode = "exact" if self.exact else "exact phase" if self.exact_phase else "sketch"
        return (f"TableStats({self.name!r}, {mode}, total={self.total}, samples={self.samples}, "
                f"state_bytes={self.state_bytes})")

