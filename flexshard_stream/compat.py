"""Old flat import paths (``flexshard_stream.planner`` ...), kept for one release.

Release 0.2 moved the modules into layered subpackages (see ``CHANGELOG.md``). Importing an old path
returns the module at its new place (the same object, so monkeypatching either name works) and emits
a ``DeprecationWarning`` naming the new path. Nothing here is imported by the package's own code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module name -> new module name, both under ``flexshard_stream``
MOVED = {
    "container": "formats.container", "interop": "formats.interop",
    "batch": "stats.batch", "config": "stats.config", "table_stats": "stats.table_stats",
    "stream": "stats.stream", "window": "stats.window", "summary": "stats.summary",
    "logs": "sources.logs", "datasets": "sources.datasets", "synth": "sources.synth",
    "drift": "sources.drift",
    "topology": "placement.topology", "tables": "placement.tables", "plan": "placement.plan",
    "baselines": "placement.baselines", "cost": "placement.cost", "planner": "placement.planner",
    "recshard": "placement.recshard", "delta": "placement.delta",
    "torchrec_compat": "placement.torchrec_compat", "export_torchrec": "placement.export_torchrec",
    "resharder": "online.resharder", "sidecar": "online.sidecar", "ring": "online.ring",
    "replay": "online.replay", "distributed": "online.distributed", "report": "online.report",
}
_PREFIX = "flexshard_stream."


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``flexshard_stream.<old>`` to ``flexshard_stream.<new>`` (same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(_PREFIX) and fullname[len(_PREFIX):] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = _PREFIX + MOVED[spec.name[len(_PREFIX):]]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        """Nothing to run: the module was executed at its new place."""


def install() -> None:
    """Register the finder once (called by ``flexshard_stream/__init__``)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
