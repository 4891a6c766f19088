"""Statistics of one embedding table, updated from the ID stream by the Numba kernels.

A :class:`TableStats` holds either exact counts (row count known and small enough) or sketches
(count-min, Misra-Gries heavy hitters, HyperLogLog), plus the sequence-length distribution (a
DataSketches KLL sketch) and exact totals. It speaks the DataSketches verbs: ``update``, ``merge``,
``estimate`` / ``bounds``, ``to_bytes`` / ``from_bytes``. Callers normally go through
:class:`flexshard_stream.stats.stream.StreamStats`, which validates whole batches first.
"""

from __future__ import annotations

import math
from typing import Any

import datasketches as ds
import numpy as np

from ..errors import BatchError, ConfigError, FormatError, IncompatibleError
from ..formats.container import pack, unpack
from ..formats.fields import INT64_MAX, field_int, field_number, field_str, mapping
from ..formats.interop import check_kll_ints_image
from ..kernels.countmin import cms_query
from ..kernels.frequent import mg_lookup, mg_update_weighted
from ..kernels.pipeline import update_table
from .config import SketchConfig
from .summary import FrequencySummary

__all__ = ["TableStats", "checked_table_meta", "hll_estimate", "sketch_config"]

_U32_MAX = np.uint64(0xFFFFFFFF)
_EMPTY_U32 = np.zeros(0, dtype=np.uint32)


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


def _state_bytes(config: SketchConfig, num_rows: int | None) -> int:
    """Bytes of the count arrays a table of ``num_rows`` rows holds under ``config`` (exact
    counts, or count-min, heavy-hitter and HyperLogLog arrays): what building it allocates."""
    if config.uses_exact(num_rows):
        return 4 * num_rows
    width = config.cms_width if config.cms_mode != "off" else 0
    return 4 * config.cms_depth * width + 16 * (1 << config.hh_lg_size) + (1 << config.hll_p)


