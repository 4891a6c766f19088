"""Interchange images that other sketch libraries read (DataSketches)."""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["frequent_items_image"]

_FAMILY_FREQUENCY = 10
_SER_VER = 1


def frequent_items_image(lg_max_map_size: int, items: np.ndarray, weights: np.ndarray,
                         stream_weight: int, offset: int) -> bytes:
    """A DataSketches frequent-items sketch image with int64 items (``PyLongsSerDe``,
    Java ``ArrayOfLongsSerDe``): the format shared by the C++, Java and Python libraries.

    Preamble (4 longs): ``[pre_longs=4, ser_ver=1, family=10, lg_max, lg_cur, flags=0, 0, 0]``,
    ``num_active (u32), 0``, ``stream weight (i64)``, ``offset (i64)``; then the weights (i64 each),
    then the items (i64 each, little endian).
    """
    items = np.ascontiguousarray(items, dtype="<i8")
    weights = np.ascontiguousarray(weights, dtype="<i8")
    n = items.size
    if n == 0 and stream_weight == 0:
        return struct.pack("<BBBBBBH", 1, _SER_VER, _FAMILY_FREQUENCY, lg_max_map_size, 3, 5, 0)
    lg_cur = 3
    while (3 << lg_cur) // 4 < n:
        lg_cur += 1
    lg_cur = min(max(lg_cur, 3), lg_max_map_size)
    pre = struct.pack("<BBBBBBH", 4, _SER_VER, _FAMILY_FREQUENCY, lg_max_map_size, lg_cur, 0, 0)
    pre += struct.pack("<IIqq", n, 0, int(stream_weight), int(offset))
    return pre + weights.tobytes() + items.tobytes()
