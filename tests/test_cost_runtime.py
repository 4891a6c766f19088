"""The cost model's ``torchrec`` profile against TorchRec 1.8 itself: the same plans run in a real
gloo ``DistributedModelParallel`` (4 ranks, 2 per node) and in a 16-rank fake world, their
collectives counted at the process group (``online.torchrec_runtime``), and the evaluator's bytes
compared with the counted ones, component by component, iteration by iteration, exactly.

Every sharding kind TorchRec runs is covered: pooled table-wise, column-wise, table-column-wise,
row-wise, table-row-wise and data-parallel, sequence table-wise, column-wise and row-wise, and a
plan with hot rows exported as a data-parallel hot table plus a cold table (``export_torchrec``).
TorchRec's index de-duplication does not run on CPU (fbgemm has no CPU kernel for
``jagged_unique_indices``), so the runs compare ``dedup=False``.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_torchrec_runtime import real  # noqa: F401 - the fixture: tables and real batches

from flexshard_stream.bridge.export import (
    export_torchrec,
    load_torchrec_export,
    plan_from_export,
)
from flexshard_stream.bridge.runtime import (
    TableSharding,
    run_sharded_cases,
    table_shardings,
    torchrec_row_blocks,
)
from flexshard_stream.placement.cost import (
    TORCHREC_COMPONENTS,
    CostModel,
    evaluate_trace,
)
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.batch import Batch, concat_batches, slice_batch

pytest.importorskip("torchrec")

W, M, B = 4, 2, 8
ITERATIONS = 2
DIM = 8
OUTPUT = ("pooled_all_to_all", "pooled_reduce_scatter", "sequence_all_to_all")
INDEX = ("input_splits", "input_lengths", "input_values")

#: The same shardings as tests/test_torchrec_runtime.py, one DMP each.
CASES = {
    "pooled": {"C1": "table_wise:1", "C2": "column_wise:0,3", "C3": "data_parallel",
               "C4": "table_column_wise:2,3"},
    "pooled_row": {"C5": "row_wise", "ml_user": "table_row_wise:1"},
    "sequence": {"ml_movie": "row_wise", "az_beauty": "table_wise:3", "az_toys": "column_wise:1,2"},
}


def our_table_plan(t: EmbeddingTable, spec: str, topo: Topology) -> TablePlan:
    """The table plan of one TorchRec sharding, in our plan type."""
    sh = TableSharding.parse(spec)
    st, H = sh.sharding_type, t.num_rows
    if st == "data_parallel":
        return TablePlan(t, ColdSharding.replicated())
    if st == "table_wise":
        return TablePlan(t, ColdSharding.ranges(sh.ranks, H))
    if st in ("column_wise", "table_column_wise"):
        n = len(sh.ranks)
        return TablePlan(t, ColdSharding.columns(sh.ranks, [t.dim // n] * n), sharding=st)
    ranks = sh.shard_ranks(topo.num_gpus, topo.gpus_per_node)
    cold = ColdSharding("range", np.asarray(ranks), torchrec_row_blocks(H, len(ranks)))
    return TablePlan(t, cold, sharding=st)


def our_plan(tables, spec, topo) -> Plan:
    return Plan("torchrec", topo, [our_table_plan(t, spec[t.name], topo) for t in tables])


def features_of(plan: Plan, batches):
    """The batches restricted to the plan's features (the evaluator refuses others)."""
    keys = [tp.table.feature for tp in plan.tables.values()]
    return [Batch.from_features({k: b.feature_values(k) for k in keys},
                                {k: b.feature_lengths(k) for k in keys}) for b in batches]


