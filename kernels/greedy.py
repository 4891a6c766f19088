"""The planner's greedy move sequence in one Numba call.

Called by ``flexshard_stream/placement/candidates.py: move_sequence``.

Per table ``t`` the cumulative curves over its top rows in decreasing probability are concatenated:
``R`` (expected requests per source GPU), ``U`` (expected distinct rows touched, all-reduce) and ``P``
(probability mass), each ``k_t + 1`` long at ``off[t]``; ``req`` (requests of each single row) is
``k_t`` long at ``off[t] - t``. A move extends a table's node tier, or moves its global boundary
deeper; moves are scored on the load-aware proxy (balanced per-GPU bytes by link class, the busiest
GPU at least the load of the hottest row it serves, aggregated over tables by a p-norm) and taken
lazily best-first from a heap while they lower the proxy's time.
"""

import heapq
import math

import numpy as np
from numba import njit

# table columns of ``tab`` (float64[T, 10])
_RTOT, _TAIL1, _PTOT, _K, _L, _B, _POOLED, _EB, _RB, _ROWS = range(10)


@njit(nogil=True, cache=True)
def _terms(t, k0, k1, R, U, P, req, off, tab, G, M, ib, out):
    """Fill ``out[11]``: per-GPU sums (idx_intra, idx_inter, emb_intra, emb_inter, s0, s1, rows)
    then the hottest single-row loads (cold_idx, cold_emb, node_idx, node_emb)."""
    o = off[t]
    k = np.int64(tab[t, _K])
    cold_req = tab[t, _RTOT] - R[o + k0 + k1]
    node_req = R[o + k0 + k1] - R[o + k0]
    idx_intra = (cold_req * (M - 1) / G + node_req * (M - 1) / M) * ib
    idx_inter = cold_req * (G - M) / G * ib
    eb = tab[t, _EB]
    if tab[t, _POOLED] > 0:
        qc = max(0.0, tab[t, _PTOT] - P[o + k0 + k1])
        qn = P[o + k0 + k1] - P[o + k0]
        L = tab[t, _L]
        Bs = tab[t, _B]
        emb_inter = (G - M) * Bs * -math.expm1(-L * qc / G) * eb
        emb_intra = (M - 1) * Bs * -math.expm1(-L * (qc / G + qn / M)) * eb
    else:
        emb_intra = idx_intra / ib * eb
        emb_inter = idx_inter / ib * eb
    rb = tab[t, _RB]
    out[0] = idx_intra
    out[1] = idx_inter
    out[2] = emb_intra
    out[3] = emb_inter
    out[4] = U[o + k0] * eb
    out[5] = (U[o + k0 + k1] - U[o + k0]) * eb
    out[6] = (k0 + k1 / M) * rb + (tab[t, _ROWS] - k0 - k1) * rb / G
    ro = o - t
    hc = req[ro + k0 + k1] if k0 + k1 < k else tab[t, _TAIL1]
    hn = req[ro + k0] if k1 > 0 else 0.0
    out[7] = hc * ib
    out[8] = hc * eb
    out[9] = hn * ib
    out[10] = hn * eb


@njit(nogil=True, cache=True)
def _time(a, hs, scale, P, G, M, bi, be, s0_i, s0_e, s1_e):
    """The proxy's iteration time for summed terms ``a`` and p-norm sums ``hs`` of hot loads."""
    h0 = scale[0] * max(hs[0], 0.0) ** (1.0 / P)
    h1 = scale[1] * max(hs[1], 0.0) ** (1.0 / P)
    h2 = scale[2] * max(hs[2], 0.0) ** (1.0 / P)
    h3 = scale[3] * max(hs[3], 0.0) ** (1.0 / P)
    t = 0.0
    # index phase (hot cold-row load h0, hot node-replica load h2), then embeddings both ways
    recv_e = max(a[1], (G - M) * h0)
    recv_i = max(a[0], (M - 1) * max(h0, h2))
    t += max(recv_i / bi, recv_e / be)
    recv_e = max(a[3], (G - M) * h1)
    recv_i = max(a[2], (M - 1) * max(h1, h3))
    t += 2.0 * max(recv_i / bi, recv_e / be)
    return t + a[4] * (s0_i / bi + s0_e / be) + a[5] * s1_e / be


@njit(nogil=True, cache=True)
def _memory(a, M):
    return a[6] + 2 * (a[0] + a[1] + a[2] + a[3]) + a[4] + a[5] / M


@njit(nogil=True, cache=True)
def _candidates(t, k0, k1, k, step):
    """Up to two candidate tier sizes: (n0, n1) pairs, -1 when absent."""
    a0 = a1 = b0 = b1 = -1
    if k0 + k1 < k:                       # extend node replicas from the cold tier
        b = min(step, max(1, k0 + k1))
        a0, a1 = k0, min(k - k0, k1 + b)
    if k0 < k:                            # move the global boundary down
        n0 = min(k, k0 + min(step, max(1, k0)))
        b0, b1 = n0, max(0, k0 + k1 - n0)
    return a0, a1, b0, b1


