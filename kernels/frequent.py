"""Heavy hitters: rows counted exactly from the moment they are tracked, admitted through a gate.

State (all numpy, owned by the caller), ``S = 2**lg`` slots with linear probing from the top ``lg``
bits of the row hash:

- ``keys`` int64[S], ``counts`` int64[S] (``counts == 0``: empty slot), ``errs`` int64[S];
- ``meta`` int64[3] = ``[live, threshold, stream_weight]``.

Invariants, for the stream counted so far (``f`` = a row's true count):

- a tracked row has ``counts <= f <= counts + errs`` (``counts`` are the occurrences since it was
  admitted, ``errs`` bounds the ones before);
- an untracked row has ``f <= threshold`` (so no row above the threshold is missing);
- a tracked row has ``counts + errs > threshold`` and ``errs <= threshold``.

An occurrence reaches the table only when the caller's gate lets it through: with a count-min sketch
the gate is "estimate after this occurrence > threshold" (the estimate never falls below ``f``, so a
rejected occurrence keeps ``f <= estimate <= threshold``: an untracked row stays within the bound, and
a tracked row stays within ``counts + errs``, which exceeds the threshold). A passing occurrence of a
tracked row adds one to its count; of an untracked row it admits the row with ``counts = 1`` and
``errs = threshold`` (its earlier occurrences number at most the threshold).

At most ``0.75 * S`` rows are tracked. When an admission would exceed that, the purge takes the median
``P`` of ``counts + errs`` over a sample of up to 1024 tracked rows, raises the threshold to ``P`` and
drops every row with ``counts + errs <= threshold`` (each then satisfies ``f <= threshold``); at least
one row always goes. Merging adds counts and errors (a row tracked on one side only gets the other
side's threshold as error) and adds thresholds. Every loop is bounded by the table size, whatever
state it is handed: a table without an empty slot is purged, never probed forever.
"""

import numpy as np
from numba import int64, njit, uint64

from .hashing import mix64

#: Tracked rows sampled for the purge median.
SAMPLE = 1024
#: :func:`hh_probe` result when the probe met neither the key nor an empty slot (a full table).
FULL = -(1 << 62)


@njit(nogil=True, cache=True, inline="always")
def hh_shift(size):
    """Shift taking a 64-bit hash to a home slot of a table of ``size`` (a power of two) slots."""
    lg = 0
    while (1 << lg) < size:
        lg += 1
    return uint64(64 - lg)


@njit(nogil=True, cache=True)
def hh_capacity(size):
    """Rows tracked at most by a table of ``size`` slots (three quarters, as DataSketches)."""
    return (size * 3) // 4


@njit(nogil=True, cache=True, inline="always")
def hh_probe(keys, counts, key, h, shift):
    """Slot of ``key`` (>= 0); ``-1 - slot`` of the empty slot where it would go; :data:`FULL`."""
    size = uint64(counts.shape[0])
    mask = size - uint64(1)
    i = h >> shift
    for _ in range(size):
        if counts[i] == 0:
            return -1 - int64(i)
        if keys[i] == key:
            return int64(i)
        i = (i + uint64(1)) & mask
    return FULL


@njit(nogil=True, cache=True)
def hh_check_sizes(keys, counts, errs):
    """Raise ValueError unless the three arrays share one power-of-two length >= 8 (any other
    length would send a home slot past the end)."""
    size = counts.shape[0]
    if size < 8 or size & (size - 1) or keys.shape[0] != size or errs.shape[0] != size:
        raise ValueError("heavy-hitter arrays must share one power-of-two length >= 8")


@njit(nogil=True, cache=True)
def _refill(keys, counts, errs, src_keys, src_counts, src_errs, seed):
    """Insert rows into a table whose ``counts`` are all zero; a repeated key adds to the first copy
    (only a damaged source repeats one). Returns the rows inserted. The caller guarantees fewer rows
    than slots."""
    shift = hh_shift(counts.shape[0])
    m = 0
    for k in range(src_keys.shape[0]):
        key = src_keys[k]
        p = hh_probe(keys, counts, key, mix64(uint64(key), seed), shift)
        if p >= 0:
            counts[p] += src_counts[k]
            errs[p] = max(errs[p], src_errs[k])
        elif p != FULL:
            i = -1 - p
            keys[i] = key
            counts[i] = src_counts[k]
            errs[i] = src_errs[k]
            m += 1
    return m


