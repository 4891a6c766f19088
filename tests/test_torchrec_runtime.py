"""TorchRec as a real runtime: DistributedModelParallel on CPU (gloo, 4 ranks on 2 "nodes") fed
KeyedJaggedTensors of the shared real traces, its outputs and gradients against the unsharded
modules, and every collective it issues against the byte formulas of docs/TORCHREC_RUNTIME.md.

Exported plans (row-wise, table-wise, FlexShard with replicated hot rows, and a hashed plan with
explicitly placed rows) run in the same world the way a user runs them: the export's own
ShardingPlan, real KJTs of original IDs through its KJTRemap into the DistributedModelParallel, the
outputs merged back; they equal the unsharded modules of the original tables.

The formula and plan tests need no torch; the runs skip when TorchRec is not installed. One gloo
world (4 processes) and one fake world (1 process simulating rank 5 of 16) serve every run test.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import SHARED

from flexshard_stream.bridge.export import (
    export_torchrec,
    load_torchrec_export,
    plan_from_export,
)
from flexshard_stream.bridge.runtime import (
    CollectiveCounter,
    TableSharding,
    compare_components,
    expected_collectives,
    expected_export_collectives,
    export_shardings,
    initial_weights,
    run_sharded_cases,
    run_unsharded,
    table_shardings,
    torchrec_column_block,
    torchrec_row_blocks,
    trace_workload,
)
from flexshard_stream.errors import ConfigError
from flexshard_stream.placement import baselines
from flexshard_stream.placement.planner import plan_flexshard
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.batch import Batch, concat_batches, slice_batch
from flexshard_stream.stats.stream import StreamStats

W, M, B = 4, 2, 8            # ranks, ranks per node, samples per rank
ITERATIONS = 2


# ----------------------------------------------------------------------------- real batches
@pytest.fixture(scope="module")
def real():
    """(tables by feature, global batches of W * B samples) from the shared traces
    (``trace_workload``: MovieLens, Amazon, Criteo)."""
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    tables, full = trace_workload(SHARED, W * B * ITERATIONS)
    batches = [slice_batch(full, i * W * B, (i + 1) * W * B) for i in range(ITERATIONS)]
    return tables, batches


#: The sharding types TorchRec 1.8 runs on CPU, in three models (one DMP each).
CASES = {
    "pooled": {"C1": "table_wise:1", "C2": "column_wise:0,3", "C3": "data_parallel",
               "C4": "table_column_wise:2,3"},
    "pooled_row": {"C5": "row_wise", "ml_user": "table_row_wise:1"},
    "sequence": {"ml_movie": "row_wise", "az_beauty": "table_wise:3", "az_toys": "column_wise:1,2"},
}


def _case(real, name):
    tables, _ = real
    spec = CASES[name]
    return [tables[f] for f in spec], spec


#: Exported plans run in the world (all nine tables each).
EXPORTS = ("row_wise", "table_wise", "flexshard", "hashed_placed")


def _hashed_placed(tables, topo, batch):
    """Every table: a hashed cold function, its 2 most looked-up rows replicated, the next 5
    placed explicitly on GPUs 3, 2, 1, 0, 3 (the export keeps them there)."""
    tps = []
    for t in tables:
        counts = np.bincount(batch.feature_values(t.feature), minlength=t.num_rows)
        top = np.argsort(-counts, kind="stable")[:7]
        placed = np.sort(top[2:])
        tps.append(TablePlan(t, ColdSharding.hashed(range(topo.num_gpus), seed=11),
                             global_ids=np.sort(top[:2]), placed_ids=placed,
                             placed_gpus=(3 - np.arange(placed.size)) % topo.num_gpus))
    return Plan("hashed_placed", topo, tps)


@pytest.fixture(scope="module")
def exports(real, tmp_path_factory):
    """{name: (plan, TorchRecExport)} of EXPORTS on every real table, W = 4, M = 2."""
    tables, batches = real
    ts = list(tables.values())
    topo = Topology.uniform(W // M, M)
    full = concat_batches(batches)
    stats = StreamStats(auto_tables=True)
    stats.update(full)
    summaries = stats.summary(k=1000)
    plans = {"row_wise": baselines.row_wise(ts, topo), "table_wise": baselines.table_wise(ts, topo),
             "flexshard": plan_flexshard(ts, topo, summaries, B).plan,
             "hashed_placed": _hashed_placed(ts, topo, full)}
    out = {}
    for name, plan in plans.items():
        d = tmp_path_factory.mktemp("export") / name
        export_torchrec(plan, d, summaries=summaries)
        out[name] = (plan, load_torchrec_export(d))
    return out


@pytest.fixture(scope="module")
def gloo_runs(real, exports):
    """Every case of CASES and every exported plan of EXPORTS in one spawned gloo world, with
    the unsharded reference of each (one for the exports: the original tables)."""
    pytest.importorskip("torchrec")
    tables, batches = real
    weights = initial_weights(list(tables.values()))
    cases = [_case(real, name) for name in CASES]
    runs = run_sharded_cases(cases + [exports[n][1] for n in EXPORTS], batches, world_size=W,
                             local_world_size=M, weights=weights)
    refs = [run_unsharded(t, batches, world_size=W, weights=weights) for t, _ in cases]
    out = {name: (case, run, ref) for name, case, run, ref in zip(CASES, cases, runs, refs)}
    ref = run_unsharded(list(tables.values()), batches, world_size=W, weights=weights)
    out.update({name: (None, run, ref) for name, run in zip(EXPORTS, runs[len(cases):])})
    return out


# ----------------------------------------------------------------------------- runs on gloo
@pytest.mark.parametrize("name", list(CASES))
def test_sharded_outputs_and_gradients_equal_the_unsharded_module(gloo_runs, name):
    (tables, _), run, ref = gloo_runs[name]
    assert run.ranks == tuple(range(W))
    _assert_equal_runs(run, ref, tables, name)


@pytest.mark.parametrize("name", list(CASES))
def test_counted_bytes_equal_the_formulas(gloo_runs, real, name):
    (tables, spec), run, _ = gloo_runs[name]
    _, batches = real
    for it in range(ITERATIONS):
        expected = expected_collectives(tables, spec, batches[it], world_size=W,
                                        local_world_size=M).summary()
        got = run.counter.select(iteration=it).summary()
        if it == 0:   # DDP's static-graph bookkeeping: one int32 all-reduce, first iteration only
            extra = {k: v for k, v in got.items() if k[5] == "int32"}
            assert all(k[3] == "data_parallel_all_reduce" and v[0] == 4 for k, v in extra.items())
            assert len(extra) == (W if "data_parallel" in spec.values() else 0)
            got = {k: v for k, v in got.items() if k not in extra}
        assert got == expected


def _assert_equal_runs(run, ref, tables, what):
    """Outputs of every rank and feature and the gradient of every table equal (fp32
    rounding), and every table got a gradient."""
    for it in range(ITERATIONS):
        for r in range(W):
            assert run.outputs[it][r].keys() == ref.outputs[it][r].keys() == \
                {t.feature for t in tables}
            for f, out in run.outputs[it][r].items():
                np.testing.assert_allclose(out, ref.outputs[it][r][f], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{what} it {it} rank {r} {f}")
        for t in tables:
            g = run.grads[it][t.name]
            assert np.abs(g).max() > 0, f"{t.name}: no gradient reached the table"
            np.testing.assert_allclose(g, ref.grads[it][t.name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{what} it {it} {t.name}")


@pytest.mark.parametrize("name", EXPORTS)
def test_exported_plan_runs_like_the_unsharded_modules(gloo_runs, real, name):
    """The remap loses and mixes no row: through KJTRemap, the export's ShardingPlan and
    KJTRemap.merge, every output and gradient equals the unsharded original tables'."""
    tables, _ = real
    _, run, ref = gloo_runs[name]
    _assert_equal_runs(run, ref, list(tables.values()), name)


