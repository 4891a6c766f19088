"""A newcomer's first hour, scripted (issue 17): logs the project never saw, built from the real
data in ``../shared/data``, and every mistake a new user made, through the command line.

- user histories (MovieLens ratings in time order, the last 20 movies of the user as a sequence):
  plan on the first half, evaluate on the second;
- e-commerce events with raw sparse 9-digit item and user IDs (Amazon Beauty histories, IDs
  mapped to random 9-digit numbers), as CSV;
- Criteo rows whose categorical values are hashed to 63-bit IDs.

The commands are the ones README.md's "first hour" walkthrough shows. Output is read as a user
reads it: figures with units, 80 columns, the rows asked for, warnings that name both values.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flexshard_stream.cli import app
from flexshard_stream.errors import LogError
from flexshard_stream.formats.units import fmt_bytes
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import load_tables
from flexshard_stream.sources.ids import IdMode, RowMap
from flexshard_stream.stats.batch import Batch

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FLEXSHARD_SHARED_DATA", ROOT.parent / "shared" / "data"))
runner = CliRunner()


# ============================================================================ the logs
def _first_hour_logs():
    """examples/first_hour_logs.py, the script README.md's walkthrough runs (one copy of the
    log builders)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_hour_logs",
                                                  ROOT / "examples" / "first_hour_logs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working directory with the logs, each split in halves (first / second)."""
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    d = tmp_path_factory.mktemp("newcomer")
    _first_hour_logs().write_logs(SHARED, d)
    return d


@pytest.fixture
def here(work, monkeypatch):
    """Run the commands from the working directory, with relative paths, as a user does."""
    monkeypatch.chdir(work)
    return work


def cli(*args: str, code: int = 0):
    """Run the command; ``.out`` / ``.err``: stdout / stderr with line breaks undone (the
    output is wrapped at 80 columns)."""
    r = runner.invoke(app, list(args))
    assert r.exit_code == code, r.output
    r.out, r.err = " ".join(r.stdout.split()), " ".join(r.stderr.split())
    return r


def _narrow(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide


# ============================================================================ the session
def test_choices_take_any_case_and_list_every_value(here):
    r = cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "FlexShard2", "--out", "x", code=2)
    for name in ("flexshard", "rw", "rw-hash", "tw", "twrw", "dp", "hugectr"):
        assert name in r.output
    r = cli("replay", "histories_first.parquet", "--topology", "2x8", "--out", "x",
            "--engine", "Threads", code=2)
    assert "local, process, ray" in r.output
    assert not Path("x").exists()


def test_stats_prints_the_top_rows_asked_for(here):
    r = cli("stats", "histories_first.parquet", "--topk", "20")
    _narrow(r.stdout)
    for table in ("user", "movie", "history"):
        block = r.stdout.split(f"top 20 rows of {table} ")[1].split("\n\n")[0]
        assert len(re.findall(r"\b\d+: [\d,]+", block)) == 20, block


def test_plan_records_how_it_was_made_and_evaluate_defaults_to_it(here):
    r = cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "FlexShard", "--batch-size", "64", "--out", "plan_h")
    _narrow(r.stdout)
    meta = Plan.load("plan_h").meta
    # de-duplication off by default under the torchrec profile: TorchRec's own default
    assert meta["batch_size"] == 64 and meta["dedup"] is False and meta["ids"] == "raw"
    assert meta["model"]["dedup"] is False and meta["requested_strategy"] == "flexshard"
    # evaluated on the same half: the plan's B, no warning
    r = cli("evaluate", "--plan", "plan_h", "--log", "histories_first.parquet", "--json")
    assert "warning" not in r.err
    doc = json.loads(r.stdout)["flexshard"]
    assert doc["batch_size"] == 64 and doc["dedup"] is False
    # another B: used, with a warning that names both values
    r = cli("evaluate", "--plan", "plan_h", "--log", "histories_first.parquet",
            "--batch-size", "16", "--dedup", "--json")
    assert "B = 16" in r.err and "B = 64" in r.err
    assert "de-duplication off" in r.err and "de-duplication on" in r.err
    doc = json.loads(r.stdout)["flexshard"]
    assert doc["batch_size"] == 16 and doc["dedup"] is True


