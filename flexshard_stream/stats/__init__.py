"""Statistics of the ID stream: the one batch type and what is learned from it.

``batch`` (``Batch``, KJT layout), ``config`` (sketch sizes), ``table_stats`` (one table's sketches),
``stream`` (``StreamStats``: every table, whole-batch validation), ``window`` (sliding and decayed
views), ``summary`` (``FrequencySummary``, the only contract between statistics and placement).
Imports only ``formats``, ``kernels`` and ``errors``.
"""
