"""Regression cases of the hardening issue: crafted inputs give a project error naming what and
where, before any allocation or kernel sees them."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from flexshard_stream import Batch
from flexshard_stream.errors import BatchError, ConfigError, FormatError
from flexshard_stream.formats.container import END, MAGIC, VERSION, pack, unpack
from flexshard_stream.plans.tables import tables_from_dict
from flexshard_stream.plans.topology import MAX_GPUS, Topology
from flexshard_stream.sources.windows import parse_window


def _forge(header: object, payload: bytes = b"\0" * 64) -> bytes:
    """A container whose header is ``header`` and whose checksum is right (an adversary can
    recompute it)."""
    h = json.dumps(header).encode()
    body = MAGIC + struct.pack("<HHQ", VERSION, 0, len(h)) + h + payload
    return body + struct.pack("<I", zlib.crc32(body)) + END


def _entry(**kw):
    e = {"name": "x", "dtype": "int64", "shape": [1], "offset": 0, "nbytes": 8}
    e.update(kw)
    return e


@pytest.mark.parametrize("header,match", [
    ([1, 2], "must be a JSON object"),
    ({"kind": "K"}, "'meta' must be an object"),
    ({"kind": "K", "meta": {}, "arrays": {"x": 1}}, "'arrays' must be a list"),
    ({"kind": "K", "meta": {}, "arrays": [7]}, "entry 0 must be an object"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(name=3)]}, "no string 'name'"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(dtype="object")]}, "unsupported dtype"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(shape=[1 << 40])]}, "does not fit the file"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(shape=[-1])]}, "invalid shape"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(shape="7")]}, "invalid shape"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(offset=1 << 70)]}, "'offset' must be an integer"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(offset=1.5)]}, "'offset' must be an integer"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(nbytes=None)]}, "'nbytes' must be an integer"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(nbytes=16)]}, "does not fit the file"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(), _entry()]}, "appears twice"),
    ({"kind": "other", "meta": {}, "arrays": []}, "expected 'K'"),
])
def test_container_header_is_validated_before_use(header, match):
    with pytest.raises(FormatError, match=match):
        unpack(_forge(header), "K", "crafted.fss")


def test_container_header_with_nan_constant_is_refused():
    h = b'{"kind": "K", "meta": {"x": NaN}, "arrays": []}'
    body = MAGIC + struct.pack("<HHQ", VERSION, 0, len(h)) + h
    with pytest.raises(FormatError, match="not valid JSON"):
        unpack(body + struct.pack("<I", zlib.crc32(body)) + END, "K")


def test_container_round_trip_still_works():
    meta, arrays = unpack(pack("K", {"a": [1, 2]}, {"x": np.arange(3), "y": np.ones(2)}), "K")
    assert meta == {"a": [1, 2]}
    assert arrays["x"].tolist() == [0, 1, 2] and arrays["y"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("nodes,gpus", [(10**9, 8), (2**70, 8), (MAX_GPUS + 1, 1)])
def test_absurd_topology_sizes_refused_before_allocation(nodes, gpus):
    with pytest.raises(ConfigError, match="at most"):
        Topology.uniform(nodes, gpus)
    with pytest.raises(ConfigError, match=r"\[topology\].*at most"):
        Topology.from_dict({"topology": {"nodes": nodes, "gpus_per_node": gpus}})


@pytest.mark.parametrize("field,value", [("num_rows", 2**64), ("dim", 2**64),
                                         ("optimizer_state_bytes", 2**70)])
def test_table_integers_past_int64_are_config_errors(field, value):
    entry = {"name": "t", "num_rows": 10, "dim": 8, field: value}
    with pytest.raises(ConfigError, match=f"table 't': {field}.*at most"):
        tables_from_dict({"table": [entry]})


@pytest.mark.parametrize("spec", ["99999999999999999999999", 2**70])
def test_window_sample_counts_are_bounded(spec):
    with pytest.raises(ConfigError, match="number of samples must be in"):
        parse_window(spec)


def test_empty_batch_from_empty_lists():
    b = Batch(["a"], [], [])
    assert b.values.size == 0 and b.lengths.size == 0


@pytest.mark.parametrize("kw,match", [
    (dict(keys=["a"], values=[1], lengths=np.array([2**63], np.uint64)), "does not fit in int64"),
    (dict(keys=["a", "b", "c", "d"], values=[], lengths=np.array([2**62] * 4)),
     "exceeds the 0 values"),
    (dict(keys=["a"], values=[1], lengths=[1], timestamp=float("inf")), "not a finite number"),
    (dict(keys=["a"], values=[1], lengths=[1], timestamp=float("-inf")), "not a finite number"),
])
def test_batch_lengths_and_timestamps_checked(kw, match):
    with pytest.raises(BatchError, match=match):
        Batch(**kw)


# ---------------------------------------------------------------------------------------------
# Saved statistics: every field checked before anything is allocated or decoded (issue items 1,
# 2, 7). ``_reforge`` rewrites a container's header or one array and recomputes the CRC.
def _reforge(blob: bytes, edit_header=None, array: str | None = None, edit_array=None) -> bytes:
    (hlen,) = struct.unpack_from("<Q", blob, 12)
    header = json.loads(blob[20:20 + hlen])
    payload = bytearray(blob[20 + hlen:len(blob) - 12])
    if edit_header is not None:
        edit_header(header)
    if array is not None:
        e = next(e for e in header["arrays"] if e["name"] == array)
        a = np.frombuffer(bytes(payload[e["offset"]:e["offset"] + e["nbytes"]]),
                          np.dtype(e["dtype"])).copy()
        edit_array(a)
        payload[e["offset"]:e["offset"] + e["nbytes"]] = a.tobytes()
    return _forge(header, bytes(payload))


@pytest.fixture(scope="module")
def saved_stats():
    from flexshard_stream.stats.config import SketchConfig
    from flexshard_stream.stats.stream import StreamStats
    s = StreamStats({"a": None, "b": 100}, SketchConfig(hh_lg_size=6, hll_p=6, length_k=16))
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = np.minimum(rng.zipf(1.2, 64), 10**6)
        s.update(Batch(["a", "b"], np.concatenate([a, a % 100]), np.full(2, 64)))  # KLL-long
    return s.to_bytes()


def _load(blob):
    from flexshard_stream.stats.stream import StreamStats
    return StreamStats.from_bytes(blob, "crafted.fss")


@pytest.mark.parametrize("edit,match", [
    (lambda h: h["meta"]["tables"][0].__setitem__("total", 1.5e300), "'total' must be"),
    (lambda h: h["meta"]["tables"][0].__setitem__("max_id", "7"), "'max_id' must be"),
    (lambda h: h["meta"]["tables"][0]["config"].__setitem__("hh_lg_size", 6.0),
     "'hh_lg_size' must be an integer"),
    (lambda h: h["meta"]["tables"][0]["config"].__setitem__("cms_delta", 1e-300),
     "bytes of counters; the file holds"),
    (lambda h: h["meta"]["tables"][1].__setitem__("num_rows", 10**12), "bytes of counters"),
    (lambda h: h["meta"].__setitem__("batches", -1), "'batches' must be"),
    (lambda h: h["meta"].__setitem__("first_ts", "yesterday"), "'first_ts' must be"),
    (lambda h: h["meta"]["tables"][1].__setitem__("feature", "a"), "repeated feature"),
    (lambda h: h["meta"]["tables"][0].__setitem__("stats_version", 99), "statistics version 99"),
])
def test_stats_header_fields_are_checked(saved_stats, edit, match):
    """Mistyped, out-of-range or oversized fields are a FormatError naming the field, before a
    table is built (a tiny cms_delta used to allocate terabytes)."""
    with pytest.raises(FormatError, match=match):
        _load(_reforge(saved_stats, edit))


def _sketched(header):
    return next(i for i, t in enumerate(header["meta"]["tables"]) if t["num_rows"] is None)


def test_heavy_hitter_metadata_that_undercounts_is_refused(saved_stats):
    """Item 1: live counters claimed fewer than the slots hold (the purge overflowed its buffers
    and aborted the process on the next update)."""
    (hlen,) = struct.unpack_from("<Q", saved_stats, 12)
    i = _sketched(json.loads(saved_stats[20:20 + hlen]))

    def undercount(a):
        a[0] = max(0, a[0] - 3)
    with pytest.raises(FormatError, match=r"mg_meta\[0\]"):
        _load(_reforge(saved_stats, array=f"{i}.mg_meta", edit_array=undercount))

    def every_slot_live(a):                      # item 4: the update spun forever
        a[a == 0] = 1
    with pytest.raises(FormatError, match="mg_"):
        _load(_reforge(saved_stats, array=f"{i}.mg_vals", edit_array=every_slot_live))


@pytest.mark.parametrize("offset,value", [(20, 0xFFFFFF00), (18, 0), (18, 200), (4, 1),
                                          (8, 12345), (0, 9)])
def test_damaged_kll_image_never_reaches_datasketches(saved_stats, offset, value):
    """Item 2: a damaged length sketch with the checksums recomputed (merge segfaulted in
    DataSketches); the image is validated against the KLL serialization format first."""
    (hlen,) = struct.unpack_from("<Q", saved_stats, 12)
    i = _sketched(json.loads(saved_stats[20:20 + hlen]))

    def damage(a):
        raw = bytearray(a.tobytes())
        struct.pack_into("<I" if offset in (8, 20) else "<B", raw, offset, value)
        a[:] = np.frombuffer(bytes(raw), np.uint8)
    with pytest.raises(FormatError, match="KLL"):
        _load(_reforge(saved_stats, array=f"{i}.lengths", edit_array=damage))


def test_kll_check_accepts_every_image_datasketches_writes():
    import datasketches as ds

    from flexshard_stream.formats.interop import check_kll_ints_image
    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 199, 200, 201, 5000, 100_000):
        k = ds.kll_ints_sketch(16)
        if n:
            k.update(rng.integers(0, 50, n).astype(np.int64))
        assert check_kll_ints_image(bytes(k.serialize()), 16, "x") == n


def test_snapshot_meta_is_typed(tmp_path):
    from flexshard_stream.sources.distributed import load_snapshot, save_snapshot
    from flexshard_stream.stats.stream import StreamStats
    s = StreamStats(["a"])
    s.update(Batch(["a"], [1, 2], [2]))
    p = save_snapshot(s, tmp_path / "s.fss", host="h")
    for key, value in (("host", 7), ("unit", "hours"), ("start", "noon"), ("sources", 0)):
        bad = tmp_path / f"{key}.fss"
        bad.write_bytes(_reforge(p.read_bytes(), lambda h: h["meta"].__setitem__(key, value)))
        with pytest.raises(FormatError, match=f"'{key}' must be"):
            load_snapshot(bad)


def test_npy_header_checked_before_allocation(tmp_path):
    """Item 8: a .npy header declaring 2**40 elements made np.load try 8 TiB."""
    from flexshard_stream.formats.files import read_npy, write_npy
    sha = write_npy(tmp_path / "a.npy", np.arange(5))
    raw = (tmp_path / "a.npy").read_bytes().replace(b"(5,)", b"(1099511627776,)")
    (tmp_path / "a.npy").write_bytes(raw)
    import hashlib
    sha = hashlib.sha256(raw).hexdigest()
    with pytest.raises(FormatError, match="needs 8796093022208 bytes"):
        read_npy(tmp_path, "a.npy", sha)
    for weird in (b"|O8", b"<U8"):
        raw2 = raw.replace(b"(1099511627776,)", b"(5,)").replace(b"<i8", weird)
        (tmp_path / "b.npy").write_bytes(raw2)
        with pytest.raises(FormatError, match="not a .npy"):
            read_npy(tmp_path, "b.npy", hashlib.sha256(raw2).hexdigest())


@pytest.mark.parametrize("special", ["fifo", "dev_zero", "directory"])
def test_readers_refuse_what_is_not_a_regular_file(tmp_path, special):
    """A FIFO or a symlink to /dev/zero where a saved file goes would block or never end."""
    import os

    from flexshard_stream.plans.topology import Topology
    from flexshard_stream.stats.stream import StreamStats
    for name, load in (("s.fss", StreamStats.load), ("t.toml", Topology.load)):
        p = tmp_path / name
        {"fifo": os.mkfifo, "directory": os.mkdir,
         "dev_zero": lambda q: os.symlink("/dev/zero", q)}[special](p)
        with pytest.raises(FormatError, match="is (not a regular file|a directory)"):
            load(p)


# ---------------------------------------------------------------------------------------------
# Outputs never replace what the project did not write (item 3).
TOPO2 = Topology.uniform(1, 2, hbm_bytes_per_gpu=1e9)


def _rw_plan():
    from flexshard_stream.placement.baselines import row_wise
    from flexshard_stream.plans.tables import EmbeddingTable
    return row_wise([EmbeddingTable("t", 100, 8)], TOPO2)


def test_plan_save_refuses_user_files_and_replaces_its_own(tmp_path):
    from flexshard_stream.errors import ConfigError
    from flexshard_stream.formats.files import KIND_MARKER
    from flexshard_stream.plans.plan import Plan
    plan = _rw_plan()
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for target in (home, a_file):
        with pytest.raises(ConfigError, match="refusing"):
            plan.save(target)
    assert (home / "thesis.tex").read_text() == "years of work" and a_file.read_text() == "mine"
    d = plan.save(tmp_path / "p")
    assert (d / KIND_MARKER).read_text().strip() == "plan"
    plan.save(d)                                   # its own kind: replaced
    (d / KIND_MARKER).unlink()                     # a plan written before markers: still ours
    assert Plan.load(plan.save(d)) == plan
    (d / KIND_MARKER).write_text("replay\n")       # another kind: refused
    with pytest.raises(ConfigError, match="replay directory, not a plan"):
        plan.save(d)


def test_cli_outputs_refuse_foreign_paths(tmp_path):
    """plan --out, stats --save and merge -o on a user's directory or file: exit 2, untouched."""
    from typer.testing import CliRunner

    from flexshard_stream.cli import app
    log = tmp_path / "log.csv"
    log.write_text("a,b\n1,2\n3,4\n")
    user_dir = tmp_path / "docs"
    user_dir.mkdir()
    (user_dir / "keep.txt").write_text("keep")
    user_file = tmp_path / "data.csv"
    user_file.write_text("precious")
    runner = CliRunner()
    for args in (["plan", "--log", str(log), "--topology", "2x8", "--out", str(user_dir)],
                 ["plan", "--log", str(log), "--topology", "2x8", "--out", str(user_file)],
                 ["stats", str(log), "--save", str(user_file)],
                 ["stats", str(log), "--save", str(user_dir)]):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and "refusing" in str(r.output) + str(r.exception), args
    assert (user_dir / "keep.txt").read_text() == "keep" and user_file.read_text() == "precious"
    stats = tmp_path / "s.fss"
    assert runner.invoke(app, ["stats", str(log), "--save", str(stats)]).exit_code == 0
    r = runner.invoke(app, ["merge", str(stats), "-o", str(user_file)])
    assert r.exit_code != 0 and user_file.read_text() == "precious"


