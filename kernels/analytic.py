"""Analytic (expected-value) traffic of many tables at once (see docs/COST_MODEL.md, analytic mode).

All tables are flattened into concatenated arrays with per-table offsets (``Plan.flat``), and cold
functions are shared as *layouts* (a set of GPUs with row shares), so one call handles thousands of
tables on thousands of GPUs: sequence tables cost O(top rows), only pooled tables pay O(G) each.

Per row ``r`` with access probability ``p``: ``lam = G * B * L * p`` expected lookups per iteration,
spread evenly over the G GPUs; one GPU requests the row ``1 - exp(-lam / G)`` times with
de-duplication, ``lam / G`` without. Pooled tables send one partial sum per (sample, owner) pair.

Host memory tier (tables with an ``hbm_fraction``, flattened as ``hf_off`` / ``hf``): a cold row
``r`` owned by GPU ``g`` is in host memory iff ``host_u(r) >= f[g]``. Explicit top rows are tested
one by one; the tail rows a cold GPU holds are in host memory with probability ``1 - f[g]``. Every
GPU, the owner included, requests a row as above, so a host row costs ``G`` times one GPU's
requests in host lookups at its owner.
"""

from collections import namedtuple

import numpy as np
from numba import njit, uint64

from .hashing import host_u, mix64
from .routing import range_bound, range_slot, weighted_range_slot

#: The plan side of :func:`analytic_traffic` (``Plan.flat``'s arrays of the same names), per table
#: ``t``: special rows sorted by ID with their routing codes (``sp_ids[sp_off[t]:sp_off[t + 1]]``,
#: ``sp_codes``: -1 global replica, ``-2 - m`` node replica on local GPU ``m``, else the owner
#: GPU), the cold layout ``layout[t]``, rows, embedding bytes ``D e``, pooled; per cold layout
#: ``l``: its kind (0 hash, 1 explicit ranges, 2 replicated, 3 weighted ranges, 4 column shards),
#: GPUs and row weights (``lay_gpus[lay_off[l]:lay_off[l + 1]]``, ``lay_w``), range bounds
#: (``lay_bounds[lay_boff[l]:lay_boff[l + 1]]``) and hash seed.
AnalyticPlan = namedtuple("AnalyticPlan", [
    "sp_off", "sp_ids", "sp_codes", "layout", "num_rows", "emb_bytes", "pooled",
    "lay_kind", "lay_off", "lay_gpus", "lay_w", "lay_boff", "lay_bounds", "lay_seed"])
#: The summaries, per table ``t``: top rows sorted by ID within each table
#: (``top_ids[top_off[t]:top_off[t + 1]]``) with their probabilities per ID drawn, the
#: probability of one tail row, the tail rows and the mean IDs per sample.
AnalyticSummaries = namedtuple("AnalyticSummaries", [
    "top_off", "top_ids", "top_p", "tail_p", "tail_rows", "mean_len"])
#: Per explicit top row (:data:`AnalyticSummaries` order), what every plan of a planning run
#: shares: ``rq`` the requests one GPU sends for the row per iteration (:func:`top_requests`:
#: depends on the workload and the GPU count only) and ``dst`` the GPU its cold function routes
#: it to (:func:`top_destinations`: the plan's layouts; -1 outside the table, 0 for column
#: shards and data-parallel tables, which do not read it).
AnalyticTopRows = namedtuple("AnalyticTopRows", ["rq", "dst"])
#: The host memory tier (``Plan.flat``): table ``t``'s HBM fractions ``hf[hf_off[t]:hf_off[t + 1]]``
#: (G values, or none without a tier) and the UVM bytes per host lookup.
AnalyticHostTier = namedtuple("AnalyticHostTier", ["hf_off", "hf", "uvm_lookup_bytes"])
#: What :func:`analytic_traffic` accumulates into (float64 arrays, see its docstring).
AnalyticOutputs = namedtuple("AnalyticOutputs", [
    "idx_cold", "idx_node", "emb_cold", "emb_node", "s_node", "host_lk", "uvm_b"])


