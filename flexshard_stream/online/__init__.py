"""Placement kept current while data flows: the re-sharder, the sidecar and replay of logged
traffic. Imports ``placement`` and below.
"""