def checked_table_meta(meta: Any, arrays: dict[str, np.ndarray], source: str
                       ) -> tuple[str, int | None, SketchConfig]:
    """``(name, num_rows, config)`` of a saved table, checked before anything is allocated:
    field types and ranges, and that the arrays its config implies fit in the bytes the file holds
    for it (a damaged config or row count cannot make loading allocate more than the file is).
    FormatError naming the file and field otherwise."""
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
    need = _state_bytes(config, num_rows)
    have = sum(a.nbytes for a in arrays.values())
    if need > have:
        raise FormatError(f"{where}: its sketch config and num_rows {num_rows} make "
                          f"{need} bytes of counters; the file holds {have} for the table")
    return name, num_rows, config


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
        if self.exact:
            self._counts = np.zeros(num_rows, dtype=np.uint32)
            self._cms = np.zeros((c.cms_depth, 0), dtype=np.uint32)
            self._mg_keys = np.zeros(0, dtype=np.int64)
            self._mg_vals = np.zeros(0, dtype=np.int64)
            self._hll = np.zeros(0, dtype=np.uint8)
        else:
            self._counts = _EMPTY_U32
            width = c.cms_width if c.cms_mode != "off" else 0
            self._cms = np.zeros((c.cms_depth, width), dtype=np.uint32)
            self._mg_keys = np.zeros(1 << c.hh_lg_size, dtype=np.int64)
            self._mg_vals = np.zeros(1 << c.hh_lg_size, dtype=np.int64)
            self._hll = np.zeros(1 << c.hll_p, dtype=np.uint8)
        self._mg_meta = np.zeros(3, dtype=np.int64)  # num_active, offset, stream weight
        self._lengths = ds.kll_ints_sketch(c.length_k)
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
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0:
                p = int(np.flatnonzero(ids < 0)[0])
                raise BatchError(f"negative ID {int(ids[p])}; expected >= 0", feature=self.name,
                                 field="values", position=p)
            if self.num_rows is not None and hi >= self.num_rows:
                p = int(np.flatnonzero(ids >= self.num_rows)[0])
                raise BatchError(f"ID {int(ids[p])} out of range; expected < num_rows "
                                 f"{self.num_rows}", feature=self.name, field="values", position=p)
        else:
            hi = -1
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
            self.saturated += int(update_table(ids, self.config.seed, self._cms,
                                               self.config.cms_mode == "conservative",
                                               self._mg_keys, self._mg_vals, self._mg_meta,
                                               self._hll, self.config.hll_p, self._counts))
            self.total += int(ids.size)
            if max_id > self.max_id:
                self.max_id = max_id
        if lengths is not None and lengths.size:
            if not lengths.flags.writeable:  # DataSketches' KLL binding rejects read-only arrays
                lengths = lengths.copy()
            self._lengths.update(lengths)
            self.samples += int(lengths.size)

    _update_validated = update_validated  # the former name, still used by bench/ingest.py

    # ------------------------------------------------------------- queries
    def bounds(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(estimate, lower, upper)`` lookups for each ID (float64 arrays).

        Guarantee: ``lower <= true <= upper`` always for the heavy-hitter bounds; the count-min part
        of ``upper`` holds always (it never underestimates), its excess is at most ``epsilon * N``
        with probability ``1 - delta``. Exact tables return the counts three times.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if self.exact:
            inside = (ids >= 0) & (ids < self.num_rows)
            c = np.zeros(ids.size, dtype=np.float64)
            c[inside] = self._counts[ids[inside]]
            return c, c.copy(), c.copy()
        lower = mg_lookup(self._mg_keys, self._mg_vals, ids, self.config.seed,
                          np.zeros(ids.size, dtype=np.int64)).astype(np.float64)
        offset = float(self._mg_meta[1])
        upper = lower + offset
        if self._cms.shape[1]:
            cms = cms_query(self._cms, ids, self.config.seed,
                            np.zeros(ids.size, dtype=np.uint64)).astype(np.float64)
            cms[cms >= float(_U32_MAX)] = np.inf  # saturated: no upper bound from the sketch
            upper = np.minimum(upper, cms)
            est = upper
        else:
            est = np.where(lower > 0, lower + offset, 0.0)
        return est, lower, upper

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """Point estimates of lookups per ID (see :meth:`bounds`)."""
        return self.bounds(ids)[0]

    def cms_estimate(self, ids: np.ndarray) -> np.ndarray:
        """The count-min sketch's own estimate (never below the truth); exact counts if exact."""
        if self.exact or not self._cms.shape[1]:
            return self.bounds(ids)[0]
        return cms_query(self._cms, np.ascontiguousarray(ids, dtype=np.int64), self.config.seed,
                         np.zeros(len(ids), dtype=np.uint64)).astype(np.float64)

    @property
    def max_error(self) -> float:
        """Heavy hitters' a-posteriori error bound (lookups): ``upper - lower`` for any row."""
        return 0.0 if self.exact else float(self._mg_meta[1])

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
        if self.exact:
            n = float(np.count_nonzero(self._counts))
            return n, n, n
        e = hll_estimate(self._hll)
        rse = 1.04 / math.sqrt(self._hll.size)
        e = min(e, float(self.total)) if self.total else 0.0
        return e, max(0.0, e * (1 - 2 * rse)), e * (1 + 2 * rse)

    def length_quantiles(self, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float]:
        """Quantiles of IDs per sample (empty dict before any sample)."""
        if self._lengths.is_empty():
            return {}
        return {str(q): float(v) for q, v in zip(qs, self._lengths.get_quantiles(list(qs)))}

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
                                tail_mass, tail_rows, self.num_rows, self.exact, self.samples,
                                self.mean_length, self.length_quantiles())

    @property
    def state_bytes(self) -> int:
        """Memory held by the statistics of this table (bytes)."""
        return int(self._counts.nbytes + self._cms.nbytes + self._mg_keys.nbytes
                   + self._mg_vals.nbytes + self._hll.nbytes + self._mg_meta.nbytes
                   + len(self._lengths.serialize()))

    @property
    def cms_saturated(self) -> bool:
        """Whether any count-min counter has saturated (estimates there are only lower-capped)."""
        return bool(self._cms.size and self._cms.max() == np.uint32(0xFFFFFFFF))

    # ----------------------------------------------------- merge and decay
    def _check_compatible(self, other: "TableStats") -> None:
        if not isinstance(other, TableStats):
            raise IncompatibleError(f"cannot merge TableStats with {type(other).__name__}")
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
        offsets add, so ``lower <= true <= upper`` still holds. Saturating where counters would wrap.
        """
        self._check_compatible(other)
        if self.exact:
            s = self._counts.astype(np.uint64) + other._counts
            self.saturated += other.saturated
            self._counts = np.minimum(s, _U32_MAX).astype(np.uint32)
        else:
            if self._cms.size:
                s = self._cms.astype(np.uint64) + other._cms
                self._cms = np.minimum(s, _U32_MAX).astype(np.uint32)
            live = other._mg_vals > 0
            mg_update_weighted(self._mg_keys, self._mg_vals, self._mg_meta,
                               other._mg_keys[live], other._mg_vals[live], self.config.seed)
            self._mg_meta[1] += other._mg_meta[1]
            self._mg_meta[2] += other._mg_meta[2]
            np.maximum(self._hll, other._hll, out=self._hll)
        self._lengths.merge(other._lengths)
        self.total += other.total
        self.samples += other.samples
        self.max_id = max(self.max_id, other.max_id)
        return self

    def scale(self, factor: float) -> "TableStats":
        """Multiply every count by ``factor`` in (0, 1] (exponential decay).

        Bounds stay valid for the decayed counts: count-min counters and the heavy-hitter offset are
        rounded up (the offset widened by one lookup), heavy-hitter counters and exact counts rounded
        down; the sample count is scaled too, so the mean IDs per sample stays what it was.
        Distinct counts and length sketches are not decayed (they cannot be).
        """
        if not (0.0 < factor <= 1.0):
            raise ValueError(f"decay factor must be in (0, 1], got {factor}")
        if factor == 1.0:
            return self
        if self.exact:
            self._counts = np.floor(self._counts * factor).astype(np.uint32)
        else:
            if self._cms.size:  # round up: the sketch stays an upper bound of the decayed counts
                self._cms = np.ceil(self._cms * factor).astype(np.uint32)
            live = self._mg_vals > 0
            keys = self._mg_keys[live].copy()
            vals = np.floor(self._mg_vals[live] * factor).astype(np.int64)
            self._mg_keys[:] = 0
            self._mg_vals[:] = 0
            offset = int(math.ceil(self._mg_meta[1] * factor)) + (1 if self._mg_meta[2] else 0)
            self._mg_meta[:] = 0
            mg_update_weighted(self._mg_keys, self._mg_vals, self._mg_meta, keys, vals,
                               self.config.seed)
            self._mg_meta[1] += offset
        self.total = int(self.total * factor)
        # samples decay with the lookups: the mean IDs per sample (total / samples) must not drift
        self.samples = int(round(self.samples * factor))
        if not self.exact:
            self._mg_meta[2] = self.total
        return self

    def copy(self) -> "TableStats":
        """A deep copy."""
        return TableStats.from_bytes(self.to_bytes())

    # ------------------------------------------------------- serialization
    def _meta(self) -> dict[str, Any]:
        return {"name": self.name, "num_rows": self.num_rows, "config": self.config.to_dict(),
                "exact": self.exact, "total": self.total, "samples": self.samples,
                "saturated": self.saturated, "max_id": self.max_id}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"counts": self._counts, "cms": self._cms, "mg_keys": self._mg_keys,
                "mg_vals": self._mg_vals, "mg_meta": self._mg_meta, "hll": self._hll,
                "lengths": np.frombuffer(self._lengths.serialize(), dtype=np.uint8)}

    @classmethod
    def _from_parts(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray],
                    source: str) -> "TableStats":
        try:
            name, num_rows, config = checked_table_meta(meta, arrays, source)
            t = cls(name, num_rows, config)
            for key, attr in (("counts", "_counts"), ("cms", "_cms"), ("mg_keys", "_mg_keys"),
                              ("mg_vals", "_mg_vals"), ("mg_meta", "_mg_meta"), ("hll", "_hll")):
                want = getattr(t, attr)
                got = arrays[key]
                if got.shape != want.shape or got.dtype != want.dtype:
                    raise FormatError(f"{source}: table {t.name!r} array {key!r} has shape "
                                      f"{got.shape} {got.dtype}, expected {want.shape} {want.dtype}")
                setattr(t, attr, np.array(got, copy=True))
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
        return t

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
        (``frequent_items_sketch.deserialize(b, PyLongsSerDe())``) read it. Exact tables export
        their top ``0.75 * 2**hh_lg_size`` rows with zero error.
        """
        from ..formats.interop import frequent_items_image
        lg = self.config.hh_lg_size
        if self.exact:
            ids, est, _, _ = self.top(self.config.hh_capacity)
            return frequent_items_image(lg, ids, est.astype(np.int64), self.total, 0)
        live = self._mg_vals > 0
        return frequent_items_image(lg, self._mg_keys[live], self._mg_vals[live],
                                    int(self._mg_meta[2]), int(self._mg_meta[1]))

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
        mode = "exact" if self.exact else "sketch"
        return (f"TableStats({self.name!r}, {mode}, total={self.total}, samples={self.samples}, "
                f"state_bytes={self.state_bytes})")

