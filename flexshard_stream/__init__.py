"""flexshard_stream: live, statistics-driven embedding-table placement.

The public API is re-exported here; see ``docs/ARCHITECTURE.md`` for the path of a batch.
"""

from .batch import Batch
from .config import SketchConfig, TableConfig
from .errors import (BatchError, ConfigError, FlexShardError, FormatError, IncompatibleError,
                     LogError)
from .stream import StreamStats, validate_batch
from .summary import FrequencySummary
from .table_stats import TableStats
from .window import DecayedStats, WindowedStats

__version__ = "0.1.0"

__all__ = ["Batch", "BatchError", "ConfigError", "DecayedStats", "FlexShardError", "FormatError",
           "FrequencySummary", "IncompatibleError", "LogError", "SketchConfig", "StreamStats",
           "TableConfig", "TableStats", "WindowedStats", "validate_batch", "__version__"]
