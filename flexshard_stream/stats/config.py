"""Configuration of the statistics engine: sketch sizes and the per-table policy."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import ConfigError

__all__ = ["SketchConfig", "TableConfig", "normalize_tables"]

_CMS_MODES = ("plain", "conservative", "off")
#: Largest sampling rate ``sample_k`` (one ID in a million).
MAX_SAMPLE_K = 1 << 20


@dataclass(frozen=True)
class SketchConfig:
    """Sizes and policy of every per-table statistic.

    Parameters
    ----------
    cms_epsilon, cms_delta : float
        Count-min guarantee: an estimate exceeds the true count by more than ``epsilon * N`` (N lookups
        in the table) with probability at most ``delta``. Width ``= next_pow2(e / epsilon)``, depth
        ``= ceil(ln(1 / delta))``. The defaults give 65,536 x 4 uint32 counters (1 MiB).
    cms_mode : {"plain", "conservative", "off"}
        Plain is linear (merge by addition is exact); conservative update is far more accurate on
        skewed streams and about 3x slower; merged conservative sketches remain upper bounds.
    hh_lg_size : int
        Heavy hitters hash map of ``2**hh_lg_size`` slots tracking up to ``0.75 * 2**hh_lg_size``
        rows (DataSketches ``lg_max_map_size``), each with a key, a count and an error (24 bytes).
        Default 14: 12,288 rows, 384 KiB.
    hll_p : int
        HyperLogLog precision: ``2**p`` one-byte registers, relative standard error ``1.04 / 2**(p/2)``
        (p = 12: 4 KiB, 1.6%).
    length_k : int
        KLL ``k`` of the per-feature sequence-length sketch (rank error about 1.65% at 200).
    exact_memory_limit : int
        Bytes. A table whose row count is known and whose ``4 * num_rows`` fits in this limit is counted
        exactly (one uint32 per row) instead of sketched: exact is both faster and error-free there.
    seed : int
        Seed of the row hash shared by all sketches; sketches merge only with equal seeds.
    sample_k : int
        Sampled ingestion: 1 (the default) counts every ID; ``k > 1`` feeds one ID occurrence in
        ``k`` (independently, probability ``1 / k``) to the count-min sketch and the heavy hitters of
        a sketched table, whose estimates are then scaled by ``k`` and whose bounds widen by the
        sampling error (docs/STATISTICS.md). Totals, sequence lengths and the HyperLogLog registers
        still see every ID, so distinct counts and the tail model are those of the whole stream.
        Exact tables always count every ID.
    sample_seed : int
        Seed of the sampler (a counter-based generator of geometric skips): the same seed and stream
        keep the same IDs. Statistics merge only with equal ``sample_k`` and ``sample_seed``.
    """

    cms_epsilon: float = 5e-5
    cms_delta: float = 0.02
    cms_mode: str = "plain"
    hh_lg_size: int = 14
    hll_p: int = 12
    length_k: int = 200
    exact_memory_limit: int = 64 * 2**20
    seed: int = 0x5EED5EED
    sample_k: int = 1
    sample_seed: int = 0x5A3B1E5

    def __post_init__(self) -> None:
        if not (0.0 < self.cms_epsilon < 1.0):
            raise ConfigError(f"cms_epsilon must be in (0, 1), got {self.cms_epsilon}")
        if not (0.0 < self.cms_delta < 1.0):
            raise ConfigError(f"cms_delta must be in (0, 1), got {self.cms_delta}")
        if self.cms_mode not in _CMS_MODES:
            raise ConfigError(f"cms_mode must be one of {_CMS_MODES}, got {self.cms_mode!r}")
        if self.cms_width > 2**30:
            raise ConfigError(f"cms_epsilon {self.cms_epsilon} needs a width of {self.cms_width} "
                              "counters per row; the limit is 2**30 (use epsilon >= 3e-9)")
        if not (3 <= self.hh_lg_size <= 26):
            raise ConfigError(f"hh_lg_size must be in [3, 26], got {self.hh_lg_size}")
        if not (4 <= self.hll_p <= 18):
            raise ConfigError(f"hll_p must be in [4, 18], got {self.hll_p}")
        if not (8 <= self.length_k <= 65535):
            raise ConfigError(f"length_k must be in [8, 65535], got {self.length_k}")
        if self.exact_memory_limit < 0:
            raise ConfigError(f"exact_memory_limit must be >= 0 bytes, got {self.exact_memory_limit}")
        if not (0 <= self.seed < 2**63):
            raise ConfigError(f"seed must be in [0, 2**63), got {self.seed}")
        if isinstance(self.sample_k, bool) or not isinstance(self.sample_k, numbers.Integral) \
                or not (1 <= self.sample_k <= MAX_SAMPLE_K):
            raise ConfigError(f"sample_k must be an integer in [1, {MAX_SAMPLE_K}] (1: no "
                              f"sampling), got {self.sample_k!r}")
        object.__setattr__(self, "sample_k", int(self.sample_k))
        if not (0 <= self.sample_seed < 2**63):
            raise ConfigError(f"sample_seed must be in [0, 2**63), got {self.sample_seed}")

    @classmethod
    def from_error(cls, epsilon: float, delta: float, **kw: Any) -> "SketchConfig":
        """A config whose count-min sketch meets ``(epsilon, delta)``."""
        return cls(cms_epsilon=epsilon, cms_delta=delta, **kw)

    @property
    def cms_width(self) -> int:
        """Counters per count-min row (a power of two)."""
        return 1 << max(1, math.ceil(math.log2(math.e / self.cms_epsilon)))

    @property
    def cms_depth(self) -> int:
        """Count-min rows (independent hash functions)."""
        return max(1, math.ceil(math.log(1.0 / self.cms_delta)))

    @property
    def sampled(self) -> bool:
        """Whether sketched tables count one ID in ``sample_k`` (``sample_k > 1``)."""
        return self.sample_k > 1

    @property
    def hh_capacity(self) -> int:
        """Heavy-hitter counters kept at most."""
        return (3 << self.hh_lg_size) // 4

    @property
    def sketch_bytes(self) -> int:
        """Bytes of a sketched table's count-min, heavy-hitter and HyperLogLog arrays."""
        return self.sketch_array_bytes()

    def sketch_array_bytes(self, slot_bytes: int = 24, lg_slots: int | None = None) -> int:
        """Bytes of the count-min (4 per counter), a table of ``2**lg_slots`` slots of
        ``slot_bytes`` each (default: the heavy hitters' slots, key, count and error) and the
        HyperLogLog registers (1 each)."""
        width = self.cms_width if self.cms_mode != "off" else 0
        lg = self.hh_lg_size if lg_slots is None else lg_slots
        return 4 * self.cms_depth * width + slot_bytes * (1 << lg) + (1 << self.hll_p)

    @property
    def exact_phase_lg_size(self) -> int:
        """Slots (``2**lg``) of the table that counts a sketched table exactly until its rows stop
        fitting (the exact phase, docs/STATISTICS.md): the most, up to four times the heavy-hitter
        slots, whose keys and counts (16 bytes a slot) take no more memory than the sketches they
        stand in for. Default 2**16 slots, 49,152 rows, 1 MiB of the sketches' 1.4 MiB."""
        lg = self.hh_lg_size
        while lg < self.hh_lg_size + 2 and 16 << (lg + 1) <= self.sketch_bytes:
            lg += 1
        return lg

    def uses_exact_phase(self, num_rows: int | None) -> bool:
        """Whether a new table of ``num_rows`` rows starts in the exact phase: sketched tables
        without sampled ingestion (a sampled table counts one ID in ``k`` from the start)."""
        return not self.uses_exact(num_rows) and self.sample_k == 1

    def uses_exact(self, num_rows: int | None) -> bool:
        """Whether a table of ``num_rows`` rows is counted exactly under this policy."""
        return num_rows is not None and 4 * num_rows <= self.exact_memory_limit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SketchConfig":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown sketch config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


