"""TorchRec-compatible comm cost (flexshard_stream.bridge.estimator) against TorchRec 1.8.0's formulas.

Hand-computed cases quote the TorchRec 1.8.0 line they follow (paths relative to
``torchrec/distributed/planner/`` of the ``torchrec==1.8.0`` wheel, git e2a8e5b8). TorchRec's
bandwidths are bytes/ms: ``INTRA_NODE_BANDWIDTH = 600 * 1024 * 1024 * 1024 / 1000``,
``CROSS_NODE_BANDWIDTH = 12.5 * 1024 * 1024 * 1024 / 1000``; so ``bytes / TR_INTER_MS`` is
TorchRec's figure in ms.
"""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexshard_stream.bridge.estimator import (
    TORCHREC_BATCHED_COPY_PERF_FACTOR,
    TORCHREC_DDR_MEM_BW,
    TORCHREC_HBM_MEM_BW,
    TORCHREC_INTER_HOST_BW,
    TORCHREC_INTRA_HOST_BW,
    torchrec_comms_bw,
    torchrec_default_num_shards,
    torchrec_shard_comm,
)
from flexshard_stream.errors import ConfigError

# TorchRec's own constants, in its own unit (bytes per millisecond), constants.py l.16-17, 28-29.
TR_INTRA_MS = 600 * 1024 * 1024 * 1024 / 1000
TR_INTER_MS = 12.5 * 1024 * 1024 * 1024 / 1000
TR_HBM_MS = 897 * 1024 * 1024 * 1024 / 1000

B, D, E = 512, 128, 4        # per-rank batch, dim, fp32
L_SEQ, L_POOL = 1000.0, 20.0  # sequence length, pooling factor


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=0.0)


def comm(sharding, kind, W=16, LW=8, L=None, **kw):
    if L is None:
        L = L_SEQ if kind == "sequence" else L_POOL
    return torchrec_shard_comm(sharding, kind, kw.pop("B", B), W, LW, 10**8, kw.pop("D", D),
                               kw.pop("E", E), L, **kw)


# ------------------------------------------------------------------------- constants and units

def test_constants_are_torchrec_gib_based_bandwidths_in_bytes_per_second():
    assert TORCHREC_INTRA_HOST_BW == 600 * 2**30          # not 600e9
    assert TORCHREC_INTER_HOST_BW == 12.5 * 2**30
    assert TORCHREC_HBM_MEM_BW == 897 * 2**30
    assert TORCHREC_DDR_MEM_BW == 51 * 2**30
    assert TORCHREC_INTER_HOST_BW / 1000 == TR_INTER_MS   # TorchRec stores bytes/ms
    assert TORCHREC_INTRA_HOST_BW / 1000 == TR_INTRA_MS


def test_get_bw_rule_mirrors_basic_comms_bandwidths():
    # types.py l.283-288: ALL_REDUCE -> inter * local_world_size; world <= local -> intra; else inter
    assert torchrec_comms_bw("all_to_all", 8, 8) == TORCHREC_INTRA_HOST_BW
    assert torchrec_comms_bw("reduce_scatter", 16, 8) == TORCHREC_INTER_HOST_BW
    assert torchrec_comms_bw("all_gather", 2, 1) == TORCHREC_INTER_HOST_BW
    assert torchrec_comms_bw("all_reduce", 16, 8) == TORCHREC_INTER_HOST_BW * 8


# ------------------------------------------------------- hand-computed: one per sharding x kind

def test_table_wise_sequence_by_hand():
    r = comm("table_wise", "sequence")
    # estimator.py l.581: ctx.batch_outputs * ctx.world_size * ctx.emb_dim * data_type_size,
    # batch_outputs = batch_inputs = B * L (sequence); ALL_TO_ALL over 16 ranks on 2 hosts -> inter
    expected = 512 * 1000 * 16 * 128 * 4           # = 4,194,304,000 bytes
    assert r["fwd_comm_bytes"] == expected
    assert r["bwd_comm_bytes"] == expected          # l.1144-1155: same size, bwd A2A dtype
    assert r["fwd_comm_ms"] == approx(expected / TR_INTER_MS)   # 312.5 ms
    assert r["fwd_comm_ms"] == approx(312.5)
    assert r["bwd_comm_ms"] == approx(312.5)
    assert r["bwd_batched_copy_s"] == 0.0           # TW has no batched copy
    # l.1059: math.ceil(ctx.batch_inputs * ctx.world_size * ctx.input_data_type_size)
    assert r["input_dist_bytes"] == 512 * 1000 * 16 * 8
    assert r["input_dist_ms"] == approx(512 * 1000 * 16 * 8 / TR_INTER_MS)
    assert r["num_shards"] == 1 and r["table_fwd_comm_bytes"] == expected