@njit(nogil=True, cache=True)
def analytic_traffic(G, M, B, dedup, torchrec, plan, sums, host, out, top):
    """Accumulate expected requests per iteration into ``out``; return the global-replica
    gradient bytes (all-reduced over all GPUs).

    ``G`` GPUs, ``M`` per node, ``B`` samples per GPU per iteration (float), ``dedup``
    in-batch de-duplication, ``torchrec`` the TorchRec execution profile; ``plan``
    (:data:`AnalyticPlan`), ``sums`` (:data:`AnalyticSummaries`), ``host``
    (:data:`AnalyticHostTier`), ``out`` (:data:`AnalyticOutputs`) and ``top``
    (:data:`AnalyticTopRows`: :func:`top_requests` and :func:`top_destinations` of the same
    arguments, which a planner computes once for many plans) are named arrays.

    out.idx_cold[G]: requests each other GPU sends to GPU g (cold and placed rows);
    out.idx_node[M]: requests each other GPU of a node sends to its local GPU m (node replicas);
    out.emb_cold[G], out.emb_node[G]: embedding bytes likewise (weighted by D * e);
    out.s_node[M]: node-replica gradient bytes. out.host_lk[G]: expected lookups served from GPU
    g's host memory (all requesters, the owner included); out.uvm_b[G]: the same weighted by
    ``host.uvm_lookup_bytes[t]`` bytes per lookup.

    Column shards (layout kind 4, ``lay_w`` the widths): every cold request goes to each shard's
    GPU, with ``w / D`` of the embedding bytes; pooled tables one partial sum per (sample, shard).

    ``torchrec``: the TorchRec execution profile's share (docs/COST_MODEL.md): ``idx_cold[g]`` is
    the expected IDs *every* GPU (``g`` itself included) sends to ``g`` in the input distribution,
    ``emb_cold[g]`` the sequence rows ``g`` returns to every GPU (bytes); replicated rows (global,
    node, data-parallel tables) send nothing and are not summed (their all-reduce is dense);
    pooled tables contribute IDs only, never de-duplicated (their outputs are dense); returns 0.
    """
    sp_off, sp_ids, sp_codes, layout = plan.sp_off, plan.sp_ids, plan.sp_codes, plan.layout
    num_rows, emb_bytes, pooled = plan.num_rows, plan.emb_bytes, plan.pooled
    lay_kind, lay_off, lay_gpus, lay_w = plan.lay_kind, plan.lay_off, plan.lay_gpus, plan.lay_w
    top_off, top_ids, top_p = sums.top_off, sums.top_ids, sums.top_p
    tail_p, tail_rows, mean_len = sums.tail_p, sums.tail_rows, sums.mean_len
    hf_off, hf, uvm_lb = host.hf_off, host.hf, host.uvm_lookup_bytes
    idx_cold, idx_node, emb_cold, emb_node = out.idx_cold, out.idx_node, out.emb_cold, out.emb_node
    s_node, host_lk, uvm_b = out.s_node, out.host_lk, out.uvm_b
    top_rq, top_dst = top.rq, top.dst
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
            if torchrec:
                continue
            touched = 0.0
            for k in range(ta, tb):
                touched += -np.expm1(-lam_scale * top_p[k])
            touched += tail_rows[t] * -np.expm1(-lam_scale * pt)
            s_global += touched * eb
            continue
        is_pooled = pooled[t]
        dd = dedup and not (torchrec and is_pooled)
        partial = is_pooled and not torchrec   # one partial sum per (sample, owner)
        if partial:
            for g in range(G):
                q_c[g] = 0.0
            for m in range(M):
                q_n[m] = 0.0
        p_special = np.full(b - a, -1.0)  # probability of special rows found in the top
        ca, cb = lay_off[lt], lay_off[lt + 1]
        nsp = b - a
        ho = hf_off[t]
        tier = hf_off[t + 1] > ho
        ulb = uvm_lb[t]
        col_rq = 0.0   # column shards: requests and probability mass of the cold rows
        col_q = 0.0
        q = a   # top rows come sorted by ID: merge them with the (sorted) special rows
        for k in range(ta, tb):
            dst = top_dst[k]
            if dst < 0:
                continue   # outside the table
            p = top_p[k]
            if nsp > 0:
                r = top_ids[k]
                while q < b and sp_ids[q] < r:
                    q += 1
                if q < b and sp_ids[q] == r:
                    p_special[q - a] = p
                    continue  # special rows are handled below with their probability
            rq = top_rq[k]
            if kind == 4:
                col_rq += rq
                col_q += p
                continue
            idx_cold[dst] += rq
            if partial:
                q_c[dst] += p
            elif not is_pooled:
                emb_cold[dst] += rq * eb
            if tier and host_u(top_ids[k]) >= hf[ho + dst]:
                hl = rq * G
                host_lk[dst] += hl
                uvm_b[dst] += hl * ulb
        n_special_tail = 0
        for j in range(b - a):
            p = p_special[j]
            if p < 0.0:
                p = pt
                n_special_tail += 1
            code = sp_codes[a + j]
            if torchrec and code < 0:
                continue   # the hot (data-parallel) table: no input distribution
            lam = lam_scale * p
            rq = -np.expm1(-lam * inv_g) if dd else lam * inv_g
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
                if partial:
                    q_c[code] += p
                elif not is_pooled:
                    emb_cold[code] += rq * eb
        # tail rows: spread over the layout's GPUs by their share of rows
        tr = tail_rows[t] - n_special_tail
        if tr > 0 and pt > 0:
            rq_t = -np.expm1(-lam_scale * pt * inv_g) if dd else lam_scale * pt * inv_g
            if kind == 4:
                col_rq += tr * rq_t
                col_q += tr * pt
            else:
                lay_idx[lt] += tr * rq_t
                if partial:
                    wsum = 0.0
                    for j in range(ca, cb):
                        wsum += lay_w[j]
                    if wsum > 0:
                        for j in range(ca, cb):
                            q_c[lay_gpus[j]] += lay_w[j] / wsum * tr * pt
                elif not is_pooled:
                    lay_emb[lt] += tr * rq_t * eb
            if tier:  # the tail share of each cold GPU, in host memory with prob. 1 - f[g]
                wsum = 0.0
                for j in range(ca, cb):
                    wsum += lay_w[j]
                if wsum > 0:
                    scale_h = G * tr * rq_t / wsum
                    for j in range(ca, cb):
                        g = lay_gpus[j]
                        hl = scale_h * lay_w[j] * (1.0 - hf[ho + g])
                        host_lk[g] += hl
                        uvm_b[g] += hl * ulb
        if kind == 4:
            _column_shards(lay_gpus, lay_w, ca, cb, col_rq, col_q, eb, B, L, is_pooled, partial,
                           idx_cold, emb_cold)
        elif partial:
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
def top_requests(G, B, dedup, torchrec, pooled, sums, out):
    """Into ``out[k]``: the requests one GPU sends for explicit top row ``k`` (``sums``,
    :data:`AnalyticSummaries`) per iteration, ``1 - exp(-lam / G)`` with de-duplication (never
    for pooled tables under ``torchrec``), ``lam / G`` without, ``lam = G * B * L * p``: what
    :func:`analytic_traffic` reads as ``top.rq``, the same for every plan of these tables on
    ``G`` GPUs (``pooled[t]``: table ``t`` is pooled)."""
    top_off, top_p, mean_len = sums.top_off, sums.top_p, sums.mean_len
    inv_g = 1.0 / G
    for t in range(top_off.shape[0] - 1):
        lam_scale = G * B * mean_len[t]
        dd = dedup and not (torchrec and pooled[t])
        for k in range(top_off[t], top_off[t + 1]):
            lam = lam_scale * top_p[k]
            out[k] = -np.expm1(-lam * inv_g) if dd else lam * inv_g


