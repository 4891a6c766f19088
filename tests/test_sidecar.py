"""The statistics sidecar: queue policies and counters, errors, publishing, checkpoints and restart
in process; real processes over the shared-memory ring (kill -9 and restart, SIGTERM, SIGINT).

No timing asserts: waits poll with generous deadlines (the machine is shared)."""
import importlib
import json
import math
import os
import queue
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FakeKJT

from flexshard_stream.errors import BatchError, ConfigError
from flexshard_stream.formats.files import KIND_MARKER
from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.sidecar import (
    Sidecar,
    SidecarError,
    SidecarWarning,
    list_checkpoints,
    read_checkpoint,
    to_batch,
)
from flexshard_stream.plans.delta import PlanDelta, plan_fingerprint
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import EmbeddingTable, save_tables
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources.ring import Ring, ring_path
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.stream import StreamStats
from flexshard_stream.testing import check_plan

ROOT = Path(__file__).resolve().parent.parent
H = 2000
TABLES = [EmbeddingTable("a", H, 32, optimizer_state_bytes=4), EmbeddingTable("b", H, 16)]
TOPO = Topology.uniform(2, 2)
B = 16
# no pause per delta: the few iterations of these tests could never pay the default one (issue
# 14); they test publishing, not whether a move pays
CFG = ReshardConfig(check_every=4, top_k=128, pause_s=0.0)
WAIT = 120.0  # seconds: generous, the machine is loaded


def make_batch(rng, n=64, alpha=1.2):
    ids = np.concatenate([np.minimum(rng.zipf(alpha, n), H) - 1 for _ in TABLES])
    return Batch(["a", "b"], ids, np.ones(len(TABLES) * n, np.int64))


def wait_until(cond, what, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def sidecar(out, **kw):
    kw.setdefault("config", CFG)
    kw.setdefault("checkpoint_every_s", None)
    return Sidecar(TABLES, TOPO, B, out_dir=out, **kw)


class GatedStats(StreamStats):
    """Statistics whose update waits for a gate: blocks the ingest thread on purpose."""

    def __init__(self, gate, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = gate

    def update(self, batch):
        assert self.gate.wait(WAIT)
        return super().update(batch)


def gated(gate):
    return GatedStats(gate, {t.name: t.num_rows for t in TABLES})


# ----------------------------------------------------------------------- publishing


def test_publishes_plans_and_deltas_atomically_and_calls_the_callback(tmp_path):
    calls = []
    rng = np.random.default_rng(0)
    with sidecar(tmp_path, callback=lambda d, p: calls.append((d, p)), keep_plans=100) as sc:
        for _ in range(40):
            assert sc.submit(make_batch(rng))
        assert sc.flush(WAIT)
        st = sc.stats()
        final = sc.plan
    assert st.accepted == st.processed == st.batches_in_stats == 40 and st.dropped == 0
    assert calls, "skewed batches move the plan off row-wise"
    assert all(d.delta is not None for d, _ in calls)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["seq"] == len(calls) == st.plans_published == st.plan_seq
    published = Plan.load(tmp_path / "plan")          # the symlink to plans/NNNNNN
    assert published == final == calls[-1][1]
    assert plan_fingerprint(published) == state["plan_fingerprint"]
    assert check_plan(published) == []
    # the deltas, applied in order to plan 0, give every published plan
    plan = Plan.load(tmp_path / "plans" / "000000")
    for seq in range(1, state["seq"] + 1):
        plan = PlanDelta.load(tmp_path / "deltas" / f"{seq:06d}.delta").apply(plan)
        assert plan == Plan.load(tmp_path / "plans" / f"{seq:06d}")
    assert plan == published
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert len(lines) == st.checks >= len(calls)
    assert list_checkpoints(tmp_path)  # the final checkpoint
    assert not [p for p in tmp_path.rglob(".*")
                if p.name not in (".lock", KIND_MARKER)]  # no temp files left


# ----------------------------------------------------------------------- queue policies


def test_drop_policy_bounds_the_queue_and_counts_exactly(tmp_path):
    gate = threading.Event()
    rng = np.random.default_rng(1)
    batches = [make_batch(rng, n=50) for _ in range(50)]        # 100 IDs each
    sc = sidecar(tmp_path, stats=gated(gate), queue_batches=4)
    try:
        assert sc.submit(batches[0])
        wait_until(lambda: sc.stats().queued_batches == 0, "the worker to take batch 0")
        results = [sc.submit(b) for b in batches[1:]]         # worker blocked: 4 fit
        st = sc.stats()
        assert results == [True] * 4 + [False] * 45
        assert (st.submitted, st.accepted, st.dropped) == (50, 5, 45)
        assert st.dropped_ids == 45 * 100 and st.accepted_ids == 5 * 100
        assert st.queued_batches == st.max_queued_batches == 4 and st.lag_s >= 0
        gate.set()
        assert sc.flush(WAIT)
        st = sc.stats()
        assert st.accepted + st.dropped == st.submitted == 50
        assert st.processed == st.accepted == st.batches_in_stats == 5
        assert st.max_queued_batches <= 4 and st.queued_batches == 0 and st.lag_s == 0
        assert sc.stats_object.batches == 5
    finally:
        gate.set()
        sc.close()


def test_queue_is_bounded_in_ids_and_bytes(tmp_path):
    gate = threading.Event()
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, n=150) for _ in range(30)]       # 300 IDs, 4800 bytes each
    sc = sidecar(tmp_path, stats=gated(gate), queue_batches=64, queue_ids=1000,
                 queue_bytes=12_000)
    try:
        assert sc.submit(batches[0])
        wait_until(lambda: sc.stats().queued_batches == 0, "the worker to take batch 0")
        results = [sc.submit(b) for b in batches[1:]]
        st = sc.stats()
        assert sum(results) == 2      # 2 x 4800 bytes <= 12000 < 3 x 4800; 900 IDs <= 1000
        assert st.max_queued_ids <= 1000 and st.max_queued_bytes <= 12_000
        gate.set()
        assert sc.flush(WAIT)
        st = sc.stats()
        assert st.accepted + st.dropped == st.submitted == 30
        assert st.processed == st.accepted == 3
    finally:
        gate.set()
        sc.close()


