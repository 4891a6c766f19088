"""Analytic (expected-value) traffic of many tables at once (see docs/COST_MODEL.md, analytic mode).

All tables are flattened into concatenated arrays with per-table offsets, so one call handles
thousands of tables on thousands of GPUs without a Python loop per table.

Per row ``r`` with access probability ``p``: ``lam = lam_scale[t] * p`` expected lookups per iteration,
spread evenly over the G GPUs; one GPU requests the row ``1 - exp(-lam / G)`` times with
de-duplication, ``lam / G`` without. Pooled tables send one partial sum per (sample, owner) pair.
"""

import numpy as np
from numba import njit, uint64

from .hashing import mix64
from .routing import range_slot


@njit(nogil=True, cache=True, inline="always")
def _req(lam, G, dedup):
    if dedup:
        return -np.expm1(-lam / G)
    return lam / G


@njit(nogil=True, cache=True)
def analytic_traffic(G, M, B, dedup,
                     # plan, per table t: special rows (sorted) with routing codes
                     sp_off, sp_ids, sp_codes,
                     cold_kind, cold_off, cold_gpus, cold_w, bnd_off, bounds, seeds,
                     num_rows, emb_bytes, pooled,
                     # summaries, per table t
                     top_off, top_ids, top_p, tail_p, tail_rows, mean_len,
                     # outputs (accumulated)
                     idx_cold, idx_node, emb_cold, emb_node, s_node):
    """Accumulate expected requests per iteration into the outputs; return the global-replica
    gradient bytes (all-reduced over all GPUs).

    idx_cold[G]: requests each other GPU sends to GPU g (cold and placed rows); idx_node[M]: requests
    each other GPU of a node sends to its local GPU m (node replicas); emb_cold[G], emb_node[G]:
    embedding bytes likewise (already weighted by D * e); s_node[M]: node-replica gradient bytes.
    """
    T = sp_off.shape[0] - 1
    idx_c = np.zeros(G)
    q_c = np.zeros(G)
    idx_n = np.zeros(M)
    q_n = np.zeros(M)
    s_global = 0.0
    for t in range(T):
        a, b = sp_off[t], sp_off[t + 1]
        ta, tb = top_off[t], top_off[t + 1]
        L = mean_len[t]
        lam_scale = G * B * L
        eb = emb_bytes[t]
        pt = tail_p[t]
        if cold_kind[t] == 2:  # data parallel: every touched row is all-reduced
            touched = 0.0
            for k in range(ta, tb):
                touched += -np.expm1(-lam_scale * top_p[k])
            touched += tail_rows[t] * -np.expm1(-lam_scale * pt)
            s_global += touched * eb
            continue
        for g in range(G):
            idx_c[g] = 0.0
            q_c[g] = 0.0
        for m in range(M):
            idx_n[m] = 0.0
            q_n[m] = 0.0
        p_special = np.full(b - a, -1.0)  # probability of special rows found in the top
        special = sp_ids[a:b]
        ca, cb = cold_off[t], cold_off[t + 1]
        bnd = bounds[bnd_off[t]:bnd_off[t + 1]]
        ncold = uint64(cb - ca)
        seed = uint64(seeds[t])
        inv_g = 1.0 / G
        for k in range(ta, tb):
            r = top_ids[k]
            if r < 0 or r >= num_rows[t]:
                continue
            p = top_p[k]
            if b > a:
                j = np.searchsorted(special, r)
                if j < b - a and special[j] == r:
                    p_special[j] = p
                    continue  # special rows are handled below with their probability
            # cold function (src-independent for hash and range)
            if cold_kind[t] == 0:
                dst = cold_gpus[ca + np.int64(mix64(uint64(r), seed) % ncold)]
            else:
                dst = cold_gpus[ca + range_slot(bnd, r)]
            lam = lam_scale * p
            idx_c[dst] += -np.expm1(-lam * inv_g) if dedup else lam * inv_g
            q_c[dst] += p
        n_special_tail = 0
        for j in range(b - a):
            p = p_special[j]
            if p < 0.0:
                p = pt
                n_special_tail += 1
            code = sp_codes[a + j]
            lam = lam_scale * p
            if code == -1:
                s_global += -np.expm1(-lam) * eb
            elif code <= -2:
                m = -code - 2
                idx_n[m] += _req(lam, G, dedup)
                q_n[m] += p
                s_node[m] += -np.expm1(-lam) * eb
            else:
                idx_c[code] += _req(lam, G, dedup)
                q_c[code] += p
        # tail rows spread over the cold GPUs by their share of rows
        tr = tail_rows[t] - n_special_tail
        if tr > 0 and pt > 0:
            wsum = 0.0
            for j in range(ca, cb):
                wsum += cold_w[j]
            if wsum > 0:
                rq = _req(lam_scale * pt, G, dedup)
                for j in range(ca, cb):
                    sh = cold_w[j] / wsum * tr
                    idx_c[cold_gpus[j]] += sh * rq
                    q_c[cold_gpus[j]] += sh * pt
        for g in range(G):
            idx_cold[g] += idx_c[g]
        for m in range(M):
            idx_node[m] += idx_n[m]
        if pooled[t]:
            for g in range(G):
                e_c = np.exp(-L * q_c[g])
                emb_cold[g] += B * (1.0 - e_c) * eb
                emb_node[g] += B * (e_c - np.exp(-L * (q_c[g] + q_n[g % M]))) * eb
        else:
            for g in range(G):
                emb_cold[g] += idx_c[g] * eb
                emb_node[g] += idx_n[g % M] * eb
    return s_global
