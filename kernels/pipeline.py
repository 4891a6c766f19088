"""The fused per-table update: hash each ID once, then feed every enabled sketch chunk by chunk.

Per chunk of 2048 IDs (it stays in L1): hash every ID; fold every hash into the HyperLogLog
registers; with sampling on, keep one ID in ``k`` (Bernoulli, by seeded geometric skips, so the
skipped IDs cost nothing more); insert the kept IDs into the count-min sketch, recording each one's
estimate; then only the IDs whose estimate exceeds the heavy-hitter threshold probe the heavy-hitter
table (on a skewed stream the tail IDs stop at the gate). Each pass writes its results by position
and a separate loop compacts them, so no load waits on an earlier one. A sketch whose state array
has size 0 is disabled.
"""

import math

import numpy as np
from numba import njit, uint64

from .countmin import cms_increment_many
from .exact import exact_update
from .frequent import hh_count_passing
from .hashing import mix64
from .hll import hll_update_hashed

CHUNK = 2048
_NO_GATE = np.iinfo(np.int64).max
_TWO_M53 = 1.0 / 9007199254740992.0  # 2**-53


@njit(nogil=True, cache=True, inline="always")
def geometric_skip(inv_log_keep, seed, draw):
    """IDs to skip before the next kept one when each is kept with probability ``p``
    (``inv_log_keep = 1 / log(1 - p)``): a geometric draw from the ``draw``-th uniform of the
    seeded counter-based generator."""
    u = (np.float64(mix64(uint64(draw), seed) >> uint64(11)) + 1.0) * _TWO_M53  # (0, 1]
    return np.int64(math.floor(math.log(u) * inv_log_keep))


@njit(nogil=True, cache=True)
def sample_chunk(ids, hashes, m, k, seed, state, out_ids, out_hashes):
    """Copy the kept IDs of a chunk of ``m`` (and their hashes) to ``out_*``, each kept with
    probability ``1 / k``; returns how many.

    ``state`` int64[2] = ``[skip, draws]``: IDs still to skip before the next kept one (-1: draw
    first) and uniforms drawn so far. It carries over from chunk to chunk and batch to batch, so the
    kept positions depend only on the seed and the stream.
    """
    inv_log_keep = 1.0 / math.log1p(-1.0 / k)
    skip = state[0]
    if skip < 0:
        skip = geometric_skip(inv_log_keep, seed, state[1])
        state[1] += 1
    pos = 0
    n = 0
    while skip < m - pos:
        pos += skip
        out_ids[n] = ids[pos]
        out_hashes[n] = hashes[pos]
        n += 1
        pos += 1
        skip = geometric_skip(inv_log_keep, seed, state[1])
        state[1] += 1
    state[0] = skip - (m - pos)
    return n


@njit(nogil=True, cache=True)
def _count_chunk(ids, hashes, m, cms, conservative, hh_keys, hh_counts, hh_errs, hh_meta, seed,
                 est, sel):
    """Count-min insert, gate, heavy hitters for ``m`` IDs with their hashes."""
    if cms.shape[1] > 0:
        cms_increment_many(cms, hashes, m, conservative, est)
    else:
        est[:m] = _NO_GATE
    if hh_counts.shape[0] == 0:
        return
    threshold = hh_meta[1]
    ns = 0
    for k in range(m):
        sel[ns] = k
        ns += est[k] > threshold
    hh_count_passing(hh_keys, hh_counts, hh_errs, hh_meta, ids, hashes, est, sel, ns, seed)


@njit(nogil=True, cache=True)
def update_table(ids, seed, cms, conservative, hh_keys, hh_counts, hh_errs, hh_meta, hll_regs,
                 hll_p, exact_counts, sample_k, sample_seed, sample_state):
    """Count ``ids`` (int64, validated) into the enabled sketches of one table.

    Exact counting (``exact_counts`` non-empty) takes every ID; otherwise every ID reaches the
    HyperLogLog registers and, with ``sample_k > 1``, one in ``sample_k`` reaches the count-min
    sketch and the heavy hitters (``hh_meta[2]`` counts those). Returns the number of IDs that hit a
    saturated exact counter (0 normally).
    """
    n = ids.shape[0]
    if exact_counts.shape[0] > 0:
        return exact_update(exact_counts, ids)
    use_hll = hll_regs.shape[0] > 0
    if hll_regs.shape[0] != (1 << hll_p) and use_hll:
        raise ValueError("HyperLogLog registers must number 2**hll_p")
    sampled = sample_k > 1
    buf = np.empty(CHUNK, dtype=np.uint64)
    kept_ids = np.empty(CHUNK if sampled else 0, dtype=np.int64)
    kept_hashes = np.empty(CHUNK if sampled else 0, dtype=np.uint64)
    est = np.empty(CHUNK, dtype=np.int64)
    sel = np.empty(CHUNK, dtype=np.int64)
    counted = 0
    for start in range(0, n, CHUNK):
        stop = min(start + CHUNK, n)
        m = stop - start
        chunk = ids[start:stop]
        for k in range(m):
            buf[k] = mix64(uint64(chunk[k]), seed)
        if use_hll:
            hll_update_hashed(hll_regs, hll_p, buf, m)
        if sampled:
            m = sample_chunk(chunk, buf, m, sample_k, sample_seed, sample_state, kept_ids,
                             kept_hashes)
            _count_chunk(kept_ids, kept_hashes, m, cms, conservative, hh_keys, hh_counts, hh_errs,
                         hh_meta, seed, est, sel)
        else:
            _count_chunk(chunk, buf, m, cms, conservative, hh_keys, hh_counts, hh_errs, hh_meta,
                         seed, est, sel)
        counted += m
    hh_meta[2] += counted
    return 0