@njit(nogil=True, cache=True)
def _score(t, n0, n1, nt, a, hs, agg, terms, hsum, scale, cur_time, cur_mem, R, U, P, req, off,
           tab, G, M, ib, bi, be, s0_i, s0_e, s1_e, p_norm):
    """Score moving table ``t`` to tiers (n0, n1): fills ``nt`` (its new terms), ``a`` and ``hs``
    (the new sums); returns (pays, class, value): class 0 for moves that save time and memory
    (value: time change), 1 otherwise (value: time change per byte of memory)."""
    _terms(t, n0, n1, R, U, P, req, off, tab, G, M, ib, nt)
    for i in range(7):
        a[i] = agg[i] - terms[t, i] + nt[i]
    for j in range(4):
        hs[j] = hsum[j] - (terms[t, 7 + j] / scale[j]) ** p_norm + (nt[7 + j] / scale[j]) ** p_norm
    dt = _time(a, hs, scale, p_norm, G, M, bi, be, s0_i, s0_e, s1_e) - cur_time
    if dt >= -1e-12 * cur_time:
        return False, 0.0, 0.0
    dm = _memory(a, M) - cur_mem
    if dm <= 0:
        return True, 0.0, dt
    return True, 1.0, dt / dm


@njit(nogil=True, cache=True)
def greedy_moves(R, U, P, req, off, tab, step, G, M, ib, bi, be, s0_i, s0_e, s1_e, p_norm,
                 max_steps, out):
    """Write the move sequence into ``out`` (int64[max_steps, 3]: table, k0, k1 after the move);
    returns the number of moves."""
    T = tab.shape[0]
    terms = np.zeros((T, 11))
    agg = np.zeros(7)
    for t in range(T):
        _terms(t, 0, 0, R, U, P, req, off, tab, G, M, ib, terms[t])
        for i in range(7):
            agg[i] += terms[t, i]
    scale = np.full(4, 1e-300)
    for t in range(T):
        scale[0] = max(scale[0], terms[t, 7])
        scale[1] = max(scale[1], terms[t, 8])
    scale[2] = scale[0]
    scale[3] = scale[1]
    hsum = np.zeros(4)
    for t in range(T):
        for j in range(4):
            hsum[j] += (terms[t, 7 + j] / scale[j]) ** p_norm
    cur_time = _time(agg, hsum, scale, p_norm, G, M, bi, be, s0_i, s0_e, s1_e)
    cur_mem = _memory(agg, M)
    k0s = np.zeros(T, np.int64)
    k1s = np.zeros(T, np.int64)
    nt = np.zeros(11)
    a = np.zeros(7)
    hs = np.zeros(4)
    heap = [(0.0, 0.0, np.int64(0), np.int64(0), np.int64(0), np.int64(0))]
    heap.pop()
    seq = np.int64(0)
    n_out = 0
    while n_out < max_steps:
        if len(heap) == 0:
            # score every table's candidates: a table whose moves did not pay earlier may pay now
            # (the busiest GPU's load moved to its rows when other tables promoted theirs)
            for t in range(T):
                c = _candidates(t, k0s[t], k1s[t], np.int64(tab[t, _K]), step[t])
                for q in range(2):
                    n0, n1 = c[2 * q], c[2 * q + 1]
                    if n0 < 0:
                        continue
                    ok, c0, c1 = _score(t, n0, n1, nt, a, hs, agg, terms, hsum, scale, cur_time,
                                        cur_mem, R, U, P, req, off, tab, G, M, ib, bi, be,
                                        s0_i, s0_e, s1_e, p_norm)
                    if ok:
                        heapq.heappush(heap, (c0, c1, seq, np.int64(t), n0, n1))
                        seq += 1
            if len(heap) == 0:
                break
        k0c, k1c, _, t, n0, n1 = heapq.heappop(heap)
        c = _candidates(t, k0s[t], k1s[t], np.int64(tab[t, _K]), step[t])
        if not ((c[0] == n0 and c[1] == n1) or (c[2] == n0 and c[3] == n1)):
            continue  # stale: the table moved since this candidate was scored
        ok, c0, c1 = _score(t, n0, n1, nt, a, hs, agg, terms, hsum, scale, cur_time, cur_mem,
                            R, U, P, req, off, tab, G, M, ib, bi, be, s0_i, s0_e, s1_e, p_norm)
        if not ok:
            continue
        if len(heap) > 0:
            h0, h1 = heap[0][0], heap[0][1]
            worse = c0 > h0 or (c0 == h0 and c1 > h1)
            if worse and not (c0 == k0c and c1 == k1c):
                heapq.heappush(heap, (c0, c1, seq, t, n0, n1))  # re-scored: not the best now
                seq += 1
                continue
        for i in range(11):
            terms[t, i] = nt[i]
        for i in range(7):
            agg[i] = a[i]
        for j in range(4):
            hsum[j] = hs[j]
        k0s[t] = n0
        k1s[t] = n1
        cur_time = _time(agg, hsum, scale, p_norm, G, M, bi, be, s0_i, s0_e, s1_e)
        cur_mem = _memory(agg, M)
        out[n_out, 0] = t
        out[n_out, 1] = n0
        out[n_out, 2] = n1
        n_out += 1
        c = _candidates(t, n0, n1, np.int64(tab[t, _K]), step[t])
        for q in range(2):
            m0, m1 = c[2 * q], c[2 * q + 1]
            if m0 < 0:
                continue
            ok, c0, c1 = _score(t, m0, m1, nt, a, hs, agg, terms, hsum, scale, cur_time,
                                cur_mem, R, U, P, req, off, tab, G, M, ib, bi, be, s0_i, s0_e,
                                s1_e, p_norm)
            if ok:
                heapq.heappush(heap, (c0, c1, seq, t, m0, m1))
                seq += 1
    return n_out
