"""HyperLogLog registers (Flajolet et al. 2007) updated from the shared 64-bit row hash.

``regs`` is ``uint8[2**p]``. Register index: the low ``p`` bits of the hash; value: one plus the number
of leading zeros of the remaining ``64 - p`` bits (at most ``65 - p``). The estimate (Ertl's improved
estimator, no empirical bias tables) is computed in Python from the register histogram.
"""

from numba import int64, njit, uint8, uint64
from numba.cpython.unsafe.numbers import leading_zeros


@njit(nogil=True, cache=True, inline="always")
def hll_add(regs, p, h):
    """Fold one hash into ``regs`` (max per register); integer arithmetic throughout."""
    j = h & uint64((1 << p) - 1)
    w = h >> uint64(p)
    r = int64(65 - p) if w == 0 else int64(leading_zeros(w)) - p + 1
    if int64(regs[j]) < r:
        regs[j] = uint8(r)


@njit(nogil=True, cache=True)
def hll_update_hashed(regs, p, hashes, n):
    """Fold the first ``n`` hashes into ``regs`` (max per register)."""
    for k in range(n):
        hll_add(regs, p, hashes[k])
