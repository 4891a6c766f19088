"""Statistics of a whole ID stream: one :class:`TableStats` per feature, fed batch by batch.

``StreamStats.update(batch)`` validates the whole batch against the table configuration first (one
Numba pass for per-feature min/max) and only then updates; a rejected batch changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import BatchError, ConfigError, FormatError, IncompatibleError
from ..formats.container import pack, unpack, write_atomic
from ..formats.fields import field_bool, field_int, field_list, field_number, field_str, mapping
from ..formats.files import read_bytes
from ..kernels.batchcheck import NEGATIVE, OK, check_ids
from .batch import Batch
from .config import SketchConfig, TableConfig, normalize_tables
from .state import check_state, state_blob
from .summary import FrequencySummary
from .table_stats import TableStats, sketch_config

__all__ = ["StreamStats", "stream_state", "validate_batch"]

_KIND = "StreamStats"
_STATE_KIND, _STATE_VERSION, _STATE_BLOB = "stream", 1, "stats.fss"
_I64_MAX = int(np.iinfo(np.int64).max)


def validate_batch(batch: Batch, tables: Mapping[str, TableConfig], *, allow_new: bool = False
                   ) -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    """Check ``batch`` against ``tables``; return ``[(feature, ids, lengths, max_id)]`` views.

    Raises :class:`BatchError` naming the feature, field and position of the first problem: a key
    not configured (unless ``allow_new``), negative IDs, IDs at or above ``num_rows``. One pass
    over the values for every key (:func:`~flexshard_stream.kernels.batchcheck.check_ids`: the
    largest ID, the sign bits, the row counts); the position of a problem is found after. Shape
    problems (lengths not adding up, bad dtypes, NaN or negative weights) were already rejected
    when the :class:`Batch` was built.
    """
    if not isinstance(batch, Batch):
        raise BatchError(f"expected a flexshard_stream.Batch, got {type(batch).__name__}; "
                         "build one with Batch(keys, values, lengths) or Batch.from_kjt(kjt)")
    keys = batch.keys
    configs = [tables.get(k) for k in keys]
    if not allow_new and None in configs:
        k = keys[configs.index(None)]
        raise BatchError(f"key not configured; configured: {sorted(tables)}",
                         feature=k, field="keys")
    nk = len(keys)
    if nk == 0 or batch.num_values == 0 and batch.batch_size == 0:
        return []
    offsets = batch.key_offsets()
    limits = np.array([_row_limit(t) for t in configs], dtype=np.int64)
    maxs = np.empty(nk, dtype=np.int64)
    bad, code = check_ids(batch.values, offsets, limits, maxs)
    if code != OK:
        _raise_ids(batch, bad, code == NEGATIVE, int(limits[bad]))
    values, lengths, bs = batch.values, batch.lengths, batch.batch_size
    return [(k, values[offsets[i]:offsets[i + 1]], lengths[i * bs:(i + 1) * bs], int(maxs[i]))
            for i, k in enumerate(keys)]


def _row_limit(table: TableConfig | None) -> int:
    """What ``check_ids`` holds a table's IDs below: its row count, or -1 (unknown, or beyond
    int64: no int64 ID reaches it)."""
    n = None if table is None else table.num_rows
    return -1 if n is None or n > _I64_MAX else int(n)


def _raise_ids(batch: Batch, i: int, negative: bool, num_rows: int) -> None:
    """The BatchError for key ``i``'s first negative ID (``negative``) or first ID at or above
    ``num_rows``: its feature, position within the feature and sample."""
    k = batch.keys[i]
    ids, lens = batch.feature_values(k), batch.feature_lengths(k)
    if negative:
        p = int(np.flatnonzero(ids < 0)[0])
        raise BatchError(f"negative ID {int(ids[p])} (sample {_sample_of(lens, p)}); "
                         "expected >= 0", feature=k, field="values", position=p)
    p = int(np.flatnonzero(ids >= num_rows)[0])
    raise BatchError(f"ID {int(ids[p])} (sample {_sample_of(lens, p)}) out of range; "
                     f"expected < num_rows {num_rows}", feature=k, field="values", position=p)


def stream_state(blob: bytes) -> dict[str, Any]:
    """The :meth:`StreamStats.state` dict of the statistics whose container (``to_bytes``) is
    ``blob``: for wrappers that keep StreamStats containers (windows, decayed statistics)."""
    return {"kind": _STATE_KIND, "version": _STATE_VERSION, "blobs": {_STATE_BLOB: blob}}


def _checked_stream_meta(meta: dict[str, Any], source: str
                         ) -> tuple[SketchConfig, list[dict[str, Any]]]:
    """The sketch config and the table entries of a saved :class:`StreamStats`, after checking
    every field its header holds (types, ranges, unique features). FormatError naming the field."""
    cfg = sketch_config(meta.get("config"), source)
    field_bool(meta, "auto_tables", source)
    for key in ("batches", "samples", "ids"):
        field_int(meta, key, source)
    for key in ("first_ts", "last_ts"):
        field_number(meta, key, source, optional=True)
    tables = field_list(meta, "tables", source)
    features = set()
    for i, tm in enumerate(tables):
        f = field_str(mapping(tm, f"{source}: table {i}"), "feature", f"{source}: table {i}")
        if not f or f in features:
            raise FormatError(f"{source}: table {i} has an empty or repeated feature {f!r}")
        features.add(f)
    return cfg, tables


def _sample_of(lengths: np.ndarray, pos: int) -> int:
    return int(np.searchsorted(np.cumsum(lengths), pos, side="right"))


class StreamStats:
    """Per-table streaming statistics of an embedding-ID stream.

    Parameters
    ----------
    tables : mapping ``{feature: num_rows or None}``, list of names or :class:`TableConfig`
        The configured features. A batch with another key is rejected unless ``auto_tables``.
    config : SketchConfig
        Sketch sizes and policy, shared by every table (tables merge only with equal configs).
    auto_tables : bool
        Add unknown features on first sight (row count unknown: sketched), as ``stats`` does.
    threads : int
        Update up to this many tables of a batch in parallel (the kernels release the GIL).
        :meth:`set_executor` runs them on the caller's threads instead.

    Attributes (read-only)
    ----------------------
    tables : dict[str, TableStats]; batches, samples, ids : counters; first_ts, last_ts : seconds.
    """

    def __init__(self, tables: Mapping[str, int | None] | Sequence[TableConfig | str] | None = None,
                 config: SketchConfig | None = None, *, auto_tables: bool = False,
                 threads: int = 1):
        self.config = config or SketchConfig()
        self._configs = normalize_tables(tables)
        self.auto_tables = auto_tables or not self._configs
        self._tables: dict[str, TableStats] = {
            f: TableStats(t.name, t.num_rows, self.config) for f, t in self._configs.items()}
        self.threads = max(1, int(threads))
        self._pool: ThreadPoolExecutor | None = None
        self._executor: Executor | None = None
        self.batches = 0
        self.samples = 0
        self.ids = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None

    # -------------------------------------------------------------- access
    @property
    def tables(self) -> dict[str, TableStats]:
        """Statistics per feature (a copy of the mapping; the TableStats are live)."""
        return dict(self._tables)

    def __getitem__(self, feature: str) -> TableStats:
        try:
            return self._tables[feature]
        except KeyError:
            raise KeyError(f"no statistics for feature {feature!r}; have {sorted(self._tables)}"
                           ) from None

    def __contains__(self, feature: str) -> bool:
        return feature in self._tables

    @property
    def table_configs(self) -> dict[str, TableConfig]:
        return dict(self._configs)

    # ------------------------------------------------------------ updating
    def update(self, batch: Batch) -> "StreamStats":
        """Validate ``batch`` whole, then count it. Empty batches are accepted and change nothing."""
        return self.update_validated(
            batch, validate_batch(batch, self._configs, allow_new=self.auto_tables))

    def update_validated(self, batch: Batch,
                         parts: list[tuple[str, np.ndarray, np.ndarray, int]]) -> "StreamStats":
        """Count ``batch``, already checked by :func:`validate_batch` against this object's tables
        (``parts``: what it returned). For wrappers that validate once at their edge
        (:class:`~flexshard_stream.stats.window.WindowedStats`, ``DecayedStats``); nothing is
        checked again, so ``parts`` must come from this very batch."""
        if batch.batch_size == 0:
            return self
        for k, *_ in parts:
            if k not in self._tables:
                self._configs[k] = TableConfig(k, None)
                self._tables[k] = TableStats(k, None, self.config)
        work = [(self._tables[k], ids, lens, mx) for k, ids, lens, mx in parts]
        pool = self._executor
        if pool is None and self.threads > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fss-update")
            pool = self._pool
        if pool is not None and len(work) > 1:
            # one thread per table and batch: each table sees its IDs in stream order, so the
            # statistics are those of one thread
            list(pool.map(lambda w: w[0].update_validated(w[1], w[2], w[3]), work))
        else:
            for t, ids, lens, mx in work:
                t.update_validated(ids, lens, mx)
        self.batches += 1
        self.samples += batch.batch_size
        self.ids += batch.num_values
        if batch.timestamp is not None:
            lo, hi = float(batch.timestamp.min()), float(batch.timestamp.max())
            self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
            self.last_ts = hi if self.last_ts is None else max(self.last_ts, hi)
        return self

    def update_many(self, batches: Iterable[Batch]) -> "StreamStats":
        for b in batches:
            self.update(b)
        return self

    def set_executor(self, executor: Executor | None) -> None:
        """Update the tables of a batch in parallel on ``executor`` (its ``map``; the caller owns
        it and shuts it down) instead of this object's own ``threads``; None: back to them."""
        self._executor = executor

    def resample(self, k: int) -> "StreamStats":
        """Go on sampling one ID occurrence in ``k`` in every table (:meth:`TableStats.resample`:
        what was counted is rescaled, every estimate and bound kept). Between two batches only;
        ConfigError for a ``k`` out of range, before anything changes."""
        config = dataclasses.replace(self.config, sample_k=k)
        for t in self._tables.values():
            t.resample(config.sample_k)
        self.config = config
        return self

    def close(self) -> None:
        """Release the update thread pool (if any)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    # ------------------------------------------------------------- queries
    def view(self) -> "StreamStats":
        """The statistics the planner reads: this object itself (every statistics source has
        ``view()``; windowed and decayed statistics return their merged or decayed view)."""
        return self

    def summary(self, k: int = 1000) -> dict[str, FrequencySummary]:
        """Frequency summary per feature for the planner."""
        return {f: t.summary(k) for f, t in self._tables.items()}

    def to_json(self, topk: int = 10) -> dict[str, Any]:
        """``{"tables": {name: {...}}}`` as printed by ``flexshard-stream stats --json``."""
        out = {}
        for f, t in self._tables.items():
            d = t.summary(topk).to_dict(topk)
            d["state_bytes"] = t.state_bytes
            out[f] = d
        return {"tables": out, "batches": self.batches, "samples": self.samples, "ids": self.ids,
                "first_ts": self.first_ts, "last_ts": self.last_ts}

    @property
    def state_bytes(self) -> int:
        return sum(t.state_bytes for t in self._tables.values())

    # -------------------------------------------------------------- merging
    def merge(self, other: "StreamStats") -> "StreamStats":
        """Add ``other`` (another host's or window's statistics) into this one.

        Checks every table first, so an incompatible ``other`` changes nothing.
        """
        if not isinstance(other, StreamStats):
            raise IncompatibleError(f"cannot merge StreamStats with {type(other).__name__}")
        if other.config != self.config:
            rates = (f" (sampled 1 in {self.config.sample_k} vs 1 in {other.config.sample_k}: "
                     "resample one side first)"
                     if other.config.sample_k != self.config.sample_k else "")
            raise IncompatibleError(f"sketch configs differ{rates}: "
                                    f"{self.config.to_dict()} vs {other.config.to_dict()}")
        for f, t in other._tables.items():
            if f in self._tables:
                self._tables[f]._check_compatible(t)
        for f, t in other._tables.items():
            if f in self._tables:
                self._tables[f].merge(t)
            else:
                self._configs[f] = other._configs[f]
                self._tables[f] = t.copy()
        self.batches += other.batches
        self.samples += other.samples
        self.ids += other.ids
        for attr, fn in (("first_ts", min), ("last_ts", max)):
            a, b = getattr(self, attr), getattr(other, attr)
            setattr(self, attr, b if a is None else a if b is None else fn(a, b))
        return self

    def scale(self, factor: float) -> "StreamStats":
        """Decay every table's counts by ``factor`` (see :meth:`TableStats.scale`)."""
        for t in self._tables.values():
            t.scale(factor)
        return self

    def copy(self) -> "StreamStats":
        return StreamStats.from_bytes(self.to_bytes())

    # ------------------------------------------------------- state protocol
    def state(self) -> dict[str, Any]:
        """Everything this object counted, as a plain dict (torch: ``state_dict``)::

            {"kind": "stream", "version": 1, "blobs": {"stats.fss": bytes}}

        The blob is :meth:`to_bytes` (one container: magic, version, CRC-32). See
        :mod:`flexshard_stream.stats.state` for the protocol."""
        return stream_state(self.to_bytes())

    def restore(self, state: Mapping[str, Any]) -> list[str]:
        """Replace what this object counted by ``state`` (from :meth:`state`; torch:
        ``load_state_dict``), in place: the update threads and the object's identity stay.

        The state must hold the same sketch config and the same tables (with ``auto_tables``, the
        tables both know must agree; the state's others are taken). The sampling rate
        (``sample_k``) is part of what was counted: the state's is taken (:meth:`resample`
        changes it afterwards). Raises FormatError (malformed state, damaged blob) or ConfigError
        (other tables or sketch sizes) and then changes nothing. Returns the notes of the
        protocol: always empty here (nothing may differ).
        """
        check_state(state, _STATE_KIND, _STATE_VERSION, {})
        loaded = StreamStats.from_bytes(state_blob(state, _STATE_KIND, _STATE_BLOB),
                                        f"state blob {_STATE_BLOB!r}")
        self._check_restorable(loaded)
        self._configs, self._tables = dict(loaded._configs), dict(loaded._tables)
        self.config = loaded.config
        self.batches, self.samples, self.ids = loaded.batches, loaded.samples, loaded.ids
        self.first_ts, self.last_ts = loaded.first_ts, loaded.last_ts
        return []

    def _check_restorable(self, loaded: "StreamStats") -> None:
        mine, theirs = self._configs, loaded._configs
        same_tables = (all(mine[f] == theirs[f] for f in mine.keys() & theirs.keys())
                       if self.auto_tables else mine == theirs)
        at_my_rate = dataclasses.replace(loaded.config, sample_k=self.config.sample_k)
        if not same_tables or at_my_rate != self.config:
            raise ConfigError(
                f"the state holds statistics of tables {sorted(theirs)} with sketch config "
                f"{loaded.config.to_dict()}; this object has tables {sorted(mine)} with "
                f"{self.config.to_dict()}")

    # -------------------------------------------------------- serialization
    def to_bytes(self) -> bytes:
        """One container holding every table (magic, version, CRC-32)."""
        meta: dict[str, Any] = {"config": self.config.to_dict(), "auto_tables": self.auto_tables,
                                "batches": self.batches, "samples": self.samples, "ids": self.ids,
                                "first_ts": self.first_ts, "last_ts": self.last_ts, "tables": []}
        arrays: dict[str, np.ndarray] = {}
        for i, (f, t) in enumerate(self._tables.items()):
            tm = t._meta()
            tm["feature"] = f
            meta["tables"].append(tm)
            for name, a in t._arrays().items():
                arrays[f"{i}.{name}"] = a
        return pack(_KIND, meta, arrays)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> "StreamStats":
        """Inverse of :meth:`to_bytes`. Every field is checked and every table validated
        (:meth:`TableStats.from_bytes`'s checks, its config equal to the statistics') before the
        object is built; a damaged or foreign blob raises FormatError naming ``source``."""
        meta, arrays = unpack(data, _KIND, source)
        cfg, tables = _checked_stream_meta(meta, source)
        parts: dict[str, dict[str, np.ndarray]] = {}
        for key, a in arrays.items():
            index, _, name = key.partition(".")
            parts.setdefault(index, {})[name] = a
        loaded = {}
        for i, tm in enumerate(tables):
            t = TableStats._from_parts(tm, parts.get(str(i), {}), source)
            if t.config != cfg:
                raise FormatError(f"{source}: table {t.name!r} has another sketch config than "
                                  "the statistics'")
            loaded[tm["feature"]] = t
        s = cls(None, cfg, auto_tables=True)
        s._configs = {f: TableConfig(t.name, t.num_rows, f) for f, t in loaded.items()}
        s._tables = loaded
        s.auto_tables = meta["auto_tables"]
        s.batches, s.samples, s.ids = (meta[k] for k in ("batches", "samples", "ids"))
        s.first_ts, s.last_ts = meta["first_ts"], meta["last_ts"]
        return s

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and verify (a crash leaves the previous file intact)."""
        return write_atomic(path, self.to_bytes(), verify_kind=_KIND)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "StreamStats":
        """Read a file written by :meth:`save` (see :meth:`from_bytes`); FormatError naming it."""
        if not os.path.lexists(path):
            raise FormatError(f"{path}: no such statistics file")
        return cls.from_bytes(read_bytes(path, "statistics file"), str(path))

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __repr__(self) -> str:
        return (f"StreamStats(tables={list(self._tables)}, batches={self.batches}, "
                f"ids={self.ids}, state_bytes={self.state_bytes})")
