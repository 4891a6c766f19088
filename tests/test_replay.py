"""Replay: window cutting, summary.json shape and numbers, online re-sharder, bad logs, CLI."""
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flexshard_stream.cli import app
from flexshard_stream.errors import ConfigError, LogError
from flexshard_stream.online.replay import STRATEGIES, WindowSpec, parse_window, replay
from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.placement.cost import CostModel, evaluate_trace
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources import drift
from flexshard_stream.sources.logs import read_log
from flexshard_stream.sources.synth import TableSpec, write_log
from flexshard_stream.stats.batch import concat_batches, rebatch, slice_batch

SPECS = [TableSpec("hist", 20_000, 1.1, "sequence", "fixed", 8),
         TableSpec("item", 5_000, 1.05, "pooled", "fixed", 1)]
TOPO = Topology.uniform(2, 2, name="2x2")
B = 16                      # 64 samples per iteration
SPW = 2000                  # samples per drift window; 1000 samples/s -> 2 s
NW = 4
N = SPW * NW


def _write(path, windows=NW, scen=None):
    scen = scen or drift.scenario("rotating", k=200, rate=0.3)
    batches = (b for w in drift.generate_windows(SPECS, scen, windows, SPW, 500, seed=5)
               for b in w)
    write_log(batches, path, SPECS, row_group_size=1000)
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("log") / "drift.parquet")


# This log is 125 iterations long: no saving of microseconds per iteration could pay the
# default pause per delta (issue 14), so the replays that test how the re-sharder tracks drift
# charge no pause (transfer only, as before the pause existed).
NO_PAUSE = ReshardConfig(pause_s=0.0)