def test_the_next_log_names_the_flag_that_fixes_it(here):
    if not Path("plan_h").exists():
        cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--batch-size", "64", "--out", "plan_h")
    # the second half rates movies the first never saw: IDs beyond the inferred tables
    r = cli("evaluate", "--plan", "plan_h", "--log", "histories_second.parquet", code=2)
    msg = r.err
    assert msg.startswith("error: histories_second.parquet: row ") and "out of range" in msg
    for fix in ("--skip-bad-rows", "--ids hash", "flexshard-stream tables"):
        assert fix in msg, msg
    r = cli("evaluate", "--plan", "plan_h", "--log", "histories_second.parquet",
            "--skip-bad-rows", "--json")
    doc = json.loads(r.stdout)["flexshard"]
    assert doc["skipped"]["out_of_range"] > 0 and doc["iterations"] > 0
    r = cli("evaluate", "--plan", "plan_h", "--log", "histories_second.parquet",
            "--skip-bad-rows")
    _narrow(r.stdout)
    assert re.search(r"skipped [\d,]+ bad rows \(out_of_range [\d,]+\)", r.out)


def test_tables_file_with_headroom_fits_the_next_log(here):
    r = cli("tables", "histories_first.parquet", "--out", "tables_h.toml")
    _narrow(r.stdout)
    assert "1.5 x (largest ID + 1)" in r.out
    first = pl.read_parquet("histories_first.parquet")
    tabs = {t.name: t for t in load_tables("tables_h.toml")}
    assert tabs["movie"].num_rows == math.ceil(1.5 * (first["movie"].max() + 1))
    assert tabs["history"].kind == "sequence" and tabs["user"].kind == "pooled"
    assert "1.5 x (largest ID + 1" in Path("tables_h.toml").read_text()
    # a larger headroom covers the second half's new movies
    second = pl.read_parquet("histories_second.parquet")
    need = int(max(second["movie"].max(), second["history"].list.max().max())) + 1
    head = math.ceil(need / (first["movie"].max() + 1) * 10) / 10
    cli("tables", "histories_first.parquet", "--headroom", str(head), "--out", "tables_h2.toml")
    cli("plan", "--log", "histories_first.parquet", "--tables", "tables_h2.toml", "--topology",
        "2x8", "--strategy", "rw", "--batch-size", "64", "--out", "plan_h2")
    r = cli("evaluate", "--plan", "plan_h2", "--log", "histories_second.parquet", "--json")
    assert json.loads(r.stdout)["rw"]["skipped"] == {}


def test_raw_sparse_ids_are_refused_then_hashed(here):
    # raw 9-digit IDs: tables of up to a billion rows each do not fit 16 GPUs
    r = cli("plan", "--log", "shop_first.csv", "--topology", "2x8", "--strategy", "flexshard",
            "--out", "plan_s", code=2)
    assert "no plan can store them" in r.err and "--ids hash" in r.err
    assert re.search(r"\d TB of rows", r.err) and not Path("plan_s").exists()
    # the tables command shows why and sizes hashed tables from the distinct IDs
    r = cli("tables", "shop_first.csv")
    assert "sparse IDs" in r.out and "GB" in r.out
    r = cli("tables", "shop_first.csv", "--ids", "hash", "--out", "tables_s.toml")
    _narrow(r.stdout)
    tabs = {t.name: t for t in load_tables("tables_s.toml")}
    assert tabs["recent_items"].kind == "sequence" and tabs["item_id"].num_rows < 100_000
    assert "share a row" in r.out and "--ids hash" in r.out
    # forgetting --ids hash with a table sized for hashing names the flag
    r = cli("plan", "--log", "shop_first.csv", "--tables", "tables_s.toml", "--topology",
            "2x8", "--out", "plan_s", code=2)
    assert "out of range" in r.err and "--ids hash" in r.err
    r = cli("plan", "--log", "shop_first.csv", "--tables", "tables_s.toml", "--ids", "hash",
            "--topology", "2x8", "--strategy", "flexshard", "--batch-size", "128",
            "--out", "plan_s")
    _narrow(r.stdout)
    assert Plan.load("plan_s").meta["ids"] == "hash"
    # evaluate takes the plan's ID mode: the second half's new IDs hash into the tables
    r = cli("evaluate", "--plan", "plan_s", "--log", "shop_second.csv", "--json")
    doc = json.loads(r.stdout)["flexshard"]
    assert doc["ids"] == "hash" and doc["skipped"] == {} and doc["batch_size"] == 128


def test_hashed_64_bit_ids_are_refused_then_hash_rows(here):
    r = cli("plan", "--log", "criteo_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--out", "plan_c", "--host-memory", code=2)
    assert "no plan can store them" in r.err and "--ids hash:ROWS" in r.err
    assert "e+" in r.err and " B of rows" in r.err          # 1e22 bytes, not "GB 1e+11"
    r = cli("plan", "--log", "criteo_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--ids", "HASH:100_000", "--batch-size", "16", "--out", "plan_c",
            "--json")
    doc = json.loads(r.stdout)
    assert doc["settings"]["ids"] == "hash:100000"
    assert all(t["shard_rows_per_gpu"][1] <= 100_000 for t in doc["tables"])
    assert len(doc["per_gpu"]["memory_bytes"]) == 16
    r = cli("evaluate", "--plan", "plan_c", "--log", "criteo_second.parquet", "--json")
    assert json.loads(r.stdout)["flexshard"]["ids"] == "hash:100000"


