"""Issue 26, "the newcomer's second hour" and silent wrong results: each item a regression test."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flexshard_stream.cli import app
from flexshard_stream.errors import ConfigError
from flexshard_stream.plans.topology import Topology


def test_tables_refuses_an_id_that_does_not_fit_its_own_table(tmp_path):
    """An ID of 2^63 - 1 made `tables` write num_rows = 2^63 - 1, a table that ID does not fit."""
    log = tmp_path / "log.parquet"
    pl.DataFrame({"item": pl.Series([1, 2**63 - 1], dtype=pl.Int64)}).write_parquet(log)
    r = CliRunner().invoke(app, ["tables", str(log), "--out", str(tmp_path / "t.toml")])
    assert r.exit_code == 2, r.output
    assert "9223372036854775807" in r.output and "--ids hash" in r.output
    assert not (tmp_path / "t.toml").exists()


@pytest.mark.parametrize("field,value", [("hbm_bytes_per_gpu", "1e308"),
                                         ("inter_node_bandwidth", "1e300")])
def test_absurd_topology_figures_are_refused(tmp_path, field, value):
    """`hbm_bytes_per_gpu = 1e308` was accepted and a numpy overflow warning leaked out."""
    p = tmp_path / "t.toml"
    p.write_text(f"[topology]\nnodes = 2\ngpus_per_node = 2\n{field} = {value}\n")
    with pytest.raises(ConfigError, match="not a real machine's"):
        Topology.from_toml(p)
    assert Topology.uniform(2, 2, hbm_bytes_per_gpu=80e9).hbm_bytes.max() == 80e9
    assert np.isfinite(Topology.preset("16x8").hbm_bytes).all()


def test_csv_with_comma_joined_ids_names_the_separator(tmp_path):
    """A CSV whose sequence cells join IDs with commas got an error that did not say how IDs are
    separated."""
    from flexshard_stream.errors import LogError
    from flexshard_stream.sources.logs import LogReader

    log = tmp_path / "log.csv"
    log.write_text('hist,user\n"3 4",1\n"12,7,40",2\n')
    with pytest.raises(LogError, match=r"separated by spaces, not ',': write '12 7 40'"):
        list(LogReader([str(log)], features={"hist": "sequence", "user": "single"}))


@pytest.mark.parametrize("argv", [["plan", "--log", "nosuch.parquet", "--topology", "2x8",
                                   "--out", "x"],
                                  ["stats", "nosuch.csv"], ["tables", "nope/*.parquet"],
                                  ["evaluate", "--plan", "p", "--log", "nosuch.parquet"],
                                  ["replay", "nosuch.parquet", "--topology", "2x8", "--out", "o"]])
def test_a_missing_log_is_refused_before_the_heavy_imports(tmp_path, argv):
    """An error for a missing file took 3-5 s to appear: polars and Numba were imported first."""
    import subprocess
    import sys
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom flexshard_stream.cli import app\n"
            f"r = CliRunner().invoke(app, {argv!r})\n"
            "print(r.exit_code, 'numba' in sys.modules, 'polars' in sys.modules)\n"
            "print(r.output)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120).stdout.splitlines()
    assert out[0] == "2 False False", out
    assert "no such log file" in "\n".join(out) or "no log file matches" in "\n".join(out)


# ------------------------------------------------------------------ OS errors on an output path
def _small_log(path):
    rng = np.random.default_rng(5)
    rows = ["ts,a,b"] + [f"{1.7e9 + i * 0.05:.2f},{min(int(rng.zipf(1.3)), 99)},"
                         f"{min(int(rng.zipf(1.2)), 499)}" for i in range(600)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A log, its plan and a statistics snapshot, for the writers below to write again."""
    d = tmp_path_factory.mktemp("written")
    log = _small_log(d / "log.csv")
    r = CliRunner().invoke(app, ["plan", "--log", str(log), "--topology", "1x2", "--out",
                                 str(d / "plan"), "--batch-size", "32"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["stats", str(log), "--save", str(d / "s.fss"), "--json"])
    assert r.exit_code == 0, r.output
    return d


def _writers(d, out):
    log = str(d / "log.csv")
    return {"plan": ["plan", "--log", log, "--topology", "1x2", "--out", out, "--batch-size",
                     "32"],
            "export": ["export", "--plan", str(d / "plan"), "--out", out],
            "stats": ["stats", log, "--save", out, "--json"],
            "merge": ["merge", str(d / "s.fss"), "-o", out],
            "tables": ["tables", log, "--out", out, "--json"]}


def _fault(kind, d, monkeypatch):
    """An output path the OS refuses to write, and the reason the error line must give."""
    import errno
    import os
    if kind == "name too long":
        return str(d / ("x" * 300)), os.strerror(errno.ENAMETOOLONG)
    if kind == "under a file":
        (d / "afile").write_text("x")
        return str(d / "afile" / "out"), "not a directory"
    real = os.replace

    def full(src, dst, *a, **kw):   # every writer renames its finished file or folder in
        if "fresh" in str(dst):
            raise OSError(errno.ENOSPC if kind == "disk full" else errno.EROFS,
                          os.strerror(errno.ENOSPC if kind == "disk full" else errno.EROFS),
                          str(dst))
        return real(src, dst, *a, **kw)
    monkeypatch.setattr(os, "replace", full)
    return str(d / "fresh"), os.strerror(errno.ENOSPC if kind == "disk full" else errno.EROFS)


@pytest.mark.parametrize("command", ["plan", "export", "stats", "merge", "tables"])
@pytest.mark.parametrize("kind", ["name too long", "under a file", "disk full", "read-only"])
def test_an_os_error_on_an_output_path_is_one_error_line(written, tmp_path, monkeypatch,
                                                         command, kind):
    """ENOSPC, EROFS, ENAMETOOLONG on an output path printed a traceback (exit 1) from plan,
    export, stats --save, merge -o and tables --out."""
    out, reason = _fault(kind, tmp_path, monkeypatch)
    r = CliRunner().invoke(app, _writers(written, out)[command])
    assert r.exit_code == 2, (r.output, r.exception)
    line = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert line and line[0].startswith(f"error: cannot write {out}") \
        or "a parent of it is not a directory" in r.output, r.output
    assert reason in r.output or kind == "under a file", r.output
    assert "Traceback" not in r.output


def test_the_sidecar_checks_out_before_creating_its_ring(tmp_path):
    """The sidecar created its 64 MB ring before checking --out and left it behind."""
    from flexshard_stream.plans.tables import EmbeddingTable, save_tables
    tables = tmp_path / "t.toml"
    save_tables([EmbeddingTable("a", 100, 8)], tables)
    rings = tmp_path / "rings"
    rings.mkdir()
    for out in (tmp_path / ("x" * 300), tmp_path / "t.toml" / "out"):
        r = CliRunner().invoke(app, ["sidecar", "--ring", "r1", "--ring-dir", str(rings),
                                     "--tables", str(tables), "--topology", "1x2", "--out",
                                     str(out)])
        assert r.exit_code == 2, (r.output, r.exception)
        assert r.output.startswith("error: cannot write") or "not a directory" in r.output
        assert list(rings.iterdir()) == [], "a ring was left behind"


# ------------------------------------------------------------------ the sidecar's losses and its out_dir
def _sidecar(out, **kw):
    from flexshard_stream.online.sidecar import Sidecar
    from flexshard_stream.plans.tables import EmbeddingTable
    return Sidecar([EmbeddingTable("item", 1000, 8)], Topology.uniform(1, 2), 8, out_dir=out,
                   checkpoint_every_s=None, **kw)


def _batch(seed):
    from flexshard_stream import Batch
    return Batch(["item"], np.random.default_rng(seed).integers(0, 1000, 32),
                 np.full(4, 8, np.int64))


def _full_disk_after(monkeypatch, good: int):
    """Checkpoints fail with ENOSPC after the first ``good`` ones."""
    import errno
    from flexshard_stream.online.sidecar import ledger
    real, calls = ledger.write_checkpoint, []

    def write(*a, **kw):
        calls.append(1)
        if len(calls) > good:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **kw)
    monkeypatch.setattr(ledger, "write_checkpoint", write)