@njit(nogil=True, cache=True)
def top_destinations(plan, sums, out):
    """Into ``out[k]`` (int32): the GPU the cold function of its table (``plan``,
    :data:`AnalyticPlan`) routes explicit top row ``k`` to, -1 for a row outside the table, 0
    for column shards and data-parallel tables (not read): what :func:`analytic_traffic` reads
    as ``top.dst``, the same for every plan with these layouts (whatever its replicas)."""
    layout, num_rows = plan.layout, plan.num_rows
    lay_kind, lay_off, lay_gpus = plan.lay_kind, plan.lay_off, plan.lay_gpus
    lay_boff, lay_bounds, lay_seed = plan.lay_boff, plan.lay_bounds, plan.lay_seed
    top_off, top_ids = sums.top_off, sums.top_ids
    for t in range(top_off.shape[0] - 1):
        lt = layout[t]
        kind = lay_kind[lt]
        ca, cb = lay_off[lt], lay_off[lt + 1]
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        ncold = uint64(cb - ca)
        seed = uint64(lay_seed[lt])
        nbnd = cb - ca
        H = num_rows[t]
        for k in range(top_off[t], top_off[t + 1]):
            r = top_ids[k]
            if r < 0 or r >= H:
                out[k] = -1
            elif kind == 2 or kind == 4:
                out[k] = 0
            elif kind == 0:
                out[k] = lay_gpus[ca + np.int64(mix64(uint64(r), seed) % ncold)]
            elif kind == 3:
                # weighted ranges: guess the slot by proportion, check with the recomputed bounds
                j = np.int64(float(r) / float(H) * nbnd)
                if j >= nbnd:
                    j = nbnd - 1
                lo_b = 0 if j == 0 else np.int64(np.floor(bnd[j] * H + 0.5))
                hi_b = H if j + 1 == nbnd else np.int64(np.floor(bnd[j + 1] * H + 0.5))
                if not (lo_b <= r and r < hi_b):
                    j = weighted_range_slot(bnd, H, r)
                out[k] = lay_gpus[ca + j]
            else:
                out[k] = lay_gpus[ca + range_slot(bnd, r)]