def test_block_policy_waits_then_times_out_or_proceeds(tmp_path):
    gate = threading.Event()
    rng = np.random.default_rng(3)
    sc = sidecar(tmp_path, stats=gated(gate), queue_batches=2, policy="block",
                 block_timeout=0.2)
    try:
        assert sc.submit(make_batch(rng))
        wait_until(lambda: sc.stats().queued_batches == 0, "the worker to take batch 0")
        assert sc.submit(make_batch(rng)) and sc.submit(make_batch(rng))
        t0 = time.monotonic()
        assert not sc.submit(make_batch(rng))   # full: waited block_timeout, then dropped
        assert time.monotonic() - t0 >= 0.19
        st = sc.stats()
        assert (st.accepted, st.dropped) == (3, 1) and st.blocked_s >= 0.19
        result = []
        th = threading.Thread(target=lambda: result.append(sc.submit(make_batch(rng),
                                                                     timeout=None)))
        th.start()
        th.join(0.3)
        assert th.is_alive() and not result  # blocked: the worker is gated
        gate.set()
        th.join(WAIT)
        assert result == [True]
        assert sc.flush(WAIT)
        st = sc.stats()
        assert st.processed == st.accepted == 4 and st.submitted == 5
        assert st.max_queued_batches <= 2
    finally:
        gate.set()
        sc.close()


# ----------------------------------------------------------------------- errors


def test_worker_errors_surface_on_the_next_call(tmp_path):
    rng = np.random.default_rng(4)
    sc = sidecar(tmp_path)
    bad = Batch(["a", "b"], [1, H + 5], [1, 1])         # ID out of range for table b
    assert sc.submit(bad)                               # validated in the worker, not here
    wait_until(lambda: sc.stats().errors == 1, "the worker to reject the batch")
    with pytest.raises(SidecarError, match="out of range") as ei:
        sc.submit(make_batch(rng))
    assert isinstance(ei.value.__cause__, BatchError)
    assert sc.stats().submitted == 1                    # the raising call submitted nothing
    assert sc.submit(make_batch(rng)) and sc.flush(WAIT)  # reported once, then goes on
    st = sc.stats()
    assert (st.rejected, st.processed, st.batches_in_stats) == (1, 2, 1)

    def boom(decision, plan):
        raise RuntimeError("callback boom")
    sc.callback = boom
    for _ in range(40):
        sc.submit(make_batch(rng, alpha=1.5))
    with pytest.raises(SidecarError, match="callback boom"):
        sc.flush(WAIT)
    assert sc.stats().plans_published >= 1   # published before the callback ran
    sc.submit(bad)
    wait_until(lambda: sc.stats().rejected == 2, "the second rejection")
    with pytest.raises(SidecarError, match="out of range"):
        sc.close()                               # surfaces after shutting down
    assert list_checkpoints(tmp_path)            # the final checkpoint was still written
    with pytest.raises(SidecarError, match="closed"):
        sc.submit(make_batch(rng))


