"""Where batches come from: logs (parquet, CSV), the shared real datasets, seeded synthetic traces
and drift scenarios. Imports ``stats`` and below.
"""