@njit(nogil=True, cache=True)
def segment_argsort(keys, off, out):
    """Into ``out[off[t]:off[t + 1]]``: the positions of ``keys[off[t]:off[t + 1]]`` in stable
    increasing order (``np.argsort(kind="stable")`` of each segment, offset by ``off[t]``)."""
    for t in range(off.shape[0] - 1):
        a, b = off[t], off[t + 1]
        order = np.argsort(keys[a:b], kind="mergesort")
        for i in range(b - a):
            out[a + i] = a + order[i]


@njit(nogil=True, cache=True)
def _column_shards(lay_gpus, lay_w, ca, cb, rq, q, eb, B, L, is_pooled, partial, idx_cold,
                   emb_cold):
    """One column-wise table's cold requests ``rq`` (probability mass ``q``) sent to every
    shard: shard ``j`` (``lay_w[j]`` of the table's columns) gets all requests and returns its
    share of the embedding bytes ``eb`` per sequence row, or per (sample, shard) partial sum
    ``B (1 - exp(-L q))`` with ``partial``."""
    wsum = 0.0
    for j in range(ca, cb):
        wsum += lay_w[j]
    for j in range(ca, cb):
        g = lay_gpus[j]
        share = eb * lay_w[j] / wsum
        idx_cold[g] += rq
        if partial:
            emb_cold[g] += B * (1.0 - np.exp(-L * q)) * share
        elif not is_pooled:
            emb_cold[g] += rq * share


@njit(nogil=True, cache=True, inline="always")
def _slot_rows(kind, bnd, H, j, n):
    """Rows ``[lo, hi)`` that slot ``j`` of a range layout with ``n`` slots holds in a table of
    ``H`` rows: kind 3 (weighted) recomputes the bounds from the cumulative weights ``bnd``; kind 1
    takes its explicit bounds, the last slot also holding rows past ``bnd[n]``."""
    if kind == 3:
        lo = np.int64(0) if j == 0 else range_bound(bnd[j], H)
        hi = np.int64(H) if j == n - 1 else range_bound(bnd[j + 1], H)
    else:
        lo = min(np.int64(bnd[j]), H)
        hi = min(np.int64(bnd[j + 1]), H)
        if j == n - 1 and H > np.int64(bnd[n]):
            hi += H - np.int64(bnd[n])
    return lo, hi


