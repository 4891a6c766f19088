"""HyperLogLog registers (Flajolet et al. 2007) updated from the shared 64-bit row hash.

``regs`` is ``uint8[2**p]``. Register index: the low ``p`` bits of the hash; value: one plus the number
of leading zeros of the remaining ``64 - p`` bits (at most ``65 - p``). The estimate (Ertl's improved
estimator, no empirical bias tables) is computed in Python from the register histogram.
"""

from numba import njit, uint64, uint8
from numba.cpython.unsafe.numbers import leading_zeros


@njit(nogil=True, cache=True)
def hll_update_hashed(regs, p, hashes, n):
    """Fold the first ``n`` hashes into ``regs`` (max per register)."""
    mask = uint64((1 << p) - 1)
    q = 64 - p
    for k in range(n):
        h = hashes[k]
        j = h & mask
        w = h >> uint64(p)
        if w == 0:
            r = q + 1
        else:
            r = leading_zeros(w) - p + 1
        if regs[j] < r:
            regs[j] = uint8(r)
