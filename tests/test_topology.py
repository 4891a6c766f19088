"""Topology (presets, TOML layout, link classes, errors) and embedding tables (TOML, inference)."""
import re

import numpy as np
import polars as pl
import pytest

from flexshard_stream.errors import ConfigError, FormatError
from flexshard_stream.plans.tables import (
    DTYPE_BYTES,
    EmbeddingTable,
    infer_tables,
    load_tables,
    save_tables,
    tables_by_feature,
)
from flexshard_stream.plans.topology import Topology, available_presets


def write(tmp_path, text, name="topo.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


HEAD = "[topology]\nnodes = 2\ngpus_per_node = 4\n"


# ----------------------------------------------------------------------------- presets
def test_preset_2x8():
    t = Topology.preset("2x8")
    assert (t.nodes, t.gpus_per_node, t.num_gpus, t.name) == (2, 8, 16, "2x8")
    assert t.hbm_bytes.shape == t.intra_bw.shape == t.inter_bw.shape == t.uvm_bw.shape == (16,)
    assert t.host_memory_bytes.shape == (2,)
    assert np.all(t.hbm_bytes == 80e9) and np.all(t.intra_bw == 300e9)
    assert np.all(t.inter_bw == 25e9) and np.all(t.uvm_bw == 25e9)
    assert np.all(t.host_memory_bytes == 1e12)
    assert t.hbm_bytes.dtype == np.float64
    assert t == Topology.uniform(2, 8, name="2x8")


def test_preset_16x8():
    t = Topology.preset("16x8")
    assert (t.nodes, t.gpus_per_node, t.num_gpus) == (16, 8, 128)
    assert t == Topology.uniform(16, 8, name="16x8")


def test_preset_16x8_skewed():
    t = Topology.preset("16x8_skewed")
    assert (t.nodes, t.gpus_per_node) == (16, 8)
    expected = np.full(128, 25e9)
    expected[96:] = 12.5e9                       # nodes 12..15
    np.testing.assert_array_equal(t.inter_bw, expected)
    assert np.all(t.intra_bw == 300e9) and np.all(t.hbm_bytes == 80e9)
    assert np.all(t.host_memory_bytes == 1e12)
    assert (t.inter_bw < 25e9).sum() == 32
    assert "12.5 GB/s" in t.summary() and "128 GPUs" in t.summary()


def test_available_presets_and_load(tmp_path):
    assert {"2x8", "16x8", "16x8_skewed"} <= set(available_presets())
    assert Topology.load("2x8") == Topology.preset("2x8")
    p = tmp_path / "mine.toml"
    Topology.uniform(1, 2, name="mine").to_toml(p)
    assert Topology.load(p) == Topology.uniform(1, 2, name="mine")
    assert Topology.load(str(p)) == Topology.uniform(1, 2, name="mine")
    with pytest.raises(ConfigError, match=r"'nope'.*2x8"):
        Topology.load("nope")


def test_unknown_preset_lists_available():
    with pytest.raises(ConfigError) as e:
        Topology.preset("4x4")
    msg = str(e.value)
    assert "'4x4'" in msg and "2x8" in msg and "16x8_skewed" in msg


# ----------------------------------------------------------------------------- shape helpers
def test_node_local_gpus_of_node():
    t = Topology.uniform(3, 4)
    g = np.arange(12)
    np.testing.assert_array_equal(t.node_of(g), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(t.local_of(g), [0, 1, 2, 3] * 3)
    assert t.node_of(7) == 1 and t.local_of(7) == 3
    np.testing.assert_array_equal(t.gpus_of_node(2), [8, 9, 10, 11])
    with pytest.raises(ConfigError, match="GPU index 12 out of range"):
        t.node_of(np.array([0, 12]))
    with pytest.raises(ConfigError, match="node index 3 out of range"):
        t.gpus_of_node(3)


def test_link_class_matrix_2x2():
    m = Topology.uniform(2, 2).link_class_matrix()
    assert m.dtype == np.int8
    np.testing.assert_array_equal(m, [[0, 1, 2, 2],
                                      [1, 0, 2, 2],
                                      [2, 2, 0, 1],
                                      [2, 2, 1, 0]])


def test_arrays_are_read_only_and_copied():
    hbm = np.full(2, 1e9)
    t = Topology(1, 2, hbm, np.full(2, 1e9), np.full(2, 1e9), np.full(2, 1e9), np.full(1, 1e9))
    hbm[0] = 5.0
    assert t.hbm_bytes[0] == 1e9
    with pytest.raises(ValueError):
        t.hbm_bytes[0] = 2.0


def test_equality_covers_every_field():
    base = Topology.uniform(2, 2, name="a")
    assert base == Topology.uniform(2, 2, name="a")
    assert hash(base) == hash(Topology.uniform(2, 2, name="a"))
    assert base != Topology.uniform(2, 2, name="b")
    assert base != Topology.uniform(1, 4, name="a")
    for key in ("hbm_bytes_per_gpu", "intra_node_bandwidth", "inter_node_bandwidth",
                "host_memory_bytes_per_node", "uvm_bandwidth"):
        assert base != Topology.uniform(2, 2, name="a", **{key: 7e9}), key


# ----------------------------------------------------------------------------- TOML layout
def test_overrides_per_node_then_per_gpu(tmp_path):
    p = write(tmp_path, HEAD + """
[[topology.node]]
index = 1
inter_node_bandwidth = 12.5e9
hbm_bytes_per_gpu = 40e9
host_memory_bytes = 5e11
[[topology.gpu]]
index = 5
inter_node_bandwidth = 10e9
[[topology.gpu]]
index = 0
uvm_bandwidth = 1e9
""")
    t = Topology.from_toml(p)
    np.testing.assert_array_equal(t.inter_bw, [25e9] * 4 + [12.5e9, 10e9, 12.5e9, 12.5e9])
    np.testing.assert_array_equal(t.hbm_bytes, [80e9] * 4 + [40e9] * 4)
    np.testing.assert_array_equal(t.uvm_bw, [1e9] + [25e9] * 7)
    np.testing.assert_array_equal(t.host_memory_bytes, [1e12, 5e11])
    np.testing.assert_array_equal(t.intra_bw, [300e9] * 8)


def test_gpu_override_wins_regardless_of_order(tmp_path):
    # the [[topology.gpu]] table comes first in the file; it must still win over the node's value
    p = write(tmp_path, HEAD + """
[[topology.gpu]]
index = 4
intra_node_bandwidth = 7e9
[[topology.node]]
index = 1
intra_node_bandwidth = 100e9
""")
    t = Topology.from_toml(p)
    np.testing.assert_array_equal(t.intra_bw, [300e9] * 4 + [7e9, 100e9, 100e9, 100e9])


def test_toml_round_trip_with_overrides(tmp_path):
    g = 12
    rng = np.random.default_rng(0)
    inter = np.full(g, 25e9)
    inter[4:8] = 12.5e9                     # a whole node slower -> node override
    inter[9] = 3.3e9                        # one GPU -> GPU override
    hbm = np.full(g, 80e9)
    hbm[2] = 40e9
    intra = rng.uniform(1e9, 1e12, g)       # arbitrary floats must survive exactly
    t = Topology(3, 4, hbm, intra, inter, np.full(g, 25e9), np.array([1e12, 2e12, 1e12]),
                 name='odd "name" \\ \u00e9')
    p = tmp_path / "rt.toml"
    t.to_toml(p)
    back = Topology.from_toml(p)
    assert back == t
    assert Topology.from_dict(t.to_dict()) == t
    d = t.to_dict()["topology"]
    assert d["inter_node_bandwidth"] == 25e9
    nodes = {e["index"]: e for e in d["node"]}
    assert nodes[1]["inter_node_bandwidth"] == 12.5e9 and nodes[1]["host_memory_bytes"] == 2e12
    assert 0 not in nodes or "inter_node_bandwidth" not in nodes[0]
    gpus = {e["index"]: e for e in d["gpu"]}
    assert gpus[9]["inter_node_bandwidth"] == 3.3e9
    assert "inter_node_bandwidth" not in gpus[10] and "hbm_bytes_per_gpu" not in gpus[10]
    assert gpus[2]["hbm_bytes_per_gpu"] == 40e9


def test_uniform_to_dict_has_no_overrides(tmp_path):
    t = Topology.preset("16x8")
    d = t.to_dict()
    assert "node" not in d["topology"] and "gpu" not in d["topology"]
    p = tmp_path / "u.toml"
    t.to_toml(p)
    text = p.read_text()
    assert "inter_node_bandwidth = 25e9" in text and "[[topology" not in text
    skew = Topology.preset("16x8_skewed").to_dict()["topology"]
    assert [e["index"] for e in skew["node"]] == [12, 13, 14, 15] and "gpu" not in skew


def test_defaults_when_optional_keys_missing(tmp_path):
    t = Topology.from_toml(write(tmp_path, HEAD))
    assert t == Topology.uniform(2, 4)


# ----------------------------------------------------------------------------- TOML errors
@pytest.mark.parametrize("body,pattern", [
    ("[topology]\nnodes = 0\ngpus_per_node = 8\n", r"nodes = 0: must be a positive integer"),
    ("[topology]\nnodes = 2\ngpus_per_node = -1\n", r"gpus_per_node = -1: must be a positive"),
    ("[topology]\nnodes = 2.5\ngpus_per_node = 8\n", r"nodes = 2\.5: must be a positive integer"),
    (HEAD + "hbm_bytes_per_gpu = 0\n", r"hbm_bytes_per_gpu = 0: must be a finite number > 0 "
                                       r"\(bytes\)"),
    (HEAD + "inter_node_bandwidth = -25e9\n", r"inter_node_bandwidth = -25000000000\.0: must be "
                                              r"a finite number > 0 \(bytes/s\)"),
    (HEAD + "uvm_bandwidth = inf\n", r"uvm_bandwidth = inf: must be a finite number"),
    (HEAD + 'intra_node_bandwidth = "fast"\n', r"intra_node_bandwidth = 'fast': must be a number "
                                               r"\(bytes/s\), got str"),
    (HEAD + "uvm_bandwidth = true\n", r"uvm_bandwidth = True: must be a number"),
    (HEAD + "nvlink = 3\n", r"\[topology\]: unknown key\(s\) \['nvlink'\] \(value 3\); known "
                            r"keys: \['name', 'nodes', 'gpus_per_node'"),
    (HEAD + "[[topology.node]]\nindex = 2\ninter_node_bandwidth = 1e9\n",
     r"\[\[topology.node\]\] entry 0 \(0-based\): index = 2 out of range \[0, 2\)"),
    (HEAD + "[[topology.node]]\nindex = -1\n", r"index = -1 out of range \[0, 2\)"),
    (HEAD + "[[topology.gpu]]\nindex = 8\nuvm_bandwidth = 1e9\n",
     r"\[\[topology.gpu\]\] entry 0 \(0-based\): index = 8 out of range \[0, 8\)"),
    (HEAD + "[[topology.node]]\nindex = 1\n[[topology.node]]\nindex = 1\n",
     r"entry 1 \(0-based\): index = 1 given twice \(also in entry 0\)"),
    (HEAD + "[[topology.gpu]]\nindex = 3\n[[topology.gpu]]\nindex = 3\n", r"index = 3 given twice"),
    (HEAD + "[[topology.node]]\ninter_node_bandwidth = 1e9\n", r"missing the required key 'index'"),
    (HEAD + '[[topology.node]]\nindex = "1"\n', r"index = '1': must be an integer"),
    (HEAD + "[[topology.node]]\nindex = 0\ninter_node_bandwidth = 0\n",
     r"\[\[topology.node\]\] index = 0: inter_node_bandwidth = 0: must be a finite number > 0"),
    (HEAD + "[[topology.node]]\nindex = 0\nspeed = 1\n",
     r"unknown key\(s\) \['speed'\].*known keys: \['index', 'hbm_bytes_per_gpu'.*'host_memory_bytes'\]"),
    (HEAD + "[[topology.gpu]]\nindex = 0\nhost_memory_bytes = 1e9\n",
     r"unknown key\(s\) \['host_memory_bytes'\]"),
    (HEAD + "[[topology.gpu]]\nindex = 1\nhbm_bytes_per_gpu = 'x'\n",
     r"\[\[topology.gpu\]\] index = 1: hbm_bytes_per_gpu = 'x': must be a number \(bytes\)"),
    ("[cluster]\nnodes = 2\n", r"missing \[topology\] table"),
    ("", r"missing \[topology\] table"),
    ("[topology]\ngpus_per_node = 8\n", r"missing the required key 'nodes'"),
    ("[topology]\nnodes = 8\n", r"missing the required key 'gpus_per_node'"),
    (HEAD + "name = 3\n", r"name = 3: must be a string"),
    ("x = 1\n" + HEAD, r"unknown key\(s\) \['x'\]"),
])
def test_toml_errors(tmp_path, body, pattern):
    p = write(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        Topology.from_toml(p)
    msg = str(e.value)
    assert str(p) in msg, msg
    assert re.search(pattern, msg), msg


def test_invalid_toml_is_format_error(tmp_path):
    p = write(tmp_path, "[topology\nnodes = 2\n")
    with pytest.raises(FormatError, match=re.escape(str(p)) + ".*not a valid TOML"):
        Topology.from_toml(p)
    q = tmp_path / "bin.toml"
    q.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FormatError, match=re.escape(str(q))):
        Topology.from_toml(q)
    with pytest.raises(FormatError, match="no such file"):
        Topology.from_toml(tmp_path / "missing.toml")


def test_constructor_errors():
    with pytest.raises(ConfigError, match=r"Topology.inter_bw\[1\] = 0\.0: must be a finite"):
        Topology(1, 2, np.ones(2), np.ones(2), np.array([1.0, 0.0]), np.ones(2), np.ones(1))
    with pytest.raises(ConfigError, match=r"Topology.host_memory_bytes: shape \(2,\), expected "
                                          r"\(1,\)"):
        Topology(1, 2, np.ones(2), np.ones(2), np.ones(2), np.ones(2), np.ones(2))
    with pytest.raises(ConfigError, match=r"Topology.uvm_bw\[0\] = nan"):
        Topology(1, 2, np.ones(2), np.ones(2), np.ones(2), np.full(2, np.nan), np.ones(1))
    with pytest.raises(ConfigError, match=r"nodes = 0: must be a positive integer"):
        Topology.uniform(0, 8)
    with pytest.raises(ConfigError, match=r"hbm_bytes_per_gpu = -1: must be a finite number"):
        Topology.uniform(1, 8, hbm_bytes_per_gpu=-1)


# ----------------------------------------------------------------------------- tables
def test_table_byte_properties():
    t = EmbeddingTable("items", num_rows=1000, dim=128, dtype="fp16", optimizer_state_bytes=4)
    assert t.element_bytes == 2
    assert t.embedding_bytes == 256                # 128 * 2
    assert t.row_bytes == 260                      # 256 + 4
    assert t.table_bytes == 260_000                # 1000 * 260
    assert t.feature == "items" and t.kind == "sequence"
    u = EmbeddingTable("u", num_rows=10, dim=3)    # fp32, no optimizer state
    assert (u.element_bytes, u.embedding_bytes, u.row_bytes, u.table_bytes) == (4, 12, 12, 120)
    assert DTYPE_BYTES["bf16"] == 2


@pytest.mark.parametrize("kw,pattern", [
    (dict(num_rows=0), r"num_rows = 0: must be > 0"),
    (dict(num_rows=-5), r"num_rows = -5: must be > 0"),
    (dict(dim=0), r"dim = 0: must be > 0"),
    (dict(dim=2.5), r"dim = 2\.5: must be an integer"),
    (dict(dtype="int8"), r"dtype = 'int8': unknown; valid dtypes: \['fp32', 'fp16', 'bf16'\]"),
    (dict(kind="jagged"), r"kind = 'jagged': unknown; valid kinds: \['sequence', 'pooled'\]"),
    (dict(optimizer_state_bytes=-1), r"optimizer_state_bytes = -1: must be >= 0"),
    (dict(name=""), r"name = '': must be a non-empty string"),
])
def test_table_errors(kw, pattern):
    args = dict(name="t", num_rows=10, dim=4)
    args.update(kw)
    with pytest.raises(ConfigError, match=pattern):
        EmbeddingTable(**args)


def test_tables_toml_round_trip(tmp_path):
    tables = [EmbeddingTable("items", 100_000_000, 128, "fp32", "sequence", "item_history", 4),
              EmbeddingTable("user", 5, 16, "bf16", "pooled"),
              EmbeddingTable('we"ird', 7, 8, "fp16", feature="a\\b")]
    p = tmp_path / "tables.toml"
    save_tables(tables, p)
    assert load_tables(p) == tables
    assert load_tables(p)[1].feature == "user"


def test_tables_toml_defaults_and_integral_floats(tmp_path):
    p = write(tmp_path, '[[table]]\nname = "a"\nnum_rows = 1e8\ndim = 64\n', "t.toml")
    (t,) = load_tables(p)
    assert t == EmbeddingTable("a", 100_000_000, 64)
    assert isinstance(t.num_rows, int) and t.feature == "a" and t.dtype == "fp32"


@pytest.mark.parametrize("body,pattern", [
    ('[[table]]\nname = "a"\nnum_rows = 10\n',
     r"\[\[table\]\] entry 0 \(0-based\), name 'a': missing the required key 'dim'"),
    ('[[table]]\nname = "a"\nnum_rows = 10\ndim = 4\n[[table]]\nnum_rows = 10\ndim = 4\n',
     r"entry 1 \(0-based\): missing the required key 'name'"),
    ('[[table]]\nname = "a"\nnum_rows = 10\ndim = 4\nrows = 3\n',
     r"unknown key\(s\) \['rows'\] \(value 3\); known keys: \['name', 'feature', 'num_rows'"),
    ('[[table]]\nname = "a"\nnum_rows = 10\ndim = 4\n[[table]]\nname = "a"\nnum_rows = 1\n'
     'dim = 1\n', r"duplicate table name 'a' \(entries 0 and 1"),
    ('[[table]]\nname = "a"\nnum_rows = 0\ndim = 4\n', r"entry 0 \(0-based\), .*num_rows = 0"),
    ('[[table]]\nname = "a"\nnum_rows = 10\ndim = 4\ndtype = "fp64"\n',
     r"dtype = 'fp64': unknown; valid dtypes"),
    ('[[table]]\nname = "a"\nnum_rows = 10\ndim = 4\nkind = "bag"\n',
     r"kind = 'bag': unknown; valid kinds: \['sequence', 'pooled'\]"),
    ('[[table]]\nname = "a"\nnum_rows = 10\ndim = 4\noptimizer_state_bytes = -8\n',
     r"optimizer_state_bytes = -8: must be >= 0"),
    ('[[table]]\nname = "a"\nnum_rows = "many"\ndim = 4\n', r"num_rows = 'many': must be an "
                                                              r"integer"),
    ('title = "x"\n', r"unknown top-level key\(s\) \['title'\]"),
    ('', r"no \[\[table\]\] entries"),
])
def test_tables_toml_errors(tmp_path, body, pattern):
    p = write(tmp_path, body, "t.toml")
    with pytest.raises(ConfigError) as e:
        load_tables(p)
    msg = str(e.value)
    assert str(p) in msg, msg
    assert re.search(pattern, msg), msg


def test_tables_invalid_toml(tmp_path):
    p = write(tmp_path, "[[table]\n", "t.toml")
    with pytest.raises(FormatError, match=re.escape(str(p))):
        load_tables(p)


def test_tables_by_feature():
    a = EmbeddingTable("a", 10, 4)
    b = EmbeddingTable("b", 10, 4, feature="f")
    assert tables_by_feature([a, b]) == {"a": a, "f": b}
    with pytest.raises(ConfigError, match=r"'b' and 'c' are both fed by feature 'f'"):
        tables_by_feature([a, b, EmbeddingTable("c", 3, 4, feature="f")])


def test_infer_tables_from_parquet(tmp_path):
    p = tmp_path / "log.parquet"
    pl.DataFrame({
        "ts": [1.0, 2.0, 3.0],
        "history": pl.Series([[3, 17, 2], [], [40, 1]], dtype=pl.List(pl.Int64)),
        "user": pl.Series([5, 0, 9], dtype=pl.Int64),
    }).write_parquet(p)
    tables = infer_tables(p)
    assert tables == [EmbeddingTable("history", 41, 128, "fp32", "sequence", "history"),
                      EmbeddingTable("user", 10, 128, "fp32", "pooled", "user")]
    (only,) = infer_tables(p, features=["user"], dim=16, dtype="fp16", optimizer_state_bytes=4)
    assert (only.name, only.num_rows, only.dim, only.dtype, only.kind, only.row_bytes) == \
        ("user", 10, 16, "fp16", "pooled", 36)
    with pytest.raises(ConfigError, match=r"dtype = 'fp8': unknown"):
        infer_tables(p, dtype="fp8")
    with pytest.raises(ConfigError, match=r"dim = 0: must be > 0"):
        infer_tables(p, dim=0)


def test_infer_tables_empty_feature(tmp_path):
    p = tmp_path / "empty.parquet"
    pl.DataFrame({"h": pl.Series([[], []], dtype=pl.List(pl.Int64))}).write_parquet(p)
    with pytest.raises(ConfigError, match=r"feature 'h' holds no ID"):
        infer_tables(p)


def test_small_presets_and_any_case():
    """Small presets for local tests, demos and the emulated cluster; a preset name in any case
    (``--topology 16X8`` was refused while strategies took any case)."""
    for name, (n, m) in {"1x2": (1, 2), "2x2": (2, 2), "2x4": (2, 4)}.items():
        t = Topology.preset(name)
        assert (t.nodes, t.gpus_per_node, t.name) == (n, m, name)
        assert float(t.hbm_bytes.min()) == 80e9
    assert Topology.load("16X8").name == "16x8" and Topology.preset("2X4").num_gpus == 8
    with pytest.raises(ConfigError, match="neither an existing topology file, a preset nor NxM"):
        Topology.load("big")


def test_nxm_is_a_uniform_cluster_of_preset_like_nodes():
    """``--topology 4x8`` without a file: 4 nodes of 8 DGX-style GPUs (the presets' figures); a
    preset of that name wins; impossible shapes are refused with the preset list's error."""
    t = Topology.load("4x8")
    assert (t.nodes, t.gpus_per_node, t.name) == (4, 8, "4x8")
    two = Topology.preset("2x8")
    assert t == Topology.uniform(4, 8, name="4x8")
    assert float(t.hbm_bytes[0]) == float(two.hbm_bytes[0])
    assert float(t.inter_bw[0]) == float(two.inter_bw[0])
    assert float(t.intra_bw[0]) == float(two.intra_bw[0])
    assert Topology.load("3X3").num_gpus == 9 and Topology.load("2x8") == two
    for bad in ("0x8", "200x100"):
        with pytest.raises(ConfigError):
            Topology.load(bad)