@pytest.mark.parametrize("name", EXPORTS)
def test_exported_plan_moves_the_bytes_of_the_formulas(gloo_runs, exports, real, name):
    _, batches = real
    _, ex = exports[name]
    _, run, _ = gloo_runs[name]
    for it in range(ITERATIONS):
        expected = expected_export_collectives(ex, batches[it])
        got = run.counter.select(iteration=it)
        if it == 0:   # DDP's static-graph bookkeeping: 4 int32 bytes per DDP parameter
            extra = [r for r in got.records if r.dtype == "int32"]
            assert {r.component for r in extra} <= {"data_parallel_all_reduce"}
            got = CollectiveCounter(r for r in got.records if r.dtype != "int32")
        assert got.summary() == expected.summary()
        cmp = compare_components(got.component_bytes(), expected.component_bytes())
        assert all(c["err"] == 0 for c in cmp.values())


@pytest.mark.parametrize("name", EXPORTS)
def test_exported_plan_bytes_equal_the_evaluator(gloo_runs, exports, real, name):
    """The cost model's torchrec profile, on the plan TorchRec runs (plan_from_export) and the
    same batches, prices every component within 2% of what TorchRec sent (in fact exactly)."""
    from flexshard_stream.placement.cost import CostModel, evaluate_trace

    try:
        model = CostModel(profile="torchrec", dedup=False)   # no de-duplication on CPU
    except TypeError:
        pytest.skip("this checkout's evaluator has no execution profiles yet")
    _, batches = real
    _, ex = exports[name]
    _, run, _ = gloo_runs[name]
    tc = evaluate_trace(plan_from_export(ex), batches, B, model)
    cmp = compare_components(run.counter.mean_component_bytes(), tc.mean.collectives)
    assert {"input_values", "input_lengths", "input_splits"} <= set(cmp)
    assert all(c["err"] <= 0.02 for c in cmp.values()), cmp


