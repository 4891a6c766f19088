"""The state protocol: ``state()`` and ``restore(state)`` on every stateful object.

Torch users know the pair as ``state_dict()`` / ``load_state_dict()``. ``state()`` returns a plain
dict ``{"kind": str, "version": int, ...}`` whose other values are JSON-able scalars and lists, plus
what the class names in its docstring (the statistics: bytes blobs under ``"blobs"``, a mapping
from a file-safe name to the bytes of one container). ``restore(state)`` takes such a dict on an
object built with the same configuration; it checks everything before it changes anything and
raises, leaving the object as it was:

- :class:`~flexshard_stream.errors.FormatError`: not a state, an unknown version, a field missing or
  of the wrong type, a damaged blob;
- :class:`~flexshard_stream.errors.ConfigError`: a state of another kind, or made with another
  configuration (tables, sketch sizes, topology).

Settings that may differ without harm (a decay half-life, a window length) are not errors: the
object keeps its own, and ``restore`` returns one note per difference (a list of strings; empty when
nothing differed) for the caller to report.

This module checks the envelope (kind, version, field types, blobs) for the classes that implement
the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, FormatError

__all__ = ["NUMBER", "OPTIONAL_NUMBER", "check_state", "state_blob"]

#: field types for :func:`check_state`: a number (bool refused), or a number or None
NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))


def check_state(state: Any, kind: str, version: int,
                fields: Mapping[str, type | tuple[type, ...]]) -> Mapping[str, Any]:
    """Check the envelope of a ``state()`` dict and return it.

    Parameters
    ----------
    state : what ``restore`` was given
    kind, version : what the restoring class writes
    fields : required field -> accepted type(s); ``bool`` is accepted only where named (it is an
        ``int`` to Python, never a count here)

    Raises FormatError (not a mapping, no or unknown version, a field missing or of another type)
    or ConfigError (a state of another kind).
    """
    if not isinstance(state, Mapping):
        raise FormatError(f"{kind} state: expected a mapping (from state()), got "
                          f"{type(state).__name__}")
    got = state.get("kind")
    if got != kind:
        if not isinstance(got, str):
            raise FormatError(f"{kind} state: no 'kind' field (not a state() dict)")
        raise ConfigError(f"a {got!r} state cannot be restored into {kind!r} statistics or "
                          "objects")
    if state.get("version") != version:
        raise FormatError(f"{kind} state version {state.get('version')!r} is not supported "
                          f"(this flexshard_stream reads version {version})")
    for name, types in fields.items():
        if name not in state:
            raise FormatError(f"{kind} state: field {name!r} is missing")
        value = state[name]
        allowed = types if isinstance(types, tuple) else (types,)
        if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise FormatError(f"{kind} state: field {name!r} is a {type(value).__name__}, "
                              f"expected {names}")
    return state


def state_blob(state: Mapping[str, Any], kind: str, name: str) -> bytes:
    """The bytes blob ``name`` of a state's ``"blobs"`` mapping; FormatError if it is missing."""
    blobs = state.get("blobs")
    if not isinstance(blobs, Mapping):
        raise FormatError(f"{kind} state: no 'blobs' mapping")
    blob = blobs.get(name)
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise FormatError(f"{kind} state: blob {name!r} is missing (have {sorted(blobs)})")
    return bytes(blob)
