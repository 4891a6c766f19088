"""Every benchmark runs as ``python bench/NAME.py`` from the repository root: its name shadows no
importable package (Python puts ``bench/`` first on ``sys.path`` for such a script, so a
``bench/torchrec.py`` made ``import torchrec`` load the bench), and it imports, as a script would,
without running (its work sits under ``if __name__ == "__main__"``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = sorted((ROOT / "bench").glob("*.py"))


def test_there_are_bench_scripts():
    assert len(BENCH) >= 5


def test_no_bench_script_shadows_an_importable_module():
    shadowing = [p.name for p in BENCH if importlib.util.find_spec(p.stem) is not None]
    assert not shadowing, (f"{shadowing}: a script of that name in bench/ would be imported in "
                           f"place of the package of the same name; rename it")


def test_every_bench_script_imports_as_a_script_would_without_running():
    code = "\n".join([
        "import importlib.util, sys",
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})",
        f"for path in {[str(p) for p in BENCH]!r}:",
        "    spec = importlib.util.spec_from_file_location('bench_' + path.split('/')[-1][:-3],"
        " path)",
        "    module = importlib.util.module_from_spec(spec)",
        "    sys.modules[spec.name] = module   # as for a script: dataclasses look it up",
        "    spec.loader.exec_module(module)",
        "    assert callable(getattr(module, 'main', None)), path + ': no main()'",
        "print('imported', len(sys.argv))",
    ])
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("imported")


def test_every_bench_script_has_quick_and_runs_only_as_main():
    for p in BENCH:
        src = p.read_text()
        assert '"--quick"' in src, f"{p.name}: no --quick"
        assert 'if __name__ == "__main__":' in src, f"{p.name}: runs on import"


def _load_bench(name: str):
    """bench/NAME.py as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test",
                                                  ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # as for a script: dataclasses look it up
    spec.loader.exec_module(module)
    return module


def _small_trace_workload(tp):
    """A skewed pooled table and a sequence table, 8,192 samples in log order, cut in two as the
    bench cuts the real traces."""
    import numpy as np

    from flexshard_stream.sources.synth import zipf_ranks
    from flexshard_stream.stats.batch import Batch

    rng = np.random.default_rng(0)
    n = 8192
    lens = rng.integers(1, 9, n)
    batch = Batch.from_features({"ad": zipf_ranks(n, 50_000, 1.1, rng),
                                 "hist": zipf_ranks(int(lens.sum()), 200_000, 1.0, rng)},
                                {"ad": np.ones(n, np.int64), "hist": lens})
    return tp._halves("small", batch, [("ad", 50_000, "pooled"), ("hist", 200_000, "sequence")],
                      64, 4096, "test trace")


def test_torchrec_bench_heldout_section_prices_every_plan_in_and_out_of_sample():
    tp = _load_bench("torchrec_plans")
    w = _small_trace_workload(tp)
    sums = tp.profile_summaries(w, 4096)
    assert sums["holdout"] is not None
    fit, hold = (sums[k]["ad"].samples for k in ("fit", "holdout"))
    assert (fit, hold) == (3072, 1024)   # the planning half's last quarter held out
    assert [h["ad"].samples for h in sums["halves"]] == [512, 512]   # its halves, in log order
    res = tp.heldout_on(w, "2x8", {}, sums)
    assert res["budget_bytes"] == tp.MemoryPolicy().hbm_budget(tp.Topology.preset("2x8"))
    for key, _ in tp.SETTINGS:
        o = res[f"torchrec_{key}"]
        assert set(o["time_ms"]) == {*tp.BASELINES, "flexshard"}
        assert o["fits_budget"]["flexshard"]
        # 2x8 at B = 64: one iteration is 1,024 samples, more than a half holds
        assert o["selection_rule"] == "fastest on the held-out part"
        assert "under one iteration" in o["selection_halves"]["why_not"]
        for k in ("in", "out"):
            best = o["best_baseline"][k]
            assert o["fits_budget"][best]
            assert o["speedup"][f"vs_best_baseline_{k}"] == (
                o["time_ms"][best][k] / o["time_ms"]["flexshard"][k])
        below = o["speedup"]["vs_best_baseline_out"] < 0.98
        assert (o["best_baseline"]["out"] in o["below_target_out_of_sample"]) == below
    hres = {w.name: {"2x8": res}}
    head = tp.heldout_headline(hres, [w], None)
    assert [t["name"] for t in head["targets"]] == [f"held-out: {k}" for k in tp.HELDOUT_TARGETS]
    worst = min(res[f"torchrec_{k}"]["speedup"]["vs_best_baseline_out"] for k, _ in tp.SETTINGS)
    assert head["worst_vs_best_out_of_sample"]["figure"] == worst
    assert head["worst_vs_torchrec_out_of_sample"] is None   # no TorchRec plan given
    assert head["sequence_geomean_vs_best_out_of_sample"] is None   # a pooled table: not sequence
    assert head["demo_speedup_vs_best"] is None
    assert len(head["heldout"]["losses"]) == sum(
        len(res[f"torchrec_{k}"]["below_target_out_of_sample"]) for k, _ in tp.SETTINGS)


def test_torchrec_bench_reads_the_demo_defaults_from_the_cli():
    tp = _load_bench("torchrec_plans")
    d = tp.demo_defaults()
    assert {"topology", "batch_size", "window", "dedup", "profile"} <= set(d)
    # dedup: None, the profile's default (off under torchrec), resolved by the demo and the bench
    assert isinstance(d["batch_size"], int) and d["dedup"] is None
