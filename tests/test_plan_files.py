"""Plan directories through the one file helper (formats.files): atomic, verified, readable by
their usual readers, and what earlier releases wrote still loads."""
import json
import math
import os
import stat

import numpy as np
import pytest

from flexshard_stream import ConfigError, FormatError
from flexshard_stream.formats.directories import VERSIONS_AREA
from flexshard_stream.placement.baselines import row_wise
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology

TOPO = Topology.uniform(2, 2)
TABLES = [EmbeddingTable("s", 40, 4), EmbeddingTable("p", 30, 8, "fp16", "pooled")]


def _plan(meta=None):
    base = row_wise(TABLES, TOPO)
    return Plan(base.strategy, TOPO, list(base.tables.values()), meta or {})


def test_non_finite_metadata_round_trips(tmp_path):
    """Plan metadata may hold NaN / infinity (e.g. an unbounded budget): kept, as before."""
    p = _plan({"budget_bytes": math.inf, "gain": math.nan, "note": "x"})
    back = Plan.load(p.save(tmp_path / "plan"))
    assert back == p
    assert back.meta["budget_bytes"] == math.inf and math.isnan(back.meta["gain"])
    text = (tmp_path / "plan" / "plan.json").read_text()
    assert "Infinity" in text and "NaN" in text


def test_directory_replaced_whole_and_files_readable(tmp_path):
    d = tmp_path / "plan"
    _plan({"v": 1}).save(d)
    (d / "stray.txt").write_text("left by hand")
    with pytest.raises(ConfigError, match="holds stray.txt"):  # a user's file: never deleted
        _plan({"v": 2}).save(d)
    assert (d / "stray.txt").read_text() == "left by hand" and Plan.load(d).meta == {"v": 1}
    (d / "stray.txt").unlink()
    _plan({"v": 2}).save(d)                        # replaced whole, as a version behind d
    assert Plan.load(d).meta == {"v": 2} and not (d / "stray.txt").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == [VERSIONS_AREA, "plan"]  # no temporary
    # the hidden area: the lock, the previous version (a reader may still read it) and this one
    assert sorted(os.listdir(tmp_path / VERSIONS_AREA / "plan")) == ["lock", "v000001", "v000002"]
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_plan_written_by_an_earlier_release_loads(tmp_path):
    """``json.dump`` without a trailing newline, NaN in the metadata, no checksum of plan.json
    (earlier releases wrote none, nor a kind marker): still read."""
    from flexshard_stream.formats.files import KIND_MARKER
    p = _plan({"gain": 1.5})
    d = p.save(tmp_path / "old")
    (d / KIND_MARKER).unlink()
    doc = json.loads((d / "plan.json").read_text())
    del doc["checksum"]
    doc["meta"]["gain"] = math.nan
    with open(d / "plan.json", "w") as f:
        json.dump(doc, f, indent=1)
    back = Plan.load(d)
    assert back == p and math.isnan(back.meta["gain"])


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FormatError, match="not a plan directory"):
        Plan.load(tmp_path)
    d = _plan().save(tmp_path / "plan")
    (d / "plan.json").write_text("{not json")
    with pytest.raises(FormatError, match=r"plan\.json: not valid JSON"):
        Plan.load(d)
    d = _plan().save(tmp_path / "plan")
    doc = json.loads((d / "plan.json").read_text())
    victim = d / doc["tables"][0]["arrays"]["global_ids"]["file"]
    np.save(victim, np.arange(3))
    with pytest.raises(FormatError, match=f"{victim.name}: checksum mismatch"):
        Plan.load(d)
