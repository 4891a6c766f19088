"""Placement kept current while data flows: the re-sharder, the sidecar, the shared-memory ring,
replay of logged traffic, distributed statistics and reports. Imports ``placement`` and below.
"""
