"""Numbers as people read them: bytes, seconds and counts with a unit chosen by magnitude.

One place for the units every printed figure uses (the command line, the HTML report, the
pictures' axes), so that ``2.81 us`` and ``2.41 us`` never both print as ``0.003 ms``. Byte
prefixes are decimal (``1 KB = 1e3 bytes``, as the rest of the project counts bytes: MB = 1e6);
times go ns, us, ms, s; three significant digits by default.
"""

from __future__ import annotations

import math

__all__ = ["byte_scale", "time_scale", "fmt_bytes", "fmt_seconds", "fmt_rows", "fmt_count"]

_BYTE_PREFIXES = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"))
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"))
_COUNT_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"))


def byte_scale(vmax: float) -> tuple[float, str]:
    """Divisor and unit for byte values up to ``vmax`` (bytes): ``(1e6, "MB")`` for 3.2e7."""
    v = abs(float(vmax)) if vmax is not None and math.isfinite(vmax) else 0.0
    for f, u in _BYTE_PREFIXES:
        if v >= f * (1 - 5e-4):         # 999.9 KB prints as 1 MB, not 1e+03 KB
            return f, u
    return 1.0, "B"


def time_scale(vmax: float) -> tuple[float, str]:
    """Divisor and unit for durations up to ``vmax`` (seconds): s, ms, us or ns."""
    v = abs(float(vmax)) if vmax is not None and math.isfinite(vmax) else 0.0
    for f, u in _TIME_UNITS:
        if v >= f * (1 - 5e-4):
            return f, u
    return 1e-9, "ns"


def _fmt(x: float, f: float, u: str, digits: int) -> str:
    """``x / f`` with ``digits`` significant digits, trailing zeros kept (``10.0``, not ``10``)."""
    v = x / f
    if v == 0:
        return f"0 {u}"
    text = f"{v:#,.{digits}g}" if abs(v) < 10 ** digits else f"{v:,.0f}"
    return f"{text.rstrip('.')} {u}"


def fmt_bytes(x: float | None, digits: int = 3) -> str:
    """``x`` bytes with a decimal unit by magnitude: ``"812 B"``, ``"2.81 KB"``, ``"20.6 GB"``
    (``"4.72e+21 B"`` from 1e18 bytes on); ``"-"`` for None or a non-finite value."""
    if x is None or not math.isfinite(x):
        return "-"
    if abs(x) >= 1e18:                  # beyond petabytes: no prefix anyone reads at a glance
        return f"{x:.{digits}g} B"
    f, u = byte_scale(x)
    return _fmt(float(x), f, u, digits)


def fmt_seconds(x: float | None, digits: int = 3) -> str:
    """``x`` seconds as ns, us, ms or s by magnitude: ``"2.81 us"``, ``"692 us"``, ``"1.3 s"``;
    ``"0 s"`` for zero and ``"-"`` for None or a non-finite value."""
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0 s"
    f, u = time_scale(x)
    return _fmt(float(x), f, u, digits)


def fmt_rows(n: float | None) -> str:
    """A row or ID count in a phrase: exact with thousands separators below a million, then
    three significant digits with M, G or T (``"54,273"``, ``"751M"``, ``"1.5G"``), and in
    scientific notation from 1e15 (``"9.19e+18"``)."""
    if n is None or not math.isfinite(n):
        return "-"
    if abs(n) >= 1e15:
        return f"{n:.3g}"
    for f, u in _COUNT_SUFFIXES:
        if abs(n) >= f:
            return f"{n / f:,.3g}{u}"
    return f"{int(round(n)):,}"


def fmt_count(n: float | None) -> str:
    """A count in a table column: exact with thousands separators below 1e10 (``"999,789,872"``),
    else three significant digits in scientific notation (``"9.19e+18"``), so that 64-bit IDs
    do not take 25 columns."""
    if n is None or not math.isfinite(n):
        return "-"
    return f"{int(round(n)):,}" if abs(n) < 1e10 else f"{n:.3g}"
