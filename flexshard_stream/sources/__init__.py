"""Where batches come from: logs (parquet, CSV), the shared real datasets, seeded synthetic traces
and drift scenarios, the shared-memory ring from producer processes, and statistics of logs
computed on many processes or Ray (``distributed``). Imports ``stats`` and below.
"""
