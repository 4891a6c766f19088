"""Trace-mode traffic counting for one table over one iteration (see docs/COST_MODEL.md).

Samples ``0 .. G*B-1`` of the iteration sit on GPU ``sample // B``. For every lookup the owner is
routed (kernels/routing); a lookup whose owner is another GPU is counted in ``cnt_idx[src, dst]``
(index exchange) and, for sequence tables, in ``cnt_emb[src, dst]`` (one embedding row each way).
With de-duplication a (src, row) pair counts once per iteration. Pooled tables count one partial sum
per (sample, owner GPU) pair in ``cnt_emb`` instead of rows. Replica rows touched by any GPU are
counted once per iteration for the gradient all-reduce.
"""

import numpy as np
from numba import njit, uint64

from .hashing import mix64
from .routing import cold_owner, map_find, resolve

_PAIR_SEED = np.uint64(0x3C6EF372FE94F82B)


@njit(nogil=True, cache=True, inline="always")
def _set_insert(set_keys, set_srcs, set_stamp, stamp, shift, mask, key, src):
    """Insert (key, src) into the stamped hash set; True if it was not there."""
    h = mix64(uint64(key) ^ (uint64(src) * uint64(0x9E3779B97F4A7C15)), _PAIR_SEED)
    i = np.int64(h >> shift) & mask
    while set_stamp[i] == stamp:
        if set_keys[i] == key and set_srcs[i] == src:
            return False
        i = (i + 1) & mask
    set_stamp[i] = stamp
    set_keys[i] = key
    set_srcs[i] = src
    return True


@njit(nogil=True, cache=True)
def table_traffic(ids, lengths, B, M, keys, vals, used, lg, cold_kind, gpus, bounds, seed,
                  dedup, pooled, set_keys, set_srcs, set_stamp, stamp, touch_stamp, marks,
                  cnt_idx, cnt_emb, touched_node):
    """Accumulate one iteration of one table into ``cnt_idx`` / ``cnt_emb`` (int64[G, G]).

    ``set_*`` is a scratch hash set (power-of-two size >= 2 * len(ids)) reused across calls via
    ``stamp`` (unique per call); ``touch_stamp`` (aligned with the routing map) marks replica rows
    already counted for the all-reduce; ``marks`` (int64[G], initialised to -1) is pooled scratch.
    Returns the number of distinct global-replica rows touched; ``touched_node[m]`` gets the
    distinct node-replica rows on local GPU ``m`` touched.
    """
    set_mask = set_keys.shape[0] - 1
    set_shift = uint64(0)
    s_lg = 0
    while (1 << s_lg) < set_keys.shape[0]:
        s_lg += 1
    if s_lg > 0:
        set_shift = uint64(64 - s_lg)
    touched_global = 0
    pos = 0
    for s in range(lengths.shape[0]):
        src = s // B
        n = lengths[s]
        for k in range(pos, pos + n):
            key = ids[k]
            slot = map_find(keys, vals, used, lg, key)
            if slot >= 0:
                code = vals[slot]
                dst = resolve(code, src, M)
                if code < 0 and touch_stamp[slot] != stamp:
                    touch_stamp[slot] = stamp
                    if code == -1:
                        touched_global += 1
                    else:
                        touched_node[-code - 2] += 1
            elif cold_kind == 2:  # data parallel: every row is a global replica
                if _set_insert(set_keys, set_srcs, set_stamp, stamp, set_shift, set_mask, key, -1):
                    touched_global += 1
                continue
            else:
                dst = cold_owner(key, src, cold_kind, gpus, bounds, seed)
            if dst == src:
                continue
            new = True
            if dedup:
                new = _set_insert(set_keys, set_srcs, set_stamp, stamp, set_shift, set_mask, key,
                                  src)
            if new:
                cnt_idx[src, dst] += 1
                if not pooled:
                    cnt_emb[src, dst] += 1
            if pooled and marks[dst] != s:
                marks[dst] = s
                cnt_emb[src, dst] += 1
        pos += n
    return touched_global
