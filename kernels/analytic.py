"""Analytic (expected-value) traffic of many tables at once (see docs/COST_MODEL.md, analytic mode).

All tables are flattened into concatenated arrays with per-table offsets (``Plan.flat``), and cold
functions are shared as *layouts* (a set of GPUs with row shares), so one call handles thousands of
tables on thousands of GPUs: sequence tables cost O(top rows), only pooled tables pay O(G) each.

Per row ``r`` with access probability ``p``: ``lam = G * B * L * p`` expected lookups per iteration,
spread evenly over the G GPUs; one GPU requests the row ``1 - exp(-lam / G)`` times with
de-duplication, ``lam / G`` without. Pooled tables send one partial sum per (sample, owner) pair.
"""

import numpy as np
from numba import njit, uint64

from .hashing import mix64
from .routing import range_bound, range_slot, weighted_range_slot


@njit(nogil=True, cache=True)
def analytic_traffic(G, M, B, dedup,
                     # plan, per table t: special rows (sorted) with routing codes, layout, sizes
                     sp_off, sp_ids, sp_codes, layout, num_rows, emb_bytes, pooled,
                     # cold layouts l: kind, GPUs and row weights, range bounds, hash seed
                     lay_kind, lay_off, lay_gpus, lay_w, lay_boff, lay_bounds, lay_seed,
                     # summaries, per table t
                     top_off, top_ids, top_p, tail_p, tail_rows, mean_len,
                     # outputs (accumulated)
                     idx_cold, idx_node, emb_cold, emb_node, s_node):
    """Accumulate expected requests per iteration into the outputs; return the global-replica
    gradient bytes (all-reduced over all GPUs).

    idx_cold[G]: requests each other GPU sends to GPU g (cold and placed rows); idx_node[M]: requests
    each other GPU of a node sends to its local GPU m (node replicas); emb_cold[G], emb_node[G]:
    embedding bytes likewise (weighted by D * e); s_node[M]: node-replica gradient bytes.
    """
    T = sp_off.shape[0] - 1
    nl = lay_off.shape[0] - 1
    lay_idx = np.zeros(nl)     # tail requests per layout, spread by row share at the end
    lay_emb = np.zeros(nl)
    emb_node_m = np.zeros(M)
    q_c = np.zeros(G)
    q_n = np.zeros(M)
    inv_g = 1.0 / G
    s_global = 0.0
    for t in range(T):
        a, b = sp_off[t], sp_off[t + 1]
        ta, tb = top_off[t], top_off[t + 1]
        L = mean_len[t]
        lam_scale = G * B * L
        eb = emb_bytes[t]
        pt = tail_p[t]
        lt = layout[t]
        kind = lay_kind[lt]
        if kind == 2:  # data parallel: every touched row is all-reduced
            touched = 0.0
            for k in range(ta, tb):
                touched += -np.expm1(-lam_scale * top_p[k])
            touched += tail_rows[t] * -np.expm1(-lam_scale * pt)
            s_global += touched * eb
            continue
        is_pooled = pooled[t]
        if is_pooled:
            for g in range(G):
                q_c[g] = 0.0
            for m in range(M):
                q_n[m] = 0.0
        p_special = np.full(b - a, -1.0)  # probability of special rows found in the top
        ca, cb = lay_off[lt], lay_off[lt + 1]
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        ncold = uint64(cb - ca)
        seed = uint64(lay_seed[lt])
        H = num_rows[t]
        nsp = b - a
        nbnd = cb - ca
        for k in range(ta, tb):
            r = top_ids[k]
            if r < 0 or r >= H:
                continue
            p = top_p[k]
            if nsp > 0:  # binary search among the special rows (written out: no calls per row)
                lo, hi = a, b
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if sp_ids[mid] < r:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < b and sp_ids[lo] == r:
                    p_special[lo - a] = p
                    continue  # special rows are handled below with their probability
            if kind == 0:
                dst = lay_gpus[ca + np.int64(mix64(uint64(r), seed) % ncold)]
            elif kind == 3:
                # weighted ranges: guess the slot by proportion, check with the recomputed bounds
                j = np.int64(float(r) / float(H) * nbnd)
                if j >= nbnd:
                    j = nbnd - 1
                lo_b = 0 if j == 0 else np.int64(np.floor(bnd[j] * H + 0.5))
                hi_b = H if j + 1 == nbnd else np.int64(np.floor(bnd[j + 1] * H + 0.5))
                if not (lo_b <= r and r < hi_b):
                    j = weighted_range_slot(bnd, H, r)
                dst = lay_gpus[ca + j]
            else:
                dst = lay_gpus[ca + range_slot(bnd, r)]
            lam = lam_scale * p
            rq = -np.expm1(-lam * inv_g) if dedup else lam * inv_g
            idx_cold[dst] += rq
            if is_pooled:
                q_c[dst] += p
            else:
                emb_cold[dst] += rq * eb
        n_special_tail = 0
        for j in range(b - a):
            p = p_special[j]
            if p < 0.0:
                p = pt
                n_special_tail += 1
            code = sp_codes[a + j]
            lam = lam_scale * p
            rq = -np.expm1(-lam * inv_g) if dedup else lam * inv_g
            if code == -1:
                s_global += -np.expm1(-lam) * eb
            elif code <= -2:
                m = -code - 2
                idx_node[m] += rq
                s_node[m] += -np.expm1(-lam) * eb
                if is_pooled:
                    q_n[m] += p
                else:
                    emb_node_m[m] += rq * eb
            else:
                idx_cold[code] += rq
                if is_pooled:
                    q_c[code] += p
                else:
                    emb_cold[code] += rq * eb
        # tail rows: spread over the layout's GPUs by their share of rows
        tr = tail_rows[t] - n_special_tail
        if tr > 0 and pt > 0:
            rq_t = -np.expm1(-lam_scale * pt * inv_g) if dedup else lam_scale * pt * inv_g
            lay_idx[lt] += tr * rq_t
            if is_pooled:
                wsum = 0.0
                for j in range(ca, cb):
                    wsum += lay_w[j]
                if wsum > 0:
                    for j in range(ca, cb):
                        q_c[lay_gpus[j]] += lay_w[j] / wsum * tr * pt
            else:
                lay_emb[lt] += tr * rq_t * eb
        if is_pooled:
            for g in range(G):
                e_c = np.exp(-L * q_c[g])
                emb_cold[g] += B * (1.0 - e_c) * eb
                emb_node[g] += B * (e_c - np.exp(-L * (q_c[g] + q_n[g % M]))) * eb
    for lt in range(nl):
        if lay_idx[lt] == 0.0 and lay_emb[lt] == 0.0:
            continue
        ca, cb = lay_off[lt], lay_off[lt + 1]
        wsum = 0.0
        for j in range(ca, cb):
            wsum += lay_w[j]
        if wsum <= 0:
            continue
        for j in range(ca, cb):
            sh = lay_w[j] / wsum
            idx_cold[lay_gpus[j]] += lay_idx[lt] * sh
            emb_cold[lay_gpus[j]] += lay_emb[lt] * sh
    for g in range(G):
        emb_node[g] += emb_node_m[g % M]
    return s_global