@dataclass(frozen=True)
class TableConfig:
    """One embedding table as the statistics engine sees it.

    ``feature`` is the batch key (log column) feeding it; ``num_rows`` is its row count when known
    (IDs at or above it are rejected), else None.
    """

    name: str
    num_rows: int | None = None
    feature: str = field(default="")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table name must be a non-empty string, got {self.name!r}")
        if self.num_rows is not None:
            if int(self.num_rows) != self.num_rows or self.num_rows <= 0:
                raise ConfigError(f"table {self.name!r}: num_rows must be a positive integer, "
                                  f"got {self.num_rows!r}")
            object.__setattr__(self, "num_rows", int(self.num_rows))
        if not self.feature:
            object.__setattr__(self, "feature", self.name)


def normalize_tables(tables: Mapping[str, int | None] | Sequence[TableConfig | str] | None
                     ) -> dict[str, TableConfig]:
    """Accept ``{feature: num_rows or None}``, a list of names, or TableConfigs; key by feature."""
    out: dict[str, TableConfig] = {}
    if tables is None:
        return out
    if isinstance(tables, Mapping):
        items = [TableConfig(k, v) for k, v in tables.items()]
    else:
        items = [t if isinstance(t, TableConfig) else TableConfig(str(t)) for t in tables]
    for t in items:
        if t.feature in out:
            raise ConfigError(f"feature {t.feature!r} is configured twice")
        out[t.feature] = t
    return out
