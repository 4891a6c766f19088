"""StreamStats: batches, merge, save/load, damaged files, windows and decay."""
import struct

import numpy as np
import pytest
from conftest import zipf_stream
from hypothesis import given
from hypothesis import strategies as st

from flexshard_stream import (
    Batch,
    BatchError,
    DecayedStats,
    FormatError,
    IncompatibleError,
    SketchConfig,
    StreamStats,
    WindowedStats,
)
from flexshard_stream.formats.container import MAGIC, VERSION

CFG = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, hh_lg_size=6, hll_p=8)


def same_counts(a, b, heavy_hitters=True):
    """Equal statistics except the KLL length sketches (whose compaction is randomized) and,
    for merged views, the heavy hitters (whose merge only keeps the bounds)."""
    assert set(a) == set(b)
    skip = {"lengths"} if heavy_hitters else {"lengths", "mg_keys", "mg_vals", "mg_meta"}
    for f in a:
        x, y = a[f]._arrays(), b[f]._arrays()
        for k in x:
            if k not in skip:
                assert np.array_equal(x[k], y[k]), (f, k)
        assert a[f].total == b[f].total and a[f].samples == b[f].samples
    return True


def batches(n_batches, bs=64, seed=0, ts0=0.0, hot_offset=0):
    rng = np.random.default_rng(seed)
    for i in range(n_batches):
        lens = rng.integers(0, 6, size=bs)
        seq = (zipf_stream(int(lens.sum()), 1000, 1.2, seed * 1000 + i) + hot_offset) % 5000
        one = rng.integers(0, 50, size=bs)
        yield Batch(["seq", "one"], np.concatenate([seq, one]),
                    np.concatenate([lens, np.ones(bs, np.int64)]),
                    timestamp=ts0 + i + np.linspace(0, 0.5, bs))


def test_update_counts_and_lengths():
    s = StreamStats({"seq": None, "one": 50}, CFG)
    bs = list(batches(5))
    for b in bs:
        s.update(b)
    assert s.batches == 5 and s.samples == 5 * 64
    assert s["seq"].total == sum(b.feature_values("seq").size for b in bs)
    assert s["one"].exact and not s["seq"].exact
    allone = np.concatenate([b.feature_values("one") for b in bs])
    assert np.array_equal(s["one"].estimate(np.arange(50)), np.bincount(allone, minlength=50))
    assert s["one"].length_quantiles()["0.5"] == 1.0
    assert s.first_ts == 0.0 and s.last_ts == 4.5


def test_threads_give_identical_state():
    a = StreamStats({"seq": None, "one": 50}, CFG)
    b = StreamStats({"seq": None, "one": 50}, CFG, threads=2)
    for x in batches(6):
        a.update(x)
        b.update(x)
    b.close()
    assert same_counts(a, b)


def test_auto_tables():
    s = StreamStats(config=CFG)
    s.update(next(batches(1)))
    assert set(s) == {"seq", "one"}


def test_merge_two_hosts_equals_one():
    whole = StreamStats({"seq": None, "one": 50}, CFG)
    h1 = StreamStats({"seq": None, "one": 50}, CFG)
    h2 = StreamStats({"seq": None, "one": 50}, CFG)
    for i, b in enumerate(batches(8)):
        whole.update(b)
        (h1 if i % 2 else h2).update(b)
    h1.merge(h2)
    assert np.array_equal(h1["seq"]._cms, whole["seq"]._cms)
    assert np.array_equal(h1["one"]._counts, whole["one"]._counts)
    assert h1["seq"].total == whole["seq"].total and h1.samples == whole.samples
    assert h1["seq"].length_quantiles() == pytest.approx(whole["seq"].length_quantiles(), abs=1)


def test_merge_incompatible_changes_nothing():
    a = StreamStats({"seq": None, "one": 50}, CFG)
    a.update(next(batches(1)))
    before = a.to_bytes()
    b = StreamStats({"seq": None, "one": 50}, SketchConfig(cms_epsilon=0.02, hh_lg_size=6))
    with pytest.raises(IncompatibleError, match="configs differ"):
        a.merge(b)
    c = StreamStats({"seq": None, "one": 60}, CFG)
    with pytest.raises(IncompatibleError, match="table 'one': num_rows differ"):
        a.merge(c)
    d = StreamStats({"seq": None, "one": 50}, SketchConfig(cms_epsilon=0.01, cms_delta=0.05,
                                                            hh_lg_size=6, hll_p=8, seed=7))
    with pytest.raises(IncompatibleError, match="seed"):
        a.merge(d)
    assert a.to_bytes() == before