@pytest.fixture(scope="module")
def hot_export(real, tmp_path_factory):
    """A plan with hot rows (global replicas) on a row-wise and a table-wise pooled table,
    exported for TorchRec: each table becomes a data-parallel hot table and a cold table, fed
    features split by the export's remap. Returns (the plan TorchRec runs, its TorchRec tables
    and shardings, the batches with the split features added)."""
    tables, batches = real
    topo = Topology.uniform(W // M, M)
    user, c1 = tables["ml_user"], tables["C1"]
    counts = {t.name: np.bincount(np.concatenate([b.feature_values(t.feature) for b in batches]),
                                  minlength=t.num_rows) for t in (user, c1)}
    hot = {n: np.sort(np.argsort(-c, kind="stable")[:k]) for (n, c), k in zip(counts.items(),
                                                                               (5, 4))}
    plan = Plan("hot", topo, [
        TablePlan(user, ColdSharding.ranges(range(W), user.num_rows), global_ids=hot["ml_user"]),
        TablePlan(c1, ColdSharding.ranges([2], c1.num_rows), global_ids=hot["C1"])])
    out = tmp_path_factory.mktemp("export") / "x"
    export_torchrec(plan, out)
    ex = load_torchrec_export(out)
    ran = plan_from_export(ex)
    tr_tables, spec = [], {}
    for e in ex.manifest["tables"]:
        t = tables[e["table"]]
        k = int(e["hot_rows"])
        tr_tables.append(EmbeddingTable(f"{t.name}__hot", k, DIM, kind="pooled",
                                        feature=f"{t.feature}__hot"))
        spec[f"{t.name}__hot"] = "data_parallel"
        cold = e["cold"]
        tr_tables.append(EmbeddingTable(f"{t.name}__cold", cold["rows"], DIM, kind="pooled",
                                        feature=f"{t.feature}__cold"))
        spec[f"{t.name}__cold"] = ("row_wise" if cold["sharding_type"] == "row_wise"
                                   else f"table_wise:{cold['ranks'][0]}")
    split = []
    for b in batches:
        feats = {k: b.feature_values(k) for k in b.keys}
        lens = {k: b.feature_lengths(k) for k in b.keys}
        for t in (user, c1):
            hv, hl, cv, cl, _ = ex.split_jagged(t.name, feats[t.feature], lens[t.feature])
            feats[f"{t.feature}__hot"], lens[f"{t.feature}__hot"] = hv, hl
            feats[f"{t.feature}__cold"], lens[f"{t.feature}__cold"] = cv, cl
        split.append(Batch.from_features(feats, lens))
    return ran, tr_tables, spec, split


@pytest.fixture(scope="module")
def runs(real, hot_export):
    """Every case, and the exported hot plan, in one spawned gloo world."""
    tables, _ = real
    _, tr_tables, hot_spec, split = hot_export
    cases = [([tables[f] for f in spec], spec) for spec in CASES.values()]
    cases.append((tr_tables, hot_spec))
    got = run_sharded_cases(cases, split, world_size=W, local_world_size=M)
    return dict(zip([*CASES, "hot"], got))


def counted(counter, it: int, components, phase: str | None = None) -> np.ndarray:
    """Bytes (float64[W, W]) the counted collectives of ``components`` sent in iteration ``it``."""
    sel = counter.select(iteration=it, component=tuple(components))
    if phase is not None:
        sel = sel.select(phase=phase)
    return sel.send_matrix(W).astype(np.float64)


def compare(run, tc, iterations: int, world: int = W) -> None:
    """Component by component, iteration by iteration: the evaluator's matrices equal the bytes
    TorchRec sent (DDP's first-iteration int32 bookkeeping left out, as expected_collectives
    does)."""
    model_dp = []
    for it in range(iterations):
        mats = tc.matrices[it]
        for comp in TORCHREC_COMPONENTS[:-1]:
            np.testing.assert_array_equal(mats[comp], counted(run.counter, it, [comp], "forward"),
                                          err_msg=f"iteration {it}, {comp}")
        np.testing.assert_array_equal(mats["index"], counted(run.counter, it, INDEX))
        np.testing.assert_array_equal(mats["forward"], counted(run.counter, it, OUTPUT,
                                                               "forward"))
        np.testing.assert_array_equal(mats["backward"], counted(run.counter, it, OUTPUT,
                                                                "backward"))
        dp = run.counter.select(iteration=it, component="data_parallel_all_reduce",
                                dtype="float32").totals(by=("rank",))
        model_dp.append(sum(dp.values()))
        assert set(dp.values()) <= {tc.mean.collectives["data_parallel_all_reduce"] / world}
    assert tc.mean.collectives["data_parallel_all_reduce"] == pytest.approx(np.mean(model_dp))


@pytest.mark.parametrize("name", list(CASES))
def test_evaluator_bytes_equal_what_torchrec_sent(real, runs, name):
    tables, batches = real
    topo = Topology.uniform(W // M, M)
    spec = CASES[name]
    plan = our_plan([tables[f] for f in spec], spec, topo)
    # our plan is the very sharding TorchRec ran (the runtime maps it back one to one)
    assert table_shardings(plan) == {n: TableSharding.parse(x) for n, x in spec.items()}
    assert CostModel().execution.can_run(plan)
    tc = evaluate_trace(plan, features_of(plan, batches), B, CostModel(dedup=False),
                        keep_matrices=True)
    assert tc.mean.iterations == ITERATIONS
    compare(runs[name], tc, ITERATIONS)
    # the per-component totals are the matrices' sums, the a2a figures the link bytes
    for comp in TORCHREC_COMPONENTS[:-1]:
        assert tc.mean.collectives[comp] == pytest.approx(
            np.mean([m[comp].sum() for m in tc.matrices]))


def test_exported_hot_table_bytes_equal_what_torchrec_sent(real, runs, hot_export):
    """Hot rows cost TorchRec the dense all-reduce of the whole hot table every iteration, and
    the cold table keeps its dense output: the plan TorchRec runs (plan_from_export), evaluated on
    the original IDs, equals the counts of the exported model run on the split features."""
    _, batches = real
    ran, tr_tables, _, _ = hot_export
    tc = evaluate_trace(ran, features_of(ran, batches), B, CostModel(dedup=False),
                        keep_matrices=True)
    compare(runs["hot"], tc, ITERATIONS)
    hot_rows = sum(t.num_rows for t in tr_tables if t.name.endswith("__hot"))
    assert tc.mean.collectives["data_parallel_all_reduce"] == W * hot_rows * DIM * 4


# ----------------------------------------------------------------------------- a fake world
FAKE_W, FAKE_M, FAKE_RANK = 16, 4, 5
FAKE_SPEC = {"C1": "table_wise:5", "C2": "column_wise:4,5", "C3": "data_parallel",
             "C4": "table_column_wise:8,9", "C5": "row_wise", "ml_user": "table_row_wise:1"}


def test_fake_world_rank_bytes_equal_the_evaluator(real):
    """Rank 5 of a 16-rank world, 4 per node (torch's fake process group), int32 IDs and
    lengths: table-row-wise across four nodes, its row of every matrix against the counts."""
    tables, batches = real
    local = [slice_batch(b, FAKE_RANK * 2, FAKE_RANK * 2 + 2) for b in batches]
    world = [concat_batches([b] * FAKE_W) for b in local]
    ts = [tables[f] for f in FAKE_SPEC]
    run = run_sharded_cases([(ts, FAKE_SPEC)], world, world_size=FAKE_W,
                            local_world_size=FAKE_M, values_dtype="int32",
                            lengths_dtype="int32", fake_ranks=[FAKE_RANK])[0]
    topo = Topology.uniform(FAKE_W // FAKE_M, FAKE_M)
    plan = our_plan(ts, FAKE_SPEC, topo)
    model = CostModel(dedup=False, index_bytes=4, length_bytes=4)
    tc = evaluate_trace(plan, features_of(plan, world), 2, model, keep_matrices=True)
    for it in range(ITERATIONS):
        mats = tc.matrices[it]
        for comp in TORCHREC_COMPONENTS[:-1]:
            sel = run.counter.select(iteration=it, component=comp, phase="forward")
            got = sel.send_matrix(FAKE_W)[FAKE_RANK].astype(np.float64)
            np.testing.assert_array_equal(mats[comp][FAKE_RANK], got,
                                          err_msg=f"iteration {it}, {comp}")
        dp = run.counter.select(iteration=it, component="data_parallel_all_reduce",
                                dtype="float32").totals(by=("rank",))
        assert dp == {(FAKE_RANK,): tc.mean.collectives["data_parallel_all_reduce"] / FAKE_W}