def test_table_wise_pooled_by_hand():
    r = comm("table_wise", "pooled")
    # pooled batch_outputs = min(1, L) * num_poolings * B = 512 (estimator/types.py l.816-834)
    expected = 512 * 16 * 128 * 4                   # = 4,194,304 bytes: one vector per sample
    assert r["fwd_comm_bytes"] == expected and r["bwd_comm_bytes"] == expected
    assert r["fwd_comm_ms"] == approx(expected / TR_INTER_MS)   # 0.3125 ms
    assert r["input_dist_bytes"] == 512 * 20 * 16 * 8           # indices still B * L each
    assert r["input_dist_ms"] == approx(512 * 20 * 16 * 8 / TR_INTER_MS)


def test_row_wise_sequence_by_hand():
    r = comm("row_wise", "sequence")
    # estimator.py l.1231-1238 (sequence): batch_outputs / world_size * world_size * emb_dim * dt
    expected = 512 * 1000 / 16 * 16 * 128 * 4       # = B*L*D*e = 262,144,000 bytes per shard
    assert r["fwd_comm_bytes"] == expected and r["bwd_comm_bytes"] == expected
    # l.1290 REDUCE_SCATTER fwd, l.1303 ALL_GATHER bwd, world-wide -> inter on 2 hosts
    assert r["fwd_comm_ms"] == approx(expected / TR_INTER_MS)   # 19.53125 ms
    # l.130: output_size * BATCHED_COPY_PERF_FACTOR / device_bw, added to bwd_comms (l.1313)
    copy_ms = expected * 2.455 / TR_HBM_MS
    assert r["bwd_batched_copy_ms"] == approx(copy_ms)
    assert r["bwd_comm_ms"] == approx(expected / TR_INTER_MS + copy_ms)
    assert r["bwd_network_ms"] == approx(expected / TR_INTER_MS)
    assert r["num_shards"] == 16
    assert r["table_fwd_comm_bytes"] == 16 * expected


def test_row_wise_pooled_by_hand():
    r = comm("row_wise", "pooled")
    # estimator.py l.1229 (pooled): batch_outputs * world_size * emb_dim * data_type_size:
    # every shard sends partial sums for all W*B samples (reduce-scatter input)
    expected = 512 * 16 * 128 * 4
    assert r["fwd_comm_bytes"] == expected
    assert r["fwd_comm_ms"] == approx(expected / TR_INTER_MS)
    assert r["bwd_comm_ms"] == approx(expected / TR_INTER_MS + expected * 2.455 / TR_HBM_MS)
    assert r["input_dist_bytes"] == 512 * 20 * 16 * 8


def test_table_row_wise_sequence_by_hand():
    r = comm("table_row_wise", "sequence")
    # group = local_world_size = 8 ranks, num_twrw_groups = 16 // 8 = 2
    # l.1381-1387: batch_outputs / intra_group_size * world_size * emb_dim * dt (SR dtype)
    intra = 512 * 1000 / 8 * 16 * 128 * 4          # = 524,288,000 at intra (RS within host)
    # l.1446-1451: batch_outputs * num_groups * emb_dim * fwd_a2a (batch_outputs NOT divided)
    inter = 512 * 1000 * 2 * 128 * 4               # = 524,288,000 at inter (A2A across hosts)
    assert r["fwd_comm_bytes"] == intra + inter
    assert r["fwd_links"] == ("intra", "inter")
    assert r["fwd_comm_ms"] == approx(intra / TR_INTRA_MS + inter / TR_INTER_MS)
    assert r["bwd_comm_ms"] == approx(inter / TR_INTER_MS + intra / TR_INTRA_MS
                                      + intra * 2.455 / TR_HBM_MS)
    assert r["bwd_links"] == ("inter", "intra")
    assert "does not offer table_row_wise" in r["note"]


