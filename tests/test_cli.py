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
        assert ("TorchRec 1.8 figures" if prof == "torchrec" else "idealized figures") in " ".join(
            r.output.split())
    # TorchRec sends the pooled user table's partial sums densely: more than the ideal exchange
    assert got["torchrec"]["bytes_per_iter"]["total"] > got["ideal"]["bytes_per_iter"]["total"]
    assert "torchrec_collectives" in got["torchrec"]["bytes_per_iter"]
    r = _script("evaluate", "--plan", str(tmp_path / "rw"), "--log", str(p), "--batch-size", "8",
                "--profile", "nccl")
    assert r.returncode == 2 and "'nccl' is not one of torchrec, ideal" in r.stderr


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
    # a gain too small to show as more than 1.00x is said in words, not left as a riddle
    gains = [s["totals"]["strategies"][k]["speedup_vs_rw"] for k in ("static", "resharder")]
    assert ("gains under 0.5% over row-wise" in " ".join(r.stdout.split())) == (max(gains) < 1.005)
    # the first result line says what FlexShard gains and over which plan (issue 22)
    text = " ".join(r.stdout.split())
    first = text[text.index("FlexShard"):]
    assert text.index("FlexShard") < text.index("lookups")          # before the details
    best = s["totals"]["strategies"]["static"]["best_baseline"]
    label = "TorchRec's own plan (torchrec)" if best == "torchrec" else best
    assert first.startswith("FlexShard gains nothing") or first.startswith(
        "FlexShard: ") and f"than {label}, the fastest baseline that fits" in first[:200]
    assert s["batch_size"] == 128 and s["totals"]["strategies"]["rw-hash"]["iterations"] > 0
    # TorchRec's own plan is replayed beside the baselines where TorchRec is installed
    import importlib.util
    if importlib.util.find_spec("torchrec") is not None:
        assert "torchrec" in s["strategies"] and (out / "plans" / "torchrec").is_dir()
        assert "torchrec: TorchRec's own plan" in text
        tr = s["totals"]["strategies"]["torchrec"]["comm_time_s_per_iter"]
        fs = min(s["totals"]["strategies"][k]["comm_time_s_per_iter"]
                 for k in ("static", "resharder"))
        assert best == "torchrec" or f"{tr / fs:.2f}x over TorchRec's own plan" in first[:300]
    else:
        assert "TorchRec is not installed" in text and "torchrec" not in s["strategies"]


def test_plan_host_memory_tier(tmp_path):
    import json as _json

    from typer.testing import CliRunner

    from flexshard_stream.cli import app
    from flexshard_stream.plans.plan import Plan
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


# ---------------------------------------------------------------------------- start-up, choices
#: What ``--help`` and an argument error must not import (issue 17: they answer at once).
HEAVY = ("numba", "polars", "pyarrow", "matplotlib", "ray", "torch", "datasketches")


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["replay", "--help"],
                                  ["tables", "--help"],
                                  ["plan", "--log", "x.parquet", "--topology", "2x8",
                                   "--strategy", "nope", "--out", "y"],
                                  ["evaluate", "--plan", "p"],
                                  ["stats", "x.parquet", "--ids", "modulo"]])
