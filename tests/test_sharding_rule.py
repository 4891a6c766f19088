"""One sharding rule: ``bridge.sharding.torchrec_sharding`` decides what a table plan becomes in
TorchRec 1.8, and the export, the runtime harness (``table_shardings``), the estimator compat
(``torchrec_sharding_of``) and the execution profiles (``table_issues`` / ``can_run``) agree with
it on generated table plans of every cold kind; then one hand-written case per disagreement the
rule settled (issue 21)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexshard_stream.bridge import sharding as rule_module
from flexshard_stream.bridge.estimator import torchrec_plan_comm, torchrec_sharding_of
from flexshard_stream.bridge.export import export_torchrec, load_torchrec_export
from flexshard_stream.bridge.planner import module_paths
from flexshard_stream.bridge.sharding import (
    COLLECTIONS,
    MODULE_PATHS,
    OFFERED_SHARDING_TYPES,
    TableSharding,
    sharding_label,
    table_shardings,
    torchrec_row_blocks,
    torchrec_sharding,
    type_ranks,
)
from flexshard_stream.errors import ConfigError
from flexshard_stream.placement.profiles import execution_profile
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology

TORCHREC = execution_profile("torchrec")
MODELLED = ("table_wise", "row_wise", "table_row_wise")
COLD = ("replicated", "columns", "columns", "hash_all", "hash_subset", "hash_one", "range",
        "blocks", "wrange", "subset", "node", "node", "node_shuffled", "node_part", "one")


# ----------------------------------------------------------------------------- generated plans
def _cold(draw, kind: str, G: int, M: int, N: int, t: EmbeddingTable) -> tuple[ColdSharding, str]:
    """A cold function of ``kind`` and the explicit sharding kind to give it ("" to infer)."""
    H = t.num_rows
    node = draw(st.integers(0, N - 1))
    node_gpus = list(range(node * M, (node + 1) * M))
    if kind == "replicated":
        return ColdSharding.replicated(), ""
    if kind == "columns":
        n = draw(st.integers(1, min(G, 4)))
        gpus = draw(st.permutations(node_gpus if draw(st.booleans()) and n <= M
                                    else list(range(G))))[:n]
        if draw(st.booleans()) and t.dim % n == 0:
            widths = [t.dim // n] * n
        else:
            cuts = sorted(draw(st.lists(st.integers(1, t.dim - 1), min_size=n - 1,
                                        max_size=n - 1, unique=True))) if n > 1 else []
            widths = np.diff([0, *cuts, t.dim]).tolist()
        one_node = len({g // M for g in gpus}) == 1
        explicit = "table_column_wise" if one_node and draw(st.booleans()) else ""
        return ColdSharding.columns(gpus, widths), explicit
    if kind.startswith("hash"):
        gpus = {"hash_all": list(range(G)), "hash_one": [draw(st.integers(0, G - 1))],
                "hash_subset": draw(st.lists(st.integers(0, G - 1), min_size=1, max_size=G,
                                             unique=True))}[kind]
        return ColdSharding.hashed(gpus, seed=draw(st.integers(0, 2**32))), ""
    if kind == "blocks":
        return ColdSharding("range", np.arange(G), torchrec_row_blocks(H, G)), ""
    if kind == "wrange":
        w = draw(st.lists(st.floats(0.05, 5.0), min_size=G, max_size=G))
        return ColdSharding.ranges(range(G), H, w), ""
    gpus = {"range": list(range(G)), "one": [draw(st.integers(0, G - 1))],
            "subset": draw(st.lists(st.integers(0, G - 1), min_size=1, max_size=G, unique=True)),
            "node": node_gpus, "node_shuffled": draw(st.permutations(node_gpus)),
            "node_part": draw(st.permutations(node_gpus))[:draw(st.integers(1, M))]}[kind]
    explicit = ""
    if kind == "node" and len(gpus) > 1 and draw(st.booleans()):
        # one node: every GPU is row-wise unless said otherwise; more: a node's GPUs row-wise
        explicit = "table_row_wise" if N == 1 else "row_wise"
    return ColdSharding.ranges(gpus, H), explicit


@st.composite
def table_plans(draw):
    """(table plan, topology): every cold kind, pooled and sequence, with and without global
    and node replicas, placed rows and a host tier."""
    N, M = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    topo = Topology.uniform(N, M)
    G = N * M
    t = EmbeddingTable("t", draw(st.integers(1, 300)), draw(st.sampled_from((4, 8, 12, 16))),
                       kind=draw(st.sampled_from(("pooled", "sequence"))))
    kind = draw(st.sampled_from(COLD))
    cold, explicit = _cold(draw, kind, G, M, N, t)
    if kind == "replicated":
        return TablePlan(t, cold), topo
    H = t.num_rows
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    cap = min(16, H // 3)
    k0, k1, k2 = (draw(st.integers(0, cap)) if draw(st.booleans()) else 0 for _ in range(3))
    if kind == "columns":
        k1 = k2 = 0
    rows = rng.choice(H, size=k0 + k1 + k2, replace=False)
    g0, n1, p2 = np.sort(rows[:k0]), np.sort(rows[k0:k0 + k1]), np.sort(rows[k0 + k1:])
    hf = np.zeros(0)
    if kind != "columns" and draw(st.booleans()) and draw(st.booleans()):
        hf = rng.random(G)
    tp = TablePlan(t, cold, global_ids=g0, node_ids=n1, node_local=rng.integers(0, M, n1.size),
                   placed_ids=p2, placed_gpus=rng.integers(0, G, p2.size), hbm_fraction=hf,
                   sharding=explicit)
    return tp, topo


def _check_runtime(r, tp: TablePlan, plan: Plan, topo: Topology) -> None:
    """The runtime harness maps the table plan exactly when the rule says TorchRec runs it
    directly, as the rule's sharding, with the rule's shards; TorchRec's check refuses exactly
    the types TorchRec lacks for the table kind (the rule's fallback runs instead)."""
    if not r.direct:
        with pytest.raises(ConfigError) as e:
            table_shardings(plan)
        assert str(e.value) == r.indirect
        return
    sh = table_shardings(plan)["t"]
    assert sh == r.table_sharding and sh.sharding_type == r.sharding_type
    assert sh.shard_ranks(topo.num_gpus, topo.gpus_per_node) == r.ranks
    assert sh.shards(tp.table, topo.num_gpus, topo.gpus_per_node) == r.shards \
        or r.sharding_type == "data_parallel"
    assert r.hot_rows in (0, tp.table.num_rows) and (not r.issues or r.fallback)
    if r.fallback is not None:
        with pytest.raises(ConfigError, match="TorchRec 1.8 has no"):
            sh.check(tp.table, topo.num_gpus, topo.gpus_per_node)
    elif sh.sharding_type != "data_parallel":
        sh.check(tp.table, topo.num_gpus, topo.gpus_per_node)


def _check_estimator(r, tp: TablePlan, plan: Plan) -> None:
    """The estimator compat prices the rule's type on the rule's ranks (a sequence table on one
    node by TorchRec's TWRW formula, as written), one table or none."""
    want = r.sharding_type
    if r.hot_rows or want not in MODELLED:
        with pytest.raises(ConfigError, match="no TorchRec sharding type"):
            torchrec_sharding_of(tp, plan.topology)
        return
    assert torchrec_sharding_of(tp, plan.topology) == want
    est = torchrec_plan_comm(plan, 8, {"t": 2.0})
    assert est["tables"]["t"]["sharding"] == want
    assert est["tables"]["t"]["num_shards"] == len(r.ranks)


def _check_export(r, tp: TablePlan, plan: Plan) -> None:
    """The export writes the tables TorchRec runs (the rule's, or its fallback): a hot table of
    ``hot_rows`` rows, a cold table of the rule's type on its ranks in its shards (refused for
    column shards)."""
    r = r.runs_as
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "x"
        if not r.exportable:
            with pytest.raises(ConfigError, match="column-wise"):
                export_torchrec(plan, out)
            return
        m = export_torchrec(plan, out)
        doc = load_torchrec_export(out).sharding_plan_doc()
    e = m["tables"][0]
    assert e["hot_rows"] == r.hot_rows
    if r.sharding_type == "data_parallel":
        assert e["cold"] is None and e["hot"]["sharding_type"] == "data_parallel"
        return
    c = e["cold"]
    assert (c["sharding_type"], c["ranks"], c["shard_rows"]) == \
        (r.sharding_type, list(r.ranks), list(r.shard_rows))
    shards = doc["tables"]["t__cold"]["shards"]
    assert [(s["rank"], tuple(s["offsets"]), tuple(s["sizes"])) for s in shards] == \
        [(s.rank, s.offsets, s.sizes) for s in r.shards]
    assert all(n in e["notes"] for n in r.notes)


@settings(deadline=None, max_examples=150,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(table_plans())
def test_one_rule_and_everyone_agrees(case):
    tp, topo = case
    plan = Plan("x", topo, [tp])
    r = torchrec_sharding(tp, topo)
    assert r.kind == tp.sharding_kind(topo)
    assert r.ranks == type_ranks(r.sharding_type, topo.num_gpus, topo.gpus_per_node,
                                 r.ranks, r.host)
    if r.sharding_type != "data_parallel":
        assert tuple(s.rank for s in r.shards) == r.ranks[:len(r.shards)]
    assert (r.fallback is not None) == (r.sharding_type not in
                                        OFFERED_SHARDING_TYPES[tp.table.kind])
    assert not (r.direct and r.issues) or r.fallback is not None
    # the profiles: the rule's issues, can_run exactly without them
    assert TORCHREC.table_issues(tp, topo) == list(r.issues)
    assert TORCHREC.can_run(plan) == (not r.issues)
    assert execution_profile("ideal").can_run(plan)
    _check_runtime(r, tp, plan, topo)
    _check_estimator(r, tp, plan)
    _check_export(r, tp, plan)


# ----------------------------------------------------------------------------- the decisions
TOPO = Topology.uniform(2, 4)
POOLED = EmbeddingTable("t", 100, 8, kind="pooled")
SEQUENCE = EmbeddingTable("t", 100, 8, kind="sequence")


def _rule(cold, table=POOLED, topo=TOPO, **kw):
    tp = TablePlan(table, cold, **kw)
    return tp, torchrec_sharding(tp, topo)


def test_table_row_wise_is_the_node_in_order():
    """TorchRec's TWRW puts shard i on the node's i-th rank (twrw_sharding.py _shard): the node's
    GPUs in order run directly; in another order, or a part of the node, only through the export
    (over every rank of the node), which the estimator prices as TWRW; a part of a node is an
    issue, another order is not (the remap puts each GPU's rows in its block)."""
    tp, r = _rule(ColdSharding.ranges([4, 5, 6, 7], 100))
    assert (r.sharding_type, r.host, r.ranks, r.direct) == ("table_row_wise", 1, (4, 5, 6, 7), True)
    assert table_shardings(Plan("x", TOPO, [tp]))["t"] == TableSharding("table_row_wise", host=1)
    tp, r = _rule(ColdSharding.ranges([5, 4, 7, 6], 100))
    assert (r.sharding_type, r.host, r.ranks, r.direct, r.issues) == \
        ("table_row_wise", 1, (4, 5, 6, 7), False, ())
    with pytest.raises(ConfigError, match="one node in order"):
        table_shardings(Plan("x", TOPO, [tp]))
    assert torchrec_sharding_of(tp, TOPO) == "table_row_wise"
    tp, r = _rule(ColdSharding.ranges([5, 6], 100))
    assert (r.sharding_type, r.ranks, r.direct) == ("table_row_wise", (4, 5, 6, 7), False)
    assert any("2 of the node's 4 GPUs" in m for m in r.issues)
    assert torchrec_sharding_of(tp, TOPO) == "table_row_wise"      # was refused


def test_hashed_and_unequal_cold_functions():
    """A hash over several GPUs or weighted ranges: row-wise through the export's remap, which
    the estimator prices (row_wise) and the runtime refuses; a hash over one GPU holds every row
    there: table-wise, directly (the runtime refused it)."""
    for cold, why in ((ColdSharding.hashed(range(8), seed=3), "hashed rows"),
                      (ColdSharding.ranges(range(8), 100, [1, 2, 3, 4, 1, 2, 3, 4]),
                       "weighted ranges")):
        tp, r = _rule(cold)
        assert (r.sharding_type, r.ranks, r.direct, r.issues) == \
            ("row_wise", tuple(range(8)), False, ())
        assert why in r.indirect and torchrec_sharding_of(tp, TOPO) == "row_wise"
    tp, r = _rule(ColdSharding.hashed([3], seed=9))
    assert (r.sharding_type, r.ranks, r.direct) == ("table_wise", (3,), True)
    assert table_shardings(Plan("x", TOPO, [tp]))["t"] == TableSharding("table_wise", (3,))
    # unequal column widths: TorchRec's column_wise(ranks) generator cuts evenly
    _, r = _rule(ColdSharding.columns([1, 6], [4, 4]))
    assert (r.sharding_type, r.direct, r.exportable) == ("column_wise", True, False)
    _, r = _rule(ColdSharding.columns([1, 6], [2, 6]))
    assert (r.direct, r.issues) == (False, ()) and "unequal" in r.indirect
    assert [s.sizes for s in r.shards] == [(100, 2), (100, 6)]


def test_sequence_tables_have_no_table_row_or_column_wise():
    """TorchRec 1.8 raises "Sharding not supported" for sequence TWRW / TWCW: the rule keeps the
    plan's sharding (the runtime harness maps it, TorchRec's check refuses it, TorchRec's
    estimator prices it as written) and says what runs instead: the export's row-wise table over
    every rank, column-wise shards; both are issues."""
    tp, r = _rule(ColdSharding.ranges([4, 5, 6, 7], 100), SEQUENCE)
    assert (r.kind, r.sharding_type, r.host, r.direct) == \
        ("table_row_wise", "table_row_wise", 1, True)
    assert (r.fallback.sharding_type, r.fallback.ranks, r.fallback.direct) == \
        ("row_wise", tuple(range(8)), False)
    assert any("offers no table_row_wise for sequence" in m for m in r.issues)
    sh = table_shardings(Plan("x", TOPO, [tp]))["t"]
    assert sh == TableSharding("table_row_wise", host=1)
    with pytest.raises(ConfigError, match="no table_row_wise for sequence"):
        sh.check(SEQUENCE, 8, 4)
    assert torchrec_sharding_of(tp, TOPO) == "table_row_wise"
    assert torchrec_plan_comm(Plan("x", TOPO, [tp]), 8, {})["tables"]["t"]["num_shards"] == 4
    with tempfile.TemporaryDirectory() as tmp:
        m = export_torchrec(Plan("x", TOPO, [tp]), Path(tmp) / "x")
    assert m["tables"][0]["cold"]["ranks"] == list(range(8))
    _, r = _rule(ColdSharding.columns([4, 5], [4, 4]), SEQUENCE, sharding="table_column_wise")
    assert (r.sharding_type, r.direct, r.fallback.sharding_type, r.fallback.ranks) == \
        ("table_column_wise", True, "column_wise", (4, 5))


def test_replicas_and_placed_rows_run_through_the_export():
    """Replicas make the export's data-parallel hot table (no one TorchRec table: the estimator
    refuses); placed rows stay in the cold table (the estimator prices it; it refused them)."""
    tp, r = _rule(ColdSharding.ranges(range(8), 100), global_ids=[1, 2], node_ids=[5],
                  node_local=[0])
    assert (r.sharding_type, r.hot_rows, r.shard_rows) == ("row_wise", 3, (13,) * 7 + (6,))
    with pytest.raises(ConfigError, match="no TorchRec sharding type"):
        torchrec_sharding_of(tp, TOPO)
    assert torchrec_sharding(tp, TOPO, node_replicas="cold").hot_rows == 2
    tp, r = _rule(ColdSharding.ranges(range(8), 100), placed_ids=[7], placed_gpus=[3])
    assert (r.sharding_type, r.hot_rows, r.direct) == ("row_wise", 0, False)
    assert torchrec_sharding_of(tp, TOPO) == "row_wise"
    _, r = _rule(ColdSharding.ranges(range(8), 100), global_ids=range(100))
    assert (r.sharding_type, r.hot_rows, r.shards) == ("data_parallel", 100, ())


def test_one_node_row_wise_stays_row_wise():
    """On one node a row-wise plan is TorchRec's row_wise (the export wrote table_row_wise for
    its pooled cold tables); an explicit table_row_wise plan stays table_row_wise."""
    one = Topology.uniform(1, 4)
    tp, r = _rule(ColdSharding.ranges(range(4), 100), topo=one)
    assert (r.sharding_type, r.direct) == ("row_wise", True)
    with tempfile.TemporaryDirectory() as tmp:
        m = export_torchrec(Plan("x", one, [tp]), Path(tmp) / "x")
    assert m["tables"][0]["cold"]["sharding_type"] == "row_wise"
    _, r = _rule(ColdSharding.ranges(range(4), 100), topo=one, sharding="table_row_wise")
    assert (r.sharding_type, r.host, r.direct) == ("table_row_wise", 0, True)


def test_export_options_go_through_the_rule():
    tp, _ = _rule(ColdSharding.ranges([4, 5, 6, 7], 100))
    r = torchrec_sharding(tp, TOPO, cold_sharding="row_wise")
    assert (r.sharding_type, r.ranks, r.direct) == ("row_wise", tuple(range(8)), False)
    r = torchrec_sharding(tp, TOPO, cold_sharding="table_wise")
    assert (r.sharding_type, r.ranks) == ("table_wise", (4,))
    seq, _ = _rule(ColdSharding.ranges([4, 5, 6, 7], 100), SEQUENCE)
    with pytest.raises(ConfigError, match="impossible for a sequence table"):
        torchrec_sharding(seq, TOPO, cold_sharding="table_row_wise")
    with pytest.raises(ConfigError, match="cold_sharding must be one of"):
        torchrec_sharding(tp, TOPO, cold_sharding="grid")


def test_one_definition_of_the_module_paths():
    tables = [EmbeddingTable("p", 10, 8, kind="pooled"), EmbeddingTable("s", 10, 8)]
    paths = module_paths(tables)
    assert paths == {"p": MODULE_PATHS[COLLECTIONS["pooled"]],
                     "s": MODULE_PATHS[COLLECTIONS["sequence"]]}
    assert (rule_module.POOLED_MODULE, rule_module.SEQUENCE_MODULE) == ("ebc", "ec")
    pytest.importorskip("torchrec")
    from flexshard_stream.bridge import world
    from flexshard_stream.bridge.loader import MODULE_PATHS as LOADER_PATHS
    from flexshard_stream.bridge.loader import EmbeddingModules

    assert LOADER_PATHS is MODULE_PATHS
    assert (world.POOLED_PATH, world.SEQUENCE_PATH) == tuple(MODULE_PATHS.values())
    modules = EmbeddingModules([], [], device="meta")
    assert all(hasattr(modules, p) for p in MODULE_PATHS.values())


def test_the_cli_label():
    """``sharding_label`` is the CLI's label of a table: ``plan`` prints it per table."""
    cases = [(ColdSharding.ranges(range(8), 100), {}, "rw"),
             (ColdSharding.ranges([0, 5], 100), {}, "rw, 2 GPUs"),
             (ColdSharding.hashed(range(8)), {"hbm_fraction": np.full(8, 0.5)},
              "rw (hashed) +host"),
             (ColdSharding.ranges([4, 5], 100), {}, "twrw"),
             (ColdSharding.ranges([2], 100), {}, "tw"),
             (ColdSharding.replicated(), {}, "dp"),
             (ColdSharding.columns([0, 1], [4, 4]), {}, "cw")]
    import inspect

    from flexshard_stream.cli import plan as cli_plan

    assert "sharding_label(tp, topo)" in inspect.getsource(cli_plan)   # the CLI asks the rule
    for cold, kw, want in cases:
        tp = TablePlan(POOLED, cold, **kw)
        assert sharding_label(tp, TOPO) == want
