"""Interchange images that other sketch libraries read (DataSketches)."""

from __future__ import annotations

import struct

import numpy as np

from ..errors import FormatError

__all__ = ["check_kll_ints_image", "frequent_items_image", "kll_total_capacity"]

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


# ------------------------------------------------------------------------------ KLL images
#: DataSketches KLL constants (``kll_sketch.hpp``): family id, the fixed ``m``, bounds of ``k``.
_FAMILY_KLL = 15
_KLL_M = 8
_KLL_MIN_K, _KLL_MAX_K = 8, (1 << 16) - 1
_KLL_FLAG_EMPTY, _KLL_FLAG_SORTED, _KLL_FLAG_SINGLE = 1, 2, 4
#: Most levels a KLL sketch can have (a level's depth is at most 60 in ``int_cap_aux``).
_KLL_MAX_LEVELS = 61
_KLL_FULL_HEADER = 20              # preamble (8) + n (8) + min_k (2) + num_levels (1) + unused (1)


def _kll_level_capacity(k: int, num_levels: int, height: int) -> int:
    """Items a level may hold (``kll_helper::level_capacity``): ``k * (2/3) ** depth``, rounded,
    at least ``m``."""
    def cap(k: int, depth: int) -> int:
        return (((2 * k) << depth) // 3 ** depth + 1) >> 1
    depth = num_levels - height - 1
    c = cap(k, depth) if depth <= 30 else cap(cap(k, depth // 2), depth - depth // 2)
    return max(_KLL_M, c)


def kll_total_capacity(k: int, num_levels: int) -> int:
    """Items a KLL sketch of ``k`` with ``num_levels`` levels keeps room for
    (``kll_helper::compute_total_capacity``): the end of its item buffer."""
    return sum(_kll_level_capacity(k, num_levels, h) for h in range(num_levels))


def check_kll_ints_image(image: bytes, k: int, what: str) -> int:
    """Validate a DataSketches KLL sketch image of 32-bit integers (``kll_ints_sketch.serialize``)
    against the serialization format before any DataSketches code reads it; returns ``n``, the
    items the sketch has seen. ``what`` names the image in messages (file and field).

    The DataSketches deserializer trusts the preamble: level offsets beyond the buffer, a level
    count of 0 or an item count that disagrees with the levels make it read or write out of
    bounds (a crash, not an exception). Checked here, each a :class:`FormatError`:

    - preamble: preamble ints 2 (empty, one item) or 5 (more), serial version 1 (2 for one item),
      family 15, only the empty / sorted level 0 / single item flags, ``k`` as configured, ``m = 8``,
      unused bytes 0;
    - the image's size is exactly what its layout says (8 bytes empty, 12 one item, else 20 +
      4 per level + 8 (min, max) + 4 per retained item);
    - ``1 <= num_levels <= 61``, ``8 <= min_k <= k``, the level offsets non-decreasing from the
      first (below the capacity ``kll_total_capacity(k, num_levels)``, so at least one item) to
      the capacity;
    - the items' weights (``2 ** level`` each) add up to ``n``, every level above 0 is sorted (and
      level 0 when flagged), ``0 <= min <= every item <= max`` (the items are sequence lengths).
    """
    if not isinstance(image, (bytes, bytearray)):
        raise FormatError(f"{what}: expected bytes, got {type(image).__name__}")
    if len(image) < 8:
        raise FormatError(f"{what}: KLL image of {len(image)} bytes, shorter than its 8-byte "
                          "preamble")
    pre, ser, family, flags, k_img, m = struct.unpack_from("<BBBBHB", image, 0)
    if family != _FAMILY_KLL:
        raise FormatError(f"{what}: not a KLL sketch (family {family}, expected {_FAMILY_KLL})")
    if flags & ~(_KLL_FLAG_EMPTY | _KLL_FLAG_SORTED | _KLL_FLAG_SINGLE) or image[7]:
        raise FormatError(f"{what}: KLL flags {flags:#04x} hold unknown bits or the unused "
                          "preamble byte is not 0")
    if k_img != k or m != _KLL_M or not _KLL_MIN_K <= k <= _KLL_MAX_K:
        raise FormatError(f"{what}: KLL k = {k_img}, m = {m}; expected k = {k} (the sketch "
                          f"config's length_k) and m = {_KLL_M}")
    if flags & _KLL_FLAG_EMPTY:
        if flags & _KLL_FLAG_SINGLE or (pre, ser) != (2, 1) or len(image) != 8:
            raise FormatError(f"{what}: empty KLL image with preamble ints {pre}, serial version "
                              f"{ser}, {len(image)} bytes (expected 2, 1, 8 bytes)")
        return 0
    if flags & _KLL_FLAG_SINGLE:
        if (pre, ser) != (2, 2) or len(image) != 12:
            raise FormatError(f"{what}: one-item KLL image with preamble ints {pre}, serial "
                              f"version {ser}, {len(image)} bytes (expected 2, 2, 12 bytes)")
        if struct.unpack_from("<i", image, 8)[0] < 0:
            raise FormatError(f"{what}: KLL item is negative (a sequence length)")
        return 1
    return _check_kll_full(image, pre, ser, k, what)


def _check_kll_full(image: bytes, pre: int, ser: int, k: int, what: str) -> int:
    """The levels and items of a KLL image with more than one item (see
    :func:`check_kll_ints_image`); returns ``n``."""
    if (pre, ser) != (5, 1) or len(image) < _KLL_FULL_HEADER:
        raise FormatError(f"{what}: KLL image with preamble ints {pre}, serial version {ser}, "
                          f"{len(image)} bytes (expected 5, 1, at least {_KLL_FULL_HEADER})")
    n, min_k, num_levels, unused = struct.unpack_from("<QHBB", image, 8)
    if not 1 <= num_levels <= _KLL_MAX_LEVELS or not _KLL_MIN_K <= min_k <= k or unused:
        raise FormatError(f"{what}: KLL num_levels = {num_levels}, min_k = {min_k}, unused byte "
                          f"{unused}; expected 1..{_KLL_MAX_LEVELS}, {_KLL_MIN_K}..{k}, 0")
    capacity = kll_total_capacity(k, num_levels)
    if len(image) < _KLL_FULL_HEADER + 4 * num_levels:
        raise FormatError(f"{what}: KLL image of {len(image)} bytes cannot hold its "
                          f"{num_levels} level offsets")
    levels = np.frombuffer(image, "<u4", num_levels, _KLL_FULL_HEADER).astype(np.int64)
    levels = np.append(levels, capacity)
    if not levels[0] < capacity or np.any(np.diff(levels) < 0):
        raise FormatError(f"{what}: KLL level offsets {levels.tolist()} are not non-decreasing "
                          f"from below {capacity} (the capacity) to it")
    retained = int(capacity - levels[0])
    start = _KLL_FULL_HEADER + 4 * num_levels
    if len(image) != start + 8 + 4 * retained:
        raise FormatError(f"{what}: KLL image of {len(image)} bytes; its levels say "
                          f"{start + 8 + 4 * retained} ({retained} items)")
    lo, hi = struct.unpack_from("<ii", image, start)
    items = np.frombuffer(image, "<i4", retained, start + 8)
    weight = sum(int(size) << h for h, size in enumerate(np.diff(levels)))
    if weight != n:
        raise FormatError(f"{what}: KLL n = {n} but its items weigh {weight} (an item of "
                          "level h weighs 2 ** h)")
    if not 0 <= lo <= hi or items.min() < lo or items.max() > hi:
        raise FormatError(f"{what}: KLL items outside 0 <= min {lo} <= item <= max {hi}")
    sorted_from = 0 if image[3] & _KLL_FLAG_SORTED else 1
    for h in range(sorted_from, num_levels):
        level = items[levels[h] - levels[0]:levels[h + 1] - levels[0]]
        if np.any(level[1:] < level[:-1]):
            raise FormatError(f"{what}: KLL level {h} is not sorted")
    return int(n)
