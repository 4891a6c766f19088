"""Exact counting: one saturating ``uint32`` counter per row of a table with known size, and an
open-addressing table of the rows seen for a table whose rows are not known (the exact phase of a
sketched table, until its rows stop fitting)."""

from numba import njit, uint32, uint64

from .frequent import hh_capacity, hh_shift
from .hashing import mix64


@njit(nogil=True, cache=True)
def exact_update(counts, ids):
    """``counts[id] += 1`` for each ID, saturating at 2**32 - 1; returns the number saturated.

    IDs must already be validated to lie in ``[0, counts.size)``.
    """
    sat = 0
    for k in range(ids.shape[0]):
        i = ids[k]
        c = counts[i]
        if c != uint32(0xFFFFFFFF):
            counts[i] = c + uint32(1)
        else:
            sat += 1
    return sat


@njit(nogil=True, cache=True)
def hashed_exact_update(ids, seed, keys, counts, meta):
    """Count ``ids`` (int64) exactly in an open-addressing table (the heavy-hitter layout of
    :mod:`.frequent`: ``keys``/``counts`` of one power-of-two size, linear probing from the top bits
    of the row hash, ``counts == 0`` an empty slot; ``meta[0]`` the live rows) while every row seen
    fits: a new row is admitted with count 1 while fewer than ``0.75 * size`` rows are live.

    Returns how many leading IDs were counted: ``ids.shape[0]``, or the position of the first ID
    of a new row that found the table full (the caller then moves the table to sketching and
    counts the rest there). ``meta[2]`` (occurrences counted) grows by that number.
    The probe is written out here rather than taken from :func:`.frequent.hh_probe`: this loop is
    the whole cost of the exact phase, and the inline form runs about 2.5x faster.
    """
    size = counts.shape[0]
    mask = uint64(size - 1)
    shift = hh_shift(size)
    cap = hh_capacity(size)
    live = meta[0]
    n = ids.shape[0]
    done = n
    for k in range(n):
        key = ids[k]
        i = mix64(uint64(key), seed) >> shift
        steps = 0
        while counts[i] != 0 and keys[i] != key and steps < size:
            i = (i + uint64(1)) & mask
            steps += 1
        if counts[i] != 0:
            if keys[i] == key:
                counts[i] += 1
                continue
            done = k                    # no empty slot (only a damaged table has none)
            break
        if live >= cap:
            done = k
            break
        keys[i] = key
        counts[i] = 1
        live += 1
    meta[0] = live
    meta[2] += done
    return done