def test_exports_use_every_path_of_the_remap(exports):
    """What the exported runs cover: replicated rows of pooled and of sequence tables (the
    latter run as plain nn.Embedding modules under DDP on CPU), explicitly placed rows kept on
    their GPU, row-wise, table-row-wise and table-wise cold tables."""
    fs = exports["flexshard"][1]
    sh = export_shardings(fs)
    kinds = {(t.kind, sh[t.name].sharding_type, sh[t.name].kernel) for t in fs.new_tables()}
    assert ("sequence", "data_parallel", "torch_module") in kinds
    assert ("pooled", "data_parallel", "dense") in kinds
    hp = exports["hashed_placed"][1]
    for e in hp.manifest["tables"]:
        assert e["cold"]["placed_rows"] == 5 and e["cold"]["placed_on_plan_gpu"] == 5
    cold = {sh.sharding_type for ex in (fs, exports["table_wise"][1], hp)
            for sh in export_shardings(ex).values()}
    assert {"row_wise", "table_wise", "data_parallel"} <= cold


def test_every_collective_of_an_iteration_is_a_torchrec_dist(gloo_runs):
    known = {"input_splits", "input_lengths", "input_values", "pooled_all_to_all",
             "pooled_reduce_scatter", "sequence_all_to_all", "data_parallel_all_reduce"}
    for _, run, _ in gloo_runs.values():
        comps = {r.component for r in run.counter.iterations().records}
        assert comps <= known, comps - known
        assert {r.phase for r in run.counter.records} <= {"setup", "forward", "backward"}
    # DDP's start-up (parameter broadcast, shape check) is filed under setup, not an iteration
    setup = gloo_runs["pooled"][1].counter.select(phase="setup")
    assert {r.op for r in setup.records} >= {"broadcast", "all_gather"}


