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
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

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


def _renamed(where: str, old: str, new: str) -> None:
    warnings.warn(f"{where}: {old!r} is deprecated, use {new!r} (same meaning); the old name goes "
                  f"in the next release", DeprecationWarning, stacklevel=3)


def renamed_keywords(**renames: str) -> Callable[[_F], _F]:
    """Decorator: accept each old keyword ``old=new`` of a function (or of a class's constructor)
    for one release, passing it on as ``new`` with a :class:`DeprecationWarning`.

    Giving both names is a :class:`TypeError`, as for any keyword given twice. Example::

        @renamed_keywords(batch_size="read_batch_size")
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
                    _renamed(where, old, new)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        if isinstance(target, type):
            target.__init__ = accept_old
            return target
        return accept_old  # type: ignore[return-value]

    return decorate


def renamed_property(old: str, new: str) -> property:
    """A read-only attribute ``old`` that returns attribute ``new`` with a
    :class:`DeprecationWarning` (assign it in the class body: ``batch_size = renamed_property(
    "batch_size", "read_batch_size")``)."""

    def get(self: Any) -> Any:
        _renamed(type(self).__name__, old, new)
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of :attr:`{new}` (goes in the next release).")