def test_help_and_argument_errors_load_no_heavy_module(args):
    code = ("import sys\nfrom flexshard_stream.cli import app\ntry:\n    app(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


def test_choices_any_case_and_every_value_listed(tmp_path):
    from flexshard_stream import cli
    from flexshard_stream.online import replay as rp
    from flexshard_stream.placement.planner import MemoryPolicy

    assert cli.ENGINES == rp.ENGINES and cli.EVALUATIONS == rp.EVALUATIONS
    for b in cli.MEMORY_BASELINES:
        MemoryPolicy(baseline=b)
    check = cli.common.choice(cli.STRATEGIES, "--strategy")
    assert check("FlexShard") == "flexshard" and check(" RW-Hash ") == "rw-hash"
    with pytest.raises(Exception) as e:
        check("flex")
    assert all(s in str(e.value) for s in cli.STRATEGIES)
    trace = Path(__file__).resolve().parent.parent / "data" / "default_trace.parquet"
    r = runner.invoke(app, ["plan", "--log", str(trace), "--topology", "2x8", "--strategy",
                            "RW-HASH", "--memory-baseline", "TWRW", "--out",
                            str(tmp_path / "p"), "--batch-size", "32", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["strategy"] == "rw-hash"


def test_every_log_command_takes_an_id_mode():
    import typer.main

    group = typer.main.get_command(app)
    for name in ("stats", "tables", "plan", "evaluate", "replay", "sidecar"):
        opts = {o for p in group.commands[name].params for o in p.opts}
        assert "--ids" in opts, name
    for name in ("plan", "evaluate", "replay"):
        assert "--skip-bad-rows" in {o for p in group.commands[name].params for o in p.opts}


def test_units_by_magnitude():
    from flexshard_stream.formats.units import (
        fmt_bytes,
        fmt_count,
        fmt_rows,
        fmt_seconds,
    )

    assert [fmt_bytes(x) for x in (0, 812, 2810, 999_700, 20.6e9, 4.72e21)] == \
        ["0 B", "812 B", "2.81 KB", "1.00 MB", "20.6 GB", "4.72e+21 B"]
    assert fmt_seconds(2.81e-6) == "2.81 us" and fmt_seconds(2.41e-6) == "2.41 us"
    assert [fmt_seconds(x) for x in (6.92e-4, 0.0123, 1.3, 0.0)] == \
        ["692 us", "12.3 ms", "1.30 s", "0 s"]
    assert fmt_rows(54_273) == "54,273" and fmt_rows(751_499_940) == "751M"
    assert fmt_count(999_789_872) == "999,789,872" and fmt_count(9.19e18) == "9.19e+18"


def test_example_tables_file_plans_the_default_trace(tmp_path):
    from flexshard_stream.data import DEFAULT_TRACE, EXAMPLE_TABLES

    r = runner.invoke(app, ["plan", "--log", str(DEFAULT_TRACE), "--tables", str(EXAMPLE_TABLES),
                            "--topology", "2x8", "--strategy", "twrw", "--batch-size", "32",
                            "--out", str(tmp_path / "p"), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["settings"]["tables_source"] == str(EXAMPLE_TABLES)
    assert {t["table"] for t in doc["tables"]} == {"item_history", "query_tokens",
                                                   "page_topics", "ad_id"}


def test_a_time_like_column_is_named_with_the_way_out(tmp_path):
    """A column named 'timestamp' (MovieLens) is the time column (issue 26); another time-like
    name read as an ID column ('created_at') is named with the ways out; naming the features
    says nothing."""
    log = tmp_path / "ratings.csv"
    log.write_text("userId,movieId,timestamp\n1,10,964982703\n2,11,964981247\n1,12,964982224\n")
    r = runner.invoke(app, ["stats", str(log), "--json"])
    assert r.exit_code == 0 and "looks like the sample time" not in r.output, r.output
    assert '"timestamp"' not in r.output and '"last_ts": 964982703.0' in r.output
    log = tmp_path / "ratings2.csv"
    log.write_text("userId,movieId,created_at\n1,10,964982703\n2,11,964981247\n")
    r = runner.invoke(app, ["stats", str(log)])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "'created_at' looks like the sample time" in said and "--ts created_at" in said
    r = runner.invoke(app, ["stats", str(log), "--features", "userId,movieId"])
    assert r.exit_code == 0 and "looks like the sample time" not in r.output
    r = runner.invoke(app, ["tables", str(log), "--out", str(tmp_path / "t.toml")])
    assert r.exit_code == 0, r.output
    assert "'created_at' looks like the sample time" in " ".join(r.output.split())


@pytest.mark.parametrize("profile, expected", [("torchrec", False), ("ideal", True)])
def test_dedup_defaults_to_what_the_runtime_does(tmp_path, profile, expected):
    """Without --dedup/--no-dedup: off under the torchrec profile (TorchRec requests every
    occurrence unless use_index_dedup is set), on under ideal; recorded in the plan."""
    from flexshard_stream.cli.common import default_dedup
    from flexshard_stream.plans.plan import Plan
    from flexshard_stream.sources.synth import TableSpec, generate, write_log

    specs = [TableSpec("hist", 2000, 1.1, "sequence", "fixed", 4)]
    log = tmp_path / "l.parquet"
    write_log(generate(specs, 4096, 1024, seed=1), log, specs)
    out = tmp_path / "p"
    r = runner.invoke(app, ["plan", "--log", str(log), "--topology", "2x2", "--batch-size", "16",
                            "--profile", profile, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert Plan.load(out).meta["dedup"] is expected is default_dedup(profile)
    # a plan that records no settings: evaluate takes de-duplication from the profile too
    bare = Plan.load(out)
    bare.meta = {}
    bare.save(tmp_path / "bare")
    r = runner.invoke(app, ["evaluate", "--plan", str(tmp_path / "bare"), "--log", str(log),
                            "--batch-size", "16", "--profile", profile, "--json"])
    assert r.exit_code == 0, r.output
    (res,) = json.loads(r.output.strip().splitlines()[-1]).values()
    assert res["dedup"] is expected


def test_cost_table_fits_80_columns_with_long_labels():
    """A plan label like ``flexshard (= torchrec)`` stacks the headers on two lines instead of
    pushing the table past 80 columns; short labels keep the one-line header."""
    from flexshard_stream.cli.common import WIDTH, cost_rows

    r = {"bytes_per_iter": {"total": 38.7e6, "inter_node": 5.95e6},
         "comm_time_s_per_iter": 15.8e-6, "peak_memory_bytes": 3.46e6, "speedup_vs_rw": 1.0}
    short = cost_rows([("rw", r), ("flexshard", r)])
    assert "crossing nodes" in short and max(map(len, short.splitlines())) <= WIDTH
    for vs_rw in (False, True):
        long = cost_rows([("rw", r), ("flexshard (= torchrec)", r)], vs_rw=vs_rw).splitlines()
        assert max(map(len, long)) <= WIDTH
        assert long[0].split() == ["crossing", "incl.", "comm", "peak/"]
        assert long[3].startswith("flexshard (= torchrec)") and "5.95 MB" in long[3]