def test_a_failed_publication_is_reported_then_retried(tmp_path):
    rng = np.random.default_rng(8)
    sc = sidecar(tmp_path)
    try:
        (tmp_path / "deltas").write_text("in the way")   # deltas/ cannot be created
        for _ in range(30):
            sc.submit(make_batch(rng, alpha=1.5))
        with pytest.raises(SidecarError, match="publishing"):
            sc.flush(WAIT)
        assert sc.stats().plans_published == 0 and sc.plan != Plan.load(tmp_path / "plan")
        (tmp_path / "deltas").unlink()
        for _ in range(8):                                  # the next check publishes
            sc.submit(make_batch(rng, alpha=1.5))
        assert sc.flush(WAIT)
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["seq"] == sc.stats().plans_published >= 1
        assert Plan.load(tmp_path / "plan") == sc.plan
        first = PlanDelta.load(tmp_path / "deltas" / "000001.delta")
        assert first.base_fingerprint == plan_fingerprint(Plan.load(tmp_path / "plans" /
                                                                    "000000"))
    finally:
        sc.close()


def test_out_dir_is_exclusive_and_not_silently_reused(tmp_path):
    sc = sidecar(tmp_path)
    with pytest.raises(ConfigError, match="in use"):
        sidecar(tmp_path)
    sc.close()
    with pytest.raises(ConfigError, match="resume=True"):
        sidecar(tmp_path)


# ----------------------------------------------------------------------- checkpoints