def test_a_failed_final_checkpoint_is_an_error_naming_what_is_lost(tmp_path, monkeypatch):
    """With --out on a full disk the sidecar returned 0 on SIGTERM, its last checkpoint holding
    192 of 4,584 batches; only the next start said the rest was lost."""
    from flexshard_stream.online.sidecar import CheckpointLostError
    _full_disk_after(monkeypatch, good=1)
    sc = _sidecar(tmp_path / "out")
    for i in range(3):
        sc.submit(_batch(i))
    sc.flush()
    first = sc.checkpoint()
    for i in range(5):
        sc.submit(_batch(10 + i))
    with pytest.raises(CheckpointLostError, match=r"final checkpoint failed .*No space left"
                       r".*: 5 of the 8 batches .*160 IDs.* lost for a restart") as e:
        sc.close()
    assert str(first) in str(e.value) and (e.value.lost_batches, e.value.lost_ids) == (5, 160)


def test_the_ring_sidecar_reports_a_failed_final_checkpoint_and_raises(tmp_path, monkeypatch):
    import secrets
    import threading

    from flexshard_stream.online.sidecar import CheckpointLostError
    from flexshard_stream.online.sidecar.ring_feed import run_ring
    from flexshard_stream.plans.tables import EmbeddingTable
    from flexshard_stream.sources.ring import Ring
    _full_disk_after(monkeypatch, good=0)
    name = f"sh-{secrets.token_hex(4)}"
    ring = Ring.create(name, slots=1, capacity_bytes=1 << 20, directory=tmp_path)
    prod = ring.producer()
    for i in range(6):
        prod.submit(_batch(i))
    prod.close()
    ring.close()
    stop, events = threading.Event(), []
    stop.set()                                     # drain what is there (unlink), then stop
    with pytest.raises(CheckpointLostError, match="6 of the 6 batches"):
        run_ring(name, [EmbeddingTable("item", 1000, 8)], Topology.uniform(1, 2),
                 tmp_path / "out", ring_dir=tmp_path, slots=1, capacity_bytes=1 << 20,
                 batch_size=8, stop=stop, emit=events.append, handle_signals=False,
                 checkpoint_every_s=None, unlink=True)
    done = events[-1]
    assert done["event"] == "stopped" and done["lost_batches"] == 6 and "final" in done["error"]


