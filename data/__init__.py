"""Data the project generates and ships: the embedded default trace, topology presets and an
example tables file.

Installed as ``flexshard_stream.data`` (package data); see README.md in this folder.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
DEFAULT_TRACE = DATA_DIR / "default_trace.parquet"
TOPOLOGY_DIR = DATA_DIR / "topologies"
#: A commented tables file (the default trace's four tables): the layout ``--tables`` reads.
EXAMPLE_TABLES = DATA_DIR / "tables.example.toml"
