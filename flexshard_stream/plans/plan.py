"""The one plan type: per table, the tiers of a FlexShard plan plus a deterministic cold-owner function.

Tiers (DESIGN.md section 3), as explicit sorted ID arrays where rows are chosen individually:

- ``global_ids``: tier 0, replicated on every GPU (lookups never leave the GPU);
- ``node_ids`` with ``node_local``: tier 1, one copy per node, row ``node_ids[i]`` on local GPU
  ``node_local[i]`` of every node (lookups never leave the node);
- ``placed_ids`` with ``placed_gpus``: cold rows placed explicitly (by load, not by hash);
- every other ID: the cold function :class:`ColdSharding` (hash, range or weighted range over a set
  of GPUs, ``columns`` (column shards: every row split by columns over a set of GPUs), or
  ``replicated`` for data-parallel tables).

Sharding kind (``TablePlan.sharding``, one of :data:`SHARDING_KINDS`, TorchRec's names): how the
table is sharded, with hot-row replication on top. Given explicitly or inferred from the cold
function and the topology (:meth:`TablePlan.sharding_kind`): ``replicated`` -> ``data_parallel``;
``columns`` -> ``column_wise``; otherwise :func:`infer_row_kind` of the cold GPUs: one GPU ->
``table_wise``; several GPUs of one node (not every GPU) -> ``table_row_wise``; otherwise
``row_wise`` (over ranges or hashed). ``table_column_wise`` (column shards on one node) is only ever
explicit. Column-wise tables take global replicas (tier 0) only: no node replicas, placed rows or
host memory tier.

The kind is the plan's own: what the cost model prices and the labels say, for any cold function
(hashed, weighted, any set of GPUs in any order). Which TorchRec 1.8 sharding a table plan becomes
(type, ranks, shards; directly or through the export's ID remap; what TorchRec cannot run as
planned) is decided by one rule in the TorchRec bridge, ``flexshard_stream.bridge.sharding.
torchrec_sharding``, which starts from this kind (the plan model cannot import the bridge).

Host memory tier (RecShard, ``hbm_fraction``, float64[G] or empty): replicas and placed rows always sit
in HBM; with a non-empty ``hbm_fraction`` every other cold row ``r`` owned by GPU ``g`` sits in HBM iff
``host_u(r) < hbm_fraction[g]`` (``kernels/hashing.host_u``, a fixed uniform hash of the row ID), else
in the host memory of ``g``'s node, read over UVM. Routing does not depend on it. An empty array (the
default) keeps every row in HBM. See docs/COST_MODEL.md, "Host memory tier (RecShard)".

Every baseline (table-wise, row-wise, table-row-wise, data-parallel, HugeCTR hybrid) and the FlexShard
planner produce this type; the evaluator, re-sharder and replay consume it; ``route`` is the single
routing function. Plans are saved as a directory: ``plan.json`` plus ``.npy`` ID arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import ConfigError, FormatError
from ..formats.fields import (
    field_bool,
    field_int,
    field_list,
    field_mapping,
    field_str,
    mapping,
)
from ..formats.directories import directory_kind, read_directory, staging_directory
from ..formats.files import (
    check_json_digest,
    json_digest,
    jsonable,
    read_json,
    read_npy,
    write_json,
    write_npy,
)
from ..kernels.hashing import host_u_np, mix64_np
from ..kernels.routing import (
    COLD_COLUMNS,
    COLD_HASH,
    COLD_RANGE,
    COLD_REPLICATED,
    cumulative_weights,
    hash_owner_counts,
    map_build,
    range_bounds,
    route_ids,
)
from .tables import EmbeddingTable
from .topology import Topology

__all__ = ["ColdSharding", "TablePlan", "Plan", "Router", "PLAN_SCHEMA_VERSION",
           "SHARDING_KINDS", "SHARDING_CODES", "infer_row_kind"]

#: Version 2 adds the sharding kind and column shards; version 1 plans still load.
PLAN_SCHEMA_VERSION = 2
_READABLE_SCHEMA_VERSIONS = (1, 2)
#: The plan directory's kind marker
#: (:func:`~flexshard_stream.formats.directories.staging_directory`).
PLAN_KIND = "plan"
#: What a plan directory holds (``fnmatch`` patterns): all a new save may replace; anything else
#: in it is a user's, and the save is refused rather than delete it.
PLAN_FILES = ("plan.json", "t*.npy")
_COLD_KINDS = {"hash": COLD_HASH, "range": COLD_RANGE, "replicated": COLD_REPLICATED,
               "columns": COLD_COLUMNS}
#: How a table is sharded (TorchRec's ``ShardingType`` values), hot-row replication on top.
SHARDING_KINDS: tuple[str, ...] = ("table_wise", "column_wise", "table_column_wise", "row_wise",
                                   "table_row_wise", "data_parallel")
#: Integer code of each sharding kind, as the kernels see it (``Plan.flat["sharding"]``).
SHARDING_CODES: dict[str, int] = {k: i for i, k in enumerate(SHARDING_KINDS)}
# the cold function kinds each sharding kind may use
_SHARDING_COLD = {"table_wise": ("hash", "range"), "row_wise": ("hash", "range"),
                  "table_row_wise": ("hash", "range"), "column_wise": ("columns",),
                  "table_column_wise": ("columns",), "data_parallel": ("replicated",)}
#: Up to this many rows a hashed table's rows per GPU are counted exactly (one sweep of every row,
#: under 0.5 ms); above, :func:`expected_rows_per_hash_slot` (docs/PLANNER.md, "Hashed rows per GPU").
_EXACT_HASH_COUNT_ROWS = 1 << 18


def infer_row_kind(gpus: Any, num_gpus: int, gpus_per_node: int) -> str:
    """The row sharding kind of cold rows on ``gpus`` (of a topology of ``num_gpus`` GPUs,
    ``gpus_per_node`` per node): ``table_wise`` for one GPU, ``table_row_wise`` for several GPUs
    of one node (not every GPU of the topology), else ``row_wise``. The plan's kind of a hash or
    range cold function (:meth:`ColdSharding.inferred_sharding`, on its GPUs); the TorchRec export
    applies it to the GPUs that hold the cold rows."""
    g = np.asarray(gpus)
    if g.size == 1:
        return "table_wise"
    if g.size == 0 or g.min() // gpus_per_node != g.max() // gpus_per_node:
        return "row_wise"
    # one node: fewer distinct GPUs than the topology's unless the topology is that one node
    if gpus_per_node < num_gpus or np.unique(g).size < num_gpus:
        return "table_row_wise"
    return "row_wise"


def _vector(a: Any, dtype) -> np.ndarray:
    """``a`` as a contiguous vector of ``dtype`` (itself when it is one)."""
    if type(a) is np.ndarray and a.dtype == dtype and a.ndim == 1 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=dtype).ravel()


def _sorted_unique_ids(a: Any, what: str, table: str, num_rows: int) -> np.ndarray:
    arr = _vector(a if a is not None else [], np.int64)
    if arr.size:
        if arr.size > 1 and (arr[1:] <= arr[:-1]).any():
            raise ConfigError(f"table {table!r}: {what} must be sorted and unique")
        if arr[0] < 0 or arr[-1] >= num_rows:
            raise ConfigError(f"table {table!r}: {what} must lie in [0, {num_rows}); "
                              f"got {int(arr[0])}..{int(arr[-1])}")
    return arr


@dataclass(frozen=True, eq=False)
class ColdSharding:
    """How the rows without an explicit placement are spread.

    kind : "hash" | "range" | "columns" | "replicated"
    gpus : int32[n]   GPUs holding the cold rows, in order (columns: the GPU of each column shard)
    bounds : int64[n + 1]   for "range": GPU ``gpus[j]`` holds rows ``[bounds[j], bounds[j + 1])``
        (unequal widths make a weighted range); empty otherwise
    seed : int   for "hash": ``gpus[mix64(id, seed) % n]``
    weights : float64[n]   for weighted ranges: the weights the bounds come from
    widths : int64[n]   for "columns": column shard ``j`` (columns ``[offset_j, offset_j +
        widths[j])``, in order) lives on GPU ``gpus[j]``; every cold row is on all of them, so a
        lookup goes to every shard's GPU. One shard per GPU; the widths sum to the table's dim
        (checked by :class:`TablePlan`).
    """

    kind: str
    gpus: np.ndarray
    bounds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seed: int = 0
    weights: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    widths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in _COLD_KINDS:
            raise ConfigError(f"cold sharding kind must be one of {sorted(_COLD_KINDS)}, "
                              f"got {self.kind!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) \
                or not 0 <= self.seed < 2**64:
            raise ConfigError(f"cold sharding seed must be an integer in [0, 2**64), got "
                              f"{self.seed!r}")
        for name, dtype in (("gpus", np.int32), ("bounds", np.int64), ("weights", np.float64),
                            ("widths", np.int64)):
            object.__setattr__(self, name, _vector(getattr(self, name), dtype))
        self._check_columns()
        w = self.weights
        if w.size and (not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0
                       or not self.bounds.size):
            raise ConfigError("range weights must be finite, non-negative, not all zero, with "
                              "bounds")
        if self.weights.size and (self.kind != "range" or self.weights.size != self.gpus.size
                                  or not np.array_equal(self.bounds,
                                                        range_bounds(self.weights,
                                                                     int(self.bounds[-1])))):
            raise ConfigError("range weights must be one per GPU and give exactly the bounds")
        if self.kind != "replicated" and self.gpus.size == 0:
            raise ConfigError("cold sharding needs at least one GPU")
        if self.kind == "range":
            b = self.bounds
            if b.size != self.gpus.size + 1:
                raise ConfigError(f"range sharding needs {self.gpus.size + 1} bounds, got {b.size}")
            if b[0] != 0 or np.any(b[1:] < b[:-1]):
                raise ConfigError("range bounds must start at 0 and not decrease")

    def _check_columns(self) -> None:
        """Column shards: one positive width per GPU, each GPU once, nothing else set."""
        if self.kind != "columns":
            if self.widths.size:
                raise ConfigError(f"column widths belong to 'columns' cold shardings, not "
                                  f"{self.kind!r}")
            return
        if self.bounds.size or self.weights.size or self.seed:
            raise ConfigError("column shards take GPUs and widths only (no bounds, weights or "
                              "seed)")
        if self.widths.size != self.gpus.size:
            raise ConfigError(f"column shards need one width per GPU: {self.gpus.size} GPUs, "
                              f"{self.widths.size} widths")
        if (self.widths <= 0).any():
            raise ConfigError(f"column widths must be > 0 columns, got {self.widths.tolist()}")
        if self.distinct_gpus != self.gpus.size:
            raise ConfigError(f"column shards must sit on distinct GPUs, got "
                              f"{self.gpus.tolist()}")

    @classmethod
    def hashed(cls, gpus: Iterable[int], seed: int = 0) -> "ColdSharding":
        g = np.array(gpus) if isinstance(gpus, np.ndarray) else np.asarray(list(gpus))
        return cls("hash", g, seed=seed)

    @classmethod
    def ranges(cls, gpus: Iterable[int], num_rows: int,
               weights: Iterable[float] | None = None) -> "ColdSharding":
        """Contiguous ranges over ``[0, num_rows)``, equal or proportional to ``weights``."""
        g = np.asarray(gpus if isinstance(gpus, np.ndarray) else list(gpus), dtype=np.int32)
        if weights is None:
            w = np.ones(g.size)
        else:
            w = np.asarray(weights if isinstance(weights, np.ndarray) else list(weights),
                           dtype=np.float64)
            if w.size != g.size or np.any(~(w >= 0)) or w.sum() <= 0:
                raise ConfigError("range weights must be one non-negative number per GPU")
        return cls._made_ranges(g, range_bounds(w, int(num_rows)), w)

    @classmethod
    def _made_ranges(cls, gpus: np.ndarray, bounds: np.ndarray, weights: np.ndarray
                     ) -> "ColdSharding":
        """The range sharding :meth:`ranges` computed, without the checks its construction
        implies: the bounds are ``range_bounds`` of the weights (``__post_init__`` would compute
        them again to compare), ending at the rows. What it does not imply is checked as
        ``__post_init__`` checks it (finite weights, a GPU, bounds from 0 not decreasing). Tens
        of thousands of tables get one each."""
        g = np.ascontiguousarray(gpus, dtype=np.int32).ravel()
        w = np.ascontiguousarray(weights, dtype=np.float64).ravel()
        b = np.ascontiguousarray(bounds, dtype=np.int64).ravel()
        if not (g.size and np.isfinite(w).all() and b[0] == 0
                and (b.size < 2 or bool((b[1:] >= b[:-1]).all()))):
            return cls("range", g, b, weights=w)   # raises as before
        self = cls.__new__(cls)
        for name, value in (("kind", "range"), ("gpus", g), ("bounds", b), ("seed", 0),
                            ("weights", w), ("widths", np.zeros(0, np.int64))):
            object.__setattr__(self, name, value)
        return self

    @classmethod
    def replicated(cls) -> "ColdSharding":
        return cls("replicated", np.zeros(0, np.int32))

    @classmethod
    def columns(cls, gpus: Iterable[int], widths: Iterable[int]) -> "ColdSharding":
        """Column shards: shard ``j``, ``widths[j]`` columns (in order), on GPU ``gpus[j]``."""
        g = np.asarray(gpus if isinstance(gpus, np.ndarray) else list(gpus), dtype=np.int32)
        w = np.asarray(widths if isinstance(widths, np.ndarray) else list(widths), dtype=np.int64)
        return cls("columns", g, widths=w)

    def inferred_sharding(self, num_gpus: int, gpus_per_node: int) -> str:
        """The plan's sharding kind this cold function implies on a topology of ``num_gpus``
        GPUs, ``gpus_per_node`` per node (``TablePlan.sharding_kind`` without an explicit kind;
        see the module docstring for how it relates to TorchRec's sharding); kept per topology
        shape (tables on thousands of GPUs share these objects)."""
        cache = self.__dict__.get("_inferred")
        if cache is None:
            cache = self.__dict__["_inferred"] = {}
        key = (num_gpus, gpus_per_node)
        kind = cache.get(key)
        if kind is None:
            kind = cache[key] = self._infer_sharding(int(num_gpus), int(gpus_per_node))
        return kind

    def _infer_sharding(self, num_gpus: int, gpus_per_node: int) -> str:
        if self.kind == "replicated":
            return "data_parallel"
        if self.kind == "columns":
            return "column_wise"
        return infer_row_kind(self.gpus, num_gpus, gpus_per_node)

    @cached_property
    def gpu_range(self) -> tuple[int, int]:
        """The least and the largest of :attr:`gpus` ((0, -1) when there are none), once per
        object (every table plan sharing it is checked against its topology)."""
        g = self.gpus
        return (int(g.min()), int(g.max())) if g.size else (0, -1)

    @cached_property
    def distinct_gpus(self) -> int:
        """Distinct GPUs holding the cold rows: the size of :attr:`gpus` when strictly increasing
        (one pass; the usual cold GPUs), else by sorting. Once per object (the capability check
        asks it of every table plan, and table plans share cold functions)."""
        g = self.gpus
        if g.size < 2 or bool(np.all(g[1:] > g[:-1])):
            return int(g.size)
        return int(np.unique(g).size)

    @property
    def column_offsets(self) -> np.ndarray:
        """First column of each column shard and the dim (int64[n + 1]); empty otherwise."""
        if self.kind != "columns":
            return np.zeros(0, np.int64)
        return np.concatenate([[0], np.cumsum(self.widths)]).astype(np.int64)

    @cached_property
    def layout_key(self) -> tuple:
        """Content key under which cold functions share one layout in ``Plan.flat``: weighted
        ranges by (GPUs, weights), whatever the table size (bounds are recomputed per table from
        the cumulative weights); explicit bounds and hashes by their own arrays. Computed once per
        object (tables on thousands of GPUs share these objects). Equal ranges over GPUs
        ``0 .. n - 1`` (row-wise's: a table each) get the short key ``(3, "equal", n)``, which
        no other content has: on thousands of GPUs, comparing their arrays' bytes for every
        table of every plan was most of the flattening."""
        if self.kind == "range" and self.weights.size:
            g, w = self.gpus, self.weights
            if g[0] == 0 and (g.size < 2 or bool((np.diff(g) == 1).all())) \
                    and bool((w == 1.0).all()):
                return (3, "equal", int(g.size))
            return (3, g.tobytes(), w.tobytes())
        if self.kind == "range":
            return (1, self.gpus.tobytes(), self.bounds.tobytes())
        if self.kind == "columns":
            return (4, self.gpus.tobytes(), self.widths.tobytes())
        return (_COLD_KINDS[self.kind], self.gpus.tobytes(), self.seed)

    @cached_property
    def flat_layout(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, int]:
        """This cold function as a layout of ``Plan.flat``: its kind code (``layout_key[0]``),
        GPUs (int64), row weights (``lay_w``), bounds (``lay_bounds``: explicit range bounds,
        or weighted ranges' cumulative weights) and seed. Once per object (plans share them)."""
        code = self.layout_key[0]
        if code == 3:
            w, b = self.weights, cumulative_weights(self.weights)
        elif code == 1:
            w, b = np.diff(self.bounds).astype(np.float64), self.bounds.astype(np.float64)
        elif code == 4:
            w, b = self.widths.astype(np.float64), np.zeros(0)
        else:
            w, b = np.ones(self.gpus.size), np.zeros(0)
        return code, self.gpus.astype(np.int64), w, b, self.seed

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, "gpus": self.gpus.tolist(), "bounds": self.bounds.tolist(),
             "seed": int(self.seed), "weights": self.weights.tolist()}
        if self.widths.size:
            d["widths"] = self.widths.tolist()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ColdSharding":
        """Inverse of :meth:`to_dict`; values that do not fit their arrays (a damaged or edited
        file) are a ConfigError."""
        try:
            return cls(d["kind"], np.asarray(d["gpus"], dtype=np.int32),
                       np.asarray(d.get("bounds", []), dtype=np.int64), d.get("seed", 0),
                       np.asarray(d.get("weights", []), dtype=np.float64),
                       np.asarray(d.get("widths", []), dtype=np.int64))
        except (KeyError, TypeError, OverflowError, AttributeError) as e:
            raise ConfigError(f"cold sharding {str(d)[:80]}: {type(e).__name__}: {e}") from None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ColdSharding) and self.kind == other.kind
                and np.array_equal(self.gpus, other.gpus)
                and np.array_equal(self.bounds, other.bounds) and self.seed == other.seed
                and np.array_equal(self.widths, other.widths))


