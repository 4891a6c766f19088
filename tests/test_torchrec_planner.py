"""TorchRec's own planner as a strategy (placement/references.py, ``plan --strategy
torchrec``): its ShardingPlan converted exactly to our plan type and priced under both profiles.

The planner tests skip without the ``torchrec`` extra; the conversion tests feed hand-made
ShardingPlans (plain objects with TorchRec's attribute names) and need no torch.
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flexshard_stream.cli import app
from flexshard_stream.errors import ConfigError, MissingExtraError
from flexshard_stream.placement.cost import CostModel, evaluate_analytic, evaluate_trace
from flexshard_stream.placement.profiles import execution_profile
from flexshard_stream.placement.references import (
    UVM_CACHING_RATIO,
    module_paths,
    plan_from_sharding_plan,
    plan_torchrec,
    torchrec_topology_config,
)
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.stream import StreamStats

B = 16
TOPO = Topology.uniform(2, 4, hbm_bytes_per_gpu=2e9)
# a mix TorchRec shards in several ways on 2 x 4 GPUs of 2 GB: data-parallel, table-row-wise,
# column-wise, row-wise
TABLES = [EmbeddingTable("tiny", 50, 16, kind="pooled"),
          EmbeddingTable("small", 2_000, 64, kind="pooled"),
          EmbeddingTable("big_pooled", 3_000_000, 128, kind="pooled", optimizer_state_bytes=4),
          EmbeddingTable("wide", 20_000, 512, kind="pooled"),
          EmbeddingTable("history", 4_000_000, 64, kind="sequence", optimizer_state_bytes=4),
          EmbeddingTable("query", 30_000, 64, kind="sequence")]
MEAN_LENGTH = {"tiny": 1, "small": 3, "big_pooled": 20, "wide": 2, "history": 40, "query": 5}


def _batch(n: int, seed: int = 0) -> Batch:
    """``n`` samples of Zipf-skewed IDs, Poisson lengths of each table's mean."""
    rng = np.random.default_rng(seed)
    feats, lens = {}, {}
    for t in TABLES:
        ln = rng.poisson(MEAN_LENGTH[t.name], n).astype(np.int64)
        ids = (rng.zipf(1.2, int(ln.sum())) - 1) * 7919 % t.num_rows
        feats[t.name], lens[t.name] = ids.astype(np.int64), ln
    return Batch.from_features(feats, lens)


@pytest.fixture(scope="module")
def planned():
    pytest.importorskip("torchrec")
    batch = _batch(TOPO.num_gpus * B * 2)
    st = StreamStats({t.name: t.num_rows for t in TABLES})
    st.update(batch)
    sums = st.summary(4096)
    return plan_torchrec(TABLES, TOPO, B, summaries=sums), sums, batch


# ----------------------------------------------------------------------------- with TorchRec
def _owner_of_rows(ps, num_rows: int) -> np.ndarray:
    """Rank holding each row under TorchRec's row shards (from its ShardMetadata)."""
    owner = np.full(num_rows, -1)
    for s in ps.sharding_spec.shards:
        lo, n = s.shard_offsets[0], s.shard_sizes[0]
        owner[lo:lo + n] = s.placement.rank()
    return owner


def test_plan_equals_torchrecs_sharding_plan(planned):
    """Per table: the sharding type, the ranks, and every shard's rows and columns are TorchRec's."""
    r, _, _ = planned
    plan, sp = r.plan, r.sharding_plan
    assert plan.strategy == "torchrec"
    paths = module_paths(TABLES)
    kinds = set()
    for t in TABLES:
        ps = sp.plan[paths[t.name]][t.name]
        tp = plan[t.name]
        kinds.add(ps.sharding_type)
        assert tp.sharding == ps.sharding_type == plan.sharding_kinds[t.name]
        if ps.sharding_type == "data_parallel":
            assert tp.replicated
            continue
        shards = sorted(ps.sharding_spec.shards, key=lambda s: tuple(s.shard_offsets))
        ranks = [s.placement.rank() for s in shards]
        assert sorted(set(tp.cold.gpus.tolist())) == sorted(set(ps.ranks)) == sorted(set(ranks))
        if tp.column_wise:
            assert tp.cold.gpus.tolist() == ranks
            assert tp.cold.column_offsets[:-1].tolist() == [s.shard_offsets[1] for s in shards]
            assert tp.cold.widths.tolist() == [s.shard_sizes[1] for s in shards]
            continue
        assert tp.cold.gpus.tolist() == ranks
        assert tp.cold.bounds[:-1].tolist() == [s.shard_offsets[0] for s in shards]
        ids = np.arange(t.num_rows, dtype=np.int64)
        assert np.array_equal(plan.route(t.name, ids, 0), _owner_of_rows(ps, t.num_rows))
    assert len(kinds) >= 3, kinds     # the workload exercises several sharding types
    assert execution_profile("torchrec").issues(plan) == []   # TorchRec runs its own plan


