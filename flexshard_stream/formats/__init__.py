"""The bottom floor beside ``kernels``: saved-state formats.

``container`` (checksummed binary files, atomic writes and reads) and ``interop`` (the DataSketches
frequent-items image). Imports nothing of the project but ``errors``.
"""
