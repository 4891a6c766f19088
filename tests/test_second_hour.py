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
