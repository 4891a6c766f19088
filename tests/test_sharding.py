"""Sharding kinds and column shards in the plan type: validation, inference, routing, memory,
plan files (schema 2, version 1 still read), the column-wise baselines, PlanDelta across column
layouts (migration against a column-by-column brute force) and the invariant checker."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexshard_stream import testing as fst
from flexshard_stream.errors import ConfigError, FormatError
from flexshard_stream.placement.baselines import (
    build_baseline,
    column_widths,
    row_wise,
    table_row_wise,
)
from flexshard_stream.placement.cost import CostModel, evaluate_analytic
from flexshard_stream.plans.delta import PlanDelta
from flexshard_stream.plans.plan import (
    PLAN_SCHEMA_VERSION,
    SHARDING_KINDS,
    ColdSharding,
    Plan,
    TablePlan,
)
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology

TOPO = Topology.uniform(2, 4)
T = EmbeddingTable("t", 100, 16, "fp32", "pooled", optimizer_state_bytes=16)   # 80 bytes a row


def cw(gpus=(1, 6), widths=(4, 12), **kw):
    return TablePlan(T, ColdSharding.columns(gpus, widths), **kw)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("make, why", [
    (lambda: ColdSharding.columns([0, 1], [8]), "one width per GPU"),
    (lambda: ColdSharding.columns([0, 1], [16, 0]), "must be > 0"),
    (lambda: ColdSharding.columns([2, 2], [8, 8]), "distinct GPUs"),
    (lambda: ColdSharding("columns", np.array([0]), np.array([0, 5]), widths=np.array([16])),
     "GPUs and widths only"),
    (lambda: ColdSharding("range", np.array([0]), np.array([0, 5]), widths=np.array([3])),
     "belong to 'columns'"),
    (lambda: cw(widths=(4, 4)), "sum to 8, the table's dim is 16"),
    (lambda: cw(node_ids=[3], node_local=[0]), "global replicas only"),
    (lambda: cw(placed_ids=[3], placed_gpus=[0]), "global replicas only"),
    (lambda: cw(hbm_fraction=np.ones(8)), "global replicas only"),
    (lambda: TablePlan(T, ColdSharding.ranges([0, 1], 100), sharding="data_parallel"),
     "needs a replicated cold function"),
    (lambda: TablePlan(T, ColdSharding.ranges([0, 1], 100), sharding="table_wise"),
     "on one GPU"),
    (lambda: TablePlan(T, ColdSharding.ranges([0, 1], 100), sharding="grid"), "unknown"),
    (lambda: cw(sharding="row_wise"), "needs a hash or range cold function"),
    (lambda: Plan("x", TOPO, [TablePlan(T, ColdSharding.ranges([3, 4], 100),
                                        sharding="table_row_wise")]), "span nodes"),
    (lambda: Plan("x", TOPO, [cw(gpus=(3, 4), sharding="table_column_wise")]), "span nodes"),
    (lambda: Plan("x", TOPO, [cw(gpus=(3, 8))]), r"cold gpus must lie in \[0, 8\)"),
])
def test_invalid_shardings_name_what_and_where(make, why):
    with pytest.raises(ConfigError, match=why):
        make()


def test_sharding_kinds_inferred_or_given():
    t1 = EmbeddingTable("a", 10, 4)
    cases = {
        "data_parallel": TablePlan(t1, ColdSharding.replicated()),
        "column_wise": TablePlan(t1, ColdSharding.columns([0, 5], [2, 2])),
        "table_wise": TablePlan(t1, ColdSharding.hashed([6])),
        "table_row_wise": TablePlan(t1, ColdSharding.ranges([4, 5, 7], 10)),
        "row_wise": TablePlan(t1, ColdSharding.ranges([0, 5], 10)),
    }
    for kind, tp in cases.items():
        assert tp.sharding_kind(TOPO) == kind
    assert TablePlan(t1, ColdSharding.hashed(range(8))).sharding_kind(TOPO) == "row_wise"
    # one node: every GPU is row-wise, unless said otherwise
    one = Topology.uniform(1, 4)
    assert TablePlan(t1, ColdSharding.ranges(range(4), 10)).sharding_kind(one) == "row_wise"
    explicit = TablePlan(t1, ColdSharding.ranges(range(4), 10), sharding="table_row_wise")
    assert Plan("x", one, [explicit]).sharding_kinds == {"a": "table_row_wise"}
    assert set(SHARDING_KINDS) == {"table_wise", "column_wise", "table_column_wise", "row_wise",
                                   "table_row_wise", "data_parallel"}


# ----------------------------------------------------------------------------- routing, memory
def test_column_routing_and_memory():
    plan = Plan("x", TOPO, [cw(global_ids=[7])])
    ids = np.array([3, 7, 99])
    assert plan.route("t", ids, 2).tolist() == [1, 2, 1]              # route: the first shard
    assert plan.owners("t", ids, 2).tolist() == [[1, 6], [2, 2], [1, 6]]
    rows = plan["t"].rows_per_gpu(TOPO)
    assert rows.tolist() == [1, 100, 1, 1, 1, 1, 100, 1]             # all rows, partly
    # bytes: the replica everywhere; the 99 cold rows split 4 : 12 between GPUs 1 and 6
    want = np.full(8, 80.0)
    want[1] += 99 * 80 * 4 / 16
    want[6] += 99 * 80 * 12 / 16
    assert np.allclose(plan.row_bytes_per_gpu, want)
    assert np.allclose(plan["t"].row_bytes_per_gpu(TOPO), want)
    assert plan.tier_sizes()["t"] == {"global": 1, "node": 0, "cold": 99, "placed": 0}


# ----------------------------------------------------------------------------- files
def test_plan_files_keep_kinds_and_columns(tmp_path):
    s = EmbeddingTable("s", 50, 8)
    plan = Plan("mix", TOPO, [cw(global_ids=[1, 2], sharding="column_wise"),
                              TablePlan(s, ColdSharding.ranges(range(4), 50),
                                        sharding="table_row_wise")])
    back = Plan.load(plan.save(tmp_path / "p"))
    assert back == plan and back.sharding_kinds == plan.sharding_kinds
    assert back["t"].cold.widths.tolist() == [4, 12]
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert doc["schema_version"] == PLAN_SCHEMA_VERSION == 2
    assert [e["sharding"] for e in doc["tables"]] == ["column_wise", "table_row_wise"]


def test_version_1_plans_still_load(tmp_path):
    """A plan written before sharding kinds (schema 1: no 'sharding', no 'widths') loads with
    its kinds inferred; an unknown version is refused naming the versions read."""
    plan = table_row_wise([T, EmbeddingTable("s", 50, 8)], TOPO)
    d = plan.save(tmp_path / "p")
    doc = json.loads((d / "plan.json").read_text())
    doc["schema_version"] = 1
    for e in doc["tables"]:
        del e["sharding"]
    del doc["checksum"]                    # as then: no checksum of plan.json, no kind marker
    (d / ".flexshard-kind").unlink()
    (d / "plan.json").write_text(json.dumps(doc))
    back = Plan.load(d)
    assert all(tp.sharding == "" for tp in back.tables.values())
    assert back.sharding_kinds == {"t": "table_row_wise", "s": "table_row_wise"}
    doc["schema_version"] = 3
    (d / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="reads versions 1, 2"):
        Plan.load(d)


# ----------------------------------------------------------------------------- baselines
def test_column_baselines_cut_as_torchrec_plans():
    assert column_widths(512).tolist() == [128] * 4
    assert column_widths(384).tolist() == [128] * 3
    assert column_widths(96).tolist() == [96]                     # under 2 x 128: one shard
    assert column_widths(200).tolist() == [200]                   # no multiple of 4 >= 128 divides
    assert column_widths(1024, max_shards=2).tolist() == [512, 512]
    tables = [EmbeddingTable(f"t{i}", 100 + i, d) for i, d in enumerate((512, 256, 64, 1024))]
    cwp = build_baseline("cw", tables, TOPO)
    assert set(cwp.sharding_kinds.values()) == {"column_wise"}
    for t in tables:
        c = cwp[t.name].cold
        assert c.widths.tolist() == column_widths(t.dim, max_shards=8).tolist()
        assert np.unique(c.gpus).size == c.gpus.size
    tw = build_baseline("twcw", tables, TOPO)
    assert set(tw.sharding_kinds.values()) == {"table_column_wise"}
    for t in tables:
        assert np.unique(tw[t.name].cold.gpus // 4).size == 1
        assert tw[t.name].cold.widths.tolist() == column_widths(t.dim, max_shards=4).tolist()
    with pytest.raises(ConfigError, match="cw, twcw"):
        build_baseline("grid", tables, TOPO)


# ----------------------------------------------------------------------------- PlanDelta
def column_holders(plan, name):
    """(G, H, D) bool: which GPU holds each column of each row (reference)."""
    tp, topo = plan[name], plan.topology
    G, M, H, D = topo.num_gpus, topo.gpus_per_node, tp.table.num_rows, tp.table.dim
    hold = np.zeros((G, H, D), bool)
    if tp.replicated:
        hold[:] = True
        return hold
    special = np.zeros(H, bool)
    special[tp.global_ids] = special[tp.node_ids] = special[tp.placed_ids] = True
    hold[:, tp.global_ids] = True
    for r, m in zip(tp.node_ids, tp.node_local):
        hold[np.arange(topo.nodes) * M + m, r] = True
    hold[tp.placed_gpus, tp.placed_ids] = True
    cold = np.flatnonzero(~special)
    if tp.column_wise:
        for g, lo, hi in zip(tp.cold.gpus, tp.cold.column_offsets[:-1], tp.cold.column_offsets[1:]):
            hold[g, cold, lo:hi] = True
    else:
        hold[plan.route(name, cold, 0), cold] = True
    return hold


def column_migration(a, b):
    """Brute force, column by column: a GPU gaining a column of a row receives it from an old
    holder in its node if any, else from another node."""
    topo = a.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    send, recv = np.zeros((G, 3)), np.zeros((G, 3))
    for name in a.tables:
        t = a[name].table
        ho, hn = column_holders(a, name), column_holders(b, name)
        for d, r, c in np.argwhere(hn & ~ho):
            n0 = (d // M) * M
            near = np.flatnonzero(ho[n0:n0 + M, r, c])
            src, cls = (n0 + near[0], 1) if near.size else (np.flatnonzero(ho[:, r, c])[0], 2)
            send[src, cls] += t.row_bytes / t.dim
            recv[d, cls] += t.row_bytes / t.dim
    return send, recv


LAYOUTS = {
    "cw_a": lambda: ColdSharding.columns([1, 6], [4, 12]),
    "cw_b": lambda: ColdSharding.columns([6, 2, 5], [8, 4, 4]),
    "rw": lambda: ColdSharding.ranges(range(8), 40),
    "tw": lambda: ColdSharding.ranges([3], 40),
    "hash": lambda: ColdSharding.hashed(range(8), seed=3),
    "dp": lambda: ColdSharding.replicated(),
}


@pytest.mark.parametrize("old, new", [("cw_a", "cw_b"), ("cw_b", "cw_a"), ("cw_a", "rw"),
                                      ("rw", "cw_b"), ("hash", "cw_a"), ("cw_a", "dp"),
                                      ("dp", "cw_b"), ("tw", "cw_a")])
def test_column_layout_changes_are_table_moves(old, new):
    t = EmbeddingTable("t", 40, 16, optimizer_state_bytes=16)
    rng = np.random.default_rng(0)

    def plan(kind, hot):
        cold = LAYOUTS[kind]()
        g0 = np.sort(rng.choice(40, hot, replace=False)) if cold.kind != "replicated" else []
        return Plan("x", TOPO, [TablePlan(t, cold, global_ids=g0)])

    a, b = plan(old, 3), plan(new, 5)
    d = PlanDelta.between(a, b)
    assert d.tables["t"].cold_changed
    assert d.apply(a) == b and d.invert().apply(b) == a
    assert PlanDelta.from_bytes(d.to_bytes()) == d
    assert d.migration_exact
    s, r = column_migration(a, b)
    assert np.allclose(d.migration_send, s) and np.allclose(d.migration_recv, r)
    assert d.summary()["tables"]["t"]["cold_changed"]


@settings(max_examples=25)
@given(fst.topologies(2, 3), fst.tables(2, 300), st.data())
def test_deltas_across_column_plans_round_trip(topo, tabs, data):
    kinds = ("hash", "range", "columns", "replicated")
    a = data.draw(fst.plans(topo, tabs, cold_kinds=kinds))
    b = data.draw(fst.plans(topo, tabs, cold_kinds=kinds))
    d = PlanDelta.between(a, b)
    assert d.apply(a) == b and d.invert().apply(b) == a
    assert np.allclose(d.migration_send.sum(axis=0), d.migration_recv.sum(axis=0))


# ----------------------------------------------------------------------------- invariants
@settings(max_examples=20)
@given(fst.workloads(max_tables=3, max_rows=400), st.data(),
       st.sampled_from(["torchrec", "ideal"]))
def test_column_plans_pass_the_invariant_checker(w, data, profile):
    plan = data.draw(fst.plans(w.topology, w.tables, summaries=w.summaries,
                               cold_kinds=("columns", "range", "hash", "replicated")))
    batches = fst.sample_batches(w.tables, w.summaries, w.topology, w.batch_size, 2, seed=1)
    assert fst.check_plan(plan, summaries=w.summaries, batch_size=w.batch_size,
                          model=CostModel(profile=profile), batches=batches) == []


def test_checker_reports_a_broken_column_accounting():
    plan = Plan("x", TOPO, [cw()])

    class Skewed(Plan):
        def owners(self, table, ids, src_gpu):
            return super().owners(table, ids, src_gpu)[:, :1]

    broken = Skewed("x", TOPO, list(plan.tables.values()))
    v = fst.check_plan(broken, round_trip=False)
    assert any("every column shard's GPU" in m for m in v)


def test_column_plans_are_not_exported_as_one_table(tmp_path):
    from flexshard_stream.bridge.export import export_torchrec
    from flexshard_stream.bridge.runtime import TableSharding, table_shardings

    plan = Plan("x", TOPO, [cw(gpus=(1, 6), widths=(8, 8))])
    with pytest.raises(ConfigError, match="column-wise"):
        export_torchrec(plan, tmp_path / "x")
    assert table_shardings(plan) == {"t": TableSharding("column_wise", (1, 6))}
    with pytest.raises(ConfigError, match="unequal"):
        table_shardings(Plan("x", TOPO, [cw()]))


def test_row_wise_and_column_plans_price_under_both_profiles():
    tables = [EmbeddingTable("a", 1000, 512, kind="pooled"), EmbeddingTable("b", 500, 256)]
    sums = {t.name: fst.zipf_summary(t, 1.1) for t in tables}
    for p in (row_wise(tables, TOPO), build_baseline("cw", tables, TOPO)):
        for profile in ("torchrec", "ideal"):
            c = evaluate_analytic(p, sums, 16, CostModel(profile=profile))
            assert c.profile == profile and c.comm_time_s > 0
            assert (c.collectives != {}) == (profile == "torchrec")


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 5000), slots=st.integers(1, 40), seed=st.integers(0, 2**64 - 1),
       data=st.data())
def test_hashed_rows_per_slot_equals_the_sweep(rows, slots, seed, data):
    """The cached per-slot row counts of a hashed cold function, less the rows held elsewhere
    (IDs beyond the table ignored), equal a full sweep; the cache never hands out a shared array."""
    from flexshard_stream.kernels.routing import hash_owner_counts

    from flexshard_stream.plans.plan import hashed_rows_per_slot
    skip = np.sort(np.array(data.draw(st.lists(st.integers(0, rows + 20), max_size=60,
                                               unique=True)), dtype=np.int64))
    want = hash_owner_counts(rows, slots, np.uint64(seed), skip)
    got = hashed_rows_per_slot(rows, slots, seed, skip)
    assert np.array_equal(got, want)
    got[0] += 1                                   # a caller's edit must not reach the cache
    assert np.array_equal(hashed_rows_per_slot(rows, slots, seed, skip), want)
