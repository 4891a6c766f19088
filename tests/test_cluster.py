"""The emulated cluster (issue 24): network namespaces, veths, a bridge and tc HTB shaping between
emulated nodes; exported plans in a real TorchRec DMP across it; measured against the evaluator.

Everything that builds a network needs root, iproute2 and the kernel's namespaces, veths,
bridges and HTB: those tests skip, saying why, where any is missing. The cluster run needs the
``torchrec`` extra too. The formulas and clean-up helpers are tested without either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from flexshard_stream.bridge.jobs import RunError
from flexshard_stream.cluster.jobs import CollectiveTiming
from flexshard_stream.cluster.netem import (
    EmulatedNetwork,
    emulation_available,
    parse_class_counters,
)
from flexshard_stream.cluster.run import busy_seconds, model_component
from flexshard_stream.errors import ClusterError, ConfigError
from flexshard_stream.placement import baselines
from flexshard_stream.placement.cost import CostModel, _pairwise_time, evaluate_trace
from flexshard_stream.plans.topology import Topology

OK, WHY = emulation_available()
needs_root = pytest.mark.skipif(not OK, reason=f"no emulated cluster here: {WHY}")


def _ours() -> list[str]:
    """Namespaces of this process's prefix still present."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"fsc-{os.getpid()}-")]


# ----------------------------------------------------------------------------- no root needed
def test_busy_seconds_is_the_union_of_intervals():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 1), (0.5, 2), (3, 4), (3.2, 3.5)]) == pytest.approx(3.0)


def test_collectives_map_onto_the_evaluators_components():
    c = [CollectiveTiming(n, p, 0, 1, 8) for n, p in (
        ("input_splits", "forward"), ("input_values", "forward"), ("sequence_all_to_all",
                                                                   "forward"),
        ("sequence_all_to_all", "backward"), ("data_parallel_all_reduce", "backward"),
        ("barrier", "forward"))]
    assert [model_component(x) for x in c] == ["index", "index", "forward", "backward", "sync",
                                               "barrier"]


def test_parse_class_counters_reads_tc_output():
    text = textwrap.dedent("""\
        class htb 1:1 root rate 20Mbit ceil 20Mbit burst 1600b cburst 1600b
         Sent 500 bytes 5 pkt (dropped 0, overlimits 0 requeues 0)
        class htb 1:10 parent 1:1 prio 0 rate 18Mbit ceil 20Mbit burst 1600b cburst 1600b
         Sent 2746064 bytes 1888 pkt (dropped 0, overlimits 306 requeues 0)
        """)
    assert parse_class_counters(text) == {1: (500, 5), 10: (2746064, 1888)}


def _plan_and_batch(G=4, M=2):
    from flexshard_stream.cluster.workload import sequence_workload

    topo = Topology.uniform(G // M, M, intra_node_bandwidth=30e6, inter_node_bandwidth=2.5e6)
    tables, batches = sequence_workload(8, G, 1, dim=8, scale=0.01)
    return topo, baselines.row_wise(tables, topo), batches


def test_default_cost_model_figures_are_unchanged_by_the_new_options():
    topo, plan, batches = _plan_and_batch()
    a = evaluate_trace(plan, batches, 8, CostModel(dedup=False)).mean
    b = evaluate_trace(plan, batches, 8, CostModel(dedup=False, wire_overhead=1.0,
                                                   message_latency_s=0.0,
                                                   alltoall="concurrent")).mean
    assert a.time_s == b.time_s and a.a2a_bytes == b.a2a_bytes


def test_calibrated_options_scale_times_and_not_bytes():
    topo, plan, batches = _plan_and_batch()
    base = evaluate_trace(plan, batches, 8, CostModel(dedup=False)).mean
    c = evaluate_trace(plan, batches, 8, CostModel(dedup=False, wire_overhead=1.05,
                                                   message_latency_s=1e-3)).mean
    assert c.a2a_bytes == base.a2a_bytes
    assert c.time_s["forward"] == pytest.approx(base.time_s["forward"] * 1.05 + 1e-3)
    assert c.time_s["index"] == pytest.approx(base.time_s["index"] * 1.05 + 3e-3)  # 3 collectives


def test_pairwise_all_to_all_is_gloos_rounds():
    """2 x 2, n bytes between every pair: round 1 (g -> g+1) and round 3 (g -> g+3) each have
    one inter-node transfer per link, round 2 (g -> g+2) is all inter-node: 3 n / inter, where
    the concurrent model says 2 n / inter (what each GPU sends between nodes)."""
    topo = Topology.uniform(2, 2, intra_node_bandwidth=1e9, inter_node_bandwidth=1e6)
    m = np.full((4, 4), 1e5)
    np.fill_diagonal(m, 0)
    assert _pairwise_time(topo, m) == pytest.approx(3 * 1e5 / 1e6, rel=1e-3)
    _, plan, batches = _plan_and_batch()
    pw = evaluate_trace(plan, batches, 8, CostModel(dedup=False, alltoall="pairwise")).mean
    cc = evaluate_trace(plan, batches, 8, CostModel(dedup=False)).mean
    assert pw.time_s["forward"] > cc.time_s["forward"]
    assert pw.a2a_bytes == cc.a2a_bytes


@pytest.mark.parametrize("kw", [{"wire_overhead": 0.9}, {"message_latency_s": -1.0},
                                {"alltoall": "ring"}, {"wire_overhead": float("nan")}])
def test_bad_calibration_options_are_refused(kw):
    with pytest.raises(ConfigError):
        CostModel(**kw)


def test_network_refuses_impossible_shapes_and_rates():
    with pytest.raises(ClusterError, match="rates must be > 0"):
        EmulatedNetwork(2, 2, inter_rate=0.0)
    with pytest.raises(ClusterError, match="1 to 250 ranks"):
        EmulatedNetwork(0, 2, inter_rate=1e6)


# ----------------------------------------------------------------------------- root
@needs_root
def test_network_is_removed_and_a_foreign_namespace_survives():
    other = f"fstest-other-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", other], check=True)
    try:
        with EmulatedNetwork(2, 2, inter_rate=10e6) as net:
            assert set(net.namespaces()) <= set(_ours()) and len(net.namespaces()) == 5
            assert net.counters().sent["inter_node"] == 0
        assert _ours() == []
        assert other in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                       text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", other])


