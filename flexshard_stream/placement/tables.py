"""Embedding tables: what a plan places (rows, dimension, element size, optimizer state).

Notation of ``DESIGN.md`` section 3: table t has H rows of dimension D, e bytes per element and s bytes
of optimizer state per row. A lookup moves one embedding vector of ``D * e`` bytes; a stored row takes
``D * e + s`` bytes.

TOML layout
-----------
::

    [[table]]
    name = "item_history"        # required, unique
    feature = "item_history"     # log column / batch key feeding the table; default: name
    num_rows = 100000000         # H, required
    dim = 128                    # D, required
    dtype = "fp32"               # fp32, fp16 or bf16 (e = 4, 2, 2 bytes); default fp32
    kind = "sequence"            # "sequence" or "pooled"; default sequence
    optimizer_state_bytes = 4    # s, bytes per row; default 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..formats.toml import read_toml, toml_value, write_text_atomic
from ..sources.logs import FeatureSpec, Paths, inspect_log, log_max_ids
from .topology import PathLike

__all__ = ["DTYPE_BYTES", "TABLE_KINDS", "EmbeddingTable", "load_tables", "save_tables",
           "infer_tables", "tables_by_feature"]

#: Bytes per element of each supported dtype (e).
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
#: Table kinds: a sequence table returns one vector per ID; a pooled table one sum per sample.
TABLE_KINDS: tuple[str, ...] = ("sequence", "pooled")

_KEYS = ("name", "feature", "num_rows", "dim", "dtype", "kind", "optimizer_state_bytes")
_REQUIRED = ("name", "num_rows", "dim")
_LOG_KIND = {"sequence": "sequence", "single": "pooled"}
#: Largest table: row counts (and IDs) are int64, so at most 2**63 - 1 rows (IDs 0 .. 2**63 - 2).
MAX_ROWS = 2**63 - 1
#: Largest embedding dimension accepted (elements per row); real models use up to a few thousand.
MAX_DIM = 1 << 20
#: Largest optimizer state per row accepted (bytes).
MAX_STATE_BYTES = 1 << 32


def _as_int(value: Any, where: str, minimum: int, maximum: int) -> int:
    """``value`` as an int in ``[minimum, maximum]``; integral floats (``1e8`` in TOML) are
    accepted."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} = {value!r}: must be an integer, got bool")
    if isinstance(value, (int, np.integer)):
        v = int(value)
    elif isinstance(value, (float, np.floating)) and math.isfinite(value) \
            and float(value).is_integer() and abs(value) < 2**53:
        v = int(value)
    else:
        raise ConfigError(f"{where} = {value!r}: must be an integer, got {type(value).__name__}")
    if v < minimum:
        cond = "> 0" if minimum == 1 else f">= {minimum}"
        raise ConfigError(f"{where} = {value!r}: must be {cond}")
    if v > maximum:
        raise ConfigError(f"{where} = {value!r}: must be at most {maximum:,}")
    return v


@dataclass(frozen=True)
class EmbeddingTable:
    """One embedding table.

    Parameters
    ----------
    name : str
        Unique table name (non-empty).
    num_rows : int
        H, rows (> 0).
    dim : int
        D, elements per row (> 0).
    dtype : {"fp32", "fp16", "bf16"}
        Element type; e = ``DTYPE_BYTES[dtype]`` bytes.
    kind : {"sequence", "pooled"}
        Sequence: one vector per looked-up ID; pooled: one sum per sample.
    feature : str
        Log column / batch key feeding the table; ``""`` means ``name``.
    optimizer_state_bytes : int
        s, bytes of optimizer state stored per row (>= 0).

    Raises
    ------
    ConfigError
        Empty name, non-positive ``num_rows`` or ``dim``, unknown dtype or kind, negative
        ``optimizer_state_bytes``.
    """

    name: str
    num_rows: int
    dim: int
    dtype: str = "fp32"
    kind: str = "sequence"
    feature: str = ""
    optimizer_state_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table name = {self.name!r}: must be a non-empty string")
        where = f"table {self.name!r}:"
        object.__setattr__(self, "num_rows",
                           _as_int(self.num_rows, f"{where} num_rows", 1, MAX_ROWS))
        object.__setattr__(self, "dim", _as_int(self.dim, f"{where} dim", 1, MAX_DIM))
        object.__setattr__(self, "optimizer_state_bytes",
                           _as_int(self.optimizer_state_bytes, f"{where} optimizer_state_bytes", 0,
                                   MAX_STATE_BYTES))
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"{where} dtype = {self.dtype!r}: unknown; valid dtypes: "
                              f"{list(DTYPE_BYTES)}")
        if not isinstance(self.kind, str) or self.kind not in TABLE_KINDS:
            raise ConfigError(f"{where} kind = {self.kind!r}: unknown; valid kinds: "
                              f"{list(TABLE_KINDS)}")
        if not isinstance(self.feature, str):
            raise ConfigError(f"{where} feature = {self.feature!r}: must be a string")
        if not self.feature:
            object.__setattr__(self, "feature", self.name)

    @property
    def element_bytes(self) -> int:
        """e, bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def embedding_bytes(self) -> int:
        """D * e, bytes of one row's vector (what a lookup or a gradient moves)."""
        return self.dim * self.element_bytes

    @property
    def row_bytes(self) -> int:
        """D * e + s, bytes stored per row (vector plus optimizer state)."""
        return self.embedding_bytes + self.optimizer_state_bytes

    @property
    def table_bytes(self) -> int:
        """H * (D * e + s), bytes of the whole table."""
        return self.num_rows * self.row_bytes

    def to_dict(self) -> dict[str, Any]:
        """All fields, in the TOML key order."""
        return {k: getattr(self, k) for k in _KEYS}


