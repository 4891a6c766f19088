"""The fused per-table update: hash each ID once, then feed every enabled sketch chunk by chunk.

A chunk of 2048 hashes stays in L1 while the count-min, heavy-hitter and HyperLogLog loops run over
it. A sketch whose state array has size 0 is disabled.
"""

import numpy as np
from numba import njit, uint64

from .countmin import cms_update_conservative_hashed, cms_update_hashed
from .exact import exact_update
from .frequent import mg_update_hashed
from .hashing import mix64
from .hll import hll_update_hashed

CHUNK = 2048


@njit(nogil=True, cache=True)
def update_table(ids, seed, cms, conservative, mg_keys, mg_vals, mg_meta, hll_regs, hll_p,
                 exact_counts):
    """Count ``ids`` (int64, validated) into the enabled sketches of one table.

    Returns the number of IDs that hit a saturated exact counter (0 normally).
    """
    n = ids.shape[0]
    sat = 0
    if exact_counts.shape[0] > 0:
        sat = exact_update(exact_counts, ids)
    use_cms = cms.shape[1] > 0
    use_mg = mg_vals.shape[0] > 0
    use_hll = hll_regs.shape[0] > 0
    if not (use_cms or use_mg or use_hll):
        return sat
    buf = np.empty(CHUNK, dtype=np.uint64)
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        m = stop - start
        for k in range(m):
            buf[k] = mix64(uint64(ids[start + k]), seed)
        if use_cms:
            if conservative:
                cms_update_conservative_hashed(cms, buf, m)
            else:
                cms_update_hashed(cms, buf, m)
        if use_mg:
            mg_update_hashed(mg_keys, mg_vals, mg_meta, ids[start:stop], buf, m, seed)
        if use_hll:
            hll_update_hashed(hll_regs, hll_p, buf, m)
    return sat


@njit(nogil=True, cache=True)
def segment_min_max(values, offsets, out_min, out_max):
    """Per-segment min and max of ``values`` split at ``offsets`` (len = segments + 1).

    Empty segments get min = 0 and max = -1.
    """
    for s in range(offsets.shape[0] - 1):
        a, b = offsets[s], offsets[s + 1]
        if a == b:
            out_min[s] = 0
            out_max[s] = -1
            continue
        lo = values[a]
        hi = values[a]
        for k in range(a + 1, b):
            v = values[k]
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        out_min[s] = lo
        out_max[s] = hi