@needs_root
def test_network_is_removed_on_an_error_and_on_ctrl_c():
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with EmulatedNetwork(1, 2, inter_rate=10e6):
                raise exc
        assert _ours() == []


@needs_root
def test_network_is_removed_on_sigterm(tmp_path):
    """A process holding a network gets SIGTERM: its namespaces go with it."""
    code = textwrap.dedent("""\
        import sys, time
        from flexshard_stream.cluster.netem import EmulatedNetwork
        net = EmulatedNetwork(1, 2, inter_rate=10e6)
        print(net.prefix, flush=True)
        time.sleep(120)
        """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    prefix = p.stdout.readline().strip()
    assert prefix.startswith(f"fsc-{p.pid}-")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in left


@needs_root
def test_shaped_link_carries_its_rate_and_counts_the_wire():
    """1 MB from rank 0 to rank 2 (other node) at 8 Mbit/s: about one second, counted in the
    inter-node class with its headers (1448 bytes of payload per 1514-byte frame)."""
    srv = ("import socket,sys;s=socket.socket();s.bind((sys.argv[1],5201));s.listen(1);"
           "c,_=s.accept();n=0\nwhile True:\n d=c.recv(65536)\n if not d: break\n n+=len(d)\n"
           "print(n)")
    cli = ("import socket,sys,time;c=socket.create_connection((sys.argv[1],5201));"
           "t=time.time();c.sendall(b'x'*1000000);c.close();print(time.time()-t)")
    with EmulatedNetwork(2, 2, inter_rate=8e6) as net:
        s = subprocess.Popen(net.command(2, [sys.executable, "-c", srv, net.address(2)]),
                             stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        c0 = net.counters()
        t0 = time.perf_counter()
        subprocess.run(net.command(0, [sys.executable, "-c", cli, net.address(2)]), check=True)
        assert int(s.communicate(timeout=60)[0]) == 1_000_000
        seconds = time.perf_counter() - t0
        d = net.counters() - c0
    assert 0.9 < seconds < 3.0
    assert d.sent["inter_node"] == d.received["inter_node"]
    assert d.sent["inter_node"] == pytest.approx(1_000_000 * 1514 / 1448, rel=0.01)
    assert _ours() == []


# ----------------------------------------------------------------------------- the real run
@pytest.fixture(scope="module")
def experiment():
    if not OK:
        pytest.skip(f"no emulated cluster here: {WHY}")
    pytest.importorskip("torchrec")
    from flexshard_stream.cluster.experiment import cluster_experiment

    # B = 128 as bench/cluster.py: at 64 the fixed bytes per step that the model leaves out
    # (gloo's message headers, short last segments, DDP's small forward collectives: ~30 kB a
    # step on 2 x 2, docs/CLUSTER.md Limits) were 1.7-2.2% of the FlexShard plan's wire bytes.
    return cluster_experiment(Topology.preset("2x2"), 20e6, batch_size=128, steps=4, warmup=2,
                              dim=32, scale=0.02, batches=2)


@needs_root
def test_measured_ranking_equals_the_models(experiment):
    h = experiment["headline"]
    assert h["ranking_measured"] == h["ranking_model"], experiment["comparison"]
    assert h["ranking_measured"][0] == "flexshard"


@needs_root
def test_wire_bytes_are_the_models_within_two_percent(experiment):
    """Every plan's wire bytes (data packets, headers included: the model's payload times
    ``wire_overhead``) within 2% of the model's; each link class within 3% (the smaller class,
    intra-node, carries more short segments per byte)."""
    for label, c in experiment["comparison"].items():
        m, mm = c["measured"], c["models"]["calibrated"]
        total = sum(m["wire_bytes_mean"].values()) / sum(mm["wire_bytes"].values())
        assert total == pytest.approx(1.0, abs=0.02), (label, m, mm)
        for cls, r in mm["wire_measured_over_model"].items():
            assert r == pytest.approx(1.0, abs=0.03), (label, cls, m, mm)
    whole = experiment["run"]["whole_run_counters"]    # nothing dropped over the whole run
    assert whole["received"]["inter_node"] == whole["sent"]["inter_node"]


@needs_root
def test_the_run_leaves_nothing_behind(experiment):
    assert experiment["run"]["plans"].keys() == {"row_wise", "torchrec", "flexshard"}
    assert _ours() == []


@needs_root
def test_a_killed_rank_stops_the_run_and_everything_is_removed(tmp_path):
    pytest.importorskip("torchrec")
    from flexshard_stream.cluster.run import run_on_cluster
    from flexshard_stream.cluster.workload import export_plans, sequence_workload

    topo = Topology.uniform(2, 2)
    tables, batches = sequence_workload(8, 4, 1, dim=8, scale=0.01)
    exports = export_plans({"rw": baselines.row_wise(tables, topo)}, tmp_path)

    def kill_one(net, procs):
        threading.Timer(5.0, lambda: procs[1].kill()).start()

    with pytest.raises(RunError, match="rank 1 of 4 was killed"):
        run_on_cluster(exports, batches, nodes=2, gpus_per_node=2, inter_rate=20e6,
                       steps=10_000, warmup=0, timeout_s=120, started=kill_one)
    assert _ours() == []