@njit(nogil=True, cache=True)
def cold_row_counts(G, layout, num_rows, row_bytes, lay_kind, lay_off, lay_gpus, lay_boff,
                    lay_bounds, sp_off, sp_ids, out):
    """Add the bytes of every table's range-sharded cold rows to ``out[G]`` (special rows taken
    out); returns False if a table uses a cold kind this kernel does not handle (hash)."""
    ok = True
    for t in range(layout.shape[0]):
        lt = layout[t]
        kind = lay_kind[lt]
        if kind == 2:
            continue
        if kind == 0:
            ok = False
            continue
        H = num_rows[t]
        rb = row_bytes[t]
        ca, cb = lay_off[lt], lay_off[lt + 1]
        n = cb - ca
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        for j in range(n):
            if kind == 3:
                lo = 0 if j == 0 else range_bound(bnd[j], H)
                hi = H if j == n - 1 else range_bound(bnd[j + 1], H)
            else:
                lo = min(np.int64(bnd[j]), H)
                hi = min(np.int64(bnd[j + 1]), H)
                if j == n - 1 and H > np.int64(bnd[n]):
                    hi += H - np.int64(bnd[n])
            out[lay_gpus[ca + j]] += (hi - lo) * rb
        for k in range(sp_off[t], sp_off[t + 1]):
            r = sp_ids[k]
            if kind == 3:
                j = weighted_range_slot(bnd, H, r)
            else:
                j = range_slot(bnd, r)
            out[lay_gpus[ca + j]] -= rb
    return ok
