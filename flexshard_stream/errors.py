"""One small exception hierarchy for the whole package.

Every error names what was wrong and where (table or feature, field, position) and what was expected,
so that a message is actionable without a debugger. Catch :class:`FlexShardError` to catch them all.
"""

from __future__ import annotations


class FlexShardError(Exception):
    """Base class of every error raised on purpose by flexshard_stream."""


class BatchError(FlexShardError, ValueError):
    """A batch was rejected by validation. No statistic was changed."""

    def __init__(self, message: str, *, feature: str | None = None, field: str | None = None,
                 position: int | None = None):
        where = []
        if feature is not None:
            where.append(f"feature {feature!r}")
        if field is not None:
            where.append(f"field {field!r}")
        if position is not None:
            where.append(f"position {position}")
        prefix = f"batch rejected ({', '.join(where)}): " if where else "batch rejected: "
        super().__init__(prefix + message)
        self.feature = feature
        self.field = field
        self.position = position


class ConfigError(FlexShardError, ValueError):
    """A configuration value (sketch size, table, window, topology, ...) is impossible."""


class IncompatibleError(FlexShardError, ValueError):
    """Two statistics objects cannot be merged (different sizes, seeds, kinds or versions)."""


class FormatError(FlexShardError, ValueError):
    """A file is damaged, foreign, or of an unknown version. Nothing was loaded."""


class LogError(FlexShardError, ValueError):
    """A log file (parquet/CSV) has missing columns, wrong types or bad rows."""


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency (an extra such as ``torchrec``) is not installed; the message names
    the extra and how to install it. Raised only by :mod:`flexshard_stream.optional`, the one gate
    for optional imports; it is an ``ImportError`` (and a ``ConfigError``: the environment lacks
    what the call needs)."""


class ClusterError(FlexShardError, RuntimeError):
    """The emulated cluster (network namespaces, veths, ``tc``) could not be built, measured or
    removed; the message names the command and what it answered."""


class ClusterUnavailable(ClusterError):
    """The emulated cluster cannot run on this machine: not root, no ``ip`` / ``tc``, or the
    kernel lacks network namespaces, veth pairs, bridges or HTB; the message says which."""