def test_formulas_by_hand_on_the_real_batch(gloo_runs, real):
    """A few components written out: what TorchRec sends is fixed by B, D, the IDs and dtypes."""
    (tables, _), run, _ = gloo_runs["pooled"]
    _, batches = real
    c = run.counter.select(iteration=1)
    d = 8
    # data-parallel C3: the whole table's gradient, every rank, every iteration
    dp = c.select(component="data_parallel_all_reduce").totals(by=("rank",))
    assert dp == {(r,): 64 * d * 4 for r in range(W)}
    # table-wise C1 on rank 1 (and the column-wise shards): each owner sends every rank
    # (itself included) B pooled rows of its columns, fp32
    fwd = c.select(component="pooled_all_to_all", phase="forward").send_matrix(W)
    assert fwd[1].tolist() == [B * d * 4] * W                  # C1 (whole) on rank 1
    assert fwd[0].tolist() == [B * (d // 2) * 4] * W           # C2 columns 0-3 on rank 0
    assert fwd[2].tolist() == [B * (d // 2) * 4] * W           # C4 columns 0-3 on rank 2
    assert fwd[3].tolist() == [B * (d // 2) * 4 * 2] * W       # C2 and C4 columns 4-7
    bwd = c.select(component="pooled_all_to_all", phase="backward").send_matrix(W)
    assert (bwd == fwd.T).all()
    # the IDs: rank r sends rank 1 its C1 IDs (int64), and B lengths (int64)
    ids = [int(slice_batch(batches[1], r * B, (r + 1) * B).feature_lengths("C1").sum())
           for r in range(W)]
    vals = c.select(component="input_values").send_matrix(W)
    lens = c.select(component="input_lengths").send_matrix(W)
    c2 = [int(slice_batch(batches[1], r * B, (r + 1) * B).feature_lengths("C2").sum())
          for r in range(W)]
    c4 = [int(slice_batch(batches[1], r * B, (r + 1) * B).feature_lengths("C4").sum())
          for r in range(W)]
    assert vals[:, 1].tolist() == [8 * n for n in ids]
    assert vals[:, 0].tolist() == [8 * n for n in c2]
    assert vals[:, 3].tolist() == [8 * (a + b) for a, b in zip(c2, c4)]
    assert lens[:, 3].tolist() == [8 * B * 2] * W
    # the splits: 3 int64 per destination per sharding (lengths, values, stride); three
    # shardings here (table-wise, column-wise, table-column-wise; data-parallel has no dist)
    assert c.select(component="input_splits").send_matrix(W).tolist() == [[3 * 8 * 3] * W] * W


def test_row_wise_pooled_reduces_partial_sums_densely(gloo_runs):
    """Pooled row-wise: every rank reduce-scatters W * B partial sums whatever the IDs;
    table-row-wise: inside the node, then an all-to-all across nodes."""
    (_, _), run, _ = gloo_runs["pooled_row"]
    c = run.counter.select(iteration=1, component="pooled_reduce_scatter")
    world = c.select(op="reduce_scatter").records
    rs_world = [r for r in world if len(r.group) == W]
    assert sorted(r.input_bytes for r in rs_world) == [W * B * 8 * 4] * W
    rs_node = [r for r in world if len(r.group) == M]
    assert {r.group for r in rs_node} == {(0, 1), (2, 3)}
    assert {(r.group, r.input_bytes) for r in rs_node} == {((0, 1), 0), ((2, 3), W * B * 8 * 4)}
    cross = run.counter.select(iteration=1, component="pooled_all_to_all", phase="forward")
    assert {r.group for r in cross.records} == {(0, 2), (1, 3)}
    assert {(r.rank, r.send_bytes) for r in cross.records} == {
        (0, (0, 0)), (1, (0, 0)), (2, (B * 8 * 4,) * 2), (3, (B * 8 * 4,) * 2)}


# ----------------------------------------------------------------------------- a fake world
FAKE_W, FAKE_M, FAKE_RANK = 16, 4, 5
FAKE_CASES = {
    "pooled": {"C1": "table_wise:5", "C2": "column_wise:4,5", "C3": "data_parallel",
               "C4": "table_column_wise:8,9", "C5": "row_wise", "ml_user": "table_row_wise:1"},
    "pooled_other_node": {"C1": "table_wise:0", "C2": "table_row_wise:2", "C5": "row_wise"},
}


@pytest.fixture(scope="module")
def fake_runs(real):
    """Rank 5 of a 16-rank world (4 per node) on torch's fake process group, int32 IDs and
    lengths, weighted pooled inputs."""
    pytest.importorskip("torchrec")
    tables, batches = real
    rng = np.random.default_rng(5)
    local = [slice_batch(b, FAKE_RANK * 2, FAKE_RANK * 2 + 2) for b in batches]
    weighted = [Batch(b.keys, b.values, b.lengths, rng.uniform(0.5, 2.0, b.num_values)
                      .astype(np.float32)) for b in local]
    # the fake world's global batch: every rank holds rank 5's samples
    world = [concat_batches([b] * FAKE_W) for b in weighted]
    cases = [([tables[f] for f in spec], spec) for spec in FAKE_CASES.values()]
    runs = run_sharded_cases(cases, world, world_size=FAKE_W, local_world_size=FAKE_M,
                             values_dtype="int32", lengths_dtype="int32",
                             fake_ranks=[FAKE_RANK])
    return dict(zip(FAKE_CASES, zip(cases, runs))), world


@pytest.mark.parametrize("name", list(FAKE_CASES))
def test_fake_world_counts_equal_the_formulas(fake_runs, name):
    runs, world = fake_runs
    (tables, spec), run = runs[name]
    assert run.ranks == (FAKE_RANK,) and run.outputs == [] and run.grads == []
    for it in range(ITERATIONS):
        expected = expected_collectives(tables, spec, world[it], world_size=FAKE_W,
                                        local_world_size=FAKE_M, values_dtype="int32",
                                        lengths_dtype="int32", weighted=True)
        got = run.counter.select(iteration=it).summary()
        if it == 0:
            got = {k: v for k, v in got.items()
                   if k[5] != "int32" or k[3] != "data_parallel_all_reduce"}
        assert got == expected.select(rank=FAKE_RANK).summary()
        assert any(k[3] == "input_weights" and k[5] == "float32" for k in got)


# ----------------------------------------------------------------------------- what does not run
def test_sequence_data_parallel_is_refused_with_the_reason():
    t = EmbeddingTable("s", 10, 4, kind="sequence")
    with pytest.raises(ConfigError, match="PoolingMode.NONE is ignored on CPU"):
        TableSharding("data_parallel").check(t, W, M)
    with pytest.raises(ConfigError, match="fused kernel"):
        TableSharding("table_wise", (0,), compute_kernel="dense").check(t, W, M)


def test_fbgemm_cpu_dense_kernel_pools_sequence_lookups():
    """Why sequence data-parallel cannot run on CPU: TorchRec puts data-parallel tables on the
    dense kernel, and fbgemm-gpu-cpu 1.8's dense kernel returns one pooled row per sample when
    asked for one row per ID (PoolingMode.NONE). If this starts failing, fbgemm fixed it."""
    pytest.importorskip("torchrec")
    import torch
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    tbe = DenseTableBatchedEmbeddingBagsCodegen([(20, 4)], pooling_mode=PoolingMode.NONE,
                                                use_cpu=True)
    w = tbe.weights.detach().view(20, 4)
    out = tbe(torch.tensor([3, 4, 5, 6, 7]), torch.tensor([0, 2, 5]))
    assert out.shape == (2, 4)                                  # not (5, 4)
    torch.testing.assert_close(out[1].detach(), w[[5, 6, 7]].sum(0))


def test_torchrec_planner_refuses_pooled_row_wise_on_cpu_unless_the_sharder_offers_it():
    pytest.importorskip("torchrec")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
    )
    from torchrec.distributed.planner import Topology as TRTopology

    from flexshard_stream.bridge.world import (
        CpuEmbeddingBagCollectionSharder,
        build_collections,
    )

    ebc = build_collections([EmbeddingTable("t", 4000, 8, kind="pooled")], device="meta").ebc
    for st in ("row_wise", "table_row_wise"):
        def planner():
            return EmbeddingShardingPlanner(
                topology=TRTopology(world_size=W, local_world_size=M, compute_device="cpu"),
                constraints={"t": ParameterConstraints(sharding_types=[st])})
        with pytest.raises(RuntimeError, match="No available sharding type"):
            planner().plan(ebc, [EmbeddingBagCollectionSharder()])
        plan = planner().plan(ebc, [CpuEmbeddingBagCollectionSharder()])
        assert plan.plan[""]["t"].sharding_type == st


def test_sharding_plan_of_our_plan_has_ranks_and_offsets():
    pytest.importorskip("torchrec")
    from flexshard_stream.bridge.runtime import sharding_plan

    topo = Topology.uniform(2, 2)
    tables = [EmbeddingTable("p", 10, 8, kind="pooled"), EmbeddingTable("s", 7, 8)]
    twrw = baselines.table_row_wise(tables[:1], topo)
    plan = sharding_plan(twrw)
    node = twrw.meta["node_of_table"]["p"]
    ps = plan.plan["ebc"]["p"]
    assert ps.sharding_type == "table_row_wise" and ps.ranks == [2 * node, 2 * node + 1]
    assert [s.shard_offsets for s in ps.sharding_spec.shards] == [[0, 0], [5, 0]]
    with pytest.raises(ConfigError, match="no table_row_wise for sequence"):   # TorchRec's EC
        sharding_plan(baselines.table_row_wise(tables, topo))
    rw = sharding_plan(baselines.row_wise(tables, topo))
    assert [s.shard_sizes for s in rw.plan["ec"]["s"].sharding_spec.shards] == \
        [[2, 8], [2, 8], [2, 8], [1, 8]]


def test_torch_module_tables_stay_out_of_torchrec():
    """compute_kernel="torch_module": a data-parallel table as a plain nn.Embedding(Bag) outside
    the collections (DDP replicates it), not in the ShardingPlan; the only way to replicate a
    sequence table on CPU, so the refusal of sequence data-parallel names it."""
    pytest.importorskip("torchrec")
    from torch import nn

    from flexshard_stream.bridge.world import build_collections, module_sharding_plan

    s, p = EmbeddingTable("s", 10, 4), EmbeddingTable("p", 12, 4, kind="pooled")
    sh = {"s": TableSharding("data_parallel", compute_kernel="torch_module"),
          "p": TableSharding("data_parallel", compute_kernel="torch_module")}
    for t in (s, p):
        sh[t.name].check(t, W, M)
    model = build_collections([s, p], shardings=sh)
    assert model.ebc is None and model.ec is None
    assert isinstance(model.plain["s"], nn.Embedding) and isinstance(model.plain["p"],
                                                                     nn.EmbeddingBag)
    assert module_sharding_plan([s, p], sh, W, M).plan == {}
    with pytest.raises(ConfigError, match="torch_module"):
        TableSharding("data_parallel").check(s, W, M)
    with pytest.raises(ConfigError, match="use the dense kernel"):
        TableSharding("data_parallel", compute_kernel="fused").check(p, W, M)


def test_fake_world_runs_pooled_tables_only():
    t = EmbeddingTable("s", 10, 4, kind="sequence")
    with pytest.raises(ConfigError, match="pooled tables only"):
        run_sharded_cases([([t], {"s": "row_wise"})], [Batch.from_features({"s": [1] * 8})],
                          fake_ranks=[0])


# ----------------------------------------------------------------------------- plans, no torch
def test_table_shardings_of_our_baselines():
    topo = Topology.uniform(2, 2)
    tables = [EmbeddingTable(f"t{i}", 100 + i, 8) for i in range(4)]
    assert {s.sharding_type for s in table_shardings(baselines.row_wise(tables, topo)).values()} \
        == {"row_wise"}
    assert {s.sharding_type for s in table_shardings(baselines.data_parallel(tables, topo))
            .values()} == {"data_parallel"}
    tw = baselines.table_wise(tables, topo)
    got = table_shardings(tw)
    assert {n: s.ranks for n, s in got.items()} == \
        {n: (g,) for n, g in tw.meta["gpu_of_table"].items()}
    twrw = baselines.table_row_wise(tables, topo)
    assert {n: s.host for n, s in table_shardings(twrw).items()} == twrw.meta["node_of_table"]


def test_table_shardings_refuse_what_torchrec_cannot_express():
    topo = Topology.uniform(2, 2)
    t = EmbeddingTable("t", 100, 8)
    cases = {
        "hashed rows": TablePlan(t, ColdSharding.hashed(range(4))),
        "weighted ranges": TablePlan(t, ColdSharding.ranges(range(4), 100, [1, 2, 3, 4])),
        "replicated, node or explicitly placed rows":
            TablePlan(t, ColdSharding.ranges(range(4), 100), global_ids=[3]),
        "neither every GPU": TablePlan(t, ColdSharding.ranges([0, 3], 100)),
    }
    for why, tp in cases.items():
        with pytest.raises(ConfigError, match=why):
            table_shardings(Plan("x", topo, [tp]))


def test_sharding_checks():
    t = EmbeddingTable("t", 100, 8, kind="pooled")
    TableSharding.parse("table_column_wise:2,3").check(t, W, M)
    for spec, why in [("table_column_wise:1,2", "span nodes"),
                      ("column_wise:0,1,2,3", "multiple of 4"),
                      ("column_wise:0,0", "one column shard per rank"), ("table_wise:4", "not in"),
                      ("table_row_wise:2", "host 2")]:
        with pytest.raises(ConfigError, match=why):
            TableSharding.parse(spec).check(t, W, M)
    with pytest.raises(ConfigError, match="unknown"):
        TableSharding("grid_shard")
    with pytest.raises(ConfigError, match="no table_row_wise for sequence"):
        TableSharding("table_row_wise", host=0).check(EmbeddingTable("s", 9, 4), W, M)


def test_torchrec_block_helpers_follow_torchrec():
    assert torchrec_row_blocks(10, 4).tolist() == [0, 3, 6, 9, 10]
    assert torchrec_row_blocks(5, 4).tolist() == [0, 2, 4, 5, 5]
    assert torchrec_column_block(8, 2) == 4 and torchrec_column_block(8, 4) == 4
    assert torchrec_column_block(128, 4) == 32 and torchrec_column_block(12, 2) == 12


def test_expected_collectives_by_hand():
    """Two ranks, one node, B = 2: a table-wise pooled table on rank 1 and a row-wise sequence
    table (blocks of 3 rows: rank 0 rows 0-2, rank 1 rows 3-5)."""
    p = EmbeddingTable("p", 6, 4, kind="pooled")
    s = EmbeddingTable("s", 6, 8, kind="sequence")
    batch = Batch.from_features({"p": [1, 2, 5, 0, 4], "s": [0, 3, 4, 5]},
                                {"p": [2, 1, 0, 2], "s": [1, 2, 0, 1]})
    c = expected_collectives([p, s], {"p": "table_wise:1", "s": "row_wise"}, batch,
                             world_size=2, local_world_size=2, values_dtype="int32")
    m = lambda comp, **kw: c.select(component=comp, **kw).send_matrix(2).tolist()  # noqa: E731
    assert m("input_splits") == [[48, 48], [48, 48]]          # two shardings x 3 int64
    # lengths: table-wise sends rank 1 B lengths; row-wise sends every rank B lengths (int64)
    assert m("input_lengths") == [[16, 32], [16, 32]]
    # values (int32): p -> rank 1: 3 and 2 IDs; s: rank 0's IDs {0, 3, 4} -> 1 to rank 0, 2 to
    # rank 1; rank 1's {5} -> rank 1
    assert m("input_values") == [[4, 12 + 8], [0, 8 + 4]]
    assert m("pooled_all_to_all", phase="forward") == [[0, 0], [2 * 4 * 4, 2 * 4 * 4]]
    assert m("sequence_all_to_all", phase="forward") == [[32, 0], [64, 32]]
    assert m("sequence_all_to_all", phase="backward") == [[32, 64], [0, 32]]
    assert isinstance(c, CollectiveCounter) and {r.iteration for r in c.records} == {None}


def test_module_imports_without_torch():
    code = ("import sys; import flexshard_stream.bridge.runtime, flexshard_stream.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
