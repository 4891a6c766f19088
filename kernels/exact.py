"""Exact dense counting: one saturating ``uint32`` counter per row of a table with known size."""

from numba import njit, uint32


@njit(nogil=True, cache=True)
def exact_update(counts, ids):
    """``counts[id] += 1`` for each ID, saturating at 2**32 - 1; returns the number saturated.

    IDs must already be validated to lie in ``[0, counts.size)``.
    """
    sat = 0
    for k in range(ids.shape[0]):
        i = ids[k]
        c = counts[i]
        if c != uint32(0xFFFFFFFF):
            counts[i] = c + uint32(1)
        else:
            sat += 1
    return sat