@pytest.fixture(scope="module")
def timed(log, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "out"
    return replay(log, TOPO, window="2s", out_dir=out, batch_size=B,
                  reshard_config=NO_PAUSE), out


def _all_batches(path):
    return concat_batches(list(read_log(str(path), read_batch_size=4096)))


def test_parse_window():
    assert parse_window("30m") == WindowSpec("seconds", 1800.0, "30m")
    assert parse_window("1h").size == 3600 and parse_window("1d").size == 86400
    assert parse_window("90s").size == 90 and parse_window("1.5h").size == 5400
    assert parse_window("500ms").size == pytest.approx(0.5)
    assert parse_window("100000") == WindowSpec("samples", 100000, "100000")
    assert parse_window(100000).unit == "samples"
    for bad in ("", "abc", "10x", "0", "0s", "-5m", "1.5", "m", "1e5", "5 m m", True, 2.5, -3):
        with pytest.raises(ConfigError):
            parse_window(bad)


def test_summary_shape_and_time_windows(timed, log):
    res, out = timed
    s = json.loads((out / "summary.json").read_text())
    assert s == json.loads(json.dumps(res.summary))
    wins = s["windows"]
    assert len(wins) == NW
    assert sum(w["samples"] for w in wins) == N == s["totals"]["samples"]
    ts = pl.read_parquet(log)["ts"].to_numpy()
    G = TOPO.num_gpus
    for i, w in enumerate(wins):
        assert w["start"] == pytest.approx(2.0 * i) and w["end"] == pytest.approx(2.0 * (i + 1))
        assert w["start"] < w["end"]
        if i:
            assert wins[i - 1]["end"] <= w["start"]
            assert wins[i - 1]["sample_end"] == w["sample_start"]
        # the window holds exactly the samples whose ts falls in [start, end)
        inside = np.flatnonzero((ts >= w["start"]) & (ts < w["end"]))
        assert (inside[0], inside[-1] + 1) == (w["sample_start"], w["sample_end"])
        assert w["iterations"] == w["samples"] // (G * B)
        assert w["dropped_samples"] == w["samples"] % (G * B)
        assert set(w["strategies"]) == set(STRATEGIES)
        for name, m in w["strategies"].items():
            assert set(m["bytes_per_iter"]) >= {"total", "intra_node", "inter_node"}
            b = m["bytes_per_iter"]
            assert b["total"] >= b["intra_node"] + b["inter_node"] - 1e-6 > 0
            assert m["comm_time_s_per_iter"] > 0 and m["peak_memory_bytes"] > 0
            assert len(m["memory_per_gpu_bytes"]) == G
            assert max(m["memory_per_gpu_bytes"]) == pytest.approx(m["peak_memory_bytes"])
            assert m["budget_bytes"] == s["budget_bytes"]
        assert w["migration_bytes"] == w["strategies"]["resharder"]["migration_bytes"] >= 0
        # the re-sharder's threshold per table after the window, and its checks
        for t in ("hist", "item"):
            th = w["thresholds"][t]
            assert {"global_rows", "node_rows", "threshold_probability"} <= set(th)
        assert len(w["checks"]) == (0 if i == 0 else 4)
        assert sum(w["decisions"].values()) == len(w["checks"])
        for c in w["checks"]:
            assert w["start"] <= c["position"] < w["end"] + 1e-9
            assert set(c["thresholds"]) == {"hist", "item"}
    tot = s["totals"]
    for name in STRATEGIES:
        t = tot["strategies"][name]
        assert t["iterations"] == sum(w["iterations"] for w in wins)
        assert t["total_bytes"]["total"] == pytest.approx(
            sum(w["strategies"][name]["bytes_per_iter"]["total"] * w["iterations"]
                for w in wins), rel=1e-9)
        assert t["comm_time_s"] == pytest.approx(t["comm_time_s_per_iter"] * t["iterations"])
    assert tot["strategies"]["resharder"]["migration_bytes"] == pytest.approx(
        sum(w["migration_bytes"] for w in wins))
    assert tot["strategies"]["rw"]["speedup_vs_rw"] == pytest.approx(1.0)
    # drift: the re-sharder moves, and beats the static plan made on the first window
    assert tot["strategies"]["resharder"]["deltas"] >= 1
    assert tot["strategies"]["resharder"]["comm_time_s"] < tot["strategies"]["static"][
        "comm_time_s"]


def test_numbers_equal_an_independent_evaluation(timed, log):
    res, out = timed
    s = res.summary
    allb = _all_batches(log)
    G = TOPO.num_gpus
    model = CostModel(**s["model"])
    for name in ("rw", "twrw", "static"):
        plan = Plan.load(out / "plans" / name)
        assert plan == res.plans[name]
        for w in s["windows"]:
            win = slice_batch(allb, w["sample_start"], w["sample_end"])
            iters = list(rebatch([win], G * B, drop_last=True))
            tc = evaluate_trace(plan, iters, B, model)
            m = w["strategies"][name]
            c = tc.mean
            assert tc.mean.iterations == w["iterations"]
            assert m["bytes_per_iter"]["total"] == pytest.approx(c.a2a_bytes, rel=1e-9)
            assert m["bytes_per_iter"]["intra_node"] == pytest.approx(c.intra_node_bytes,
                                                                      rel=1e-9)
            assert m["bytes_per_iter"]["inter_node"] == pytest.approx(c.inter_node_bytes,
                                                                      rel=1e-9)
            assert m["comm_time_s_per_iter"] == pytest.approx(c.comm_time_s, rel=1e-9)
            assert m["peak_memory_bytes"] == pytest.approx(c.peak_memory_bytes, rel=1e-12)
    # the first window: the re-sharder runs the static plan
    w0 = s["windows"][0]["strategies"]
    assert w0["resharder"]["bytes_per_iter"] == w0["static"]["bytes_per_iter"]


def test_output_files(timed):
    res, out = timed
    G = TOPO.num_gpus
    for name in STRATEGIES:
        assert Plan.load(out / "plans" / name) == res.plans[name]
        with np.load(out / "traffic" / f"{name}.npz") as z:
            assert z["a2a"].shape == (G, G)
            assert np.array_equal(z["link_class"], TOPO.link_class_matrix())
            it = int(z["iterations"])
            assert it == res.totals["strategies"][name]["iterations"]
            # the mean a2a matrix adds up to the mean all-to-all bytes per iteration
            assert z["a2a"].sum() == pytest.approx(
                res.totals["strategies"][name]["bytes_per_iter"]["total"], rel=1e-9)
    assert Plan.load(out / "plans" / "resharder") == res.plans["resharder"]
    cdf = json.loads((out / "cdf.json").read_text())
    for t in ("hist", "item"):
        c = cdf["tables"][t]
        counts = np.asarray(c["top_counts"])
        share = np.asarray(c["cumulative_share"])
        assert np.all(np.diff(counts) <= 0) and np.all(np.diff(share) >= -1e-9)
        assert share[-1] <= 1 + 1e-9 and c["total"] > 0
        assert share[0] == pytest.approx(counts[0] / c["total"], rel=1e-5)
        for strat in ("static", "resharder"):
            k = c["cuts"][strat]
            tp = res.plans[strat][t]
            assert k["k0"] == tp.global_ids.size
            assert k["k0_k1"] == tp.global_ids.size + tp.node_ids.size
    assert not list(out.parent.glob(".out.tmp.*"))


def test_sample_windows_and_no_ts(tmp_path, log):
    res = replay(log, TOPO, window=3000, out_dir=tmp_path / "a", batch_size=B)
    wins = res.windows
    assert [w["samples"] for w in wins] == [3000, 3000, 2000]
    assert [w["sample_start"] for w in wins] == [0, 3000, 6000]
    ts = pl.read_parquet(log)["ts"].to_numpy()
    assert [w["start"] for w in wins] == pytest.approx([ts[0], ts[3000], ts[6000]])
    assert res.summary["window"]["unit"] == "samples"
    for w in wins:      # check positions are in the unit of start / end (here ts)
        assert all(w["start"] <= c["position"] <= w["ts_last"] for c in w["checks"])
    # a log without ts: positions are sample indices; the default is 10 windows
    nots = tmp_path / "nots.parquet"
    pl.read_parquet(log).drop("ts").write_parquet(nots)
    res = replay(nots, TOPO, out_dir=tmp_path / "b", batch_size=B, checks_per_window=2)
    wins = res.windows
    assert len(wins) == 10 and all(w["samples"] == N // 10 for w in wins)
    assert [(w["start"], w["end"]) for w in wins] == [(i * 800, (i + 1) * 800)
                                                       for i in range(10)]
    for w in wins[1:]:
        # a check after the last whole iteration of the first half, one at the window end
        assert [c["position"] for c in w["checks"]] == [w["start"] + 384, w["end"]]
    with pytest.raises(ConfigError, match="no 'ts' column"):
        replay(nots, TOPO, window="1s", out_dir=tmp_path / "c", batch_size=B)
    assert not (tmp_path / "c").exists()


def _bad(tmp_path, log):
    df = pl.read_parquet(log)
    files = {}
    neg = df.with_columns(pl.when(pl.int_range(pl.len()) == 4321).then(-7)
                          .otherwise(pl.col("item")).alias("item"))
    files["negative"] = tmp_path / "neg.parquet"
    neg.write_parquet(files["negative"], row_group_size=1000)
    files["missing"] = tmp_path / "noitem.parquet"
    df.drop("item").write_parquet(files["missing"])
    raw = Path(log).read_bytes()
    files["truncated"] = tmp_path / "cut.parquet"
    files["truncated"].write_bytes(raw[: len(raw) * 2 // 3])
    return files


def test_bad_logs_name_file_and_row_and_write_nothing(tmp_path, log):
    files = _bad(tmp_path, log)
    out = tmp_path / "out"
    with pytest.raises(LogError) as e:
        replay(files["negative"], TOPO, window="2s", out_dir=out, batch_size=B)
    assert "neg.parquet" in str(e.value) and "row 4321" in str(e.value) and "item" in str(e.value)
    with pytest.raises(LogError) as e:
        replay([log, files["missing"]], TOPO, out_dir=out, batch_size=B)
    assert "noitem.parquet" in str(e.value) and "'item' is missing" in str(e.value)
    with pytest.raises(LogError) as e:
        replay([log, files["truncated"]], TOPO, out_dir=out, batch_size=B)
    assert "cut.parquet" in str(e.value) and "truncated" in str(e.value)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # a failed replay leaves an earlier replay directory as it was
    replay(log, TOPO, window="4s", out_dir=out, batch_size=B)
    before = (out / "summary.json").read_bytes()
    with pytest.raises(LogError):
        replay(files["negative"], TOPO, window="2s", out_dir=out, batch_size=B)
    assert (out / "summary.json").read_bytes() == before
    # never replaces a directory that is not a replay directory
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not a replay directory"):
        replay(log, TOPO, out_dir=other, batch_size=B)
    assert (other / "notes.txt").read_text() == "keep"


def test_skip_bad_rows_counts_exactly(tmp_path, log):
    df = pl.read_parquet(log)
    neg_rows = [10, 2500, 7999]
    null_rows = [123, 4000]
    idx = pl.int_range(pl.len())
    bad = df.with_columns(
        pl.when(idx.is_in(neg_rows)).then(-1).when(idx.is_in(null_rows)).then(None)
        .otherwise(pl.col("item")).alias("item"))
    p = tmp_path / "bad.parquet"
    bad.write_parquet(p)
    with pytest.raises(LogError, match="row 10 "):
        replay(p, TOPO, window="2s", out_dir=tmp_path / "x", batch_size=B)
    res = replay(p, TOPO, window="2s", out_dir=tmp_path / "o", batch_size=B, skip_bad_rows=True)
    tot = res.totals
    assert tot["skipped_rows"] == 5
    assert tot["skipped"]["negative_id"] == 3 and tot["skipped"]["null_id"] == 2
    assert tot["skipped_by_file"] == {str(p): {**dict.fromkeys(tot["skipped"], 0),
                                               "negative_id": 3, "null_id": 2}}
    assert tot["samples"] == N - 5 == sum(w["samples"] for w in res.windows)
    assert tot["rows_read"] == N
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["totals"]["skipped_rows"] == 5


def test_cli_replay(tmp_path, log):
    runner = CliRunner()
    topo = tmp_path / "topo.toml"
    TOPO.to_toml(topo)
    out = tmp_path / "cli"
    r = runner.invoke(app, ["replay", str(log), "--topology", str(topo), "--window", "4s",
                            "--out", str(out), "--batch-size", str(B), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["totals"]["windows"] == 2 and set(d["totals"]["strategies"]) == set(STRATEGIES)
    assert (out / "summary.json").exists() and (out / "plans" / "static" / "plan.json").exists()
    r = runner.invoke(app, ["replay", str(log), "--topology", str(topo), "--window", "4000",
                            "--out", str(out), "--batch-size", str(B), "--no-dedup"])
    assert r.exit_code == 0, r.output
    assert "resharder" in r.stdout and "vs rw" in r.stdout and "written to" in r.stdout
    assert json.loads((out / "summary.json").read_text())["model"]["dedup"] is False
    for args, needle in ((["--window", "soon"], "window 'soon'"),
                         (["--window", "2s", "--topology", "nope"], "nope")):
        cmd = ["replay", str(log), "--topology", str(topo), "--out", str(tmp_path / "e"),
               "--batch-size", str(B), *args]
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, r.output
        assert r.output.startswith("error: ") and needle in r.output
        assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    files = _bad(tmp_path, log)
    r = runner.invoke(app, ["replay", str(files["negative"]), "--topology", str(topo), "--out",
                            str(tmp_path / "e"), "--batch-size", str(B)])
    assert r.exit_code == 2 and "neg.parquet" in r.output and "row 4321" in r.output
    assert "--skip-bad-rows" in r.output and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["replay", str(files["negative"]), "--topology", str(topo), "--out",
                            str(tmp_path / "e"), "--batch-size", str(B), "--skip-bad-rows"])
    assert r.exit_code == 0, r.output
    assert "skipped 1 bad rows" in r.stdout and "negative_id 1" in r.stdout
    assert not (tmp_path / "e").joinpath("report.html").exists()


def _total_cost_adds_up(summary, pause):
    """Every strategy's total_cost_s, per window and in the totals, is its modelled iteration time
    plus (the re-sharder only) the transfer and the pauses of the deltas it applied."""
    for w in summary["windows"]:
        applied = [c for c in w["checks"] if c["action"] in ("applied", "partial")]
        assert w["pause_s"] == pytest.approx(pause * len(applied))
        assert w["migration_s"] == pytest.approx(sum(c["migration_s"] for c in applied))
        for name, m in w["strategies"].items():
            paid = w["migration_s"] + w["pause_s"] if name == "resharder" else 0.0
            assert m["total_cost_s"] == pytest.approx(
                m["iteration_time_s_per_iter"] * m["iterations"] + paid)
    for name, t in summary["totals"]["strategies"].items():
        assert t["total_cost_s"] == pytest.approx(t["iteration_time_s"] + t["migration_s"]
                                                  + t["pause_s"])
        assert t["total_cost_s"] == pytest.approx(sum(w["strategies"][name]["total_cost_s"]
                                                      for w in summary["windows"]))
        if name != "resharder":
            assert (t["migration_s"], t["pause_s"], t["deltas"]) == (0.0, 0.0, 0)
    r = summary["totals"]["strategies"]["resharder"]
    assert r["pause_s"] == pytest.approx(pause * r["deltas"])


def test_total_cost_counts_communication_migration_and_pauses(timed, log, tmp_path):
    res, _ = timed
    _total_cost_adds_up(res.summary, 0.0)
    assert res.totals["strategies"]["resharder"]["deltas"] >= 1
    paid = replay(log, TOPO, window="2s", out_dir=tmp_path / "paid", batch_size=B,
                  reshard_config=ReshardConfig(pause_s=1e-6))
    _total_cost_adds_up(paid.summary, 1e-6)
    assert paid.totals["strategies"]["resharder"]["pause_s"] > 0
    # a pause no saving of this short log can pay: the re-sharder waits, its plan stays the
    # static one, and every check says why
    dear = replay(log, TOPO, window="2s", out_dir=tmp_path / "dear", batch_size=B,
                  reshard_config=ReshardConfig(pause_s=1e3))
    _total_cost_adds_up(dear.summary, 1e3)
    t = dear.totals["strategies"]
    assert t["resharder"]["deltas"] == 0 and dear.plans["resharder"] == dear.plans["static"]
    assert t["resharder"]["total_cost_s"] == pytest.approx(t["static"]["total_cost_s"])
    waited = [c for w in dear.windows for c in w["checks"] if "waiting" in c["reason"]]
    assert waited and all(c["pause_s"] == 0.0 for c in waited)


def test_torchrec_plan_is_replayed_and_chosen_among(log, tmp_path):
    """``vs_torchrec``: TorchRec's plan made on window 0 replayed as one more baseline, written
    with the others, and among the plans the static FlexShard plan is chosen from."""
    pytest.importorskip("torchrec")
    res = replay(log, TOPO, window="2s", out_dir=tmp_path / "out", batch_size=B,
                 model=CostModel(profile="torchrec"), vs_torchrec=True)
    s = res.summary
    assert s["strategies"] == ["rw", "rw-hash", "twrw", "tw", "torchrec", "static", "resharder"]
    tr = s["totals"]["strategies"]["torchrec"]
    assert tr["iterations"] == s["totals"]["strategies"]["rw"]["iterations"] > 0
    assert (tmp_path / "out" / "plans" / "torchrec").is_dir()
    assert Plan.load(tmp_path / "out" / "plans" / "torchrec") == res.plans["torchrec"]
    times = {k: v["comm_time_s"] for k, v in s["totals"]["strategies"].items()
             if k in ("rw", "rw-hash", "twrw", "tw", "torchrec")}
    best = s["totals"]["strategies"]["static"]["best_baseline"]
    assert best in times and times[best] == min(
        t for k, t in times.items()
        if s["totals"]["strategies"][k]["peak_memory_bytes"] <= s["budget_bytes"] * (1 + 1e-9))
    assert all(w["strategies"]["torchrec"]["iterations"] >= 0 for w in s["windows"])


def test_torchrec_reference_over_the_table_limit_is_refused_before_reading(tmp_path):
    """``vs_torchrec`` on more tables than TorchRec's planner is asked to plan as a reference
    (the CLI's limit, ``bridge.limits``): a ConfigError naming both counts, nothing written."""
    pytest.importorskip("torchrec")
    from flexshard_stream.bridge.limits import TORCHREC_REFERENCE_TABLES

    n = TORCHREC_REFERENCE_TABLES + 1
    cols = {f"f{i}": np.arange(8, dtype=np.int64) % 4 for i in range(n)}
    path = tmp_path / "wide.parquet"
    pl.DataFrame({"ts": np.arange(8, dtype=np.float64), **cols}).write_parquet(path)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=rf"{n} tables.*{TORCHREC_REFERENCE_TABLES}"):
        replay(path, TOPO, out_dir=out, batch_size=B, vs_torchrec=True)
    assert not out.exists()
    # the same log replays without the reference
    res = replay(path, TOPO, window=4, out_dir=out, batch_size=1)
    assert len(res.plans["rw"].tables) == n
