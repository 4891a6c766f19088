"""How a log's IDs become table rows: the ID modes (raw, hash, hash:ROWS) and :class:`RowMap`.

Light on purpose: nothing but the standard library at import (numpy and the batch type are
imported by the methods that map IDs), so the command line parses ``--ids`` with it before loading
anything. :class:`~flexshard_stream.sources.logs.LogReader` applies a :class:`RowMap` to every chunk
it reads (``rows=``); the sidecar's ring loop applies it to every batch (:meth:`RowMap.map_batch`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from ..errors import BatchError, LogError

if TYPE_CHECKING:
    import numpy as np

    from ..stats.batch import Batch

__all__ = ["ID_MODES", "OUT_OF_RANGE", "RANGE_FIXES", "DEFAULT_HEADROOM", "IdMode", "RowMap"]

#: Headroom of table sizes inferred from a log: rows = headroom x what the log needs (its largest
#: ID + 1, or its distinct IDs when hashed), room for the IDs the next log adds.
DEFAULT_HEADROOM = 1.5

#: Ways a log's IDs become table rows (:class:`IdMode`).
ID_MODES: tuple[str, ...] = ("raw", "hash")
#: The reason under which :class:`RowMap` counts dropped rows (beside the log reader's
#: :data:`~flexshard_stream.sources.logs.REASONS`).
OUT_OF_RANGE = "out_of_range"
#: What to do about an ID at or above its table's num_rows (library spelling; the command line
#: shows its flags instead).
RANGE_FIXES = ("size the tables for this log (flexshard-stream tables LOG... --out tables.toml), "
               "hash IDs into the tables (ids='hash'), or pass skip_bad_rows=True to drop and "
               "count such rows")


@dataclass(frozen=True)
class IdMode:
    """How a log's IDs become table rows: ``raw``, ``hash`` or ``hash:ROWS``.

    ``raw``
        An ID is its row: a table needs ``num_rows`` above its largest ID.
    ``hash`` / ``hash:ROWS``
        Row = ``ID mod R`` with ``R = ROWS``, or each table's ``num_rows`` when ``ROWS`` is not
        given. This is the modulo hashing TorchRec users apply to raw or pre-hashed IDs before
        the KeyedJaggedTensor (TorchRec's Criteo pipeline, ``InMemoryBinaryCriteoIterDataPipe(
        hashes=...)``, does ``sparse %= hashes``; DLRM scripts take ``--num_embeddings_per_feature``
        the same way). Plain modulo rather than a mixing hash on purpose: the statistics and
        the plan must see exactly the rows (and collisions) the training job's tables see. IDs
        are non-negative int64, so ``ID mod R`` is ``ID % R`` in numpy.

    Attributes
    ----------
    kind : {"raw", "hash"}
    rows : int or None
        R for every table (``hash:ROWS``); None: each table's ``num_rows``.
    """

    kind: str = "raw"
    rows: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ID_MODES:
            raise LogError(f"ID mode {self.kind!r}: expected one of raw, hash, hash:ROWS")
        if self.rows is not None and (self.kind != "hash" or isinstance(self.rows, bool)
                                      or not isinstance(self.rows, numbers.Integral)
                                      or self.rows < 1):
            raise LogError(f"ID mode {self.kind}:{self.rows!r}: ROWS must be a positive integer "
                           f"and goes with hash only (hash:ROWS)")

    @classmethod
    def parse(cls, spec: "IdMode | str | None") -> "IdMode":
        """``None``/``"raw"``, ``"hash"`` or ``"hash:ROWS"`` (case-insensitive; ROWS may be
        written ``1_000_000``, ``1,000,000`` or ``1e6``).

        Raises
        ------
        LogError
            Anything else, naming the valid forms.
        """
        if spec is None:
            return cls()
        if isinstance(spec, IdMode):
            return spec
        text = str(spec).strip().lower()
        kind, sep, rows = text.partition(":")
        if kind not in ID_MODES or (sep and kind != "hash"):
            raise LogError(f"ID mode {spec!r}: expected raw, hash or hash:ROWS (e.g. "
                           f"hash:1000000)")
        if not sep:
            return cls(kind)
        try:
            r = float(rows.replace("_", "").replace(",", ""))
        except ValueError:
            r = float("nan")
        if not (math.isfinite(r) and r >= 1 and r.is_integer() and r < 2**63):
            raise LogError(f"ID mode {spec!r}: ROWS must be a positive whole number of rows, "
                           f"got {rows!r}")
        return cls("hash", int(r))

    @property
    def hashed(self) -> bool:
        """IDs are taken modulo a row count."""
        return self.kind == "hash"

    def __str__(self) -> str:
        return self.kind if self.rows is None else f"{self.kind}:{self.rows}"


class RowMap:
    """Per feature, how IDs become rows and the table size they must fit.

    The one place where a log's IDs meet the tables' ``num_rows``: :class:`LogReader` applies it
    to every chunk of a file (``rows=``) before batching, so a row out of range is reported with
    its file, row and column, or dropped and counted under :data:`OUT_OF_RANGE` with
    ``skip_bad_rows``.

    Parameters
    ----------
    num_rows : mapping of str to int
        Feature -> rows of its table (features not listed pass through unchecked).
    mode : IdMode or str
        ``raw`` (IDs must be below ``num_rows``), ``hash`` (ID mod ``num_rows``) or
        ``hash:ROWS`` (ID mod ``ROWS``; ``ROWS`` must not exceed a table's ``num_rows``).

    Raises
    ------
    LogError
        An invalid mode, or ``hash:ROWS`` larger than a table.
    """

    def __init__(self, num_rows: Mapping[str, int], mode: "IdMode | str | None" = None):
        self.mode = IdMode.parse(mode)
        self.num_rows = {str(f): int(n) for f, n in num_rows.items()}
        bad = {f: n for f, n in self.num_rows.items() if n < 1}
        if bad:
            raise LogError(f"tables need at least one row; got num_rows {bad}")
        if self.mode.rows is not None:
            small = {f: n for f, n in self.num_rows.items() if n < self.mode.rows}
            if small:
                raise LogError(f"ID mode {self.mode}: rows {self.mode.rows:,} exceed the tables' "
                               f"num_rows {small}; hash into each table's own size with ids="
                               f"'hash'")
        self.moduli = ({f: (self.mode.rows or n) for f, n in self.num_rows.items()}
                       if self.mode.hashed else {})

    def __repr__(self) -> str:
        return f"RowMap({self.num_rows}, mode={str(self.mode)!r})"

    def map_values(self, feature: str, values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows of one feature's IDs, and (raw mode) the positions out of range (bool per
        value, None when all fit)."""
        import numpy as np

        m = self.moduli.get(feature)
        if m is not None:
            return np.remainder(values, m), None
        n = self.num_rows.get(feature)
        if n is None or not values.size or int(values.max()) < n:
            return values, None
        return values, values >= n

    def map_batch(self, batch: Batch) -> Batch:
        """A batch with IDs mapped to rows (for batches that do not come from a log file, as
        in the sidecar).

        Raises
        ------
        BatchError
            Raw mode and an ID at or above its table's ``num_rows`` (naming the feature, the ID
            and the ways out).
        """
        import numpy as np

        from ..stats.batch import Batch

        offsets = batch.key_offsets()
        out = []
        for i, k in enumerate(batch.keys):
            v, bad = self.map_values(k, batch.values[offsets[i]:offsets[i + 1]])
            if bad is not None:
                p = int(np.argmax(bad))
                raise BatchError(f"ID {int(v[p])} out of range: the table has num_rows "
                                 f"{self.num_rows[k]:,}; {RANGE_FIXES}", feature=k,
                                 field="values", position=p)
            out.append(v)
        values = np.concatenate(out) if len(out) > 1 else (out[0] if out else batch.values)
        return Batch(batch.keys, values, batch.lengths, batch.weights, batch.timestamp)
