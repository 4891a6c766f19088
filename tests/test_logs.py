"""Tests of flexshard_stream.sources.logs: streaming parquet / CSV logs into batches."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexshard_stream import Batch, LogError
from flexshard_stream.sources import logs as logs_mod
from flexshard_stream.sources.logs import (
    REASONS,
    LogReader,
    LogSchema,
    inspect_log,
    log_max_ids,
    read_log,
)


# ----------------------------------------------------------------------------- helpers
def make_rows(rng: np.random.Generator, n: int, t0: float = 0.0) -> list[dict[str, Any]]:
    """Plain-Python rows: ts, a single ID ``u``, a sequence ``seq`` (lengths 0..6), a float."""
    rows = []
    for i in range(n):
        k = int(rng.integers(0, 7))
        rows.append({"ts": t0 + i * 0.5, "u": int(rng.integers(0, 1 << 40)),
                     "seq": [int(x) for x in rng.integers(0, 1000, k)],
                     "score": float(rng.random())})
    return rows


def frame(rows: list[dict[str, Any]], ts: bool = True) -> pl.DataFrame:
    df = pl.DataFrame(rows, schema={"ts": pl.Float64, "u": pl.Int64, "seq": pl.List(pl.Int64),
                                    "score": pl.Float64})
    return df if ts else df.drop("ts")


def write(df: pl.DataFrame, path: Path, row_group_size: int = 4) -> Path:
    """Write a frame as parquet (small row groups) or CSV (sequences as space-separated IDs)."""
    if path.suffix == ".parquet":
        df.write_parquet(path, row_group_size=row_group_size)
    else:
        df.with_columns(pl.col(c).list.eval(pl.element().cast(pl.String)).list.join(" ")
                        for c, t in df.schema.items() if isinstance(t, pl.List)).write_csv(path)
    return path


def samples(batches: list[Batch]) -> list[dict[str, Any]]:
    """Batches -> per-sample dicts {feature: [ids], 'ts': t}, by plain Python loops."""
    out = []
    for b in batches:
        per_key = {}
        for k in b.keys:
            vals = b.feature_values(k).tolist()
            lens = b.feature_lengths(k).tolist()
            pos, seqs = 0, []
            for l in lens:
                seqs.append(vals[pos:pos + l])
                pos += l
            per_key[k] = seqs
        for i in range(b.batch_size):
            s = {k: per_key[k][i] for k in b.keys}
            if b.timestamp is not None:
                s["ts"] = float(b.timestamp[i])
            out.append(s)
    return out


def reference(rows: list[dict[str, Any]], ts: bool) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        s = {"u": [r["u"]], "seq": list(r["seq"])}
        if ts:
            s["ts"] = r["ts"]
        out.append(s)
    return out


def check_msg(err: pytest.ExceptionInfo, path: Path, row: int | None, column: str | None) -> None:
    msg = str(err.value)
    assert path.name in msg, msg
    if row is not None:
        assert f"row {row} " in msg and "0-based" in msg, msg
    if column is not None:
        assert f"column {column!r}" in msg, msg


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("ext", [".parquet", ".csv", ".csv-small-blocks"])
@pytest.mark.parametrize("with_ts", [True, False])
def test_round_trip_several_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ext: str,
                                  with_ts: bool) -> None:
    if ext == ".csv-small-blocks":
        monkeypatch.setattr(logs_mod, "_CSV_BLOCK", 100)   # CSV blocks of a few rows
        ext = ".csv"
    rng = np.random.default_rng(1)
    sizes = [7, 0, 13, 5, 1]
    rows_all, paths = [], []
    for j, n in enumerate(sizes):
        rows = make_rows(rng, n, t0=100.0 * j)
        rows_all += rows
        paths.append(write(frame(rows, with_ts), tmp_path / f"part{j}{ext}"))
    reader = LogReader(paths, read_batch_size=6)
    assert reader.schema == LogSchema({"u": "single", "seq": "sequence"}, with_ts,
                                   "ts" if with_ts else None)
    batches = list(reader)
    # exact batch sizes; batches span file and row-group boundaries (6 vs files 7, 13, ...)
    assert [b.batch_size for b in batches] == [6, 6, 6, 6, 2]
    assert all(b.keys == ("u", "seq") for b in batches)
    assert all((b.timestamp is not None) == with_ts for b in batches)
    assert all(b.values.dtype == np.int64 and b.lengths.dtype == np.int64 for b in batches)
    assert samples(batches) == reference(rows_all, with_ts)
    assert reader.samples == reader.rows_read == sum(sizes)
    assert reader.skipped == dict.fromkeys(REASONS, 0)


def test_mixed_parquet_and_csv_and_feature_selection(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    r1, r2 = make_rows(rng, 9), make_rows(rng, 4, t0=50)
    paths = [write(frame(r1), tmp_path / "a.parquet"), write(frame(r2), tmp_path / "b.csv")]
    got = samples(list(read_log(paths, features=["seq"], read_batch_size=4)))
    assert got == [{"seq": r["seq"], "ts": r["ts"]} for r in r1 + r2]
    # ts=False drops timestamps; iterating again re-reads
    reader = LogReader(paths, ["seq", "u"], read_batch_size=100, ts=False)
    for _ in range(2):
        (b,) = list(reader)
        assert b.keys == ("seq", "u") and b.timestamp is None and b.batch_size == 13


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4),
       read_batch_size=st.integers(1, 9), rg=st.integers(1, 5), seed=st.integers(0, 2**16),
       block=st.sampled_from([64, 1 << 20]))
def test_round_trip_property(tmp_path: Path, sizes: list[int], read_batch_size: int, rg: int,
                             seed: int, block: int) -> None:
    logs_mod_block = logs_mod._CSV_BLOCK
    logs_mod._CSV_BLOCK = block                      # CSV blocks of ~1 row, or one block
    try:
        _round_trip(tmp_path, sizes, read_batch_size, rg, seed)
    finally:
        logs_mod._CSV_BLOCK = logs_mod_block


def _round_trip(tmp_path: Path, sizes: list[int], read_batch_size: int, rg: int, seed: int
                ) -> None:
    rng = np.random.default_rng(seed)
    rows_all, paths = [], []
    for j, n in enumerate(sizes):
        rows = make_rows(rng, n)
        rows_all += rows
        ext = ".parquet" if (seed + j) % 2 else ".csv"
        paths.append(write(frame(rows), tmp_path / f"p{seed}_{j}{ext}", row_group_size=rg))
    batches = list(read_log(paths, ["u", "seq"], read_batch_size=read_batch_size))
    total = sum(sizes)
    expect_sizes = [read_batch_size] * (total // read_batch_size) + (
        [total % read_batch_size] if total % read_batch_size else [])
    assert [b.batch_size for b in batches] == expect_sizes
    assert samples(batches) == reference(rows_all, True)


def test_large_file_streams_in_several_batches(tmp_path: Path) -> None:
    n = 200_000
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 4, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(0, 1 << 50, int(offsets[-1]))
    u = rng.integers(0, 1 << 30, n)
    table = pa.table({"u": u, "seq": pa.LargeListArray.from_arrays(pa.array(offsets),
                                                                   pa.array(values))})
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=50_000)
    reader = LogReader(path, read_batch_size=65536)
    it = iter(reader)
    first = next(it)
    assert first.batch_size == 65536
    assert reader.rows_read < n                          # streamed: the file was not read whole
    batches = [first] + list(it)
    assert [b.batch_size for b in batches] == [65536, 65536, 65536, n - 3 * 65536]
    assert np.array_equal(np.concatenate([b.feature_values("u") for b in batches]), u)
    assert np.array_equal(np.concatenate([b.feature_lengths("seq") for b in batches]), lengths)
    assert np.array_equal(np.concatenate([b.feature_values("seq") for b in batches]), values)


def test_other_integer_widths_and_fixed_lists(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array([1, 2, 3], pa.int32()), "b": pa.array([4, 5, 6], pa.uint16()),
                      "c": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32(), 2)),
                      "d": pa.array([[7], [], [8, 9]], pa.list_(pa.uint8()))})
    path = tmp_path / "w.parquet"
    pq.write_table(table, path)
    assert inspect_log(path).features == {"a": "single", "b": "single", "c": "sequence",
                                          "d": "sequence"}
    assert samples(list(read_log(path))) == [
        {"a": [1], "b": [4], "c": [1, 2], "d": [7]}, {"a": [2], "b": [5], "c": [3, 4], "d": []},
        {"a": [3], "b": [6], "c": [5, 6], "d": [8, 9]}]


def test_datetime_ts_parquet_and_csv(tmp_path: Path) -> None:
    t0 = dt.datetime(2020, 1, 2, 3, 4, 5)
    epoch = t0.replace(tzinfo=dt.timezone.utc).timestamp()
    df = pl.DataFrame({"ts": [t0, t0 + dt.timedelta(seconds=1.5)], "u": [1, 2]})
    df.write_parquet(tmp_path / "d.parquet")
    (b,) = list(read_log(tmp_path / "d.parquet"))
    assert b.timestamp.tolist() == [epoch, epoch + 1.5]
    (tmp_path / "d.csv").write_text("ts,u\n2020-01-02T03:04:05,1\n1577934246.5,2\n")
    (b,) = list(read_log(tmp_path / "d.csv"))
    assert b.timestamp.tolist() == [epoch, epoch + 1.5]


def test_csv_format_details(tmp_path: Path) -> None:
    # extra whitespace, an empty sequence (quoted and unquoted), tab-separated variant
    p = tmp_path / "x.csv"
    p.write_text('u,seq\n1, 2  3 \n2,""\n3,\n4,5\n')
    assert samples(list(read_log(p, {"u": "single", "seq": "sequence"}))) == [
        {"u": [1], "seq": [2, 3]}, {"u": [2], "seq": []}, {"u": [3], "seq": []},
        {"u": [4], "seq": [5]}]
    t = tmp_path / "x.tsv"
    t.write_text("u\tseq\n1\t2 3\n")
    assert samples(list(read_log(t))) == [{"u": [1], "seq": [2, 3]}]


def test_sliced_arrow_arrays_convert() -> None:
    # arrays that are slices of larger ones (non-zero offsets) convert to the right rows
    lst = pa.array([[9, 9], [1], [], [2, -3], None, [4]], pa.list_(pa.int64())).slice(1, 4)
    c = logs_mod._convert_list(lst)
    assert c.values.tolist()[:3] == [1, 2, -3] and c.lengths.tolist() == [1, 0, 2, 0]
    assert c.row_null.tolist() == [False, False, False, True]
    txt = pa.array(["7 7", "1", "", " 2  x ", "4"]).slice(1, 4)
    t = logs_mod._convert_text(txt)
    assert t.lengths.tolist() == [1, 0, 2, 1] and t.bad_id.tolist() == [False, False, True, False]
    big = pa.array([1, 2**63 + 1, 3], pa.uint64()).slice(1, 2)
    assert logs_mod._convert_int(big).bad_id.tolist() == [True, False]


# ----------------------------------------------------------------------------- inspection
def test_inspect_log_infers_features(tmp_path: Path) -> None:
    rows = make_rows(np.random.default_rng(4), 5)
    df = frame(rows).with_columns(pl.lit("x").alias("name"), pl.col("u").alias("label"))
    pq_path = write(df, tmp_path / "i.parquet")
    csv_path = write(df, tmp_path / "i.csv")
    for p in (pq_path, csv_path):
        s = inspect_log(p)
        assert s.features == {"u": "single", "seq": "sequence", "label": "single"}, p
        assert s.has_ts
        assert inspect_log(p, ignore=["label"]).keys == ("u", "seq")
        assert inspect_log(p, ["seq"]).features == {"seq": "sequence"}
    assert not inspect_log(write(frame(rows, ts=False), tmp_path / "n.parquet")).has_ts


def test_inspect_directory_and_glob(tmp_path: Path) -> None:
    rows = make_rows(np.random.default_rng(5), 3)
    write(frame(rows), tmp_path / "b.parquet")
    write(frame(rows), tmp_path / "a.parquet")
    (tmp_path / "notes.txt").write_text("ignored")
    assert len(samples(list(read_log(tmp_path)))) == 6
    assert len(samples(list(read_log(str(tmp_path / "*.parquet"))))) == 6
    with pytest.raises(LogError, match="no log file matches"):
        inspect_log(str(tmp_path / "*.csv"))


# ----------------------------------------------------------------------------- bad input
def test_missing_column_lists_existing(tmp_path: Path) -> None:
    rows = make_rows(np.random.default_rng(6), 3)
    good = write(frame(rows), tmp_path / "good.parquet")
    other = write(frame(rows).drop("seq"), tmp_path / "other.csv")
    with pytest.raises(LogError) as e:
        LogReader([good, other], ["u", "seq"])
    check_msg(e, other, None, "seq")
    assert "missing" in str(e.value) and "['ts', 'u', 'score']" in str(e.value)


def test_unknown_extension(tmp_path: Path) -> None:
    p = tmp_path / "log.json"
    p.write_text("{}")
    with pytest.raises(LogError, match=r"log\.json.*unknown log file extension '\.json'"):
        read_log(p)


def test_float_column_parquet(tmp_path: Path) -> None:
    p = write(frame(make_rows(np.random.default_rng(7), 3)), tmp_path / "f.parquet")
    with pytest.raises(LogError) as e:
        LogReader(p, ["score"])
    check_msg(e, p, 0, "score")
    assert "wrong type double" in str(e.value)


@pytest.mark.parametrize("cell,why", [("1.5", "not an integer ID"), ("abc", "not an integer ID"),
                                      ("99999999999999999999", "not an integer ID"),
                                      ("3 4", "holds 2 IDs")])
def test_unparseable_single_csv(tmp_path: Path, cell: str, why: str) -> None:
    p = tmp_path / "s.csv"
    p.write_text(f"ts,u\n0,1\n1,2\n2,{cell}\n3,4\n")
    with pytest.raises(LogError) as e:
        list(read_log(p, {"u": "single"}))
    check_msg(e, p, 2, "u")
    assert why in str(e.value) and "line 4" in str(e.value)


def test_unparseable_sequence_csv_and_parquet_strings(tmp_path: Path) -> None:
    p = tmp_path / "q.csv"
    p.write_text("seq\n1 2\n3 x4 5\n")
    with pytest.raises(LogError) as e:
        list(read_log(p, {"seq": "sequence"}))
    check_msg(e, p, 1, "seq")
    assert "'x4' is not a decimal integer" in str(e.value)
    q = tmp_path / "q.parquet"
    pl.DataFrame({"seq": ["1 2", "3", "", "7 -"]}).write_parquet(q)
    with pytest.raises(LogError) as e:
        list(read_log(q, ["seq"]))
    check_msg(e, q, 3, "seq")


def test_non_utf8_bytes_in_csv(tmp_path: Path) -> None:
    p = tmp_path / "bin.csv"
    p.write_bytes(b"u,seq\n1,2 3\n2,4\n3,5 \xff\xfe 6\n4,1\n")
    with pytest.raises(LogError) as e:
        list(read_log(p, {"u": "single", "seq": "sequence"}))
    check_msg(e, p, 2, "seq")


def test_null_ids(tmp_path: Path) -> None:
    p = tmp_path / "n.parquet"
    pl.DataFrame({"u": [1, 2, None, 4]}).write_parquet(p)
    with pytest.raises(LogError) as e:
        list(read_log(p))
    check_msg(e, p, 2, "u")
    assert "null ID" in str(e.value)
    q = tmp_path / "nl.parquet"
    pl.DataFrame({"seq": [[1], [2, None], [3]]}, schema={"seq": pl.List(pl.Int64)}).write_parquet(q)
    with pytest.raises(LogError) as e:
        list(read_log(q))
    check_msg(e, q, 1, "seq")
    r = tmp_path / "nn.parquet"
    pl.DataFrame({"seq": [[1], [2], None]}, schema={"seq": pl.List(pl.Int64)}).write_parquet(r)
    with pytest.raises(LogError) as e:
        list(read_log(r))
    check_msg(e, r, 2, "seq")
    assert "null sequence" in str(e.value)
    c = tmp_path / "n.csv"
    c.write_text("ts,u\n1,5\n2,\n")
    with pytest.raises(LogError) as e:
        list(read_log(c, {"u": "single"}))
    check_msg(e, c, 1, "u")


def test_null_as_empty(tmp_path: Path) -> None:
    p = tmp_path / "n.parquet"
    pl.DataFrame({"u": [1, None, 3], "seq": [[1, None, 2], None, [5]]},
                 schema={"u": pl.Int64, "seq": pl.List(pl.Int64)}).write_parquet(p)
    assert samples(list(read_log(p, null_as_empty=True))) == [
        {"u": [1], "seq": [1, 2]}, {"u": [], "seq": []}, {"u": [3], "seq": [5]}]
    c = tmp_path / "n.csv"
    c.write_text("u,v\n1,\n,2\n")
    assert samples(list(read_log(c, {"u": "single", "v": "single"}, null_as_empty=True))) == [
        {"u": [1], "v": []}, {"u": [], "v": [2]}]


@pytest.mark.parametrize("ext", [".parquet", ".csv"])
def test_negative_ids(tmp_path: Path, ext: str) -> None:
    rows = make_rows(np.random.default_rng(8), 30)
    rows[17]["seq"] = [3, -4, 5]
    p = write(frame(rows), tmp_path / f"neg{ext}")
    with pytest.raises(LogError) as e:
        list(read_log(p, ["u", "seq"], read_batch_size=4))
    check_msg(e, p, 17, "seq")
    assert "negative ID" in str(e.value)


def test_uint64_overflow(tmp_path: Path) -> None:
    p = tmp_path / "o.parquet"
    pq.write_table(pa.table({"u": pa.array([1, 2**63 + 5, 3], pa.uint64())}), p)
    with pytest.raises(LogError) as e:
        list(read_log(p))
    check_msg(e, p, 1, "u")
    assert "does not fit in int64" in str(e.value)


def test_earliest_bad_row_reported_across_columns(tmp_path: Path) -> None:
    # a later row with an earlier-attributed reason (bad_ts) must not hide an earlier bad row
    p = tmp_path / "e.parquet"
    pl.DataFrame({"ts": [0.0, 1.0, 2.0, 3.0, None], "u": [1, 2, -3, 4, 5],
                  "seq": [[1], [2], [3], [4, None], [5]]},
                 schema={"ts": pl.Float64, "u": pl.Int64, "seq": pl.List(pl.Int64)}
                 ).write_parquet(p)
    with pytest.raises(LogError) as e:
        list(read_log(p))
    check_msg(e, p, 2, "u")


def test_bad_ts(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("ts,u\n1,1\n2,2\nnever,3\n")
    with pytest.raises(LogError) as e:
        list(read_log(p))
    check_msg(e, p, 2, "ts")
    q = tmp_path / "t.parquet"
    pl.DataFrame({"ts": [1.0, float("nan")], "u": [1, 2]}).write_parquet(q)
    with pytest.raises(LogError) as e:
        list(read_log(q))
    check_msg(e, q, 1, "ts")


def test_ts_only_in_some_files(tmp_path: Path) -> None:
    rows = make_rows(np.random.default_rng(9), 3)
    a = write(frame(rows), tmp_path / "a.parquet")
    b = write(frame(rows, ts=False), tmp_path / "b.parquet")
    with pytest.raises(LogError, match=r"b\.parquet.*ts=False"):
        LogReader([a, b])
    assert len(samples(list(read_log([a, b], ts=False)))) == 6


def test_garbled_csv_line(tmp_path: Path) -> None:
    p = tmp_path / "g.csv"
    lines = ["ts,u,seq"] + [f"{i},{i},{i} {i}" for i in range(10)]
    lines[7] = "6,6,6,6,6"                                 # data row 5: too many fields
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError) as e:
        list(read_log(p, {"u": "single", "seq": "sequence"}, read_batch_size=3))
    check_msg(e, p, 6, None)
    assert "line 8" in str(e.value) and "malformed" in str(e.value)


def test_truncated_csv_last_line(tmp_path: Path) -> None:
    p = tmp_path / "cut.csv"
    p.write_text("ts,u,seq\n0,1,2 3\n1,2,3 4\n2,3")
    with pytest.raises(LogError) as e:
        list(read_log(p, {"u": "single", "seq": "sequence"}))
    check_msg(e, p, 2, None)


def test_truncated_parquet(tmp_path: Path) -> None:
    p = write(frame(make_rows(np.random.default_rng(10), 100)), tmp_path / "full.parquet")
    cut = tmp_path / "cut.parquet"
    data = p.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(LogError, match=r"cut\.parquet.*truncated"):
        list(read_log(cut))
    with pytest.raises(LogError, match=r"cut\.parquet"):           # also with skip_bad_rows
        list(read_log([p, cut], skip_bad_rows=True))


def test_damaged_parquet_page(tmp_path: Path) -> None:
    n = 10_000
    table = pa.table({"u": np.arange(n, dtype=np.int64),
                      "seq": pa.array([[i, i + 1] for i in range(n)])})
    p = tmp_path / "dmg.parquet"
    pq.write_table(table, p, row_group_size=2500, write_page_checksum=True, compression="none")
    col = pq.ParquetFile(p).metadata.row_group(2).column(0)          # 'u' of rows 5000..7499
    data = bytearray(p.read_bytes())
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    pos = start + col.total_compressed_size // 2                     # inside that column chunk
    data[pos:pos + 16] = b"\xff" * 16
    p.write_bytes(bytes(data))
    with pytest.raises(LogError) as e:
        list(read_log(p, read_batch_size=1000))
    check_msg(e, p, None, "u")
    assert "row group 2 (rows 5000..7499" in str(e.value)


# ----------------------------------------------------------------------------- skipping
def test_skip_bad_rows_counts_exact(tmp_path: Path) -> None:
    c = tmp_path / "bad.csv"
    c.write_text("\n".join([
        "ts,u,seq",
        "0,1,1 2",            # 0 ok
        "1,2",                # 1 malformed
        "x,3,3",              # 2 bad_ts
        "3,-4,4",             # 3 negative_id
        "4,5,5 z",            # 4 bad_id
        "5,,6",               # 5 null_id (single)
        "6,7,7 -8",           # 6 negative_id
        "7,8,8,9",            # 7 malformed
        "nan,abc,-1",         # 8 bad_ts (first reason wins)
        "9,10,10",            # 9 ok
        "10,11,1.5",          # 10 bad_id
    ]) + "\n")
    p = tmp_path / "bad.parquet"
    pl.DataFrame({"ts": [0.0, 1.0, 2.0, 3.0, None], "u": [1, None, 3, -5, 6],
                  "seq": [[1], [2], [None], [4], [5]]},
                 schema={"ts": pl.Float64, "u": pl.Int64, "seq": pl.List(pl.Int64)}
                 ).write_parquet(p)
    reader = LogReader([c, p], {"u": "single", "seq": "sequence"}, read_batch_size=2,
                       skip_bad_rows=True)
    got = samples(list(reader))
    assert got == [{"u": [1], "seq": [1, 2], "ts": 0.0}, {"u": [10], "seq": [10], "ts": 9.0},
                   {"u": [1], "seq": [1], "ts": 0.0}]
    assert reader.skipped_by_file[str(c)] == {"malformed": 2, "bad_ts": 2, "bad_id": 2,
                                              "null_id": 1, "negative_id": 2}
    assert reader.skipped_by_file[str(p)] == {"malformed": 0, "bad_ts": 1, "bad_id": 0,
                                              "null_id": 2, "negative_id": 1}
    assert reader.skipped == {"malformed": 2, "bad_ts": 3, "bad_id": 2, "null_id": 3,
                              "negative_id": 3}
    assert reader.rows_read == 16 and reader.samples == 3
    # without skipping, the first bad row (malformed row 1) raises
    with pytest.raises(LogError) as e:
        list(read_log([c, p], {"u": "single", "seq": "sequence"}))
    check_msg(e, c, 1, None)


@pytest.mark.parametrize("block", [None, 64])
def test_first_problem_in_file_order_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          block: int | None) -> None:
    if block:                                     # many small CSV blocks
        monkeypatch.setattr(logs_mod, "_CSV_BLOCK", block)
    lines = ["u"] + [str(i) for i in range(40)]
    p = tmp_path / "m.csv"
    p.write_text("\n".join(lines[:4] + ["3,3"] + lines[4:30] + ["-9"] + lines[30:]) + "\n")
    with pytest.raises(LogError) as e:          # malformed row 3 comes before negative row 30
        list(read_log(p, {"u": "single"}, read_batch_size=2))
    check_msg(e, p, 3, None)
    reader = LogReader(p, {"u": "single"}, read_batch_size=7, skip_bad_rows=True)
    assert [s["u"][0] for s in samples(list(reader))] == list(range(40))
    assert reader.skipped["malformed"] == 1 and reader.skipped["negative_id"] == 1
    assert reader.rows_read == 42
    q = tmp_path / "n.csv"
    q.write_text("\n".join(lines[:12] + ["-9"] + lines[12:30] + ["3,3"] + lines[30:]) + "\n")
    with pytest.raises(LogError) as e:          # negative row 11 comes before malformed row 29
        list(read_log(q, {"u": "single"}, read_batch_size=2))
    check_msg(e, q, 11, "u")
    assert "line 13" in str(e.value)


def test_read_batch_size_validation(tmp_path: Path) -> None:
    p = write(frame(make_rows(np.random.default_rng(11), 2)), tmp_path / "v.parquet")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(LogError, match="batch_size"):
            LogReader(p, read_batch_size=bad)  # type: ignore[arg-type]


def test_old_batch_size_keyword_is_the_read_chunk(tmp_path: Path) -> None:
    """``batch_size`` (deprecated for one release) still means the read chunk, with a warning."""
    rows = make_rows(np.random.default_rng(13), 10)
    p = write(frame(rows), tmp_path / "o.parquet")
    with pytest.warns(DeprecationWarning, match="'batch_size' is deprecated, use "
                                                "'read_batch_size'"):
        reader = LogReader(p, batch_size=4)
    assert reader.read_batch_size == 4
    assert [b.batch_size for b in reader] == [4, 4, 2]
    with pytest.warns(DeprecationWarning, match="read_batch_size"):
        assert reader.batch_size == 4
    with pytest.warns(DeprecationWarning, match="read_batch_size"):
        got = samples(list(read_log(p, batch_size=3)))
    assert got == reference(rows, True)
    with pytest.raises(TypeError, match="both 'batch_size'"):
        LogReader(p, batch_size=4, read_batch_size=4)


def test_file_infos_and_data_rows(tmp_path: Path) -> None:
    """Format and footer row count per file; data rows from footers and CSV line counts, bad rows
    included, without reading the samples."""
    rng = np.random.default_rng(14)
    a = write(frame(make_rows(rng, 9)), tmp_path / "a.parquet")
    b = write(frame(make_rows(rng, 5)), tmp_path / "b.csv")
    with open(b, "a") as f:
        f.write("7.0,-3,,0.5\n")                      # a bad row (negative ID) is still a row
    reader = LogReader([a, b], skip_bad_rows=True)
    infos = reader.file_infos
    assert [(i.path, i.format, i.num_rows) for i in infos] == [(a, "parquet", 9), (b, "csv", None)]
    assert [i.data_rows() for i in infos] == [9, 6]
    assert reader.data_rows() == 15 and reader.rows_read == 0      # nothing read yet
    list(reader)
    assert reader.rows_read == reader.data_rows() and reader.samples == 14


# ----------------------------------------------------------------------------- max ids
def test_log_max_ids(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    r1, r2 = make_rows(rng, 20), make_rows(rng, 15)
    paths = [write(frame(r1), tmp_path / "a.parquet"), write(frame(r2), tmp_path / "b.csv")]
    expect = {"u": max(r["u"] for r in r1 + r2),
              "seq": max(x for r in r1 + r2 for x in r["seq"])}
    assert log_max_ids(paths, ["u", "seq"]) == expect
    assert log_max_ids(paths) == expect
    e = tmp_path / "e.parquet"
    pl.DataFrame({"seq": [[], []]}, schema={"seq": pl.List(pl.Int64)}).write_parquet(e)
    assert log_max_ids(e, ["seq"]) == {"seq": -1}
    with pytest.raises(LogError, match="missing"):
        log_max_ids(paths, ["nope"])


def test_row_groups_read_one_share_of_a_file(tmp_path):
    ids = np.arange(100, dtype=np.int64)
    ids[57] = -1                                    # a bad row in the third row group
    pq.write_table(pa.table({"ts": np.arange(100.0), "a": ids}), tmp_path / "x.parquet",
                   row_group_size=20)
    got = np.concatenate([b.values for b in LogReader(tmp_path / "x.parquet", "a", 7,
                                                      row_groups=[1, 2], skip_bad_rows=True)])
    assert np.array_equal(got, np.delete(np.arange(20, 60), 37))
    with pytest.raises(LogError, match="row 57"):       # rows numbered in the whole file
        list(LogReader(tmp_path / "x.parquet", "a", 7, row_groups=[2]))
    with pytest.raises(LogError, match="out of range"):
        list(LogReader(tmp_path / "x.parquet", "a", 7, row_groups=[5]))
    pl.DataFrame({"a": [1, 2]}).write_csv(tmp_path / "y.csv")
    with pytest.raises(LogError, match="one parquet file"):
        LogReader(tmp_path / "y.csv", "a", 7, row_groups=[0])
