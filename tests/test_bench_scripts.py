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
