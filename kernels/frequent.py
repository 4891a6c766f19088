"""Misra-Gries heavy hitters with batched median purge: the DataSketches frequent-items algorithm.

State (all numpy, owned by the caller):

- ``keys``  int64[S], ``vals`` int64[S] with ``S = 2**lg_size`` (linear probing; ``vals == 0`` is an
  empty slot);
- ``meta``  int64[3] = ``[num_active, offset, stream_weight]``.

At most ``0.75 * S`` counters are live. When an insert would exceed that, the purge takes the median of
a sample of up to 1024 live counters, subtracts it from every counter, drops the ones that reach zero,
and adds it to ``offset`` (Anderson et al., "A high-performance algorithm for identifying frequent items
in data streams", IMC 2017). Guarantees, for every item: ``vals[item] <= true <= vals[item] + offset``
(``0 <= true <= offset`` for items without a counter), and ``offset <= N / (0.75 S / 2)`` roughly.
"""

import numpy as np
from numba import njit, uint64

from .hashing import mix64

SAMPLE = 1024


@njit(nogil=True, cache=True, inline="always")
def _slot(h, shift):
    return np.int64(h >> shift)


@njit(nogil=True, cache=True)
def _insert(keys, vals, shift, mask, key, h, w):
    """Add ``w`` to ``key``; return 1 if a new counter was created, else 0."""
    i = _slot(h, shift)
    while True:
        v = vals[i]
        if v == 0:
            keys[i] = key
            vals[i] = w
            return 1
        if keys[i] == key:
            vals[i] = v + w
            return 0
        i = (i + 1) & mask


@njit(nogil=True, cache=True)
def mg_purge(keys, vals, meta, seed):
    """Subtract the sample median from every counter, drop non-positive ones, grow ``offset``."""
    S = vals.shape[0]
    active = meta[0]
    ns = min(SAMPLE, active)
    sample = np.empty(ns, dtype=np.int64)
    t = 0
    for i in range(S):
        if vals[i] > 0:
            sample[t] = vals[i]
            t += 1
            if t == ns:
                break
    med = np.int64(np.median(sample))
    if med < 1:
        med = 1
    # Collect survivors, clear, re-insert (cheaper and simpler than back-shift deletion at 75% load).
    sk = np.empty(active, dtype=np.int64)
    sv = np.empty(active, dtype=np.int64)
    m = 0
    for i in range(S):
        v = vals[i]
        if v > 0:
            if v > med:
                sk[m] = keys[i]
                sv[m] = v - med
                m += 1
            vals[i] = 0
    lg = 0
    while (1 << lg) < S:
        lg += 1
    shift = uint64(64 - lg)
    mask = S - 1
    for k in range(m):
        _insert(keys, vals, shift, mask, sk[k], mix64(uint64(sk[k]), seed), sv[k])
    meta[0] = m
    meta[1] += med


@njit(nogil=True, cache=True)
def mg_update_hashed(keys, vals, meta, ids, hashes, n, seed):
    """Count the first ``n`` of ``ids`` (hashes precomputed with the table seed), weight 1 each."""
    S = vals.shape[0]
    lg = 0
    while (1 << lg) < S:
        lg += 1
    shift = uint64(64 - lg)
    mask = S - 1
    cap = (S * 3) // 4
    active = meta[0]
    for k in range(n):
        active += _insert(keys, vals, shift, mask, ids[k], hashes[k], 1)
        if active > cap:
            meta[0] = active
            mg_purge(keys, vals, meta, seed)
            active = meta[0]
    meta[0] = active
    meta[2] += n


@njit(nogil=True, cache=True)
def mg_update_weighted(keys, vals, meta, ids, weights, seed):
    """Add ``weights[k]`` (int64 > 0) to ``ids[k]``: merging another sketch's counters."""
    S = vals.shape[0]
    lg = 0
    while (1 << lg) < S:
        lg += 1
    shift = uint64(64 - lg)
    mask = S - 1
    cap = (S * 3) // 4
    active = meta[0]
    total = 0
    for k in range(ids.shape[0]):
        w = weights[k]
        if w <= 0:
            continue
        total += w
        active += _insert(keys, vals, shift, mask, ids[k], mix64(uint64(ids[k]), seed), w)
        if active > cap:
            meta[0] = active
            mg_purge(keys, vals, meta, seed)
            active = meta[0]
    meta[0] = active
    return total


@njit(nogil=True, cache=True)
def mg_lookup(keys, vals, ids, seed, out):
    """Counter value (lower bound) of each of ``ids`` into ``out`` (0 when not tracked)."""
    S = vals.shape[0]
    lg = 0
    while (1 << lg) < S:
        lg += 1
    shift = uint64(64 - lg)
    mask = S - 1
    for k in range(ids.shape[0]):
        key = ids[k]
        i = _slot(mix64(uint64(key), seed), shift)
        out[k] = 0
        while vals[i] != 0:
            if keys[i] == key:
                out[k] = vals[i]
                break
            i = (i + 1) & mask
    return out


@njit(nogil=True, cache=True)
def mg_update(keys, vals, meta, ids, seed):
    """Hash and count ``ids`` (int64), weight 1 each; standalone (unfused) path."""
    buf = np.empty(2048, dtype=np.uint64)
    n = ids.shape[0]
    for start in range(0, n, 2048):
        stop = min(start + 2048, n)
        for k in range(start, stop):
            buf[k - start] = mix64(uint64(ids[k]), seed)
        mg_update_hashed(keys, vals, meta, ids[start:stop], buf, stop - start, seed)