@njit(nogil=True, cache=True, inline="always")
def _slot_of(kind, bnd, H, r):
    """The slot of a range layout (kind 3: weighted, else explicit bounds) that holds row ``r``."""
    if kind == 3:
        return weighted_range_slot(bnd, H, r)
    return range_slot(bnd, r)


@njit(nogil=True, cache=True)
def cold_row_counts(G, layout, num_rows, row_bytes, lay_kind, lay_off, lay_gpus, lay_w, lay_boff,
                    lay_bounds, sp_off, sp_ids, out, hf_off, hf, host_out):
    """Add the bytes of every table's range-sharded or column-sharded cold rows to ``out[G]``
    (special rows taken out); returns False if a table uses a cold kind this kernel does not
    handle (hash). A column shard of ``w`` of the table's ``D`` columns (``lay_w``: the widths)
    stores ``w / D`` of every cold row's bytes.

    Host memory tier (``hf_off`` / ``hf`` of ``Plan.flat``): a table with fractions ``f`` puts
    ``f[g]`` of GPU g's cold bytes in ``out`` (HBM) and ``1 - f[g]`` in ``host_out`` (expected
    values); a table without puts them all in ``out``."""
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
        if kind == 4:  # column shards (global replicas only: the special rows)
            wsum = 0.0
            for j in range(ca, cb):
                wsum += lay_w[j]
            rows = H - (sp_off[t + 1] - sp_off[t])
            for j in range(ca, cb):
                out[lay_gpus[j]] += rows * rb * (lay_w[j] / wsum)
            continue
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        ho = hf_off[t]
        tier = hf_off[t + 1] > ho
        for j in range(n):
            # the bounds of slot j, written out (an inlined helper taking arrays costs reference
            # counting per call here: G x tables iterations per plan); _slot_rows is the same rule
            if kind == 3:
                lo = 0 if j == 0 else range_bound(bnd[j], H)
                hi = H if j == n - 1 else range_bound(bnd[j + 1], H)
            else:
                lo = min(np.int64(bnd[j]), H)
                hi = min(np.int64(bnd[j + 1]), H)
                if j == n - 1 and H > np.int64(bnd[n]):
                    hi += H - np.int64(bnd[n])
            g = lay_gpus[ca + j]
            f = hf[ho + g] if tier else 1.0
            out[g] += (hi - lo) * rb * f
            if tier:
                host_out[g] += (hi - lo) * rb * (1.0 - f)
        for k in range(sp_off[t], sp_off[t + 1]):
            r = sp_ids[k]
            if kind == 3:
                j = weighted_range_slot(bnd, H, r)
            else:
                j = range_slot(bnd, r)
            g = lay_gpus[ca + j]
            f = hf[ho + g] if tier else 1.0
            out[g] -= rb * f
            if tier:
                host_out[g] -= rb * (1.0 - f)
    return ok


@njit(nogil=True, cache=True)
def special_cold_bytes(layout, row_bytes, num_rows, lay_kind, lay_off, lay_gpus, lay_boff,
                       lay_bounds, sp_off, sp_ids, out):
    """Take each range-sharded table's special rows out of ``out[G]``: ``row_bytes[t]`` at the
    GPU of the slot holding each (what :func:`cold_row_counts` subtracts without a host memory
    tier), for a caller that has the cold rows' bytes before it (``Plan._memory``)."""
    for t in range(layout.shape[0]):
        lt = layout[t]
        kind = lay_kind[lt]
        if kind != 1 and kind != 3:
            continue
        H = num_rows[t]
        rb = row_bytes[t]
        ca = lay_off[lt]
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        for k in range(sp_off[t], sp_off[t + 1]):
            r = sp_ids[k]
            j = weighted_range_slot(bnd, H, r) if kind == 3 else range_slot(bnd, r)
            out[lay_gpus[ca + j]] -= rb


