"""TorchRec as a real runtime: DistributedModelParallel on CPU (gloo, 4 ranks on 2 "nodes") fed
KeyedJaggedTensors of the shared real traces, its outputs and gradients against the unsharded
modules, and every collective it issues against the byte formulas of docs/TORCHREC_RUNTIME.md.

The formula and plan tests need no torch; the runs skip when TorchRec is not installed. One gloo
world (4 processes) and one fake world (1 process simulating rank 5 of 16) serve every run test.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import SHARED
from flexshard_stream.errors import ConfigError
from flexshard_stream.online.torchrec_runtime import (
    CollectiveCounter, TableSharding, expected_collectives, run_sharded_cases, run_unsharded,
    table_shardings, torchrec_column_block, torchrec_row_blocks)
from flexshard_stream.placement import baselines
from flexshard_stream.placement.plan import ColdSharding, Plan, TablePlan
from flexshard_stream.placement.tables import EmbeddingTable
from flexshard_stream.placement.topology import Topology
from flexshard_stream.sources import datasets
from flexshard_stream.stats.batch import Batch, concat_batches, slice_batch

W, M, B = 4, 2, 8            # ranks, ranks per node, samples per rank
ITERATIONS = 2


# ----------------------------------------------------------------------------- real batches
def _histories(values: np.ndarray, lengths: np.ndarray, users: slice, keep: int):
    """The last ``keep`` items of each user in ``users`` (values, lengths)."""
    offs = np.concatenate([[0], np.cumsum(lengths)])
    out_v, out_l = [], []
    for u in range(users.start, users.stop):
        items = values[offs[u]:offs[u + 1]][-keep:]
        out_v.append(items)
        out_l.append(items.size)
    return np.concatenate(out_v), np.array(out_l)


def _real_features(n: int) -> tuple[dict, dict, dict[str, int]]:
    """Features of ``n`` samples from MovieLens, Amazon and Criteo, IDs made dense per feature:
    pooled ``C1``..``C5`` (Criteo fields, one ID or none per row, hash mod 64) and ``ml_user``;
    sequence ``ml_movie`` (a user's last 6 movies), ``az_beauty`` / ``az_toys`` (last 8 items)."""
    ratings = datasets.movielens_ratings(SHARED / "movielens-latest-small")
    users = ratings.get_column("user").to_numpy()
    movies = np.unique(ratings.get_column("movie").to_numpy(), return_inverse=True)[1]
    order = np.argsort(users, kind="stable")
    _, per_user = np.unique(users, return_counts=True)
    feats, lens, rows = {}, {}, {}
    feats["ml_movie"], lens["ml_movie"] = _histories(movies[order], per_user, slice(0, n), 6)
    rows["ml_movie"] = int(movies.max()) + 1
    feats["ml_user"], lens["ml_user"] = np.arange(n) % per_user.size, np.ones(n, np.int64)
    rows["ml_user"] = per_user.size
    for key, name in (("az_beauty", "Beauty"), ("az_toys", "Toys_and_Games")):
        v, ln = datasets.amazon_sequences(name, SHARED / "amazon-reviews-sequences"
                                          / f"{name}.txt")
        feats[key], lens[key] = _histories(v, ln, slice(0, n), 8)
        rows[key] = int(v.max()) + 1
    frame = datasets.criteo_frame(SHARED / "criteo-1k" / "train.txt")
    for c in ("C1", "C2", "C3", "C4", "C5"):
        col = frame.get_column(c).to_numpy()[:n]
        present = ~np.isnan(col.astype(float))
        feats[c] = (col[present].astype(np.int64) % 64)
        lens[c] = present.astype(np.int64)
        rows[c] = 64
    return feats, lens, rows


@pytest.fixture(scope="module")
def real():
    """(tables by feature, global batches of W * B samples) from the shared traces."""
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    n = W * B * ITERATIONS
    feats, lens, rows = _real_features(n)
    full = Batch.from_features(feats, lens)
    batches = [slice_batch(full, i * W * B, (i + 1) * W * B) for i in range(ITERATIONS)]
    kind = {f: "sequence" if f in ("ml_movie", "az_beauty", "az_toys") else "pooled" for f in feats}
    tables = {f: EmbeddingTable(f, rows[f], 8, kind=kind[f], feature=f) for f in feats}
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


@pytest.fixture(scope="module")
def gloo_runs(real):
    """Every case of CASES in one spawned gloo world, with the unsharded reference of each."""
    pytest.importorskip("torchrec")
    _, batches = real
    cases = [_case(real, name) for name in CASES]
    runs = run_sharded_cases(cases, batches, world_size=W, local_world_size=M)
    refs = [run_unsharded(t, batches, world_size=W) for t, _ in cases]
    return {name: (case, run, ref) for name, case, run, ref in zip(CASES, cases, runs, refs)}


# ----------------------------------------------------------------------------- runs on gloo
@pytest.mark.parametrize("name", list(CASES))
def test_sharded_outputs_and_gradients_equal_the_unsharded_module(gloo_runs, name):
    (tables, _), run, ref = gloo_runs[name]
    assert run.ranks == tuple(range(W))
    for it in range(ITERATIONS):
        for r in range(W):
            assert run.outputs[it][r].keys() == ref.outputs[it][r].keys() == \
                {t.feature for t in tables}
            for f, out in run.outputs[it][r].items():
                np.testing.assert_allclose(out, ref.outputs[it][r][f], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} it {it} rank {r} {f}")
        for t in tables:
            g = run.grads[it][t.name]
            assert np.abs(g).max() > 0, f"{t.name}: no gradient reached the table"
            np.testing.assert_allclose(g, ref.grads[it][t.name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} it {it} {t.name}")


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
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import \
        DenseTableBatchedEmbeddingBagsCodegen

    tbe = DenseTableBatchedEmbeddingBagsCodegen([(20, 4)], pooling_mode=PoolingMode.NONE,
                                                use_cpu=True)
    w = tbe.weights.detach().view(20, 4)
    out = tbe(torch.tensor([3, 4, 5, 6, 7]), torch.tensor([0, 2, 5]))
    assert out.shape == (2, 4)                                  # not (5, 4)
    torch.testing.assert_close(out[1].detach(), w[[5, 6, 7]].sum(0))


def test_torchrec_planner_refuses_pooled_row_wise_on_cpu_unless_the_sharder_offers_it():
    pytest.importorskip("torchrec")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import (EmbeddingShardingPlanner, ParameterConstraints,
                                              Topology as TRTopology)

    from flexshard_stream.online.torchrec_world import (CpuEmbeddingBagCollectionSharder,
                                                        build_collections)

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
    from flexshard_stream.online.torchrec_runtime import sharding_plan

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
    code = ("import sys; import flexshard_stream.online.torchrec_runtime, flexshard_stream.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
