"""The TorchRec bridge: what one of our plans becomes in TorchRec 1.8 and back.

The sharding rule (``sharding``), TorchRec's own estimator formulas (``estimator``), TorchRec's
planner on our tables (``planner``), the export of a plan as TorchRec tables with its row layout and
ID remap (``export``, ``layout``, ``remap``), the torch side that loads it (``loader``), the
drop-in modules a model holds in place of its TorchRec collections and their
``DistributedModelParallel`` in one call (``module``), the real runtime harness in a gloo or fake
world (``runtime``, ``world``, ``jobs``), live re-sharding inside a running job (``live``,
``slots``) and how many tables TorchRec's planner is asked to plan as a reference (``limits``).
torch and torchrec are imported only inside functions that need them, through the one gate for
optional imports, :mod:`flexshard_stream.optional`. Imports ``plans`` and below.
"""