def test_plan_output_per_table_and_per_gpu_with_units(here):
    if not Path("plan_h").exists():
        cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--batch-size", "64", "--out", "plan_h")
    r = cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--batch-size", "64", "--out", "plan_h", "--json")
    doc = json.loads(r.stdout)
    r = cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--batch-size", "64", "--out", "plan_h")
    out = r.stdout
    _narrow(out)
    # per table: sharding, shard rows per GPU, replicated rows (on every GPU, or per node where
    # the target runs node replicas: TorchRec, the default, does not)
    assert re.search(r"^history\s+(rw|rw \(hashed\)|twrw|tw|cw|twcw|dp)\s+\d+\s+[\d,]+"
                     r"(\.\.[\d,]+)?\s+([\d,]+ all|[\d,]+/node|-)", out, re.M)
    # per GPU: one row per GPU with memory, sent and received
    gpu_rows = re.findall(r"^\s*(\d+)\s+(\d)\s+[\d.]+ [KMG]?B", out, re.M)
    assert [int(g) for g, _ in gpu_rows] == list(range(16))
    # one crossing-nodes figure: the all-to-all's and the sync's bytes between nodes
    b = doc["cost"]["bytes_per_iter"]
    cross = fmt_bytes(b["inter_node"] + b["sync_inter_node"])
    line = next(x for x in out.splitlines() if re.match(r"flexshard\s+[\d.]+ [KMG]?B", x))
    assert cross in line and fmt_bytes(b["sync_inter_node"]) in line
    # comm time by magnitude: microseconds, never "0.00x ms"
    assert re.search(r"\d us", line) and not re.search(r"0\.00\d ms", out)


def test_flexshard_equal_to_row_wise_says_so(here):
    items = pl.read_csv("shop_first.csv").select("ts", "item_id")
    items.write_parquet("items.parquet")
    r = cli("plan", "--log", "items.parquet", "--ids", "hash:50000", "--topology", "2x8",
            "--strategy", "flexshard", "--batch-size", "64", "--out", "plan_i", "--json")
    doc = json.loads(r.stdout)
    if doc["equals"] is None:
        pytest.skip("FlexShard found a better plan than row-wise on this log")
    assert doc["strategy"] == "flexshard" and doc["label"] == "flexshard (= rw)"
    r = cli("plan", "--log", "items.parquet", "--ids", "hash:50000", "--topology", "2x8",
            "--strategy", "flexshard", "--batch-size", "64", "--out", "plan_i")
    assert r.out.startswith("flexshard (= rw) plan") and "found no plan better" in r.out
    r = cli("evaluate", "--plan", "plan_i", "--log", "items.parquet", "--json")
    assert json.loads(r.stdout)["flexshard"]["label"] == "flexshard (= rw)"


def test_replay_refuses_or_adapts_windows_that_cannot_fill_an_iteration(here):
    pl.read_parquet("histories_first.parquet").head(3000).write_parquet("short.parquet")
    r = cli("replay", "short.parquet", "--topology", "2x8", "--out", "rep_short", code=2)
    assert "3,000 rows" in r.err and "16 GPUs x B 512 = 8,192" in r.err
    r = cli("replay", "short.parquet", "--topology", "2x8", "--out", "rep_short",
            "--window", "500", "--batch-size", "64", code=2)
    assert "500 samples" in r.err and "--batch-size 31 or less" in r.err
    r = cli("replay", "short.parquet", "--topology", "2x8", "--out", "rep_short",
            "--window", "1000d", "--batch-size", "512", code=2)
    assert "nothing was evaluated" in r.err
    # ten default windows of 300 samples cannot fill 16 x 64: fewer, larger windows
    r = cli("replay", "short.parquet", "--topology", "2x8", "--out", "rep_short",
            "--batch-size", "64", "--json")
    assert "replayed 2 window(s)" in r.err
    tot = json.loads(r.stdout)["totals"]
    assert tot["windows"] == 2 and tot["iterations"] > 0


