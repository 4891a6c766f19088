"""Data the project generates and ships: the embedded default trace and topology presets.

Installed as ``flexshard_stream.data`` (package data); see README.md in this folder.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
DEFAULT_TRACE = DATA_DIR / "default_trace.parquet"
TOPOLOGY_DIR = DATA_DIR / "topologies"
