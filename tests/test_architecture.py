"""The house rules, checked on the source: imports only go down the layers, no module imports
another module's private name, no long functions outside the kernels, old import paths still work."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "flexshard_stream"

#: Floors, bottom first. A module may import its own floor (same subpackage) or any lower floor.
FLOORS = {
    "errors": 0, "compat": 0, "kernels": 0, "data": 0,
    "formats": 1, "optional": 1,
    "stats": 2,
    "sources": 3,
    "plans": 4,
    "bridge": 5,
    "placement": 6,
    "online": 7, "cluster": 7,
    "report": 8,
    "cli": 9, "testing": 9,
}
MAX_FUNCTION_LINES = 120


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG).with_suffix("")
        parts = [x for x in rel.parts if x != "__init__"]
        out[".".join(parts)] = p
    return out


def _floor(mod: str) -> str:
    return mod.split(".")[0] if mod else ""


def _imports(mod: str, path: Path):
    """(target module relative to the package, imported name, line) for each project import."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base[: len(base) - (node.level - 1)] if node.level > 1 else list(base)
                target = ".".join(parts + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("flexshard_stream"):
                target = node.module[len("flexshard_stream"):].lstrip(".")
            else:
                continue
            for a in node.names:
                yield target, a.name, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("flexshard_stream."):
                    yield a.name[len("flexshard_stream."):], "", node.lineno


MODULES = _modules()


def test_imports_only_go_down():
    bad = []
    for mod, path in MODULES.items():
        src = _floor(mod)
        if src not in FLOORS:
            continue
        for target, name, line in _imports(mod, path):
            full = f"{target}.{name}".strip(".") if f"{target}.{name}".strip(".") in MODULES \
                else target
            dst = _floor(full)
            if not dst or dst == src or dst not in FLOORS:
                continue
            if FLOORS[dst] >= FLOORS[src]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {full} (floor {dst} is not "
                           f"below {src})")
    assert not bad, "\n".join(bad)


def test_every_module_has_a_floor():
    assert {_floor(m) for m in MODULES if m} <= set(FLOORS)


def test_no_private_name_imported_across_modules():
    bad = []
    for mod, path in MODULES.items():
        for target, name, line in _imports(mod, path):
            if name.startswith("_") and not name.startswith("__") and target != mod:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}.{name}")
    assert not bad, "\n".join(bad)


def test_no_long_functions_outside_kernels():
    bad = []
    for mod, path in MODULES.items():
        if mod.startswith("kernels"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("old,new", [("planner", "placement.planner"), ("stream", "stats.stream"),
                                     ("container", "formats.container"),
                                     ("replay", "online.replay")])
def test_old_import_paths_resolve_to_the_moved_module(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = importlib.import_module(f"flexshard_stream.{old}")
    b = importlib.import_module(f"flexshard_stream.{new}")
    assert a is b
    from flexshard_stream.compat import MOVED
    assert MOVED[old].new == new
    if caught:  # first import in this process warns; later imports hit sys.modules
        assert any(issubclass(w.category, DeprecationWarning) for w in caught)


def test_compat_table_names_real_modules():
    from flexshard_stream.compat import MOVED
    for moved in MOVED.values():
        assert moved.new in MODULES, moved.new
        assert moved.removed_in == "0.3.0"


def test_every_subpackage_is_installed():
    """pyproject.toml lists packages by hand: a subpackage missing there is left out of a
    non-editable install (the editable one used in development hides it)."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {"flexshard_stream." + ".".join(p.parent.relative_to(PKG).parts)
             for p in PKG.rglob("__init__.py") if p.parent != PKG}
    assert found - listed == set(), f"add to pyproject.toml packages: {sorted(found - listed)}"
