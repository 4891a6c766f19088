"""Trace-mode traffic counting for one table over one iteration (see docs/COST_MODEL.md).

Samples ``0 .. G*B-1`` of the iteration sit on GPU ``sample // B``. For every lookup the owner is
routed (the plan's routing map, then its cold function); a lookup whose owner is another GPU is
counted in ``cnt_idx[src, dst]`` (index exchange) and, for sequence tables, in ``cnt_emb[src, dst]``
(one embedding row each way). With de-duplication a (src, row) pair counts once per iteration.
Pooled tables count one partial sum per (sample, owner GPU) pair in ``cnt_emb`` instead of rows.
Replica rows touched by any GPU are counted once per iteration for the gradient all-reduce.
Host memory tier (optional arguments): lookups of cold rows kept in host memory are counted per owner
GPU, the owner's own included (docs/COST_MODEL.md, "Host memory tier").

Column shards (optional ``col_gpus``): a cold lookup goes to every shard's GPU (one index message
and, for sequence tables, one shard row each; pooled tables one partial sum per (sample, shard)).

TorchRec execution profile (``torchrec=True``, docs/COST_MODEL.md): ``cnt_idx[src, dst]`` counts
every ID of ``src``'s samples that the KJT input distribution sends to ``dst``, ``dst == src``
included (TorchRec's all-to-all buffers hold a rank's own share too); replicated rows (global and
node replicas: the exported data-parallel hot table) are not sent at all; de-duplication, when
asked (TorchRec's index de-duplication of sequence tables), is per (``src``, row) as above.
``cnt_emb`` is then left alone: sequence rows come back one per counted ID and pooled outputs are
dense, both priced by the caller.

Hot-loop notes (measured, bench/cost.py): routing is written out in the loop rather than called
through inlined helpers that take arrays (those left reference-count calls per ID), and
de-duplication works one source-GPU block at a time (a GPU's samples are contiguous) in a small
stamped table that stays in cache.
"""

import numpy as np
from numba import njit, uint64

from .hashing import host_u, mix64

_PAIR_SEED = np.uint64(0x3C6EF372FE94F82B)
_MAP_SEED = np.uint64(0x2545F4914F6CDD1D)