def test_table_row_wise_pooled_by_hand():
    r = comm("table_row_wise", "pooled")
    intra = 512 * 16 * 128 * 4                     # l.1379: batch_outputs * world_size * D * dt
    inter = 512 * 2 * 128 * 4                      # l.1446-1451 with num_groups = 2
    assert r["fwd_comm_bytes"] == intra + inter
    assert r["fwd_comm_ms"] == approx(intra / TR_INTRA_MS + inter / TR_INTER_MS)
    assert r["bwd_comm_bytes"] == intra + inter
    assert r["num_shards"] == 8                    # TWRW shards over one host's 8 ranks
    assert "does not offer" not in r["note"]


# Values produced by running TorchRec 1.8.0's own evaluator classes (estimator/estimator.py with
# EmbeddingPerfEstimatorConfig and BasicCommsBandwidths defaults) on B=512, D=128, fp32,
# L=1000 (sequence) / 20 (pooled): (fwd_comms, bwd_comms, input_dist_comms) in ms.
TORCHREC_1_8_RECORDED = {
    ("table_wise", "sequence", 16, 8, None): (312.5, 312.5, 4.8828125),
    ("table_wise", "sequence", 8, 8, None): (3.2552083333333335, 3.2552083333333335,
                                             0.050862630208333336),
    ("table_wise", "pooled", 16, 8, None): (0.3125, 0.3125, 0.09765625),
    ("row_wise", "sequence", 16, 8, None): (19.53125, 20.199438667084728, 4.8828125),
    ("row_wise", "sequence", 8, 8, None): (0.4069010416666667, 1.0750897087513935,
                                           0.050862630208333336),
    ("row_wise", "pooled", 16, 8, None): (0.3125, 0.32319101867335565, 0.09765625),
    ("row_wise", "pooled", 32, 8, 2): (0.625, 0.6463820373467113, 0.1953125),
    ("table_row_wise", "sequence", 16, 8, None): (39.876302083333336, 41.21267941750279,
                                                  4.8828125),
    ("table_row_wise", "sequence", 32, 8, 2): (78.125, 79.46137733416946, 9.765625),
    ("table_row_wise", "pooled", 16, 8, None): (0.045572916666666664, 0.056263935340022296,
                                                0.09765625),
    ("table_row_wise", "pooled", 8, 8, None): (0.0032552083333333335, 0.008600717670011148,
                                               0.0010172526041666667),
    ("table_row_wise", "pooled", 32, 8, 2): (0.6640625, 0.6854445373467113, 0.1953125),
}


@pytest.mark.parametrize("case", sorted(TORCHREC_1_8_RECORDED, key=str))
def test_matches_values_recorded_from_torchrec_1_8(case):
    sharding, kind, W, LW, pod = case
    r = comm(sharding, kind, W=W, LW=LW, pod_size=pod)
    fwd, bwd, inp = TORCHREC_1_8_RECORDED[case]
    assert r["fwd_comm_ms"] == approx(fwd)
    assert r["bwd_comm_ms"] == approx(bwd)
    assert r["input_dist_ms"] == approx(inp)


# ------------------------------------------------------------- single-host vs multi-host choice

@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
@pytest.mark.parametrize("kind", ["sequence", "pooled"])
def test_world_wide_collectives_switch_to_inter_host_when_job_spans_hosts(sharding, kind):
    one = comm(sharding, kind, W=8, LW=8)
    two = comm(sharding, kind, W=16, LW=8)
    assert one["fwd_links"] == ("intra",) and two["fwd_links"] == ("inter",)
    assert one["fwd_comm_ms"] == approx(one["fwd_comm_bytes"] / TR_INTRA_MS)
    assert two["fwd_comm_ms"] == approx(two["fwd_comm_bytes"] / TR_INTER_MS)
    assert two["input_dist_ms"] == approx(two["input_dist_bytes"] / TR_INTER_MS)
    assert one["input_dist_ms"] == approx(one["input_dist_bytes"] / TR_INTRA_MS)


def test_row_wise_sequence_per_shard_is_48x_slower_on_two_hosts_for_the_same_bytes():
    one, two = comm("row_wise", "sequence", W=8, LW=8), comm("row_wise", "sequence", W=16, LW=8)
    assert one["fwd_comm_bytes"] == two["fwd_comm_bytes"] == B * L_SEQ * D * E
    assert two["fwd_comm_s"] / one["fwd_comm_s"] == approx(600 / 12.5)


