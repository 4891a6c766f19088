"""The cost evaluator: brute-force references of both execution profiles, conservation,
hand-computed cases, analytic vs trace. Figures of the ``ideal`` profile are those the evaluator
gave before profiles existed (pinned here with ``profile="ideal"``); the ``torchrec`` profile is
checked against a plain-Python reading of docs/TORCHREC_RUNTIME.md here and against TorchRec
itself in tests/test_cost_runtime.py."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexshard_stream import Batch, BatchError, TableStats
from flexshard_stream.placement.baselines import (
    data_parallel,
    hugectr_hybrid,
    hugectr_threshold,
    row_wise,
    table_row_wise,
    table_wise,
)
from flexshard_stream.placement.cost import (
    TORCHREC_COMPONENTS,
    CostModel,
    evaluate_analytic,
    evaluate_trace,
)
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.plans.tables import DTYPE_BYTES, EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.summary import FrequencySummary

M64 = (1 << 64) - 1
IDEAL = CostModel(profile="ideal")


def mix64_py(x, seed):
    h = (x + seed * 0x9E3779B97F4A7C15) & M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    h ^= h >> 33
    return h


def owner_py(tp, rid, src, M):
    """Routing by the plan's definition, one ID at a time (reference)."""
    if tp.replicated or rid in set(tp.global_ids.tolist()):
        return src, "global"
    node = dict(zip(tp.node_ids.tolist(), tp.node_local.tolist()))
    if rid in node:
        return (src // M) * M + node[rid], ("node", node[rid])
    placed = dict(zip(tp.placed_ids.tolist(), tp.placed_gpus.tolist()))
    if rid in placed:
        return placed[rid], None
    c = tp.cold
    if c.kind == "columns":   # route() answers with the first shard's GPU
        return int(c.gpus[0]), None
    if c.kind == "hash":
        return int(c.gpus[mix64_py(rid, c.seed) % c.gpus.size]), None
    j = max(j for j in range(c.gpus.size) if c.bounds[j] <= rid) if rid >= c.bounds[0] else 0
    return int(c.gpus[min(j, c.gpus.size - 1)]), None


def owners_py(tp, rid, src, M):
    """Every (GPU, bytes of its share of the row) serving a lookup, and the tier: column shards
    serve a cold row together (reference)."""
    dst, tier = owner_py(tp, rid, src, M)
    if tp.cold.kind == "columns" and tier is None:
        e = DTYPE_BYTES[tp.table.dtype]
        return [(int(g), int(w) * e) for g, w in zip(tp.cold.gpus, tp.cold.widths)], tier
    return [(dst, tp.table.embedding_bytes)], tier


def brute_force(plan, batch, B, dedup, index_bytes=8):
    """A plain Python loop over every ID of one iteration: (index, forward, sync-bytes) reference
    of the ``ideal`` profile."""
    topo = plan.topology
    G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
    idx = np.zeros((G, G))
    fwd = np.zeros((G, G))
    s0 = 0.0
    s1 = np.zeros(M)
    by_feat = {tp.table.feature: tp for tp in plan.tables.values()}
    for k in batch.keys:
        tp = by_feat[k]
        eb = tp.table.embedding_bytes
        vals = batch.feature_values(k).tolist()
        lens = batch.feature_lengths(k).tolist()
        seen, touched0, touched1 = set(), set(), set()
        pos = 0
        for s, n in enumerate(lens):
            src = s // B
            owners = set()
            for rid in vals[pos:pos + n]:
                serving, tier = owners_py(tp, rid, src, M)
                if tier == "global":
                    touched0.add(rid)
                elif tier is not None:
                    touched1.add((rid, tier[1]))
                new = True
                if dedup and any(dst != src for dst, _ in serving):
                    new = (src, rid) not in seen
                    seen.add((src, rid))
                for dst, nbytes in serving:
                    if dst == src:
                        continue
                    if new:
                        idx[src, dst] += index_bytes
                        if tp.table.kind == "sequence":
                            fwd[dst, src] += nbytes
                    if tp.table.kind == "pooled" and dst not in owners:
                        owners.add(dst)
                        fwd[dst, src] += nbytes
            pos += n
        s0 += len(touched0) * eb
        for _, m in touched1:
            s1[m] += eb
    # hierarchical all-reduce, total bytes sent (written out from the formula)
    sync = 0.0
    if M > 1:
        sync += G * 2 * (M - 1) / M * s0
    if N > 1:
        sync += G * 2 * (N - 1) / N * s0 / M + N * sum(2 * (N - 1) / N * s1[m] for m in range(M))
    return idx, fwd, sync


def _torchrec_slots(tp, kind, topo):
    """GPUs receiving a slot of the table (lengths, B each), as TorchRec's input dist does."""
    G, M = topo.num_gpus, topo.gpus_per_node
    if kind == "table_wise":
        return [int(tp.cold.gpus[0])]
    if kind in ("column_wise", "table_column_wise"):
        return [int(g) for g in tp.cold.gpus]
    if kind == "row_wise":
        return list(range(G))
    node = int(tp.cold.gpus[0]) // M
    return list(range(node * M, (node + 1) * M))


def _pooled_outputs_py(tp, kind, topo, B, out):
    """Dense pooled outputs of one table, written out per (sender, receiver) (reference)."""
    G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
    eb, e = tp.table.embedding_bytes, DTYPE_BYTES[tp.table.dtype]
    if kind == "table_wise":
        out["pooled_all_to_all"][int(tp.cold.gpus[0]), :] += B * eb
    elif kind in ("column_wise", "table_column_wise"):
        for g, w in zip(tp.cold.gpus, tp.cold.widths):
            out["pooled_all_to_all"][int(g), :] += B * int(w) * e
    elif kind == "row_wise":   # reduce-scatter over the world: a [B, D] chunk to every rank
        out["pooled_reduce_scatter"][:, :] += B * eb
    else:                      # reduce-scatter in the node, then across nodes by local index
        node = int(tp.cold.gpus[0]) // M
        for a in range(node * M, (node + 1) * M):
            for b in range(G):
                if b // M == node:
                    out["pooled_reduce_scatter"][a, b] += N * B * eb
                if b % M == a % M:
                    out["pooled_all_to_all"][a, b] += B * eb


def brute_force_torchrec(plan, batch, B, dedup, index_bytes=8, length_bytes=8):
    """What TorchRec 1.8 sends in one iteration, per collective, one ID at a time (reference of
    the ``torchrec`` profile, from docs/TORCHREC_RUNTIME.md): {component: G x G bytes} and the
    data-parallel all-reduce buffer of every GPU."""
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    out = {c: np.zeros((G, G)) for c in TORCHREC_COMPONENTS[:-1]}
    groups, allreduce = set(), 0.0
    by_feat = {tp.table.feature: tp for tp in plan.tables.values()}
    for k in batch.keys:
        tp = by_feat[k]
        t = tp.table
        hot = set(tp.global_ids.tolist()) | set(tp.node_ids.tolist())
        kind = plan.sharding_kinds[tp.name]
        if kind == "data_parallel" or len(hot) == t.num_rows:
            allreduce += t.num_rows * t.embedding_bytes        # DDP: the whole table
            continue
        allreduce += len(hot) * t.embedding_bytes              # the exported hot table
        pooled = t.kind == "pooled"
        if not pooled:   # TorchRec runs these sequence kinds as row_wise / column_wise
            kind = {"table_row_wise": "row_wise",
                    "table_column_wise": "column_wise"}.get(kind, kind)
        groups.add((pooled, kind))
        for dst in _torchrec_slots(tp, kind, topo):
            out["input_lengths"][:, dst] += length_bytes * B
        vals = batch.feature_values(k).tolist()
        lens = batch.feature_lengths(k).tolist()
        seen, pos = set(), 0
        for s, n in enumerate(lens):
            src = s // B
            for rid in vals[pos:pos + n]:
                if rid in hot:
                    continue
                if dedup and not pooled:
                    if (src, rid) in seen:
                        continue
                    seen.add((src, rid))
                serving, _ = owners_py(tp, rid, src, M)
                for dst, nbytes in serving:
                    out["input_values"][src, dst] += index_bytes
                    if not pooled:
                        out["sequence_all_to_all"][dst, src] += nbytes
            pos += n
        if pooled:
            _pooled_outputs_py(tp, kind, topo, B, out)
    out["input_splits"][:, :] = 3 * 8 * len(groups)
    return out, allreduce


ALL_KINDS = ("hash", "range", "wrange", "replicated", "subset", "columns", "twcw", "twrw", "tw")


def _column_shards(draw, t, gpus):
    """Random widths (>= 1, summing to the dim) for column shards on some of ``gpus``."""
    n = draw(st.integers(1, min(len(gpus), t.dim)))
    cuts = sorted(draw(st.lists(st.integers(1, t.dim - 1), min_size=n - 1, max_size=n - 1,
                                unique=True))) if n > 1 else []
    return draw(st.permutations(gpus))[:n], np.diff([0, *cuts, t.dim])


def _cold_of(draw, kind, t, N, M):
    """(cold function, explicit sharding kind) of one drawn table kind."""
    G, H = N * M, t.num_rows
    if kind == "hash":
        return ColdSharding.hashed(range(G), seed=draw(st.integers(0, 1000))), ""
    if kind == "range":
        return ColdSharding.ranges(range(G), H), ""
    if kind == "subset":
        gp = draw(st.lists(st.integers(0, G - 1), min_size=1, max_size=G, unique=True))
        return ColdSharding.ranges(gp, H), ""
    if kind == "wrange":
        w = draw(st.lists(st.floats(0.1, 5), min_size=G, max_size=G))
        return ColdSharding.ranges(range(G), H, w), ""
    if kind == "tw":
        return ColdSharding.ranges([draw(st.integers(0, G - 1))], H), "table_wise"
    n0 = draw(st.integers(0, N - 1)) * M
    if kind == "twrw":
        return ColdSharding.ranges(range(n0, n0 + M), H), "table_row_wise"
    gpus, widths = _column_shards(draw, t, list(range(n0, n0 + M)) if kind == "twcw"
                                  else list(range(G)))
    return ColdSharding.columns(gpus, widths), "table_column_wise" if kind == "twcw" else ""


@st.composite
def plans_and_batches(draw, kinds=("hash", "range", "wrange", "replicated", "subset")):
    """A random plan (tables of the drawn cold kinds, with global, node and placed tiers where
    the kind takes them) and a batch of whole iterations for it."""
    N, M = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    topo = Topology.uniform(N, M)
    G = N * M
    B = draw(st.integers(1, 3))
    tps, feats = [], []
    for i in range(draw(st.integers(1, 2))):
        H = draw(st.integers(1, 40))
        t = EmbeddingTable(f"t{i}", H, draw(st.integers(1, 8)), draw(st.sampled_from(["fp32", "fp16"])),
                           draw(st.sampled_from(["sequence", "pooled"])))
        rows = draw(st.permutations(range(H)))
        k0, k1, k2 = (draw(st.integers(0, H // 3)) for _ in range(3))
        kind = draw(st.sampled_from(kinds))
        if kind == "replicated":
            tp = TablePlan(t, ColdSharding.replicated())
        else:
            cold, sharding = _cold_of(draw, kind, t, N, M)
            g0 = sorted(rows[:k0])
            if cold.kind == "columns":   # global replicas only
                k1 = k2 = 0
            n1 = sorted(rows[k0:k0 + k1])
            p2 = sorted(rows[k0 + k1:k0 + k1 + k2])
            tp = TablePlan(t, cold, global_ids=g0, node_ids=n1,
                           node_local=[draw(st.integers(0, M - 1)) for _ in n1],
                           placed_ids=p2, placed_gpus=[draw(st.integers(0, G - 1)) for _ in p2],
                           sharding=sharding)
        tps.append(tp)
        feats.append(t)
    plan = Plan("random", topo, tps)
    n_it = draw(st.integers(1, 2))
    keys = [t.feature for t in feats]
    vals, lens = [], []
    for t in feats:
        ls = draw(st.lists(st.integers(0, 4), min_size=G * B * n_it, max_size=G * B * n_it))
        lens.extend(ls)
        vals.extend(draw(st.lists(st.integers(0, t.num_rows - 1), min_size=sum(ls), max_size=sum(ls))))
    batch = Batch(keys, np.array(vals, np.int64), np.array(lens, np.int64))
    return plan, batch, B


def _iterations(tc, batch, G, B):
    from flexshard_stream.stats.batch import slice_batch
    assert tc.mean.iterations == len(tc.matrices) == batch.batch_size // (G * B)
    return [(mats, slice_batch(batch, i * G * B, (i + 1) * G * B))
            for i, mats in enumerate(tc.matrices)]


@given(plans_and_batches(ALL_KINDS), st.booleans())
@settings(max_examples=60)
def test_ideal_evaluator_equals_brute_force(pb, dedup):
    plan, batch, B = pb
    G = plan.topology.num_gpus
    tc = evaluate_trace(plan, [batch], B, CostModel(dedup=dedup, profile="ideal"),
                        keep_matrices=True)
    for mats, it in _iterations(tc, batch, G, B):
        idx, fwd, sync = brute_force(plan, it, B, dedup)
        assert np.allclose(mats["index"], idx, rtol=1e-12, atol=0)
        assert np.allclose(mats["forward"], fwd, rtol=1e-12, atol=0)
        assert np.allclose(mats["backward"], fwd.T, rtol=1e-12, atol=0)
        assert mats["sync"].sum() == pytest.approx(sync, rel=1e-12, abs=1e-9)
        # every ID routes, and through the same functions the users call
        for k in it.keys:
            tp = next(t for t in plan.tables.values() if t.table.feature == k)
            v = it.feature_values(k)
            src = np.repeat(np.arange(G * B) // B, it.feature_lengths(k))
            M = plan.topology.gpus_per_node
            ref = [owner_py(tp, int(r), int(s), M)[0] for r, s in zip(v, src)]
            assert plan.route(tp.name, v, src).tolist() == ref
            # every GPU serving each lookup (a replicated row: the requester, once per shard)
            k = tp.cold.gpus.size if tp.column_wise else 1
            every = [[g for g, _ in owners_py(tp, int(r), int(s), M)[0]] for r, s in zip(v, src)]
            every = [e * k if len(e) == 1 else e for e in every]
            assert plan.owners(tp.name, v, src).tolist() == every


@given(plans_and_batches(ALL_KINDS), st.booleans(), st.sampled_from([4, 8]),
       st.sampled_from([4, 8]))
@settings(max_examples=60)
def test_torchrec_evaluator_equals_brute_force(pb, dedup, ib, lb):
    plan, batch, B = pb
    G = plan.topology.num_gpus
    model = CostModel(dedup=dedup, index_bytes=ib, length_bytes=lb)
    assert model.profile == "torchrec"
    tc = evaluate_trace(plan, [batch], B, model, keep_matrices=True)
    for mats, it in _iterations(tc, batch, G, B):
        ref, allreduce = brute_force_torchrec(plan, it, B, dedup, ib, lb)
        for comp, m in ref.items():
            np.testing.assert_array_equal(mats[comp], m, err_msg=comp)
        index = sum(ref[c] for c in ("input_splits", "input_lengths", "input_values"))
        forward = sum(ref[c] for c in ("pooled_all_to_all", "pooled_reduce_scatter",
                                       "sequence_all_to_all"))
        np.testing.assert_array_equal(mats["index"], index)
        np.testing.assert_array_equal(mats["forward"], forward)
        np.testing.assert_array_equal(mats["backward"], forward.T)
        assert tc.mean.collectives["data_parallel_all_reduce"] == G * allreduce
        # the all-reduce moves the whole buffer by the hierarchical ring formula
        N, M = plan.topology.nodes, plan.topology.gpus_per_node
        wire = G * 2 * (M - 1) / M * allreduce + G * 2 * (N - 1) / N * allreduce / M
        assert mats["sync"].sum() == pytest.approx(wire, rel=1e-12, abs=1e-9)


@given(plans_and_batches(ALL_KINDS), st.booleans(), st.sampled_from(["ideal", "torchrec"]))
@settings(max_examples=30)
def test_conservation(pb, dedup, profile):
    plan, batch, B = pb
    c = evaluate_trace(plan, [batch], B, CostModel(dedup=dedup, profile=profile)).mean
    for comp in ("index", "forward", "backward", "sync"):
        assert c.send[comp].sum() == pytest.approx(c.recv[comp].sum())
        for k in range(3):
            assert c.send[comp][:, k].sum() == pytest.approx(c.recv[comp][:, k].sum())
        assert np.allclose(c.matrices[comp].sum(axis=1), c.send[comp].sum(axis=1))
        assert np.allclose(np.diag(c.matrices[comp]), c.send[comp][:, 0])
        if profile == "ideal" or comp == "sync":  # local lookups cost nothing
            assert np.all(np.diag(c.matrices[comp]) == 0)
            assert c.send[comp][:, 0].sum() == 0
    assert np.allclose(c.matrices["backward"], c.matrices["forward"].T)
    # link bytes leave a rank's own chunk out
    assert c.a2a_bytes == pytest.approx(sum(c.send[k][:, 1:].sum()
                                            for k in ("index", "forward", "backward")))


def test_replicated_and_node_replicated_lookups():
    topo = Topology.uniform(2, 2)
    t = EmbeddingTable("s", 8, 2)
    plan = Plan("x", topo, [TablePlan(t, ColdSharding.ranges(range(4), 8), global_ids=[0, 1],
                                      node_ids=[7], node_local=[1])])
    b = Batch(["s"], np.array([0, 1, 7, 0, 7, 7, 1, 1]), np.array([3, 2, 1, 2]))
    c = evaluate_trace(plan, [b], 1, IDEAL).mean
    # global replicas never leave the GPU; row 7 is served inside each node by local GPU 1
    assert c.inter_node_bytes == 0
    assert c.matrices["index"][0, 1] == 8 and c.matrices["index"][2, 3] == 8
    assert c.matrices["index"].sum() == 16


# ------------------------------------------------------------------ hand-computed two-node cases
TOPO = Topology.uniform(2, 2, intra_node_bandwidth=300e9, inter_node_bandwidth=25e9)
TABLE = EmbeddingTable("s", 8, 2, "fp32", "sequence")            # D * e = 8 bytes per row
# one sample per GPU (B = 1): GPU0 [0, 2, 2, 7], GPU1 [1, 3], GPU2 [4], GPU3 [6, 7]
BATCH = Batch(["s"], np.array([0, 2, 2, 7, 1, 3, 4, 6, 7]), np.array([4, 2, 1, 2]))


def test_hand_row_wise():
    # ranges: GPU g owns rows 2g, 2g+1. Requests leaving a GPU (de-duplicated):
    # GPU0 -> GPU1 row 2 (intra), GPU0 -> GPU3 row 7 (inter), GPU1 -> GPU0 row 1 (intra)
    c = evaluate_trace(row_wise([TABLE], TOPO), [BATCH], 1, IDEAL).mean
    assert c.bytes_by_class("index") == {"local": 0, "intra_node": 16, "inter_node": 8}
    assert c.bytes_by_class("forward") == {"local": 0, "intra_node": 16, "inter_node": 8}
    assert c.a2a_bytes == 72 and c.inter_node_bytes == 24
    # slowest GPU per phase: 8 inter-node bytes at 25 GB/s = 3.2e-10 s, three phases, no sync
    assert c.comm_time_s == pytest.approx(3 * 8 / 25e9)
    # without de-duplication GPU0 asks for row 2 twice
    n = evaluate_trace(row_wise([TABLE], TOPO), [BATCH], 1, CostModel(dedup=False, profile="ideal")).mean
    assert n.a2a_bytes == 96 and n.inter_node_bytes == 24
    # memory: 2 rows of 8 bytes per GPU; buffers: GPU0 sends 16 + receives 8 index bytes and
    # sends 8 + receives 16 embedding bytes
    assert c.row_bytes.tolist() == [16, 16, 16, 16]
    assert c.buffer_bytes[0] == 48


def test_hand_table_wise():
    # the table on GPU0: GPU1 asks 2 rows (intra), GPU2 one row, GPU3 two rows (inter)
    c = evaluate_trace(table_wise([TABLE], TOPO), [BATCH], 1, IDEAL).mean
    assert c.bytes_by_class("index") == {"local": 0, "intra_node": 16, "inter_node": 24}
    assert c.a2a_bytes == 120 and c.inter_node_bytes == 72
    assert c.row_bytes.tolist() == [64, 0, 0, 0]
    # GPU0 receives 24 inter-node index bytes: 24 / 25e9 s; it sends 24 inter embedding bytes
    assert c.time_s["index"] == pytest.approx(24 / 25e9)


def test_hand_table_row_wise():
    # the table over node 0: GPU0 rows 0-3, GPU1 rows 4-7
    # GPU0 -> GPU1 row 7; GPU1 -> GPU0 rows 1, 3; GPU2 -> GPU1 row 4; GPU3 -> GPU1 rows 6, 7
    c = evaluate_trace(table_row_wise([TABLE], TOPO), [BATCH], 1, IDEAL).mean
    assert c.bytes_by_class("index") == {"local": 0, "intra_node": 24, "inter_node": 24}
    assert c.a2a_bytes == 144 and c.inter_node_bytes == 72
    assert c.row_bytes.tolist() == [32, 32, 0, 0]


def test_hand_data_parallel():
    # no all-to-all; 7 distinct rows touched -> 56 gradient bytes all-reduced hierarchically:
    # intra ring (M=2): 2*(1/2)*56 = 56 bytes per GPU; inter ring (N=2): 2*(1/2)*56/2 = 28 per GPU
    c = evaluate_trace(data_parallel([TABLE], TOPO), [BATCH], 1, IDEAL).mean
    assert c.a2a_bytes == 0
    assert c.bytes_by_class("sync") == {"local": 0, "intra_node": 4 * 56, "inter_node": 4 * 28}
    assert c.time_s["sync"] == pytest.approx(56 / 300e9 + 28 / 25e9)
    assert c.row_bytes.tolist() == [64] * 4
    ring = evaluate_trace(data_parallel([TABLE], TOPO), [BATCH], 1, CostModel(allreduce="ring", profile="ideal")).mean
    # flat ring over 4 GPUs: each sends 2*(3/4)*56 = 84 bytes to the next GPU (0->1, 2->3 intra)
    assert ring.bytes_by_class("sync") == {"local": 0, "intra_node": 168, "inter_node": 168}


def test_hand_node_replica_sync():
    # row 7 in tier 1 on local GPU 1: GPU0 gets it from GPU1 (intra); GPU3 holds its own node's copy.
    plan = Plan("x", TOPO, [TablePlan(TABLE, ColdSharding.ranges(range(4), 8), node_ids=[7],
                                      node_local=[1])])
    c = evaluate_trace(plan, [BATCH], 1, IDEAL).mean
    assert c.matrices["index"][0, 1] == 16  # rows 2 and 7, both on GPU1
    # sync: one touched node row (8 bytes) all-reduced between GPU1 and GPU3: 2*(1/2)*8 each way
    assert c.matrices["sync"][1, 3] == 8 and c.matrices["sync"][3, 1] == 8
    assert c.sync_bytes == 16


def test_hand_pooled():
    pooled = EmbeddingTable("s", 8, 2, "fp32", "pooled")
    # GPU0's bag [0, 2, 2, 7]: partial sums from GPU1 and GPU3 (one each); GPU1's bag: from GPU0
    c = evaluate_trace(row_wise([pooled], TOPO), [BATCH], 1, IDEAL).mean
    assert c.matrices["forward"][1, 0] == 8 and c.matrices["forward"][3, 0] == 8
    assert c.matrices["forward"][0, 1] == 8 and c.matrices["forward"].sum() == 24
    assert c.matrices["index"].sum() == 24


def test_hand_hugectr():
    # threshold on 2 nodes, 1 profiled iteration: 1 * 2 * (1.9/1.3) * 1 * 2/1 = 5.85 lookups
    assert hugectr_threshold(1, 2) == pytest.approx(2 * 1.9e11 / 1.3e11 * 2)
    prof = TableStats("s", 8).update(np.array([7] * 6 + [1] * 5 + [2] * 3 + [4] * 2 + [0]))
    plan = hugectr_hybrid([TABLE], TOPO, {"s": prof.summary(8)}, iterations=1)
    # only row 7 passes; the frequent set is rounded up to G = 4 rows: 7, 1, 2, 4
    assert plan["s"].global_ids.tolist() == [1, 2, 4, 7]
    c = evaluate_trace(plan, [BATCH], 1, IDEAL).mean
    # remaining remote request: GPU1 row 3 is local (GPU1 owns 2,3); GPU0 row 0 local; GPU3 6 local
    assert c.a2a_bytes == 0
    assert math.isinf(hugectr_threshold(5, 1))


# ------------------------------------------------------------------ hand-computed, TorchRec profile
TR = CostModel(dedup=False)     # TorchRec's own default: no index de-duplication


def test_torchrec_hand_row_wise_sequence():
    # every rank sends every rank 24 bytes of splits and B = 1 int64 length (one row-wise slot
    # per rank); the IDs go to their owner, self included: GPU0 [0, 2, 2, 7] -> 0, 1, 1, 3
    c = evaluate_trace(row_wise([TABLE], TOPO), [BATCH], 1, TR, keep_matrices=True)
    m = c.matrices[0]
    assert (m["input_splits"] == 24).all() and (m["input_lengths"] == 8).all()
    assert m["input_values"].tolist() == [[8, 16, 0, 8], [8, 8, 0, 0], [0, 0, 8, 0],
                                          [0, 0, 0, 16]]
    # one 8-byte row back per ID, no de-duplication: the values transposed
    assert np.array_equal(m["sequence_all_to_all"], m["input_values"].T)
    assert c.mean.collectives["input_values"] == 72
    # link bytes leave the diagonal (a rank's own chunk) out: forward 16 + 8 intra, 8 inter
    assert c.mean.bytes_by_class("forward") == {"local": 40, "intra_node": 24, "inter_node": 8}
    # with TorchRec's index de-duplication GPU0 sends row 2 once
    d = evaluate_trace(row_wise([TABLE], TOPO), [BATCH], 1, CostModel(), keep_matrices=True)
    assert d.matrices[0]["input_values"][0, 1] == 8


def test_torchrec_hand_pooled_outputs_are_dense():
    pooled = EmbeddingTable("s", 8, 2, "fp32", "pooled")          # D e = 8 bytes
    # row-wise: a reduce-scatter of every sample's partial sum, B D e to every rank, whatever
    # the IDs (the ideal profile sends 3 partial sums, 24 bytes)
    rw = evaluate_trace(row_wise([pooled], TOPO), [BATCH], 1, TR, keep_matrices=True).mean
    assert (rw.matrices["pooled_reduce_scatter"] == 8).all()
    assert rw.bytes_by_class("forward") == {"local": 32, "intra_node": 32, "inter_node": 64}
    assert evaluate_trace(row_wise([pooled], TOPO), [BATCH], 1, IDEAL).mean.bytes_by_class(
        "forward")["inter_node"] == 8
    # the reduce-scatter sums what it receives: its output buffer is one chunk, not G
    assert rw.buffer_bytes[0] == pytest.approx(rw.send["index"][0].sum()
                                               + rw.recv["index"][0].sum() + 4 * 8 + 8)
    # table-wise on GPU 1: the owner sends every rank B pooled rows
    tw = evaluate_trace(table_wise([pooled], TOPO), [BATCH], 1, TR).mean
    owner = int(table_wise([pooled], TOPO)["s"].cold.gpus[0])
    assert tw.matrices["pooled_all_to_all"][owner].tolist() == [8] * 4
    assert tw.matrices["pooled_all_to_all"].sum() == 32
    # table-row-wise on node 1 (GPUs 2, 3): reduce-scatter in the node, N B D e chunks, then
    # B D e to the same local GPU of every node
    twrw = Plan("x", TOPO, [TablePlan(pooled, ColdSharding.ranges([2, 3], 8),
                                      sharding="table_row_wise")])
    t = evaluate_trace(twrw, [BATCH], 1, TR).mean
    rs = np.zeros((4, 4))
    rs[2:, 2:] = 16
    assert np.array_equal(t.matrices["pooled_reduce_scatter"], rs)
    a2a = np.zeros((4, 4))
    a2a[2, [0, 2]] = a2a[3, [1, 3]] = 8
    assert np.array_equal(t.matrices["pooled_all_to_all"], a2a)
    # lengths go to the node's two ranks only
    assert t.matrices["input_lengths"][:, :2].sum() == 0 and (t.matrices["input_lengths"][:, 2:]
                                                              == 8).all()


def test_torchrec_hand_column_wise():
    t4 = EmbeddingTable("s", 8, 4, "fp32", "sequence")            # 4 bytes per column
    plan = Plan("x", TOPO, [TablePlan(t4, ColdSharding.columns([1, 2], [1, 3]))])
    c = evaluate_trace(plan, [BATCH], 1, TR, keep_matrices=True).matrices[0]
    # every ID goes to both shards; each returns its columns: 4 and 12 bytes per ID
    assert c["input_values"][0].tolist() == [0, 32, 32, 0]
    assert c["sequence_all_to_all"][1, 0] == 16 and c["sequence_all_to_all"][2, 0] == 48
    assert (c["input_lengths"][:, [1, 2]] == 8).all() and c["input_lengths"][:, [0, 3]].sum() == 0
    ideal = evaluate_trace(plan, [BATCH], 1, IDEAL).mean
    # ideal: GPU1 asks shard 2 for its 2 distinct rows, GPU2 asks shard 1 for 1 row
    assert ideal.matrices["index"][1, 2] == 16 and ideal.matrices["index"][2, 1] == 8


def test_torchrec_hand_replicas_and_data_parallel():
    # data-parallel: DDP all-reduces the whole table (8 rows x 8 bytes) every iteration, not
    # the 7 rows touched; hierarchical: 64 intra and 32 inter-node bytes per GPU
    dp = evaluate_trace(data_parallel([TABLE], TOPO), [BATCH], 1, TR).mean
    assert dp.collectives["data_parallel_all_reduce"] == 4 * 64
    assert dp.bytes_by_class("sync") == {"local": 0, "intra_node": 4 * 64, "inter_node": 4 * 32}
    assert dp.a2a_bytes == 0
    # hot rows 0 and 7 (a global replica and a node replica, folded into the hot table): no
    # input distribution for them, the hot table's 2 rows all-reduced
    plan = Plan("x", TOPO, [TablePlan(TABLE, ColdSharding.ranges(range(4), 8), global_ids=[0],
                                      node_ids=[7], node_local=[1])])
    c = evaluate_trace(plan, [BATCH], 1, TR, keep_matrices=True)
    assert c.matrices[0]["input_values"][0].tolist() == [0, 16, 0, 0]
    assert c.mean.collectives["data_parallel_all_reduce"] == 4 * 16
    # cold rows 1 | 2, 3 | 4, 5 | 6 and row 0 everywhere; the node replica (8 bytes) is stored
    # on every GPU, as the export runs it, not on local GPU 1 of each node as planned
    assert evaluate_trace(plan, [BATCH], 1, IDEAL).mean.row_bytes.tolist() == [16, 32, 24, 24]
    assert c.mean.row_bytes.tolist() == [24, 32, 32, 24]


def test_profiles_say_what_torchrec_runs():
    tr, ideal = CostModel().execution, IDEAL.execution
    assert (tr.name, tr.label, ideal.label) == ("torchrec", "TorchRec 1.8", "idealized")
    assert tr.can_run(row_wise([TABLE], TOPO)) and tr.can_run(data_parallel([TABLE], TOPO))
    node = Plan("x", TOPO, [TablePlan(TABLE, ColdSharding.ranges(range(4), 8), node_ids=[7],
                                      node_local=[1])])
    assert not tr.can_run(node) and ideal.can_run(node)
    assert any("node replicas" in m for m in tr.issues(node))
    assert tr.table_issues(node["s"], TOPO) == tr.issues(node)       # per table, for planners
    seq_twrw = table_row_wise([TABLE], TOPO)
    assert any("offers no table_row_wise for sequence" in m for m in tr.issues(seq_twrw))
    subset = Plan("x", TOPO, [TablePlan(TABLE, ColdSharding.ranges([0, 2, 3], 8))])
    assert any("every rank" in m for m in tr.issues(subset))
    with pytest.raises(Exception, match="execution profile 'nccl' unknown"):
        CostModel(profile="nccl")


# ------------------------------------------------------------------ analytic vs trace
def _draw_trace(p, G, B, L, iters, seed):
    rng = np.random.default_rng(seed)
    ids = rng.choice(p.size, size=G * B * L * iters, p=p)
    return Batch(["s"], ids, np.full(G * B * iters, L))


def _agreement_plan(layout, t, topo, order):
    """The plans the analytic mode is checked on: hashed rows with global and node replicas,
    column shards with global replicas, table-row-wise over node 1, data-parallel."""
    G = topo.num_gpus
    if layout == "replicas":
        return Plan("x", topo, [TablePlan(t, ColdSharding.hashed(range(G), seed=3),
                                          global_ids=np.sort(order[:5]),
                                          node_ids=np.sort(order[5:20]),
                                          node_local=np.arange(15) % topo.gpus_per_node)])
    if layout == "columns":
        return Plan("x", topo, [TablePlan(t, ColdSharding.columns([1, 6, 3], [4, 8, 4]),
                                          global_ids=np.sort(order[:5]))])
    if layout == "twrw":
        return Plan("x", topo, [TablePlan(t, ColdSharding.ranges(topo.gpus_of_node(1),
                                                                 t.num_rows))])
    return Plan("x", topo, [TablePlan(t, ColdSharding.replicated())])


@pytest.mark.parametrize("profile", ["ideal", "torchrec"])
@pytest.mark.parametrize("layout", ["replicas", "columns", "twrw", "dp"])
@pytest.mark.parametrize("kind", ["sequence", "pooled"])
@pytest.mark.parametrize("dedup", [True, False])
def test_analytic_agrees_with_trace(kind, dedup, layout, profile):
    H, G, B, L = 2000, 8, 16, 10
    topo = Topology.uniform(2, 4)
    # hot rows scattered over the IDs (the summary's tail is uniform over the IDs it leaves)
    p = np.random.default_rng(7).permutation(1.0 / np.arange(1, H + 1) ** 1.1)
    p /= p.sum()
    t = EmbeddingTable("s", H, 16, "fp32", kind)
    order = np.argsort(-p)
    plan = _agreement_plan(layout, t, topo, order)
    # the summary: top 500 rows explicit, the rest as a uniform tail (as the sketches provide)
    k = 500
    s = FrequencySummary("s", 10**9, order[:k], p[order[:k]] * 1e9, p[order[:k]] * 1e9,
                         p[order[:k]] * 1e9, H, H, H, float(p[order[k:]].sum() * 1e9), H - k,
                         H, True, 10**8, float(L))
    model = CostModel(dedup=dedup, profile=profile)
    an = evaluate_analytic(plan, {"s": s}, B, model)
    tr = evaluate_trace(plan, [_draw_trace(p, G, B, L, 40, 1)], B, model).mean
    for attr in ("a2a_bytes", "inter_node_bytes", "intra_node_bytes", "sync_bytes"):
        assert getattr(an, attr) == pytest.approx(getattr(tr, attr), rel=0.05), attr
    assert an.collectives.keys() == tr.collectives.keys()
    for comp, v in an.collectives.items():
        assert v == pytest.approx(tr.collectives[comp], rel=0.05), comp
    # times: the analytic mode is the slowest GPU of the *expected* traffic; the trace averages the
    # slowest GPU of each iteration, which is higher by the per-iteration imbalance (Jensen)
    from flexshard_stream.placement.cost import _a2a_time
    for comp in ("index", "forward", "backward"):
        of_mean = _a2a_time(topo, tr.send[comp], tr.recv[comp])
        assert an.time_s[comp] == pytest.approx(of_mean, rel=0.05), comp
        assert an.time_s[comp] <= tr.time_s[comp] * 1.02
    assert np.allclose(an.matrices["forward"], an.matrices["backward"].T)
    for comp in ("index", "forward", "backward", "sync"):
        assert np.allclose(an.matrices[comp].sum(axis=1), an.send[comp].sum(axis=1))
        assert np.allclose(an.matrices[comp].sum(axis=0), an.recv[comp].sum(axis=1))


# ------------------------------------------------------------------ errors
def test_trace_errors():
    plan = row_wise([TABLE], TOPO)
    with pytest.raises(BatchError, match=r"feature 'x'.*no table"):
        evaluate_trace(plan, [Batch(["x"], np.array([1, 2, 3, 4]), np.ones(4, np.int64))], 1)
    with pytest.raises(BatchError, match=r"feature 's'.*ID 9.*out of range"):
        evaluate_trace(plan, [Batch(["s"], np.array([1, 2, 3, 9]), np.ones(4, np.int64))], 1)
    r = evaluate_trace(plan, [Batch(["s"], np.array([1, 2, 3]), np.ones(3, np.int64))], 1)
    assert r.mean.iterations == 0 and r.dropped_samples == 3


@given(plans_and_batches(ALL_KINDS))
@settings(max_examples=40)
def test_fast_row_bytes_equal_per_table_rows(pb):
    plan, _, _ = pb
    ref = sum(tp.row_bytes_per_gpu(plan.topology) for tp in plan.tables.values())
    assert np.allclose(plan.row_bytes_per_gpu, ref, rtol=0, atol=1e-6)
    for tp in plan.tables.values():
        if not tp.column_wise:   # whole rows: rows stored times the bytes of a row
            assert np.array_equal(tp.row_bytes_per_gpu(plan.topology),
                                  tp.rows_per_gpu(plan.topology) * float(tp.table.row_bytes))


def test_torchrec_host_lookups_follow_torchrec_deduplication():
    """Host-tier lookups are counted as the profile distributes the IDs: TorchRec de-duplicates
    sequence tables only (when asked), so a pooled table's host rows are read per occurrence."""
    seq, pooled = EmbeddingTable("s", 8, 2), EmbeddingTable("p", 8, 2, kind="pooled")
    batch = Batch(["s", "p"], np.array([0, 2, 2, 7, 1, 3, 4, 6, 7] * 2),
                  np.array([4, 2, 1, 2] * 2))
    plan = Plan("x", TOPO, [TablePlan(t, ColdSharding.ranges(range(4), 8),
                                      hbm_fraction=np.zeros(4)) for t in (seq, pooled)])
    tr = evaluate_trace(plan, [batch], 1, CostModel(dedup=True)).mean.host_lookups
    want = {}
    for d in (True, False):
        for name in ("s", "p"):
            one = Plan("x", TOPO, [plan[name]])
            b = Batch([name], batch.feature_values(name), batch.feature_lengths(name))
            want[name, d] = evaluate_trace(one, [b], 1, CostModel(dedup=d, profile="ideal")
                                           ).mean.host_lookups
    assert np.array_equal(tr, want["s", True] + want["p", False])
    assert want["p", False].sum() > want["p", True].sum()
