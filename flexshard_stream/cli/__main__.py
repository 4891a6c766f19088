"""``python -m flexshard_stream.cli ...``: the same as ``flexshard-stream ...``."""

from . import main

main()
