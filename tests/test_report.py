"""Report: report.html and its PNGs from a small replay directory; clean errors; lazy matplotlib."""
import json
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from flexshard_stream.cli import app
from flexshard_stream.errors import FlexShardError, FormatError
from flexshard_stream.formats.files import KIND_MARKER
from flexshard_stream.online.replay import replay
from flexshard_stream.plans.topology import Topology
from flexshard_stream.report import PICTURES, build_report
from flexshard_stream.sources import drift
from flexshard_stream.sources.synth import TableSpec, write_log

pytest.importorskip("matplotlib")

SPECS = [TableSpec("hist", 20_000, 1.1, "sequence", "fixed", 8),
         TableSpec("item", 5_000, 1.05, "pooled", "fixed", 1)]
TOPO = Topology.uniform(2, 2, name="2x2")


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    log = d / "log.parquet"
    batches = (b for w in drift.generate_windows(SPECS, drift.scenario("rotating", k=200,
                                                                       rate=0.3),
                                                 3, 2000, 500, seed=5) for b in w)
    write_log(batches, log, SPECS, row_group_size=1000)
    out = d / "out"
    replay(log, TOPO, window="2s", out_dir=out, batch_size=16)
    return out


def test_report_builds_html_and_pictures(rep):
    html_path = build_report(rep)
    assert html_path == rep / "report.html"
    html = html_path.read_text()
    refs = set(re.findall(r"src='([^']+)'", html))
    assert refs == set(PICTURES)
    for name in PICTURES:
        data = (rep / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    for strat in ("row-wise (rw)", "table-row-wise (twrw)", "static", "re-sharder"):
        assert strat in html
    assert "<table>" in html and "speed-up vs rw" in html
    assert not [p for p in rep.iterdir()
                if p.name.startswith(".") and p.name != KIND_MARKER]   # no temp files left


def test_cli_report(rep, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["report", str(rep)])
    assert r.exit_code == 0, r.output
    assert "report.html" in r.output
    r = runner.invoke(app, ["report", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "nothing" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_missing_or_damaged_summary(rep, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(rep, d)
    (d / "summary.json").unlink()
    with pytest.raises(FormatError, match=r"summary\.json: missing"):
        build_report(d)
    text = (rep / "summary.json").read_text()
    (d / "summary.json").write_text(text[: len(text) // 2])
    with pytest.raises(FormatError, match=r"summary\.json: damaged replay summary: not valid"):
        build_report(d)
    doc = json.loads(text)
    del doc["windows"]
    (d / "summary.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="missing key 'windows'"):
        build_report(d)
    doc = json.loads(text)
    doc["windows"][0]["strategies"]["rw"]["bytes_per_iter"] = "garbage"
    (d / "summary.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="damaged replay summary"):
        build_report(d)
    (d / "summary.json").write_text(text)
    (d / "traffic" / "rw.npz").write_bytes(b"not a zip")
    with pytest.raises(FormatError, match=r"rw\.npz: damaged"):
        build_report(d)
    r = CliRunner().invoke(app, ["report", str(d)])
    assert r.exit_code == 2 and "rw.npz" in r.output and "Traceback" not in r.output


def test_matplotlib_is_lazy_and_its_absence_is_a_clear_error(rep, monkeypatch):
    code = ("import sys, flexshard_stream, flexshard_stream.cli, flexshard_stream.online.replay, "
            "flexshard_stream.report; print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.stdout.strip() == "False", out.stderr
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(FlexShardError, match=r"flexshard-stream\[report\]"):
        build_report(rep)


# ---------------------------------------------------------------------------- reading it at a glance
def _captured(monkeypatch):
    """Keep every figure the report saves (name -> figure), still drawable."""
    from flexshard_stream import report

    figs = {}
    real = report._save

    def keep(fig, path):
        figs[path.name] = fig
        real(fig, path)

    monkeypatch.setattr(report, "_save", keep)
    return figs


def _extents(fig, texts):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)          # the report closed it: draw it again as it was saved
    canvas.draw()
    r = canvas.get_renderer()
    return [t.get_window_extent(r) for t in texts if t.get_visible() and t.get_text()]


def test_titles_fit_and_colorbar_labels_do_not_overlap(rep, tmp_path, monkeypatch):
    d = tmp_path / "one"
    shutil.copytree(rep, d)
    cdf = json.loads((d / "cdf.json").read_text())
    name = next(iter(cdf["tables"]))
    cdf["tables"] = {name: cdf["tables"][name]}            # a single table: the narrow figure
    (d / "cdf.json").write_text(json.dumps(cdf))
    figs = _captured(monkeypatch)
    build_report(d)
    fig = figs["cdf.png"]
    box = fig.bbox
    for t in _extents(fig, [fig._suptitle] + [ax.title for ax in fig.axes]):
        assert box.x0 <= t.x0 and t.x1 <= box.x1, (t, box)
    fig = figs["traffic.png"]
    cbar = fig.axes[-1]
    labels = sorted(_extents(fig, cbar.get_yticklabels()), key=lambda b: b.y0)
    assert len(labels) >= 2
    for a, b in zip(labels, labels[1:]):
        assert a.y1 <= b.y0, "colour-bar labels overlap"


def test_budget_shares_only_for_the_plans_made_for_it(rep, monkeypatch):
    figs = _captured(monkeypatch)
    build_report(rep)
    texts = [t.get_text() for t in figs["memory.png"].legends[0].get_texts()]
    rw = next(t for t in texts if t.startswith("row-wise"))
    static = next(t for t in texts if t.startswith("FlexShard, static"))
    assert "budget" not in rw and "% of the budget" in static
    assert any("row-wise's modelled peak" in t for t in texts)


def test_epoch_windows_show_dates_and_the_report_says_how_to_apply_it(rep, tmp_path):
    d = tmp_path / "dated"
    shutil.copytree(rep, d)
    s = json.loads((d / "summary.json").read_text())
    shift = 1.6e9                                           # 2020-09-13 12:26:40 UTC
    s["window"]["t0"] = (s["window"].get("t0") or 0.0) + shift
    for w in s["windows"]:
        for k in ("start", "end", "ts_first", "ts_last"):
            if w.get(k) is not None:
                w[k] += shift
        for c in w.get("checks") or []:
            c["position"] += shift
    (d / "summary.json").write_text(json.dumps(s))
    html = build_report(d).read_text()
    assert "start (UTC)" in html and "<td>2020-09-13 12:26</td>" in html
    assert "Period: 2020-09-13 12:26:40" in html
    plain = build_report(rep).read_text()
    assert "(UTC)" not in plain
    assert "Apply this plan" in html and "plans/" in html and "TORCHREC_EXPORT.md" in html
    best = min(("static", "resharder"),
               key=lambda n: s["totals"]["strategies"][n]["comm_time_s_per_iter"])
    assert f"flexshard-stream export --plan plans/{best} --out torchrec" in html


def test_apply_section_recommends_the_fastest_plan_that_fits_and_says_when_it_is_not_flexshard():
    """The report recommended FlexShard's plan even when another replayed plan was faster (issue
    22): it names the fastest plan that fits its budget, and says when FlexShard is not it."""
    from flexshard_stream.report import _apply_section

    def t(ms, peak=1e6, budget=None, **kw):
        return {"comm_time_s_per_iter": ms * 1e-3, "iterations": 10, "total_cost_s": ms * 1e-2,
                "peak_memory_bytes": peak, "budget_bytes": budget, "speedup_vs_rw": 2.0, **kw}

    summary = {"strategies": ["rw", "twrw", "static", "resharder"], "budget_bytes": 5e6,
               "totals": {"strategies": {"rw": t(4.0), "twrw": t(1.0), "static": t(2.0),
                                         "resharder": t(2.5)}}}
    html = _apply_section(summary)
    assert "plans/twrw" in html and "FlexShard is not it" in html and "2.00x" in html
    summary["totals"]["strategies"]["twrw"] = t(1.0, peak=9e6)      # over the budget
    html = _apply_section(summary)
    assert "plans/static" in html and "FlexShard is not it" not in html


def _zero_replicas(d):
    """The replay in ``d`` edited as if no plan replicated a row (thresholds and CDF cuts)."""
    s = json.loads((d / "summary.json").read_text())
    for w in s["windows"]:
        for th in [w.get("thresholds") or {}] + [c.get("thresholds") or {}
                                                  for c in w.get("checks") or []]:
            for t in th.values():
                t["global_rows"] = t["node_rows"] = 0
    (d / "summary.json").write_text(json.dumps(s))
    c = json.loads((d / "cdf.json").read_text())
    for t in c["tables"].values():
        for cut in (t.get("cuts") or {}).values():
            cut["k0"] = cut["k0_k1"] = 0
            cut["replicated_share"] = 0.0
    (d / "cdf.json").write_text(json.dumps(c))


def test_report_layout_says_what_there_is(rep, tmp_path):
    """Issue 26: the speed-ups lead the totals table (a wide table scrolls); window bounds carry
    their unit; with nothing replicated no empty threshold chart is drawn and the CDF legend says
    so instead of "0 global + 0 node rows"."""
    html = build_report(rep).read_text()
    head = html[html.index("<h2>Totals over the replay</h2>"):]
    cols = re.findall(r"<th>([^<]+)</th>", head[:head.index("</tr>")])
    assert cols[:3] == ["strategy", "speed-up vs rw", "vs best baseline"]
    assert "<div class='wide'><table>" in head and ".wide{overflow-x:auto}" in html
    assert re.search(r"<th>start \((s|sample|UTC)\)</th>", html)
    d = tmp_path / "zero"
    shutil.copytree(rep, d, symlinks=True)
    _zero_replicas(d.resolve() if d.is_symlink() else d)
    (d / "threshold.png").unlink(missing_ok=True)
    html = build_report(d).read_text()
    assert "threshold.png" not in set(re.findall(r"src='([^']+)'", html))
    assert "there is no threshold to draw" in html and not (d / "threshold.png").exists()
    from flexshard_stream.report import cut_label
    assert cut_label("static", {"k0": 0, "k0_k1": 0}) == "static: no replicated rows"
    assert cut_label("static", {"k0": 3, "k0_k1": 5, "replicated_share": 0.4}) == (
        "static: 3 global + 2 node rows (40% of lookups)")
