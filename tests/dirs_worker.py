"""Writers for tests/test_directories.py, run in their own processes (killed, raced, read from).

``python tests/dirs_worker.py write KIND DIR N`` writes N plans (or exports, KIND ``export``) at
DIR, numbered from 1000, printing ``started`` first and, at the end, one JSON line: how many were
written and how many were refused because another writer held the lock (with the first message).
Any other exception is a traceback and exit status 1.

``python tests/dirs_worker.py kill-points SCENARIO DIR`` publishes a plan at DIR once per
file-system change the publication makes, in a forked child killed with SIGKILL just before the
k-th change (k = 1, 2, ... until a child finishes), and prints one JSON line per k: whether the
child was killed, what a reader then loaded, and what the next write left behind. SCENARIO:
``fresh`` (nothing at DIR), ``migrate`` (a real directory at DIR), ``swap`` (a published version).

``python tests/dirs_worker.py random-kills DIR ROUNDS SEED`` kills a forked writer of DIR at a
random time per round and prints one JSON line per round: what a reader then loaded, what the
next write left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flexshard_stream.bridge.export import export_torchrec, load_torchrec_export  # noqa: E402
from flexshard_stream.errors import ConfigError, FlexShardError  # noqa: E402
from flexshard_stream.formats import directories  # noqa: E402
from flexshard_stream.formats.directories import VERSIONS_AREA  # noqa: E402
from flexshard_stream.placement.baselines import row_wise  # noqa: E402
from flexshard_stream.plans.plan import Plan  # noqa: E402
from flexshard_stream.plans.tables import EmbeddingTable  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402

TOPO = Topology.uniform(1, 2, hbm_bytes_per_gpu=1e9)
#: The file-system calls a publication makes (counted, and killed before, by ``kill-points``;
#: ``shutil.rmtree`` too, as one).
FS_CALLS = ("replace", "rename", "symlink", "unlink", "rmdir", "mkdir")


def plan(v: int) -> Plan:
    """Plan number ``v``: tables of ``50 + v`` and ``30 + v`` rows, ``meta["v"] == v`` (an
    export records the rows, a plan both)."""
    base = row_wise([EmbeddingTable("a", 50 + v, 4), EmbeddingTable("b", 30 + v, 8)], TOPO)
    return Plan(base.strategy, TOPO, list(base.tables.values()), {"v": v})


def write(kind: str, target: Path, v: int) -> None:
    """Write plan ``v`` at ``target`` as a plan directory or as an export."""
    if kind == "plan":
        plan(v).save(target)
    else:
        export_torchrec(plan(v), target)


def read(kind: str, target: Path) -> int:
    """The number of the plan (or export) at ``target``, checked whole against that plan (a mix
    of two versions would not pass); a project error when none loads."""
    if kind == "plan":
        got = Plan.load(target)
        v = int(got.meta["v"])
        if got != plan(v):
            raise AssertionError(f"{target}: plan {v} read back different")
        return v
    ex = load_torchrec_export(target)
    rows = [e["source_table"]["num_rows"] for e in ex.manifest["tables"]]
    if len(rows) != 2 or rows[0] - 50 != rows[1] - 30:
        raise AssertionError(f"{target}: an export of a mix of plans: table rows {rows}")
    return rows[0] - 50


def leftovers(parent: Path, name: str) -> list[str]:
    """What the parent and the output's hidden area hold beyond the output, its lock and at
    most two versions: ``[]`` when a write cleaned up."""
    out = [p for p in os.listdir(parent) if p not in (name, VERSIONS_AREA)]
    area = parent / VERSIONS_AREA / name
    if area.is_dir():
        inside = sorted(os.listdir(area))
        versions = [p for p in inside if re.fullmatch(r"v[0-9]{6,12}", p)]
        out += [f"{VERSIONS_AREA}/{name}/{p}" for p in inside if p != "lock" and p not in versions]
        if len(versions) > 2:
            out.append(f"{len(versions)} versions: {versions}")
    return out


# ---------------------------------------------------------------------------------- write
def write_main(kind: str, target: Path, n: int) -> int:
    written, refused, first = 0, 0, None
    print("started", flush=True)
    for j in range(n):
        try:
            write(kind, target, 1000 + j)
            written += 1
        except ConfigError as e:
            if "is writing it" not in str(e):
                raise
            refused += 1
            first = first or str(e)
    print(json.dumps({"written": written, "refused": refused, "refusal": first}), flush=True)
    return 0


# ---------------------------------------------------------------------------------- kill points
def _prepare(scenario: str, target: Path) -> set[int]:
    """Reset ``target``'s parent to the scenario; the plan numbers a reader may then see."""
    parent = target.parent
    for p in parent.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if scenario == "fresh":
        return {2}
    plan(1).save(target)                       # a real directory
    if scenario == "migrate":
        return {1, 2}
    plan(1).save(target)                       # now a published version
    return {1, 2}


