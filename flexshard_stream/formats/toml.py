"""TOML in and out: reading with errors that name the file, and writing values that read back
exactly (topology and table files)."""

from __future__ import annotations

import os
import tomllib
from decimal import Decimal
from typing import Any

import numpy as np

from ..errors import FormatError
from .files import check_output_file, read_bytes, write_atomic

__all__ = ["TOML_KINDS", "read_toml", "toml_kind", "toml_value", "write_text_atomic"]

#: The TOML files the project writes, by kind: the top-level key each one holds.
TOML_KINDS = {"tables": "table", "topology": "topology"}
#: Largest file :func:`toml_kind` parses to recognize it (bytes); anything larger is not ours.
_TOML_KIND_MAX_BYTES = 16 << 20


def _fmt_float(x: float) -> str:
    """A TOML float that reads back as exactly ``x``, in engineering notation when short (80e9)."""
    r = repr(float(x))
    d = Decimal(r).normalize()
    sign, digits, exp = d.as_tuple()
    if isinstance(exp, int) and digits != (0,):
        e10 = len(digits) - 1 + exp                   # x = m * 10**e10 with 1 <= m < 10
        eng = 3 * (e10 // 3)
        mant = format(d.scaleb(-eng), "f")
        s = f"{mant}e{eng}" if eng else (mant if "." in mant else mant + ".0")
        if float(s) == x and len(s) <= len(r):
            return s
    return r


def _fmt_str(s: str) -> str:
    """A TOML basic string."""
    out = []
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    """``v`` (str, bool, int or float) as a TOML value that reads back as exactly ``v``."""
    if isinstance(v, str):
        return _fmt_str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return _fmt_float(float(v))


def write_text_atomic(path: str | os.PathLike, text: str, *, kind: str | None = None) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (:func:`.files.write_atomic`); with ``kind``
    (:data:`TOML_KINDS`) it replaces only a TOML file of that kind, never a user's other file
    (:func:`.files.check_output_file`)."""
    if kind is not None:
        check_output_file(path, kind, toml_kind)
    write_atomic(path, text.encode("utf-8"), mode=0o644)


def toml_kind(path: str | os.PathLike) -> str | None:
    """The kind of TOML file at ``path`` (:data:`TOML_KINDS`: the one top-level key of a kind it
    holds); None for a file that is larger than a configuration file, not TOML, or of no kind."""
    if os.stat(path).st_size > _TOML_KIND_MAX_BYTES:
        return None
    found = [kind for kind, key in TOML_KINDS.items() if key in read_toml(path)]
    return found[0] if len(found) == 1 else None


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a TOML file; FormatError naming the file if it cannot be read (a missing path, a
    directory, a FIFO or a device: :func:`.files.read_bytes`) or is not TOML."""
    raw = read_bytes(path, "TOML file")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise FormatError(f"{path}: not a valid TOML file ({e})") from None
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: not a valid TOML file (not UTF-8 text: {e})") from None
    except RecursionError:
        raise FormatError(f"{path}: not a valid TOML file (nested too deeply)") from None
