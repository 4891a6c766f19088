"""How much of TorchRec's planner a comparison may ask for (no imports, so the CLI's help can name
the figure without loading numpy or torch)."""

from __future__ import annotations

__all__ = ["TORCHREC_REFERENCE_TABLES"]

#: Up to this many tables TorchRec's own plan is made as a reference beside other plans (``plan``,
#: ``replay --vs-torchrec``, the demo): TorchRec's planner took 1.4 s for 10 tables and 47 s for
#: 100 here. Above it the reference is left out with a note (CLI ``plan``, demo) or refused
#: (``replay(vs_torchrec=True)``); ``--strategy torchrec`` and ``plan_torchrec`` still make it.
TORCHREC_REFERENCE_TABLES = 64
