"""PlanDelta: how to go from one plan to another, as a first-class, serializable object.

A delta is what a training job applies when the re-sharder moves the replication threshold online.
It holds, per table, the rows whose placement changes (explicit sorted IDs with their old and new
placement codes), the cold sharding before and after, and any other changed ``TablePlan`` field
(found generically through ``dataclasses.fields``, e.g. ``hbm_fraction``); plus the strategy and
meta before and after, the topology, and sha256 fingerprints of the base and target plans.

Placement codes (int32, the routing map's codes plus one): ``g >= 0`` placed on GPU ``g``; ``-1``
global replica; ``-2 - m`` node replica on local GPU ``m`` of every node; :data:`COLD_CODE` no
explicit placement (the cold function decides).

``PlanDelta.between(a, b).apply(a) == b`` exactly; ``invert`` and ``compose`` are exact too.
Migration accounting (bytes that must move between GPUs, by link class) is computed from the delta
alone; see docs/RESHARDER.md, "PlanDelta". Column shards are part of the cold function
(``ColdSharding.columns``): a change of column layout is a cold change, a table-level move in
which every GPU receives, from the GPUs that held them, the column slices of the cold rows it holds
afterwards and did not hold before (exact by column overlap); the sharding kind label
(``TablePlan.sharding``) is an extra field that moves nothing. :func:`migration_cost` prices
applying a delta as a training job pays for it: a fixed pause plus the transfer of the rows and
their optimizer state.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError, FormatError, IncompatibleError
from ..formats.container import pack, read_file, unpack, write_atomic
from ..formats.files import jsonable
from ..kernels.routing import COLD_COLUMNS, COLD_HASH, COLD_RANGE, route_ids
from .plan import ColdSharding, Plan, TablePlan, hashed_rows_per_slot
from .tables import EmbeddingTable
from .topology import Topology

__all__ = [
    "COLD_CODE",
    "DEFAULT_PAUSE_S",
    "DELTA_KIND",
    "DELTA_VERSION",
    "TIERS",
    "MigrationCost",
    "PlanDelta",
    "TableDelta",
    "TierMoves",
    "check_pause",
    "compose",
    "migration_cost",
    "plan_fingerprint",
]

DELTA_KIND = "plan_delta"
DELTA_VERSION = 1
COLD_CODE = int(np.iinfo(np.int32).min)
#: Tiers from hottest to coldest; "cold": rows without an explicit placement (not the placed ones).
TIERS = ("global", "node", "placed", "cold")
CLASS_NAMES = ("local", "intra_node", "inter_node")
_TIER_FIELDS = ("global_ids", "node_ids", "node_local", "placed_ids", "placed_gpus")
_FIXED_FIELDS = ("table", "cold") + _TIER_FIELDS
_EXACT_HASH_ROWS = 1 << 24   # up to this many rows, hash owner counts are exact (one Numba pass)
_EX = 5                      # IDs quoted in error messages


# ============================================================================ small helpers
def _extra_field_names() -> list[str]:
    """TablePlan fields other than the table, the cold function and the tier arrays."""
    return [f.name for f in dataclasses.fields(TablePlan) if f.name not in _FIXED_FIELDS]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return (a.dtype == b.dtype and a.shape == b.shape
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")))
    return bool(a == b)


def _same_cold(a: ColdSharding, b: ColdSharding) -> bool:
    """Equality including the range weights (``ColdSharding.__eq__`` ignores them)."""
    return a == b and np.array_equal(a.weights, b.weights)


def _copy(v: Any) -> Any:
    return v.copy() if isinstance(v, np.ndarray) else copy.deepcopy(v)


def _ex(ids: np.ndarray) -> str:
    ids = np.asarray(ids).ravel()
    s = ", ".join(str(int(x)) for x in ids[:_EX])
    return s + (f", ... ({ids.size} in all)" if ids.size > _EX else "")


def _describe(code: int) -> str:
    code = int(code)
    if code == COLD_CODE:
        return "cold (cold function)"
    if code == -1:
        return "global"
    if code <= -2:
        return f"a node replica on local GPU {-2 - code}"
    return f"placed on GPU {code}"


def _cold_brief(c: ColdSharding) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": c.kind, "gpus": int(c.gpus.size)}
    if c.kind == "hash":
        d["seed"] = int(c.seed)
    if c.kind == "columns":
        d["widths"] = c.widths.tolist()
    return d


def _special(tp: TablePlan) -> tuple[np.ndarray, np.ndarray]:
    """All explicitly placed rows of a table, sorted by ID, with their codes (read-only)."""
    return tp.special_sorted


def _lookup(ids: np.ndarray, codes: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Code of each query ID in a sorted (ids, codes) map; COLD_CODE where absent."""
    out = np.full(query.size, COLD_CODE, np.int32)
    if ids.size and query.size:
        pos = np.minimum(np.searchsorted(ids, query), ids.size - 1)
        hit = ids[pos] == query
        out[hit] = codes[pos[hit]]
    return out


def _tier_index(codes: np.ndarray) -> np.ndarray:
    """0 global, 1 node, 2 placed, 3 cold (see TIERS)."""
    t = np.full(codes.size, 3, np.int8)
    t[codes == -1] = 0
    t[(codes <= -2) & (codes != COLD_CODE)] = 1
    t[codes >= 0] = 2
    return t


def _place(codes: np.ndarray) -> np.ndarray:
    """Local GPU for node replicas, GPU for placed rows, -1 otherwise."""
    p = np.full(codes.size, -1, np.int32)
    node = (codes <= -2) & (codes != COLD_CODE)
    p[node] = -2 - codes[node]
    p[codes >= 0] = codes[codes >= 0]
    return p