def test_toml_outputs_replace_only_a_file_of_their_kind(tmp_path):
    """tables --out / save_tables and Topology.to_toml: a user's CSV, a directory or a TOML file
    of the other kind is refused and untouched; their own kind is replaced."""
    from typer.testing import CliRunner

    from flexshard_stream.cli import app
    from flexshard_stream.plans.tables import EmbeddingTable, load_tables, save_tables
    from flexshard_stream.plans.topology import Topology
    log = tmp_path / "log.csv"
    log.write_text("a,b\n1,2\n3,4\n")
    tables = [EmbeddingTable("a", 10, 8)]
    topo = Topology.load("2x8")
    user_dir = tmp_path / "docs"
    user_dir.mkdir()
    for target in (log, user_dir):
        r = CliRunner().invoke(app, ["tables", str(log), "--out", str(target)])
        assert r.exit_code == 2 and "refusing" in r.output, r.output
        with pytest.raises(ConfigError, match="refusing"):
            topo.to_toml(target)
    assert log.read_text() == "a,b\n1,2\n3,4\n" and not any(user_dir.iterdir())
    t, g = tmp_path / "t.toml", tmp_path / "g.toml"
    save_tables(tables, t)
    save_tables(tables, t)                                     # its own kind: replaced
    topo.to_toml(g)
    topo.to_toml(g)
    with pytest.raises(ConfigError, match="a topology file, not a tables file"):
        save_tables(tables, g)
    with pytest.raises(ConfigError, match="a tables file, not a topology file"):
        topo.to_toml(t)
    assert load_tables(t) == tables and Topology.load(g) == topo