# ----------------------------------------------------------------------------- host memory tier
@njit(nogil=True, cache=True)
def cold_rows_by_table(G, layout, num_rows, lay_kind, lay_off, lay_gpus, lay_boff, lay_bounds,
                       sp_off, sp_ids, out):
    """Cold rows of every range-sharded table on every GPU, special rows taken out, added into
    ``out[G, T]`` (GPU-major); tables with a hashed cold function are left to the caller (returns
    their indices, int64); data-parallel and column-wise tables have none (they keep every row in
    HBM)."""
    T = layout.shape[0]
    todo = np.zeros(T, np.int64)
    nt = 0
    for t in range(T):
        lt = layout[t]
        kind = lay_kind[lt]
        if kind == 2 or kind == 4:
            continue
        if kind == 0:
            todo[nt] = t
            nt += 1
            continue
        H = num_rows[t]
        ca, cb = lay_off[lt], lay_off[lt + 1]
        n = cb - ca
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        for j in range(n):
            lo, hi = _slot_rows(kind, bnd, H, j, n)
            out[lay_gpus[ca + j], t] += hi - lo
        for k in range(sp_off[t], sp_off[t + 1]):
            r = sp_ids[k]
            j = _slot_of(kind, bnd, H, r)
            out[lay_gpus[ca + j], t] -= 1
    return todo[:nt]


@njit(nogil=True, cache=True)
def top_cold_owners(sp_off, sp_ids, layout, num_rows, lay_kind, lay_off, lay_gpus, lay_bounds,
                    lay_boff, lay_seed, top_off, top_ids, out):
    """Owner GPU of every explicit top row that the cold function routes (``out[k]``), or -1 for
    rows that are replicas or placed already, out of range, of a data-parallel or column-wise table
    (no host memory tier), or repeated in the same table's list (the first listing is kept)."""
    T = layout.shape[0]
    nmax = 0
    for t in range(T):
        nmax = max(nmax, top_off[t + 1] - top_off[t])
    cap = 16
    while cap < 2 * nmax + 1:
        cap <<= 1
    set_key = np.zeros(cap, np.int64)
    set_stamp = np.zeros(cap, np.int64)
    for t in range(T):
        ta, tb = top_off[t], top_off[t + 1]
        if tb == ta:
            continue
        lt = layout[t]
        kind = lay_kind[lt]
        if kind == 2 or kind == 4:
            for k in range(ta, tb):
                out[k] = -1
            continue
        a, b = sp_off[t], sp_off[t + 1]
        ca, cb = lay_off[lt], lay_off[lt + 1]
        bnd = lay_bounds[lay_boff[lt]:lay_boff[lt + 1]]
        ncold = uint64(cb - ca)
        seed = uint64(lay_seed[lt])
        H = num_rows[t]
        size = 16
        lgs = 4
        while size < 2 * (tb - ta) + 1:
            size <<= 1
            lgs += 1
        mask = size - 1
        shift = uint64(64 - lgs)
        for k in range(ta, tb):
            r = top_ids[k]
            out[k] = -1
            if r < 0 or r >= H:
                continue
            # repeated in this table's list: keep the first listing (stamped hash set)
            i = np.int64(mix64(uint64(r), uint64(0x3C6EF372FE94F82B)) >> shift) & mask
            seen = False
            while set_stamp[i] == t + 1:
                if set_key[i] == r:
                    seen = True
                    break
                i = (i + 1) & mask
            if seen:
                continue
            set_stamp[i] = t + 1
            set_key[i] = r
            if b > a:
                lo, hi = a, b
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if sp_ids[mid] < r:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < b and sp_ids[lo] == r:
                    continue
            if kind == 0:
                out[k] = lay_gpus[ca + np.int64(mix64(uint64(r), seed) % ncold)]
            elif kind == 3:
                out[k] = lay_gpus[ca + weighted_range_slot(bnd, H, r)]
            else:
                out[k] = lay_gpus[ca + range_slot(bnd, r)]