def test_save_load_round_trip(tmp_path):
    s = StreamStats({"seq": None, "one": 50}, CFG)
    for b in batches(3):
        s.update(b)
    p = s.save(tmp_path / "stats.fss")
    t = StreamStats.load(p)
    assert t.to_bytes() == s.to_bytes()
    assert t.summary(5)["seq"].top_ids.tolist() == s.summary(5)["seq"].top_ids.tolist()


@pytest.fixture
def saved(tmp_path):
    s = StreamStats({"seq": None, "one": 50}, CFG)
    for b in batches(2):
        s.update(b)
    p = s.save(tmp_path / "stats.fss")
    return p, p.read_bytes()


def _blob():
    s = StreamStats({"seq": None, "one": 50}, CFG)
    for b in batches(2):
        s.update(b)
    return s.to_bytes()


BLOB = None


@given(st.data())
def test_any_single_byte_damage_is_detected(data):
    global BLOB
    BLOB = BLOB or _blob()
    blob = BLOB
    i = data.draw(st.integers(0, len(blob) - 1))
    flip = data.draw(st.integers(1, 255))
    bad = bytearray(blob)
    bad[i] ^= flip
    with pytest.raises(FormatError):
        StreamStats.from_bytes(bytes(bad), "damaged.fss")


def test_truncated_foreign_and_future_files(saved, tmp_path):
    p, blob = saved
    for cut in (0, 5, 30, len(blob) // 2, len(blob) - 1):
        with pytest.raises(FormatError, match="damaged.fss"):
            StreamStats.from_bytes(blob[:cut], "damaged.fss")
    with pytest.raises(FormatError, match="not a flexshard_stream state file"):
        StreamStats.from_bytes(b"PAR1" + b"\0" * 100, "x.parquet")
    future = bytearray(blob)
    struct.pack_into("<H", future, len(MAGIC), VERSION + 1)
    with pytest.raises(FormatError, match=f"format version {VERSION + 1} is not supported"):
        StreamStats.from_bytes(bytes(future), "future.fss")
    with pytest.raises(FormatError, match="no such statistics file"):
        StreamStats.load(tmp_path / "missing.fss")


def test_failed_save_keeps_previous_file(saved, monkeypatch):
    p, blob = saved
    s = StreamStats.load(p)
    s.update(next(batches(1, seed=9)))
    import flexshard_stream.formats.container as c

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(c.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        s.save(p)
    assert p.read_bytes() == blob
    assert [f.name for f in p.parent.iterdir()] == [p.name]  # no temp file left behind


def test_window_forgets_old_batches():
    w = WindowedStats({"seq": None, "one": 50}, CFG, window=4, slots=4)
    for b in batches(4, seed=1):
        w.update(b)
    for b in batches(4, seed=2, hot_offset=2500):
        w.update(b)
    v = w.view()
    fresh = StreamStats({"seq": None, "one": 50}, CFG)
    for b in batches(4, seed=2, hot_offset=2500):
        fresh.update(b)
    assert same_counts(v, fresh, heavy_hitters=False)
    true = np.bincount(np.concatenate([b.feature_values("seq")
                                       for b in batches(4, seed=2, hot_offset=2500)]), minlength=5000)
    _, lo, hi = v["seq"].bounds(np.arange(5000))
    assert np.all(lo <= true) and np.all(true <= hi)
    assert w.live_slots == 4


def test_window_by_time():
    w = WindowedStats({"seq": None, "one": 50}, CFG, window=3.0, slots=3, unit="seconds")
    for b in batches(10):
        w.update(b)
    v = w.view()
    assert v.first_ts >= 6.0  # batches are 1 s apart: the last 3-4 s are remembered
    assert v.samples <= 4 * 64


def test_decay_halves_old_counts():
    d = DecayedStats({"seq": None, "one": 50}, CFG, half_life=4, period=4)
    bs = list(batches(9))
    for b in bs:
        d.update(b)
    assert d.decays == 2
    one = d.view()["one"]
    c = [np.bincount(b.feature_values("one"), minlength=50) for b in bs]
    expect = (sum(c[:4]) * 0.25 + sum(c[4:8]) * 0.5 + c[8])
    assert np.all(np.abs(one.estimate(np.arange(50)) - expect) <= 2)


def test_bad_window_config():
    from flexshard_stream import ConfigError
    with pytest.raises(ConfigError, match="window must be > 0"):
        WindowedStats(window=0)
    with pytest.raises(ConfigError, match="unit must be"):
        WindowedStats(window=3, unit="hours")
    with pytest.raises(ConfigError, match="half_life"):
        DecayedStats(half_life=-1)


def test_config_errors():
    from flexshard_stream import ConfigError, TableConfig
    with pytest.raises(ConfigError, match="cms_epsilon"):
        SketchConfig(cms_epsilon=0)
    with pytest.raises(ConfigError, match="num_rows must be a positive integer"):
        TableConfig("t", -3)
    c = SketchConfig.from_error(0.001, 0.01)
    assert c.cms_width == 4096 and c.cms_depth == 5


def test_summary_probabilities_of_any_ids():
    st = StreamStats({"a": 100})
    st.update(Batch(["a"], np.array([5, 5, 5, 7], np.int64), np.ones(4, np.int64)))
    s = st.summary(1)["a"]                      # top row 5; row 7 and the rest are the tail
    p = s.probabilities(np.array([5, 7, 50]))
    assert p[0] == pytest.approx(0.75)
    assert p[1] == p[2] == pytest.approx(s.tail_probability()) and p[1] > 0
    assert StreamStats({"a": 100}).summary(1)["a"].probabilities(np.array([1])).tolist() == [0.0]


# ----------------------------------------------------------------------- the state protocol

SIZES = {"seq": None, "one": 50}
SOURCES = {
    "stream": lambda **kw: StreamStats(SIZES, CFG),
    "windowed": lambda **kw: WindowedStats(SIZES, CFG, window=kw.get("window", 4), slots=4),
    "decayed": lambda **kw: DecayedStats(SIZES, CFG, half_life=kw.get("half_life", 4), period=2),
}


def _summaries_equal(a, b):
    sa, sb = a.view().summary(50), b.view().summary(50)
    assert set(sa) == set(sb)
    for f in sa:
        x, y = sa[f], sb[f]
        assert np.array_equal(x.top_ids, y.top_ids) and np.array_equal(x.top_est, y.top_est)
        assert (x.total, x.distinct_estimate, x.tail_mass, x.samples) == \
            (y.total, y.distinct_estimate, y.tail_mass, y.samples)
    return True


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_state_round_trip_behaves_identically(kind):
    a = SOURCES[kind]()
    for b in batches(7, seed=3):
        a.update(b)
    twin = SOURCES[kind]()
    assert twin.restore(a.state()) == []
    assert _summaries_equal(a, twin) and same_counts(a.view(), twin.view())
    for b in batches(6, seed=4, ts0=7.0, hot_offset=1200):  # decays and window turns ahead
        a.update(b)
        twin.update(b)
    assert _summaries_equal(a, twin) and same_counts(a.view(), twin.view())
    assert a.view().batches == twin.view().batches
    if kind == "decayed":
        assert a.decays == twin.decays > 0
    if kind == "windowed":
        assert a.live_slots == twin.live_slots


def test_stream_state_is_json_scalars_and_bytes():
    s = StreamStats(SIZES, CFG).update(next(batches(1)))
    st = s.state()
    assert (st["kind"], st["version"]) == ("stream", 1)
    assert StreamStats.from_bytes(st["blobs"]["stats.fss"]).batches == 1
    assert s.view() is s


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_restore_refuses_bad_states_and_changes_nothing(kind):
    from flexshard_stream import ConfigError
    obj = SOURCES[kind]()
    for b in batches(5, seed=5):
        obj.update(b)
    good = obj.state()
    other = WindowedStats(SIZES, CFG, window=2) if kind != "windowed" else StreamStats(SIZES, CFG)
    foreign = {"stream": lambda: StreamStats({"seq": None}, CFG),
               "windowed": lambda: WindowedStats({"seq": None}, CFG, window=4, slots=4),
               "decayed": lambda: DecayedStats({"seq": None}, CFG, half_life=4, period=2)}[kind]()
    foreign.update(Batch(["seq"], [1, 2], [1, 1]))
    blob_name = next(iter(good["blobs"]))
    damaged = bytearray(good["blobs"][blob_name])
    damaged[len(damaged) // 2] ^= 0xFF
    bad = [({**good, "version": 2}, FormatError, "version 2"),
           (other.state(), ConfigError, "cannot be restored"),
           ({k: v for k, v in good.items() if k != "blobs"}, FormatError, "blobs"),
           ({**good, "blobs": {**good["blobs"], blob_name: bytes(damaged)}}, FormatError,
            "damaged|checksum|CRC"),
           (foreign.state(), ConfigError, "tables"),
           ("not a state", FormatError, "mapping")]
    if kind != "stream":
        bad.append(({**good, "seen": "many"}, FormatError, "'seen'"))
    for state, error, match in bad:
        with pytest.raises(error, match=match):
            obj.restore(state)
        assert obj.state() == good


def test_restore_keeps_own_settings_and_says_which_differ():
    a = DecayedStats(SIZES, CFG, half_life=4, period=2)
    for b in batches(5):
        a.update(b)
    b = DecayedStats(SIZES, CFG, half_life=8, period=2)
    notes = b.restore(a.state())
    assert len(notes) == 1 and "half_life" in notes[0] and b.half_life == 8.0
    assert b.decays == a.decays and b.view().to_bytes() == a.view().to_bytes()
    w = WindowedStats(SIZES, CFG, window=4, slots=4, unit="seconds")
    from flexshard_stream import ConfigError
    with pytest.raises(ConfigError, match="unit"):
        w.restore(WindowedStats(SIZES, CFG, window=4, slots=4).state())


def test_a_batch_is_validated_once(monkeypatch):
    import flexshard_stream.stats.stream as stream_mod
    import flexshard_stream.stats.window as window_mod
    calls, original = [], stream_mod.validate_batch

    def counting(*a, **kw):
        calls.append(1)
        return original(*a, **kw)
    monkeypatch.setattr(window_mod, "validate_batch", counting)
    monkeypatch.setattr(stream_mod, "validate_batch", counting)
    for make in (SOURCES["windowed"], SOURCES["decayed"]):
        s = make()
        calls.clear()
        for b in batches(3):
            s.update(b)
        assert len(calls) == 3   # the outer edge only: the inner StreamStats does not re-check
        assert s.view().batches == 3
    d = SOURCES["decayed"]()
    with pytest.raises(BatchError, match="out of range"):
        d.update(Batch(["one"], [50], [1]))
    assert d.view().batches == 0 and d.decays == 0


# ------------------------------------------------------------------------ sampled ingestion
SAMPLED_CFG = SketchConfig(cms_epsilon=0.01, cms_delta=0.05, hh_lg_size=6, hll_p=8, sample_k=3,
                           sample_seed=11)


def test_sampled_stream_threads_merge_and_save(tmp_path):
    """Sampled statistics: threads change nothing, two hosts merge (the sampled counts add, the
    exact parts stay exact), a save and load keeps the sampler's place in the stream."""
    one = StreamStats({"seq": None, "one": 50}, SAMPLED_CFG)
    two = StreamStats({"seq": None, "one": 50}, SAMPLED_CFG, threads=2)
    h1 = StreamStats({"seq": None, "one": 50}, SAMPLED_CFG)
    h2 = StreamStats({"seq": None, "one": 50}, SAMPLED_CFG)
    bs = list(batches(8))
    for i, b in enumerate(bs):
        one.update(b)
        two.update(b)
        (h1 if i % 2 else h2).update(b)
    two.close()
    assert same_counts(one, two)
    h1.merge(h2)
    assert h1["seq"].total == one["seq"].total
    assert np.array_equal(h1["one"]._counts, one["one"]._counts)   # exact tables: not sampled
    assert h1["seq"].distinct() == one["seq"].distinct()             # HLL saw every ID
    p = tmp_path / "sampled.fss"
    one.save(p)
    back = StreamStats.load(p)
    extra = list(batches(3, seed=5))
    for b in extra:
        one.update(b)
        back.update(b)
    assert same_counts(one, back)


def test_sampled_and_unsampled_streams_do_not_merge():
    a = StreamStats({"seq": None, "one": 50}, SAMPLED_CFG)
    a.update(next(batches(1)))
    before = a.to_bytes()
    b = StreamStats({"seq": None, "one": 50}, CFG)
    b.update(next(batches(1)))
    with pytest.raises(IncompatibleError, match="sample"):
        a.merge(b)
    assert a.to_bytes() == before