def test_datasketches_export_and_report_write_only_into_their_own_directory(tmp_path):
    from flexshard_stream.report import build_report
    from flexshard_stream.sources.distributed import export_datasketches
    from flexshard_stream.stats.stream import StreamStats
    stats = StreamStats({"a": 100})
    stats.update(Batch(["a"], [1, 2, 2], [1, 1, 1]))
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    for call in (lambda: export_datasketches(stats, home), lambda: build_report(home)):
        with pytest.raises(ConfigError, match="refusing"):
            call()
    assert [p.name for p in home.iterdir()] == ["thesis.tex"]
    out = tmp_path / "ds"
    export_datasketches(stats, out)
    export_datasketches(stats, out)                            # its own kind: written again
    assert (out / "a.frequent_items.bin").is_file()


def test_sidecar_out_dir_must_be_its_own(tmp_path):
    from flexshard_stream.errors import ConfigError
    from flexshard_stream.online.sidecar import Sidecar
    from flexshard_stream.plans.tables import EmbeddingTable
    home = tmp_path / "home"
    (home / "plan").mkdir(parents=True)            # was rmtree'd when the first plan was linked
    (home / "plan" / "mine.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a sidecar directory"):
        Sidecar([EmbeddingTable("t", 100, 8)], TOPO2, 4, out_dir=home)
    assert (home / "plan" / "mine.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# plan.json joins the checksum (item 8).
def test_edited_plan_json_is_refused(tmp_path):
    from flexshard_stream.formats.files import json_digest
    from flexshard_stream.plans.plan import Plan
    d = _rw_plan().save(tmp_path / "p")
    doc = json.loads((d / "plan.json").read_text())
    doc["topology"]["topology"]["inter_bw_bytes_per_s"] = 1.0
    (d / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="plan.json: checksum mismatch"):
        Plan.load(d)
    doc["topology"]["topology"]["gpus_per_node"] = 2**70     # checksum recomputed: still checked
    doc["checksum"] = json_digest(doc)
    (d / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="plan.json"):
        Plan.load(d)


@pytest.mark.parametrize("key, value", [("batch_size", "x"), ("dedup", "yes"), ("model", 3),
                                        ("ids", 7), ("requested_strategy", 5)])
def test_recorded_plan_settings_are_typed(tmp_path, key, value):
    """What evaluate and replay --plan default to, edited with the checksum recomputed: a
    FormatError naming plan.json and the field (was a TypeError / AttributeError traceback)."""
    from flexshard_stream.formats.files import json_digest
    from flexshard_stream.plans.plan import Plan
    d = _rw_plan().save(tmp_path / "p")
    doc = json.loads((d / "plan.json").read_text())
    doc["meta"][key] = value
    doc["checksum"] = json_digest(doc)
    (d / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=rf"plan.json: meta: field '{key}'"):
        Plan.load(d)


@pytest.mark.parametrize("field", ["index_bytes", "reservation_bytes", "length_bytes"])
@pytest.mark.parametrize("value", ["x", float("inf"), [1], True])
def test_cost_model_numbers_are_checked(field, value):
    from flexshard_stream.placement.cost import CostModel
    with pytest.raises(ConfigError, match=f"{field} must be a finite number"):
        CostModel(**{field: value})


def test_plans_written_before_the_checksum_still_load(tmp_path):
    """A plan directory written before plan.json carried a checksum (no kind marker either)
    loads; a marked one whose checksum was removed is refused."""
    from flexshard_stream.formats.files import KIND_MARKER
    from flexshard_stream.plans.plan import Plan
    plan = _rw_plan()
    d = plan.save(tmp_path / "p")
    doc = json.loads((d / "plan.json").read_text())
    del doc["checksum"]
    (d / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="plan.json: checksum mismatch"):
        Plan.load(d)
    (d / KIND_MARKER).unlink()                               # as an older release wrote it
    assert Plan.load(d) == plan
    assert "checksum" in json.loads((plan.save(d) / "plan.json").read_text())


# ---------------------------------------------------------------------------------------------
# Time: closed-form decay, no hang, no underflow (items 4, 5, 11).
def test_decay_factor_is_closed_form_and_clamped():
    from flexshard_stream.stats.window import MIN_DECAY_FACTOR, decay_factor
    assert decay_factor(0.0, 2.0) == 1.0 and decay_factor(-5.0, 2.0) == 1.0
    assert decay_factor(4.0, 2.0) == 0.25
    for gap in (64.0, 1075.0 * 2, 1e300, float("inf")):
        assert decay_factor(gap, 1.0) == MIN_DECAY_FACTOR > 0.0


def test_decayed_stats_survive_timestamp_jumps():
    """A jump to 1e18 seconds took one step per period (minutes to forever): now one decay that
    forgets what came before; a jump back is counted without moving the clock back."""
    from flexshard_stream.stats.window import DecayedStats
    d = DecayedStats(["a"], half_life=4.0, period=1.0, unit="seconds")
    d.update(Batch(["a"], [1, 1, 1], [3], timestamp=[1.7e9]))
    d.update(Batch(["a"], [2], [1], timestamp=[1e18]))
    assert d.view()["a"].total == 1 and d.decays >= 10**17
    before = d.state()["next"]
    d.update(Batch(["a"], [3], [1], timestamp=[5.0]))          # backwards: counted, no decay
    assert d.view()["a"].total == 2 and d.state()["next"] == before
    d.update(Batch(["a"], [3], [1], timestamp=[1.7976931348623157e308]))
    assert d.view()["a"].total == 1


def test_replay_over_a_long_gap(tmp_path):
    """Item 5: a gap of thousands of half-lives between windows (the factor underflowed to 0.0
    and scale() raised after the clock had moved)."""
    from flexshard_stream.online.replay import replay
    rows = ["ts,a"] + [f"{t},{i % 7}" for i, t in enumerate(
        [float(x) for x in range(40)] + [1e7 + x for x in range(40)])]
    log = tmp_path / "gap.csv"
    log.write_text("\n".join(rows) + "\n")
    res = replay(log, TOPO2, window="10s", out_dir=tmp_path / "out", batch_size=2,
                 evaluation="analytic", top_k=16)
    assert res.totals["windows"] >= 2


# ---------------------------------------------------------------------------------------------
# Logs through the CLI (items 6, 10, 11).
@pytest.mark.parametrize("cell, why", [("4.5", "'4.5' is not a decimal integer"),
                                       ("x y", "'x' is not a decimal integer")])
def test_mostly_id_csv_column_with_a_bad_value_is_an_error(tmp_path, cell, why):
    from flexshard_stream.errors import LogError
    from flexshard_stream.sources.logs import LogReader
    log = tmp_path / "ids.csv"
    log.write_text(f"a,b\n1,2\n3,{cell}\n5,6\n")
    with pytest.raises(LogError, match=rf"ids.csv: .*line 3\), column 'b': .*{why}"):
        list(LogReader(log))
    r = LogReader(log, skip_bad_rows=True)
    assert sum(b.batch_size for b in r) == 2 and r.skipped["bad_id"] == 1


def test_cli_errors_name_flags_not_python_arguments(tmp_path, monkeypatch, capsys):
    from typer.testing import CliRunner

    from flexshard_stream.cli import app, main
    log = tmp_path / "bad.csv"
    log.write_text("a,b\n1,2\n3,x\n5,6\n7\n")
    runner = CliRunner()
    r = runner.invoke(app, ["stats", str(log)])
    assert r.exit_code == 2 and "--skip-bad-rows" in r.output and "=True" not in r.output
    r = runner.invoke(app, ["stats", str(log), "--skip-bad-rows", "--json"])
    assert r.exit_code == 0 and "skipped 2 bad rows" in r.output
    r = runner.invoke(app, ["plan", "--log", str(log), "--topology", "2x8", "--strategy", "tw",
                            "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "--skip-bad-rows" in r.output and "=True" not in r.output
    monkeypatch.setattr("sys.argv", ["flexshard-stream", "tables", str(log)])
    with pytest.raises(SystemExit) as e:            # tables has no such flag: not suggested
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.lstrip().startswith("error: ") and "line 3" in err
    assert "skip" not in err and "=True" not in err


def test_malformed_line_that_is_not_utf8_is_one_clean_error(tmp_path):
    """pyarrow decodes a malformed line before the bad-row handler sees it: no "Exception
    ignored" traceback on stderr, one error line saying why it cannot be skipped (found by the
    long fuzz run)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    log = tmp_path / "log.csv"
    log.write_bytes(b"a,b\n1,2\n3\xff\n5,6\n")
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "flexshard_stream.cli", "stats", str(log),
                        "--skip-bad-rows"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr
    assert "log.csv" in r.stderr and "not UTF-8 text cannot be skipped" in r.stderr


def test_parquet_timestamp_statistics_beyond_python_dates(tmp_path):
    """Window statistics plan their tasks from the parquet statistics; a timestamp pyarrow cannot
    make a datetime of (year > 9999) means no usable statistics, not an OverflowError (found by
    the long fuzz run through replay)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flexshard_stream.sources.distributed import window_stats
    log = tmp_path / "log.parquet"
    n = 64
    pq.write_table(pa.table({"a": pa.array(range(n), pa.int64()),
                             "ts": pa.array([10**15 + i for i in range(n)], pa.timestamp("s"))}),
                   log)
    wins = window_stats([str(log)], window="30m", num_workers=2)
    assert sum(w.stats.samples for w in wins) == n


def test_row_id_beyond_int64_row_count_is_a_clear_error(tmp_path):
    from flexshard_stream.errors import ConfigError
    from flexshard_stream.plans.tables import infer_tables
    log = tmp_path / "big.csv"
    log.write_text(f"a\n1\n{2**63 - 1}\n")
    with pytest.raises(ConfigError, match="holds ID 9223372036854775807"):
        infer_tables(log)


# ---------------------------------------------------------------------------------------------
# Evaluator size guards and the trailing iteration (items 9, 11).
def test_trace_evaluation_refuses_huge_matrices_before_allocating():
    from flexshard_stream.errors import ConfigError
    from flexshard_stream.placement.baselines import row_wise
    from flexshard_stream.placement.cost import MATRIX_MAX_GPUS, evaluate_trace
    from flexshard_stream.plans.tables import EmbeddingTable
    big = Topology.uniform(MATRIX_MAX_GPUS // 8 * 2, 8)
    plan = row_wise([EmbeddingTable("t", 10**6, 8)], big)
    with pytest.raises(ConfigError, match="G x G"):
        evaluate_trace(plan, [], 1)


def test_evaluate_checks_ids_of_the_trailing_partial_iteration():
    from flexshard_stream.errors import BatchError
    from flexshard_stream.placement.cost import evaluate_trace
    plan = _rw_plan()
    ok = Batch(["t"], np.arange(4), np.ones(4, np.int64))
    bad = Batch(["t"], [10**6], [1])
    with pytest.raises(BatchError, match="out of range"):
        evaluate_trace(plan, [ok, bad], 2)


def test_sidecar_state_json_cannot_point_elsewhere(tmp_path):
    """state.json's 'plan' names plans/NNNNNN of the out_dir: a number (a TypeError at restart)
    or a path elsewhere (loaded and linked to) is the usual fallback, with a warning."""
    from flexshard_stream.online.sidecar import Sidecar, SidecarWarning
    from flexshard_stream.plans.tables import EmbeddingTable
    tables = [EmbeddingTable("t", 100, 8)]
    out = tmp_path / "run"
    Sidecar(tables, TOPO2, 4, out_dir=out, checkpoint_every_s=None).close()
    elsewhere = _rw_plan().save(tmp_path / "elsewhere")
    for bad in (7.5, "../elsewhere", str(elsewhere)):
        state = json.loads((out / "state.json").read_text())
        state["plan"] = bad
        (out / "state.json").write_text(json.dumps(state))
        with pytest.warns(SidecarWarning, match="field 'plan' must"):
            sc = Sidecar(tables, TOPO2, 4, out_dir=out, resume=True, checkpoint_every_s=None)
        assert sc.resume_report.plan_from != "published"
        sc.close()
    assert not (out / "plan").resolve().is_relative_to(tmp_path / "elsewhere")
