"""Every ```python block of README.md and docs/*.md runs (issue 26: the README's planning snippet
used an undefined `batches`, and its own batch then failed with "key not configured").

The blocks of one page run in order in one namespace, in a fresh directory, after the page's
SETUP: the names a page takes from the user's own program (a data loader, a training step, a
publishing hook) or from the text around a block. A block that cannot run here says so in the page
itself, on the line before its fence: ``<!-- not run: REASON -->`` (a Ray cluster, a GPU, a quote
of TorchRec's source); the test checks that every such block gives a reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")

_TABLES = """
import numpy as np
from flexshard_stream import Batch, StreamStats
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
tables = [EmbeddingTable("item", 1000, 16, kind="sequence"), EmbeddingTable("user", 100, 16)]
topology = topo = Topology.uniform(1, 2)
batch_size = B = 8
_rng = np.random.default_rng(0)
loader = [Batch(["item", "user"], np.concatenate([_rng.zipf(1.3, 40) % 1000,
                                                  _rng.integers(0, 100, 8)]),
                np.concatenate([np.full(8, 5), np.ones(8, np.int64)])) for _ in range(6)]
def train_step(batch): pass
def publish(delta, plan): pass
def apply(delta): pass
stats = StreamStats({"item": 1000, "user": 100})
for _b in loader:
    stats.update(_b)
summaries = stats.summary(k=1000)
"""

#: Per page: what runs before its blocks (the names its text assumes).
SETUP = {
    "README.md": "def train_step(batch): pass\n",
    "RESHARDER.md": _TABLES + """
from flexshard_stream.placement.baselines import row_wise, table_wise
initial_plan = old_plan = row_wise(tables, topo)
new_plan = table_wise(tables, topo)
from flexshard_stream.plans.delta import PlanDelta
d1, d2 = PlanDelta.between(old_plan, new_plan), PlanDelta.between(new_plan, old_plan)
""",
    "SIDECAR.md": _TABLES,
    "SCALING.md": _TABLES + """
from pathlib import Path
from flexshard_stream.sources.distributed import export_datasketches
_s = StreamStats({"ad_id": 1000})
_s.update(Batch(["ad_id"], [42, 42, 7], [1, 1, 1]))
export_datasketches(_s, "out")
""",
    "TORCHREC_EXPORT.md": _TABLES + """
from flexshard_stream.placement.baselines import row_wise
plan = row_wise(tables, topo)
table = tables[0]
""",
    "TORCHREC_PLANNER.md": _TABLES,
}


def _blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """The page's ```python blocks: (line of the fence, code, the not-run reason or None)."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i + 1, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            m = NOT_RUN.search(lines[start - 2]) if start >= 2 else None
            out.append((start, "\n".join(body) + "\n", m.group(1) if m else None))
        i += 1
    return out


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=lambda p: p.name)
def test_the_python_blocks_of_a_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__snippet__"}
    exec(compile(SETUP.get(page.name, ""), f"SETUP[{page.name}]", "exec"), ns)
    ran = 0
    for line, code, reason in _blocks(page):
        if reason is not None:
            continue
        exec(compile(code, f"{page.name}:{line}", "exec"), ns)
        ran += 1
    assert ran or all(r for _, _, r in _blocks(page)), page


def test_every_block_not_run_says_why():
    marked = [(p.name, line, r) for p in PAGES for line, _, r in _blocks(p) if r is not None]
    assert all(len(r) > 10 for _, _, r in marked), marked
    assert not any(p.name == "README.md" for p in PAGES for _, _, r in _blocks(p) if r), \
        "every README block runs"