def plan_fingerprint(plan: Plan) -> str:
    """sha256 (hex) of a plan's content: strategy, topology, meta (as JSON), and per table the
    table, the cold function (weights included) and every other TablePlan field (found through
    ``dataclasses.fields``; optional fields at their default value are left out, so adding a new
    optional field to TablePlan does not change the fingerprint of plans that do not use it)."""
    h = hashlib.sha256()

    def put(tag: str, b: bytes) -> None:
        t = tag.encode()
        h.update(len(t).to_bytes(8, "little") + t + len(b).to_bytes(8, "little"))
        h.update(b)

    def put_array(tag: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        put(tag, f"{a.dtype.name}{list(a.shape)}".encode())
        put(tag, a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())

    put("fingerprint", b"flexshard_stream plan v1")
    put("strategy", plan.strategy.encode())
    topo = plan.topology
    put("topology", json.dumps([topo.nodes, topo.gpus_per_node, topo.name]).encode())
    for a in ("hbm_bytes", "intra_bw", "inter_bw", "uvm_bw", "host_memory_bytes"):
        put_array(a, np.asarray(getattr(topo, a), np.float64))
    put("meta", json.dumps(_meta_json(plan.meta), sort_keys=True, default=repr).encode())
    defaults = {f.name: f for f in dataclasses.fields(TablePlan)}
    for tp in plan.tables.values():
        put("table", json.dumps(dataclasses.asdict(tp.table), sort_keys=True).encode())
        c = tp.cold
        put("cold", json.dumps([c.kind, int(c.seed)]).encode())
        for a in ("gpus", "bounds", "weights"):
            put_array("cold." + a, getattr(c, a))
        if c.widths.size:   # column shards only: other plans keep their fingerprints
            put_array("cold.widths", c.widths)
        for f in dataclasses.fields(tp):
            if f.name in ("table", "cold"):
                continue
            v = getattr(tp, f.name)
            if f.name not in _TIER_FIELDS:
                d = defaults.get(f.name)
                if d is not None and d.default_factory is not dataclasses.MISSING \
                        and _same(v, d.default_factory()):
                    continue
                if d is not None and d.default is not dataclasses.MISSING and _same(v, d.default):
                    continue
            if isinstance(v, np.ndarray):
                put_array(f.name, v)
            else:
                put(f.name, json.dumps(_meta_json(v), sort_keys=True, default=repr).encode())
    return h.hexdigest()


def _topology_diff(a: Topology, b: Topology) -> str:
    if (a.nodes, a.gpus_per_node) != (b.nodes, b.gpus_per_node):
        return f"{a.nodes}x{a.gpus_per_node} GPUs vs {b.nodes}x{b.gpus_per_node}"
    if a.name != b.name:
        return f"name {a.name!r} vs {b.name!r}"
    for attr in ("hbm_bytes", "intra_bw", "inter_bw", "uvm_bw", "host_memory_bytes"):
        x, y = getattr(a, attr), getattr(b, attr)
        if not np.array_equal(x, y):
            i = int(np.flatnonzero(x != y)[0])
            return f"{attr}[{i}] {x[i]:.6g} vs {y[i]:.6g}"
    return "unequal"


def _check_same_layout(old: Plan, new: Plan, what: str) -> None:
    """Same topology, same tables (names, order, definitions). Raises IncompatibleError."""
    if old.topology != new.topology:
        raise IncompatibleError(f"{what}: the topologies differ "
                                f"({_topology_diff(old.topology, new.topology)})")
    a, b = list(old.tables), list(new.tables)
    if a != b:
        only_a = [n for n in a if n not in new.tables]
        only_b = [n for n in b if n not in old.tables]
        if only_a or only_b:
            raise IncompatibleError(f"{what}: the tables differ: only in the first plan {only_a}, "
                                    f"only in the second {only_b}")
        raise IncompatibleError(f"{what}: the same tables in another order ({a} vs {b})")
    for n in a:
        ta, tb = old.tables[n].table, new.tables[n].table
        if ta != tb:
            diff = [f"{f.name} {getattr(ta, f.name)!r} -> {getattr(tb, f.name)!r}"
                    for f in dataclasses.fields(ta) if getattr(ta, f.name) != getattr(tb, f.name)]
            raise IncompatibleError(f"{what}: table {n!r} is defined differently "
                                    f"({', '.join(diff)})")


def _host_bytes(tp: TablePlan, topo: Topology) -> np.ndarray:
    """Expected bytes of the table each GPU keeps in host memory (float64[G]); zeros without a host
    memory tier (or on a TablePlan without one)."""
    if hasattr(tp, "host_rows_per_gpu"):
        return np.asarray(tp.host_rows_per_gpu(topo), np.float64) * float(tp.table.row_bytes)
    p = Plan("host", topo, [tp])
    if hasattr(p, "host_bytes_per_gpu"):
        v = p.host_bytes_per_gpu
        return np.asarray(v() if callable(v) else v, np.float64)
    return np.zeros(topo.num_gpus)


# ============================================================================ migration
class _Acc:
    """Bytes sent / received per GPU and link class (float64[G, 3]) and rows moved."""

    def __init__(self, topo: Topology):
        self.N, self.M, self.G = topo.nodes, topo.gpus_per_node, topo.num_gpus
        self.send = np.zeros((self.G, 3))
        self.recv = np.zeros((self.G, 3))
        self.rows = 0.0
        self.exact = True

    def pairs(self, s: np.ndarray, d: np.ndarray, w: np.ndarray, rb: float) -> None:
        """``w[k]`` rows each copied from GPU ``s[k]`` to GPU ``d[k]`` (nothing where s == d)."""
        s, d, w = np.asarray(s, np.int64), np.asarray(d, np.int64), np.asarray(w, np.float64)
        m = s != d
        s, d, w = s[m], d[m], w[m]
        if not s.size:
            return
        cls = np.where(s // self.M == d // self.M, 1, 2)
        G = self.G
        self.send += np.bincount(s * 3 + cls, w * rb, 3 * G).reshape(G, 3)
        self.recv += np.bincount(d * 3 + cls, w * rb, 3 * G).reshape(G, 3)
        self.rows += float(w.sum())

    def one_to_all(self, mass: np.ndarray, rb: float) -> None:
        """``mass[s]`` rows held by GPU ``s`` alone become replicated on every GPU."""
        N, M, G = self.N, self.M, self.G
        a = np.asarray(mass, np.float64) * rb
        node = np.arange(G) // M
        an = a.reshape(N, M).sum(axis=1)[node]
        self.send[:, 1] += a * (M - 1)
        self.send[:, 2] += a * (G - M)
        self.recv[:, 1] += an - a
        self.recv[:, 2] += a.sum() - an
        if G > 1:
            self.rows += float(np.sum(mass))

    def product(self, u: np.ndarray, v: np.ndarray, rb: float) -> None:
        """Expected moves ``u[s] * v[d]`` rows from GPU s to GPU d (independent old and new owners:
        ``u`` rows per old owner, ``v`` probabilities or rows per new owner)."""
        N, M, G = self.N, self.M, self.G
        node = np.arange(G) // M
        un = u.reshape(N, M).sum(axis=1)[node]
        vn = v.reshape(N, M).sum(axis=1)[node]
        U, V = float(u.sum()), float(v.sum())
        self.send[:, 1] += rb * u * (vn - v)
        self.send[:, 2] += rb * u * (V - vn)
        self.recv[:, 1] += rb * v * (un - u)
        self.recv[:, 2] += rb * v * (U - un)
        self.rows += U * V - float((u * v).sum())
        self.exact = False

    def holders(self, oh: np.ndarray, nh: np.ndarray, w: np.ndarray, rb: float) -> None:
        """Rows going from holder set ``oh`` to ``nh`` (holder codes: ``g >= 0`` GPU g alone, -1
        every GPU, ``-2 - m`` local GPU m of every node; canonical). Each GPU that gains the row
        receives it from the nearest old holder (same node if any, else the single old holder)."""
        N, M, G = self.N, self.M, self.G
        keep = (oh != nh) & (oh != -1)
        oh, nh, w = oh[keep], nh[keep], w[keep]
        if not oh.size:
            return
        g = np.arange(G)
        o1, on = oh >= 0, oh <= -2
        n1, nn, na = nh >= 0, nh <= -2, nh == -1
        # one GPU -> one GPU
        k = o1 & n1
        self.pairs(oh[k], nh[k], w[k], rb)
        # one GPU s -> local GPU m of every node: s sends to each, intra inside its node
        k = o1 & nn
        if k.any():
            s, m, ww = oh[k], -2 - nh[k], w[k]
            C = np.bincount(s * M + m, ww * rb, G * M).reshape(G, M)
            tot, diag = C.sum(axis=1), C[g, g % M]
            snode = C.reshape(N, M, M).sum(axis=1)            # [node, m]
            self.send[:, 1] += tot - diag
            self.send[:, 2] += (N - 1) * tot
            self.recv[:, 1] += (snode - diag.reshape(N, M)).ravel()
            self.recv[:, 2] += (C.sum(axis=0)[None, :] - snode).ravel()
            self.rows += float(ww[(N >= 2) | (s % M != m)].sum())
        # one GPU -> every GPU
        k = o1 & na
        if k.any():
            self.one_to_all(np.bincount(oh[k], w[k], G), rb)
        # local GPU m' of every node -> one GPU d: from GPU m' of d's node
        k = on & n1
        if k.any():
            d = nh[k]
            self.pairs((d // M) * M + (-2 - oh[k]), d, w[k], rb)
        # local GPU m' -> local GPU m of every node: inside each node
        k = on & nn
        if k.any():
            P = np.bincount((-2 - oh[k]) * M + (-2 - nh[k]), w[k] * rb, M * M).reshape(M, M)
            np.fill_diagonal(P, 0.0)
            self.send[:, 1] += np.tile(P.sum(axis=1), N)
            self.recv[:, 1] += np.tile(P.sum(axis=0), N)
            self.rows += float(w[k][oh[k] != nh[k]].sum())
        # local GPU m' of every node -> every GPU: inside each node
        k = on & na
        if k.any():
            Q = np.bincount(-2 - oh[k], w[k] * rb, M)
            self.send[:, 1] += np.tile(Q * (M - 1), N)
            self.recv[:, 1] += np.tile(Q.sum() - Q, N)
            if M > 1:
                self.rows += float(w[k].sum())


def _canonical(h: np.ndarray, topo: Topology) -> np.ndarray:
    """Holder codes with one code per holder set (node replicas on 1-GPU nodes are everywhere,
    node replicas on one node are one GPU, 'everywhere' on one GPU is GPU 0)."""
    h = np.asarray(h, np.int64).copy()
    if topo.gpus_per_node == 1:
        h[h <= -2] = -1
    if topo.nodes == 1:
        k = h <= -2
        h[k] = -2 - h[k]
    if topo.num_gpus == 1:
        h[h == -1] = 0
    return h


def _cold_owner(ids: np.ndarray, cold: ColdSharding, topo: Topology) -> np.ndarray:
    """Owner GPU of cold rows under a hash or range cold function (the routing kernel itself;
    column shards: the first shard's GPU)."""
    ids = np.ascontiguousarray(ids, np.int64)
    kind = {"hash": COLD_HASH, "columns": COLD_COLUMNS}.get(cold.kind, COLD_RANGE)
    bounds = cold.bounds if cold.bounds.size else np.zeros(1, np.int64)
    return route_ids(ids, np.zeros(ids.size, np.int64), np.zeros(0, np.int64),
                     np.zeros(0, np.int32), np.zeros(0, np.bool_), 0, kind, cold.gpus, bounds,
                     np.uint64(cold.seed), topo.gpus_per_node,
                     np.empty(ids.size, np.int32)).astype(np.int64)


def _holder_codes(ids: np.ndarray, codes: np.ndarray, cold: ColdSharding,
                  topo: Topology) -> np.ndarray:
    """Holder code of each row (cold rows of column shards: the first shard's GPU; see
    :func:`_row_moves` for their slices)."""
    if cold.kind == "replicated":
        return _canonical(np.full(ids.size, -1, np.int64), topo)
    h = codes.astype(np.int64)
    c = codes == COLD_CODE
    if c.any():
        h[c] = _cold_owner(ids[c], cold, topo)
    return _canonical(h, topo)


def _between_count(S: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Rows of the sorted array S in each [lo, hi)."""
    return np.searchsorted(S, hi) - np.searchsorted(S, lo)


def _cold_mass(c: ColdSharding, S: np.ndarray, H: int, G: int) -> tuple[np.ndarray, bool]:
    """Rows per GPU (float64[G]) of ``[0, H)`` minus the sorted rows ``S`` under the cold function
    ``c`` (hash, range or column shards: a shard of ``w`` of ``D`` columns holds ``w / D`` of each
    row); exact for ranges, columns and hashes up to 2**24 rows, else expected."""
    n = c.gpus.size
    if c.kind == "columns":
        return np.bincount(c.gpus, (H - S.size) * (c.widths / c.widths.sum()), G), True
    if c.kind == "range":
        lo = np.minimum(c.bounds[:-1], H)
        hi = np.minimum(c.bounds[1:], H)
        cnt = (hi - lo) - _between_count(S, lo, hi)
        return np.bincount(c.gpus, cnt.astype(np.float64), G), True
    if H <= _EXACT_HASH_ROWS:
        cnt = hashed_rows_per_slot(H, n, c.seed, S).astype(np.float64)
        return np.bincount(c.gpus, cnt, G), True
    return np.bincount(c.gpus, np.full(n, (H - S.size) / n), G), False


def _cold_moves(td: TableDelta, topo: Topology, acc: _Acc, rb: float) -> None:
    """Rows that are cold in both plans but change cold owner (cold function changed)."""
    c0, c1 = td.cold_old, td.cold_new
    if c0.kind == "replicated":
        return
    H, G = td.table.num_rows, topo.num_gpus
    S = np.sort(np.concatenate([td.ids, td.kept_ids]))   # rows explicitly placed in either plan
    Z = H - S.size                                       # rows cold in both plans
    if Z <= 0:
        return
    if c1.kind == "replicated":
        mass, exact = _cold_mass(c0, S, H, G)
        acc.one_to_all(mass, rb)
        acc.exact &= exact
        return
    if c0.kind == "columns" or c1.kind == "columns":
        _column_moves(c0, c1, S, H, G, acc, rb)
        return
    if c0.kind == "range" and c1.kind == "range":
        # interval arithmetic on the merged bounds: never enumerates rows
        pts = np.unique(np.concatenate([np.minimum(c0.bounds, H), np.minimum(c1.bounds, H),
                                        [0, H]]))
        lo, hi = pts[:-1], pts[1:]
        j0 = np.clip(np.searchsorted(c0.bounds, lo, side="right") - 1, 0, c0.gpus.size - 1)
        j1 = np.clip(np.searchsorted(c1.bounds, lo, side="right") - 1, 0, c1.gpus.size - 1)
        cnt = (hi - lo) - _between_count(S, lo, hi)
        acc.pairs(c0.gpus[j0], c1.gpus[j1], cnt.astype(np.float64), rb)
        return
    n0, n1 = c0.gpus.size, c1.gpus.size
    if c0.kind == "hash" and c1.kind == "hash":
        same_seed = c0.seed == c1.seed
        if same_seed and n0 == n1:
            # the same hash index before and after: index i moves gpus0[i] -> gpus1[i]
            if H <= _EXACT_HASH_ROWS:
                cnt = hashed_rows_per_slot(H, n0, c0.seed, S).astype(np.float64)
            else:
                cnt = np.full(n0, Z / n0)
                acc.exact = False
            acc.pairs(c0.gpus, c1.gpus, cnt, rb)
            return
        # expected value: with one seed, (h % n0, h % n1) is uniform over the index pairs that agree
        # modulo gcd(n0, n1) (mix64 modelled as uniform); with two seeds, independent
        g = math.gcd(n0, n1) if same_seed else 1
        for r in range(g):
            u = np.bincount(c0.gpus[r::g], minlength=G) * (Z / g / len(range(r, n0, g)))
            v = np.bincount(c1.gpus[r::g], minlength=G) / len(range(r, n1, g))
            acc.product(u.astype(np.float64), v.astype(np.float64), rb)
        return
    # range <-> hash: expected value, hash owners independent of the position
    if c0.kind == "range":
        u, _ = _cold_mass(c0, S, H, G)
        v = np.bincount(c1.gpus, minlength=G) / n1
    else:
        u = np.bincount(c0.gpus, minlength=G) / n0
        v, _ = _cold_mass(c1, S, H, G)
    acc.product(u.astype(np.float64), v.astype(np.float64), rb)


def _column_moves(c0: ColdSharding, c1: ColdSharding, S: np.ndarray, H: int, G: int, acc: _Acc,
                  rb: float) -> None:
    """Cold rows (all but ``S``) when column shards come or go: a table-level move. Every GPU
    receives the column slices of the cold rows it holds afterwards from the GPUs that held them
    (a slice a GPU already holds stays). Rows are fractions: ``w / D`` of a row per shard of
    ``w`` columns."""
    Z = H - S.size
    if c0.kind == "columns" and c1.kind == "columns":
        o0, o1 = c0.column_offsets, c1.column_offsets
        lo = np.maximum(o0[:-1, None], o1[None, :-1])
        hi = np.minimum(o0[1:, None], o1[None, 1:])
        overlap = np.maximum(hi - lo, 0) / float(o0[-1])       # [old shard, new shard]
        src = np.repeat(c0.gpus, c1.gpus.size)
        acc.pairs(src, np.tile(c1.gpus, c0.gpus.size), (Z * overlap).ravel(), rb)
        return
    # rows to or from one owner each: that owner sends or receives every shard's slice
    cols, rows = (c0, c1) if c0.kind == "columns" else (c1, c0)
    mass, exact = _cold_mass(rows, S, H, G)                     # rows per owner GPU
    share = cols.widths / cols.widths.sum()
    owners = np.flatnonzero(mass)
    shard = np.repeat(cols.gpus, owners.size)
    owner = np.tile(owners, cols.gpus.size)
    w = (share[:, None] * mass[None, owners]).ravel()
    if c0.kind == "columns":
        acc.pairs(shard, owner, w, rb)
    else:
        acc.pairs(owner, shard, w, rb)
    acc.exact &= exact


def _row_moves(td: "TableDelta", topo: Topology, acc: _Acc, rb: float) -> None:
    """Rows whose placement code changes (``td.ids``): from their old holders to their new ones.
    A cold row of column shards is held in slices: one move per shard, ``w / D`` of the row."""
    c0, c1 = td.cold_old, td.cold_new
    oh = _holder_codes(td.ids, td.old_codes, c0, topo)
    nh = _holder_codes(td.ids, td.new_codes, c1, topo)
    old_col = (td.old_codes == COLD_CODE) & (c0.kind == "columns")
    new_col = (td.new_codes == COLD_CODE) & (c1.kind == "columns")
    plain = ~(old_col | new_col)
    parts = [(oh[plain], nh[plain], np.ones(int(plain.sum())))]
    for mask, cold, old_side in ((old_col, c0, True), (new_col, c1, False)):
        k = np.flatnonzero(mask)
        if not k.size:
            continue
        slices = np.tile(cold.gpus.astype(np.int64), k.size)
        share = np.tile(cold.widths / cold.widths.sum(), k.size)
        other = np.repeat((nh if old_side else oh)[k], cold.gpus.size)
        parts.append((slices, other, share) if old_side else (other, slices, share))
    acc.holders(*(np.concatenate(x) for x in zip(*parts)), rb)


# ============================================================================ TableDelta
class TierMoves(NamedTuple):
    """Rows changing placement: ``ids`` (int64), ``old_tier`` / ``new_tier`` (int8, index into
    :data:`TIERS`), ``old_place`` / ``new_place`` (int32: local GPU for node replicas, GPU for
    placed rows, -1 for global and cold)."""

    ids: np.ndarray
    old_tier: np.ndarray
    new_tier: np.ndarray
    old_place: np.ndarray
    new_place: np.ndarray


@dataclass(frozen=True, eq=False)
class TableDelta:
    """The change of one table.

    table : EmbeddingTable          the same in both plans
    cold_old, cold_new : ColdSharding
    ids : int64[k]                  rows whose placement code changes, sorted, unique
    old_codes, new_codes : int32[k] their codes before / after (module docstring; COLD_CODE = cold)
    kept_ids, kept_codes : int64[j], int32[j] or None
        only when the cold function changes: rows explicitly placed in both plans, unchanged (needed
        to count the cold rows that change owner)
    extra_old, extra_new : dict     other TablePlan fields that change (e.g. ``hbm_fraction``)
    host_transfer : float64[G] or None
        expected bytes each GPU moves between HBM and host memory (``hbm_fraction`` changed)
    """

    table: EmbeddingTable
    cold_old: ColdSharding
    cold_new: ColdSharding
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    old_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    new_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    kept_ids: np.ndarray | None = None
    kept_codes: np.ndarray | None = None
    extra_old: dict = field(default_factory=dict)
    extra_new: dict = field(default_factory=dict)
    host_transfer: np.ndarray | None = None

    def __post_init__(self) -> None:
        t = self.table
        for a, dt in (("ids", np.int64), ("old_codes", np.int32), ("new_codes", np.int32)):
            object.__setattr__(self, a, np.ascontiguousarray(getattr(self, a), dtype=dt).ravel())
        ids = self.ids
        if not (self.old_codes.size == self.new_codes.size == ids.size):
            raise ConfigError(f"table {t.name!r}: {ids.size} ids, {self.old_codes.size} old codes, "
                              f"{self.new_codes.size} new codes")
        if ids.size and (np.any(ids[1:] <= ids[:-1]) or ids[0] < 0 or ids[-1] >= t.num_rows):
            raise ConfigError(f"table {t.name!r}: delta ids must be sorted, unique, in "
                              f"[0, {t.num_rows})")
        if np.any(self.old_codes == self.new_codes):
            raise ConfigError(f"table {t.name!r}: delta lists rows that do not change: "
                              f"{_ex(ids[self.old_codes == self.new_codes])}")
        if (self.kept_ids is None) != (self.kept_codes is None):
            raise ConfigError(f"table {t.name!r}: kept_ids and kept_codes go together")
        if self.kept_ids is not None:
            k = np.ascontiguousarray(self.kept_ids, dtype=np.int64).ravel()
            kc = np.ascontiguousarray(self.kept_codes, dtype=np.int32).ravel()
            if k.size != kc.size or (k.size and (np.any(k[1:] <= k[:-1]) or k[0] < 0
                                                  or k[-1] >= t.num_rows)) \
                    or np.any(kc == COLD_CODE) or np.intersect1d(k, ids).size:
                raise ConfigError(f"table {t.name!r}: kept rows must be sorted, unique, in range, "
                                  f"explicitly placed and disjoint from the changed rows")
            object.__setattr__(self, "kept_ids", k)
            object.__setattr__(self, "kept_codes", kc)
        if not self.cold_changed and self.kept_ids is not None:
            object.__setattr__(self, "kept_ids", None)
            object.__setattr__(self, "kept_codes", None)
        if self.cold_changed and self.kept_ids is None:
            raise ConfigError(f"table {t.name!r}: a cold sharding change needs the kept rows")
        if set(self.extra_old) != set(self.extra_new):
            raise ConfigError(f"table {t.name!r}: extra fields before / after differ")
        unknown = sorted(set(self.extra_old) - set(_extra_field_names()))
        if unknown:
            raise ConfigError(f"table {t.name!r}: fields {unknown} are not TablePlan fields here "
                              f"(have {_extra_field_names()})")
        if self.host_transfer is not None:
            object.__setattr__(self, "host_transfer",
                               np.ascontiguousarray(self.host_transfer, np.float64).ravel())

    # ----------------------------------------------------------------- views
    @property
    def name(self) -> str:
        return self.table.name

    @property
    def cold_changed(self) -> bool:
        return not _same_cold(self.cold_old, self.cold_new)

    @property
    def is_empty(self) -> bool:
        return self.ids.size == 0 and not self.cold_changed and not self.extra_old

    def moves(self, old: str | None = None, new: str | None = None) -> TierMoves:
        """Rows changing placement, optionally only those from tier ``old`` and / or to ``new``."""
        ot, nt = _tier_index(self.old_codes), _tier_index(self.new_codes)
        m = np.ones(self.ids.size, bool)
        if old is not None:
            m &= ot == TIERS.index(old)
        if new is not None:
            m &= nt == TIERS.index(new)
        return TierMoves(self.ids[m], ot[m], nt[m], _place(self.old_codes[m]),
                         _place(self.new_codes[m]))

    def entered(self, tier: str) -> np.ndarray:
        """IDs in ``tier`` after but not before."""
        i = TIERS.index(tier)
        return self.ids[(_tier_index(self.new_codes) == i) & (_tier_index(self.old_codes) != i)]

    def left(self, tier: str) -> np.ndarray:
        """IDs in ``tier`` before but not after."""
        i = TIERS.index(tier)
        return self.ids[(_tier_index(self.old_codes) == i) & (_tier_index(self.new_codes) != i)]

    def counts(self) -> dict[str, Any]:
        """Per tier rows added / removed / relocated (same tier, other GPU); promoted (to a hotter
        tier, order global > node > placed > cold), demoted, and all rows changed."""
        ot, nt = _tier_index(self.old_codes), _tier_index(self.new_codes)
        out: dict[str, Any] = {}
        for i, t in enumerate(TIERS):
            out[t] = {"added": int(np.sum((nt == i) & (ot != i))),
                      "removed": int(np.sum((ot == i) & (nt != i))),
                      "relocated": int(np.sum((ot == i) & (nt == i)))}
        out["promoted"] = int(np.sum(nt < ot))
        out["demoted"] = int(np.sum(nt > ot))
        out["relocated"] = int(np.sum(nt == ot))
        out["rows_changed"] = int(self.ids.size)
        return out

    # ----------------------------------------------------------------- algebra
    def invert(self) -> TableDelta:
        return TableDelta(self.table, self.cold_new, self.cold_old, self.ids, self.new_codes,
                          self.old_codes, self.kept_ids, self.kept_codes, dict(self.extra_new),
                          dict(self.extra_old), self.host_transfer)

    def then(self, nxt: TableDelta) -> TableDelta:
        """This change followed by ``nxt`` (``nxt``'s base must be this change's target)."""
        a, b = self, nxt
        u = np.union1d(a.ids, b.ids)
        ia, ib = np.isin(u, a.ids), np.isin(u, b.ids)
        old = np.where(ia, _lookup(a.ids, a.old_codes, u), _lookup(b.ids, b.old_codes, u))
        new = np.where(ib, _lookup(b.ids, b.new_codes, u), _lookup(a.ids, a.new_codes, u))
        ch = old != new
        kept_ids = kept_codes = None
        if not _same_cold(a.cold_old, b.cold_new):
            # rows explicitly placed, unchanged, from the base of a to the target of b
            both = u[ia & ib & (old == new) & (old != COLD_CODE)]
            base = (b.kept_ids, b.kept_codes, a.ids) if b.kept_ids is not None \
                else (a.kept_ids, a.kept_codes, b.ids)
            keep = ~np.isin(base[0], base[2])
            kept_ids = np.concatenate([base[0][keep], both])
            kept_codes = np.concatenate([base[1][keep], _lookup(u, old, both)])
            o = np.argsort(kept_ids, kind="stable")
            kept_ids, kept_codes = kept_ids[o], kept_codes[o]
        eo, en = {}, {}
        for f in list(a.extra_old) + [f for f in b.extra_old if f not in a.extra_old]:
            vo = a.extra_old[f] if f in a.extra_old else b.extra_old[f]
            vn = b.extra_new[f] if f in b.extra_new else a.extra_new[f]
            if not _same(vo, vn):
                eo[f], en[f] = vo, vn
        host = None
        if "hbm_fraction" in eo:  # estimate: the steps' transfers added up
            parts = [d.host_transfer for d in (a, b) if d.host_transfer is not None]
            host = np.sum(parts, axis=0) if parts else None
        return TableDelta(a.table, a.cold_old, b.cold_new, u[ch], old[ch], new[ch], kept_ids,
                          kept_codes, eo, en, host)

    # ----------------------------------------------------------------- apply
    def _check_base(self, tp: TablePlan) -> None:
        n = self.name
        if tp.table != self.table:
            raise IncompatibleError(f"delta does not apply: table {n!r} is defined differently")
        if not _same_cold(tp.cold, self.cold_old):
            raise IncompatibleError(
                f"delta does not apply: table {n!r} has cold sharding {tp.cold.to_dict()}, the "
                f"delta's base has {self.cold_old.to_dict()}")
        for f, v in self.extra_old.items():
            if not _same(getattr(tp, f), v):
                raise IncompatibleError(f"delta does not apply: table {n!r} field {f!r} differs "
                                        f"from the delta's base")
        bi, bc = _special(tp)
        for ids, codes, what in ((self.ids, self.old_codes, "changed"),
                                 (self.kept_ids, self.kept_codes, "kept")):
            if ids is None or not ids.size:
                continue
            cur = _lookup(bi, bc, ids)
            bad = np.flatnonzero(cur != codes)
            if bad.size:
                j = int(bad[0])
                raise IncompatibleError(
                    f"delta does not apply: table {n!r} row {int(ids[j])} is {_describe(cur[j])} "
                    f"but the delta's base has it {_describe(codes[j])} ({bad.size} {what} rows "
                    f"differ: {_ex(ids[bad])})")

    def _apply(self, tp: TablePlan) -> TablePlan:
        if self.is_empty:
            return tp
        bi, bc = _special(tp)
        keep = np.ones(bi.size, bool)
        if bi.size and self.ids.size:
            pos = np.minimum(np.searchsorted(bi, self.ids), bi.size - 1)
            hit = bi[pos] == self.ids
            keep[pos[hit]] = False
        add = self.new_codes != COLD_CODE
        ids = np.concatenate([bi[keep], self.ids[add]])
        codes = np.concatenate([bc[keep], self.new_codes[add]])
        o = np.argsort(ids, kind="stable")
        ids, codes = ids[o], codes[o]
        g, nd, pl = codes == -1, (codes <= -2) & (codes != COLD_CODE), codes >= 0
        kw = {f.name: getattr(tp, f.name) for f in dataclasses.fields(tp) if f.init}
        kw.update(cold=self.cold_new, global_ids=ids[g], node_ids=ids[nd],
                  node_local=(-2 - codes[nd]).astype(np.int32), placed_ids=ids[pl],
                  placed_gpus=codes[pl].astype(np.int32))
        kw.update({f: _copy(v) for f, v in self.extra_new.items()})
        return type(tp)(**kw)

    # ----------------------------------------------------------------- migration
    def _migration(self, topo: Topology) -> _Acc:
        acc = _Acc(topo)
        rb = float(self.table.row_bytes)
        c0, c1 = self.cold_old, self.cold_new
        if self.ids.size:
            _row_moves(self, topo, acc, rb)
        if self.cold_changed:
            if self.kept_ids.size and (c0.kind == "replicated") != (c1.kind == "replicated"):
                acc.holders(_holder_codes(self.kept_ids, self.kept_codes, c0, topo),
                            _holder_codes(self.kept_ids, self.kept_codes, c1, topo),
                            np.ones(self.kept_ids.size), rb)
            _cold_moves(self, topo, acc, rb)
        return acc

    def _equal(self, o: TableDelta) -> bool:
        def arr_eq(x, y):
            return (x is None and y is None) or (x is not None and y is not None
                                                 and np.array_equal(x, y))
        return (self.table == o.table and _same_cold(self.cold_old, o.cold_old)
                and _same_cold(self.cold_new, o.cold_new) and np.array_equal(self.ids, o.ids)
                and np.array_equal(self.old_codes, o.old_codes)
                and np.array_equal(self.new_codes, o.new_codes)
                and arr_eq(self.kept_ids, o.kept_ids) and arr_eq(self.kept_codes, o.kept_codes)
                and set(self.extra_old) == set(o.extra_old)
                and all(_same(self.extra_old[f], o.extra_old[f])
                        and _same(self.extra_new[f], o.extra_new[f]) for f in self.extra_old)
                and arr_eq(self.host_transfer, o.host_transfer))


def _table_between(to: TablePlan, tn: TablePlan, topo: Topology) -> TableDelta:
    oi, oc = _special(to)
    ni, nc = _special(tn)
    u = np.union1d(oi, ni)
    ocu, ncu = _lookup(oi, oc, u), _lookup(ni, nc, u)
    ch = ocu != ncu
    kept_ids = kept_codes = None
    if not _same_cold(to.cold, tn.cold):
        kept_ids, kept_codes = u[~ch], ocu[~ch]
    eo, en = {}, {}
    for f in _extra_field_names():
        a, b = getattr(to, f), getattr(tn, f)
        if not _same(a, b):
            eo[f], en[f] = _copy(a), _copy(b)
    host = None
    if "hbm_fraction" in eo:
        host = np.abs(_host_bytes(tn, topo) - _host_bytes(to, topo))
    return TableDelta(to.table, to.cold, tn.cold, u[ch], ocu[ch], ncu[ch], kept_ids, kept_codes,
                      eo, en, host)


# ============================================================================ PlanDelta
@dataclass(frozen=True, eq=False)
class PlanDelta:
    """How to go from the plan with fingerprint ``base_fingerprint`` to the one with
    ``target_fingerprint``: one :class:`TableDelta` per table (plan order), strategy and meta before
    and after. Build with :meth:`between`; use :meth:`apply`, :meth:`invert`, :meth:`then`."""

    base_fingerprint: str
    target_fingerprint: str
    topology: Topology
    strategy_old: str
    strategy_new: str
    meta_old: dict
    meta_new: dict
    tables: dict[str, TableDelta]

    def __post_init__(self) -> None:
        G, M = self.topology.num_gpus, self.topology.gpus_per_node
        for name, td in self.tables.items():
            if name != td.name:
                raise ConfigError(f"table delta {td.name!r} listed under {name!r}")
            for c in (td.cold_old, td.cold_new):
                if c.gpus.size and (c.gpus.min() < 0 or c.gpus.max() >= G):
                    raise ConfigError(f"table {name!r}: cold GPUs outside [0, {G})")
            for codes in (td.old_codes, td.new_codes, td.kept_codes):
                if codes is None or not codes.size:
                    continue
                c = codes[codes != COLD_CODE]
                if c.size and (c.min() < -1 - M or c.max() >= G):
                    raise ConfigError(f"table {name!r}: placement codes outside the topology "
                                      f"({G} GPUs, {M} per node)")
            if td.host_transfer is not None and td.host_transfer.size != G:
                raise ConfigError(f"table {name!r}: host_transfer needs {G} values")

    # ----------------------------------------------------------------- build
    @classmethod
    def between(cls, old: Plan, new: Plan) -> PlanDelta:
        """The delta from ``old`` to ``new`` (same topology, same tables in the same order, else
        IncompatibleError naming what differs)."""
        _check_same_layout(old, new, "PlanDelta.between")
        tds = {n: _table_between(old.tables[n], new.tables[n], old.topology) for n in old.tables}
        return cls(plan_fingerprint(old), plan_fingerprint(new), old.topology, old.strategy,
                   new.strategy, copy.deepcopy(old.meta), copy.deepcopy(new.meta), tds)

    @property
    def is_empty(self) -> bool:
        """Nothing changes (the base and target plans have the same content)."""
        return self.base_fingerprint == self.target_fingerprint and \
            all(td.is_empty for td in self.tables.values())

    def __bool__(self) -> bool:
        return not self.is_empty

    def changed_tables(self) -> list[str]:
        return [n for n, td in self.tables.items() if not td.is_empty]

    # ----------------------------------------------------------------- apply
    def check_base(self, plan: Plan) -> None:
        """Raise IncompatibleError unless ``plan`` is this delta's base (rows where the delta says
        they are, then the sha256 fingerprint of the whole content)."""
        if not isinstance(plan, Plan):
            raise TypeError(f"PlanDelta.apply needs a Plan, got {type(plan).__name__}")
        if plan.topology != self.topology:
            raise IncompatibleError(f"delta does not apply: the topologies differ "
                                    f"({_topology_diff(self.topology, plan.topology)})")
        if list(plan.tables) != list(self.tables):
            raise IncompatibleError(f"delta does not apply: the plan has tables "
                                    f"{list(plan.tables)}, the delta's base {list(self.tables)}")
        for n, td in self.tables.items():
            td._check_base(plan.tables[n])
        fp = plan_fingerprint(plan)
        if fp != self.base_fingerprint:
            what = []
            if plan.strategy != self.strategy_old:
                what.append(f"strategy {plan.strategy!r}, expected {self.strategy_old!r}")
            if _meta_json(plan.meta) != _meta_json(self.meta_old):
                what.append("meta differs")
            raise IncompatibleError(
                f"delta does not apply: the plan is not the delta's base (fingerprint "
                f"{fp[:16]}..., expected {self.base_fingerprint[:16]}...; "
                f"{'; '.join(what) or 'rows or fields the delta does not change differ'})")

    def apply(self, plan: Plan) -> Plan:
        """The target plan (a new Plan; ``plan`` is not modified; unchanged tables are shared).
        Raises IncompatibleError when ``plan`` is not the delta's base."""
        self.check_base(plan)
        tps = [self.tables[n]._apply(tp) for n, tp in plan.tables.items()]
        out = Plan(self.strategy_new, plan.topology, tps, copy.deepcopy(self.meta_new))
        fp = plan_fingerprint(out)
        if fp != self.target_fingerprint:
            raise IncompatibleError(f"delta is inconsistent: the result's fingerprint {fp[:16]}... "
                                    f"is not the target's {self.target_fingerprint[:16]}...")
        return out

    # ----------------------------------------------------------------- algebra
    def invert(self) -> PlanDelta:
        """The delta from the target back to the base."""
        return PlanDelta(self.target_fingerprint, self.base_fingerprint, self.topology,
                         self.strategy_new, self.strategy_old, copy.deepcopy(self.meta_new),
                         copy.deepcopy(self.meta_old),
                         {n: td.invert() for n, td in self.tables.items()})

    def then(self, nxt: PlanDelta) -> PlanDelta:
        """This delta followed by ``nxt``: one delta from this base to ``nxt``'s target (its
        migration is the direct one, not the sum of the steps)."""
        if self.target_fingerprint != nxt.base_fingerprint:
            raise IncompatibleError(
                f"cannot compose: the second delta's base ({nxt.base_fingerprint[:16]}...) is not "
                f"the first delta's target ({self.target_fingerprint[:16]}...)")
        if self.topology != nxt.topology or list(self.tables) != list(nxt.tables):
            raise IncompatibleError("cannot compose: topology or tables differ")
        return PlanDelta(self.base_fingerprint, nxt.target_fingerprint, self.topology,
                         self.strategy_old, nxt.strategy_new, copy.deepcopy(self.meta_old),
                         copy.deepcopy(nxt.meta_new),
                         {n: td.then(nxt.tables[n]) for n, td in self.tables.items()})

    # ----------------------------------------------------------------- migration
    @cached_property
    def _migration(self) -> dict[str, _Acc]:
        return {n: td._migration(self.topology) for n, td in self.tables.items()
                if not td.is_empty}

    @property
    def migration_send(self) -> np.ndarray:
        """Bytes each GPU sends, float64[G, 3], columns local / intra-node / inter-node."""
        out = np.zeros((self.topology.num_gpus, 3))
        for a in self._migration.values():
            out += a.send
        return out

    @property
    def migration_recv(self) -> np.ndarray:
        """Bytes each GPU receives, float64[G, 3], columns local / intra-node / inter-node."""
        out = np.zeros((self.topology.num_gpus, 3))
        for a in self._migration.values():
            out += a.recv
        return out

    @property
    def send_bytes_per_gpu(self) -> np.ndarray:
        """Bytes each GPU sends (float64[G])."""
        return self.migration_send.sum(axis=1)

    @property
    def recv_bytes_per_gpu(self) -> np.ndarray:
        """Bytes each GPU receives (float64[G])."""
        return self.migration_recv.sum(axis=1)

    @property
    def migration_bytes(self) -> float:
        """Bytes moved between GPUs in all (each copy counted once, at its destination)."""
        return float(self.migration_recv.sum())

    @property
    def migration_bytes_by_class(self) -> dict[str, float]:
        """Bytes moved per link class (``local`` is always 0: a row already held is not moved)."""
        r = self.migration_recv.sum(axis=0)
        return {c: float(r[i]) for i, c in enumerate(CLASS_NAMES)}

    @property
    def rows_moved(self) -> float:
        """Rows that at least one GPU must receive (expected value where hashes are involved)."""
        return float(sum(a.rows for a in self._migration.values()))

    @property
    def migration_exact(self) -> bool:
        """False when some hash-sharded cold change was counted by its expected value."""
        return all(a.exact for a in self._migration.values())

    @property
    def host_transfer_bytes_per_gpu(self) -> np.ndarray:
        """Expected bytes each GPU moves between HBM and host memory (``hbm_fraction`` changes),
        float64[G]."""
        out = np.zeros(self.topology.num_gpus)
        for td in self.tables.values():
            if td.host_transfer is not None:
                out += td.host_transfer
        return out

    def migration_time_s(self, topology: Topology | None = None, *, overlap: bool = True) -> float:
        """Seconds until the slowest GPU has sent and received its bytes.

        ``overlap=True`` (cost.py's ``_a2a_time`` convention): per GPU the max of intra bytes /
        intra_bw and inter bytes / inter_bw, sent and received (links in parallel).
        ``overlap=False``: intra bytes / intra_bw + inter bytes / inter_bw (links in series), max of
        send and receive. HBM <-> host transfers add ``bytes / uvm_bw``."""
        topo = topology or self.topology
        if topo.num_gpus != self.topology.num_gpus:
            raise IncompatibleError(f"migration_time_s: {topo.num_gpus} GPUs, the delta has "
                                    f"{self.topology.num_gpus}")
        s, r = self.migration_send, self.migration_recv
        host = self.host_transfer_bytes_per_gpu / topo.uvm_bw
        if overlap:
            t = np.maximum.reduce([s[:, 1] / topo.intra_bw, s[:, 2] / topo.inter_bw,
                                   r[:, 1] / topo.intra_bw, r[:, 2] / topo.inter_bw, host])
        else:
            t = np.maximum(s[:, 1] / topo.intra_bw + s[:, 2] / topo.inter_bw,
                           r[:, 1] / topo.intra_bw + r[:, 2] / topo.inter_bw) + host
        return float(t.max()) if t.size else 0.0

    def table_migration(self, name: str) -> dict[str, Any]:
        """One table's migration: ``send`` / ``recv`` (float64[G, 3] bytes), ``bytes``,
        ``rows_moved``, ``exact``."""
        td = self.tables[name]
        a = self._migration.get(name) or _Acc(self.topology)
        return {"send": a.send.copy(), "recv": a.recv.copy(), "bytes": float(a.recv.sum()),
                "rows_moved": a.rows, "exact": a.exact,
                "host_transfer_bytes": float(td.host_transfer.sum())
                if td.host_transfer is not None else 0.0}

    # ----------------------------------------------------------------- summary
    def summary(self) -> dict[str, Any]:
        """A JSON-able report: per changed table the tier counts (added / removed / relocated),
        promoted / demoted rows, cold and field changes, migration bytes; totals for the delta."""
        tables: dict[str, Any] = {}
        tot = {"rows_changed": 0, "promoted": 0, "demoted": 0, "relocated": 0}
        tiers = {t: {"added": 0, "removed": 0, "relocated": 0} for t in TIERS}
        for n in self.changed_tables():
            td = self.tables[n]
            c = td.counts()
            m = self.table_migration(n)
            r = m["recv"].sum(axis=0)
            e = {**c, "cold_changed": td.cold_changed,
                 "migration_bytes": m["bytes"],
                 "migration_bytes_by_class": {k: float(r[i]) for i, k in enumerate(CLASS_NAMES)},
                 "rows_moved": m["rows_moved"], "exact": m["exact"]}
            if td.cold_changed:
                e["cold"] = {"old": _cold_brief(td.cold_old), "new": _cold_brief(td.cold_new)}
            if td.extra_old:
                e["changed_fields"] = list(td.extra_old)
            if td.host_transfer is not None:
                e["host_transfer_bytes"] = m["host_transfer_bytes"]
            tables[n] = e
            for k in tot:
                tot[k] += c[k]
            for t in TIERS:
                for k in tiers[t]:
                    tiers[t][k] += c[t][k]
        totals = {"tables": len(self.tables), "tables_changed": len(tables), **tot, **tiers,
                  "migration_bytes": self.migration_bytes,
                  "migration_bytes_by_class": self.migration_bytes_by_class,
                  "rows_moved": self.rows_moved, "migration_time_s": self.migration_time_s(),
                  "host_transfer_bytes": float(self.host_transfer_bytes_per_gpu.sum()),
                  "exact": self.migration_exact}
        out: dict[str, Any] = {"base": self.base_fingerprint, "target": self.target_fingerprint,
                               "empty": self.is_empty}
        if self.strategy_old != self.strategy_new:
            out["strategy"] = {"old": self.strategy_old, "new": self.strategy_new}
        out["meta_changed"] = _meta_json(self.meta_old) != _meta_json(self.meta_new)
        out["tables"] = tables
        out["totals"] = totals
        return out

    # ----------------------------------------------------------------- equality
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanDelta):
            return NotImplemented
        return (self.base_fingerprint == other.base_fingerprint
                and self.target_fingerprint == other.target_fingerprint
                and self.topology == other.topology and self.strategy_old == other.strategy_old
                and self.strategy_new == other.strategy_new
                and _meta_json(self.meta_old) == _meta_json(other.meta_old)
                and _meta_json(self.meta_new) == _meta_json(other.meta_new)
                and list(self.tables) == list(other.tables)
                and all(td._equal(other.tables[n]) for n, td in self.tables.items()))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        rows = sum(td.ids.size for td in self.tables.values())
        return (f"PlanDelta({self.base_fingerprint[:12]} -> {self.target_fingerprint[:12]}, "
                f"{len(self.changed_tables())}/{len(self.tables)} tables changed, {rows} rows)")

    # ----------------------------------------------------------------- files
    def to_bytes(self) -> bytes:
        """The delta in the project's checksummed container (kind ``plan_delta``)."""
        arrays: dict[str, np.ndarray] = {}
        tabs = []
        for i, td in enumerate(self.tables.values()):
            p = f"t{i}."
            arrays[p + "ids"], arrays[p + "old"], arrays[p + "new"] = \
                td.ids, td.old_codes, td.new_codes
            e: dict[str, Any] = {"table": dataclasses.asdict(td.table),
                                 "cold_old": td.cold_old.to_dict(),
                                 "cold_new": td.cold_new.to_dict(),
                                 "kept": td.kept_ids is not None,
                                 "host_transfer": td.host_transfer is not None, "extra": {}}
            if td.kept_ids is not None:
                arrays[p + "kept_ids"], arrays[p + "kept_codes"] = td.kept_ids, td.kept_codes
            if td.host_transfer is not None:
                arrays[p + "host"] = td.host_transfer
            for f in td.extra_old:
                e["extra"][f] = {}
                for side, v in (("old", td.extra_old[f]), ("new", td.extra_new[f])):
                    if isinstance(v, np.ndarray):
                        key = f"{p}x.{f}.{side}"
                        arrays[key] = v
                        e["extra"][f][side] = {"array": key}
                    else:
                        e["extra"][f][side] = {"value": _meta_json(v)}
            tabs.append(e)
        meta = {"delta_version": DELTA_VERSION, "base_fingerprint": self.base_fingerprint,
                "target_fingerprint": self.target_fingerprint,
                "strategy_old": self.strategy_old, "strategy_new": self.strategy_new,
                "meta_old": _meta_json(self.meta_old), "meta_new": _meta_json(self.meta_new),
                "topology": self.topology.to_dict(), "tables": tabs}
        try:
            return pack(DELTA_KIND, meta, arrays)
        except TypeError as e:
            raise ConfigError(f"PlanDelta.to_bytes: not serializable ({e})") from None

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> PlanDelta:
        """Decode :meth:`to_bytes`; raises FormatError naming ``source`` when damaged or foreign."""
        header, arrays = unpack(data, DELTA_KIND, source)
        return cls._decode(header, arrays, source)

    @classmethod
    def _decode(cls, h: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                source: str) -> PlanDelta:
        v = h.get("delta_version") if isinstance(h, Mapping) else None
        if v != DELTA_VERSION:
            raise FormatError(f"{source}: plan delta version {v!r} is not supported (this "
                              f"flexshard_stream reads version {DELTA_VERSION})")
        try:
            topo = Topology.from_dict(h["topology"], source=source)
            tds: dict[str, TableDelta] = {}
            for i, e in enumerate(h["tables"]):
                p = f"t{i}."
                extra_old, extra_new = {}, {}
                for f, sides in e["extra"].items():
                    for side, dst in (("old", extra_old), ("new", extra_new)):
                        s = sides[side]
                        dst[f] = arrays[s["array"]].copy() if "array" in s else s["value"]
                td = TableDelta(EmbeddingTable(**e["table"]), ColdSharding.from_dict(e["cold_old"]),
                                ColdSharding.from_dict(e["cold_new"]), arrays[p + "ids"],
                                arrays[p + "old"], arrays[p + "new"],
                                arrays[p + "kept_ids"] if e["kept"] else None,
                                arrays[p + "kept_codes"] if e["kept"] else None,
                                extra_old, extra_new,
                                arrays[p + "host"] if e["host_transfer"] else None)
                if td.name in tds:
                    raise ValueError(f"table {td.name!r} twice")
                tds[td.name] = td
            return cls(str(h["base_fingerprint"]), str(h["target_fingerprint"]), topo,
                       str(h["strategy_old"]), str(h["strategy_new"]), dict(h["meta_old"]),
                       dict(h["meta_new"]), tds)
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise FormatError(f"{source}: inconsistent plan delta ({type(e).__name__}: {e})") \
                from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file, fsync, read back and verify, rename)."""
        data = self.to_bytes()
        if PlanDelta.from_bytes(data, str(path)) != self:
            raise FormatError(f"{path}: verification failed: the delta does not decode to itself")
        return write_atomic(path, data, verify_kind=DELTA_KIND)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PlanDelta:
        """Read and verify a delta file; raises FormatError naming the file."""
        header, arrays = read_file(path, DELTA_KIND)
        return cls._decode(header, arrays, str(path))


def compose(*deltas: PlanDelta) -> PlanDelta:
    """``compose(d1, d2, ...)``: d1, then d2, ... as one delta (each base the previous target)."""
    if not deltas:
        raise ConfigError("compose needs at least one delta")
    out = deltas[0]
    for d in deltas[1:]:
        out = out.then(d)
    return out


# ============================================================================ migration cost
#: Seconds a training job stalls per applied delta, whatever the delta moves: the steps stop at a
#: barrier, the sharded modules are rebuilt and the pipeline refills (docs/RESHARDER.md, "The
#: pause", gives the reasoning and the TorchRec measurement).
DEFAULT_PAUSE_S = 0.25


@dataclass(frozen=True)
class MigrationCost:
    """What applying plan deltas costs a training job (seconds, bytes).

    bytes : float         rows and their optimizer state moved between GPUs (counted at their
                          destinations, :attr:`PlanDelta.migration_bytes`)
    transfer_s : float    seconds the moves take: per delta, the slowest GPU's send and receive
                          over its links at the topology's bandwidths
                          (:meth:`PlanDelta.migration_time_s`, the cost model's all-to-all rule)
    pause_s : float       the fixed stall of applying a new sharding, once per non-empty delta
    deltas : int          non-empty deltas priced
    """

    bytes: float = 0.0
    transfer_s: float = 0.0
    pause_s: float = 0.0
    deltas: int = 0

    @property
    def total_s(self) -> float:
        """Transfer plus pauses (seconds)."""
        return self.transfer_s + self.pause_s

    def __add__(self, other: MigrationCost) -> MigrationCost:
        if not isinstance(other, MigrationCost):
            return NotImplemented
        return MigrationCost(self.bytes + other.bytes, self.transfer_s + other.transfer_s,
                             self.pause_s + other.pause_s, self.deltas + other.deltas)

    def to_json(self) -> dict[str, float]:
        """``{"bytes", "transfer_s", "pause_s", "total_s", "deltas"}``."""
        return {"bytes": self.bytes, "transfer_s": self.transfer_s, "pause_s": self.pause_s,
                "total_s": self.total_s, "deltas": self.deltas}


def check_pause(pause_s: Any, where: str = "pause_s") -> float:
    """``pause_s`` as a float of seconds; ConfigError naming ``where`` unless finite and >= 0."""
    try:
        value = float(pause_s)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number of seconds >= 0, got {pause_s!r}") from None
    if isinstance(pause_s, bool) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{where} must be a number of seconds >= 0, got {pause_s!r}")
    return value


def migration_cost(delta: PlanDelta | None, pause_s: float = DEFAULT_PAUSE_S,
                   topology: Topology | None = None) -> MigrationCost:
    """What a training job pays to apply ``delta``: its bytes at the ``topology``'s bandwidths
    (default the delta's; :meth:`PlanDelta.migration_time_s`) plus ``pause_s`` seconds. An empty
    delta (or None) costs nothing, not even the pause: nothing is applied.

    Raises ConfigError for a negative or non-finite ``pause_s``, IncompatibleError for a
    topology with another number of GPUs than the delta's.
    """
    pause = check_pause(pause_s)
    if delta is None or not delta:
        return MigrationCost()
    return MigrationCost(float(delta.migration_bytes), float(delta.migration_time_s(topology)),
                         pause, 1)


def _meta_json(x: Any) -> Any:
    """JSON values for digests and comparisons (non-finite floats kept)."""
    return jsonable(x, nonfinite_as_none=False)
