"""Routing of row IDs to owner GPUs, shared by ``Plan.route`` and the trace evaluator.

A table's routing is a small open-addressing map of its *special* rows (replicas and explicitly
placed cold rows) plus a deterministic cold-owner function for every other ID.

Codes stored in the map (int32):

- ``code >= 0``: the row lives on GPU ``code`` (explicitly placed cold row);
- ``code == -1``: global replica: served by the requesting GPU itself;
- ``code <= -2``: node replica held by local GPU ``-code - 2`` of the requester's node.

Cold functions (``cold_kind``): 0 hash: ``gpus[mix64(id, seed) % len(gpus)]``; 1 range:
``gpus[j]`` for ``bounds[j] <= id < bounds[j + 1]`` (contiguous or weighted ranges; IDs past the last
bound go to the last GPU); 2 all-replicated (data parallel): every ID is local; 3 column shards:
every cold row lives on every GPU of ``gpus`` (a slice of its columns each), so a lookup goes to all
of them; the single-owner functions here answer with the first shard's GPU, ``gpus[0]`` (the
traffic kernels fan out over every shard themselves).
"""

import heapq

import numpy as np
from numba import njit, uint64

from .hashing import mix64

CODE_GLOBAL = -1
COLD_HASH, COLD_RANGE, COLD_REPLICATED, COLD_COLUMNS = 0, 1, 2, 3
_MAP_SEED = np.uint64(0x2545F4914F6CDD1D)


@njit(nogil=True, cache=True)
def map_build(ids, codes, lg):
    """Open-addressing map ``id -> code`` of ``2**lg`` slots (``lg`` large enough for load <= 1/2).

    Returns ``(keys, vals, used)``; ``used`` marks occupied slots. Later IDs overwrite earlier ones.
    """
    size = 1 << lg
    keys = np.zeros(size, dtype=np.int64)
    vals = np.zeros(size, dtype=np.int32)
    used = np.zeros(size, dtype=np.bool_)
    shift = uint64(64 - lg) if lg > 0 else uint64(63)
    mask = size - 1
    for k in range(ids.shape[0]):
        key = ids[k]
        i = np.int64(mix64(uint64(key), _MAP_SEED) >> shift) & mask
        while used[i] and keys[i] != key:
            i = (i + 1) & mask
        keys[i] = key
        vals[i] = codes[k]
        used[i] = True
    return keys, vals, used


@njit(nogil=True, cache=True, inline="always")
def map_find(keys, vals, used, lg, key):
    """Slot of ``key`` in the map, or -1."""
    if keys.shape[0] == 0:
        return -1
    shift = uint64(64 - lg) if lg > 0 else uint64(63)
    mask = keys.shape[0] - 1
    i = np.int64(mix64(uint64(key), _MAP_SEED) >> shift) & mask
    while used[i]:
        if keys[i] == key:
            return i
        i = (i + 1) & mask
    return -1


@njit(nogil=True, cache=True, inline="always")
def range_slot(bounds, key):
    """``j`` with ``bounds[j] <= key < bounds[j + 1]``, clipped to ``[0, len(bounds) - 2]``.

    Guesses ``j`` by proportion (exact for equal ranges), then falls back to a binary search.
    """
    n = bounds.shape[0] - 1
    last = bounds[n]
    if n <= 1:
        return 0
    if key >= last:
        return n - 1
    j = np.int64(float(key) / float(last) * n)
    if j >= n:
        j = n - 1
    if bounds[j] <= key and key < bounds[j + 1]:
        return j
    if j + 1 < n and bounds[j + 1] <= key and key < bounds[j + 2]:
        return j + 1
    if j > 0 and bounds[j - 1] <= key and key < bounds[j]:
        return j - 1
    j = np.searchsorted(bounds, key, side="right") - 1
    if j < 0:
        return 0
    if j >= n:
        return n - 1
    return j


@njit(nogil=True, cache=True, inline="always")
def cold_owner(key, src, cold_kind, gpus, bounds, seed):
    """Owner GPU of a non-special row ``key`` requested by ``src`` (column shards: the first
    shard's GPU)."""
    if cold_kind == 2:
        return src
    if cold_kind == 3:
        return gpus[0]
    if cold_kind == 0:
        return gpus[np.int64(mix64(uint64(key), seed) % uint64(gpus.shape[0]))]
    return gpus[range_slot(bounds, key)]