@functools.lru_cache(maxsize=8192)
def _rows_per_hash_slot(num_rows: int, slots: int, seed: int) -> np.ndarray:
    """Rows of ``[0, num_rows)`` the seeded hash sends to each of ``slots`` slots (read-only
    int64[slots]): one sweep over every row, so cached per (rows, slots, seed)."""
    counts = hash_owner_counts(num_rows, slots, np.uint64(seed), np.zeros(0, np.int64))
    counts.setflags(write=False)
    return counts


def hashed_rows_per_slot(num_rows: int, slots: int, seed: int,
                         skip_sorted: np.ndarray) -> np.ndarray:
    """Rows (int64[slots]) a hashed cold function sends to each of its slots, less the rows
    ``skip_sorted`` (IDs held elsewhere: replicas, placed rows; those ``>= num_rows`` ignored).

    Equal to :func:`~flexshard_stream.kernels.routing.hash_owner_counts`; the sweep over all rows
    is done once per (rows, slots, seed), the skipped rows are hashed each call (the planner prices
    many plans of one table that differ only in their replicas)."""
    counts = _rows_per_hash_slot(int(num_rows), int(slots), int(seed)).copy()
    skip = np.asarray(skip_sorted, dtype=np.int64)
    skip = skip[skip < num_rows]
    if skip.size:
        owners = (mix64_np(skip, int(seed)) % np.uint64(slots)).astype(np.int64)
        counts -= np.bincount(owners, minlength=slots)
    return counts