def test_replay_takes_the_plan_and_the_report_reads_well(here):
    if not Path("plan_h").exists():
        cli("plan", "--log", "histories_first.parquet", "--topology", "2x8", "--strategy",
            "flexshard", "--batch-size", "64", "--out", "plan_h")
    r = cli("replay", "histories_second.parquet", "--plan", "plan_h", "--window", "5000",
            "--skip-bad-rows", "--out", "rep_h")
    _narrow(r.stdout)
    s = json.loads(Path("rep_h/summary.json").read_text())
    assert s["batch_size"] == 64 and s["topology"]["name"] == "2x8"
    assert s["totals"]["skipped"]["out_of_range"] > 0
    assert "crossing nodes" in r.out and "incl. sync" in r.out
    pytest.importorskip("matplotlib")
    cli("report", "rep_h")
    html = Path("rep_h/report.html").read_text()
    assert "Apply this plan" in html and "flexshard-stream export --plan plans/" in html
    assert "TORCHREC_EXPORT.md" in html and re.search(r"start \(UTC\)", html)
    assert re.search(r"<td>20\d\d-\d\d-\d\d \d\d:\d\d</td>", html)


# ============================================================================ ID modes
def test_id_modes_parse_and_map():
    assert str(IdMode.parse(None)) == "raw" and str(IdMode.parse("Hash")) == "hash"
    assert IdMode.parse("hash:1e6").rows == 1_000_000
    assert IdMode.parse("hash:1,000").rows == 1000
    for bad in ("mod:5", "raw:5", "hash:0", "hash:-3", "hash:2.5", "hash:"):
        with pytest.raises(LogError, match="ID mode"):
            IdMode.parse(bad)
    b = Batch(["a", "b"], np.array([5, 12, 7, 1_000_000_007], np.int64), np.array([2, 0, 1, 1]))
    m = RowMap({"a": 10, "b": 1000}, "hash").map_batch(b)
    assert m.values.tolist() == [5, 2, 7, 1_000_000_007 % 1000]
    assert m.lengths.tolist() == b.lengths.tolist()
    with pytest.raises(LogError, match="exceed"):
        RowMap({"a": 10, "b": 1000}, "hash:100")
    from flexshard_stream.errors import BatchError
    with pytest.raises(BatchError, match="out of range"):
        RowMap({"a": 10, "b": 1000}).map_batch(b)


def _walkthrough() -> list[tuple[list[str], str]]:
    """README.md's "first hour" commands and their comments, in order."""
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("## The first hour", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    out = []
    for line in block.strip().splitlines():
        cmd, _, comment = line.partition("#")
        if cmd.startswith("flexshard-stream "):
            out.append((shlex.split(cmd)[1:], comment.strip()))
    return out


def test_readme_walkthrough_runs_as_written(here):
    """Every command of README.md's walkthrough, in order: an "error" comment means exit 2 with
    one error line, "warns" a warning; the rest succeed."""
    steps = _walkthrough()
    assert len(steps) >= 12
    for args, comment in steps:
        if args[0] == "report":
            pytest.importorskip("matplotlib")
        r = cli(*args, code=2 if comment.startswith("error") else 0)
        if comment.startswith("warns"):
            assert "warning:" in r.stderr, (args, r.stderr)
        if comment.startswith("error"):
            assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
        else:
            _narrow(r.stdout)
    assert Path("rep_h/report.html").exists()


@pytest.mark.parametrize("ids", ["raw", "hash"])
def test_ring_sidecar_hashes_raw_ids(tmp_path, ids):
    """Producers write raw 9-digit IDs into the ring: --ids hash maps them into the tables'
    rows (every batch counted); raw IDs are rejected by the statistics."""
    import secrets
    import threading
    import time

    from flexshard_stream.online.sidecar.ring_feed import run_ring
    from flexshard_stream.plans.tables import EmbeddingTable
    from flexshard_stream.plans.topology import Topology
    from flexshard_stream.sources.ring import Ring

    name = f"nc-{os.getpid()}-{secrets.token_hex(3)}"
    tables = [EmbeddingTable("item", 5000, 16)]
    ring = Ring.create(name, slots=2, capacity_bytes=1 << 20, directory=tmp_path)
    stop, events = threading.Event(), []
    t = threading.Thread(target=run_ring, args=(name, tables, Topology.uniform(1, 2),
                                                tmp_path / "out"),
                         kwargs={"ring_dir": tmp_path, "slots": 2, "capacity_bytes": 1 << 20,
                                 "batch_size": 8, "stop": stop,
                                 "emit": events.append, "handle_signals": False, "ids": ids,
                                 "checkpoint_every_s": None, "unlink": True})
    t.start()
    try:
        prod = ring.producer(block=True, timeout=30)
        rng = np.random.default_rng(0)
        for _ in range(20):
            prod.submit(Batch(["item"], rng.integers(100_000_000, 999_999_999, 64),
                              np.ones(64, np.int64)))
        deadline = time.monotonic() + 60
        while ring.stats().total.batches_read < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        prod.close()
    finally:
        stop.set()
        t.join(60)
        ring.close()
    done = next(e for e in events if e["event"] == "stopped")
    if ids == "hash":
        assert done["rejected"] == 0 and done["processed_ids"] == 20 * 64
    else:
        assert done["rejected"] == 20