@njit(nogil=True, cache=True)
def fill_hbm(cap, over, owner, ex_table, ex_dens, ex_order, tail_order, tail_dens, cold,
             row_bytes, frac, placed, host, tier):
    """Frequency-aware greedy fill of each overflowing GPU's HBM capacity, by decreasing density.

    cap[G]: HBM bytes left for cold rows that are neither replicas nor placed; over[G]: the GPU
    overflows (the others keep everything in HBM, ``frac[g, :] = 1``). Explicit rows ``k``: owner
    GPU (-1: not a candidate), table, density (host-lookup bytes saved per HBM byte), visited in
    the order ``ex_order`` (decreasing density);
    ``tail_order`` lists tables by decreasing tail density ``tail_dens``; ``cold[g, t]`` rows.

    Per GPU, in decreasing density: an explicit row that fits becomes a placed row
    (``placed[k] = True``); a table's block on g (its cold rows there not placed) gets the fraction
    ``frac[g, t]`` of its bytes that fits, after which the table's remaining explicit rows on g are
    part of the block. Placed rows of a table whose block ends wholly in HBM (``frac = 1``) are
    unplaced again (same memory, same lookups, a smaller plan). Outputs (GPU-major ``frac[G, T]``):
    ``host[g]`` expected host-memory bytes, ``tier[t]`` the table keeps rows in host memory
    somewhere.
    """
    G = cap.shape[0]
    T = cold.shape[1]
    n = ex_order.shape[0]
    # explicit candidates grouped by GPU (counting sort, keeping the order of ex_order)
    cnt = np.zeros(G + 1, np.int64)
    for q in range(n):
        g = owner[ex_order[q]]
        if g >= 0 and over[g]:
            cnt[g + 1] += 1
    for g in range(G):
        cnt[g + 1] += cnt[g]
    pos = cnt[:G].copy()
    idx = np.empty(cnt[G], np.int64)
    for q in range(n):
        k = ex_order[q]
        g = owner[k]
        if g >= 0 and over[g]:
            idx[pos[g]] = k
            pos[g] += 1
    nplaced = np.zeros(T, np.int64)
    done = np.zeros(T, np.bool_)
    nt = tail_order.shape[0]
    for g in range(G):
        if not over[g]:
            for t in range(T):
                frac[g, t] = 1.0
            continue
        a, b = cnt[g], cnt[g + 1]
        c = cap[g]
        for t in range(T):
            nplaced[t] = 0
            done[t] = False
            frac[g, t] = 0.0 if cold[g, t] > 0 else 1.0
        i = a
        j = 0
        while c > 0.0 and (i < b or j < nt):
            while j < nt and cold[g, tail_order[j]] <= 0:
                j += 1
            if i < b and (j >= nt or ex_dens[idx[i]] >= tail_dens[tail_order[j]]):
                k = idx[i]
                t = ex_table[k]
                rb = row_bytes[t]
                if not done[t] and rb <= c:
                    placed[k] = True
                    nplaced[t] += 1
                    c -= rb
                i += 1
            elif j < nt:
                t = tail_order[j]
                rest = (cold[g, t] - nplaced[t]) * row_bytes[t]
                if rest <= c:
                    frac[g, t] = 1.0
                    c -= rest
                else:
                    frac[g, t] = c / rest * (1.0 - 1e-12)
                    c = 0.0
                done[t] = True
                j += 1
            else:
                break
        # explicit rows of a table whose block on g stays wholly in HBM need no placement
        for i in range(a, b):
            k = idx[i]
            if placed[k] and frac[g, ex_table[k]] == 1.0:
                placed[k] = False
                nplaced[ex_table[k]] -= 1
        hb = 0.0
        for t in range(T):
            rest = cold[g, t] - nplaced[t]
            if rest > 0 and frac[g, t] < 1.0:
                hb += (1.0 - frac[g, t]) * rest * row_bytes[t]
                tier[t] = True
        host[g] = hb