def expected_rows_per_hash_slot(num_rows: int, slots: int, seed: int,
                                skip_sorted: np.ndarray) -> np.ndarray:
    """Rows (int64[slots]) a hashed cold function sends to each slot, in closed form: every slot's
    expected share of all ``num_rows`` rows (``num_rows // slots``, the remainder one row each to
    the first slots), less the rows ``skip_sorted`` it owns (hashed exactly; those ``>= num_rows``
    ignored), at least 0. No row is swept: the cost is that of the skipped rows.

    Error (the hash modelled as uniform, as everywhere in the cost model): slot ``j`` is off by
    the deviation of its share of all rows from ``num_rows / slots``, a binomial's, standard
    deviation ``sqrt(num_rows / slots)``; within ``6 sqrt(num_rows / slots) + 1`` rows on every
    slot but with probability under ``slots * 2e-9`` (docs/PLANNER.md, "Hashed rows per GPU";
    tests/test_planspeed.py checks it against the sweep). The total is exact unless a slot's
    skipped rows exceed its share (then it is clipped at 0)."""
    n = int(slots)
    counts = np.full(n, int(num_rows) // n, dtype=np.int64)
    counts[: int(num_rows) % n] += 1
    skip = np.asarray(skip_sorted, dtype=np.int64)
    skip = skip[skip < num_rows]
    if skip.size:
        owners = (mix64_np(skip, int(seed)) % np.uint64(n)).astype(np.int64)
        counts -= np.bincount(owners, minlength=n)
        np.maximum(counts, 0, out=counts)
    return counts

def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


#: ``TablePlan.special_sorted`` of a table plan without replicas or placed rows.
_NO_SPECIAL_ROWS = (_read_only(np.zeros(0, np.int64)), _read_only(np.zeros(0, np.int32)))


@dataclass(frozen=True, eq=False)
class TablePlan:
    """The placement of one embedding table (see the module docstring for the tiers).

    ``sharding`` is the table's sharding kind (:data:`SHARDING_KINDS`), ``""`` to infer it from the
    cold function and the topology (:meth:`sharding_kind`). An explicit kind must agree with the
    cold function: ``data_parallel`` with ``replicated``; ``column_wise`` and
    ``table_column_wise`` with ``columns``; ``table_wise`` with one GPU; ``row_wise`` and
    ``table_row_wise`` with a hash or range (``table_row_wise`` and ``table_column_wise``: GPUs of
    one node, checked against the topology).
    """

    table: EmbeddingTable
    cold: ColdSharding
    global_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    node_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    node_local: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    placed_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    placed_gpus: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    hbm_fraction: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    sharding: str = ""

    def __post_init__(self) -> None:
        t = self.table
        hf = self.hbm_fraction
        if not (type(hf) is np.ndarray and hf.size == 0 and hf.dtype == np.float64
                and hf.ndim == 1):   # the default, kept as it is (every table plan has one)
            hf = self._fractions()
        if hf.size:
            if self.cold.kind == "replicated":
                raise ConfigError(f"table {t.name!r}: a data-parallel (replicated) table cannot "
                                  f"have a host memory tier (hbm_fraction must be empty)")
            bad = np.flatnonzero(~((hf >= 0.0) & (hf <= 1.0)))
            if bad.size:
                raise ConfigError(f"table {t.name!r}: hbm_fraction must lie in [0, 1]; GPU "
                                  f"{int(bad[0])} has {float(hf[bad[0]])!r}")
        object.__setattr__(self, "hbm_fraction", hf)
        for name in ("global_ids", "node_ids", "placed_ids"):
            object.__setattr__(self, name, _sorted_unique_ids(getattr(self, name), name, t.name,
                                                              t.num_rows))
        nl, pg = _vector(self.node_local, np.int32), _vector(self.placed_gpus, np.int32)
        if nl.size != self.node_ids.size:
            raise ConfigError(f"table {t.name!r}: {nl.size} node_local entries for "
                              f"{self.node_ids.size} node_ids")
        if pg.size != self.placed_ids.size:
            raise ConfigError(f"table {t.name!r}: {pg.size} placed_gpus for "
                              f"{self.placed_ids.size} placed_ids")
        object.__setattr__(self, "node_local", nl)
        object.__setattr__(self, "placed_gpus", pg)
        # each tier is sorted and unique: disjoint unless two of them hold rows
        if (self.global_ids.size > 0) + (self.node_ids.size > 0) + (self.placed_ids.size > 0) > 1:
            tiers = np.concatenate([self.global_ids, self.node_ids, self.placed_ids])
            tiers.sort()
            if np.any(tiers[1:] == tiers[:-1]):
                raise ConfigError(f"table {t.name!r}: global, node and placed rows must be "
                                  f"disjoint")
        if self.cold.kind == "range" and self.cold.bounds[-1] < t.num_rows:
            raise ConfigError(f"table {t.name!r}: range bounds end at {int(self.cold.bounds[-1])} "
                              f"but the table has {t.num_rows} rows")
        self._check_sharding()

    def _fractions(self) -> np.ndarray:
        """``hbm_fraction`` as a float64 vector (ConfigError when it is not numbers)."""
        try:
            return np.ascontiguousarray(np.asarray(self.hbm_fraction if self.hbm_fraction
                                                   is not None else [], dtype=np.float64).ravel())
        except (TypeError, ValueError):
            raise ConfigError(f"table {self.table.name!r}: hbm_fraction must be an array of "
                              f"numbers in [0, 1], got {self.hbm_fraction!r}") from None

    def _check_sharding(self) -> None:
        """The explicit sharding kind agrees with the cold function; column shards cover the dim
        and take global replicas only."""
        t, c, kind = self.table, self.cold, self.sharding
        if not isinstance(kind, str) or (kind and kind not in SHARDING_KINDS):
            raise ConfigError(f"table {t.name!r}: sharding {kind!r} unknown; expected one of "
                              f"{list(SHARDING_KINDS)} (or '' to infer it)")
        if kind and c.kind not in _SHARDING_COLD[kind]:
            raise ConfigError(f"table {t.name!r}: sharding {kind!r} needs a "
                              f"{' or '.join(_SHARDING_COLD[kind])} cold function, got {c.kind!r}")
        if kind == "table_wise" and c.gpus.size != 1:
            raise ConfigError(f"table {t.name!r}: table_wise puts the table on one GPU, the cold "
                              f"function has {c.gpus.size}")
        if c.kind != "columns":
            return
        if int(c.widths.sum()) != t.dim:
            raise ConfigError(f"table {t.name!r}: column widths {c.widths.tolist()} sum to "
                              f"{int(c.widths.sum())}, the table's dim is {t.dim}")
        if self.node_ids.size or self.placed_ids.size or self.hbm_fraction.size:
            raise ConfigError(f"table {t.name!r}: a column-wise table takes global replicas only "
                              f"(no node replicas, placed rows or host memory tier)")

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def special_sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows with an explicit placement, sorted, and their routing codes (int32): -1 global,
        -2 - m node replica on local GPU m, g placed on GPU g. Computed once per object (kept in
        its ``__dict__``: ``functools.cached_property`` takes a lock on every first access, and a
        planner makes tens of thousands of table plans)."""
        found = self.__dict__.get("_special_sorted")
        if found is None:
            found = self.__dict__["_special_sorted"] = self._special_sorted()
        return found

    def _special_sorted(self) -> tuple[np.ndarray, np.ndarray]:
        if not (self.global_ids.size or self.node_ids.size or self.placed_ids.size):
            return _NO_SPECIAL_ROWS   # most table plans: one read-only pair for all
        if not (self.node_ids.size or self.placed_ids.size):   # global replicas only: sorted
            ids, codes = self.global_ids.view(), np.full(self.global_ids.size, -1, np.int32)
            ids.flags.writeable = False
            codes.flags.writeable = False
            return ids, codes
        ids = np.concatenate([self.global_ids, self.node_ids, self.placed_ids])
        codes = np.concatenate([np.full(self.global_ids.size, -1, np.int32),
                                (-2 - self.node_local).astype(np.int32),
                                self.placed_gpus.astype(np.int32)])
        if ids.size:
            order = np.argsort(ids, kind="stable")
            ids, codes = ids[order], codes[order]
        ids.flags.writeable = False   # shared by every user of this TablePlan
        codes.flags.writeable = False
        return ids, codes

    @property
    def flat_parts(self) -> tuple:
        """This table plan's entries in ``Plan.flat``: special rows and codes
        (:attr:`special_sorted`), rows, row bytes, embedding bytes, pooled, ``hbm_fraction``,
        UVM bytes per host lookup. Once per object (kept as :attr:`special_sorted` is): the
        candidates of a planning run share table plans, each flattened once."""
        found = self.__dict__.get("_flat_parts")
        if found is None:
            found = self.__dict__["_flat_parts"] = self._flat_parts()
        return found

    def _flat_parts(self) -> tuple:
        t = self.table
        ids, codes = self.special_sorted
        eb, rb = t.embedding_bytes, t.row_bytes
        return (ids, codes, t.num_rows, float(rb), float(eb), t.kind == "pooled",
                self.hbm_fraction, float(eb + 2 * rb))

    @property
    def replicated(self) -> bool:
        """Data parallel: every row on every GPU."""
        return self.cold.kind == "replicated"

    @property
    def column_wise(self) -> bool:
        """Column shards (``column_wise`` or ``table_column_wise``): every cold lookup goes to
        every shard's GPU."""
        return self.cold.kind == "columns"

    def sharding_kind(self, topo: Topology) -> str:
        """The plan's sharding kind (:data:`SHARDING_KINDS`): :attr:`sharding` when given, else
        inferred: ``data_parallel`` (replicated), ``column_wise`` (column shards),
        ``table_wise`` (one GPU), ``table_row_wise`` (several GPUs, all on one node, not every
        GPU of the topology), else ``row_wise``. What the cost model prices; the TorchRec
        sharding it becomes is ``bridge.sharding.torchrec_sharding``'s (module docstring)."""
        if self.sharding:
            return self.sharding
        last = self.__dict__.get("_kind_on")   # (GPUs, GPUs per node, kind) asked last
        G, M = topo.num_gpus, topo.gpus_per_node
        if last is None or last[0] != G or last[1] != M:
            last = self.__dict__["_kind_on"] = (G, M, self.cold.inferred_sharding(G, M))
        return last[2]

    @property
    def has_host_tier(self) -> bool:
        """Some cold rows may sit in host memory (``hbm_fraction`` given)."""
        return self.hbm_fraction.size > 0

    def in_hbm(self, ids: Any, owners: Any) -> np.ndarray:
        """Whether each cold row ``ids[k]`` owned by GPU ``owners[k]`` sits in HBM (bool array).

        For rows routed by the cold function only (replicas and placed rows are always in HBM);
        everything is in HBM without a host tier."""
        ids = np.asarray(ids, dtype=np.int64)
        if not self.has_host_tier:
            return np.ones(ids.shape, dtype=bool)
        return host_u_np(ids) < self.hbm_fraction[np.asarray(owners, dtype=np.int64)]

    def tier_sizes(self) -> dict[str, int]:
        """Rows per tier (``cold`` includes placed rows)."""
        H = self.table.num_rows
        if self.replicated:
            return {"global": H, "node": 0, "cold": 0, "placed": 0}
        k0, k1 = self.global_ids.size, self.node_ids.size
        return {"global": k0, "node": k1, "cold": H - k0 - k1, "placed": int(self.placed_ids.size)}

    def check_topology(self, topo: Topology) -> None:
        G, M = topo.num_gpus, topo.gpus_per_node
        t = self.table.name
        if self.node_local.size and (self.node_local.min() < 0 or self.node_local.max() >= M):
            raise ConfigError(f"table {t!r}: node_local must lie in [0, {M})")
        g = self.placed_gpus
        if g.size and (g.min() < 0 or g.max() >= G):
            raise ConfigError(f"table {t!r}: placed_gpus must lie in [0, {G})")
        lo, hi = self.cold.gpu_range
        if self.cold.gpus.size and (lo < 0 or hi >= G):
            raise ConfigError(f"table {t!r}: cold gpus must lie in [0, {G})")
        if self.hbm_fraction.size and self.hbm_fraction.size != G:
            raise ConfigError(f"table {t!r}: hbm_fraction has {self.hbm_fraction.size} values; "
                              f"one per GPU expected ({G}), or none (no host memory tier)")
        if self.sharding in ("table_row_wise", "table_column_wise") and \
                self.cold.gpus.size and lo // M != hi // M:   # nodes lo // M .. hi // M
            raise ConfigError(f"table {t!r}: {self.sharding} keeps the table on one node; its "
                              f"GPUs {self.cold.gpus.tolist()} span nodes")

    def rows_per_gpu(self, topo: Topology) -> np.ndarray:
        """Rows stored by each GPU (int64[G]), in HBM or (host memory tier) in its host memory."""
        G, M = topo.num_gpus, topo.gpus_per_node
        H = self.table.num_rows
        if self.replicated:
            return np.full(G, H, dtype=np.int64)
        rows = np.full(G, self.global_ids.size, dtype=np.int64)
        per_local = np.bincount(self.node_local, minlength=M).astype(np.int64)
        rows += np.tile(per_local, topo.nodes)
        rows += np.bincount(self.placed_gpus, minlength=G)
        rows += self._cold_counts(topo)
        return rows

    def _cold_counts(self, topo: Topology) -> np.ndarray:
        """Cold rows (those of the cold function, not placed) each GPU stores (int64[G]); not
        for a replicated table."""
        G, H = topo.num_gpus, self.table.num_rows
        special = np.concatenate([self.global_ids, self.node_ids, self.placed_ids])
        special.sort()
        c = self.cold
        n = c.gpus.size
        if c.kind == "columns":  # every shard GPU holds every cold row (its columns of it)
            counts = np.full(n, H - special.size, dtype=np.int64)
        elif c.kind == "range":
            counts = np.diff(c.bounds).astype(np.int64)
            counts[-1] += max(0, H - int(c.bounds[-1]))
            inside = np.searchsorted(c.bounds, special, side="right") - 1
            inside = np.clip(inside, 0, n - 1)
            counts -= np.bincount(inside, minlength=n)
        elif H <= _EXACT_HASH_COUNT_ROWS:
            counts = hashed_rows_per_slot(H, n, c.seed, special)
        else:
            counts = expected_rows_per_hash_slot(H, n, c.seed, special)
        return np.bincount(c.gpus, weights=counts, minlength=G).astype(np.int64)

    def _memory_terms(self, topo: Topology) -> tuple:
        """This table plan's terms of ``Plan._memory`` on ``topo`` (kept per object and topology
        shape: candidates share table plans): the shape, the bytes every GPU stores (replicated
        table, global replicas), node replicas' bytes per local GPU, placed rows' bytes per GPU,
        hashed cold rows' bytes per GPU (None where there are none); range cold rows are the
        kernel's (``cold_row_counts``)."""
        G, M = topo.num_gpus, topo.gpus_per_node
        rb = float(self.table.row_bytes)
        if self.replicated:
            return (G, M), self.table.num_rows * rb, None, None, None
        node = np.bincount(self.node_local, minlength=M) * rb if self.node_ids.size else None
        placed = np.bincount(self.placed_gpus, minlength=G) * rb if self.placed_ids.size else None
        hashed = self._cold_counts(topo) * rb if self.cold.kind == "hash" else None
        return (G, M), self.global_ids.size * rb, node, placed, hashed

    def row_bytes_per_gpu(self, topo: Topology) -> np.ndarray:
        """Bytes of rows (embeddings plus optimizer state) each GPU stores (float64[G]), HBM and
        host memory together: ``rows_per_gpu * (D e + s)``, except that a column shard of ``w``
        columns stores ``w / D`` of each cold row's bytes (optimizer state split alike)."""
        rb = float(self.table.row_bytes)
        if not self.column_wise:
            return self.rows_per_gpu(topo) * rb
        c = self.cold
        out = np.full(topo.num_gpus, self.global_ids.size * rb)
        out[c.gpus] += (self.table.num_rows - self.global_ids.size) * rb * (c.widths / c.widths.sum())
        return out

    def host_rows_per_gpu(self, topo: Topology) -> np.ndarray:
        """Expected rows each GPU keeps in host memory (float64[G]): ``(1 - f[g])`` times its cold
        rows that are not placed (the hash split counted by its expected value); zeros without a
        host tier."""
        G = topo.num_gpus
        if not self.has_host_tier:
            return np.zeros(G)
        cold = (self.rows_per_gpu(topo) - Plan.non_cold_rows_per_gpu(self, topo)).astype(np.float64)
        return (1.0 - self.hbm_fraction) * cold

    def to_dict(self) -> dict[str, Any]:
        d = {"table": self.table.name, "cold": self.cold.to_dict(), "tiers": self.tier_sizes()}
        if self.has_host_tier:
            d["hbm_fraction"] = self.hbm_fraction.tolist()
        if self.sharding:
            d["sharding"] = self.sharding
        return d

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TablePlan):
            return NotImplemented
        return (self.table == other.table and self.cold == other.cold
                and self.sharding == other.sharding
                and all(np.array_equal(getattr(self, a), getattr(other, a))
                        for a in ("global_ids", "node_ids", "node_local", "placed_ids",
                                  "placed_gpus", "hbm_fraction")))


