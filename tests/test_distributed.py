"""Distributed windowed statistics (local / process / Ray), snapshots and their merge, the merge
command, planning on merged statistics, and the DataSketches images."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import zipf_stream

from flexshard_stream import (
    Batch,
    ConfigError,
    FormatError,
    IncompatibleError,
    LogError,
    SketchConfig,
    StreamStats,
)
from flexshard_stream.sources.distributed import (
    export_datasketches,
    hll_image,
    load_snapshot,
    load_stats,
    merge_snapshots,
    parse_window,
    save_snapshot,
    window_stats,
)
from flexshard_stream.sources.logs import read_log

CFG = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, hh_lg_size=4, hll_p=8)  # purges past 48 rows
TABLES = {"a": None, "b": None, "c": 300}        # a, b sketched (heavy hitters purge), c exact
EXACT = {"a": 4000, "b": 2000, "c": 300}         # every table counted exactly
FILES, PER_FILE, ROW_GROUP = 4, 3000, 750
DT = 0.01                                        # seconds between samples


def _table(rng, n, seed, t0, shuffle=False):
    lens = rng.integers(0, 6, n)
    a = zipf_stream(int(lens.sum()), 4000, 1.2, seed)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    tab = pa.table({"ts": (t0 + np.arange(n)) * DT,
                    "a": pa.ListArray.from_arrays(pa.array(off), pa.array(a)),
                    "b": zipf_stream(n, 2000, 1.3, seed + 100),
                    "c": rng.integers(0, 300, n)})
    return tab.take(pa.array(rng.permutation(n))) if shuffle else tab


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """Four parquet files of 3,000 samples (row groups of 750); file 2 has shuffled rows (its
    timestamps are out of order)."""
    d = tmp_path_factory.mktemp("logs")
    rng = np.random.default_rng(7)
    paths = []
    for f in range(FILES):
        p = d / f"part-{f}.parquet"
        pq.write_table(_table(rng, PER_FILE, f, f * PER_FILE, shuffle=f == 2), p,
                       row_group_size=ROW_GROUP)
        paths.append(str(p))
    return paths


def single_pass(paths, unit, size, tables=TABLES, skip_bad_rows=False):
    """Reference: the same batches read in order, each sample fed to its window's StreamStats.
    Returns ``{window: (StreamStats, {feature: ids})}``."""
    bs = list(read_log(paths, read_batch_size=1000, skip_bad_rows=skip_bad_rows))
    origin = min(float(b.timestamp.min()) for b in bs)
    out, seen = {}, 0
    for b in bs:
        n = b.batch_size
        if unit == "seconds":
            w = np.floor((b.timestamp - origin) / size).astype(np.int64)
        else:
            w = (seen + np.arange(n)) // size
        seen += n
        for u in np.unique(w):
            m = w == u
            vals = {k: b.feature_values(k)[np.repeat(m, b.feature_lengths(k))] for k in b.keys}
            piece = Batch.from_features(vals, {k: b.feature_lengths(k)[m] for k in b.keys},
                                        timestamp=b.timestamp[m])
            st, ids = out.setdefault(int(u), (StreamStats(tables, CFG), {k: [] for k in b.keys}))
            st.update(piece)
            for k in b.keys:
                ids[k].append(vals[k])
    return {w: (st, {k: np.concatenate(v) for k, v in ids.items()})
            for w, (st, ids) in sorted(out.items())}


def assert_linear_equal(a: StreamStats, b: StreamStats):
    """Count-min counters, exact counts, HLL registers, totals: identical."""
    assert set(a) == set(b)
    for f in a:
        x, y = a[f], b[f]
        for arr in ("_cms", "_counts", "_hll"):
            assert np.array_equal(getattr(x, arr), getattr(y, arr)), (f, arr)
        assert (x.total, x.samples, x.max_id) == (y.total, y.samples, y.max_id), f
    assert (a.samples, a.ids) == (b.samples, b.ids)


def assert_heavy_hitters_within_bounds(st: StreamStats, ids: dict, parts: int):
    """Misra-Gries after merges: lower <= true <= upper for every row, and the a-posteriori error
    (offset) within the published bound N / (counters / 2), plus one of rounding per merged part."""
    for f, t in st.tables.items():
        if t.exact:
            continue
        v = ids[f]
        probe = np.arange(int(v.max()) + 2 if v.size else 1, dtype=np.int64)
        true = np.bincount(v, minlength=probe.size)
        _, lo, hi = t.bounds(probe)
        assert np.all(lo <= true) and np.all(true <= hi), f
        assert t.max_error <= v.size / (CFG.hh_capacity / 2) + parts, (f, t.max_error)


def assert_same_stats(a: StreamStats, b: StreamStats):
    """Every array equal, heavy hitters included; not the randomized KLL length sketch."""
    assert_linear_equal(a, b)
    for f in a:
        x, y = a[f]._arrays(), b[f]._arrays()
        for k in x:
            if k != "lengths":
                assert np.array_equal(x[k], y[k]), (f, k)


# --------------------------------------------------------------------------- window spec
def test_parse_window_is_replays():
    from flexshard_stream.online import replay
    w = parse_window("30m")
    assert (w.unit, w.size) == ("seconds", 1800.0)
    w = parse_window("100000")
    assert (w.unit, w.size) == ("samples", 100000)
    assert parse_window(250) == replay.parse_window(250)
    for bad in ("0", "-5m", "1.5", "3 parsecs", ""):
        with pytest.raises(ConfigError):
            parse_window(bad)


# --------------------------------------------------------------------------- windows
def test_duration_windows_equal_single_pass(logs):
    """Row-group tasks (8 workers > 4 files), out-of-order timestamps in one file."""
    diag = {}
    got = window_stats(logs, window="7s", engine="local", num_workers=8, config=CFG,
                       tables=TABLES, read_batch_size=500, diagnostics=diag)
    ref = single_pass(logs, "seconds", 7.0)
    assert diag["tasks"] > FILES and not diag["scan_pass"]
    assert [w.index for w in got] == list(ref)
    assert sum(w.samples for w in got) == FILES * PER_FILE
    for w in got:
        st, ids = ref[w.index]
        assert w.unit == "seconds" and w.end - w.start == 7.0
        assert w.start == pytest.approx(w.index * 7.0) and w.samples == st.samples
        assert w.start <= w.stats.first_ts and w.stats.last_ts < w.end
        assert_linear_equal(w.stats, st)
        assert_heavy_hitters_within_bounds(w.stats, ids, diag["tasks"])
    assert all(w.stats["a"].max_error > 0 for w in got)      # the heavy hitters did purge


def test_sample_windows_equal_single_pass(logs):
    diag = {}
    got = window_stats(logs[:2], window="1000", engine="local", num_workers=3, config=CFG,
                       tables=TABLES, read_batch_size=400, diagnostics=diag)
    ref = single_pass(logs[:2], "samples", 1000)
    assert diag["tasks"] == 4 and not diag["scan_pass"]   # two files, 2 row-group runs each
    assert [(w.index, w.start, w.end) for w in got] == [(i, i * 1000.0, (i + 1) * 1000.0)
                                                         for i in range(6)]
    for w in got:
        assert_linear_equal(w.stats, ref[w.index][0])
        assert_heavy_hitters_within_bounds(w.stats, ref[w.index][1], diag["tasks"])


def test_old_batch_size_keyword_is_the_read_chunk(logs):
    """``batch_size`` (deprecated for one release) still sets the read chunk, with a warning."""
    new = window_stats(logs[:1], window="1000", config=CFG, tables=TABLES, read_batch_size=400)
    with pytest.warns(DeprecationWarning, match="'batch_size' is deprecated, use "
                                                "'read_batch_size'"):
        old = window_stats(logs[:1], window="1000", config=CFG, tables=TABLES, batch_size=400)
    assert [w.index for w in old] == [w.index for w in new]
    for a, b in zip(old, new):
        assert_same_stats(a.stats, b.stats)
    with pytest.raises(TypeError, match="both 'batch_size'"):
        window_stats(logs[:1], window="1000", batch_size=400, read_batch_size=400)


def test_bad_rows_csv_and_counting_pass(tmp_path, logs):
    """CSV (no footer: a counting pass) with bad rows skipped: sample offsets count valid samples."""
    p = tmp_path / "bad.csv"
    lines = ["ts,a,b,c"]
    rng = np.random.default_rng(3)
    for i in range(900):
        b = -1 if i % 97 == 5 else int(rng.integers(0, 2000))
        lines.append(f"{100 + i * DT},{' '.join(map(str, rng.integers(0, 4000, i % 4)))},{b},"
                     f"{int(rng.integers(0, 300))}")
    p.write_text("\n".join(lines) + "\n")
    paths = [logs[0], str(p)]
    with pytest.raises(LogError, match="bad.csv"):
        window_stats(paths, window="1000", config=CFG, tables=TABLES)
    diag = {}
    got = window_stats(paths, window="1000", engine="local", num_workers=2, config=CFG,
                       tables=TABLES, skip_bad_rows=True, read_batch_size=300,
                       diagnostics=diag)
    ref = single_pass(paths, "samples", 1000, skip_bad_rows=True)
    assert diag["scan_pass"] and diag["skipped"]["negative_id"] == 10
    assert [w.index for w in got] == list(ref) and sum(w.samples for w in got) == 3890
    for w in got:
        assert_linear_equal(w.stats, ref[w.index][0])
    # duration windows over CSV: origin and windows per task from the counting pass
    got = window_stats(paths, window="5s", config=CFG, tables=TABLES, skip_bad_rows=True)
    ref = single_pass(paths, "seconds", 5.0, skip_bad_rows=True)
    assert [w.index for w in got] == list(ref)
    for w in got:
        assert_linear_equal(w.stats, ref[w.index][0])


def test_errors(logs, tmp_path):
    with pytest.raises(ConfigError, match="engine"):
        window_stats(logs, window="7s", engine="spark")
    p = tmp_path / "nots.parquet"
    pq.write_table(pa.table({"b": np.arange(10)}), p)
    with pytest.raises(ConfigError, match="no 'ts' column"):
        window_stats([str(p)], window="7s")
    assert window_stats([str(p)], window="4")[-1].samples == 2


# --------------------------------------------------------------------------- engines
def test_process_engine_agrees(logs):
    local = window_stats(logs, window="7s", engine="local", num_workers=2, config=CFG,
                         tables=TABLES)
    proc = window_stats(logs, window="7s", engine="process", num_workers=2, config=CFG,
                        tables=TABLES)
    assert [w.index for w in proc] == [w.index for w in local]
    for a, b in zip(proc, local):
        assert (a.start, a.end, a.samples) == (b.start, b.end, b.samples)
        assert_same_stats(a.stats, b.stats)
    # the caller's executor (kept open)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as ex:
        mine = window_stats(logs, window="7s", engine="process", executor=ex, config=CFG,
                            tables=TABLES)
        assert ex.submit(int, 1).result() == 1
    for a, b in zip(mine, local):
        assert_same_stats(a.stats, b.stats)


def test_ray_engine_agrees(logs, ray_cluster):
    diag = {}
    ray_w = window_stats(logs, window="7s", engine="ray", num_workers=2, config=CFG,
                         tables=TABLES, diagnostics=diag)
    local = window_stats(logs, window="7s", engine="local", num_workers=2, config=CFG,
                         tables=TABLES)
    assert ray_cluster.is_initialized()            # ours: window_stats does not shut it down
    assert diag["tasks"] == FILES and diag["moved_bytes"] > diag["task_bytes"] > 0
    assert [w.index for w in ray_w] == [w.index for w in local]
    for a, b in zip(ray_w, local):
        assert (a.start, a.end, a.samples) == (b.start, b.end, b.samples)
        assert_same_stats(a.stats, b.stats)
    # sample windows with row-group tasks on Ray, against the single pass
    got = window_stats(logs[:1], window="1000", engine="ray", num_workers=2, config=CFG,
                       tables=TABLES)
    ref = single_pass(logs[:1], "samples", 1000)
    for w in got:
        assert_linear_equal(w.stats, ref[w.index][0])


def test_import_does_not_import_ray():
    code = ("import sys, flexshard_stream, flexshard_stream.sources.distributed, flexshard_stream.cli; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- snapshots
def _host_stats(paths, tables=TABLES):
    st = StreamStats(tables, CFG)
    for b in read_log(paths, read_batch_size=1000):
        st.update(b)
    return st


def test_snapshot_round_trip(tmp_path, logs):
    st = _host_stats(logs[:1])
    p = save_snapshot(st, tmp_path / "h0.snap", host="host-0")
    s = load_snapshot(p)
    assert (s.host, s.unit, s.start, s.end, s.sources) == ("host-0", "seconds", st.first_ts,
                                                           st.last_ts, 1)
    assert_same_stats(s.stats, st)
    p2 = save_snapshot(st, tmp_path / "w.snap", host="h", start=0, end=3000, unit="samples")
    assert (load_snapshot(p2).unit, load_snapshot(p2).end) == ("samples", 3000.0)
    # a plain statistics file reads as a snapshot without metadata
    st.save(tmp_path / "plain.fss")
    assert load_snapshot(tmp_path / "plain.fss").host is None
    with pytest.raises(FormatError, match="no such"):
        load_snapshot(tmp_path / "missing.snap")
    damaged = bytearray(p.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    (tmp_path / "bad.snap").write_bytes(bytes(damaged))
    with pytest.raises(FormatError, match="bad.snap"):
        load_snapshot(tmp_path / "bad.snap")


def test_merge_snapshots_across_hosts_and_windows(tmp_path, logs):
    wins = window_stats(logs, window="7s", config=CFG, tables=TABLES, num_workers=2)
    paths = [save_snapshot(w.stats, tmp_path / f"w{w.index}.snap", host=f"h{w.index % 3}",
                           start=w.start, end=w.end) for w in wins]
    merged = merge_snapshots(paths, tmp_path / "all.snap")
    whole = _host_stats(logs)
    assert_linear_equal(merged, whole)
    ids = {k: np.concatenate([b.feature_values(k) for b in read_log(logs)]) for k in "abc"}
    assert_heavy_hitters_within_bounds(merged, ids, len(paths) + 2 * FILES)
    s = load_snapshot(tmp_path / "all.snap")
    assert s.host == "h0,h1,h2" and s.sources == len(paths)
    assert (s.start, s.end) == (wins[0].start, wins[-1].end)
    # merged snapshots merge again (rack -> cluster), plain statistics files too
    whole.save(tmp_path / "plain.fss")
    again = merge_snapshots([tmp_path / "all.snap", tmp_path / "plain.fss"], None)
    assert again.samples == 2 * whole.samples
    assert load_snapshot(tmp_path / "all.snap").stats.samples == whole.samples


@pytest.mark.parametrize("other", [{"seed": 12345}, {"cms_epsilon": 0.02}, {"hll_p": 9},
                                   "num_rows", "version"])
def test_merge_refuses_incompatible(tmp_path, logs, other):
    st = _host_stats(logs[:1])
    a = save_snapshot(st, tmp_path / "a.snap", host="a")
    if other == "num_rows":
        b = save_snapshot(_host_stats(logs[1:2], {"a": None, "b": None, "c": 400}),
                          tmp_path / "b.snap", host="b")
    elif other == "version":
        from flexshard_stream.formats.container import pack, unpack
        from flexshard_stream.sources import distributed
        meta, arrays = unpack(distributed._snapshot_bytes(st, "b", None, None, None),
                              "StreamSnapshot")
        meta["snapshot_version"] = 2
        b = tmp_path / "b.snap"
        b.write_bytes(pack("StreamSnapshot", meta, arrays))
    else:
        cfg = SketchConfig(**{**CFG.to_dict(), **other})
        s2 = StreamStats(TABLES, cfg)
        for x in read_log(logs[1:2]):
            s2.update(x)
        b = save_snapshot(s2, tmp_path / "b.snap", host="b")
    out = tmp_path / "out.snap"
    with pytest.raises(IncompatibleError) as e:
        merge_snapshots([a, b], out)
    msg = str(e.value)
    assert "a.snap" in msg and "b.snap" in msg
    assert not out.exists()
    assert not list(tmp_path.glob(".out.snap*"))      # no temp file left behind


def test_merge_refuses_the_same_statistics_twice(tmp_path, logs):
    """`merge s.fss s.fss` doubled every count without a word: the same file, the same bytes
    under another name, or the same host's same window is refused, and nothing is written."""
    import shutil
    st = _host_stats(logs[:1])
    a = save_snapshot(st, tmp_path / "a.snap", host="h", start=0.0, end=10.0, unit="seconds")
    shutil.copy(a, tmp_path / "copy.snap")
    st2 = _host_stats(logs[1:2])
    again = save_snapshot(st2, tmp_path / "again.snap", host="h", start=0.0, end=10.0,
                          unit="seconds")
    out = tmp_path / "out.snap"
    for other, match in ((a, "the same file"), (tmp_path / "copy.snap", "identical bytes"),
                         (again, r"same host's \(h\) same window")):
        with pytest.raises(IncompatibleError, match=match):
            merge_snapshots([a, other], out)
        assert not out.exists()
    later = save_snapshot(st2, tmp_path / "later.snap", host="h", start=10.0, end=20.0,
                          unit="seconds")
    assert merge_snapshots([a, later], out).samples == st.samples + st2.samples


