"""The one gate for optional dependencies (as polars' ``import_optional``).

torch and torchrec (the ``torchrec`` extra), matplotlib (``report``) and Ray (``ray``) are imported
only by the functions that need them, through :func:`import_optional` or :func:`optional_imports`;
a missing one is a :class:`~flexshard_stream.errors.MissingExtraError` that names the extra, what
needed it and how to install it.
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Iterator

from .errors import MissingExtraError

__all__ = ["EXTRAS", "import_optional", "optional_imports", "missing_extra"]

#: extra -> (what it brings, how to install it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torchrec": ("TorchRec 1.8.0 with torch 2.13 (CPU) and fbgemm-gpu-cpu 1.8.0",
                 "`make install-dev`, or pip install 'torch==2.13.0+cpu' "
                 "'flexshard-stream[torchrec]', then pip install torchrec==1.8.0 "
                 "fbgemm-gpu-cpu==1.8.0 --no-deps (docs/TORCHREC_RUNTIME.md)"),
    "report": ("matplotlib", "pip install 'flexshard-stream[report]' (or pip install matplotlib)"),
    "ray": ("Ray", "pip install 'flexshard-stream[ray]' (or 'ray>=2.9')"),
}


def missing_extra(extra: str, purpose: str, cause: BaseException | None = None
                  ) -> MissingExtraError:
    """The error for ``purpose`` (what needed it, e.g. ``"plan --strategy torchrec"``) when the
    ``extra`` is not installed."""
    what, how = EXTRAS[extra]
    detail = f" ({cause})" if cause is not None else ""
    return MissingExtraError(f"{purpose} needs {what}, which is not installed: install the "
                             f"{extra!r} extra: {how}{detail}")


@contextlib.contextmanager
def optional_imports(extra: str, purpose: str) -> Iterator[None]:
    """Run the imports in the block; an ``ImportError`` among them becomes
    :func:`missing_extra` (``with optional_imports("torchrec", "export"): from torchrec ...``)."""
    try:
        yield
    except MissingExtraError:
        raise
    except ImportError as e:
        raise missing_extra(extra, purpose, e) from e


def import_optional(module: str, *, extra: str, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``, or :func:`missing_extra` when it is not installed."""
    with optional_imports(extra, purpose):
        return importlib.import_module(module)