class Router:
    """The compiled routing of one table: special-row map plus cold function (Numba arrays)."""

    def __init__(self, tp: TablePlan, topo: Topology):
        ids, codes = tp.special_sorted
        self.num_special = int(ids.size)
        self.lg = max(1, math.ceil(math.log2(2 * ids.size + 1))) if ids.size else 0
        if ids.size:
            self.keys, self.vals, self.used = map_build(ids, codes, self.lg)
        else:
            self.keys = np.zeros(0, np.int64)
            self.vals = np.zeros(0, np.int32)
            self.used = np.zeros(0, np.bool_)
        self.cold_kind = _COLD_KINDS[tp.cold.kind]
        # column shards: every cold lookup goes to each of these GPUs (None: one owner)
        self.col_gpus = tp.cold.gpus.astype(np.int64) if tp.column_wise else None
        self.gpus = tp.cold.gpus if tp.cold.gpus.size else np.zeros(1, np.int32)
        self.bounds = tp.cold.bounds if tp.cold.bounds.size else np.zeros(1, np.int64)
        self.seed = np.uint64(tp.cold.seed)
        self.gpus_per_node = topo.gpus_per_node

    def route(self, ids: np.ndarray, srcs: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        srcs = np.ascontiguousarray(np.broadcast_to(srcs, ids.shape), dtype=np.int64)
        return route_ids(ids, srcs, self.keys, self.vals, self.used, self.lg, self.cold_kind,
                         self.gpus, self.bounds, self.seed, self.gpus_per_node,
                         np.empty(ids.size, np.int32))


class Plan:
    """A placement of every table on a topology.

    Parameters
    ----------
    strategy : str            "rw", "tw", "twrw", "dp", "hugectr", "flexshard", ...
    topology : Topology
    tables : iterable of TablePlan (one per table, unique names)
    meta : dict               free-form JSON-able facts (parameters, estimates, where memory came from)
    """

    def __init__(self, strategy: str, topology: Topology, tables: Iterable[TablePlan],
                 meta: Mapping[str, Any] | None = None):
        self.strategy = str(strategy)
        self.topology = topology
        self.tables: dict[str, TablePlan] = {}
        for tp in tables:
            if tp.name in self.tables:
                raise ConfigError(f"table {tp.name!r} appears twice in the plan")
            if tp.__dict__.get("_checked_for") is not topology:   # reused tables: checked once
                tp.check_topology(topology)
                tp.__dict__["_checked_for"] = topology
            self.tables[tp.name] = tp
        self.meta: dict[str, Any] = dict(meta or {})
        self._routers: dict[str, Router] = {}

    # ---------------------------------------------------------------- routing
    def router(self, table: str) -> Router:
        if table not in self._routers:
            self._routers[table] = Router(self[table], self.topology)
        return self._routers[table]

    def route(self, table: str, ids: Any, src_gpu: Any) -> np.ndarray:
        """Owner GPU (int32) serving each of ``ids`` of ``table`` for requester(s) ``src_gpu``."""
        ids = np.asarray(ids, dtype=np.int64)
        tp = self[table]
        if ids.size and (ids.min() < 0 or ids.max() >= tp.table.num_rows):
            raise ConfigError(f"table {table!r}: IDs must lie in [0, {tp.table.num_rows})")
        src = np.asarray(src_gpu, dtype=np.int64)
        if src.size and (src.min() < 0 or src.max() >= self.topology.num_gpus):
            raise ConfigError(f"src_gpu must lie in [0, {self.topology.num_gpus})")
        return self.router(table).route(ids, src)

    def owners(self, table: str, ids: Any, src_gpu: Any) -> np.ndarray:
        """Every GPU serving each of ``ids`` (int32[n, k]): ``k = 1`` (the :meth:`route` owner)
        except for a column-wise table, whose cold rows are served by all ``k`` column shards'
        GPUs (replicated rows: the requester, repeated)."""
        out = self.route(table, ids, src_gpu)
        tp = self[table]
        if not tp.column_wise:
            return out[:, None]
        cold = ~np.isin(np.asarray(ids, dtype=np.int64), tp.global_ids)
        many = np.repeat(out[:, None], tp.cold.gpus.size, axis=1)
        many[cold] = tp.cold.gpus[None, :]
        return many

    @cached_property
    def sharding_kinds(self) -> dict[str, str]:
        """Per table, its sharding kind (:meth:`TablePlan.sharding_kind` on this topology)."""
        return {n: tp.sharding_kind(self.topology) for n, tp in self.tables.items()}

    def __getitem__(self, table: str) -> TablePlan:
        try:
            return self.tables[table]
        except KeyError:
            raise KeyError(f"no table {table!r} in the plan; have {sorted(self.tables)}") from None

    # ----------------------------------------------------------------- memory
    def rows_per_gpu(self) -> dict[str, np.ndarray]:
        return {n: tp.rows_per_gpu(self.topology) for n, tp in self.tables.items()}

    @property
    def has_host_tier(self) -> bool:
        """Some table keeps cold rows in host memory."""
        return any(tp.has_host_tier for tp in self.tables.values())

    @property
    def row_bytes_per_gpu(self) -> np.ndarray:
        """Bytes of rows (embeddings plus optimizer state) each GPU stores in HBM (float64[G]).

        Without a host memory tier equal to ``sum(tp.rows_per_gpu(topo) * row_bytes)``; with one,
        the cold rows that are not placed count ``hbm_fraction[g]`` of their bytes (expected value of
        the hash split), the rest is in :attr:`host_bytes_per_gpu`. Range-sharded cold rows are
        counted in one Numba pass over all tables (thousands of tables on thousands of GPUs).
        """
        return self._memory[0]

    @property
    def host_bytes_per_gpu(self) -> np.ndarray:
        """Expected bytes of rows each GPU keeps in host memory (float64[G]; zeros without a host
        memory tier): ``sum_t (1 - f_t[g]) * (cold rows of t on g that are not placed) * row_bytes``.
        The GPUs of a node share its ``topology.host_memory_bytes``."""
        return self._memory[1]

    @property
    def node_replica_bytes_per_gpu(self) -> np.ndarray:
        """Bytes of node replicas (tier 1) each GPU stores (float64[G]), part of
        :attr:`row_bytes_per_gpu`."""
        return self._memory[2]

    @cached_property
    def _memory(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from ..kernels.analytic import cold_row_counts, special_cold_bytes
        topo = self.topology
        G, M = topo.num_gpus, topo.gpus_per_node
        out = np.zeros(G)
        host = np.zeros(G)
        everywhere = 0.0
        node_acc = np.zeros(M)
        shape = (G, M)
        for tp in self.tables.values():
            terms = tp.__dict__.get("_memory_terms_of")
            if terms is None or terms[0] != shape:
                terms = tp._memory_terms(topo)
                tp.__dict__["_memory_terms_of"] = terms
            _, rows_everywhere, node, placed, hashed = terms
            everywhere += rows_everywhere
            if node is not None:
                node_acc += node
            if placed is not None:
                out += placed
            if hashed is not None:
                if tp.has_host_tier:
                    out += tp.hbm_fraction * hashed
                    host += (1.0 - tp.hbm_fraction) * hashed
                else:
                    out += hashed
        f = self.flat
        if _bytes_are_exact(f):
            cold = _cold_range_bytes(G, f).copy()
            special_cold_bytes(f["layout"], f["row_bytes"], f["num_rows"], f["lay_kind"],
                               f["lay_off"], f["lay_gpus"], f["lay_boff"], f["lay_bounds"],
                               f["sp_off"], f["sp_ids"], cold)
            out += cold
        else:
            cold_row_counts(G, f["layout"], f["num_rows"], f["row_bytes"], f["lay_kind"],
                            f["lay_off"], f["lay_gpus"], f["lay_w"], f["lay_boff"],
                            f["lay_bounds"], f["sp_off"], f["sp_ids"], out, f["hf_off"], f["hf"],
                            host)
        out += everywhere
        node = np.tile(node_acc, topo.nodes)
        out += node
        return out, host, node

    @staticmethod
    def non_cold_rows_per_gpu(tp: TablePlan, topo: Topology) -> np.ndarray:
        """Rows of table plan ``tp`` each GPU of ``topo`` stores outside its cold function
        (int64[G]): global replicas, node replicas and placed rows, i.e. what
        ``tp.rows_per_gpu(topo)`` counts besides the cold rows."""
        G, M = topo.num_gpus, topo.gpus_per_node
        rows = np.full(G, tp.global_ids.size, dtype=np.int64)
        rows += np.tile(np.bincount(tp.node_local, minlength=M).astype(np.int64), topo.nodes)
        rows += np.bincount(tp.placed_gpus, minlength=G)
        return rows

    def tier_sizes(self) -> dict[str, dict[str, int]]:
        return {n: tp.tier_sizes() for n, tp in self.tables.items()}

    @cached_property
    def flat(self) -> dict[str, np.ndarray]:
        """All tables flattened into concatenated arrays with per-table offsets (plan order), cold
        functions shared as layouts (one per distinct ColdSharding object), for kernels that process
        many tables in one call (``kernels/analytic.py``). Host memory tier: ``hf[hf_off[t]:
        hf_off[t + 1]]`` is table t's ``hbm_fraction`` (G values, or none without a tier);
        ``uvm_lookup_bytes[t] = D e + 2 (D e + s)`` bytes moved over UVM per host lookup;
        ``sharding[t]`` the code (:data:`SHARDING_CODES`) of table t's sharding kind. Layout kinds:
        0 hash, 1 explicit range bounds, 2 replicated, 3 weighted ranges (``lay_bounds``: the
        cumulative weights), 4 column shards (``lay_w``: the widths)."""
        kinds = self.sharding_kinds
        lay_of: dict[tuple, int] = {}
        lays: list[tuple] = []
        layout = []
        for tp in self.tables.values():
            c = tp.cold
            key = c.layout_key
            li = lay_of.get(key)
            if li is None:
                li = lay_of[key] = len(lays)
                lays.append(c.flat_layout)
            layout.append(li)
        parts = [tp.flat_parts for tp in self.tables.values()]
        ids, codes, rows, rbs, eb, pooled, hf, ulb = (list(x) for x in zip(*parts)) if parts \
            else ([], [], [], [], [], [], [], [])
        lk, lg, lw, lb, ls = (list(x) for x in zip(*lays)) if lays else ([], [], [], [], [])

        def cat(parts, dtype):
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        def offsets(arrays):
            out = np.zeros(len(arrays) + 1, np.int64)
            np.cumsum([a.size for a in arrays], out=out[1:])
            return out
        return {"sp_off": offsets(ids), "sp_ids": cat(ids, np.int64),
                "sp_codes": cat(codes, np.int32), "layout": np.asarray(layout, np.int64),
                "num_rows": np.asarray(rows, np.int64), "emb_bytes": np.asarray(eb, np.float64),
                "pooled": np.asarray(pooled, np.bool_), "lay_kind": np.asarray(lk, np.int64),
                "lay_off": offsets(lg), "lay_gpus": cat(lg, np.int64),
                "lay_w": cat(lw, np.float64), "lay_boff": offsets(lb),
                "lay_bounds": cat(lb, np.float64), "lay_seed": np.asarray(ls, np.uint64),
                "hf_off": offsets(hf), "hf": cat(hf, np.float64),
                "uvm_lookup_bytes": np.asarray(ulb, np.float64),
                "row_bytes": np.asarray(rbs, np.float64),
                "sharding": np.asarray([SHARDING_CODES[kinds[n]] for n in self.tables], np.int64)}

    # -------------------------------------------------------------- equality
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (self.strategy == other.strategy and self.topology == other.topology
                and list(self.tables) == list(other.tables)
                and all(self.tables[n] == other.tables[n] for n in self.tables))

    def __repr__(self) -> str:
        return (f"Plan({self.strategy!r}, {self.topology.nodes}x{self.topology.gpus_per_node}, "
                f"tables={list(self.tables)})")

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``plan.json`` and the ``.npy`` ID arrays into ``directory`` atomically: built in a
        temporary directory, verified by :meth:`load`, then published: renamed into place, or,
        replacing a plan, as a new version behind the ``directory`` symlink
        (:func:`~flexshard_stream.formats.directories.staging_directory`). A directory holding
        anything but a plan's files (:data:`PLAN_FILES`) is refused, as is a second writer."""
        directory = Path(directory)
        with staging_directory(directory, kind=PLAN_KIND, legacy=("plan.json",),
                               owns=PLAN_FILES) as tmp:
            tables = [{"table": dataclasses.asdict(tp.table), "cold": tp.cold.to_dict(),
                       "sharding": tp.sharding, "tiers": tp.tier_sizes(),
                       "arrays": _save_arrays(tmp, i, tp)}
                      for i, tp in enumerate(self.tables.values())]
            doc = {"schema_version": PLAN_SCHEMA_VERSION, "strategy": self.strategy,
                   "topology": self.topology.to_dict(), "tables": tables,
                   "memory_per_gpu_bytes": self.row_bytes_per_gpu.tolist(),
                   "host_memory_per_gpu_bytes": self.host_bytes_per_gpu.tolist(),
                   "meta": _meta_json(self.meta)}
            write_json(tmp / "plan.json", _sealed(doc), indent=1, allow_nonfinite=True, mode=0o644)
            Plan.load(tmp)  # verify before publishing
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Plan":
        """Read a plan directory (schema version 1 or 2), verifying version, shapes, dtypes and
        checksums. Version 1 plans have no sharding kinds (inferred) and no column shards. Every
        file comes from one version of a replaced plan
        (:func:`~flexshard_stream.formats.directories.read_directory`)."""
        return read_directory(directory, cls._load_from)

    @classmethod
    def _load_from(cls, directory: Path) -> "Plan":
        """:meth:`load` of the resolved directory."""
        pj = directory / "plan.json"
        doc = _verified_plan_json(directory)
        try:
            topo = Topology.from_dict(doc["topology"])
            tps = [TablePlan(EmbeddingTable(**entry["table"]),
                             ColdSharding.from_dict(entry["cold"]),
                             **_load_arrays(directory, entry["arrays"]),
                             sharding=entry.get("sharding", ""))
                   for entry in doc["tables"]]
            plan = cls(doc["strategy"], topo, tps, doc.get("meta", {}))
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{pj}: inconsistent plan ({type(e).__name__}: {e})") from None
        return plan


#: Bytes below which sums of whole numbers of bytes in float64 are exact (2^53), whatever the
#: order: ``Plan._memory``'s sums then do not depend on it.
_EXACT_FLOAT = float(1 << 53)
_COLD_BYTES: list = []   # the last few (key, range cold bytes per GPU), most recent last
_COLD_BYTES_KEEP = 4


def _bytes_are_exact(f: Mapping[str, np.ndarray]) -> bool:
    """Whether every term of ``Plan._memory`` is a whole number of bytes and every partial sum
    is below 2^53 bytes, so that the float64 sums are exact in any order: no host memory tier
    (fractions of bytes), no column shards (shares of rows), and four times all tables' bytes
    below 2^53 (a GPU's terms: at most every row of every table, its special rows counted twice
    and taken out once; the factor also covers the rounding of this dot product). ``f``: the
    plan's ``Plan.flat``."""
    if f["hf"].size or np.any(f["lay_kind"] == 4):
        return False
    return 4.0 * float(np.dot(f["num_rows"].astype(np.float64), f["row_bytes"])) < _EXACT_FLOAT


def _cold_range_bytes(G: int, f: Mapping[str, np.ndarray]) -> np.ndarray:
    """Bytes of the range-sharded cold rows each of ``G`` GPUs stores, special rows included
    (``cold_row_counts`` without them), for the layouts of ``f`` (``Plan.flat``): kept for the
    last few sets of layouts (the candidates of a planning run share row-wise's), read-only."""
    key = (G, *(f[k].tobytes() for k in ("layout", "num_rows", "row_bytes", "lay_kind", "lay_off",
                                          "lay_gpus", "lay_boff", "lay_bounds")))
    for k, v in list(_COLD_BYTES):
        if k == key:
            return v
    from ..kernels.analytic import cold_row_counts
    out = np.zeros(G)
    cold_row_counts(G, f["layout"], f["num_rows"], f["row_bytes"], f["lay_kind"], f["lay_off"],
                    f["lay_gpus"], f["lay_w"], f["lay_boff"], f["lay_bounds"],
                    np.zeros(f["layout"].size + 1, np.int64), np.zeros(0, np.int64), out,
                    f["hf_off"], f["hf"], np.zeros(G))
    out.setflags(write=False)
    _COLD_BYTES[:] = [*_COLD_BYTES[-(_COLD_BYTES_KEEP - 1):], (key, out)]
    return out


_TABLE_ARRAYS = ("global_ids", "node_ids", "node_local", "placed_ids", "placed_gpus",
                 "hbm_fraction")


def _sealed(doc: dict[str, Any]) -> dict[str, Any]:
    """``plan.json`` with its checksum: the SHA-256 of the document itself
    (:func:`~flexshard_stream.formats.files.json_digest`). With the arrays' SHA-256 it lists, it
    covers the whole plan directory."""
    return {**doc, "checksum": json_digest(doc)}


def _verified_plan_json(directory: Path) -> dict[str, Any]:
    """``directory/plan.json``: a JSON object of a schema version this library reads whose
    checksum verifies. Plans written before plan.json carried a checksum (their directory has no
    kind marker either) have none: they are read as before, their arrays still checked against
    their SHA-256; a marked directory's plan.json without one was edited. FormatError naming the
    file otherwise."""
    pj = directory / "plan.json"
    if not pj.exists():
        raise FormatError(f"{directory}: not a plan directory (no plan.json)")
    doc = read_json(pj, "plan.json", allow_nonfinite=True)
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise FormatError(f"{pj}: not a flexshard_stream plan (no schema_version)")
    version = doc["schema_version"]
    if isinstance(version, bool) or version not in _READABLE_SCHEMA_VERSIONS:
        raise FormatError(f"{pj}: plan schema version {doc['schema_version']!r} is not supported "
                          f"(this flexshard_stream reads versions "
                          f"{', '.join(map(str, _READABLE_SCHEMA_VERSIONS))})")
    # a plan directory with the kind marker was written since plan.json carried its checksum
    check_json_digest(doc, pj, "plan", required=directory_kind(directory) == PLAN_KIND)
    field_mapping(doc, "topology", str(pj))
    field_str(doc, "strategy", str(pj))
    _check_recorded_settings(field_mapping(doc, "meta", str(pj), default={}), f"{pj}: meta")
    for i, entry in enumerate(field_list(doc, "tables", str(pj))):
        where = f"{pj}: tables[{i}]"
        field_mapping(mapping(entry, where), "table", where)
        field_mapping(entry, "cold", where)
        for name, spec in field_mapping(entry, "arrays", where).items():
            spec = mapping(spec, f"{where} array {name!r}")
            for key in ("file", "sha256", "dtype"):
                field_str(spec, key, f"{where} array {name!r}")
            field_list(spec, "shape", f"{where} array {name!r}")
    return doc


def _check_recorded_settings(meta: Mapping[str, Any], where: str) -> None:
    """The settings a plan records of how it was made (``plan`` writes them into ``meta``;
    ``evaluate`` and ``replay --plan`` default to them), typed when present: FormatError naming
    the field otherwise."""
    field_int(meta, "batch_size", where, lo=1, default=None)
    field_bool(meta, "dedup", where, default=None)
    field_mapping(meta, "model", where, default=None)
    for key in ("ids", "requested_strategy", "tables_source"):
        field_str(meta, key, where, default=None)


def _save_arrays(directory: Path, index: int, tp: TablePlan) -> dict[str, dict[str, Any]]:
    """Write table ``index``'s tier arrays as ``t<index>.<array>.npy`` into ``directory``; returns
    their ``plan.json`` entries (file, dtype, shape, SHA-256 of the file's bytes)."""
    out = {}
    for a in _TABLE_ARRAYS:
        fn = f"t{index}.{a}.npy"
        arr = getattr(tp, a)
        sha = write_npy(directory / fn, arr, mode=0o644)
        out[a] = {"file": fn, "dtype": arr.dtype.name, "shape": list(arr.shape), "sha256": sha}
    return out


def _load_arrays(directory: Path, specs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The tier arrays of one table, each checked against its ``plan.json`` entry (plain file
    name, checksum, dtype, shape); FormatError naming the file otherwise."""
    arrs = {}
    for a, spec in specs.items():
        arrs[a] = read_npy(directory, spec["file"], spec["sha256"], "plan array file",
                           dtype=spec["dtype"], shape=spec["shape"])
    return arrs


def _meta_json(meta: Any) -> Any:
    """A plan's ``meta`` as JSON values (floats kept as they are)."""
    return jsonable(meta, nonfinite_as_none=False)