def test_plan_prices_under_both_profiles(planned):
    r, sums, batch = planned
    assert r.cost is not None and r.cost.profile == "torchrec"
    assert r.plan.meta["estimates"]["comm_time_s_per_iter"] == r.cost.comm_time_s
    for profile in ("torchrec", "ideal"):
        m = CostModel(profile=profile)
        a = evaluate_analytic(r.plan, sums, B, m)
        t = evaluate_trace(r.plan, [batch], B, m).mean
        for c in (a, t):
            assert c.profile == profile and np.isfinite(c.comm_time_s) and c.comm_time_s > 0
            assert c.peak_memory_bytes > 0
    # the data-parallel table is all-reduced whole under torchrec, touched rows only under ideal
    dp = [n for n, tp in r.plan.tables.items() if tp.replicated]
    if dp:
        tr = evaluate_analytic(r.plan, sums, B, CostModel(profile="torchrec"))
        assert tr.collectives["data_parallel_all_reduce"] > 0


def test_torchrecs_own_estimate_is_recorded(planned):
    r, _, _ = planned
    e = r.plan.meta["torchrec"]["estimate"]
    assert e is r.estimate or e == r.estimate
    per_rank = np.array(e["per_rank_total_ms"])
    assert e["perf_rating_ms"] == per_rank.max() > 0 and e["critical_rank"] == per_rank.argmax()
    assert sorted(e["tables"]) == sorted(t.name for t in TABLES)
    assert sum(v["perf_total_ms"] for v in e["tables"].values()) == pytest.approx(per_rank.sum())
    assert r.plan.meta["torchrec"]["pooling_factors"] == pytest.approx(
        {n: s.mean_length for n, s in planned[1].items()})
    assert r.seconds > 0 and e["num_plans"] >= 1


def test_plan_saves_and_loads(planned, tmp_path):
    r, _, _ = planned
    r.plan.save(tmp_path / "p")
    back = Plan.load(tmp_path / "p")
    assert back == r.plan and back.meta["torchrec"]["compute_kernels"]


def test_heterogeneous_hbm_goes_in_per_rank():
    pytest.importorskip("torchrec")
    hbm = np.full(8, 2e9)
    hbm[:4] = 1e9
    topo = Topology(2, 4, hbm, TOPO.intra_bw, TOPO.inter_bw, TOPO.uvm_bw, TOPO.host_memory_bytes)
    t = EmbeddingTable("rows", 400_000, 128, kind="sequence")
    r = plan_torchrec([t], topo, B, mean_lengths={"rows": 10.0})
    assert r.plan.meta["torchrec"]["topology"]["hbm_cap_per_rank"] == hbm.astype(int).tolist()
    ps = r.sharding_plan.plan["ec"]["rows"]
    assert ps.sharding_type == "row_wise"
    rows = np.bincount(r.plan.route("rows", np.arange(t.num_rows), 0), minlength=8)
    assert rows[:4].max() < rows[4:].min()     # TorchRec cuts rows by HBM: uneven blocks
    assert np.array_equal(r.plan.route("rows", np.arange(t.num_rows), 0),
                          _owner_of_rows(ps, t.num_rows))


