"""Typed fields of decoded documents (container headers, manifests, JSON files).

Every decoder reads the values it uses through these checks before anything else sees them, so a
missing, mistyped or out-of-range value is a :class:`~flexshard_stream.errors.FormatError` naming
the file and the field, never a ``TypeError``, ``KeyError`` or ``OverflowError`` further on. JSON
gives ``bool`` as an ``int``; it is never accepted as a number here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import FormatError

__all__ = ["INT64_MAX", "field_bool", "field_int", "field_list", "field_mapping", "field_number",
           "field_str", "mapping"]

INT64_MAX = (1 << 63) - 1
_REQUIRED = object()
_SHOWN = 60


def _shown(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= _SHOWN else r[:_SHOWN - 3] + "..."


def mapping(doc: Any, where: str) -> Mapping[str, Any]:
    """``doc`` itself if it is a mapping (a JSON object), else a FormatError naming ``where``."""
    if not isinstance(doc, Mapping):
        raise FormatError(f"{where}: expected an object, got {type(doc).__name__}")
    return doc


def _absent(doc: Mapping[str, Any], key: str, where: str, default: Any) -> bool:
    """Whether ``key`` is absent and has a default; FormatError when absent and required."""
    if key in doc:
        return False
    if default is _REQUIRED:
        raise FormatError(f"{where}: field {key!r} is missing")
    return True


def field_int(doc: Mapping[str, Any], key: str, where: str, *, lo: int = 0, hi: int = INT64_MAX,
              default: Any = _REQUIRED) -> int:
    """An integer in ``[lo, hi]`` (default: ``[0, 2**63)``); ``default`` when absent (else
    required)."""
    if _absent(doc, key, where, default):
        return default
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FormatError(f"{where}: field {key!r} must be an integer in [{lo}, {hi}], got "
                          f"{_shown(v)}")
    return v


def field_number(doc: Mapping[str, Any], key: str, where: str, *, lo: float = -math.inf,
                 hi: float = math.inf, optional: bool = False, default: Any = _REQUIRED
                 ) -> float | None:
    """A finite number in ``[lo, hi]`` as a float; None allowed if ``optional``; ``default``
    when absent (else required)."""
    if _absent(doc, key, where, default):
        return default
    v = doc[key]
    if v is None and optional:
        return None
    ok = not isinstance(v, bool) and isinstance(v, (int, float))
    if ok:
        try:
            f = float(v)
        except OverflowError:
            ok = False
        else:
            ok = math.isfinite(f) and lo <= f <= hi
    if not ok:
        none = " or null" if optional else ""
        raise FormatError(f"{where}: field {key!r} must be a finite number in [{lo}, {hi}]{none}"
                          f", got {_shown(v)}")
    return f


def field_str(doc: Mapping[str, Any], key: str, where: str, *, optional: bool = False,
              choices: tuple[str, ...] | None = None, default: Any = _REQUIRED) -> str | None:
    """A string (one of ``choices`` when given); None allowed if ``optional``; ``default`` when
    absent (else required)."""
    if _absent(doc, key, where, default):
        return default
    v = doc[key]
    if v is None and optional:
        return None
    if not isinstance(v, str) or (choices is not None and v not in choices):
        want = f"one of {list(choices)}" if choices is not None else "a string"
        raise FormatError(f"{where}: field {key!r} must be {want}"
                          f"{' or null' if optional else ''}, got {_shown(v)}")
    return v


def _typed(doc: Mapping[str, Any], key: str, where: str, default: Any, kind: type,
           want: str) -> Any:
    """``doc[key]`` when it is a ``kind`` (``want`` says so in the error); ``default`` when
    absent (else required)."""
    if _absent(doc, key, where, default):
        return default
    v = doc[key]
    if not isinstance(v, kind):
        raise FormatError(f"{where}: field {key!r} must be {want}, got {_shown(v)}")
    return v


def field_bool(doc: Mapping[str, Any], key: str, where: str, *, default: Any = _REQUIRED) -> bool:
    """``true`` or ``false``; ``default`` when absent (else required)."""
    return _typed(doc, key, where, default, bool, "true or false")


def field_mapping(doc: Mapping[str, Any], key: str, where: str, *,
                  default: Any = _REQUIRED) -> Mapping[str, Any]:
    """An object; ``default`` when absent (else required)."""
    return _typed(doc, key, where, default, Mapping, "an object")


def field_list(doc: Mapping[str, Any], key: str, where: str, *, default: Any = _REQUIRED) -> list:
    """A list; ``default`` when absent (else required)."""
    return _typed(doc, key, where, default, list, "a list")