def _table_from_entry(entry: Any, i: int, src: str) -> EmbeddingTable:
    where = f"{src}: [[table]] entry {i} (0-based)"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a table, got {entry!r}")
    if isinstance(entry.get("name"), str):
        where += f", name {entry['name']!r}"
    unknown = [k for k in entry if k not in _KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (value {entry[unknown[0]]!r}); "
                          f"known keys: {list(_KEYS)}")
    for key in _REQUIRED:
        if key not in entry:
            raise ConfigError(f"{where}: missing the required key {key!r}")
    for key in ("name", "feature", "dtype", "kind"):
        if key in entry and not isinstance(entry[key], str):
            raise ConfigError(f"{where}: {key} = {entry[key]!r}: must be a string")
    try:
        return EmbeddingTable(**entry)
    except ConfigError as e:
        raise ConfigError(f"{src}: [[table]] entry {i} (0-based), {e}") from None


def tables_from_dict(d: Mapping[str, Any], *, source: str | None = None) -> list[EmbeddingTable]:
    """Tables from the TOML layout (a mapping with a ``table`` array of tables).

    Raises
    ------
    ConfigError
        No ``[[table]]``, unknown keys, missing required keys (naming the entry), invalid values,
        duplicate names.
    """
    src = source or "<tables dict>"
    if not isinstance(d, Mapping):
        raise ConfigError(f"{src}: expected a mapping with [[table]] entries, got {type(d).__name__}")
    unknown = [k for k in d if k != "table"]
    if unknown:
        raise ConfigError(f"{src}: unknown top-level key(s) {unknown}; known keys: ['table'] "
                          f"([[table]] entries)")
    entries = d.get("table")
    if not entries:
        raise ConfigError(f"{src}: no [[table]] entries")
    if not isinstance(entries, list):
        raise ConfigError(f"{src}: table = {entries!r}: must be an array of tables ([[table]])")
    tables = [_table_from_entry(e, i, src) for i, e in enumerate(entries)]
    _check_unique_names(tables, src)
    return tables


def _check_unique_names(tables: Sequence[EmbeddingTable], src: str) -> None:
    first: dict[str, int] = {}
    for i, t in enumerate(tables):
        if t.name in first:
            raise ConfigError(f"{src}: duplicate table name {t.name!r} (entries {first[t.name]} "
                              f"and {i}, 0-based)")
        first[t.name] = i


def load_tables(path: PathLike) -> list[EmbeddingTable]:
    """Read a TOML file of ``[[table]]`` entries (layout in the module docstring).

    Raises
    ------
    FormatError
        The file cannot be read or is not valid TOML.
    ConfigError
        Invalid content (see :func:`tables_from_dict`); the message names the file.
    """
    return tables_from_dict(read_toml(path), source=str(path))


