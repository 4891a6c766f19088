"""Old names kept for one release: flat import paths and renamed keywords.

Release 0.2 moved the modules into layered subpackages (see ``CHANGELOG.md``). Importing an old path
returns the module at its new place (the same object, so monkeypatching either name works) and emits
a ``DeprecationWarning`` naming the new path.

Release 0.2 also renamed keywords whose old name said less than it meant (``batch_size`` for a read
chunk or for the samples per generated batch): :func:`renamed_keywords` keeps an old keyword of a
function or a class working, :func:`renamed_property` an old attribute, both with a
``DeprecationWarning`` naming the new name. They are the only things here the package imports.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

#: The release in which every old name below stops working.
REMOVED_IN = "0.3.0"


class Moved(NamedTuple):
    """Where an old module path now lives (``new``, under ``flexshard_stream``) and the release
    whose first version no longer has the old path (``removed_in``)."""

    new: str
    removed_in: str = REMOVED_IN


#: old module name -> where it lives now, both under ``flexshard_stream``. Flat paths moved into
#: subpackages in 0.2; the TorchRec bridge, the plan model and the sources' ring and distributed
#: statistics moved later in 0.2 (CHANGELOG "The TorchRec bridge as one room").
_FLAT = {
    "container": "formats.container", "interop": "formats.interop",
    "batch": "stats.batch", "config": "stats.config", "table_stats": "stats.table_stats",
    "stream": "stats.stream", "window": "stats.window", "summary": "stats.summary",
    "logs": "sources.logs", "datasets": "sources.datasets", "synth": "sources.synth",
    "drift": "sources.drift",
    "topology": "plans.topology", "tables": "plans.tables", "plan": "plans.plan",
    "baselines": "placement.baselines", "cost": "placement.cost", "planner": "placement.planner",
    "recshard": "placement.recshard", "delta": "plans.delta",
    "torchrec_compat": "bridge.estimator", "export_torchrec": "bridge.export",
    "resharder": "online.resharder", "sidecar": "online.sidecar", "ring": "sources.ring",
    "replay": "online.replay", "distributed": "sources.distributed", "report": "report",
}
_BRIDGE = {
    "placement.topology": "plans.topology", "placement.tables": "plans.tables",
    "placement.plan": "plans.plan", "placement.delta": "plans.delta",
    "placement.torchrec_compat": "bridge.estimator",
    "placement.torchrec_planner": "placement.references",
    "placement.torchrec_loader": "bridge.loader", "placement.export_torchrec": "bridge.export",
    "placement.export_layout": "bridge.layout", "placement.id_remap": "bridge.remap",
    "online.torchrec_runtime": "bridge.runtime", "online.torchrec_world": "bridge.world",
    "online.ring": "sources.ring", "online.distributed": "sources.distributed",
    "online.report": "report",
}
MOVED: dict[str, Moved] = {old: Moved(new) for old, new in {**_FLAT, **_BRIDGE}.items()}
_PREFIX = "flexshard_stream."


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``flexshard_stream.<old>`` to ``flexshard_stream.<new>`` (same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(_PREFIX) and fullname[len(_PREFIX):] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        moved = MOVED[spec.name[len(_PREFIX):]]
        new = _PREFIX + moved.new
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in {moved.removed_in}",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        """Nothing to run: the module was executed at its new place."""


def install() -> None:
    """Register the finder once (called by ``flexshard_stream/__init__``)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


def _renamed(where: str, old: str, new: str, removed_in: str) -> None:
    warnings.warn(f"{where}: {old!r} is deprecated, use {new!r} (same meaning); the old name goes "
                  f"in {removed_in}", DeprecationWarning, stacklevel=3)


def renamed_keywords(removed_in: str, **renames: str) -> Callable[[_F], _F]:
    """Decorator: accept each old keyword ``old=new`` of a function (or of a class's constructor)
    until release ``removed_in``, passing it on as ``new`` with a :class:`DeprecationWarning`
    that names that release.

    Giving both names is a :class:`TypeError`, as for any keyword given twice. Example::

        @renamed_keywords("0.3.0", batch_size="read_batch_size")
        def read_log(paths, features=None, read_batch_size=65536): ...
    """

    def decorate(target: _F) -> _F:
        fn = target.__init__ if isinstance(target, type) else target
        where = f"{target.__qualname__}()"

        @functools.wraps(fn)
        def accept_old(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where} got both {old!r} (deprecated) and {new!r}")
                    _renamed(where, old, new, removed_in)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        if isinstance(target, type):
            target.__init__ = accept_old
            return target
        return accept_old  # type: ignore[return-value]

    return decorate


def renamed_property(old: str, new: str, removed_in: str) -> property:
    """A read-only attribute ``old`` that returns attribute ``new`` with a
    :class:`DeprecationWarning` naming the release ``removed_in`` that drops it (assign it in the
    class body: ``batch_size = renamed_property("batch_size", "read_batch_size", "0.3.0")``)."""

    def get(self: Any) -> Any:
        _renamed(type(self).__name__, old, new, removed_in)
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of :attr:`{new}` (goes in {removed_in}).")