def test_merge_command(tmp_path, logs):
    import typer
    from typer.testing import CliRunner

    from flexshard_stream.cli import merge_command
    app = typer.Typer()
    app.command("merge")(merge_command)

    @app.callback()
    def _main():
        """flexshard-stream (test app)."""

    paths = [str(save_snapshot(_host_stats([p]), tmp_path / f"h{i}.snap", host=f"h{i}"))
             for i, p in enumerate(logs[:2])]
    r = CliRunner().invoke(app, ["merge", *paths, "-o", str(tmp_path / "m.snap"), "--json"])
    assert r.exit_code == 0, r.output
    import json
    doc = json.loads(r.output.strip().splitlines()[-1])
    assert doc["hosts"] == ["h0", "h1"] and doc["samples"] == 2 * PER_FILE
    assert load_stats(tmp_path / "m.snap").samples == 2 * PER_FILE
    s2 = StreamStats(TABLES, SketchConfig(**{**CFG.to_dict(), "seed": 1}))
    s2.update(next(read_log(logs[2:3])))
    save_snapshot(s2, tmp_path / "odd.snap")
    r = CliRunner().invoke(app, ["merge", paths[0], str(tmp_path / "odd.snap"), "-o",
                                 str(tmp_path / "m2.snap")])
    assert r.exit_code == 2 and r.output.startswith("error: cannot merge")   # IncompatibleError
    assert "odd.snap" in r.output and not (tmp_path / "m2.snap").exists()