def test_cli_plan_strategy_torchrec(tmp_path):
    pytest.importorskip("torchrec")
    rng = np.random.default_rng(1)
    n = 2000
    df = pl.DataFrame({"item": pl.Series([list(rng.zipf(1.3, rng.integers(1, 9)) % 900)
                                          for _ in range(n)], dtype=pl.List(pl.Int64)),
                       "user": rng.integers(0, 300, n)})
    log = tmp_path / "log.parquet"
    df.write_parquet(log)
    r = CliRunner().invoke(app, ["plan", "--log", str(log), "--topology", "2x8", "--strategy",
                                 "torchrec", "--out", str(tmp_path / "p"), "--batch-size", "8",
                                 "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["strategy"] == "torchrec" and doc["torchrec_issues"] == []
    assert doc["torchrec_estimate"]["perf_rating_ms"] > 0
    assert doc["cost"]["comm_time_s_per_iter"] > 0
    assert Plan.load(tmp_path / "p").strategy == "torchrec"


# ----------------------------------------------------------------------------- without TorchRec
def test_missing_extra_is_named(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchrec", None)    # import torchrec raises ImportError
    with pytest.raises(MissingExtraError, match="'torchrec' extra"):
        plan_torchrec(TABLES, TOPO, B)
    trace = tmp_path / "log.parquet"
    pl.DataFrame({"user": np.arange(100) % 7}).write_parquet(trace)
    r = CliRunner().invoke(app, ["plan", "--log", str(trace), "--topology", "2x8",
                                 "--strategy", "torchrec", "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "'torchrec' extra" in r.output and "Traceback" not in r.output


def test_topology_in_torchrecs_units():
    topo = Topology.preset("16x8")
    cfg = torchrec_topology_config(topo)
    assert cfg["trainer"]["world_size"] == 128 and cfg["trainer"]["local_world_size"] == 8
    assert cfg["hardware"]["intra_host_bw"] == float(topo.intra_bw.min()) / 1e3   # bytes/ms
    assert cfg["hardware"]["inter_host_bw"] == float(topo.inter_bw.min()) / 1e3
    assert cfg["hardware"]["hbm_cap_bytes"] == int(topo.hbm_bytes.min())
    assert cfg["kernel"]["compute_device"] == "cuda" and "hbm_cap_per_rank" not in cfg
    skewed = torchrec_topology_config(Topology.preset("16x8_skewed"))
    assert skewed["hardware"]["inter_host_bw"] == \
        float(Topology.preset("16x8_skewed").inter_bw.min()) / 1e3


def _shard(rows, cols, size, rank):
    return SimpleNamespace(shard_offsets=[rows, cols], shard_sizes=list(size),
                           placement=f"rank:{rank}/cuda:{rank % 4}")


def _ps(kind, shards=None, ranks=(), kernel="fused", cache=None):
    spec = SimpleNamespace(shards=shards) if shards is not None else None
    return SimpleNamespace(sharding_type=kind, compute_kernel=kernel, ranks=list(ranks),
                           sharding_spec=spec, cache_params=cache)


def _plan(entries, tables):
    return plan_from_sharding_plan(SimpleNamespace(plan={"m": entries}), tables, TOPO)


def test_conversion_of_each_sharding_kind():
    t = EmbeddingTable("t", 10, 8, kind="pooled")
    rw = _plan({"t": _ps("row_wise", [_shard(3 * i, 0, (3 if i < 3 else 1, 8), i)
                                      for i in range(4)] +
                         [_shard(10, 0, (0, 8), i) for i in range(4, 8)])}, [t])
    assert rw["t"].cold.bounds.tolist() == [0, 3, 6, 9, 10, 10, 10, 10, 10]
    assert rw.route("t", np.arange(10), 0).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    uneven = _plan({"t": _ps("table_row_wise", [_shard(0, 0, (7, 8), 5), _shard(7, 0, (3, 8), 4)])},
                   [t])
    assert uneven["t"].sharding == "table_row_wise"
    assert uneven.route("t", np.arange(10), 0).tolist() == [5] * 7 + [4] * 3
    tw = _plan({"t": _ps("table_wise", [_shard(0, 0, (10, 8), 6)])}, [t])
    assert tw["t"].cold.gpus.tolist() == [6] and tw.sharding_kinds["t"] == "table_wise"
    cw = _plan({"t": _ps("column_wise", [_shard(0, 4, (10, 4), 2), _shard(0, 0, (10, 4), 7)])},
               [t])
    assert cw["t"].cold.gpus.tolist() == [7, 2] and cw["t"].cold.widths.tolist() == [4, 4]
    dp = _plan({"t": _ps("data_parallel", None, range(8), "dense")}, [t])
    assert dp["t"].replicated and dp.meta["torchrec"]["compute_kernels"] == {"t": "dense"}


def test_adjacent_column_shards_on_one_rank_merge_and_others_are_refused():
    t = EmbeddingTable("t", 10, 12, kind="pooled")
    merged = _plan({"t": _ps("table_column_wise", [_shard(0, 0, (10, 4), 1),
                                                   _shard(0, 4, (10, 4), 1),
                                                   _shard(0, 8, (10, 4), 3)])}, [t])
    assert merged["t"].cold.gpus.tolist() == [1, 3] and merged["t"].cold.widths.tolist() == [8, 4]
    assert "adjacent column shards" in merged.meta["torchrec"]["notes"][0]
    with pytest.raises(ConfigError, match="not adjacent"):
        _plan({"t": _ps("column_wise", [_shard(0, 0, (10, 4), 1), _shard(0, 4, (10, 4), 2),
                                        _shard(0, 8, (10, 4), 1)])}, [t])


def test_conversion_refuses_what_it_cannot_express():
    t = EmbeddingTable("t", 10, 8, kind="pooled")
    with pytest.raises(ConfigError, match="grid_shard"):
        _plan({"t": _ps("grid_shard", [_shard(0, 0, (10, 8), 0)])}, [t])
    with pytest.raises(ConfigError, match="do not tile the rows"):
        _plan({"t": _ps("row_wise", [_shard(0, 0, (4, 8), 0), _shard(5, 0, (5, 8), 1)])}, [t])
    with pytest.raises(ConfigError, match="span every column"):
        _plan({"t": _ps("row_wise", [_shard(0, 0, (10, 4), 0)])}, [t])
    with pytest.raises(ConfigError, match=r"no entry for table\(s\) \['u'\]"):
        _plan({"t": _ps("table_wise", [_shard(0, 0, (10, 8), 0)])},
              [t, EmbeddingTable("u", 5, 8)])


def test_uvm_kernels_keep_rows_in_host_memory():
    t = EmbeddingTable("t", 10, 8, kind="pooled")
    uvm = _plan({"t": _ps("table_wise", [_shard(0, 0, (10, 8), 2)], kernel="fused_uvm")}, [t])
    assert uvm["t"].hbm_fraction.tolist() == [0.0] * 8
    cached = _plan({"t": _ps("row_wise", [_shard(5 * i, 0, (5, 8), i) for i in range(2)],
                             kernel="fused_uvm_caching")}, [t])
    assert cached["t"].hbm_fraction.tolist() == [UVM_CACHING_RATIO] * 8
    lf = _plan({"t": _ps("table_wise", [_shard(0, 0, (10, 8), 0)], kernel="fused_uvm_caching",
                         cache=SimpleNamespace(load_factor=0.5))}, [t])
    assert lf["t"].hbm_fraction.tolist() == [0.5] * 8


def test_module_paths_group_sequence_tables_by_dim():
    same = [EmbeddingTable("a", 5, 8), EmbeddingTable("b", 5, 8), EmbeddingTable("p", 5, 4,
                                                                                 kind="pooled")]
    assert module_paths(same) == {"a": "ec", "b": "ec", "p": "ebc"}
    mixed = [EmbeddingTable("a", 5, 8), EmbeddingTable("b", 5, 16)]
    assert module_paths(mixed) == {"a": "ec_d8", "b": "ec_d16"}


def test_bad_inputs():
    with pytest.raises(ConfigError, match="batch_size"):
        plan_torchrec(TABLES, TOPO, 0)
    with pytest.raises(ConfigError, match="no tables"):
        plan_torchrec([], TOPO, 4)


def test_table_names_torchrec_refuses_are_mapped_and_mapped_back():
    """A table named like an attribute of nn.ModuleDict (``items``, ``keys``) or holding a dot
    crashed TorchRec's collections (KeyError "attribute 'items' already exists"): it is planned
    under a safe name and converted back to ours."""
    pytest.importorskip("torchrec")
    tables = [EmbeddingTable("items", 5_000, 16, kind="pooled"),
              EmbeddingTable("keys", 3_000, 16, kind="sequence"),
              EmbeddingTable("a.b", 2_000, 16, kind="pooled"),
              EmbeddingTable("plain", 1_000, 16, kind="pooled")]
    r = plan_torchrec(tables, TOPO, B, mean_lengths={t.name: 2.0 for t in tables})
    assert set(r.plan.tables) == {"items", "keys", "a.b", "plain"}
    renamed = r.plan.meta["torchrec"]["table_names"]
    assert set(renamed) == {"items", "keys", "a.b"} and "plain" not in renamed
    planned = {n for mp in r.sharding_plan.plan.values() for n in mp}
    assert planned == {renamed["items"], renamed["keys"], renamed["a.b"], "plain"}
    for t in tables:      # every row of every table routes to an owner
        assert r.plan.route(t.name, np.arange(t.num_rows), 0).min() >= 0
