"""PlanDelta: exact round trips (apply / invert / compose), refusal of a wrong base, migration bytes
against a brute-force reference built on Plan.route and on hand-computed cases, serialization."""
import dataclasses
import json
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexshard_stream import testing as fst
from flexshard_stream.errors import FormatError, IncompatibleError
from flexshard_stream.formats.container import pack, unpack
from flexshard_stream.formats.files import jsonable
from flexshard_stream.plans.delta import COLD_CODE, PlanDelta, compose, plan_fingerprint
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology

HAS_HBM = "hbm_fraction" in {f.name for f in dataclasses.fields(TablePlan)}


# ================================================================ helpers
def codes_of(tp):
    """Placement code of every row (reference, independent of delta.py)."""
    c = np.full(tp.table.num_rows, COLD_CODE, np.int64)
    c[tp.global_ids] = -1
    c[tp.node_ids] = -2 - tp.node_local
    c[tp.placed_ids] = tp.placed_gpus
    return c


def table_plan(table, cold, codes, **extra):
    ids = np.arange(codes.size)
    nd = (codes <= -2) & (codes != COLD_CODE)
    return TablePlan(table, cold, global_ids=ids[codes == -1], node_ids=ids[nd],
                     node_local=(-2 - codes[nd]).astype(np.int32), placed_ids=ids[codes >= 0],
                     placed_gpus=codes[codes >= 0].astype(np.int32), **extra)


def random_cold(rng, tp, G):
    H, c = tp.table.num_rows, tp.cold
    r = rng.integers(0, 6)
    if r == 0:
        return ColdSharding.replicated()
    if r == 1:  # same hash seed or a new one, maybe other GPUs
        gp = rng.permutation(G)[:rng.integers(1, G + 1)]
        return ColdSharding.hashed(gp, seed=int(c.seed if rng.random() < 0.5 else rng.integers(9)))
    if r == 2 and c.kind == "range":  # shift one bound
        b = c.bounds.copy()
        if b.size > 2:
            j = rng.integers(1, b.size - 1)
            b[j] = np.clip(b[j] + rng.integers(-50, 51), b[j - 1], b[j + 1])
        return ColdSharding("range", c.gpus, b)
    if r == 3:
        return ColdSharding.ranges(range(G), H, rng.uniform(0.1, 3.0, G))
    if r == 4:
        return ColdSharding.ranges(rng.permutation(G)[:rng.integers(1, G + 1)], H)
    return c


def mutate(plan, rng, change_cold=True):
    """A plan for the same tables: some rows change tier or GPU, maybe a new cold function and
    host memory tier, maybe another strategy and meta."""
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    tps = []
    for tp in plan.tables.values():
        H = tp.table.num_rows
        codes = codes_of(tp)
        cold = random_cold(rng, tp, G) if change_cold and rng.random() < 0.5 else tp.cold
        k = int(rng.integers(0, min(H, 24) + 1))
        rows = rng.choice(H, size=k, replace=False)
        choice = rng.integers(0, 4, size=k)
        codes[rows] = np.select([choice == 0, choice == 1, choice == 2],
                                [np.full(k, -1), -2 - rng.integers(0, M, size=k),
                                 rng.integers(0, G, size=k)], COLD_CODE)
        extra = {}
        if cold.kind == "replicated":
            codes[:] = COLD_CODE
        elif HAS_HBM:
            hf = tp.hbm_fraction
            if rng.random() < 0.3:
                hf = rng.uniform(0, 1, G).round(2)
            elif rng.random() < 0.1:
                hf = np.zeros(0)
            extra["hbm_fraction"] = hf
        tps.append(table_plan(tp.table, cold, codes, **extra))
    strategy = plan.strategy if rng.random() < 0.7 else "other"
    meta = dict(plan.meta)
    if rng.random() < 0.3:
        meta = {"step": int(rng.integers(100)), "weights": np.arange(3.0)}
    return Plan(strategy, topo, tps, meta)


