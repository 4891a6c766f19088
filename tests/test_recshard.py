"""The host memory tier (RecShard): representation, files, accounting, the trace kernel against a
plain-Python reference, analytic vs trace, and ``recshard.split_cold``."""
import copy
import json

import numpy as np
import pytest
from flexshard_stream.kernels.hashing import HOST_SEED, host_u, host_u_np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexshard_stream import ConfigError
from flexshard_stream import testing as fst
from flexshard_stream.placement.baselines import row_wise, table_wise
from flexshard_stream.placement.cost import (
    Cost,
    CostModel,
    evaluate_analytic,
    evaluate_trace,
)
from flexshard_stream.placement.recshard import (
    HbmRoom,
    cold_rows_per_gpu,
    slow_memory_report,
    split_cold,
)
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.batch import Batch, slice_batch
from flexshard_stream.stats.summary import FrequencySummary

M64 = (1 << 64) - 1
FEW = settings(max_examples=30, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def mix64_py(x, seed):
    h = (x + seed * 0x9E3779B97F4A7C15) & M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    h ^= h >> 33
    return h


def host_u_py(r):
    return (mix64_py(int(r), int(HOST_SEED)) >> 11) * 2.0 ** -53


def strip(plan):
    return Plan(plan.strategy, plan.topology,
                [TablePlan(tp.table, tp.cold, tp.global_ids, tp.node_ids, tp.node_local,
                           tp.placed_ids, tp.placed_gpus) for tp in plan.tables.values()])


def with_fraction(plan, fractions):
    return Plan(plan.strategy, plan.topology,
                [TablePlan(tp.table, tp.cold, tp.global_ids, tp.node_ids, tp.node_local,
                           tp.placed_ids, tp.placed_gpus, fractions.get(n, []))
                 for n, tp in plan.tables.items()])


TOPO = Topology.uniform(2, 2)
TAB = EmbeddingTable("s", 40, 4, "fp32", "sequence", optimizer_state_bytes=8)


# ----------------------------------------------------------------------------- the hash
def test_host_hash_numpy_twin_and_python_reference():
    from numba import njit

    @njit
    def many(ids):
        out = np.empty(ids.size)
        for i in range(ids.size):
            out[i] = host_u(ids[i])
        return out

    ids = np.concatenate([np.arange(500), np.random.default_rng(0).integers(0, 2**62, 500)])
    a, b = many(ids.astype(np.int64)), host_u_np(ids)
    assert np.array_equal(a, b)
    assert all(host_u_py(r) == u for r, u in zip(ids[:200].tolist(), b[:200]))
    assert 0.0 <= b.min() and b.max() < 1.0
    assert abs(host_u_np(np.arange(100000)).mean() - 0.5) < 0.01


# ----------------------------------------------------------------------------- representation
def test_validation_names_the_table():
    cold = ColdSharding.ranges(range(4), 40)
    with pytest.raises(ConfigError, match=r"table 's'.*hbm_fraction.*\[0, 1\]"):
        TablePlan(TAB, cold, hbm_fraction=[0.5, 1.2, 0.0, 1.0])
    with pytest.raises(ConfigError, match=r"table 's'.*hbm_fraction.*\[0, 1\]"):
        TablePlan(TAB, cold, hbm_fraction=[0.5, np.nan, 0.0, 1.0])
    with pytest.raises(ConfigError, match=r"table 's'.*data-parallel.*host memory tier"):
        TablePlan(TAB, ColdSharding.replicated(), hbm_fraction=[0.5] * 4)
    tp = TablePlan(TAB, cold, hbm_fraction=[0.5] * 3)       # G unknown here
    with pytest.raises(ConfigError, match=r"table 's'.*hbm_fraction has 3 values.*\(4\)"):
        Plan("x", TOPO, [tp])
    ok = TablePlan(TAB, cold)
    assert ok.hbm_fraction.size == 0 and ok.hbm_fraction.dtype == np.float64
    assert not ok.has_host_tier


def test_equality_and_save_load_round_trip(tmp_path):
    base = row_wise([TAB, EmbeddingTable("p", 30, 8, "fp16", "pooled")], TOPO)
    p = with_fraction(base, {"s": [0.25, 1.0, 0.0, 0.5]})
    assert p != base and p == with_fraction(base, {"s": [0.25, 1.0, 0.0, 0.5]})
    assert p != with_fraction(base, {"s": [0.25, 1.0, 0.0, 0.6]})
    back = Plan.load(p.save(tmp_path / "plan"))
    assert back == p
    assert np.array_equal(back["s"].hbm_fraction, [0.25, 1.0, 0.0, 0.5])
    assert back["p"].hbm_fraction.size == 0
    doc = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert doc["host_memory_per_gpu_bytes"] == pytest.approx(p.host_bytes_per_gpu.tolist())
    assert fst.check_plan(p) == []


def test_plans_written_before_the_tier_still_load(tmp_path):
    base = row_wise([TAB], TOPO)
    d = base.save(tmp_path / "old")
    # a plan directory as written before this change: no hbm_fraction array at all
    doc = json.loads((d / "plan.json").read_text())
    for entry in doc["tables"]:
        spec = entry["arrays"].pop("hbm_fraction")
        (d / spec["file"]).unlink()
    doc.pop("host_memory_per_gpu_bytes")
    doc.pop("checksum")                     # nor a checksum of plan.json, nor a kind marker
    (d / ".flexshard-kind").unlink()
    (d / "plan.json").write_text(json.dumps(doc))
    back = Plan.load(d)
    assert back == base and back["s"].hbm_fraction.size == 0


def test_memory_accounting_hbm_and_host():
    tabs = [TAB, EmbeddingTable("h", 50, 2, "fp16", "pooled")]
    topo = TOPO
    rw = row_wise(tabs, topo)
    # placed rows and replicas stay in HBM; the hash split counts (1 - f) of the other cold rows
    tps = [TablePlan(TAB, ColdSharding.ranges(range(4), 40), global_ids=[3], node_ids=[7],
                     node_local=[1], placed_ids=[0, 11, 25], placed_gpus=[3, 3, 0],
                     hbm_fraction=[0.5, 0.0, 1.0, 0.25]),
           TablePlan(tabs[1], ColdSharding.hashed(range(4), seed=5), placed_ids=[1], placed_gpus=[2],
                     hbm_fraction=[0.0, 0.0, 0.0, 0.0])]
    p = Plan("x", topo, tps)
    total = sum(tp.rows_per_gpu(topo) * float(tp.table.row_bytes) for tp in tps)
    host = sum(tp.host_rows_per_gpu(topo) * float(tp.table.row_bytes) for tp in tps)
    assert np.allclose(p.host_bytes_per_gpu, host)
    assert np.allclose(p.row_bytes_per_gpu + p.host_bytes_per_gpu, total)
    # table s: GPU g owns rows [10 g, 10 g + 10); its cold rows are those outside the tiers
    ids = np.arange(40)
    special = np.isin(ids, [3, 7, 0, 11, 25])
    cold_s = np.bincount(ids[~special] // 10, minlength=4).astype(float)
    assert np.allclose(tps[0].host_rows_per_gpu(topo), (1 - tps[0].hbm_fraction) * cold_s)
    # no tier anywhere: the HBM bytes are exactly what they were, host bytes zero
    assert np.array_equal(rw.host_bytes_per_gpu, np.zeros(4))
    assert np.allclose(rw.row_bytes_per_gpu,
                       sum(tp.rows_per_gpu(topo) * float(tp.table.row_bytes)
                           for tp in rw.tables.values()), rtol=0, atol=0)


def test_cost_defaults_and_json():
    c = evaluate_analytic(row_wise([TAB], TOPO), {"s": fst.zipf_summary(TAB, 1.0)}, 4)
    assert np.array_equal(c.host_lookups, np.zeros(4)) and c.uvm_time_s == 0.0
    assert c.iteration_time_s == c.comm_time_s
    j = c.to_json()
    for k in ("host_lookups_per_iter", "uvm_time_s_per_iter", "iteration_time_s", "host_bytes_max"):
        assert j[k] == (c.comm_time_s if k == "iteration_time_s" else 0.0)
    # constructors without the new fields keep working
    z = {k: np.zeros((4, 3)) for k in ("index", "forward", "backward", "sync")}
    Cost(TOPO, z, z, {k: 0.0 for k in z}, np.zeros(4), np.zeros(4))


# ----------------------------------------------------------------------------- trace: brute force
def brute_host(plan, batch, B, dedup):
    """Host lookups per GPU (and UVM bytes) of one iteration, one ID at a time."""
    topo = plan.topology
    G = topo.num_gpus
    host = np.zeros(G)
    uvm = np.zeros(G)
    by_feat = {tp.table.feature: tp for tp in plan.tables.values()}
    for k in batch.keys:
        tp = by_feat[k]
        vals = batch.feature_values(k)
        lens = batch.feature_lengths(k)
        src = np.repeat(np.arange(lens.size) // B, lens)
        owner = plan.route(tp.name, vals, src)
        special = set(tp.global_ids.tolist()) | set(tp.node_ids.tolist()) | set(
            tp.placed_ids.tolist())
        seen = set()
        per = float(tp.table.embedding_bytes + 2 * tp.table.row_bytes)
        for r, s, g in zip(vals.tolist(), src.tolist(), owner.tolist()):
            if not tp.has_host_tier or tp.replicated or r in special:
                continue
            if host_u_py(r) < tp.hbm_fraction[g]:
                continue
            if dedup:
                if (s, r) in seen:
                    continue
                seen.add((s, r))
            host[g] += 1
            uvm[g] += per
    return host, uvm


@st.composite
def tiered_plans_and_batches(draw):
    topo = draw(fst.topologies(3, 3, skewed=False))
    tabs = draw(fst.tables(2, 60, kinds=("sequence", "pooled")))
    plan = draw(fst.plans(topo, tabs, host_tier=True, max_tier_rows=8))
    G = topo.num_gpus
    B = draw(st.integers(1, 3))
    n_it = draw(st.integers(1, 2))
    keys, vals, lens = [], [], []
    for t in tabs:
        ls = draw(st.lists(st.integers(0, 5), min_size=G * B * n_it, max_size=G * B * n_it))
        keys.append(t.feature)
        lens.extend(ls)
        # few distinct rows, so that de-duplication matters
        vals.extend(draw(st.lists(st.integers(0, t.num_rows - 1), min_size=sum(ls),
                                  max_size=sum(ls))))
    return plan, Batch(keys, np.array(vals, np.int64), np.array(lens, np.int64)), B, n_it


@given(tiered_plans_and_batches(), st.booleans())
@FEW
def test_trace_host_lookups_equal_brute_force(pbb, dedup):
    plan, batch, B, n_it = pbb
    G = plan.topology.num_gpus
    # brute_host de-duplicates every table, as the ideal profile does (TorchRec does not
    # de-duplicate pooled tables)
    model = CostModel(dedup=dedup, profile="ideal")
    tc = evaluate_trace(plan, [batch], B, model, keep_matrices=True)
    ref_h, ref_u = np.zeros(G), np.zeros(G)
    for i in range(n_it):
        h, u = brute_host(plan, slice_batch(batch, i * G * B, (i + 1) * G * B), B, dedup)
        ref_h += h
        ref_u += u
        assert tc.per_iteration["host_lookups"][i] == h.sum()
    assert np.array_equal(tc.mean.host_lookups * n_it, ref_h)
    assert np.allclose(tc.mean.uvm_bytes * n_it, ref_u, rtol=1e-12, atol=0)
    assert tc.mean.uvm_time_s == pytest.approx(float((ref_u / n_it / plan.topology.uvm_bw).max()))
    assert np.array_equal(tc.mean.host_bytes, plan.host_bytes_per_gpu)
    # the tier changes where rows sit, not the traffic between GPUs
    flat = evaluate_trace(strip(plan), [batch], B, model, keep_matrices=True)
    for a, b in zip(tc.matrices, flat.matrices):
        for comp in ("index", "forward", "backward", "sync"):
            assert np.array_equal(a[comp], b[comp])
    assert flat.mean.host_lookups.sum() == 0


# ----------------------------------------------------------------------------- analytic vs trace
def _zipf(H, alpha):
    p = 1.0 / np.arange(1, H + 1) ** alpha
    return p / p.sum()


@pytest.mark.parametrize("kind,dedup,cold", [("sequence", True, "hash"), ("sequence", False, "range"),
                                             ("pooled", True, "range"), ("pooled", False, "hash")])
def test_analytic_host_lookups_agree_with_trace(kind, dedup, cold):
    H, G, B, L = 4000, 8, 16, 10
    topo = Topology.uniform(2, 4)
    rng = np.random.default_rng(7)
    perm = rng.permutation(H)
    p = np.empty(H)
    p[perm] = _zipf(H, 0.9)                      # row perm[i] has rank i
    t = EmbeddingTable("s", H, 16, "fp32", kind, optimizer_state_bytes=64)
    cs = ColdSharding.hashed(range(G), seed=3) if cold == "hash" else ColdSharding.ranges(range(G), H)
    frac = np.array([0.2, 0.5, 0.9, 0.0, 1.0, 0.35, 0.6, 0.75])
    placed = np.sort(perm[10:40])
    plan = Plan("x", topo, [TablePlan(t, cs, global_ids=np.sort(perm[:5]),
                                      node_ids=np.sort(perm[5:10]), node_local=np.arange(5) % 4,
                                      placed_ids=placed, placed_gpus=placed % G,
                                      hbm_fraction=frac)])
    k = 400
    top = perm[:k]
    s = FrequencySummary("s", 10**9, top, p[top] * 1e9, p[top] * 1e9, p[top] * 1e9, H, H, H,
                         float(p[perm[k:]].sum() * 1e9), H - k, H, True, 10**8, float(L))
    ids = rng.choice(H, size=G * B * L * 60, p=p)
    batch = Batch(["s"], ids, np.full(G * B * 60, L))
    model = CostModel(dedup=dedup)
    an = evaluate_analytic(plan, {"s": s}, B, model)
    tr = evaluate_trace(plan, [batch], B, model).mean
    assert an.host_lookups.sum() > 0
    assert an.host_lookups.sum() == pytest.approx(tr.host_lookups.sum(), rel=0.03)
    assert np.allclose(an.host_lookups, tr.host_lookups, rtol=0.08, atol=0.02 * tr.host_lookups.max())
    assert an.uvm_time_s == pytest.approx(tr.uvm_time_s, rel=0.08)
    assert an.host_lookups[4] == 0 and tr.host_lookups[4] == 0     # f = 1 on GPU 4
    assert np.array_equal(an.host_bytes, tr.host_bytes)
    # routing unchanged: the traffic is the traffic of the plan without the tier
    flat = evaluate_analytic(strip(plan), {"s": s}, B, model)
    assert an.a2a_bytes == flat.a2a_bytes and an.comm_time_s == flat.comm_time_s
    assert an.iteration_time_s == pytest.approx(an.comm_time_s + an.uvm_time_s)


# ----------------------------------------------------------------------------- split_cold
def skewed_workload(G_nodes=2, M=4, seed=0, hash_cold=False, alpha=1.1):
    topo = Topology.uniform(G_nodes, M)
    tabs = [EmbeddingTable("a", 6000, 16, "fp32", "sequence", optimizer_state_bytes=64),
            EmbeddingTable("b", 3000, 32, "fp16", "pooled"),
            EmbeddingTable("c", 800, 8, "fp32", "sequence", optimizer_state_bytes=4)]
    sums = {t.name: fst.zipf_summary(t, alpha, total=10**6, top_k=min(t.num_rows, 500),
                                     seed=seed + i, mean_length=(20.0, 4.0, 2.0)[i])
            for i, t in enumerate(tabs)}
    if hash_cold:
        plan = Plan("hash", topo, [TablePlan(t, ColdSharding.hashed(range(topo.num_gpus), seed=i))
                                   for i, t in enumerate(tabs)])
    else:
        plan = row_wise(tabs, topo)
    return topo, tabs, sums, plan


def budget_for(plan, sums, B, keep, model=None):
    """A budget that keeps ``keep`` of the most loaded GPU's cold rows in HBM."""
    c = evaluate_analytic(plan, sums, B, model)
    cold = cold_rows_per_gpu(plan) @ np.array([t.table.row_bytes for t in plan.tables.values()],
                                              float)
    fixed = c.peak_memory_per_gpu - cold
    return float(fixed.max() + keep * cold.max()), c


@pytest.mark.parametrize("hash_cold", [False, True])
def test_non_cold_rows_and_cold_rows_add_up_to_the_table(hash_cold):
    """``Plan.non_cold_rows_per_gpu`` (replicas and placed rows) plus ``cold_rows_per_gpu`` is
    every row each GPU stores, and the non-cold rows are counted by hand here."""
    topo, tabs, sums, plan = skewed_workload(hash_cold=hash_cold)
    G, M = topo.num_gpus, topo.gpus_per_node
    order = fst.summary_order(tabs[0], sums["a"], 40)
    tps = list(plan.tables.values())
    tps[0] = TablePlan(tabs[0], tps[0].cold, global_ids=np.sort(order[:5]),
                       node_ids=np.sort(order[5:15]), node_local=np.arange(10) % M,
                       placed_ids=np.sort(order[15:40]), placed_gpus=np.arange(25) % G)
    plan = Plan(plan.strategy, topo, tps)
    cold = cold_rows_per_gpu(plan)
    for t, tp in enumerate(plan.tables.values()):
        extra = Plan.non_cold_rows_per_gpu(tp, topo)
        assert np.array_equal(extra + cold[:, t], tp.rows_per_gpu(topo))
    by_hand = 5 + np.tile(np.bincount(np.arange(10) % M, minlength=M), topo.nodes) \
        + np.bincount(np.arange(25) % G, minlength=G)
    assert np.array_equal(Plan.non_cold_rows_per_gpu(tps[0], topo), by_hand)
    assert not Plan.non_cold_rows_per_gpu(tps[1], topo).any()


@pytest.mark.parametrize("keep", [0.1, 0.5, 1.5])
def test_hbm_room_is_the_budget_less_what_stays_in_hbm(keep):
    """Capacity per GPU = budget - (peak - cold bytes), less a 1e-12 margin; the overflowing GPUs
    are those whose cold bytes exceed it, and only they get rows in host memory."""
    topo, tabs, sums, plan = skewed_workload()
    budget, c = budget_for(plan, sums, 16, keep)
    b = np.full(topo.num_gpus, budget)
    room = HbmRoom.measure(plan, c, b)
    fixed = c.peak_memory_per_gpu - room.cold_bytes
    assert np.allclose(room.capacity, np.maximum(b - fixed, 0), rtol=1e-9)
    assert np.array_equal(room.over, room.cold_bytes > room.capacity * (1 + 1e-9))
    assert room.over.any() == (keep < 1)
    host = split_cold(plan, sums, 16, b, cost=c).host_bytes_per_gpu
    assert np.array_equal(host > 0, room.over)


@pytest.mark.parametrize("aware", [True, False])
@pytest.mark.parametrize("hash_cold", [False, True])
@pytest.mark.parametrize("keep", [0.1, 0.5])
def test_split_fits_the_budget_and_keeps_routing(aware, hash_cold, keep):
    topo, tabs, sums, plan = skewed_workload(hash_cold=hash_cold)
    B = 16
    budget, base = budget_for(plan, sums, B, keep)
    before = copy.deepcopy(plan)
    p = split_cold(plan, sums, B, budget, frequency_aware=aware)
    assert plan == before and not plan.has_host_tier           # input untouched
    c = evaluate_analytic(p, sums, B)
    peak = c.peak_memory_per_gpu
    assert np.all(peak <= budget)                              # no float slack needed
    has_host = p.host_bytes_per_gpu > 0
    assert has_host.any()
    assert np.allclose(peak[has_host], budget, rtol=1e-9)      # fills the budget exactly
    assert np.allclose(c.buffer_bytes, base.buffer_bytes, rtol=1e-12)
    assert c.a2a_bytes == pytest.approx(base.a2a_bytes, rel=1e-12)
    # all memory is somewhere: HBM + host = the rows of the plan
    assert np.allclose(p.row_bytes_per_gpu + p.host_bytes_per_gpu, plan.row_bytes_per_gpu)
    G = topo.num_gpus
    for t in tabs:
        ids = np.arange(t.num_rows)
        for src in range(G):
            assert np.array_equal(p.route(t.name, ids, src), plan.route(t.name, ids, src))
    if not aware:
        assert p.meta["recshard"]["placed_rows_added"] == 0
        fr = [tp.hbm_fraction for tp in p.tables.values() if tp.has_host_tier]
        assert all(np.array_equal(fr[0], f) for f in fr)       # one fraction per GPU
        for tp in p.tables.values():
            assert np.array_equal(tp.placed_ids, plan[tp.name].placed_ids)
    assert fst.check_plan(p, summaries=sums, batch_size=B, budget_bytes=budget) == []


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("keep", [0.05, 0.25, 0.5])
def test_aware_never_more_host_lookups_than_blind(dedup, keep):
    topo, tabs, sums, plan = skewed_workload(seed=3)
    B = 16
    model = CostModel(dedup=dedup)
    budget, _ = budget_for(plan, sums, B, keep, model)
    aware = split_cold(plan, sums, B, budget, model)
    blind = split_cold(plan, sums, B, budget, model, frequency_aware=False)
    ca = evaluate_analytic(aware, sums, B, model)
    cb = evaluate_analytic(blind, sums, B, model)
    assert ca.host_lookups_total <= cb.host_lookups_total
    assert ca.uvm_time_s <= cb.uvm_time_s * (1 + 1e-9)
    rep = slow_memory_report(ca, cb)
    assert 0 < rep["slow_memory_access_reduction_vs_blind"] <= 1
    assert rep["uvm_time_speedup_vs_blind"] >= 1
    # out of sample, in trace mode
    batches = fst.sample_batches(tabs, sums, topo, B, iterations=3, seed=11)
    ta = evaluate_trace(aware, batches, B, model).mean
    tb = evaluate_trace(blind, batches, B, model).mean
    assert ta.host_lookups_total < tb.host_lookups_total
    assert ta.comm_time_s == pytest.approx(tb.comm_time_s, rel=1e-12)


def test_budget_too_small_raises_and_leaves_the_plan():
    topo, tabs, sums, plan = skewed_workload()
    B = 16
    c = evaluate_analytic(plan, sums, B)
    before = copy.deepcopy(plan)
    budget = float(c.buffer_bytes.min()) * 0.5
    with pytest.raises(ConfigError, match=r"GPU \d+.*take [0-9.e+]+ bytes.*budget of [0-9.e+]+ "
                                          r"bytes"):
        split_cold(plan, sums, B, budget)
    with pytest.raises(ConfigError, match=r"GPU 3"):
        b = np.full(topo.num_gpus, 1e12)
        b[3] = budget
        split_cold(plan, sums, B, b, frequency_aware=False)
    assert plan == before and not plan.has_host_tier


def test_host_memory_overflow_raises():
    topo, tabs, sums, plan = skewed_workload()
    small = Topology.uniform(2, 4, host_memory_bytes_per_node=1000.0)
    plan = Plan(plan.strategy, small, list(plan.tables.values()))
    budget, _ = budget_for(plan, sums, 16, 0.2)
    with pytest.raises(ConfigError, match=r"host memory overflow on node \d.*host_memory_bytes"):
        split_cold(plan, sums, 16, budget)


def test_everything_fits_in_hbm_gives_no_tier():
    topo, tabs, sums, plan = skewed_workload()
    c = evaluate_analytic(plan, sums, 16)
    for aware in (True, False):
        p = split_cold(plan, sums, 16, c.peak_memory_bytes * 1.01, frequency_aware=aware)
        assert not p.has_host_tier and p == plan and p is not plan
        assert p.meta["recshard"]["host_tier"] is False
    # an existing tier is replaced: with room for everything it goes away
    tiered = with_fraction(plan, {"a": np.full(topo.num_gpus, 0.5)})
    p = split_cold(tiered, sums, 16, c.peak_memory_bytes * 1.01)
    assert p == plan and tiered["a"].has_host_tier


def test_split_on_table_wise_and_replicas():
    topo, tabs, sums, _ = skewed_workload()
    plan = table_wise(tabs, topo)
    order = fst.summary_order(tabs[0], sums["a"], 60)
    tps = list(plan.tables.values())
    tps[0] = TablePlan(tabs[0], tps[0].cold, global_ids=np.sort(order[:20]),
                       node_ids=np.sort(order[20:60]), node_local=np.arange(40) % 4)
    plan = Plan("tw+", topo, tps)
    budget, _ = budget_for(plan, sums, 8, 0.3)
    for aware in (True, False):
        p = split_cold(plan, sums, 8, budget, frequency_aware=aware)
        assert fst.check_plan(p, summaries=sums, batch_size=8, budget_bytes=budget) == []
        assert np.array_equal(p["a"].global_ids, plan["a"].global_ids)
        # GPUs without cold rows get no host bytes
        cold = cold_rows_per_gpu(plan).sum(axis=1)
        assert np.all(p.host_bytes_per_gpu[cold == 0] == 0)


def test_aware_keeps_the_hottest_rows_and_places_only_what_it_must():
    topo, tabs, sums, plan = skewed_workload(seed=5)
    B = 16
    budget, _ = budget_for(plan, sums, B, 0.25)
    p = split_cold(plan, sums, B, budget)
    for t in tabs:
        tp = p[t.name]
        hot = fst.summary_order(t, sums[t.name], 30)
        owners = plan.route(t.name, hot, 0)
        placed = np.isin(hot, tp.placed_ids)
        # the hottest rows are in HBM: placed, or in a table block that stays wholly in HBM
        assert np.all(placed | tp.in_hbm(hot, owners))
        if not tp.has_host_tier:
            assert tp.placed_ids.size == 0      # nothing to place when the table stays in HBM
        else:
            ok = tp.hbm_fraction[tp.placed_gpus] < 1.0
            assert np.all(ok)                   # placed only where the table spills
    assert p.meta["recshard"]["placed_rows_added"] == sum(tp.placed_ids.size
                                                          for tp in p.tables.values())
    # host lookups fall as the budget grows
    prev = np.inf
    for keep in (0.05, 0.2, 0.5, 0.9):
        b, _ = budget_for(plan, sums, B, keep)
        h = evaluate_analytic(split_cold(plan, sums, B, b), sums, B).host_lookups_total
        assert h <= prev * (1 + 1e-9)
        prev = h


def test_existing_placed_rows_and_repeated_summary_ids():
    topo, tabs, sums, plan = skewed_workload(seed=2)
    B = 16
    t = tabs[0]
    s = sums["a"]
    # the summary lists its hottest row twice; the plan already places a few cold rows
    dup = FrequencySummary("a", s.total, np.concatenate([s.top_ids[:1], s.top_ids]),
                           np.concatenate([s.top_est[:1], s.top_est]),
                           np.concatenate([s.top_lower[:1], s.top_lower]),
                           np.concatenate([s.top_upper[:1], s.top_upper]), s.distinct_estimate,
                           s.distinct_lower, s.distinct_upper, s.tail_mass, s.tail_rows,
                           s.num_rows, s.exact, s.samples, s.mean_length)
    sums2 = dict(sums, a=dup)
    pre = np.sort(s.top_ids[5:15])
    tps = list(plan.tables.values())
    tps[0] = TablePlan(t, tps[0].cold, placed_ids=pre, placed_gpus=(pre % topo.num_gpus))
    plan = Plan("rw+", topo, tps)
    budget, _ = budget_for(plan, sums2, B, 0.1)
    p = split_cold(plan, sums2, B, budget)
    assert np.all(np.isin(pre, p["a"].placed_ids))
    i = np.searchsorted(p["a"].placed_ids, pre)
    assert np.array_equal(p["a"].placed_gpus[i], pre % topo.num_gpus)
    assert fst.check_plan(p, summaries=sums2, batch_size=B, budget_bytes=budget) == []
    c = evaluate_analytic(p, sums2, B)
    assert np.all(c.peak_memory_per_gpu <= budget * (1 + 1e-9))


# ----------------------------------------------------------------------------- testing helpers
@given(fst.plans(fst.topologies(2, 3), fst.tables(2, 200), host_tier=True))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_tiered_plans_pass_check_plan(plan):
    assert fst.check_plan(plan) == []


def test_check_plan_catches_a_bad_fraction():
    p = with_fraction(row_wise([TAB], TOPO), {"s": [0.5] * 4})
    object.__setattr__(p["s"], "hbm_fraction", np.array([0.5, 0.5, 2.0, 0.5]))
    v = fst.check_plan(p, round_trip=False)
    assert any("hbm_fraction outside [0, 1]" in x for x in v)
    q = with_fraction(row_wise([TAB], TOPO), {"s": [0.5] * 4})
    object.__setattr__(q["s"], "hbm_fraction", np.array([0.5, 0.5]))
    v = fst.check_plan(q, round_trip=False)
    assert any("hbm_fraction has 2 values for 4 GPUs" in x for x in v)
    # a node whose host memory is too small for what the tier sends there
    tiny = Topology.uniform(2, 2, host_memory_bytes_per_node=100.0)
    z = Plan("x", tiny, [TablePlan(TAB, ColdSharding.ranges(range(4), 40),
                                   hbm_fraction=[0.0] * 4)])
    assert any("host_memory_bytes" in x for x in fst.check_plan(z))
