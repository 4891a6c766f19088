"""``python -m flexshard_stream.online.sidecar ...``: the ring command's former entry point, kept
working. It runs ``flexshard-stream sidecar ...`` (``sidecar_command`` in
:mod:`flexshard_stream.cli`, where the command lives now) in this process, by module name: the
library itself never imports the command line."""

import runpy
import sys

sys.argv[1:1] = ["sidecar"]
runpy.run_module("flexshard_stream.cli", run_name="__main__", alter_sys=True)