@st.composite
def chains(draw, length=2, max_rows=1200):
    """``length`` plans for the same topology and tables: each one mutated from the previous or
    drawn afresh by ``testing.plans``."""
    topo = draw(fst.topologies(3, 3))
    tabs = draw(fst.tables(3, max_rows))
    out = [draw(fst.plans(topo, tabs))]
    while len(out) < length:
        if draw(st.integers(0, 3)) == 0:
            out.append(draw(fst.plans(topo, tabs)))
        else:
            out.append(mutate(out[-1], np.random.default_rng(draw(st.integers(0, 2**31 - 1)))))
    return out


def same_plan(a, b):
    """Plan equality plus what Plan.__eq__ leaves out (meta, range weights)."""
    return (a == b and json.dumps(jsonable(a.meta, nonfinite_as_none=False))
            == json.dumps(jsonable(b.meta, nonfinite_as_none=False))
            and all(np.array_equal(a[n].cold.weights, b[n].cold.weights) for n in a.tables)
            and plan_fingerprint(a) == plan_fingerprint(b))


def holders(plan, name):
    """(G, H) bool: which GPUs hold each row, from the routing from every GPU."""
    tp, G = plan[name], plan.topology.num_gpus
    H = tp.table.num_rows
    own = plan.route(name, np.tile(np.arange(H), G), np.repeat(np.arange(G), H)).reshape(G, H)
    hold = np.zeros((G, H), bool)
    hold[own, np.broadcast_to(np.arange(H), (G, H))] = True
    return hold