def test_the_sidecar_command_exits_2_when_its_final_checkpoint_fails(tmp_path, monkeypatch):
    from flexshard_stream.online import sidecar as pkg
    from flexshard_stream.online.sidecar import CheckpointLostError

    def lost(*a, **kw):
        raise CheckpointLostError("the final checkpoint failed (...): 9 of the 9 batches", 9, 9)
    monkeypatch.setattr(pkg, "run_ring", lost)
    r = CliRunner().invoke(app, ["sidecar", "--ring", "r", "--tables", "t.toml", "--topology",
                                 "1x2", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and r.output.startswith("error: the final checkpoint failed")


def _planted(tmp_path):
    """Another user's world-writable directory with the sidecar's marker, and a victim."""
    out, victim = tmp_path / "shared", tmp_path / "victim"
    out.mkdir()
    victim.mkdir()
    (out / ".flexshard-kind").write_text("sidecar\n")
    for i in range(3):
        (victim / f"{i:06d}").write_text("theirs")
    return out, victim


@pytest.mark.parametrize("entry", ["plans", ".lock", "decisions.jsonl", "deltas"])
def test_the_sidecar_refuses_symlinked_entries_of_its_out_dir(tmp_path, entry):
    """Symlinks planted in its out_dir made the sidecar (as root) delete a victim's files while
    pruning, create a file through `.lock` and append through `decisions.jsonl`."""
    from flexshard_stream.errors import ConfigError
    out, victim = _planted(tmp_path)
    target = victim if entry in ("plans", "deltas") else victim / "made-by-root"
    (out / entry).symlink_to(target)
    with pytest.raises(ConfigError, match=rf"{entry}: a symlink where the sidecar keeps"):
        _sidecar(out)
    assert sorted(p.name for p in victim.iterdir()) == ["000000", "000001", "000002"]


@pytest.mark.parametrize("how", ["world-writable", "another owner"])
def test_the_sidecar_refuses_an_out_dir_others_can_write(tmp_path, how):
    import os

    from flexshard_stream.errors import ConfigError
    out, _ = _planted(tmp_path)
    if how == "world-writable":
        out.chmod(0o777)
        match = "others can write into it"
    else:
        os.chown(out, 12345, 12345)
        match = "belongs to uid 12345"
    with pytest.raises(ConfigError, match=match):
        _sidecar(out)
    assert sorted(p.name for p in out.iterdir()) == [".flexshard-kind"]


def test_link_plan_never_deletes_a_real_directory(tmp_path):
    """link_plan rmtree'd a real directory at out_dir/plan (one it did not write)."""
    import os

    from flexshard_stream.errors import ConfigError
    out = tmp_path / "out"
    sc = _sidecar(out)
    sc.close()
    os.unlink(out / "plan")
    (out / "plan").mkdir()
    (out / "plan" / "mine.txt").write_text("mine")
    with pytest.raises(ConfigError, match="did not write"):
        _sidecar(out, resume=True)
    assert (out / "plan" / "mine.txt").read_text() == "mine"


# ------------------------------------------------------------------ export file names
def _hashed_plan(*tables):
    from flexshard_stream.placement.baselines import row_wise
    from flexshard_stream.plans.tables import EmbeddingTable
    return row_wise([EmbeddingTable(n, rows, 4) for n, rows in tables],
                    Topology.uniform(1, 2, hbm_bytes_per_gpu=1e9), mode="hash")


@pytest.mark.parametrize("tables", [[("t1", 100), ("my table", 37)],     # "t1" was index 1's
                                    [("my table", 37), ("t0", 100)],
                                    [("x" * 240, 100), ("y" * 240, 37)],
                                    [("A", 100), ("a", 37)]])             # case-blind systems
def test_export_gives_every_table_its_own_files(tmp_path, tables):
    """A table `t1` beside an unsafe-named table at index 1 shared `t1.remap_*.npy` (the
    self-check refused a valid plan); a 240-character name raised `File name too long`."""
    from flexshard_stream.bridge.export import export_torchrec, load_torchrec_export
    plan = _hashed_plan(*tables)
    export_torchrec(plan, tmp_path / "e")
    ex = load_torchrec_export(tmp_path / "e")
    files = [p.name for p in (tmp_path / "e").iterdir() if p.name.endswith(".npy")]
    assert len({f.lower() for f in files}) == 2 * len(tables) and max(map(len, files)) < 100
    for name, rows in tables:
        ids = np.arange(rows, dtype=np.int64)
        assert sorted(ex.apply(name, ids).tolist()) == ids.tolist()


def test_datasketches_features_that_look_alike_get_two_files(tmp_path):
    """`export_datasketches` mapped features `a/b` and `a_b` to one file: the second silently
    overwrote the first."""
    from flexshard_stream import Batch
    from flexshard_stream.sources.distributed import export_datasketches
    from flexshard_stream.stats.stream import StreamStats
    stats = StreamStats({"a/b": 100, "a_b": 100})
    stats.update(Batch(["a/b", "a_b"], [1, 2, 2, 7], [3, 1]))
    files = export_datasketches(stats, tmp_path / "ds")
    paths = {files[f]["frequent_items"] for f in ("a/b", "a_b")}
    assert len(paths) == 2 and all((tmp_path / "ds" / p).is_file() for p in paths)
    assert files["a_b"]["frequent_items"].endswith("/a_b.frequent_items.bin")


# ------------------------------------------------------------------ replay --plan
def test_replay_plan_replays_the_users_plan(written, tmp_path):
    """`replay --plan DIR` replayed a fresh static plan made on window 0, not the user's."""
    import json

    from flexshard_stream.plans.delta import plan_fingerprint
    from flexshard_stream.plans.plan import Plan
    d = written
    rw = tmp_path / "rw"
    r = CliRunner().invoke(app, ["plan", "--log", str(d / "log.csv"), "--topology", "1x2",
                                 "--strategy", "rw-hash", "--out", str(rw), "--batch-size", "32"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["replay", str(d / "log.csv"), "--plan", str(rw), "--out",
                                 str(out), "--window", "200"])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    assert s["static_plan"] == "given" and "the plan given with --plan" in r.output
    static = Plan.load(out / "plans" / "static")
    assert plan_fingerprint(static) == plan_fingerprint(Plan.load(rw))
    assert "rw-hash" in s["strategies"] and "replicate no row" in r.output


# ------------------------------------------------------------------ plans named on the command line
def test_export_says_a_missing_plan_does_not_exist(tmp_path):
    """`export --plan nosuchplan` said "not a plan directory (no plan.json)"."""
    r = CliRunner().invoke(app, ["export", "--plan", str(tmp_path / "nosuchplan"), "--out",
                                 str(tmp_path / "e")])
    assert r.exit_code == 2 and "nosuchplan: does not exist" in r.output, r.output
    assert not (tmp_path / "e").exists()


def test_a_replay_directory_as_plan_points_to_its_plans(written, tmp_path):
    """`export --plan` on a replay directory did not point to its `plans/`."""
    d = written
    rep = tmp_path / "rep"
    r = CliRunner().invoke(app, ["replay", str(d / "log.csv"), "--topology", "1x2",
                                 "--batch-size", "32", "--out", str(rep), "--window", "200"])
    assert r.exit_code == 0, r.output
    for argv in (["export", "--plan", str(rep), "--out", str(tmp_path / "e")],
                 ["evaluate", "--plan", str(rep), "--log", str(d / "log.csv")]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2, r.output
        assert "a replay directory, not a plan" in r.output
        assert f"--plan {rep / 'plans' / 'static'}" in " ".join(r.output.split())


def test_evaluate_says_once_that_the_last_samples_did_not_fill_an_iteration(written, tmp_path):
    """`evaluate` repeated "the last N samples did not fill an iteration" once per plan."""
    d = written
    rw = tmp_path / "rw"
    assert CliRunner().invoke(app, ["plan", "--log", str(d / "log.csv"), "--topology", "1x2",
                                    "--strategy", "rw", "--out", str(rw), "--batch-size",
                                    "32"]).exit_code == 0
    r = CliRunner().invoke(app, ["evaluate", "--plan", str(d / "plan"), "--plan", str(rw),
                                 "--log", str(d / "log.csv"), "--batch-size", "64"])
    assert r.exit_code == 0, r.output
    assert r.output.count("did not fill an iteration") == 1 and "every plan: the last" in r.output


# ------------------------------------------------------------------ plan: a log too short for B
@pytest.mark.parametrize("batch_size,warned", [(512, True), (16, False)])
def test_plan_says_when_the_log_cannot_fill_enough_iterations(written, tmp_path, batch_size,
                                                               warned):
    """Default B = 512 passed `plan` silently and failed later: `evaluate` then said the log
    held fewer than one iteration, or evaluated "1 iterations" without a warning."""
    r = CliRunner().invoke(app, ["plan", "--log", str(written / "log.csv"), "--topology", "1x2",
                                 "--out", str(tmp_path / "p"), "--batch-size", str(batch_size)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert ("cannot judge it" in text) == warned, text
    if warned:
        assert "the log holds 600 samples: 0 iterations of 2 GPUs x B 512" in text
        assert "--batch-size 30 or less fills 10 (600 samples)" in text


# ------------------------------------------------------------------ the in-process Sidecar
def test_the_in_process_sidecar_takes_ids_hash(tmp_path):
    """The in-process Sidecar had no `ids=` (only the ring command had --ids): raw IDs beyond a
    table's rows were rejected."""
    from flexshard_stream import Batch
    sc = _sidecar(tmp_path / "out", ids="hash")
    big = np.array([10**12 + 5, 987_654_321_123, 1005], np.int64)
    sc.submit(Batch(["item"], big, np.array([1, 1, 1])))
    sc.flush()
    sc.close()
    st = sc.stats()
    assert st.rejected == 0 and st.processed_ids == 3
    assert sorted(sc.stats_object.view().summary(10)["item"].top_ids.tolist()) == \
        sorted(set((big % 1000).tolist()))


def test_the_sidecar_logs_drops_and_why_no_plan_was_published(tmp_path, caplog):
    """One loop dropped 20% of its batches and published 0 plans without a word."""
    import logging
    sc = _sidecar(tmp_path / "out", policy="drop", queue_batches=1)
    with caplog.at_level(logging.INFO, logger="flexshard_stream.online.sidecar"):
        for i in range(200):
            sc.submit(_batch(i))
        sc.close()
    st = sc.stats()
    assert st.dropped > 0, "the test needs drops"
    line = [r.getMessage() for r in caplog.records if "sidecar closing" in r.getMessage()]
    assert line and f"dropped {st.dropped:,} of 200 submitted batches" in line[0]
    assert "published no plan change: " in line[0] and "check" in line[0]
    assert [r.levelname for r in caplog.records if "sidecar closing" in r.getMessage()] == \
        ["WARNING"]


# ------------------------------------------------------------------ export: pooling factors
def test_export_stats_fills_the_pooling_factors(written, tmp_path):
    """`export` wrote TorchRec's default pooling factors: a plan directory holds no
    statistics."""
    import json
    d = written
    runs = {}
    for name, extra in (("bare", []), ("stats", ["--stats", str(d / "s.fss")])):
        r = CliRunner().invoke(app, ["export", "--plan", str(d / "plan"), "--out",
                                     str(tmp_path / name), "--json"] + extra)
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.output.strip().splitlines()[-1])
    bare = {e["table"]: e for e in runs["bare"]["tables"]}
    filled = {e["table"]: e for e in runs["stats"]["tables"]}
    assert all(e["mean_length"] is None for e in bare.values())
    assert all(e["mean_length"] == pytest.approx(1.0) for e in filled.values())  # one ID each
    assert any("--stats FILE" in n for e in bare.values() for n in e["notes"])
    assert not any("pooling_factors" in n for e in filled.values() for n in e["notes"])


# ------------------------------------------------------------------ the time column
@pytest.mark.parametrize("name", ["timestamp", "time", "event_time"])
def test_a_column_named_like_time_is_the_time_column(tmp_path, name):
    """MovieLens' `timestamp` column became a 2.3 G-row ID table unless renamed `ts`."""
    from flexshard_stream.sources.logs import LogReader, inspect_log
    log = tmp_path / "log.parquet"
    pl.DataFrame({"user": [1, 2, 3], "movie": [10, 20, 30],
                  name: [978300760, 978302109, 978301968]}).write_parquet(log)
    schema = inspect_log([str(log)])
    assert schema.keys == ("user", "movie") and schema.ts_column == name and schema.has_ts
    batches = list(LogReader([str(log)]))
    assert batches[0].timestamp.tolist() == [978300760.0, 978302109.0, 978301968.0]
    r = CliRunner().invoke(app, ["tables", str(log), "--json"])
    assert r.exit_code == 0 and name not in r.output.split('"tables"')[1], r.output


def test_ts_column_names_the_time_column_and_a_feature_can_still_be_named_time(tmp_path):
    from flexshard_stream.sources.logs import LogReader
    log = tmp_path / "log.parquet"
    pl.DataFrame({"item": [1, 2], "time": [5, 6], "when": [1.5, 2.5]}).write_parquet(log)
    r = LogReader([str(log)], ts_column="when")
    assert r.schema.keys == ("item", "time") and next(iter(r)).timestamp.tolist() == [1.5, 2.5]
    r = LogReader([str(log)], features=["item", "time"])       # asked for as IDs: IDs
    assert r.schema.keys == ("item", "time") and r.schema.ts_column is None


def test_ts_flag_names_the_time_column_of_stats_tables_and_plan(tmp_path):
    import json
    log = tmp_path / "log.parquet"
    n = 400
    pl.DataFrame({"item": np.arange(n) % 37, "when": 1_700_000_000 + np.arange(n)}
                 ).write_parquet(log)                       # integer seconds: IDs by their type
    for argv in (["stats", str(log), "--json"], ["tables", str(log), "--json"]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0 and '"when"' in r.output, r.output          # without: a table
        r = CliRunner().invoke(app, argv + ["--ts", "when"])
        assert r.exit_code == 0 and '"when"' not in r.output, r.output
    r = CliRunner().invoke(app, ["plan", "--log", str(log), "--topology", "1x2", "--ts", "when",
                                 "--batch-size", "8", "--out", str(tmp_path / "p"), "--json"])
    assert r.exit_code == 0, r.output
    assert [t["table"] for t in json.loads(r.output.strip().splitlines()[-1])["tables"]] == \
        ["item"]


@pytest.mark.parametrize("engine,evaluation", [("local", "trace"), ("process", "analytic")])
def test_replay_ts_names_the_time_column_for_duration_windows(tmp_path, engine, evaluation):
    log = tmp_path / "log.parquet"
    n = 800
    rng = np.random.default_rng(1)
    pl.DataFrame({"item": rng.zipf(1.3, n) % 97, "when": 1_700_000_000 + np.arange(n) // 4}
                 ).write_parquet(log)
    argv = ["replay", str(log), "--topology", "1x2", "--batch-size", "8", "--window", "50s",
            "--engine", engine, "--evaluation", evaluation, "--workers", "2", "--json",
            "--out", str(tmp_path / "o")]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and "duration" in r.output, r.output      # `when` is read as IDs
    r = CliRunner().invoke(app, argv + ["--ts", "when"])
    assert r.exit_code == 0, r.output
    import json
    assert json.loads(r.output.strip().splitlines()[-1])["totals"]["windows"] == 4


def test_the_sidecar_accepts_its_own_group_writable_directory(tmp_path):
    """A umask of 002 (one private group per user) leaves g+w on the directories the sidecar
    makes: its own group, so the next start still takes them."""
    import os
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o775)
    os.chown(out, os.geteuid(), os.getegid())
    _sidecar(out).close()
    _sidecar(out, resume=True).close()
    os.chown(out, os.geteuid(), os.getegid() + 4242)               # another group: refused
    from flexshard_stream.errors import ConfigError
    with pytest.raises(ConfigError, match="others can write into it"):
        _sidecar(out, resume=True)
