"""flexshard_stream: live, statistics-driven embedding-table placement.

The public API is re-exported here; see ``docs/ARCHITECTURE.md`` for the path of a batch.
"""

from .compat import install as install_moved_module_aliases
from .errors import (
                     BatchError,
                     ConfigError,
                     FlexShardError,
                     FormatError,
                     IncompatibleError,
                     LogError,
)
from .stats.batch import Batch
from .stats.config import SketchConfig, TableConfig
from .stats.stream import StreamStats, validate_batch
from .stats.summary import FrequencySummary
from .stats.table_stats import TableStats
from .stats.window import DecayedStats, WindowedStats

__version__ = "0.2.0"

install_moved_module_aliases()

__all__ = ["Batch", "BatchError", "ConfigError", "DecayedStats", "FlexShardError", "FormatError",
           "FrequencySummary", "IncompatibleError", "LogError", "SketchConfig", "StreamStats",
           "TableConfig", "TableStats", "WindowedStats", "validate_batch", "__version__"]
