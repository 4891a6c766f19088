"""The shared-memory ring: real producer/consumer processes, kills, overload, permissions, damage."""
import os
import pickle
import secrets
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from flexshard_stream.errors import FormatError
from flexshard_stream.sources import ring as R
from flexshard_stream.sources.ring import (
    RecordTooLargeError,
    Ring,
    RingBusyError,
    RingCorruptionWarning,
    RingError,
    RingFormatError,
    RingPermissionError,
    ring_path,
)
from flexshard_stream.stats.batch import Batch

# One deterministic batch per (producer, seq); the first key names it, so a received batch says
# which one it is. Shared verbatim with the child processes.
GEN = '''
import numpy as np
from flexshard_stream.stats.batch import Batch

def make_batch(producer, seq, big=1):
    rng = np.random.default_rng([producer, seq])
    nk = 1 + seq % 3
    keys = [f"id_{producer}_{seq}"] + [f"f{k}\\u00e9" for k in range(1, nk)]
    bs = 0 if seq % 17 == 5 else int(rng.integers(1, 40 * big))
    lengths = rng.integers(0, 5, size=nk * bs)
    values = rng.integers(0, 1 << 62, size=int(lengths.sum()))
    weights = rng.random(values.size).astype(np.float32) if seq % 4 == 1 else None
    ts = None
    if seq % 4 == 2:
        ts = rng.random(bs) * 1e9
    elif seq % 4 == 3:
        ts = 1.7e9 + seq
    return Batch(keys, values, lengths, weights, ts)
'''
_ns: dict = {}
exec(GEN, _ns)  # noqa: S102 - the same source runs in the child processes
make_batch = _ns["make_batch"]

PRELUDE = GEN + '''
import os, sys, json, time
from flexshard_stream.sources.ring import Ring
'''


def ident(batch):
    _, p, s = batch.keys[0].split("_")
    return int(p), int(s)


def same(a, b):
    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None
                                             and np.array_equal(x, y))
    return (a.keys == b.keys and eq(a.values, b.values) and eq(a.lengths, b.lengths)
            and eq(a.weights, b.weights) and eq(a.timestamp, b.timestamp))


def check_intact(batch):
    p, s = ident(batch)
    assert same(batch, make_batch(p, s)), (p, s)
    return p, s


def spawn(code, *args):
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code),
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


@pytest.fixture
def name():
    n = f"test-{os.getpid()}-{secrets.token_hex(4)}"
    yield n
    for p in [ring_path(n)]:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


# ------------------------------------------------------------------------- in one process


def test_roundtrip_wraparound_and_stats(name):
    with Ring.create(name, slots=2, capacity_bytes=2 * 8192) as ring:
        assert ring.slot_capacity == 8192 and ring.capacity_bytes == 16384
        with ring.producer() as p:
            sent = [make_batch(0, s) for s in range(200)]
            sent += [Batch.empty(), Batch.empty(["x"])]
            got = []
            for b in sent:  # forces many wrap-arounds of an 8 KiB slot
                assert p.submit(b)
                got += ring.poll_records()
            assert len(got) == len(sent)
            for g, b in zip(got, sent):
                assert same(g.batch, b) and g.slot == p.slot
            assert [g.seq for g in got] == list(range(len(sent)))
            st = ring.stats()
            s = st.slots[p.slot]
            assert s.alive and s.owner_pid == os.getpid() and s.claims == 1
            assert s.batches_written == s.batches_read == len(sent)
            assert s.ids_written == s.ids_read == sum(b.num_values for b in sent)
            assert s.bytes_written == s.bytes_read == sum(g.nbytes for g in got)
            assert s.bytes_written > ring.slot_capacity  # wrapped
            assert s.lag_bytes == 0 and st.total.batches_dropped == 0
            assert st.consumer_alive and st.consumer_pid == os.getpid()
            assert R.memory_ordering() == "llvm"
        assert not ring.stats().slots[0].alive


def test_drop_when_full_block_timeout_and_too_large(name):
    with Ring.create(name, slots=1, capacity_bytes=8192) as ring, ring.producer() as p:
        b = Batch(["a"], np.arange(300), np.ones(300, np.int64))  # 4864-byte record
        assert p.submit(b) and not p.submit(b)
        t = time.monotonic()
        assert not p.submit(b, block=True, timeout=0.05)
        assert time.monotonic() - t >= 0.05
        s = ring.stats().slots[0]
        assert (s.batches_dropped, s.ids_dropped) == (2, 600)
        assert (p.submitted, p.accepted, p.dropped) == (3, 1, 2)
        with pytest.raises(RecordTooLargeError, match="capacity_bytes"):
            p.submit(Batch(["a"], np.arange(600), np.ones(600, np.int64)))
        assert p.submitted == 3  # an error is not a submission
        assert len(ring.poll()) == 1 and p.submit(b)
        with pytest.raises(TypeError):
            p.submit({"a": [1]})


