"""A compact bijection of row IDs: explicit rows in a sorted map, every other row by arithmetic.

The TorchRec export (:mod:`flexshard_stream.bridge.export`) renumbers the rows of a
table of ``H`` rows: hot rows first (``[0, K)``), then the cold rows in TorchRec's row blocks. A
dense ``int64[H]`` permutation takes ``8 H`` bytes (8 GB for 10^9 rows, nothing at all for hashed
64-bit IDs), while only the individually chosen rows (replicas, explicitly placed rows) need an
entry: the others are contiguous ranges of the plan's cold function, which stay contiguous (or are
cut at a few block boundaries) after the renumbering. :class:`IdRemap` stores exactly that:

``exceptions`` (int64[E, 2], sorted by the first column)
    ``(original ID, new index)`` of every individually placed row.
``segments`` (int64[S, 2], sorted by the first column, the first one starting at 0)
    the other ("regular") rows, by their *regular rank* ``r(x) = x - #{exceptions < x}`` (the
    position of ``x`` among the regular rows): regular rows of ranks ``[s_i, s_{i+1})`` get the new
    indices ``n_i + (r - s_i)``, ``(s_i, n_i) = segments[i]``.

Looking an ID up is two binary searches, vectorized::

    p = searchsorted(exc_ids, x)                              # exceptions below x
    hit = exc_ids[p] == x                                     # (p < E)
    r = x - p                                                 # regular rank of x
    s = searchsorted(seg_rank, r, side="right") - 1
    new = exc_new[p] if hit else seg_new[s] + r - seg_rank[s]

Memory and time are ``O(E + S)`` to build and verify and ``O(log(E + S))`` per ID, whatever ``H``
(up to ``2**63 - 1`` rows). :meth:`IdRemap.apply` is the numpy lookup;
``flexshard_stream.bridge.loader.TableRemap`` is its torch twin (same arrays, same
searches, identical results, tested); :meth:`IdRemap.original` inverts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, FormatError

__all__ = ["IdRemap", "regular_rank", "regular_id"]


def regular_rank(exc_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Regular rank ``x - #{exceptions < x}`` of each ID (int64; meaningful for non-exceptions)."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids - np.searchsorted(exc_ids, ids, side="left").astype(np.int64)


def regular_id(exc_ids: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The inverse of :func:`regular_rank`: the ``r``-th ID that is not an exception, for each
    rank ``r`` (int64). ``exc_ids`` sorted and unique."""
    ranks = np.asarray(ranks, dtype=np.int64)
    if not exc_ids.size:
        return ranks.copy()
    # exc_ids[j] - j = regular rows below exception j; the r-th regular row is r + (exceptions
    # with at most r regular rows below them)
    gaps = exc_ids - np.arange(exc_ids.size, dtype=np.int64)
    return ranks + np.searchsorted(gaps, ranks, side="right").astype(np.int64)


