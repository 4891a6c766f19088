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


# ----------------------------------------------------------------------------- host-tier hash
#: Seed of the host-memory-tier hash: a cold row ``r`` of a table with a host tier sits in HBM iff
#: ``host_u(r) < hbm_fraction[owner]`` (docs/COST_MODEL.md, "Host memory tier").
HOST_SEED = np.uint64(0x6A09E667F3BCC909)
_TWO_M53 = 1.0 / 9007199254740992.0  # 2**-53


@njit(nogil=True, cache=True, inline="always")
def host_u(r):
    """``u(r) = (mix64(r, HOST_SEED) >> 11) * 2**-53``: a fixed uniform in ``[0, 1)`` per row ID
    (53 bits, exact in float64)."""
    return np.float64(mix64(uint64(r), uint64(0x6A09E667F3BCC909)) >> uint64(11)) * _TWO_M53


def mix64_np(x, seed) -> np.ndarray:
    """:func:`mix64` on an array of IDs (numpy, wrapping uint64 arithmetic), bit for bit."""
    offset = np.uint64((int(seed) * int(GOLDEN)) & 0xFFFFFFFFFFFFFFFF)
    h = np.atleast_1d(np.asarray(x).astype(np.uint64))
    h = h + offset
    h ^= h >> _S33
    h *= _C1
    h ^= h >> _S33
    h *= _C2
    h ^= h >> _S33
    return h


def host_u_np(ids) -> np.ndarray:
    """:func:`host_u` of every ID (numpy twin of the Numba function, bit for bit): float64 array
    of the shape of ``ids``."""
    a = np.asarray(ids)
    if a.dtype.kind not in "iu":
        a = a.astype(np.int64)
    h = mix64_np(a.ravel(), HOST_SEED)
    return ((h >> np.uint64(11)).astype(np.float64) * _TWO_M53).reshape(a.shape)