def test_whole_job_on_one_host_is_all_intra_even_with_many_ranks():
    # Topology(local_world_size=None) means local_world_size = world_size (types.py l.1037-1039)
    r = comm("row_wise", "sequence", W=128, LW=128)
    assert r["fwd_links"] == ("intra",) and r["bwd_links"] == ("intra",)
    assert r["input_dist_ms"] == approx(r["input_dist_bytes"] / TR_INTRA_MS)


def test_table_row_wise_single_host_has_no_inter_component():
    r = comm("table_row_wise", "pooled", W=8, LW=8)
    assert r["fwd_links"] == ("intra",) and r["bwd_links"] == ("intra",)
    assert r["fwd_comm_bytes"] == B * 8 * D * E


def test_table_row_wise_group_spanning_hosts_is_charged_inter_host():
    # pod_size=2: intra_group_size = 16 > local_world_size 8, so the reduce-scatter inside the
    # group is looked up with world_size=16, local_world_size=min(16, 8) -> inter (l.1433-1439)
    r = comm("table_row_wise", "pooled", W=32, LW=8, pod_size=2)
    assert r["fwd_links"] == ("inter", "inter")
    assert r["num_shards"] == 16
    intra_group = 512 * 32 * 128 * 4
    inter_group = 512 * 2 * 128 * 4
    assert r["fwd_comm_ms"] == approx((intra_group + inter_group) / TR_INTER_MS)


# ----------------------------------------------------------------- scale and monotonicity checks

@pytest.mark.parametrize("sharding", ["table_wise", "row_wise", "table_row_wise"])
@pytest.mark.parametrize("kind", ["sequence", "pooled"])
def test_bytes_are_linear_in_batch_dim_and_element_size(sharding, kind):
    base = comm(sharding, kind)
    for key, factor in (("B", 3), ("D", 2), ("E", 2)):
        scaled = comm(sharding, kind, **{key: {"B": B, "D": D, "E": E}[key] * factor})
        assert scaled["fwd_comm_bytes"] == approx(factor * base["fwd_comm_bytes"])
        assert scaled["bwd_comm_bytes"] == approx(factor * base["bwd_comm_bytes"])
        assert scaled["fwd_comm_s"] == approx(factor * base["fwd_comm_s"])
    assert comm(sharding, kind, B=3 * B)["input_dist_bytes"] == 3 * base["input_dist_bytes"]
    assert comm(sharding, kind, D=2 * D)["input_dist_bytes"] == base["input_dist_bytes"]


@pytest.mark.parametrize("sharding", ["table_wise", "row_wise", "table_row_wise"])
def test_sequence_bytes_scale_with_length_pooled_only_below_one(sharding):
    s1, s2 = comm(sharding, "sequence", L=100.0), comm(sharding, "sequence", L=400.0)
    assert s2["fwd_comm_bytes"] == approx(4 * s1["fwd_comm_bytes"])
    p1, p2 = comm(sharding, "pooled", L=1.0), comm(sharding, "pooled", L=50.0)
    assert p1["fwd_comm_bytes"] == p2["fwd_comm_bytes"]          # one vector per sample
    assert p2["input_dist_bytes"] == 50 * p1["input_dist_bytes"]   # but indices grow
    half = comm(sharding, "pooled", L=0.5)                          # min(1.0, il) in batch_outputs
    assert half["fwd_comm_bytes"] == approx(0.5 * p1["fwd_comm_bytes"])


def test_world_size_scaling_per_shard_and_per_table():
    # TW sequence per shard grows with W (the owner receives all W*B*L lookups) ...
    assert comm("table_wise", "sequence", W=32)["fwd_comm_bytes"] == \
        2 * comm("table_wise", "sequence", W=16)["fwd_comm_bytes"]
    # ... RW sequence per shard does not, but the table total does (W shards)
    rw16, rw32 = comm("row_wise", "sequence", W=16), comm("row_wise", "sequence", W=32)
    assert rw16["fwd_comm_bytes"] == rw32["fwd_comm_bytes"]
    assert rw32["table_fwd_comm_bytes"] == 2 * rw16["table_fwd_comm_bytes"]
    # RW pooled per shard grows with W (partial sums for every sample of the job)
    assert comm("row_wise", "pooled", W=32)["fwd_comm_bytes"] == \
        2 * comm("row_wise", "pooled", W=16)["fwd_comm_bytes"]