def test_slots_busy_consumer_busy_exist_ok_pickle(name):
    ring = Ring.create(name, slots=2, capacity_bytes=2 * 4096)
    try:
        with pytest.raises(RingError, match="already exists"):
            Ring.create(name, slots=2, capacity_bytes=2 * 4096)
        with pytest.raises(RingError, match="slot capacity"):
            Ring.create(name, slots=4, capacity_bytes=4 * 4096, exist_ok=True)
        again = Ring.create(name, slots=2, capacity_bytes=2 * 4096, exist_ok=True)
        assert again.ring_id == ring.ring_id
        p1 = ring.producer()
        lazy = pickle.loads(pickle.dumps(p1))  # unclaimed copy, claims on first submit
        assert lazy.slot is None
        assert lazy.submit(make_batch(1, 0)) and {p1.slot, lazy.slot} == {0, 1}
        with pytest.raises(RingBusyError, match="slots"):
            ring.producer()
        lazy.close()
        p3 = ring.producer()  # the freed slot is claimed again
        assert p3.slot == lazy.slot and ring.stats().slots[p3.slot].claims == 2
        assert [ident(b) for b in ring.poll()] == [(1, 0)]
        with pytest.raises(RingBusyError, match="consumer"):
            again.poll()
        r2 = pickle.loads(pickle.dumps(ring))
        assert r2.ring_id == ring.ring_id and r2.stats().consumer_alive
        for x in (p1, p3, again, r2):
            x.close()
    finally:
        ring.close()
        ring.unlink()
    assert not ring_path(name).exists()
    with pytest.raises(RingError, match="no ring"):
        Ring.attach(name)
    with pytest.raises(R.ConfigError):
        Ring.create("../evil")


def test_fork_child_claims_its_own_slot(name):
    with Ring.create(name, slots=2, capacity_bytes=2 * 8192) as ring, ring.producer() as p:
        mine = p.slot
        pid = os.fork()
        if pid == 0:  # child: the inherited producer must not write into the parent's slot
            code = 2
            try:
                code = 0 if p.submit(make_batch(1, 0)) and p.slot != mine else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert p.slot == mine and p.submit(make_batch(0, 0))
        recs = ring.poll_records()
        assert sorted((r.slot == mine, check_intact(r.batch)) for r in recs) == \
            [(False, (1, 0)), (True, (0, 0))]