# ----------------------------------------------------------------------------- TorchRec profile
@njit(nogil=True, cache=True)
def torchrec_dense_terms(G, M, B, length_bytes, sharding, layout, pooled, emb_bytes, num_rows,
                         sp_off, sp_codes, lay_off, lay_gpus, lay_w,
                         lengths, pooled_owner, rs_node, x_node, groups, counted):
    """The collectives of the TorchRec execution profile that do not depend on the IDs (one
    iteration, bytes; docs/COST_MODEL.md), all tables in one pass.

    ``sharding[t]``: the code (``plan.SHARDING_CODES``: 0 table_wise, 1 column_wise,
    2 table_column_wise, 3 row_wise, 4 table_row_wise, 5 data_parallel) of the TorchRec type
    that runs table t (the sharding rule's, ``bridge.sharding.torchrec_kind``: sequence tables
    have no table_row_wise / table_column_wise in TorchRec, their caller passes row_wise /
    column_wise); the replicated rows of a table (special codes < 0) form its data-parallel hot
    table. Outputs (accumulated):

    - ``lengths[g]``: KJT lengths every rank sends to ``g`` (``length_bytes * B`` per slot);
    - ``pooled_owner[g]``: pooled all-to-all bytes ``g`` sends to every rank (``B d e`` per
      table-wise / column-wise shard of ``d`` columns);
    - ``rs_node[n]``: table-row-wise reduce-scatter chunk of each rank of node ``n`` (``N B D_n
      e``), ``x_node[n]``: its cross-node all-to-all bytes to each peer (``B D_n e``);
    - ``groups[6 * pooled + kind]``: 1 for every (module, sharding kind) group with a dist;
    - ``counted[t]``: table t's IDs go through an input distribution (not data-parallel, not all
      rows replicated).

    Returns ``(rs_world, allreduce)``: the row-wise reduce-scatter chunk every rank sends every
    rank (``B sum D e``) and the data-parallel all-reduce buffer (``sum H D e`` over data-parallel
    tables plus ``K D e`` over hot tables of ``K`` replicated rows).
    """
    T = layout.shape[0]
    N = G // M
    bl = B * length_bytes
    n_rw = 0.0
    twrw_len = np.zeros(N)
    d_node = np.zeros(N)
    rs_world = 0.0
    allreduce = 0.0
    for t in range(T):
        eb = emb_bytes[t]
        hot = 0
        for k in range(sp_off[t], sp_off[t + 1]):
            if sp_codes[k] < 0:
                hot += 1
        code = sharding[t]
        if code == 5 or hot >= num_rows[t]:
            allreduce += num_rows[t] * eb
            continue
        allreduce += hot * eb
        counted[t] = True
        is_pooled = pooled[t]
        groups[6 * np.int64(is_pooled) + code] = 1
        ca, cb = lay_off[layout[t]], lay_off[layout[t] + 1]
        if code == 0:
            g = lay_gpus[ca]
            lengths[g] += bl
            if is_pooled:
                pooled_owner[g] += B * eb
        elif code == 1 or code == 2:
            wsum = 0.0
            for j in range(ca, cb):
                wsum += lay_w[j]
            for j in range(ca, cb):
                g = lay_gpus[j]
                lengths[g] += bl
                if is_pooled:
                    pooled_owner[g] += B * eb * lay_w[j] / wsum
        elif code == 3:
            n_rw += 1.0
            if is_pooled:
                rs_world += B * eb
        else:
            n = lay_gpus[ca] // M
            twrw_len[n] += 1.0
            if is_pooled:
                d_node[n] += B * eb
    for g in range(G):
        lengths[g] += bl * (n_rw + twrw_len[g // M])
    for n in range(N):
        rs_node[n] += N * d_node[n]
        x_node[n] += d_node[n]
    return rs_world, allreduce