@njit(nogil=True, cache=True)
def hh_purge(keys, counts, errs, meta, seed):
    """Raise the threshold to the sample median of ``counts + errs`` and drop the tracked rows at or
    below it. Recounts the live rows from the arrays (``meta[0]`` is not trusted) and clears every
    other slot (a damaged negative count included)."""
    hh_check_sizes(keys, counts, errs)
    size = counts.shape[0]
    sample = np.empty(SAMPLE, dtype=np.int64)
    t = 0
    live = 0
    for i in range(size):
        if counts[i] > 0:
            live += 1
            if t < SAMPLE:
                sample[t] = counts[i] + errs[i]
                t += 1
    if t == 0:
        counts[:] = 0
        meta[0] = 0
        return
    sample = np.sort(sample[:t])
    threshold = max(meta[1], sample[(t - 1) // 2])
    sk = np.empty(live, dtype=np.int64)
    sc = np.empty(live, dtype=np.int64)
    se = np.empty(live, dtype=np.int64)
    m = 0
    for i in range(size):
        c = counts[i]
        if c > 0 and c + errs[i] > threshold:
            sk[m] = keys[i]
            sc[m] = c
            se[m] = errs[i]
            m += 1
        counts[i] = 0
    meta[0] = _refill(keys, counts, errs, sk[:m], sc[:m], se[:m], seed)
    meta[1] = threshold


@njit(nogil=True, cache=True)
def hh_count_passing(keys, counts, errs, meta, ids, hashes, est, sel, ns, seed):
    """Count the gate-passing occurrences ``sel[:ns]`` (indices into ``ids``/``hashes``/``est``):
    a tracked row's count grows by one; an untracked row is admitted while its estimate still
    exceeds the threshold (a purge earlier in the batch may have raised it)."""
    hh_check_sizes(keys, counts, errs)
    size = counts.shape[0]
    shift = hh_shift(size)
    cap = hh_capacity(size)
    live = meta[0]
    for t in range(ns):
        k = sel[t]
        key = ids[k]
        h = hashes[k]
        p = hh_probe(keys, counts, key, h, shift)
        if p == FULL:  # only a damaged table has no empty slot: a purge frees one, look again
            meta[0] = live
            hh_purge(keys, counts, errs, meta, seed)
            live = meta[0]
            p = hh_probe(keys, counts, key, h, shift)
        if p >= 0:
            counts[p] += 1
            continue
        if est[k] <= meta[1]:
            continue
        i = -1 - p
        keys[i] = key
        counts[i] = 1
        errs[i] = meta[1]
        live += 1
        if live > cap:
            meta[0] = live
            hh_purge(keys, counts, errs, meta, seed)
            live = meta[0]
    meta[0] = live


@njit(nogil=True, cache=True)
def hh_lookup(keys, counts, errs, ids, seed, out_count, out_err):
    """Per ID: ``out_count`` its count (0 when untracked) and ``out_err`` its error bound (-1 when
    untracked: the caller uses the threshold)."""
    hh_check_sizes(keys, counts, errs)
    shift = hh_shift(counts.shape[0])
    for k in range(ids.shape[0]):
        key = ids[k]
        p = hh_probe(keys, counts, key, mix64(uint64(key), seed), shift)
        if p >= 0:
            out_count[k] = counts[p]
            out_err[k] = errs[p]
        else:
            out_count[k] = 0
            out_err[k] = -1


@njit(nogil=True, cache=True)
def hh_rebuild(keys, counts, errs, meta, src_keys, src_counts, src_errs, threshold, seed):
    """Refill the table from rows ``src_*`` (counts > 0, errs >= 0) under ``threshold``: rows with
    ``counts + errs <= threshold`` are dropped, and while more rows remain than the table tracks the
    threshold rises to their median (as a purge). Returns the number of duplicate keys met (their
    later copies are added to the first: only a damaged source has any)."""
    hh_check_sizes(keys, counts, errs)
    size = counts.shape[0]
    cap = hh_capacity(size)
    n = src_keys.shape[0]
    upper = src_counts + src_errs
    keep = upper > threshold
    while keep.sum() > cap:
        live = upper[keep]
        ns = min(SAMPLE, live.shape[0])
        sample = np.sort(live[:ns])
        threshold = max(threshold, sample[(ns - 1) // 2])
        keep &= upper > threshold
    counts[:] = 0
    errs[:] = 0
    kept = np.flatnonzero(keep)
    m = _refill(keys, counts, errs, src_keys[kept], src_counts[kept], src_errs[kept], seed)
    meta[0] = m
    meta[1] = threshold
    return kept.shape[0] - m


@njit(nogil=True, cache=True)
def hh_union(keys, counts, errs, threshold, okeys, ocounts, oerrs, othreshold, seed):
    """The rows of two tables of equal size and seed, merged: ``(keys, counts, errs)`` arrays with
    counts and errors added, a row missing on one side taking that side's threshold as error.
    The merged threshold is ``threshold + othreshold``."""
    hh_check_sizes(keys, counts, errs)
    hh_check_sizes(okeys, ocounts, oerrs)
    if ocounts.shape[0] != counts.shape[0]:
        raise ValueError("heavy-hitter tables of different sizes do not merge")
    size = counts.shape[0]
    shift = hh_shift(size)
    n = 0
    for i in range(size):
        n += counts[i] > 0
    for i in range(ocounts.shape[0]):
        n += ocounts[i] > 0
    uk = np.empty(n, dtype=np.int64)
    uc = np.empty(n, dtype=np.int64)
    ue = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(size):
        if counts[i] > 0:
            key = keys[i]
            p = hh_probe(okeys, ocounts, key, mix64(uint64(key), seed), shift)
            uk[m] = key
            if p >= 0:
                uc[m] = counts[i] + ocounts[p]
                ue[m] = errs[i] + oerrs[p]
            else:
                uc[m] = counts[i]
                ue[m] = errs[i] + othreshold
            m += 1
    for i in range(ocounts.shape[0]):
        if ocounts[i] > 0:
            key = okeys[i]
            if hh_probe(keys, counts, key, mix64(uint64(key), seed), shift) >= 0:
                continue
            uk[m] = key
            uc[m] = ocounts[i]
            ue[m] = oerrs[i] + threshold
            m += 1
    return uk[:m], uc[:m], ue[:m]


@njit(nogil=True, cache=True)
def hh_update(keys, counts, errs, meta, ids, seed):
    """Count ``ids`` (int64) with no gate (every occurrence passes): the standalone heavy-hitter
    path without a count-min sketch."""
    buf = np.empty(2048, dtype=np.uint64)
    est = np.full(2048, np.iinfo(np.int64).max, dtype=np.int64)
    sel = np.arange(2048)
    n = ids.shape[0]
    for start in range(0, n, 2048):
        stop = min(start + 2048, n)
        for k in range(start, stop):
            buf[k - start] = mix64(uint64(ids[k]), seed)
        hh_count_passing(keys, counts, errs, meta, ids[start:stop], buf, est, sel, stop - start,
                         seed)
    meta[2] += n


@njit(nogil=True, cache=True)
def hh_misplaced(keys, counts, seed):
    """First slot whose tracked row a probe from its home slot does not reach (a misplaced or
    repeated key), else -1: the layout check of a loaded table."""
    hh_check_sizes(keys, counts, counts)
    shift = hh_shift(counts.shape[0])
    for i in range(counts.shape[0]):
        if counts[i] > 0:
            key = keys[i]
            if hh_probe(keys, counts, key, mix64(uint64(key), seed), shift) != i:
                return i
    return -1
