"""The command line: stats, demo, plan, evaluate (through typer's runner and the real script)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flexshard_stream.cli import app

runner = CliRunner()


@pytest.fixture
def log(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    seq = [list(rng.zipf(1.3, size=rng.integers(1, 20)) % 500) for _ in range(n)]
    df = pl.DataFrame({"ts": np.arange(n, dtype=np.float64),
                       "hist": pl.Series(seq, dtype=pl.List(pl.Int64)),
                       "user": rng.integers(0, 300, size=n)})
    p = tmp_path / "log.parquet"
    df.write_parquet(p)
    return p, df


def test_stats_json(log):
    p, df = log
    r = runner.invoke(app, ["stats", str(p), "--json", "--topk", "5"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(d["tables"]) == {"hist", "user"}
    h = d["tables"]["hist"]
    assert h["total"] == int(df["hist"].list.len().sum())
    ids = np.concatenate([np.asarray(x) for x in df["hist"].to_list()])
    counts = np.bincount(ids)
    assert [row[0] for row in h["top"][:1]] == [int(np.argmax(counts))]
    top_id, est, lo, hi = h["top"][0]
    assert lo <= counts[top_id] <= hi
    assert abs(h["distinct_estimate"] - np.unique(ids).size) / np.unique(ids).size < 0.05
    assert set(h["length_quantiles"]) == {"0.5", "0.9", "0.99"}
    assert d["tables"]["user"]["length_quantiles"]["0.5"] == 1.0


def test_stats_features_and_table(log):
    p, _ = log
    r = runner.invoke(app, ["stats", str(p), "--features", "user"])
    assert r.exit_code == 0, r.output
    assert "user" in r.stdout and "hist" not in r.stdout


def test_stats_read_batch_size_and_its_old_flag(log):
    """The read chunk is --read-batch-size; the old --batch-size still works (hidden, warns);
    statistics do not depend on it."""
    p, _ = log
    docs = []
    for flag in ("--read-batch-size", "--batch-size"):
        r = runner.invoke(app, ["stats", str(p), "--json", flag, "700"])
        assert r.exit_code == 0, r.output
        docs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        assert ("deprecated" in r.output) == (flag == "--batch-size")
    for t, d in docs[0]["tables"].items():
        for k in d:
            if k != "length_quantiles":   # the KLL length sketch compacts with random coin flips
                assert d[k] == docs[1]["tables"][t][k], (t, k, d[k], docs[1]["tables"][t][k])
    assert docs[0]["batches"] == 5                      # 3,000 samples read 700 at a time
    r = runner.invoke(app, ["stats", "--help"])
    assert "--read-batch-size" in r.output and "--batch-size" not in r.output


def test_plan_and_evaluate(log, tmp_path):
    p, _ = log
    out = {}
    for strat in ("rw", "tw", "twrw", "dp", "hugectr"):
        d = tmp_path / strat
        r = runner.invoke(app, ["plan", "--log", str(p), "--topology", "2x8", "--strategy", strat,
                                "--out", str(d), "--batch-size", "8", "--json"])
        assert r.exit_code == 0, r.output
        out[strat] = d
        assert (d / "plan.json").exists()
    r = runner.invoke(app, ["evaluate", "--plan", str(out["rw"]), "--plan", str(out["dp"]),
                            "--log", str(p), "--batch-size", "8", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(d) == {"rw", "dp"}
    assert d["rw"]["iterations"] == 3000 // (16 * 8)
    assert d["rw"]["bytes_per_iter"]["total"] > 0 and d["dp"]["bytes_per_iter"]["total"] == 0
    assert d["dp"]["peak_memory_bytes"] > d["rw"]["peak_memory_bytes"]
    for k in ("intra_node", "inter_node"):
        assert k in d["rw"]["bytes_per_iter"]
    assert d["rw"]["comm_time_s_per_iter"] > 0


def test_profile_option(log, tmp_path):
    """--profile chooses the execution profile; the figures say which; cw / twcw plans write."""
    p, _ = log
    for strat in ("rw", "cw"):
        r = runner.invoke(app, ["plan", "--log", str(p), "--topology", "2x8", "--strategy", strat,
                                "--out", str(tmp_path / strat), "--batch-size", "8", "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        assert set(doc["sharding"].values()) == {"row_wise" if strat == "rw" else "column_wise"}
        assert doc["profile"] == "torchrec" and doc["torchrec_issues"] == []
    got = {}
    for prof in ("torchrec", "ideal"):
        r = runner.invoke(app, ["evaluate", "--plan", str(tmp_path / "rw"), "--log", str(p),
                                "--batch-size", "8", "--profile", prof, "--json"])
        assert r.exit_code == 0, r.output
        got[prof] = json.loads(r.stdout.strip().splitlines()[-1])["rw"]
        assert got[prof]["profile"] == prof
        r = runner.invoke(app, ["evaluate", "--plan", str(tmp_path / "rw"), "--log", str(p),
                                "--batch-size", "8", "--profile", prof])
        assert ("TorchRec 1.8 figures" if prof == "torchrec" else "idealized figures") in r.output
    # TorchRec sends the pooled user table's partial sums densely: more than the ideal exchange
    assert got["torchrec"]["bytes_per_iter"]["total"] > got["ideal"]["bytes_per_iter"]["total"]
    assert "torchrec_collectives" in got["torchrec"]["bytes_per_iter"]
    r = _script("evaluate", "--plan", str(tmp_path / "rw"), "--log", str(p), "--batch-size", "8",
                "--profile", "nccl")
    assert r.returncode == 2 and "execution profile 'nccl' unknown" in r.stderr


def _script(*args):
    exe = Path(sys.executable).parent / "flexshard-stream"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def test_bad_inputs_give_clear_errors(tmp_path, log):
    p, _ = log
    r = _script("stats", str(tmp_path / "missing.parquet"))
    assert r.returncode != 0 and "missing.parquet" in (r.stderr + r.stdout)
    r = _script("plan", "--log", str(p), "--topology", "nope", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "error:" in r.stderr and "nope" in r.stderr
    r = _script("evaluate", "--plan", str(tmp_path), "--log", str(p), "--batch-size", "4")
    assert r.returncode == 2 and "not a plan directory" in r.stderr


def test_demo_runs_on_the_embedded_trace(tmp_path):
    out = tmp_path / "demo"
    r = runner.invoke(app, ["demo", "--out", str(out), "--window", "10s"])
    assert r.exit_code == 0, r.output
    assert "default_trace" in r.stdout and "lookups" in r.stdout
    assert "resharder" in r.stdout and "vs rw" in r.stdout and "report.html" in r.stdout
    assert (out / "report.html").exists() and (out / "summary.json").exists()
    s = json.loads((out / "summary.json").read_text())
    assert len(s["windows"]) == 3 and s["totals"]["samples"] == 30000


def test_plan_host_memory_tier(tmp_path):
    import json as _json

    from typer.testing import CliRunner

    from flexshard_stream.cli import app
    from flexshard_stream.placement.plan import Plan
    trace = Path(__file__).resolve().parent.parent / "data" / "default_trace.parquet"
    r = CliRunner().invoke(app, ["plan", "--log", str(trace), "--topology", "2x8", "--strategy",
                                 "flexshard", "--out", str(tmp_path / "p"), "--batch-size", "64",
                                 "--memory-bytes", "2e7", "--host-memory", "--json"])
    assert r.exit_code == 0, r.output
    doc = _json.loads(r.output.strip().splitlines()[-1])
    assert doc["host_bytes_per_gpu"]["max"] > 0
    assert doc["estimate"]["peak_memory_bytes"] <= 2e7 * (1 + 1e-9)
    assert Plan.load(tmp_path / "p").has_host_tier
    # without the tier the same budget is impossible, and says what would make it possible
    r = CliRunner().invoke(app, ["plan", "--log", str(trace), "--topology", "2x8", "--strategy",
                                 "flexshard", "--out", str(tmp_path / "q"), "--batch-size", "64",
                                 "--memory-bytes", "2e7"])
    assert r.exit_code != 0
    assert not (tmp_path / "q").exists()
