"""Count-min sketch kernels (Cormode & Muthukrishnan 2005) over a ``uint32[depth, width]`` table.

Width is a power of two. Row ``i`` of an ID with hash ``h`` uses column
``(lo32(h) + i * (hi32(h) | 1)) & (width - 1)`` (Kirsch-Mitzenmacher double hashing from one 64-bit
hash). Counters saturate at 2**32 - 1 instead of wrapping: a saturated counter only ever
overestimates, so the never-underestimate guarantee survives; callers report saturation.
"""

import numpy as np
from numba import njit, uint32, uint64

from .hashing import mix64

U32_MAX = np.uint32(0xFFFFFFFF)


@njit(nogil=True, cache=True, inline="always")
def _col(h, i, mask):
    return ((h & uint64(0xFFFFFFFF)) + uint64(i) * ((h >> uint64(32)) | uint64(1))) & mask


@njit(nogil=True, cache=True)
def cms_update_hashed(table, hashes, n):
    """Plain (linear) update: +1 in every row for each of the first ``n`` hashes."""
    depth, width = table.shape
    mask = uint64(width - 1)
    for k in range(n):
        h = hashes[k]
        for i in range(depth):
            j = _col(h, i, mask)
            c = table[i, j]
            if c != uint32(0xFFFFFFFF):
                table[i, j] = c + uint32(1)


@njit(nogil=True, cache=True)
def cms_update_conservative_hashed(table, hashes, n):
    """Conservative update (Estan & Varghese 2002): raise only the counters equal to the minimum.

    Still never underestimates; no longer linear (merging by addition stays an upper bound).
    """
    depth, width = table.shape
    mask = uint64(width - 1)
    for k in range(n):
        h = hashes[k]
        m = uint32(0xFFFFFFFF)
        for i in range(depth):
            c = table[i, _col(h, i, mask)]
            if c < m:
                m = c
        if m == uint32(0xFFFFFFFF):
            continue
        m1 = m + uint32(1)
        for i in range(depth):
            j = _col(h, i, mask)
            if table[i, j] < m1:
                table[i, j] = m1


@njit(nogil=True, cache=True)
def cms_query(table, ids, seed, out):
    """Point estimates (minimum over rows) for ``ids`` into ``out`` (uint64)."""
    depth, width = table.shape
    mask = uint64(width - 1)
    for k in range(ids.shape[0]):
        h = mix64(uint64(ids[k]), seed)
        m = uint32(0xFFFFFFFF)
        for i in range(depth):
            c = table[i, _col(h, i, mask)]
            if c < m:
                m = c
        out[k] = m
    return out


@njit(nogil=True, cache=True)
def cms_update(table, ids, seed, conservative):
    """Hash and insert ``ids`` (int64) one occurrence each; standalone (unfused) path."""
    buf = np.empty(2048, dtype=np.uint64)
    n = ids.shape[0]
    for start in range(0, n, 2048):
        stop = min(start + 2048, n)
        for k in range(start, stop):
            buf[k - start] = mix64(uint64(ids[k]), seed)
        if conservative:
            cms_update_conservative_hashed(table, buf, stop - start)
        else:
            cms_update_hashed(table, buf, stop - start)