# --------------------------------------------------------------------------- planning
def test_planner_on_merged_equals_planner_on_concatenated(tmp_path, logs):
    from flexshard_stream.placement.planner import plan_flexshard
    from flexshard_stream.plans.tables import EmbeddingTable
    from flexshard_stream.plans.topology import Topology
    tabs = [EmbeddingTable("a", 4000, 16), EmbeddingTable("b", 2000, 16, kind="pooled"),
            EmbeddingTable("c", 300, 16, kind="pooled")]
    topo = Topology.preset("2x8")
    paths = [save_snapshot(_host_stats([p], EXACT), tmp_path / f"h{i}.snap", host=f"h{i}")
             for i, p in enumerate(logs)]
    merged = merge_snapshots(paths, tmp_path / "all.snap")
    whole = _host_stats(logs, EXACT)
    assert all(merged[f].exact for f in merged)
    p1 = plan_flexshard(tabs, topo, load_stats(tmp_path / "all.snap").summary(1000), 64).plan
    p2 = plan_flexshard(tabs, topo, whole.summary(1000), 64).plan
    assert p1 == p2


# --------------------------------------------------------------------------- interop
def test_datasketches_images_round_trip(tmp_path, logs):
    import datasketches as ds
    hosts = [_host_stats([p]) for p in logs[:2]]
    merged = hosts[0].copy().merge(hosts[1])
    files = export_datasketches(merged, tmp_path / "ds")
    assert set(files) == {"a", "b", "c"} and "hll" in files["c"] and "hll" not in files["a"]
    # frequent items (sketched, merged): DataSketches reads the same bounds
    t = merged["a"]
    fi = ds.frequent_items_sketch.deserialize(Path(files["a"]["frequent_items"]).read_bytes(),
                                              ds.PyLongsSerDe())
    assert fi.total_weight == t.total
    ids, _, lo, _ = t.top(20)
    for i, l in zip(ids, lo):
        assert fi.get_lower_bound(int(i)) == l
        assert fi.get_upper_bound(int(i)) == l + t.max_error
    true = np.bincount(np.concatenate([b.feature_values("a") for b in read_log(logs[:2])]))
    for item, _, lb, ub in fi.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES):
        assert lb <= true[item] <= ub
    # HLL (exact table): a DataSketches image; images of two hosts union to the distinct rows
    true = merged["c"].nonzero_rows().size
    looked_up = np.unique(np.concatenate([b.feature_values("c") for b in read_log(logs[:2])]))
    assert np.array_equal(merged["c"].nonzero_rows(), looked_up)
    h = ds.hll_sketch.deserialize(Path(files["c"]["hll"]).read_bytes())
    assert h.lg_config_k == CFG.hll_p
    assert h.get_lower_bound(2) <= true <= h.get_upper_bound(2)
    u = ds.hll_union(CFG.hll_p)
    for s in hosts:
        u.update(ds.hll_sketch.deserialize(hll_image(s["c"])))
    assert u.get_result().get_lower_bound(2) <= true <= u.get_result().get_upper_bound(2)
    with pytest.raises(ConfigError, match="sketched"):
        hll_image(merged["a"])
    with pytest.raises(ConfigError, match="sketched"):
        merged["a"].nonzero_rows()