def _killed_child(target: Path, k: int) -> bool:
    """Publish plan 2 at ``target`` in a child killed just before its k-th file-system change
    while publishing; True when killed, False when it finished first."""
    pid = os.fork()
    if pid == 0:
        try:
            count, armed = [0], [False]

            def counting(fn):
                def wrapped(*a, **kw):
                    if armed[0]:
                        count[0] += 1
                        if count[0] == k:
                            os.kill(os.getpid(), signal.SIGKILL)
                    return fn(*a, **kw)
                return wrapped
            for name in FS_CALLS:
                setattr(os, name, counting(getattr(os, name)))
            rmtree = shutil.rmtree

            def one_step_rmtree(*a, **kw):         # a removal is one step (not one per file)
                was, armed[0] = armed[0], False
                try:
                    return rmtree(*a, **kw)
                finally:
                    armed[0] = was
            shutil.rmtree = counting(one_step_rmtree)
            publish = directories._publish

            def armed_publish(*a, **kw):
                armed[0] = True
                return publish(*a, **kw)
            directories._publish = armed_publish
            plan(2).save(target)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return False
    raise AssertionError(f"child at k={k} ended with status {status}")


def kill_points_main(scenario: str, target: Path) -> int:
    for k in range(1, 400):
        allowed = _prepare(scenario, target)
        killed = _killed_child(target, k)
        try:
            seen: object = read("plan", target)
        except FlexShardError as e:
            seen = f"{type(e).__name__}: {e}"
        plan(3).save(target)                   # the next run: cleans up
        print(json.dumps({"k": k, "killed": killed, "seen": seen, "allowed": sorted(allowed),
                          "after": read("plan", target),
                          "leftovers": leftovers(target.parent, target.name)}), flush=True)
        if not killed:
            return 0
    return 1


# ---------------------------------------------------------------------------------- random kills
def random_kills_main(target: Path, rounds: int, seed: int) -> int:
    """Per round: plan ``r`` published at ``target`` (a real directory every other round), a
    forked child writing plans 1000, 1001, ... there without end, SIGKILL after a random time;
    one JSON line: what a reader then loaded, what the next write left behind."""
    import time

    import numpy as np
    rng = np.random.default_rng(seed)
    for r in range(rounds):
        if r % 2 == 0:
            directories.remove_output_directory(target)
        plan(r).save(target)
        pid = os.fork()
        if pid == 0:
            try:
                for j in range(10**9):
                    plan(1000 + j).save(target)
            finally:
                os._exit(3)
        time.sleep(float(rng.uniform(0.0, 0.4)))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            seen: object = read("plan", target)
        except FlexShardError as e:
            seen = f"{type(e).__name__}: {e}"
        plan(7).save(target)
        print(json.dumps({"round": r, "seen": seen, "after": read("plan", target),
                          "leftovers": leftovers(target.parent, target.name)}), flush=True)
    return 0


if __name__ == "__main__":
    try:
        if sys.argv[1] == "write":
            sys.exit(write_main(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])))
        if sys.argv[1] == "kill-points":
            sys.exit(kill_points_main(sys.argv[2], Path(sys.argv[3])))
        if sys.argv[1] == "random-kills":
            sys.exit(random_kills_main(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    print(__doc__)
    sys.exit(2)
