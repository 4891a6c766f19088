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