def save_tables(tables: Iterable[EmbeddingTable], path: PathLike) -> None:
    """Write tables as TOML, every field explicit; ``load_tables`` reads back equal tables.

    Raises
    ------
    ConfigError
        No tables, a non-table item, or duplicate names.
    """
    tables = list(tables)
    if not tables:
        raise ConfigError(f"{path}: no tables to save")
    for i, t in enumerate(tables):
        if not isinstance(t, EmbeddingTable):
            raise ConfigError(f"{path}: item {i} is not an EmbeddingTable: {t!r}")
    _check_unique_names(tables, str(path))
    lines = ["# Embedding tables (flexshard_stream.placement.tables): H = num_rows, D = dim, e = dtype bytes,",
             "# s = optimizer_state_bytes per row."]
    for t in tables:
        lines += ["", "[[table]]"] + [f"{k} = {toml_value(v)}" for k, v in t.to_dict().items()]
    write_text_atomic(path, "\n".join(lines) + "\n")


def infer_tables(log_paths: Paths, features: FeatureSpec = None, dim: int = 128,
                 dtype: str = "fp32", *, optimizer_state_bytes: int = 0,
                 ignore: Iterable[str] = ()) -> list[EmbeddingTable]:
    """One table per feature of a log, sized by the largest ID seen.

    Parameters
    ----------
    log_paths : path, glob, directory or sequence of them
        Log files (see :func:`flexshard_stream.sources.logs.inspect_log`).
    features : optional
        Feature columns (and kinds) to use; default: every ID column (see ``inspect_log``).
    dim : int
        D of every table.
    dtype : str
        Element type of every table.
    optimizer_state_bytes : int
        s of every table, bytes per row.
    ignore : iterable of str
        Columns never inferred as features (labels, ...).

    Returns
    -------
    list of EmbeddingTable
        In log column order; name = feature = column; ``num_rows`` = largest ID + 1; kind
        ``"sequence"`` for list columns and ``"pooled"`` for single-ID columns.

    Raises
    ------
    LogError
        Unreadable log or missing / wrongly typed columns.
    ConfigError
        A feature holds no ID at all (no row count to infer), or invalid dim / dtype.
    """
    dim = _as_int(dim, "infer_tables: dim", 1, MAX_DIM)
    optimizer_state_bytes = _as_int(optimizer_state_bytes, "infer_tables: optimizer_state_bytes", 0,
                                    MAX_STATE_BYTES)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ConfigError(f"infer_tables: dtype = {dtype!r}: unknown; valid dtypes: "
                          f"{list(DTYPE_BYTES)}")
    ignore = tuple(ignore)
    schema = inspect_log(log_paths, features, ignore=ignore)
    max_ids = log_max_ids(log_paths, dict(schema.features), ignore=ignore)
    tables = []
    for name, log_kind in schema.features.items():
        top = max_ids[name]
        if top < 0:
            raise ConfigError(f"feature {name!r} holds no ID in the log {log_paths!s}; cannot "
                              f"infer its number of rows")
        if top >= MAX_ROWS:
            raise ConfigError(f"feature {name!r} holds ID {top} in the log {log_paths!s}: a "
                              f"table of {top + 1} rows does not fit an int64 row count; IDs "
                              f"must be below {MAX_ROWS} (give the tables with --tables)")
        tables.append(EmbeddingTable(name, top + 1, dim, dtype, _LOG_KIND[log_kind], name,
                                     optimizer_state_bytes))
    return tables


def tables_by_feature(tables: Iterable[EmbeddingTable]) -> dict[str, EmbeddingTable]:
    """Map feature -> table.

    Raises
    ------
    ConfigError
        Two tables are fed by the same feature.
    """
    out: dict[str, EmbeddingTable] = {}
    for t in tables:
        if t.feature in out:
            raise ConfigError(f"tables {out[t.feature].name!r} and {t.name!r} are both fed by "
                              f"feature {t.feature!r}; each feature may feed one table")
        out[t.feature] = t
    return out


def summaries_by_table(tables: Iterable[EmbeddingTable], summaries: Mapping[str, Any], *,
                       required: bool = True) -> dict[str, Any]:
    """Resolve frequency summaries keyed by table name or by feature to one per table name.

    The one place where "a summary for table ``t``" is decided: the entry under ``t.name`` if
    present, else the one under ``t.feature``. Planners, baselines and evaluators call this once at
    their edge and then index by table name.

    Raises
    ------
    ConfigError
        ``required`` and a table has neither (the message lists the keys present).
    """
    out: dict[str, Any] = {}
    for t in tables:
        s = summaries.get(t.name)
        if s is None:
            s = summaries.get(t.feature)
        if s is None and required:
            raise ConfigError(f"no frequency summary for table {t.name!r} (feature "
                              f"{t.feature!r}); have {sorted(summaries)[:10]}")
        out[t.name] = s
    return out