def reference_migration(a, b):
    """Brute force: every GPU that gains a row receives it from an old holder in its node if any,
    else from another node."""
    topo = a.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    send, recv, rows = np.zeros((G, 3)), np.zeros((G, 3)), 0
    for name in a.tables:
        rb = a[name].table.row_bytes
        ho, hn = holders(a, name), holders(b, name)
        gain = hn & ~ho
        rows += int(gain.any(axis=0).sum())
        for d in range(G):
            cols = np.flatnonzero(gain[d])
            if not cols.size:
                continue
            n0 = (d // M) * M
            same = ho[n0:n0 + M][:, cols]
            has = same.any(axis=0)
            src = np.where(has, n0 + same.argmax(axis=0), ho[:, cols].argmax(axis=0))
            cls = np.where(has, 1, 2)
            np.add.at(send, (src, cls), rb)
            np.add.at(recv, (np.full(src.size, d), cls), rb)
    return send, recv, rows


def two_node_topo():
    return Topology.uniform(2, 2, intra_node_bandwidth=300e9, inter_node_bandwidth=25e9)


T96 = EmbeddingTable("t", 100, 8, "fp32", optimizer_state_bytes=64)   # row_bytes = 32 + 64 = 96


def simple_plan(topo, codes=None, cold=None, table=T96, strategy="s", meta=None):
    codes = np.full(table.num_rows, COLD_CODE, np.int64) if codes is None else codes
    cold = cold or ColdSharding.ranges(range(topo.num_gpus), table.num_rows)
    return Plan(strategy, topo, [table_plan(table, cold, codes)], meta)


# ================================================================ properties
@settings(max_examples=30)
@given(chains(2))
def test_round_trip_invert_and_migration_reference(ps):
    a, b = ps
    fa = plan_fingerprint(a)
    d = PlanDelta.between(a, b)
    out = d.apply(a)
    assert same_plan(out, b)
    assert plan_fingerprint(a) == fa          # input untouched
    assert fst.check_plan(out, round_trip=False) == []
    back = d.invert().apply(b)
    assert same_plan(back, a)
    assert d.invert().invert() == d
    assert bool(d) == (plan_fingerprint(a) != plan_fingerprint(b))
    # migration: exact cases against the brute force, all cases conserve bytes
    s, r = d.migration_send, d.migration_recv
    assert (s >= -1e-9).all() and (r >= -1e-9).all()
    assert np.allclose(s.sum(axis=0), r.sum(axis=0))
    assert s[:, 0].sum() == 0
    if d.migration_exact:
        rs, rr, rows = reference_migration(a, b)
        assert np.allclose(s, rs, rtol=1e-12, atol=1e-6)
        assert np.allclose(r, rr, rtol=1e-12, atol=1e-6)
        assert d.rows_moved == rows
    json.dumps(d.summary())


@settings(max_examples=25)
@given(chains(3))
def test_compose_equals_direct(ps):
    a, b, c = ps
    d1, d2 = PlanDelta.between(a, b), PlanDelta.between(b, c)
    d = compose(d1, d2)
    assert same_plan(d.apply(a), c)
    assert same_plan(d1.then(d2).invert().apply(c), a)
    direct = PlanDelta.between(a, c)
    for n, td in direct.tables.items():
        tc = d.tables[n]
        for f in ("ids", "old_codes", "new_codes", "kept_ids", "kept_codes"):
            x, y = getattr(td, f), getattr(tc, f)
            assert (x is None and y is None) or np.array_equal(x, y), (n, f)
        assert td.cold_old == tc.cold_old and td.cold_new == tc.cold_new
        assert set(td.extra_old) == set(tc.extra_old)
    assert np.allclose(d.migration_recv, direct.migration_recv)
    assert d.rows_moved == pytest.approx(direct.rows_moved)
    assert compose(d1, d1.invert()).is_empty
    if d1:
        with pytest.raises(IncompatibleError, match="cannot compose"):
            d1.then(d1)


@settings(max_examples=20)
@given(chains(2))
def test_wrong_base_refused_and_untouched(ps):
    a, b = ps
    d = PlanDelta.between(a, b)
    if plan_fingerprint(a) == plan_fingerprint(b):
        return
    fb = plan_fingerprint(b)
    with pytest.raises(IncompatibleError, match="does not apply"):
        d.apply(b)
    assert plan_fingerprint(b) == fb


# ================================================================ hand-built cases
def test_empty_delta_for_equal_plans():
    topo = two_node_topo()
    codes = np.full(100, COLD_CODE, np.int64)
    codes[[1, 2]] = -1
    codes[5] = -3
    a = simple_plan(topo, codes, meta={"x": 1})
    b = simple_plan(topo, codes.copy(), meta={"x": 1})
    d = PlanDelta.between(a, b)
    assert d.is_empty and not d
    assert d.migration_bytes == 0 and d.rows_moved == 0 and d.migration_time_s() == 0
    assert same_plan(d.apply(a), b)
    assert d.summary()["tables"] == {}


def test_row_moves_to_other_node():
    topo = two_node_topo()
    c0 = np.full(100, COLD_CODE, np.int64)
    c0[5] = 0
    c1 = c0.copy()
    c1[5] = 3
    a, b = simple_plan(topo, c0), simple_plan(topo, c1)
    d = PlanDelta.between(a, b)
    assert d.migration_bytes_by_class == {"local": 0.0, "intra_node": 0.0, "inter_node": 96.0}
    assert d.send_bytes_per_gpu.tolist() == [96, 0, 0, 0]
    assert d.recv_bytes_per_gpu.tolist() == [0, 0, 0, 96]
    assert d.rows_moved == 1
    assert d.migration_time_s() == pytest.approx(96 / 25e9)
    td = d.tables["t"]
    mv = td.moves("placed", "placed")
    assert mv.ids.tolist() == [5] and mv.old_place.tolist() == [0] and mv.new_place.tolist() == [3]
    s = d.summary()["tables"]["t"]
    assert s["placed"]["relocated"] == 1 and s["promoted"] == 0 and s["demoted"] == 0
    # the reverse: losing the only copy on GPU 3, gaining it on GPU 0
    assert d.invert().migration_recv[0, 2] == 96


def test_node_replica_on_every_node():
    topo = Topology.uniform(3, 2)
    c0 = np.full(100, COLD_CODE, np.int64)          # row 7 is cold: ranges of 17 rows, GPU 0
    c1 = c0.copy()
    c1[7] = -2 - 1                                  # node replica on local GPU 1: GPUs 1, 3, 5
    d = PlanDelta.between(simple_plan(topo, c0), simple_plan(topo, c1))
    assert d.migration_bytes_by_class["intra_node"] == 96        # 0 -> 1
    assert d.migration_bytes_by_class["inter_node"] == 2 * 96    # 0 -> 3, 0 -> 5
    assert d.send_bytes_per_gpu.tolist() == [288, 0, 0, 0, 0, 0]
    assert d.recv_bytes_per_gpu.tolist() == [0, 96, 0, 96, 0, 96]
    assert d.rows_moved == 1
    assert d.tables["t"].entered("node").tolist() == [7]
    assert d.tables["t"].left("cold").tolist() == [7]
    assert d.summary()["tables"]["t"]["promoted"] == 1
    # node replica -> global: every GPU of local index 0 receives from its node's local GPU 1
    c2 = c1.copy()
    c2[7] = -1
    d2 = PlanDelta.between(simple_plan(topo, c1), simple_plan(topo, c2))
    assert d2.migration_bytes_by_class == {"local": 0.0, "intra_node": 3 * 96.0, "inter_node": 0.0}
    assert d2.send_bytes_per_gpu.tolist() == [0, 96, 0, 96, 0, 96]
    # global -> cold: only losing holders, nothing moves
    d3 = PlanDelta.between(simple_plan(topo, c2), simple_plan(topo, c0))
    assert d3 and d3.migration_bytes == 0 and d3.rows_moved == 0
    assert d3.summary()["tables"]["t"]["demoted"] == 1


@pytest.mark.parametrize("k", [1, 7, 25])
def test_range_bounds_shift_moves_k_rows(k):
    topo = two_node_topo()
    b0 = np.array([0, 25, 50, 75, 100])
    b1 = b0.copy()
    b1[1] += k                                       # rows [25, 25 + k) go from GPU 1 to GPU 0
    a = simple_plan(topo, cold=ColdSharding("range", np.arange(4), b0))
    b = simple_plan(topo, cold=ColdSharding("range", np.arange(4), b1))
    d = PlanDelta.between(a, b)
    assert d.rows_moved == k
    assert d.migration_bytes_by_class["intra_node"] == 96 * k
    assert d.send_bytes_per_gpu[1] == 96 * k and d.recv_bytes_per_gpu[0] == 96 * k
    assert same_plan(d.apply(a), b)
    # a row explicitly placed in both plans inside the shifted region does not move
    codes = np.full(100, COLD_CODE, np.int64)
    codes[25] = -1
    d2 = PlanDelta.between(simple_plan(topo, codes, ColdSharding("range", np.arange(4), b0)),
                           simple_plan(topo, codes, ColdSharding("range", np.arange(4), b1)))
    assert d2.rows_moved == k - 1
    assert d2.tables["t"].kept_ids.tolist() == [25]


def test_huge_table_interval_arithmetic():
    topo = two_node_topo()
    H, k = 10**8, 123_457
    t = EmbeddingTable("big", H, 64, "fp16")
    b0 = np.array([0, H // 4, H // 2, 3 * H // 4, H])
    b1 = b0.copy()
    b1[2] -= k                                       # rows [H/2 - k, H/2) go from GPU 2 to GPU 1
    g_ids = np.array([10, H // 2 - 5, H // 2 - 3])   # global in both; two inside the shift
    tp0 = TablePlan(t, ColdSharding("range", np.arange(4), b0), global_ids=g_ids)
    tp1 = TablePlan(t, ColdSharding("range", np.arange(4), b1), global_ids=g_ids,
                    placed_ids=np.array([7]), placed_gpus=np.array([3]))
    a, b = Plan("s", topo, [tp0]), Plan("s", topo, [tp1])
    d = PlanDelta.between(a, b)
    assert d.migration_exact and d.rows_moved == k - 2 + 1   # + row 7: GPU 0 -> GPU 3
    assert d.migration_bytes_by_class["inter_node"] == (k - 2 + 1) * 128
    assert same_plan(d.apply(a), b)
    # hash seed change on a huge table: expected value (3/4 of the cold rows change owner)
    h0 = Plan("s", topo, [TablePlan(t, ColdSharding.hashed(range(4), seed=1))])
    h1 = Plan("s", topo, [TablePlan(t, ColdSharding.hashed(range(4), seed=2))])
    dh = PlanDelta.between(h0, h1)
    assert not dh.migration_exact
    assert dh.rows_moved == pytest.approx(0.75 * H)
    assert dh.migration_bytes == pytest.approx(0.75 * H * 128)
    assert dh.migration_bytes_by_class["inter_node"] == pytest.approx(0.5 * H * 128)


def test_hash_change_expected_value_close_to_actual():
    topo = two_node_topo()
    t = EmbeddingTable("h", 40_000, 4)
    a = Plan("s", topo, [TablePlan(t, ColdSharding.hashed(range(4), seed=1))])
    for c1 in (ColdSharding.hashed(range(4), seed=5), ColdSharding.hashed([0, 1, 2], seed=1),
               ColdSharding.ranges(range(4), t.num_rows)):
        b = Plan("s", topo, [TablePlan(t, c1)])
        d = PlanDelta.between(a, b)
        assert not d.migration_exact
        _s, r, rows = reference_migration(a, b)
        assert d.rows_moved == pytest.approx(rows, rel=0.02)
        assert d.migration_recv == pytest.approx(r, rel=0.05, abs=200)
    # same seed, same number of GPUs, another order: exact
    b = Plan("s", topo, [TablePlan(t, ColdSharding.hashed([1, 0, 2, 3], seed=1))])
    d = PlanDelta.between(a, b)
    _s, r, rows = reference_migration(a, b)
    assert d.migration_exact and d.rows_moved == rows and np.array_equal(d.migration_recv, r)


def test_replicated_transitions():
    topo = two_node_topo()
    a = simple_plan(topo)                                               # ranges of 25 rows
    b = simple_plan(topo, cold=ColdSharding.replicated())
    d = PlanDelta.between(a, b)
    assert d.rows_moved == 100
    assert d.migration_bytes_by_class["intra_node"] == 100 * 96       # one node-mate each
    assert d.migration_bytes_by_class["inter_node"] == 100 * 2 * 96   # two GPUs on the other node
    assert PlanDelta.between(b, a).migration_bytes == 0


# ================================================================ refusals
def test_apply_refuses_wrong_base_with_reasons():
    topo = two_node_topo()
    c0 = np.full(100, COLD_CODE, np.int64)
    c0[[3, 4]] = -1
    c1 = c0.copy()
    c1[3] = 2
    a, b = simple_plan(topo, c0, meta={"v": 1}), simple_plan(topo, c1, meta={"v": 2})
    d = PlanDelta.between(a, b)
    moved = c0.copy()
    moved[3] = 1                                     # row 3 is not where the delta says
    wrong = simple_plan(topo, moved, meta={"v": 1})
    with pytest.raises(IncompatibleError, match=r"row 3 is placed on GPU 1.*global"):
        d.apply(wrong)
    other = c0.copy()
    other[50] = 0                                    # a row the delta does not touch
    with pytest.raises(IncompatibleError, match="fingerprint"):
        d.apply(simple_plan(topo, other, meta={"v": 1}))
    with pytest.raises(IncompatibleError, match="meta differs"):
        d.apply(simple_plan(topo, c0, meta={"v": 3}))
    with pytest.raises(IncompatibleError, match="topolog"):
        d.apply(simple_plan(Topology.uniform(1, 4), c0, meta={"v": 1}))
    with pytest.raises(IncompatibleError, match="cold sharding"):
        d.apply(simple_plan(topo, c0, ColdSharding.hashed(range(4)), meta={"v": 1}))
    fw = plan_fingerprint(wrong)
    with pytest.raises(IncompatibleError):
        d.apply(wrong)
    assert plan_fingerprint(wrong) == fw and codes_of(wrong["t"]).tolist() == moved.tolist()


def test_between_incompatible_plans():
    topo = two_node_topo()
    a = simple_plan(topo)
    with pytest.raises(IncompatibleError, match="topolog"):
        PlanDelta.between(a, simple_plan(Topology.uniform(1, 4)))
    t2 = EmbeddingTable("t", 200, 8, "fp32", optimizer_state_bytes=64)
    with pytest.raises(IncompatibleError, match="num_rows 100 -> 200"):
        PlanDelta.between(a, simple_plan(topo, table=t2))
    u = EmbeddingTable("u", 100, 8)
    with pytest.raises(IncompatibleError, match="'u'"):
        PlanDelta.between(a, simple_plan(topo, table=u))


@pytest.mark.skipif(not HAS_HBM, reason="TablePlan has no hbm_fraction")
def test_hbm_fraction_change():
    topo = two_node_topo()
    t = EmbeddingTable("h", 1000, 16)
    tp = TablePlan(t, ColdSharding.ranges(range(4), 1000), global_ids=np.arange(10))
    a = Plan("s", topo, [tp])
    b = Plan("s", topo, [dataclasses.replace(tp, hbm_fraction=np.full(4, 0.25))])
    d = PlanDelta.between(a, b)
    assert d and d.tables["h"].extra_old
    assert same_plan(d.apply(a), b) and same_plan(d.invert().apply(b), a)
    assert d.migration_bytes == 0
    assert np.allclose(d.host_transfer_bytes_per_gpu, b.host_bytes_per_gpu)
    assert d.migration_time_s() == pytest.approx((b.host_bytes_per_gpu / topo.uvm_bw).max())
    back = PlanDelta.from_bytes(d.to_bytes())
    assert back == d and same_plan(back.apply(a), b)


# ================================================================ files
def test_serialization_round_trip_and_damage(tmp_path):
    rng = np.random.default_rng(3)
    topo = Topology.uniform(2, 3)
    tabs = [EmbeddingTable("t0", 500, 8), EmbeddingTable("t1", 300, 4, "fp16", "pooled", "f1", 8)]
    tps = [TablePlan(tabs[0], ColdSharding.ranges(range(6), 500, [1, 2, 1, 2, 1, 2]),
                     global_ids=np.arange(5)),
           TablePlan(tabs[1], ColdSharding.hashed(range(6), seed=4), placed_ids=np.array([9]),
                     placed_gpus=np.array([5]))]
    a = Plan("flexshard", topo, tps, {"k": 1})
    b = mutate(a, rng)
    c = mutate(b, rng)
    for d in (PlanDelta.between(a, b), PlanDelta.between(a, c).invert(),
              compose(PlanDelta.between(a, b), PlanDelta.between(b, c)),
              PlanDelta.between(a, a)):
        assert PlanDelta.from_bytes(d.to_bytes()) == d
    d = PlanDelta.between(a, c)
    p = tmp_path / "x" / "step.delta"
    d.save(p)
    assert sorted(os.listdir(p.parent)) == ["step.delta"]
    back = PlanDelta.load(p)
    assert back == d and back.to_bytes() == d.to_bytes()
    assert same_plan(back.apply(a), c)
    assert fst.check_plan(back.apply(a)) == []          # file round trip of the plan too
    assert back.migration_bytes == d.migration_bytes
    raw = p.read_bytes()
    for i in (30, len(raw) // 2, len(raw) - 20):
        bad = bytearray(raw)
        bad[i] ^= 0x40
        q = tmp_path / f"bad{i}.delta"
        q.write_bytes(bytes(bad))
        with pytest.raises(FormatError, match=re.escape(str(q))):
            PlanDelta.load(q)
    q = tmp_path / "short.delta"
    q.write_bytes(raw[: len(raw) // 3])
    with pytest.raises(FormatError, match=re.escape(str(q))):
        PlanDelta.load(q)
    header, arrays = unpack(raw, "plan_delta")
    q = tmp_path / "future.delta"
    q.write_bytes(pack("plan_delta", {**header, "delta_version": 99}, arrays))
    with pytest.raises(FormatError, match=re.escape(str(q)) + ".*version 99"):
        PlanDelta.load(q)
    q = tmp_path / "other.kind"
    q.write_bytes(pack("stream_stats", header, arrays))
    with pytest.raises(FormatError, match=re.escape(str(q))):
        PlanDelta.load(q)
    with pytest.raises(FormatError, match="no such file"):
        PlanDelta.load(tmp_path / "missing.delta")
    # a structurally broken delta (codes that do not change) is refused too
    arrays2 = dict(arrays)
    arrays2["t0.new"] = arrays["t0.old"]
    q = tmp_path / "broken.delta"
    q.write_bytes(pack("plan_delta", header, arrays2))
    if arrays["t0.ids"].size:
        with pytest.raises(FormatError, match=re.escape(str(q))):
            PlanDelta.load(q)
