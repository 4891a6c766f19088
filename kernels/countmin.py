"""Count-min sketch kernels (Cormode & Muthukrishnan 2005) over a ``uint32[depth, width]`` table.

Width is a power of two. Row ``i`` of an ID with hash ``h`` uses column
``(lo32(h) + i * (hi32(h) | 1)) & (width - 1)`` (Kirsch-Mitzenmacher double hashing from one 64-bit
hash). Counters saturate at 2**32 - 1 instead of wrapping: a saturated counter only ever
overestimates, so the never-underestimate guarantee survives; callers report saturation.

The hot kernels address the table as one flat row-major array with unsigned indices (Numba emits no
negative-index wrap-around code for them) and unroll the row loop up to :data:`UNROLL` rows (the
default depth is 4); deeper tables finish in a plain loop.
"""

import numpy as np
from numba import njit, uint32, uint64

from .hashing import mix64

U32_MAX = np.uint32(0xFFFFFFFF)
#: Rows handled by the unrolled loop; rows beyond it take a plain loop.
UNROLL = 8


@njit(nogil=True, cache=True, inline="always")
def _col(h, i, mask):
    return ((h & uint64(0xFFFFFFFF)) + uint64(i) * ((h >> uint64(32)) | uint64(1))) & mask


@njit(nogil=True, cache=True, inline="always")
def cms_cell(h, i, width, mask):
    """Flat index (uint64) of row ``i``'s counter for hash ``h`` in a ``[depth, width]`` table."""
    return uint64(i) * uint64(width) + _col(h, i, mask)


@njit(nogil=True, cache=True, inline="always")
def _bump(flat, j):
    c = flat[j]
    c2 = c + uint32(c != uint32(0xFFFFFFFF))
    flat[j] = c2
    return c2


@njit(nogil=True, cache=True, inline="always")
def cms_increment(flat, width, depth, h):
    """Plain (linear) update of one ID: +1 in every row, saturating; returns the new estimate
    (the minimum over rows, which never falls below the ID's true count)."""
    mask = uint64(width - 1)
    e = uint32(0xFFFFFFFF)
    for i in range(UNROLL):
        if i < depth:
            e = min(e, _bump(flat, cms_cell(h, i, width, mask)))
    for i in range(UNROLL, depth):
        e = min(e, _bump(flat, cms_cell(h, i, width, mask)))
    return e


@njit(nogil=True, cache=True, inline="always")
def cms_increment_conservative(flat, width, depth, h):
    """Conservative update of one ID (Estan & Varghese 2002): raise only the counters below the new
    minimum; returns that minimum. Still never underestimates; no longer linear."""
    mask = uint64(width - 1)
    m = uint32(0xFFFFFFFF)
    for i in range(depth):
        m = min(m, flat[cms_cell(h, i, width, mask)])
    if m == uint32(0xFFFFFFFF):
        return m
    m1 = m + uint32(1)
    for i in range(depth):
        j = cms_cell(h, i, width, mask)
        if flat[j] < m1:
            flat[j] = m1
    return m1


@njit(nogil=True, cache=True)
def cms_increment_many(table, hashes, n, conservative, est):
    """Insert the first ``n`` hashes one occurrence each; ``est[k]`` gets each ID's estimate right
    after its own update (int64)."""
    depth, width = table.shape
    flat = table.reshape(depth * width)
    if conservative:
        for k in range(n):
            est[k] = cms_increment_conservative(flat, width, depth, hashes[k])
    else:
        for k in range(n):
            est[k] = cms_increment(flat, width, depth, hashes[k])


@njit(nogil=True, cache=True)
def cms_query(table, ids, seed, out):
    """Point estimates (minimum over rows) for ``ids`` into ``out`` (uint64)."""
    depth, width = table.shape
    mask = uint64(width - 1)
    for k in range(ids.shape[0]):
        h = mix64(uint64(ids[k]), seed)
        m = uint32(0xFFFFFFFF)
        for i in range(depth):
            m = min(m, table[i, _col(h, i, mask)])
        out[k] = m
    return out


@njit(nogil=True, cache=True)
def cms_update(table, ids, seed, conservative):
    """Hash and insert ``ids`` (int64) one occurrence each; the standalone (unfused) path."""
    buf = np.empty(2048, dtype=np.uint64)
    est = np.empty(2048, dtype=np.int64)
    n = ids.shape[0]
    for start in range(0, n, 2048):
        stop = min(start + 2048, n)
        for k in range(start, stop):
            buf[k - start] = mix64(uint64(ids[k]), seed)
        cms_increment_many(table, buf, stop - start, conservative, est)


@njit(nogil=True, cache=True)
def cms_add_counts(table, keys, counts, seed, conservative):
    """Add ``counts[j]`` occurrences of row ``keys[j]`` for every ``j`` with ``counts[j] > 0``:
    plain, ``+count`` in every row (saturating; the sketch then equals the one of the stream those
    occurrences came from, in any order); conservative, every counter of the row raised to at least
    its minimum plus the count (an upper bound still, as the one-at-a-time update keeps)."""
    depth, width = table.shape
    if width == 0:
        return
    flat = table.reshape(depth * width)
    mask = uint64(width - 1)
    for j in range(keys.shape[0]):
        c = counts[j]
        if c <= 0:
            continue
        h = mix64(uint64(keys[j]), seed)
        if conservative:
            m = uint64(0xFFFFFFFF)
            for i in range(depth):
                m = min(m, uint64(flat[cms_cell(h, i, width, mask)]))
            target = uint32(min(m + uint64(c), uint64(0xFFFFFFFF)))
            for i in range(depth):
                k = cms_cell(h, i, width, mask)
                if flat[k] < target:
                    flat[k] = target
        else:
            for i in range(depth):
                k = cms_cell(h, i, width, mask)
                flat[k] = uint32(min(uint64(flat[k]) + uint64(c), uint64(0xFFFFFFFF)))
