"""Numba kernels: pure functions over numpy arrays, ``@njit(nogil=True, cache=True)``.

No classes, no I/O, no Python objects in loops. Installed as ``flexshard_stream.kernels``.
"""