def test_faster_links_never_cost_more_time_and_inter_bw_drives_multi_host():
    slow = comm("row_wise", "sequence")
    fast = comm("row_wise", "sequence", inter_host_bw=2 * TORCHREC_INTER_HOST_BW)
    assert fast["fwd_comm_s"] == approx(slow["fwd_comm_s"] / 2)
    assert fast["bwd_network_s"] == approx(slow["bwd_network_s"] / 2)
    assert fast["bwd_batched_copy_s"] == slow["bwd_batched_copy_s"]
    intra_fast = comm("row_wise", "sequence", intra_host_bw=10 * TORCHREC_INTRA_HOST_BW)
    assert intra_fast["fwd_comm_s"] == slow["fwd_comm_s"]     # multi-host: intra unused
    faster_device = comm("row_wise", "sequence", device_bw=2 * TORCHREC_HBM_MEM_BW)
    assert faster_device["bwd_batched_copy_s"] == approx(slow["bwd_batched_copy_s"] / 2)


@given(sharding=st.sampled_from(["table_wise", "row_wise", "table_row_wise"]),
       kind=st.sampled_from(["sequence", "pooled"]),
       hosts=st.integers(1, 8), lw=st.sampled_from([1, 2, 4, 8]),
       b=st.integers(1, 4096), d=st.integers(1, 512), e=st.sampled_from([1, 2, 4, 8]),
       length=st.floats(0.0, 5000.0, allow_nan=False), extra=st.floats(0.0, 100.0))
def test_properties(sharding, kind, hosts, lw, b, d, e, length, extra):
    r = torchrec_shard_comm(sharding, kind, b, hosts * lw, lw, 1000, d, e, length)
    for key in ("fwd_comm_bytes", "bwd_comm_bytes", "input_dist_bytes", "fwd_comm_s",
                "bwd_comm_s", "input_dist_s"):
        assert r[key] >= 0 and math.isfinite(r[key])
    # no comm multiplier on the backward: same bytes as forward for all three shardings
    assert r["bwd_comm_bytes"] == approx(r["fwd_comm_bytes"]) or r["fwd_comm_bytes"] == 0
    assert r["bwd_comm_s"] == approx(r["bwd_network_s"] + r["bwd_batched_copy_s"])
    # input dist is reported but is not part of the score (types.py l.99-105, Perf.total)
    assert r["score_comm_s"] == r["fwd_comm_s"] + r["bwd_comm_s"]
    assert r["input_dist_bytes"] == math.ceil(length * 1.0 * b * (hosts * lw) * 8)
    assert r["table_fwd_comm_bytes"] == r["num_shards"] * r["fwd_comm_bytes"]
    if hosts == 1:
        assert set(r["fwd_links"]) == {"intra"} and set(r["bwd_links"]) == {"intra"}
    elif sharding != "table_row_wise":
        assert r["fwd_links"] == ("inter",)
    # more lookups never cost less
    more = torchrec_shard_comm(sharding, kind, b, hosts * lw, lw, 1000, d, e, length + extra)
    assert more["fwd_comm_bytes"] >= r["fwd_comm_bytes"]
    assert more["score_comm_s"] >= r["score_comm_s"]
    assert more["input_dist_bytes"] >= r["input_dist_bytes"]


def test_weighted_features_change_no_comm_term():
    # estimator.py l.1052-1058: input dist computed WITHOUT the is_weighted doubling; the doubling
    # of input_read_size (l.631-632) only feeds compute.
    for sharding in ("table_wise", "row_wise", "table_row_wise"):
        plain, weighted = comm(sharding, "pooled"), comm(sharding, "pooled", is_weighted=True)
        for key in ("fwd_comm_bytes", "bwd_comm_bytes", "input_dist_bytes", "score_comm_s"):
            assert weighted[key] == plain[key]