def test_permissions_0600_and_owner(name, tmp_path, monkeypatch):
    with Ring.create(name, slots=1, capacity_bytes=4096) as ring:
        st = os.stat(ring.path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        assert ring.path.parent == R._default_directory()
    path = ring_path(name)
    os.chmod(path, 0o644)
    with pytest.raises(RingPermissionError, match="0o644"):
        Ring.attach(name)
    os.chmod(path, 0o600)
    monkeypatch.setattr(R, "_euid", lambda: os.geteuid() + 4242)  # as seen by another user
    with pytest.raises(RingPermissionError, match="belongs to uid"):
        Ring.attach(name)
    monkeypatch.undo()
    if os.geteuid() == 0:
        os.chown(path, 65534, -1)
        with pytest.raises(RingPermissionError, match="belongs to uid 65534"):
            Ring.attach(name)
        os.chown(path, 0, -1)
    link = ring_path("lnk-" + name, tmp_path)
    os.symlink(path, link)
    with pytest.raises(RingPermissionError, match="symbolic link"):
        Ring.attach("lnk-" + name, tmp_path)
    with Ring.create(name, slots=1, capacity_bytes=4096, directory=tmp_path) as r2:
        assert r2.path.parent == tmp_path and stat.S_IMODE(os.stat(r2.path).st_mode) == 0o600


@pytest.mark.parametrize("damage,match", [
    ("magic", "not a flexshard ring"),
    ("version", "version 7"),
    ("capacity", "damaged"),
    ("truncate", "truncated"),
    ("short", "shorter than"),
    ("foreign", "not a flexshard ring"),
])
def test_damaged_or_foreign_file(name, damage, match):
    Ring.create(name, slots=2, capacity_bytes=2 * 4096).close()
    path = ring_path(name)
    with open(path, "r+b") as f:
        if damage == "magic":
            f.write(b"XXXXXXXX")
        elif damage == "version":
            f.seek(8)
            f.write(struct.pack("<I", 7))
        elif damage == "capacity":
            f.seek(24)
            f.write(struct.pack("<Q", 8192))
        elif damage == "truncate":
            f.truncate(os.path.getsize(path) - 4096)
        elif damage == "short":
            f.truncate(100)
        else:
            f.write(os.urandom(os.path.getsize(path)))
    with pytest.raises(RingFormatError, match=match) as e:
        Ring.attach(name)
    assert isinstance(e.value, FormatError)


def test_damaged_records_are_discarded_and_counted(name):
    with Ring.create(name, slots=1, capacity_bytes=8192, checksum=True) as ring, \
            ring.producer() as p:
        bs = [make_batch(0, s) for s in range(4)]
        for b in bs[:3]:
            assert p.submit(b)
        recs = ring.poll_records(max_batches=1)
        n0, n1 = recs[0].nbytes, bs[1].num_values
        seg = ring._seg
        data = seg.data_off
        seg.u8[data + n0 + 64 + 24 + 1] ^= 0xFF  # a length of record 1: CRC catches it
        with pytest.warns(RingCorruptionWarning, match="CRC"):
            got = ring.poll()
        assert [ident(b) for b in got] == [(0, 2)] and n1 > 0
        assert ring.stats().slots[0].records_discarded == 1
        assert p.submit(bs[3])
        pos = ring.stats().slots[0].bytes_read % ring.slot_capacity
        seg.u8[data + pos] ^= 0xFF  # the tag of record 3: framing
        with pytest.warns(RingCorruptionWarning, match="framing"):
            assert ring.poll() == []
        s = ring.stats().slots[0]
        assert s.records_discarded == 2 and s.lag_bytes == 0
        assert p.submit(bs[0]) and same(ring.poll()[0], bs[0])  # the slot keeps working


# ---------------------------------------------------------------------- real processes


def test_producers_in_processes_exactly_once(name):
    n, nprod = 250, 3
    ring = Ring.create(name, slots=4, capacity_bytes=4 * 16384, checksum=True)
    procs = [spawn('''
        ring = Ring.attach(sys.argv[1])
        with ring.producer(block=True, timeout=20) as p:
            for s in range(int(sys.argv[3])):
                assert p.submit(make_batch(int(sys.argv[2]), s))
    ''', name, k, n) for k in range(nprod)]
    got, deadline = [], time.monotonic() + 30
    while len(got) < n * nprod and time.monotonic() < deadline:
        got += ring.poll(timeout=0.05)
    for proc in procs:
        finish(proc)
    got += ring.poll()
    ids = [check_intact(b) for b in got]
    assert sorted(ids) == [(k, s) for k in range(nprod) for s in range(n)]  # once each
    for k in range(nprod):  # per producer in order
        assert [s for p, s in ids if p == k] == list(range(n))
    st = ring.stats()
    assert st.total.batches_read == st.total.batches_written == n * nprod
    assert st.total.batches_dropped == 0 and st.total.lag_bytes == 0
    assert st.total.bytes_written > 10 * ring.capacity_bytes  # wrapped many times
    ring.close()
    ring.unlink()


def test_producer_killed_between_copy_and_publish(name):
    ring = Ring.create(name, slots=1, capacity_bytes=16384)
    proc = spawn('''
        from flexshard_stream.sources.ring import Producer
        import signal
        p = Ring.attach(sys.argv[1]).producer()
        for s in range(5):
            assert p.submit(make_batch(0, s))
        Producer._publish = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        p.submit(make_batch(0, 5))  # copied in, never published
    ''', name)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    recs = ring.poll_records()
    assert [r.seq for r in recs] == list(range(5))
    assert [check_intact(r.batch) for r in recs] == [(0, s) for s in range(5)]
    s = ring.stats().slots[0]
    assert not s.alive and s.lag_bytes == 0 and s.batches_written == 5
    with ring.producer() as p:  # the dead producer's slot is reclaimed
        for q in range(6, 9):
            assert p.submit(make_batch(0, q))
    recs = ring.poll_records()
    assert [r.seq for r in recs] == [5, 6, 7]  # the unpublished record left no trace
    assert [check_intact(r.batch) for r in recs] == [(0, 6), (0, 7), (0, 8)]
    assert ring.stats().slots[0].claims == 2
    ring.close()
    ring.unlink()


def test_producer_kill9_mid_stream(name):
    ring = Ring.create(name, slots=1, capacity_bytes=4 << 20)
    proc = spawn('''
        p = Ring.attach(sys.argv[1]).producer()
        s = 0
        while True:  # big records, so the kill most likely lands inside a copy
            p.submit(make_batch(0, s, big=100))
            s += 1
    ''', name)
    got = []
    while len(got) < 20:
        got += ring.poll_records(timeout=0.1)
        assert proc.poll() is None, proc.stderr.read()
    time.sleep(0.05 + 0.1 * np.random.default_rng().random())
    proc.kill()
    proc.wait(timeout=30)
    got += ring.poll_records()
    assert [r.seq for r in got] == list(range(len(got)))  # no gap, no tear, no duplicate
    for r in got:
        p, s = ident(r.batch)
        assert same(r.batch, make_batch(p, s, big=100))
    st = ring.stats().slots[0]
    assert not st.alive and st.lag_bytes == 0
    with ring.producer() as p:
        assert p.submit(make_batch(1, 0))
    (last,) = ring.poll_records()
    assert check_intact(last.batch) == (1, 0) and last.seq >= len(got)
    ring.close()
    ring.unlink()


def test_consumer_kill9_and_new_consumer_continues(name):
    n = 300
    ring = Ring.create(name, slots=2, capacity_bytes=2 * (1 << 19))
    p = ring.producer()
    for s in range(n):
        assert p.submit(make_batch(0, s))
    c1 = spawn('''
        ring = Ring.attach(sys.argv[1])
        while True:
            for b in ring.poll(max_batches=1):
                print(b.keys[0], flush=True)
            time.sleep(0.002)
    ''', name)
    lines = []

    def read():
        for line in c1.stdout:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 20
    while len(lines) < 50:
        assert c1.poll() is None and time.monotonic() < deadline, "consumer c1 stalled"
        time.sleep(0.01)
    with pytest.raises(RingBusyError, match="consumer"):
        Ring.attach(name).poll()  # c1 is alive
    assert ring.stats().consumer_pid == c1.pid and ring.stats().consumer_alive
    c1.kill()
    c1.wait(timeout=30)
    reader.join(timeout=10)
    logged = [int(x.split("_")[2]) for x in lines]
    assert logged == list(range(len(logged)))
    assert not ring.stats().consumer_alive
    for s in range(n, n + 20):  # producers go on while there is no consumer
        assert p.submit(make_batch(0, s))
    c2 = Ring.attach(name)
    got = [check_intact(r.batch) for r in c2.poll_records()]
    k = got[0][1]
    assert len(logged) <= k <= len(logged) + 1  # at most the one record c1 held when killed
    assert got == [(0, s) for s in range(k, n + 20)]
    assert c2.stats().total.batches_read in (n + 20, n + 19)
    for x in (p, c2, ring):
        x.close()
    ring.unlink()


def test_overload_bounded_memory_and_exact_drops(name):
    n, nprod = 1500, 2
    ring = Ring.create(name, slots=2, capacity_bytes=2 * 8192)
    size = os.path.getsize(ring.path)
    procs = [spawn('''
        ring = Ring.attach(sys.argv[1])
        p = ring.producer()
        for s in range(int(sys.argv[3])):
            p.submit(make_batch(int(sys.argv[2]), s))
        print(json.dumps(dict(slot=p.slot, submitted=p.submitted, accepted=p.accepted,
                              dropped=p.dropped)))
    ''', name, k, n) for k in range(nprod)]
    got, max_lag = [], 0
    while any(proc.poll() is None for proc in procs):
        time.sleep(0.005)  # a slow consumer
        got += ring.poll(max_batches=3)
        max_lag = max(max_lag, max(s.lag_bytes for s in ring.stats().slots))
    reports = [__import__("json").loads(finish(proc)) for proc in procs]
    got += ring.poll()
    ids = [check_intact(b) for b in got]
    st = ring.stats()
    # a producer that finishes releases its slot, and a later one may claim the same slot: the
    # slot's counters are the sums over the producers that used it
    by_slot: dict = {}
    dropped_ids = {}
    for k, rep in enumerate(reports):
        mine = [s for p, s in ids if p == k]
        assert mine == sorted(set(mine))  # in order, no duplicates
        assert rep["submitted"] == n
        assert len(mine) == rep["accepted"]
        assert len(mine) + rep["dropped"] == n  # received + dropped == submitted
        dropped_ids[k] = sum(make_batch(k, s).num_values for s in set(range(n)) - set(mine))
        by_slot.setdefault(rep["slot"], []).append(k)
    for i, ks in by_slot.items():
        slot = st.slots[i]
        accepted = sum(reports[k]["accepted"] for k in ks)
        assert accepted == slot.batches_written == slot.batches_read
        assert sum(reports[k]["dropped"] for k in ks) == slot.batches_dropped > 0
        assert slot.ids_dropped == sum(dropped_ids[k] for k in ks)
    assert max_lag <= ring.slot_capacity
    fst = os.stat(ring.path)
    assert fst.st_size == size and fst.st_blocks * 512 <= size + 4096  # fixed memory
    ring.close()
    ring.unlink()


def test_throughput_smoke():
    assert R.ring_throughput(0.3, batch_ids=4096, capacity_bytes=1 << 20) > 0
