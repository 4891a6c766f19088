"""flexshard_stream: live, statistics-driven embedding-table placement.

The public API is re-exported here; see ``docs/ARCHITECTURE.md`` for the path of a batch. The
re-exported classes are imported on first use (PEP 562), so ``import flexshard_stream`` (and the
command line's ``--help``) loads neither Numba nor the statistics until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .compat import install as install_moved_module_aliases
from .errors import (
                     BatchError,
                     ConfigError,
                     FlexShardError,
                     FormatError,
                     IncompatibleError,
                     LogError,
)

if TYPE_CHECKING:
    from .stats.batch import Batch
    from .stats.config import SketchConfig, TableConfig
    from .stats.stream import StreamStats, validate_batch
    from .stats.summary import FrequencySummary
    from .stats.table_stats import TableStats
    from .stats.window import DecayedStats, WindowedStats

__version__ = "0.2.0"

#: Re-exported name -> the module that defines it (imported on first access).
_LAZY = {"Batch": ".stats.batch", "SketchConfig": ".stats.config", "TableConfig": ".stats.config",
         "StreamStats": ".stats.stream", "validate_batch": ".stats.stream",
         "FrequencySummary": ".stats.summary", "TableStats": ".stats.table_stats",
         "DecayedStats": ".stats.window", "WindowedStats": ".stats.window"}

install_moved_module_aliases()

__all__ = ["Batch", "BatchError", "ConfigError", "DecayedStats", "FlexShardError", "FormatError",
           "FrequencySummary", "IncompatibleError", "LogError", "SketchConfig", "StreamStats",
           "TableConfig", "TableStats", "WindowedStats", "validate_batch", "__version__"]


def __getattr__(name: str) -> Any:
    """Import a re-exported name on first access and keep it in the package namespace."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'flexshard_stream' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