@njit(nogil=True, cache=True)
def table_traffic(ids, lengths, B, M, num_rows, keys, vals, used, lg, cold_kind, gpus, bounds,
                  seed, dedup, pooled, set_tab, stamp0, touch_stamp, dp_tab, marks,
                  cnt_idx, cnt_emb, touched_node, hbm_frac=None, host_cnt=None, torchrec=False,
                  col_gpus=None):
    """Accumulate one iteration of one table into ``cnt_idx`` / ``cnt_emb`` (int64[G, G]).

    ``set_tab`` (int64[cap, 2], ``cap`` a power of two >= 2 * the IDs of any one GPU) is the
    de-duplication scratch, reused across calls through stamps: block ``g`` of this call uses stamp
    ``stamp0 + g``; callers advance ``stamp0`` by at least G per call. ``touch_stamp`` (aligned with
    the routing map) marks replica rows already counted for the all-reduce (stamp ``stamp0``).
    ``dp_tab`` (int64[cap2, 2], cap2 >= 2 * len(ids)) is the touched-row set of data-parallel tables.
    ``marks`` (int64[G], -1) is pooled scratch. Returns the distinct global-replica rows touched;
    ``touched_node[m]`` gets the distinct node-replica rows on local GPU ``m`` touched. An ID outside
    ``[0, num_rows)`` stops the count and returns ``-(position + 1)`` (the caller discards the
    partial counts and raises).

    Host memory tier: when ``hbm_frac`` (float64[G], the table's ``hbm_fraction``) and ``host_cnt``
    (int64[G]) are given, a cold row ``r`` (not a replica, not placed) owned by GPU ``g`` is in host
    memory iff ``host_u(r) >= hbm_frac[g]``; every lookup of such a row, the owner's own included,
    adds one to ``host_cnt[g]`` (with de-duplication once per (source GPU, row) pair, as the index
    exchange). Without them (the default) this code is pruned at compile time: the specialization
    without a host tier is the plain hot loop.

    ``torchrec`` (bool): count as TorchRec's input distribution does (module docstring).
    ``col_gpus`` (int64[n], column-wise tables, no host tier): the GPU of each column shard; a
    cold lookup is counted towards each of them.
    """
    nsamp = lengths.shape[0]
    G = (nsamp + B - 1) // B
    nb = bounds.shape[0] - 1
    last = bounds[nb]
    ngpu = uint64(gpus.shape[0])
    use_map = keys.shape[0] > 0
    map_mask = keys.shape[0] - 1
    map_shift = uint64(64 - lg) if lg > 0 else uint64(63)
    cap = set_tab.shape[0]
    dp_mask = dp_tab.shape[0] - 1
    dp_lg = 0
    while (1 << dp_lg) < dp_tab.shape[0]:
        dp_lg += 1
    dp_shift = uint64(64 - dp_lg) if dp_lg > 0 else uint64(63)
    touched_global = 0
    pos = 0
    for src in range(G):
        s_lo = src * B
        s_hi = min(nsamp, s_lo + B)
        nblk = 0
        for s in range(s_lo, s_hi):
            nblk += lengths[s]
        size = 16
        lgs = 4
        while size < 2 * nblk + 1 and size < cap:
            size <<= 1
            lgs += 1
        mask = size - 1
        shift = uint64(64 - lgs)
        stamp = stamp0 + src
        for s in range(s_lo, s_hi):
            n = lengths[s]
            for k in range(pos, pos + n):
                key = ids[k]
                if key < 0 or key >= num_rows:
                    return -(k + 1)
                special = False
                host = False
                if use_map:
                    i = np.int64(mix64(uint64(key), _MAP_SEED) >> map_shift) & map_mask
                    while used[i]:
                        if keys[i] == key:
                            special = True
                            break
                        i = (i + 1) & map_mask
                    if special:
                        code = vals[i]
                        if torchrec and code < 0:
                            continue  # the hot (data-parallel) table: no input distribution
                        if code >= 0:
                            dst = np.int64(code)
                        elif code == -1:
                            dst = src
                        else:
                            dst = (src // M) * M + (-code - 2)
                        if code < 0 and touch_stamp[i] != stamp0:
                            touch_stamp[i] = stamp0
                            if code == -1:
                                touched_global += 1
                            else:
                                touched_node[-code - 2] += 1
                if not special:
                    if cold_kind == 2:  # data parallel: every row is a global replica
                        i = np.int64(mix64(uint64(key), _PAIR_SEED) >> dp_shift) & dp_mask
                        new = True
                        while dp_tab[i, 0] == stamp0:
                            if dp_tab[i, 1] == key:
                                new = False
                                break
                            i = (i + 1) & dp_mask
                        if new:
                            dp_tab[i, 0] = stamp0
                            dp_tab[i, 1] = key
                            touched_global += 1
                        continue
                    elif cold_kind == 0:
                        dst = np.int64(gpus[np.int64(mix64(uint64(key), seed) % ngpu)])
                    elif cold_kind == 3:
                        dst = -1   # column shards: every shard's GPU (below)
                    else:
                        # range: guess by proportion (exact for equal ranges), else binary search
                        j = 0
                        if nb > 1:
                            if key >= last:
                                j = nb - 1
                            else:
                                j = min(np.int64(float(key) / float(last) * nb), nb - 1)
                                if not (bounds[j] <= key and key < bounds[j + 1]):
                                    lo, hi = 0, nb + 1
                                    while lo < hi:
                                        mid = (lo + hi) >> 1
                                        if bounds[mid] <= key:
                                            lo = mid + 1
                                        else:
                                            hi = mid
                                    j = min(max(lo - 1, 0), nb - 1)
                        dst = np.int64(gpus[j])
                    if hbm_frac is not None:
                        host = host_u(key) >= hbm_frac[dst]
                if dst == src and not host and not torchrec:
                    continue
                new = True
                if dedup:
                    i = np.int64(mix64(uint64(key), _PAIR_SEED) >> shift) & mask
                    while set_tab[i, 0] == stamp:
                        if set_tab[i, 1] == key:
                            new = False
                            break
                        i = (i + 1) & mask
                    if new:
                        set_tab[i, 0] = stamp
                        set_tab[i, 1] = key
                if host_cnt is not None:
                    if host and new:
                        host_cnt[dst] += 1
                    if dst == src and not torchrec:
                        continue
                d0 = dst
                nd = 1
                if col_gpus is not None:
                    if d0 < 0:
                        nd = col_gpus.shape[0]
                for q in range(nd):
                    if col_gpus is not None:
                        if d0 < 0:
                            dst = col_gpus[q]
                            if dst == src and not torchrec:
                                continue
                    if new:
                        cnt_idx[src, dst] += 1
                        if not pooled and not torchrec:
                            cnt_emb[src, dst] += 1
                    if pooled and not torchrec and marks[dst] != s:
                        marks[dst] = s
                        cnt_emb[src, dst] += 1
            pos += n
    return touched_global
