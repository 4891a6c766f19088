"""Seeded 64-bit hashing of row IDs.

``mix64`` is MurmurHash3's 64-bit finalizer (fmix64) applied to ``id + seed * golden``: a bijection on
64-bit words with full avalanche, so sequential row IDs (0, 1, 2, ...) spread as well as random ones.
All sketches of one table derive their indices from this one hash (computed once per ID).
"""

import numpy as np
from numba import njit, uint64

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


@njit(nogil=True, cache=True, inline="always")
def mix64(x, seed):
    """fmix64(x + seed * golden) for one uint64 (the seeded, sequential-safe row hash)."""
    h = uint64(x) + uint64(seed) * uint64(0x9E3779B97F4A7C15)
    h ^= h >> uint64(33)
    h *= uint64(0xFF51AFD7ED558CCD)
    h ^= h >> uint64(33)
    h *= uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> uint64(33)
    return h


@njit(nogil=True, cache=True)
def hash_ids(ids, seed, out):
    """Hash ``ids`` (int64) into ``out`` (uint64, same length)."""
    for i in range(ids.shape[0]):
        out[i] = mix64(uint64(ids[i]), seed)
    return out