def _flip(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def decayed():
    """Decayed statistics (the sidecar's default before issue 14): their checkpoint is the one
    file stats/stats.fss that the damage tests flip."""
    from flexshard_stream.stats.config import TableConfig
    from flexshard_stream.stats.window import DecayedStats
    return DecayedStats([TableConfig(t.name, t.num_rows, t.feature) for t in TABLES],
                        half_life=4 * CFG.check_every, unit=CFG.unit)


@pytest.mark.parametrize("damage", ["stats/stats.fss", "manifest.json", "plan/plan.json"])
def test_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
    rng = np.random.default_rng(5)
    sc = sidecar(tmp_path, stats=decayed())
    for _ in range(10):
        sc.submit(make_batch(rng))
    sc.flush(WAIT)
    first = sc.checkpoint()
    kept = sc.stats_object.stats.to_bytes()
    for _ in range(7):
        sc.submit(make_batch(rng))
    sc.flush(WAIT)
    second = sc.checkpoint()
    sc.close(checkpoint=False)
    assert list_checkpoints(tmp_path) == [second, first]
    _flip(second / damage)
    with pytest.warns(SidecarWarning, match=rf"{second.name}.*{Path(damage).name}"):
        sc2 = sidecar(tmp_path, resume=True, stats=decayed())
    try:
        r = sc2.resume_report
        assert r.checkpoint == str(first) and r.batches_in_checkpoint == 10
        assert len(r.skipped) == 1 and Path(damage).name in r.skipped[0]
        assert (r.lost_batches, r.exact, r.source) == (7, True, "counters")  # clean shutdown
        assert "exactly 7 batches" in r.message
        assert sc2.stats_object.stats.to_bytes() == kept    # restored exactly
        assert sc2.stats().batches_in_stats == 10
        sc2.submit(make_batch(rng))
        sc2.flush(WAIT)
    finally:
        sc2.close()


def test_every_checkpoint_damaged_starts_empty_keeps_published_plan(tmp_path):
    rng = np.random.default_rng(6)
    with sidecar(tmp_path, stats=decayed()) as sc:
        for _ in range(30):
            sc.submit(make_batch(rng, alpha=1.5))
        sc.flush(WAIT)
        sc.checkpoint()
        seq = sc.stats().plan_seq
        plan = sc.plan
    ckpts = list_checkpoints(tmp_path)   # the final one is skipped: nothing new since
    for ck in ckpts:
        _flip(ck / "stats" / "stats.fss")
    with pytest.warns(SidecarWarning, match="no good checkpoint left"):
        sc2 = sidecar(tmp_path, resume=True, stats=decayed())
    try:
        r = sc2.resume_report
        assert r.checkpoint is None and len(r.skipped) == len(ckpts) >= 1
        assert r.lost_batches == 30 and "statistics start empty" in r.message
        assert r.plan_from == "published" and r.plan_seq == seq and sc2.plan == plan
        assert sc2.stats().batches_in_stats == 0
    finally:
        sc2.close()
    with pytest.raises(Exception, match="checksum"):
        read_checkpoint(ckpts[0])


def test_crash_before_close_counts_the_loss_from_the_counters_file(tmp_path):
    """An in-process 'crash': a child process submits, checkpoints, submits more, then
    os._exit(0)s without closing; the restart counts the batches accepted after the
    checkpoint from counters.json (a lower bound: written every counters_every_s)."""
    code = textwrap.dedent(f"""
        import os, sys, time, numpy as np
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_sidecar import sidecar, make_batch, wait_until
        rng = np.random.default_rng(7)
        sc = sidecar(sys.argv[1], counters_every_s=0.05)
        for _ in range(12):
            sc.submit(make_batch(rng))
        sc.flush(60); sc.checkpoint()
        for _ in range(9):
            sc.submit(make_batch(rng))
        sc.flush(60)
        c = sys.argv[1] + "/counters.json"
        wait_until(lambda: '"accepted": 21' in open(c).read(), "counters")
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=WAIT,
                   cwd=ROOT)
    sc = sidecar(tmp_path, resume=True)
    try:
        r = sc.resume_report
        assert r.batches_in_checkpoint == 12 and r.lost_batches == 9 and not r.exact
        assert "at least 9 batches" in r.message
    finally:
        sc.close()


def _legacy_layout(ckpt):
    """Rewrite a checkpoint's manifest as the sidecar wrote it before the state protocol: no
    version in the statistics' section, only the budget, migrated bytes and checks in the
    re-sharder's; the manifest checksum recomputed."""
    import hashlib
    path = ckpt / "manifest.json"
    m = json.loads(path.read_text())
    m["stats"].pop("version")
    m["resharder"] = {k: m["resharder"][k] for k in ("budget_bytes", "migrated_bytes", "checks")}
    body = {k: v for k, v in m.items() if k != "checksum"}
    m["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                                   .encode()).hexdigest()
    path.write_text(json.dumps(m, indent=1) + "\n")


@pytest.mark.parametrize("kind", ["decayed", "windowed", "stream"])
def test_checkpoints_of_the_earlier_layout_resume(tmp_path, kind):
    from flexshard_stream.stats.window import DecayedStats, WindowedStats
    sizes = {t.name: t.num_rows for t in TABLES}
    make = {"decayed": lambda: DecayedStats(sizes, half_life=8),
            "windowed": lambda: WindowedStats(sizes, window=12, slots=4),
            "stream": lambda: StreamStats(sizes)}[kind]
    rng = np.random.default_rng(11)
    with sidecar(tmp_path, stats=make()) as sc:
        for _ in range(30):
            sc.submit(make_batch(rng, alpha=1.5))
        sc.flush(WAIT)
        ckpt = sc.checkpoint()
        saved = sc.stats_object.state()
        checks, budget = sc.resharder.checks, sc.resharder.budget_bytes
    for old in list_checkpoints(tmp_path):
        _legacy_layout(old)
    sc2 = sidecar(tmp_path, stats=make(), resume=True)
    try:
        assert sc2.resume_report.checkpoint == str(ckpt)
        assert sc2.stats_object.state() == saved                 # restored exactly
        assert (sc2.resharder.checks, sc2.resharder.budget_bytes) == (checks, budget)
        assert sc2.stats().batches_in_stats == 30
    finally:
        sc2.close()


def test_the_ring_command_runs_from_the_cli_module():
    out = subprocess.run([sys.executable, "-m", "flexshard_stream.cli", "sidecar", "--help"],
                         capture_output=True, text=True, timeout=WAIT, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "--ring" in out.stdout and "--checkpoint-every" in out.stdout


# ----------------------------------------------------------------------- attach / convert


def test_attach_submits_every_item_and_converts(tmp_path):
    items = [FakeKJT(["a", "b"], [1, 2, 3], [1, 1, 0, 1]),
             {"a": np.array([4, 5]), "b": np.array([6, 7])},
             (np.zeros(3), FakeKJT(["a", "b"], [8], [1, 0]), "label"),
             Batch(["a"], [9, 9], [2])]
    with sidecar(tmp_path) as sc:
        wrapped = sc.attach(items)
        assert len(wrapped) == 4
        out = list(wrapped)
        assert out[0] is items[0] and out[2] is items[2]  # the loader's items, unchanged
        assert sc.flush(WAIT)
        st = sc.stats()
        assert (st.accepted, st.processed, st.accepted_ids) == (4, 4, 3 + 4 + 1 + 2)
    assert to_batch(items[1]).batch_size == 2
    with pytest.raises(TypeError, match="convert="):
        to_batch(object())


def _example(name):
    """Import examples/<name>.py by name (DataLoader workers may need to import it too)."""
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    return importlib.import_module(name)


def test_torch_dataloader_example(tmp_path):
    pytest.importorskip("torch")
    st = _example("torch_dataloader").main(["--out", str(tmp_path), "--steps", "20"])
    assert st.accepted == st.processed == 20 and st.dropped == 0


def test_torchrec_kjt_example(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchrec")
    st = _example("torchrec_kjt").main(["--out", str(tmp_path), "--steps", "20"])
    assert st.accepted == st.processed == 20 and st.dropped == 0


def test_ring_workers_example(tmp_path):
    pytest.importorskip("torch")
    ring = f"ex-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        done = _example("ring_workers").main(["--out", str(tmp_path), "--ring", ring,
                                              "--steps", "20", "--workers", "2"])
        assert done["event"] == "stopped" and done["batches_in_stats"] == 20
    finally:
        ring_path(ring).unlink(missing_ok=True)


# ----------------------------------------------------------------------- real processes


PRODUCER = textwrap.dedent("""
    import os, sys, time, numpy as np
    from flexshard_stream.stats.batch import Batch
    from flexshard_stream.sources.ring import Ring
    name, directory, seed, stop, H = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \\
        int(sys.argv[5])
    ring = Ring.attach(name, directory)
    p = ring.producer(block=True, timeout=300)
    rng = np.random.default_rng(seed)
    n = 0
    while not os.path.exists(stop) and n < 20000:
        ids = np.concatenate([np.minimum(rng.zipf(1.3, 64), H) - 1 for _ in range(2)])
        assert p.submit(Batch(["a", "b"], ids, np.ones(128, np.int64)))
        n += 1
        time.sleep(0.002)
    p.close()
    ring.close()
    print(n)
""")


class Proc:
    """A sidecar process whose JSON-lines stdout is read by a thread."""

    def __init__(self, args):
        self.p = subprocess.Popen([sys.executable, "-m", "flexshard_stream.cli", "sidecar", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=ROOT)
        self.events = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.events.put(json.loads(line))

    def event(self, kind):
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            try:
                ev = self.events.get(timeout=max(0.01, left))
            except queue.Empty:
                ev = None
            if ev is None or left <= 0:
                raise AssertionError(f"no {kind} event; exit {self.p.poll()}; stderr:\n"
                                     + "".join(self.err))
            if ev["event"] == kind:
                return ev

    def finish(self):
        self.p.wait(WAIT)
        return self.p.returncode


@pytest.fixture
def ring_setup(tmp_path):
    name = f"sc-{os.getpid()}-{secrets.token_hex(4)}"
    save_tables(TABLES, tmp_path / "tables.toml")
    TOPO.to_toml(tmp_path / "topo.toml")
    args = ["--ring", name, "--ring-dir", str(tmp_path), "--tables", str(tmp_path / "tables.toml"),
            "--topology", str(tmp_path / "topo.toml"), "--out", str(tmp_path / "out"),
            "--batch-size", str(B), "--check-every", "16", "--top-k", "128",
            "--checkpoint-every", "0.3", "--slots", "4", "--capacity-mb", "4"]
    procs = []
    yield name, tmp_path, args, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    try:
        os.unlink(ring_path(name, tmp_path))
    except FileNotFoundError:
        pass


def _manifests(out):
    found = {}
    for ck in list_checkpoints(out):
        try:
            found[str(ck)] = json.loads((ck / "manifest.json").read_text())
        except (OSError, ValueError):
            pass  # being pruned
    return found


def test_ring_sidecar_kill9_resumes_and_reports_exact_loss(ring_setup):
    name, tmp, args, procs = ring_setup
    out, stop = tmp / "out", tmp / "stop"
    a = Proc(args)
    procs.append(a.p)
    assert a.event("resume")["checkpoint"] is None
    a.event("ready")
    ring = Ring.attach(name, tmp)           # observer: stats() does not take the consumer role
    try:
        prods = [subprocess.Popen([sys.executable, "-c", PRODUCER, name, str(tmp), str(s),
                                   str(stop), str(H)], stdout=subprocess.PIPE, text=True,
                                  cwd=ROOT) for s in (1, 2)]
        procs += prods

        def mid_stream():
            ms = _manifests(out)
            if not ms:
                return False
            newest = max(m["source_batches"] for m in ms.values())
            return ring.stats().total.batches_read >= newest + 20
        wait_until(mid_stream, "a checkpoint and 20 more batches read")
        a.p.send_signal(signal.SIGKILL)
        assert a.finish() == -signal.SIGKILL
        read_at_kill = ring.stats().total.batches_read
        manifests = _manifests(out)             # before the restart can prune any

        b = Proc(args)
        procs.append(b.p)
        rep = b.event("resume")
        m = manifests[rep["checkpoint"]]
        assert rep["exact"] and rep["source"] == "ring"
        assert rep["lost_batches"] == read_at_kill - m["source_batches"] > 0
        assert rep["batches_in_checkpoint"] == m["batches"]
        assert f"exactly {rep['lost_batches']} batches" in rep["message"]
        b.event("ready")

        stop.touch()
        for p in prods:
            assert p.wait(WAIT) == 0
        written = ring.stats().total.batches_written
        assert sum(int(p.stdout.read()) for p in prods) == written
        wait_until(lambda: ring.stats().total.batches_read == written, "the ring to drain")
        b.p.send_signal(signal.SIGTERM)
        done = b.event("stopped")
        assert b.finish() == 0, "".join(b.err)
        assert done["signal"] == "SIGTERM" and done["errors"] == 0
        assert done["ring"]["batches_dropped"] == 0
        # every batch written is in the final statistics except exactly the reported loss
        assert done["batches_in_stats"] == written - rep["lost_batches"]
        final = json.loads((Path(done["checkpoint"]) / "manifest.json").read_text())
        assert final["batches"] == done["batches_in_stats"]
        assert final["source_batches"] == written
    finally:
        ring.close()
    plan = Plan.load(out / "plan")
    assert check_plan(plan) == []
    state = json.loads((out / "state.json").read_text())
    assert plan_fingerprint(plan) == state["plan_fingerprint"]


def test_ring_sidecar_sigint_is_a_clean_shutdown(ring_setup):
    name, tmp, args, procs = ring_setup
    c = Proc(args + ["--no-resume"])
    procs.append(c.p)
    c.event("ready")
    with Ring.attach(name, tmp) as ring, ring.producer() as p:
        rng = np.random.default_rng(9)
        for i in range(11):
            assert p.submit(make_batch(rng) if i != 5 else Batch(["a"], [H], [1]))  # 5: bad ID
        wait_until(lambda: ring.stats().total.batches_read == 11, "the sidecar to read")
    c.p.send_signal(signal.SIGINT)
    done = c.event("stopped")
    assert c.finish() == 0, "".join(c.err)
    assert done["signal"] == "SIGINT" and done["batches_in_stats"] == 10
    assert done["rejected"] == done["errors"] == 1 and "out of range" in "".join(c.err)
    m, plan, _, _ = read_checkpoint(done["checkpoint"])
    assert m["batches"] == 10 and check_plan(plan) == []


# ----------------------------------------------------------------------- sampling within a budget


def sketched():
    """Statistics of the two tables with unknown row counts: sketched, so sampling applies."""
    return StreamStats({t.name: None for t in TABLES})


def feed_until(sc, rng, cond, what, sent):
    """Submit batches (block policy) until ``cond()``; every ID submitted is appended to
    ``sent`` per table."""
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        b = make_batch(rng, n=2000)
        assert sc.submit(b)
        for i, key in enumerate(b.keys):
            sent.setdefault(key, []).append(b.values[i * 2000:(i + 1) * 2000])


def test_a_cpu_budget_samples_reports_the_rate_and_resumes_at_it(tmp_path, monkeypatch):
    """A budget no ingestion can meet (a millionth of a core) takes the rate to its maximum;
    the statistics, the counters, counters.json and the checkpoint all say so; the estimates
    still bound the truth; a restart goes on at the checkpoint's rate (with a budget) or rescales
    to the configured one (without)."""
    from flexshard_stream.online.sidecar.rate import RateController
    # an idle sidecar steps its rate down after 1.5 s (test_sampling covers that); under load the
    # flush and checkpoint below can take longer, so here the rate stays where the budget sent it
    monkeypatch.setattr(RateController, "_halved_load", lambda self, load: math.inf)
    rng = np.random.default_rng(11)
    sent: dict[str, list] = {}
    with sidecar(tmp_path, stats=sketched(), cpu_budget=1e-6, max_sample_k=8,
                 policy="block") as sc:
        feed_until(sc, rng, lambda: sc.stats().sample_k == 8, "the rate to reach 1 in 8", sent)
        assert sc.flush(WAIT)
        st = sc.stats()
        assert st.sample_k == sc.stats_object.config.sample_k == 8
        assert st.sample_k_changes >= 1 and st.cpu_budget == 1e-6
        assert st.cpu_s > 0 and st.ingest_threads == 1
        ckpt = sc.checkpoint(WAIT)
    counters = json.loads((tmp_path / "counters.json").read_text())
    assert counters["sample_k"] == sc.stats().sample_k == 8
    assert json.loads((ckpt / "manifest.json").read_text())["sampling"]["sample_k"] == 8
    stats = sc.stats_object
    for key, parts in sent.items():
        ids = np.concatenate(parts)
        table = stats[key]
        assert table.total == ids.size and table.config.sample_k == 8
        rows, counts = np.unique(ids, return_counts=True)
        top = np.argsort(-counts)[:100]
        _, lo, hi = table.bounds(rows[top])
        assert np.mean((lo <= counts[top]) & (counts[top] <= hi)) >= 0.95
    with sidecar(tmp_path, stats=sketched(), cpu_budget=1e-6, max_sample_k=8,
                 resume=True) as again:
        st = again.stats()    # the checkpoint's rate (idle since: any change is a halving)
        assert st.sample_k << st.sample_k_changes == 8
    fixed = sidecar(tmp_path, stats=sketched(), cpu_budget=None, resume=True)
    try:
        assert fixed.stats().sample_k == fixed.stats_object.config.sample_k == 1
        assert fixed.stats_object["a"].sample_variance == 7    # the 1-in-8 part keeps its bounds
        assert fixed.stats().cpu_budget is None
    finally:
        fixed.close()


def test_ingest_threads_give_the_statistics_of_one_thread(tmp_path):
    from test_sampling import assert_same_statistics
    rng = np.random.default_rng(12)
    batches = [make_batch(rng, n=3000) for _ in range(12)]
    results = []
    for threads in (1, 2):
        with sidecar(tmp_path / str(threads), stats=sketched(), cpu_budget=None,
                     ingest_threads=threads) as sc:
            for b in batches:
                assert sc.submit(b, block=True)
            assert sc.flush(WAIT)
            assert sc.stats().ingest_threads == threads
        results.append(sc.stats_object.to_bytes())
    assert_same_statistics(*results)


def test_the_ring_command_takes_a_cpu_budget():
    out = subprocess.run([sys.executable, "-m", "flexshard_stream.cli", "sidecar", "--help"],
                         capture_output=True, text=True, timeout=WAIT, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    assert "--cpu-budget" in out.stdout