@dataclass(frozen=True, eq=False)
class IdRemap:
    """A bijection of ``[0, num_rows)`` (see the module docstring for the encoding).

    Attributes
    ----------
    num_rows : int
        H, rows (IDs ``0 .. H - 1``).
    exceptions : ndarray of int64, shape (E, 2)
        ``(original ID, new index)`` of the individually placed rows, by original ID.
    segments : ndarray of int64, shape (S, 2)
        ``(regular rank start, new index start)`` of the runs of regular rows, by rank.
    """

    num_rows: int
    exceptions: np.ndarray
    segments: np.ndarray

    def __post_init__(self) -> None:
        for name in ("exceptions", "segments"):
            a = np.asarray(getattr(self, name))
            if a.size == 0:
                a = np.zeros((0, 2), np.int64)
            if a.dtype != np.int64 or a.ndim != 2 or a.shape[1] != 2:
                raise ConfigError(f"IdRemap {name} must be int64[n, 2], got {a.dtype} "
                                  f"{list(a.shape)}")
            object.__setattr__(self, name, np.ascontiguousarray(a))
        object.__setattr__(self, "num_rows", int(self.num_rows))

    # ------------------------------------------------------------------ construction
    @classmethod
    def identity(cls, num_rows: int) -> "IdRemap":
        """``new = id`` for every row (no exceptions, one segment)."""
        return cls(num_rows, np.zeros((0, 2), np.int64), np.zeros((1, 2), np.int64))

    @classmethod
    def from_permutation(cls, remap: np.ndarray) -> "IdRemap":
        """The compact form of a dense permutation ``new = remap[id]`` (``O(H)``: for tests and
        small tables). Every row whose new index does not continue its predecessor's run starts a
        segment; no exceptions."""
        remap = np.asarray(remap, dtype=np.int64)
        starts = np.flatnonzero(np.diff(remap, prepend=remap[:1] - 2) != 1)
        segs = np.stack([starts.astype(np.int64), remap[starts]], axis=1)
        return cls(remap.size, np.zeros((0, 2), np.int64), segs)

    # ------------------------------------------------------------------ views
    @property
    def exception_ids(self) -> np.ndarray:
        """Original IDs of the exceptions, sorted (int64[E], contiguous)."""
        return np.ascontiguousarray(self.exceptions[:, 0])

    @property
    def regular_rows(self) -> int:
        """Rows that are not exceptions."""
        return self.num_rows - int(self.exceptions.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the two arrays (the remap's whole size)."""
        return int(self.exceptions.nbytes + self.segments.nbytes)

    def segment_lengths(self) -> np.ndarray:
        """Regular rows in each segment (int64[S])."""
        starts = self.segments[:, 0]
        if not starts.size:
            return np.zeros(0, np.int64)
        return np.diff(starts, append=np.int64(self.regular_rows)).astype(np.int64)

    # ------------------------------------------------------------------ lookups
    def apply(self, ids: Any, where: str = "IdRemap") -> np.ndarray:
        """New index of each ID (int64, same shape); :class:`ConfigError` for an ID outside
        ``[0, num_rows)`` (``where`` names the table)."""
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise ConfigError(f"{where}: IDs must be integers, got dtype {ids.dtype}")
        ids = ids.astype(np.int64, copy=False)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_rows):
            raise ConfigError(f"{where}: IDs must lie in [0, {self.num_rows}), got "
                              f"{int(ids.min())}..{int(ids.max())}")
        flat = ids.ravel()
        exc, seg = self.exceptions, self.segments
        out = np.empty(flat.size, np.int64)
        p = np.searchsorted(exc[:, 0], flat, side="left")
        hit = np.zeros(flat.size, np.bool_)
        if exc.shape[0]:
            pc = np.minimum(p, exc.shape[0] - 1)
            hit = exc[pc, 0] == flat
            out[hit] = exc[pc[hit], 1]
        miss = ~hit
        r = flat[miss] - p[miss]
        if r.size:
            s = np.searchsorted(seg[:, 0], r, side="right") - 1
            out[miss] = seg[s, 1] + (r - seg[s, 0])
        return out.reshape(ids.shape)

    def original(self, new: Any) -> np.ndarray:
        """Original ID of each new index (the inverse of :meth:`apply`; int64)."""
        new = np.asarray(new, dtype=np.int64)
        if new.size and (int(new.min()) < 0 or int(new.max()) >= self.num_rows):
            raise ConfigError(f"new indices must lie in [0, {self.num_rows})")
        flat = new.ravel()
        out = np.empty(flat.size, np.int64)
        exc = self.exceptions[np.argsort(self.exceptions[:, 1], kind="stable")]
        hit = np.zeros(flat.size, np.bool_)
        if exc.shape[0]:
            p = np.minimum(np.searchsorted(exc[:, 1], flat), exc.shape[0] - 1)
            hit = exc[p, 1] == flat
            out[hit] = exc[p[hit], 0]
        miss = ~hit
        if miss.any():
            order = np.argsort(self.segments[:, 1], kind="stable")
            seg = self.segments[order]
            s = np.searchsorted(seg[:, 1], flat[miss], side="right") - 1
            ranks = seg[s, 0] + (flat[miss] - seg[s, 1])
            out[miss] = regular_id(self.exception_ids, ranks)
        return out.reshape(new.shape)

    def dense(self) -> np.ndarray:
        """The permutation as a dense int64[H] array (``O(H)`` memory: small tables only)."""
        return self.apply(np.arange(self.num_rows, dtype=np.int64))

    # ------------------------------------------------------------------ checks
    def verify(self, where: str) -> None:
        """Raise :class:`FormatError` (naming ``where``) unless this is a bijection of
        ``[0, num_rows)``: exception IDs sorted, unique and in range; segments starting at rank 0,
        strictly increasing and below the regular rows; the new indices of exceptions (one each)
        and segments (a run each) tiling ``[0, num_rows)`` exactly. ``O((E + S) log(E + S))``."""
        H, exc, seg = self.num_rows, self.exceptions, self.segments
        ids = exc[:, 0]
        if ids.size and (ids[0] < 0 or ids[-1] >= H or np.any(ids[1:] <= ids[:-1])):
            raise FormatError(f"{where}: exception IDs must be sorted, unique and in [0, {H})")
        regular = H - ids.size
        if regular < 0:
            raise FormatError(f"{where}: {ids.size} exceptions for {H} rows")
        starts = seg[:, 0]
        if bool(regular) != bool(starts.size) or (regular and (
                starts[0] != 0 or np.any(starts[1:] <= starts[:-1]) or starts[-1] >= regular)):
            raise FormatError(f"{where}: segment ranks must start at 0 and increase strictly "
                              f"within the {regular} regular rows")
        first = np.concatenate([exc[:, 1], seg[:, 1]])
        length = np.concatenate([np.ones(ids.size, np.int64), self.segment_lengths()])
        order = np.argsort(first, kind="stable")
        first, length = first[order], length[order]
        ends = first + length           # < 2**63: new indices and lengths are below H
        if not first.size or first[0] != 0 or np.any(first[1:] != ends[:-1]) \
                or int(ends[-1]) != H:
            raise FormatError(f"{where}: the new indices do not tile [0, {H}) exactly (the "
                              f"remap is not a bijection)")