def test_quantized_comm_dtypes_follow_torchrec_choice():
    # RW pooled uses the SR (reduce-scatter) dtype, RW sequence the A2A dtype (l.1240-1253)
    assert comm("row_wise", "pooled", fwd_rs_bytes=2)["fwd_comm_bytes"] == B * 16 * D * 2
    assert comm("row_wise", "pooled", fwd_a2a_bytes=2)["fwd_comm_bytes"] == B * 16 * D * E
    assert comm("row_wise", "sequence", fwd_a2a_bytes=2)["fwd_comm_bytes"] == B * L_SEQ * D * 2
    # TW always the A2A dtype
    assert comm("table_wise", "pooled", bwd_a2a_bytes=1)["bwd_comm_bytes"] == B * 16 * D * 1


# ------------------------------------------------------------------------------- the contract

def test_default_num_shards_and_mismatch_rejected():
    assert torchrec_default_num_shards("table_wise", 16, 8) == 1
    assert torchrec_default_num_shards("row_wise", 16, 8) == 16
    assert torchrec_default_num_shards("table_row_wise", 16, 8) == 8
    assert torchrec_default_num_shards("table_row_wise", 32, 8, pod_size=2) == 16
    assert comm("row_wise", "sequence", num_shards=16)["num_shards"] == 16
    with pytest.raises(ConfigError, match="num_shards"):
        comm("row_wise", "sequence", num_shards=8)


@pytest.mark.parametrize("kwargs, match", [
    (dict(sharding="column_wise"), "sharding"),
    (dict(kind="jagged"), "kind"),
    (dict(W=12, LW=8), "multiple"),
    (dict(L=-1.0), "mean_length"),
    (dict(B=0), "batch_size"),
    (dict(inter_host_bw=0.0), "inter_host_bw"),
    (dict(W=16, LW=8, pod_size=3), "pod_size"),
])
def test_bad_inputs_raise_config_error(kwargs, match):
    sharding = kwargs.pop("sharding", "row_wise")
    kind = kwargs.pop("kind", "sequence")
    with pytest.raises(ConfigError, match=match):
        comm(sharding, kind, **kwargs)


def test_note_and_units_are_reported():
    r = comm("row_wise", "sequence")
    assert "inter_host_bw" in r["note"] and "excluded from Perf.total" in r["note"]
    assert r["fwd_comm_ms"] == approx(1000 * r["fwd_comm_s"])
    assert r["score_comm_ms"] == approx(r["fwd_comm_ms"] + r["bwd_comm_ms"])
    assert TORCHREC_BATCHED_COPY_PERF_FACTOR == 2.455


# ------------------------------------------------------------------ plan-level wrapper
def test_plan_level_torchrec_estimate_matches_shard_formula():
    from flexshard_stream.bridge.estimator import (
        torchrec_plan_comm,
        torchrec_sharding_of,
    )
    from flexshard_stream.placement.baselines import (
        row_wise,
        table_row_wise,
        table_wise,
    )
    from flexshard_stream.plans.plan import ColdSharding, TablePlan
    from flexshard_stream.plans.tables import EmbeddingTable
    from flexshard_stream.plans.topology import Topology

    topo = Topology.uniform(2, 8)
    t = EmbeddingTable("s", 1000, 128, "fp32", "sequence")
    B, L = 512, 100
    rw = torchrec_plan_comm(row_wise([t], topo), B, {"s": L})
    # row-wise sequence: B * L * D * e bytes per shard forward (reduce-scatter), 16 shards
    assert rw["tables"]["s"]["sharding"] == "row_wise"
    assert rw["fwd_comm_bytes"] == pytest.approx(16 * B * L * 128 * 4)
    # index exchange: ceil(B * L * W * 8) per shard, left out of the score
    assert rw["input_dist_bytes"] == pytest.approx(16 * B * L * 16 * 8)
    tw = torchrec_plan_comm(table_wise([t], topo), B, {"s": L})
    # table-wise sequence: one shard, B * L * W * D * e each way
    assert tw["fwd_comm_bytes"] == pytest.approx(B * L * 16 * 128 * 4)
    assert torchrec_sharding_of(table_row_wise([t], topo)["s"], topo) == "table_row_wise"
    with pytest.raises(ConfigError, match="no TorchRec sharding type"):
        torchrec_sharding_of(TablePlan(t, ColdSharding.ranges(range(16), 1000), global_ids=[1]),
                             topo)
