"""Output directories (issue 26): a user's file is never deleted, a replacement is atomic for
readers and kill -9 alike, one writer at a time, leftovers cleaned on the next run
(docs/FILES.md, "Directories: versions behind a pointer"). The writers killed, raced and read
from here run in their own processes (tests/dirs_worker.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flexshard_stream.bridge.export import (
    EXPORT_FILES,
    check_export_target,
    export_torchrec,
    load_torchrec_export,
)
from flexshard_stream.cli import app
from flexshard_stream.errors import ConfigError, FormatError
from flexshard_stream.formats.directories import (
    KIND_MARKER,
    VERSIONS_AREA,
    check_output_directory,
    directory_lock,
    read_directory,
    remove_output_directory,
    resolve_directory,
    staging_directory,
)
from flexshard_stream.online.replay import REPLAY_FILES, replay
from flexshard_stream.plans.plan import PLAN_FILES, Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dirs_worker import TOPO, leftovers, plan, read  # noqa: E402

WORKER = Path(__file__).resolve().parent / "dirs_worker.py"


def _worker(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _started(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "started", (line, proc.stderr.read() if proc.poll() else "")


def _finished(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _area(target: Path) -> Path:
    return target.parent / VERSIONS_AREA / target.name


# ------------------------------------------------------------------------- a user's files
def test_a_users_file_in_a_plan_directory_is_refused_by_name_and_kept(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)                                          # a real directory
    (d / "MY_NOTES.md").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds MY_NOTES\.md, which flexshard_stream did not"):
        plan(2).save(d)
    assert (d / "MY_NOTES.md").read_text() == "mine" and read("plan", d) == 1
    (d / "MY_NOTES.md").unlink()
    plan(2).save(d)                                          # now a version behind d
    (d / "drafts").mkdir()                                   # a folder, in a published version
    (d / "drafts" / "a.txt").write_text("mine too")
    (d / "t9.extra.npy").write_bytes(b"the plan's own name pattern: replaced")
    with pytest.raises(ConfigError, match=r"holds drafts/, which"):
        plan(3).save(d)
    assert (d / "drafts" / "a.txt").read_text() == "mine too" and read("plan", d) == 2
    assert (tmp_path / VERSIONS_AREA / "p" / "lock").is_file()
    assert not [p for p in os.listdir(_area(d)) if p.startswith("tmp-")]   # nothing left over


def test_cli_plan_out_refuses_a_users_file_and_says_which(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("a,b\n1,2\n3,4\n5,6\n")
    out = tmp_path / "plan"
    runner = CliRunner()
    args = ["plan", "--log", str(log), "--topology", "2x8", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    (out / "MY_NOTES.md").write_text("mine")
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "MY_NOTES.md" in r.output and "refusing" in r.output, r.output
    assert (out / "MY_NOTES.md").read_text() == "mine"
    (out / "MY_NOTES.md").unlink()
    assert runner.invoke(app, args).exit_code == 0 and Plan.load(out).tables


def test_exports_refuse_a_users_file(tmp_path):
    d = tmp_path / "x"
    export_torchrec(plan(1), d)
    export_torchrec(plan(2), d)                              # its own files: replaced
    assert read("export", d) == 2
    (d / "train.py").write_text("mine")
    for call in (lambda: check_export_target(d), lambda: export_torchrec(plan(3), d)):
        with pytest.raises(ConfigError, match=r"holds train\.py"):
            call()
    assert (d / "train.py").read_text() == "mine" and read("export", d) == 2
    assert set(EXPORT_FILES) >= {"torchrec_export.json", "sharding_plan.json"}


def _small_log(path: Path) -> Path:
    rng = np.random.default_rng(5)
    rows = ["ts,a,b"] + [f"{1.7e9 + i * 0.05:.2f},{min(int(rng.zipf(1.3)), 99)},"
                         f"{min(int(rng.zipf(1.2)), 499)}" for i in range(300)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_replay_replaces_its_own_and_the_reports_files_and_refuses_a_users(tmp_path):
    from flexshard_stream.report import PICTURES
    assert set(PICTURES) | {"report.html"} <= set(REPLAY_FILES)
    log, out = _small_log(tmp_path / "log.csv"), tmp_path / "out"
    replay(log, TOPO, window="5s", out_dir=out, batch_size=2, top_k=32)
    for name in ("report.html", *PICTURES):                 # as `report` writes them
        (out / name).write_bytes(b"drawn")
    replay(log, TOPO, window="5s", out_dir=out, batch_size=2, top_k=32)
    assert not (out / "report.html").exists() and resolve_directory(out) != out
    (next((out / "plans").iterdir()) / "why.txt").write_text("under plans/: the replay's own")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds notes\.txt"):
        replay(log, TOPO, window="5s", out_dir=out, batch_size=2, top_k=32)
    assert (out / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------- atomic for kill -9
@pytest.mark.parametrize("scenario", ["fresh", "migrate", "swap"])
def test_a_writer_killed_at_any_step_leaves_an_output_and_the_next_run_cleans_up(
        tmp_path, scenario):
    """SIGKILL just before each file-system change of a publication, in turn: a reader then
    loads the previous plan or the new one (nothing at all only when there was none), and the
    next write publishes and leaves no temporary, no record and at most two versions."""
    target = tmp_path / "out" / "p"
    target.parent.mkdir()
    r = subprocess.run([sys.executable, str(WORKER), "kill-points", scenario, str(target)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    points = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(points) >= {"fresh": 3, "migrate": 6, "swap": 4}[scenario]
    assert [p["killed"] for p in points] == [True] * (len(points) - 1) + [False]
    for p in points:
        fresh_and_empty = scenario == "fresh" and isinstance(p["seen"], str) \
            and "not a plan directory" in p["seen"]
        assert p["seen"] in p["allowed"] or fresh_and_empty, p
        assert p["after"] == 3 and p["leftovers"] == [], p
    assert any(p["seen"] == 2 for p in points[:-1])          # some kills came after the switch
    if scenario != "fresh":
        assert any(p["seen"] == 1 for p in points)            # and some before it


def test_kill_9_at_random_times_leaves_the_previous_output_loadable(tmp_path):
    """A writer (a forked child of the worker) killed with SIGKILL after a random time, 8 times:
    the output always loads, whole (the plan before the writer started, or one it wrote), and
    the next write leaves nothing behind."""
    target = tmp_path / "out" / "p"
    target.parent.mkdir()
    r = subprocess.run([sys.executable, str(WORKER), "random-kills", str(target), "8", "26"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rounds = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rounds) == 8
    for p in rounds:
        assert p["seen"] == p["round"] or (isinstance(p["seen"], int) and p["seen"] >= 1000), p
        assert p["after"] == 7 and p["leftovers"] == [], p


# ------------------------------------------------------------------------- readers and writers
@pytest.mark.parametrize("kind", ["plan", "export"])
def test_a_reader_never_fails_while_a_writer_rewrites(tmp_path, kind):
    d = tmp_path / "out"
    if kind == "plan":
        plan(1).save(d)                                       # a real directory: migrated first
    else:
        export_torchrec(plan(1), d)
    proc = _worker("write", kind, str(d), "30")
    _started(proc)
    seen, failures = [], []
    while proc.poll() is None or not seen:
        try:
            seen.append(read(kind, d))
        except (FormatError, AssertionError) as e:
            failures.append(str(e))
    result = _finished(proc)
    assert failures == [] and result["written"] == 30
    assert set(seen) <= {1} | set(range(1000, 1030)) and len(seen) > 1
    assert read(kind, d) == 1029 and leftovers(tmp_path, "out") == []


def test_read_directory_reads_again_when_its_version_was_removed(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)
    plan(2).save(d)
    dirs: list[Path] = []

    def slow_read(directory: Path) -> Plan:
        dirs.append(directory)
        if len(dirs) == 1:                   # two writes while this read is under way: the
            plan(3).save(d)                  # version it resolved is removed by the second
            plan(4).save(d)
        return Plan._load_from(directory)

    assert read_directory(d, slow_read).meta["v"] == 4
    assert len(dirs) == 2 and dirs[0] != dirs[1] and not dirs[0].exists()
    with pytest.raises(FormatError, match="not a plan directory"):    # no second chance when
        read_directory(tmp_path / "none", Plan._load_from)             # nothing moved


def test_a_second_writer_is_refused_with_the_path_and_the_holders_pid(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)
    with staging_directory(d, kind="plan", owns=PLAN_FILES) as tmp:
        with pytest.raises(ConfigError, match=rf"{d}: another process \(pid {os.getpid()}\) is "
                                              "writing it"):
            plan(2).save(d)
        proc = _worker("write", "plan", str(d), "1")          # another process, the same
        _started(proc)
        result = _finished(proc)
        assert result == {"written": 0, "refused": 1, "refusal": result["refusal"]}
        assert f"pid {os.getpid()}" in result["refusal"] and str(d) in result["refusal"]
        shutil.copytree(resolve_directory(d), tmp, dirs_exist_ok=True)   # the first one wins
    assert read("plan", d) == 1 and leftovers(tmp_path, "p") == []
    with directory_lock(d):                                   # report's lock: the same one
        with pytest.raises(ConfigError, match="is writing it"):
            plan(2).save(d)
    assert leftovers(tmp_path, "p") == []


def test_two_writers_at_once_one_wins_the_other_is_refused_nothing_leaks(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)
    procs = [_worker("write", "plan", str(d), "12") for _ in range(2)]
    for p in procs:
        _started(p)
    results = [_finished(p) for p in procs]
    assert sum(r["written"] for r in results) >= 1
    assert sum(r["written"] + r["refused"] for r in results) == 24
    for r in results:
        assert r["refusal"] is None or ("is writing it" in r["refusal"]
                                        and "pid " in r["refusal"])
    assert read("plan", d) >= 1000 and leftovers(tmp_path, "p") == []


# ------------------------------------------------------------------------- leftovers, layouts
def test_leftovers_of_interrupted_writes_are_cleaned_on_the_next_run(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)
    # what an earlier release left when killed between its two renames
    shutil.copytree(d, tmp_path / ".p.old.abcd_123" / "p")
    shutil.copytree(d, tmp_path / ".p.k2x9qq0z")
    (tmp_path / ".p.zzzzzzzz").mkdir()                       # a user's, by its content
    (tmp_path / ".p.zzzzzzzz" / "thesis.tex").write_text("years of work")
    plan(2).save(d)
    area = _area(d)
    # what this release leaves when killed: a temporary directory, a link, a record, a version
    (area / "tmp-99-abc").mkdir()
    (area / "tmp-99-abc" / "plan.json").write_text("{")
    os.symlink("nowhere", area / "link-99-ab")
    (area / ".publishing.x1y2z3.tmp").write_text("v0")
    shutil.copytree(resolve_directory(d), area / "v000042")
    plan(3).save(d)
    assert read("plan", d) == 3
    assert sorted(os.listdir(tmp_path)) == sorted([".p.zzzzzzzz", VERSIONS_AREA, "p"])
    assert sorted(os.listdir(area)) == ["lock", "v000002", "v000043"]
    assert (tmp_path / ".p.zzzzzzzz" / "thesis.tex").read_text() == "years of work"


def test_an_interrupted_switch_is_read_and_then_completed(tmp_path):
    """Killed between moving a real directory into the hidden area and linking the new
    version: nothing at the path, the record names the new version. Readers read it; the next
    writer (or report's lock) completes the switch."""
    d = tmp_path / "p"
    plan(2).save(tmp_path / "new")
    plan(1).save(d)
    area = _area(d)
    area.mkdir(parents=True)
    os.replace(tmp_path / "new", area / "v000002")
    (area / "publishing").write_text("v000002\n")
    os.replace(d, area / "v000001")
    assert not os.path.lexists(d) and read("plan", d) == 2
    check_output_directory(d, "plan", owns=PLAN_FILES)
    with directory_lock(d) as version:
        assert version == area / "v000002" and os.readlink(d) == f"{VERSIONS_AREA}/p/v000002"
    assert sorted(os.listdir(area)) == ["lock", "v000001", "v000002"]
    plan(3).save(d)
    assert read("plan", d) == 3 and sorted(os.listdir(area)) == ["lock", "v000002", "v000003"]


def test_a_damaged_record_never_names_a_path(tmp_path):
    d = tmp_path / "p"
    (tmp_path / "elsewhere").mkdir()
    plan(9).save(tmp_path / "elsewhere" / "p")
    area = _area(d)
    area.mkdir(parents=True)
    for text in ("../../elsewhere/p", "/etc", "v1", "v000002/..", ""):
        (area / "publishing").write_text(text)
        with pytest.raises(FormatError, match="not a plan directory"):
            Plan.load(d)
    plan(1).save(d)
    assert read("plan", d) == 1 and not (area / "publishing").exists()
    assert read("plan", tmp_path / "elsewhere" / "p") == 9


def test_a_plan_written_by_an_earlier_release_migrates_on_its_first_replacement(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)
    (d / KIND_MARKER).unlink()                                # as an earlier release wrote it
    doc = json.loads((d / "plan.json").read_text())
    del doc["checksum"]
    (d / "plan.json").write_text(json.dumps(doc))
    assert read("plan", d) == 1
    plan(2).save(d)
    assert os.readlink(d) == f"{VERSIONS_AREA}/p/v000002" and read("plan", d) == 2
    assert read("plan", _area(d) / "v000001") == 1           # kept for a reader that had it
    plan(3).save(d)
    assert sorted(os.listdir(_area(d))) == ["lock", "v000002", "v000003"]


def test_an_output_moved_with_mv_keeps_its_version(tmp_path):
    d = tmp_path / "p"
    plan(1).save(d)
    plan(2).save(d)
    os.rename(d, tmp_path / "p.bak")                          # the symlink, renamed
    for v in (3, 4, 5):
        plan(v).save(d)
    assert read("plan", tmp_path / "p.bak") == 2 and read("plan", d) == 5
    remove_output_directory(d)
    assert not os.path.lexists(d) and read("plan", tmp_path / "p.bak") == 2
    os.unlink(tmp_path / "p.bak")
    remove_output_directory(d)
    assert os.listdir(tmp_path) == []


def test_a_users_symlink_is_still_refused_and_followed_by_readers(tmp_path):
    real = tmp_path / "real"
    plan(1).save(real)
    os.symlink("real", tmp_path / "link")
    os.symlink(f"{VERSIONS_AREA}/link/../../real", tmp_path / "sly")   # not a version name
    assert read("plan", tmp_path / "link") == 1
    for name in ("link", "sly"):
        with pytest.raises(ConfigError, match="exists and is not a directory"):
            plan(2).save(tmp_path / name)
    assert read("plan", real) == 1
    with pytest.raises(ConfigError, match="not a name an output directory can have"):
        plan(2).save(tmp_path / VERSIONS_AREA)
