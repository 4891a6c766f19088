"""The cost evaluator: brute-force reference, conservation, hand-computed cases, analytic vs trace."""
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
from flexshard_stream.placement.cost import CostModel, evaluate_analytic, evaluate_trace
from flexshard_stream.placement.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.placement.tables import EmbeddingTable
from flexshard_stream.placement.topology import Topology
from flexshard_stream.stats.summary import FrequencySummary

M64 = (1 << 64) - 1


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
    if c.kind == "hash":
        return int(c.gpus[mix64_py(rid, c.seed) % c.gpus.size]), None
    j = max(j for j in range(c.gpus.size) if c.bounds[j] <= rid) if rid >= c.bounds[0] else 0
    return int(c.gpus[min(j, c.gpus.size - 1)]), None


def brute_force(plan, batch, B, dedup, index_bytes=8):
    """A plain Python loop over every ID of one iteration: (index, forward, sync-bytes) reference."""
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
                dst, tier = owner_py(tp, rid, src, M)
                if tier == "global":
                    touched0.add(rid)
                elif tier is not None:
                    touched1.add((rid, tier[1]))
                if dst == src:
                    continue
                new = True
                if dedup:
                    new = (src, rid) not in seen
                    seen.add((src, rid))
                if new:
                    idx[src, dst] += index_bytes
                    if tp.table.kind == "sequence":
                        fwd[dst, src] += eb
                if tp.table.kind == "pooled" and dst not in owners:
                    owners.add(dst)
                    fwd[dst, src] += eb
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


@st.composite
def plans_and_batches(draw):
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
        kind = draw(st.sampled_from(["hash", "range", "wrange", "replicated", "subset"]))
        if kind == "replicated":
            tp = TablePlan(t, ColdSharding.replicated())
        else:
            if kind == "hash":
                cold = ColdSharding.hashed(range(G), seed=draw(st.integers(0, 1000)))
            elif kind == "range":
                cold = ColdSharding.ranges(range(G), H)
            elif kind == "subset":
                gp = draw(st.lists(st.integers(0, G - 1), min_size=1, max_size=G, unique=True))
                cold = ColdSharding.ranges(gp, H)
            else:
                w = draw(st.lists(st.floats(0.1, 5), min_size=G, max_size=G))
                cold = ColdSharding.ranges(range(G), H, w)
            g0 = sorted(rows[:k0])
            n1 = sorted(rows[k0:k0 + k1])
            p2 = sorted(rows[k0 + k1:k0 + k1 + k2])
            tp = TablePlan(t, cold, global_ids=g0, node_ids=n1,
                           node_local=[draw(st.integers(0, M - 1)) for _ in n1],
                           placed_ids=p2, placed_gpus=[draw(st.integers(0, G - 1)) for _ in p2])
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


