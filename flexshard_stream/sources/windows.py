"""How a log is cut into windows: a duration on the ``ts`` column (seconds) or a number of samples.

One parser for every command and API that takes ``--window`` (replay, distributed statistics).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["MAX_WINDOW_SAMPLES", "WindowSpec", "parse_window"]

#: Largest window in samples (sample counters are int64).
MAX_WINDOW_SAMPLES = 1 << 62

_UNITS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0,
          "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "d": 86400.0, "day": 86400.0,
          "days": 86400.0}
_RE_WINDOW = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class WindowSpec:
    """How the stream is cut: ``unit`` "seconds" (on the ``ts`` column) or "samples"; ``size``
    in that unit (> 0; an integer for samples); ``text`` as given."""

    unit: str
    size: float
    text: str = ""

    def describe(self) -> str:
        """Human form: ``"30m"`` or ``"100,000 samples"``."""
        if self.unit == "samples":
            return f"{int(self.size):,} samples"
        return self.text or f"{self.size:g} s"

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "size": self.size, "spec": self.text,
                "describe": self.describe()}


def parse_window(spec: str | int | WindowSpec) -> WindowSpec:
    """Parse a window spec.

    ``"30m"``, ``"1h"``, ``"1d"``, ``"90s"``, ``"500ms"``, ``"1.5h"``: a duration on the ``ts``
    column (units ms, s, m / min, h, d). A plain positive integer (``"100000"`` or ``100000``):
    samples.

    Raises
    ------
    ConfigError
        Empty, zero, negative, fractional sample counts, unknown units, anything else.
    """
    if isinstance(spec, WindowSpec):
        return spec
    if isinstance(spec, bool):
        raise ConfigError(f"window {spec!r}: expected a duration such as '30m' or a number of "
                          f"samples such as '100000'")
    if isinstance(spec, (int, np.integer)):
        if not 0 < spec <= MAX_WINDOW_SAMPLES:
            raise ConfigError(f"window {spec}: a number of samples must be in "
                              f"[1, {MAX_WINDOW_SAMPLES:,}]")
        return WindowSpec("samples", int(spec), str(int(spec)))
    if not isinstance(spec, str):
        raise ConfigError(f"window {spec!r}: expected a string such as '30m' (a duration) or "
                          f"'100000' (samples), got {type(spec).__name__}")
    m = _RE_WINDOW.match(spec)
    if not m:
        raise ConfigError(f"window {spec!r}: expected a duration such as '90s', '30m', '1h', '1d' "
                          f"or a number of samples such as '100000'")
    num, unit = m.group(1), m.group(2).lower()
    if not unit:
        if "." in num:
            raise ConfigError(f"window {spec!r}: a number of samples must be a whole number; for "
                              f"a duration add a unit (ms, s, m, h, d)")
        n = int(num)
        if not 0 < n <= MAX_WINDOW_SAMPLES:
            raise ConfigError(f"window {spec!r}: a number of samples must be in "
                              f"[1, {MAX_WINDOW_SAMPLES:,}]")
        return WindowSpec("samples", n, spec.strip())
    if unit not in _UNITS:
        raise ConfigError(f"window {spec!r}: unknown unit {m.group(2)!r}; use ms, s, m (min), "
                          f"h or d, or no unit for a number of samples")
    secs = float(num) * _UNITS[unit]
    if not (secs > 0 and math.isfinite(secs)):
        raise ConfigError(f"window {spec!r}: a duration must be > 0")
    return WindowSpec("seconds", secs, spec.strip())