@njit(nogil=True, cache=True, inline="always")
def resolve(code, src, gpus_per_node):
    """GPU serving a special row with map ``code`` for requester ``src``."""
    if code >= 0:
        return code
    if code == -1:
        return src
    return (src // gpus_per_node) * gpus_per_node + (-code - 2)


@njit(nogil=True, cache=True)
def route_ids(ids, srcs, keys, vals, used, lg, cold_kind, gpus, bounds, seed, gpus_per_node, out):
    """Owner GPU of each ``ids[k]`` requested from ``srcs[k]`` (int32 into ``out``)."""
    for k in range(ids.shape[0]):
        key = ids[k]
        src = srcs[k]
        slot = map_find(keys, vals, used, lg, key)
        if slot >= 0:
            out[k] = resolve(vals[slot], src, gpus_per_node)
        else:
            out[k] = cold_owner(key, src, cold_kind, gpus, bounds, seed)
    return out


@njit(nogil=True, cache=True)
def hash_owner_counts(num_rows, gpus_n, seed, skip_sorted):
    """Rows per cold GPU slot under the hash function, excluding the sorted IDs ``skip_sorted``."""
    counts = np.zeros(gpus_n, dtype=np.int64)
    for r in range(num_rows):
        counts[np.int64(mix64(uint64(r), seed) % uint64(gpus_n))] += 1
    for k in range(skip_sorted.shape[0]):
        r = skip_sorted[k]
        if r < num_rows:
            counts[np.int64(mix64(uint64(r), seed) % uint64(gpus_n))] -= 1
    return counts


@njit(nogil=True, cache=True)
def place_by_load(p, base_load, inv_bw):
    """Greedy placement of rows (decreasing probability ``p``) onto GPUs: each row goes to the GPU
    with the least ``load * inv_bw`` (load per unit of bandwidth), via a binary heap (O(n log G)).

    Returns the GPU of each row (int32); ``base_load`` (float64[G]) is the load already there.
    """
    G = base_load.shape[0]
    load = base_load.copy()
    heap = [(load[g] * inv_bw[g], g) for g in range(G)]
    heapq.heapify(heap)
    out = np.empty(p.shape[0], dtype=np.int32)
    for i in range(p.shape[0]):
        _, g = heapq.heappop(heap)
        out[i] = g
        load[g] += p[i]
        heapq.heappush(heap, (load[g] * inv_bw[g], g))
    return out


@njit(nogil=True, cache=True)
def cumulative_weights(w):
    """Normalized cumulative weights ``cw[j] = sum(w[:j]) / sum(w)`` (float64[n + 1]).

    The single definition behind weighted ranges: ``ColdSharding.ranges`` and the kernels that
    recompute range bounds for a table of ``H`` rows both go through :func:`range_bound`."""
    n = w.shape[0]
    out = np.zeros(n + 1)
    total = 0.0
    for j in range(n):
        total += w[j]
    acc = 0.0
    for j in range(n):
        acc += w[j]
        out[j + 1] = acc / total
    return out


@njit(nogil=True, cache=True, inline="always")
def range_bound(cw_j, num_rows):
    """Row where a weighted range starts: ``round(cw_j * num_rows)``, halves rounded up."""
    b = np.int64(np.floor(cw_j * num_rows + 0.5))
    if b > num_rows:
        b = num_rows
    return b


@njit(nogil=True, cache=True)
def range_bounds(w, num_rows):
    """Bounds (int64[n + 1]) of weighted ranges over ``[0, num_rows)``: 0, ..., num_rows."""
    cw = cumulative_weights(w)
    n = w.shape[0]
    out = np.empty(n + 1, dtype=np.int64)
    for j in range(n + 1):
        out[j] = range_bound(cw[j], num_rows)
    out[0] = 0
    out[n] = num_rows
    return out


@njit(nogil=True, cache=True)
def weighted_range_slot(cw, num_rows, key):
    """Slot ``j`` of ``key`` in the weighted ranges ``cw`` of a ``num_rows`` table (as range_slot
    on ``range_bounds``), without materializing the bounds."""
    n = cw.shape[0] - 1
    if n <= 1:
        return 0
    if key >= num_rows:
        return n - 1
    j = np.int64(float(key) / float(num_rows) * n)
    if j >= n:
        j = n - 1
    lo_b = 0 if j == 0 else range_bound(cw[j], num_rows)
    hi_b = num_rows if j + 1 == n else range_bound(cw[j + 1], num_rows)
    if lo_b <= key and key < hi_b:
        return j
    lo, hi = 0, n + 1
    while lo < hi:
        mid = (lo + hi) >> 1
        bm = 0 if mid == 0 else (num_rows if mid == n else range_bound(cw[mid], num_rows))
        if bm <= key:
            lo = mid + 1
        else:
            hi = mid
    j = lo - 1
    if j < 0:
        return 0
    if j >= n:
        return n - 1
    return j