@given(plans_and_batches(), st.booleans())
@settings(max_examples=60)
def test_vectorized_evaluator_equals_brute_force(pb, dedup):
    plan, batch, B = pb
    G = plan.topology.num_gpus
    tc = evaluate_trace(plan, [batch], B, CostModel(dedup=dedup), keep_matrices=True)
    from flexshard_stream.stats.batch import slice_batch
    assert tc.mean.iterations == len(tc.matrices) == batch.batch_size // (G * B)
    for i, mats in enumerate(tc.matrices):
        it = slice_batch(batch, i * G * B, (i + 1) * G * B)
        idx, fwd, sync = brute_force(plan, it, B, dedup)
        assert np.allclose(mats["index"], idx, rtol=1e-12, atol=0)
        assert np.allclose(mats["forward"], fwd, rtol=1e-12, atol=0)
        assert np.allclose(mats["backward"], fwd.T, rtol=1e-12, atol=0)
        assert mats["sync"].sum() == pytest.approx(sync, rel=1e-12, abs=1e-9)
        # every ID routes, and through the same function the users call
        for k in it.keys:
            tp = next(t for t in plan.tables.values() if t.table.feature == k)
            v = it.feature_values(k)
            src = np.repeat(np.arange(G * B) // B, it.feature_lengths(k))
            ref = [owner_py(tp, int(r), int(s), plan.topology.gpus_per_node)[0] for r, s in zip(v, src)]
            assert plan.route(tp.name, v, src).tolist() == ref


@given(plans_and_batches(), st.booleans())
@settings(max_examples=30)
def test_conservation(pb, dedup):
    plan, batch, B = pb
    c = evaluate_trace(plan, [batch], B, CostModel(dedup=dedup)).mean
    for comp in ("index", "forward", "backward", "sync"):
        assert c.send[comp].sum() == pytest.approx(c.recv[comp].sum())
        assert np.all(np.diag(c.matrices[comp]) == 0)  # local lookups cost nothing
        assert c.send[comp][:, 0].sum() == 0
    assert np.allclose(c.matrices["backward"], c.matrices["forward"].T)


def test_replicated_and_node_replicated_lookups():
    topo = Topology.uniform(2, 2)
    t = EmbeddingTable("s", 8, 2)
    plan = Plan("x", topo, [TablePlan(t, ColdSharding.ranges(range(4), 8), global_ids=[0, 1],
                                      node_ids=[7], node_local=[1])])
    b = Batch(["s"], np.array([0, 1, 7, 0, 7, 7, 1, 1]), np.array([3, 2, 1, 2]))
    c = evaluate_trace(plan, [b], 1).mean
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
    c = evaluate_trace(row_wise([TABLE], TOPO), [BATCH], 1).mean
    assert c.bytes_by_class("index") == {"local": 0, "intra_node": 16, "inter_node": 8}
    assert c.bytes_by_class("forward") == {"local": 0, "intra_node": 16, "inter_node": 8}
    assert c.a2a_bytes == 72 and c.inter_node_bytes == 24
    # slowest GPU per phase: 8 inter-node bytes at 25 GB/s = 3.2e-10 s, three phases, no sync
    assert c.comm_time_s == pytest.approx(3 * 8 / 25e9)
    # without de-duplication GPU0 asks for row 2 twice
    n = evaluate_trace(row_wise([TABLE], TOPO), [BATCH], 1, CostModel(dedup=False)).mean
    assert n.a2a_bytes == 96 and n.inter_node_bytes == 24
    # memory: 2 rows of 8 bytes per GPU; buffers: GPU0 sends 16 + receives 8 index bytes and
    # sends 8 + receives 16 embedding bytes
    assert c.row_bytes.tolist() == [16, 16, 16, 16]
    assert c.buffer_bytes[0] == 48


def test_hand_table_wise():
    # the table on GPU0: GPU1 asks 2 rows (intra), GPU2 one row, GPU3 two rows (inter)
    c = evaluate_trace(table_wise([TABLE], TOPO), [BATCH], 1).mean
    assert c.bytes_by_class("index") == {"local": 0, "intra_node": 16, "inter_node": 24}
    assert c.a2a_bytes == 120 and c.inter_node_bytes == 72
    assert c.row_bytes.tolist() == [64, 0, 0, 0]
    # GPU0 receives 24 inter-node index bytes: 24 / 25e9 s; it sends 24 inter embedding bytes
    assert c.time_s["index"] == pytest.approx(24 / 25e9)


def test_hand_table_row_wise():
    # the table over node 0: GPU0 rows 0-3, GPU1 rows 4-7
    # GPU0 -> GPU1 row 7; GPU1 -> GPU0 rows 1, 3; GPU2 -> GPU1 row 4; GPU3 -> GPU1 rows 6, 7
    c = evaluate_trace(table_row_wise([TABLE], TOPO), [BATCH], 1).mean
    assert c.bytes_by_class("index") == {"local": 0, "intra_node": 24, "inter_node": 24}
    assert c.a2a_bytes == 144 and c.inter_node_bytes == 72
    assert c.row_bytes.tolist() == [32, 32, 0, 0]


def test_hand_data_parallel():
    # no all-to-all; 7 distinct rows touched -> 56 gradient bytes all-reduced hierarchically:
    # intra ring (M=2): 2*(1/2)*56 = 56 bytes per GPU; inter ring (N=2): 2*(1/2)*56/2 = 28 per GPU
    c = evaluate_trace(data_parallel([TABLE], TOPO), [BATCH], 1).mean
    assert c.a2a_bytes == 0
    assert c.bytes_by_class("sync") == {"local": 0, "intra_node": 4 * 56, "inter_node": 4 * 28}
    assert c.time_s["sync"] == pytest.approx(56 / 300e9 + 28 / 25e9)
    assert c.row_bytes.tolist() == [64] * 4
    ring = evaluate_trace(data_parallel([TABLE], TOPO), [BATCH], 1, CostModel(allreduce="ring")).mean
    # flat ring over 4 GPUs: each sends 2*(3/4)*56 = 84 bytes to the next GPU (0->1, 2->3 intra)
    assert ring.bytes_by_class("sync") == {"local": 0, "intra_node": 168, "inter_node": 168}


def test_hand_node_replica_sync():
    # row 7 in tier 1 on local GPU 1: GPU0 gets it from GPU1 (intra); GPU3 holds its own node's copy.
    plan = Plan("x", TOPO, [TablePlan(TABLE, ColdSharding.ranges(range(4), 8), node_ids=[7],
                                      node_local=[1])])
    c = evaluate_trace(plan, [BATCH], 1).mean
    assert c.matrices["index"][0, 1] == 16  # rows 2 and 7, both on GPU1
    # sync: one touched node row (8 bytes) all-reduced between GPU1 and GPU3: 2*(1/2)*8 each way
    assert c.matrices["sync"][1, 3] == 8 and c.matrices["sync"][3, 1] == 8
    assert c.sync_bytes == 16


def test_hand_pooled():
    pooled = EmbeddingTable("s", 8, 2, "fp32", "pooled")
    # GPU0's bag [0, 2, 2, 7]: partial sums from GPU1 and GPU3 (one each); GPU1's bag: from GPU0
    c = evaluate_trace(row_wise([pooled], TOPO), [BATCH], 1).mean
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
    c = evaluate_trace(plan, [BATCH], 1).mean
    # remaining remote request: GPU1 row 3 is local (GPU1 owns 2,3); GPU0 row 0 local; GPU3 6 local
    assert c.a2a_bytes == 0
    assert math.isinf(hugectr_threshold(5, 1))


# ------------------------------------------------------------------ analytic vs trace
def _draw_trace(p, G, B, L, iters, seed):
    rng = np.random.default_rng(seed)
    ids = rng.choice(p.size, size=G * B * L * iters, p=p)
    return Batch(["s"], ids, np.full(G * B * iters, L))


@pytest.mark.parametrize("kind", ["sequence", "pooled"])
@pytest.mark.parametrize("dedup", [True, False])
def test_analytic_agrees_with_trace(kind, dedup):
    H, G, B, L = 2000, 8, 16, 10
    topo = Topology.uniform(2, 4)
    p = 1.0 / np.arange(1, H + 1) ** 1.1
    p /= p.sum()
    t = EmbeddingTable("s", H, 16, "fp32", kind)
    order = np.argsort(-p)
    plan = Plan("x", topo, [TablePlan(t, ColdSharding.hashed(range(8), seed=3),
                                      global_ids=np.sort(order[:5]), node_ids=np.sort(order[5:20]),
                                      node_local=np.arange(15) % 4)])
    # the summary: top 500 rows explicit, the rest as a uniform tail (as the sketches provide)
    k = 500
    s = FrequencySummary("s", 10**9, order[:k], p[order[:k]] * 1e9, p[order[:k]] * 1e9,
                         p[order[:k]] * 1e9, H, H, H, float(p[order[k:]].sum() * 1e9), H - k,
                         H, True, 10**8, float(L))
    model = CostModel(dedup=dedup)
    an = evaluate_analytic(plan, {"s": s}, B, model)
    tr = evaluate_trace(plan, [_draw_trace(p, G, B, L, 40, 1)], B, model).mean
    for attr in ("a2a_bytes", "inter_node_bytes", "intra_node_bytes", "sync_bytes"):
        assert getattr(an, attr) == pytest.approx(getattr(tr, attr), rel=0.05), attr
    # times: the analytic mode is the slowest GPU of the *expected* traffic; the trace averages the
    # slowest GPU of each iteration, which is higher by the per-iteration imbalance (Jensen)
    from flexshard_stream.placement.cost import _a2a_time
    for comp in ("index", "forward", "backward"):
        of_mean = _a2a_time(topo, tr.send[comp], tr.recv[comp])
        assert an.time_s[comp] == pytest.approx(of_mean, rel=0.05), comp
        assert an.time_s[comp] <= tr.time_s[comp] * 1.02
    assert np.allclose(an.matrices["forward"], an.matrices["backward"].T)


# ------------------------------------------------------------------ errors
def test_trace_errors():
    plan = row_wise([TABLE], TOPO)
    with pytest.raises(BatchError, match=r"feature 'x'.*no table"):
        evaluate_trace(plan, [Batch(["x"], np.array([1, 2, 3, 4]), np.ones(4, np.int64))], 1)
    with pytest.raises(BatchError, match=r"feature 's'.*ID 9.*out of range"):
        evaluate_trace(plan, [Batch(["s"], np.array([1, 2, 3, 9]), np.ones(4, np.int64))], 1)
    r = evaluate_trace(plan, [Batch(["s"], np.array([1, 2, 3]), np.ones(3, np.int64))], 1)
    assert r.mean.iterations == 0 and r.dropped_samples == 3


@given(plans_and_batches())
@settings(max_examples=40)
def test_fast_row_bytes_equal_per_table_rows(pb):
    plan, _, _ = pb
    ref = sum(tp.rows_per_gpu(plan.topology) * float(tp.table.row_bytes)
              for tp in plan.tables.values())
    assert np.allclose(plan.row_bytes_per_gpu, ref, rtol=0, atol=1e-6)
