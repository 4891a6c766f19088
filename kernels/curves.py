"""Running sums of many tables' benefit curves in one Numba call.

Called by ``flexshard_stream/placement/candidates.py: benefit_curves``: the per-row values of every
table are concatenated (table ``t``'s ``k_t`` rows at ``off[t]``), their running sums laid out as
``kernels/greedy.py`` reads them (``k_t + 1`` values at ``off[t] + t``, a 0 first). The sums are
sequential, in row order, as ``np.cumsum`` adds (bit for bit).
"""

from numba import njit


@njit(nogil=True, cache=True)
def segment_running_sums(x, off, out):
    """Into ``out`` (float64[n + T]): for each table ``t`` of the ``T = off.size - 1`` segments
    ``x[off[t]:off[t + 1]]``, 0 then its running sums, at ``out[off[t] + t:off[t + 1] + t + 1]``."""
    for t in range(off.shape[0] - 1):
        o = off[t] + t
        acc = 0.0
        out[o] = 0.0
        for i in range(off[t], off[t + 1]):
            acc += x[i]
            o += 1
            out[o] = acc
