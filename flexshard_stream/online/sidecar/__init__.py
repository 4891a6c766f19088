"""The statistics sidecar: live statistics and re-sharding next to a training job.

In process (docs/SIDECAR.md)::

    with Sidecar(tables, topology, batch_size=512, out_dir="run/sidecar") as sc:
        for batch in sc.attach(loader):      # every batch the loader yields is submitted
            train_step(batch)
    sc.stats()                               # counters: batches, IDs, drops, lag

Every setting (queue bounds and policy, checkpoint period, CPU budget, the re-sharder's
``ReshardConfig``, ...) is a field of one frozen, validated :class:`SidecarConfig`
(``Sidecar(..., config=SidecarConfig(...))``, or the fields by name: ``queue_batches=8``), with one
default that the ring command and :func:`run_ring` read too.

``submit(batch)`` puts the batch on a bounded queue (bounded in batches, IDs and bytes) and returns
at once: when the queue is full the batch is dropped and counted (``policy="drop"``, the default),
or ``submit`` waits for room, up to a timeout (``policy="block"``). Two background threads do the
rest: the *ingest* thread feeds the statistics (the Numba kernels release the GIL) and, every
``config.reshard.check_every`` batches or seconds, hands a frequency summary to the *planner*
thread, which runs :meth:`Resharder.check <flexshard_stream.online.resharder.Resharder.check>`
and publishes the :class:`~flexshard_stream.online.resharder.Decision` it returns when it moved
the plan (planning
never stalls ingestion; a check due while the previous one still runs replaces the one waiting,
counted as ``checks_coalesced``). Every applied change is published atomically under ``out_dir``::

    out_dir/state.json            pointer: {"seq", "plan", "plan_fingerprint", "delta", ...}
    out_dir/plan -> plans/NNNNNN  symlink to the current plan directory (Plan.load)
    out_dir/plans/NNNNNN/         the last few published plans (Plan.save)
    out_dir/deltas/NNNNNN.delta   PlanDelta from plan NNNNNN-1 to plan NNNNNN (PlanDelta.load)
    out_dir/decisions.jsonl       one line per check (Decision.to_json)
    out_dir/counters.json         cumulative counters, rewritten every ``counters_every_s``
    out_dir/checkpoints/ckpt-NNNNNNNN/   the last ``keep_checkpoints`` checkpoints

and passed to ``callback(decision, plan)`` (on the planner thread). Errors in the background threads
are logged and re-raised, as :class:`SidecarError`, by the next ``submit``/``flush``/
``checkpoint``/``close``; the sidecar keeps running after a bad batch or a failing callback.

Checkpoints (the ``state()`` of the statistics and of the re-sharder, the plans, a manifest with a
sha256 per file, a checksum and the batch counts) are written every ``checkpoint_every_s`` seconds
and on ``close``. With ``resume=True`` the sidecar restarts from the newest good checkpoint (a
damaged one is skipped with a :class:`SidecarWarning` naming the file) and reports in
:attr:`Sidecar.resume_report` how many batches were lost since it.

Out of process: ``flexshard-stream sidecar --ring NAME ...`` (:func:`run_ring`) reads batches that
DataLoader workers write into a shared-memory ring (:mod:`flexshard_stream.sources.ring`), feeds the
same machinery and shuts down cleanly (final checkpoint) on SIGTERM/SIGINT.

Within a CPU budget (``cpu_budget``, half a core by default) the ingest thread samples one ID
occurrence in ``k``, ``k`` chosen from its measured cost per ID and the offered rate, so that it
keeps up without dropping batches (``SidecarStats.sample_k``; docs/SIDECAR.md).

The parts, one module each: :mod:`.loader` (``to_batch``, ``AttachedLoader``), :mod:`.ingest`
(the bounded queue, the counters, the ingest thread, the sampling it applies), :mod:`.rate` (the
rate controller), :mod:`.cores` (threads for the tables of a batch), :mod:`.planning` (the planner
thread),
:mod:`.publisher` (plans, deltas, the ``plan`` link, the counters file), :mod:`.checkpoint`
(format, write, read, resume, ``ResumeReport``), :mod:`.ring_feed` (``run_ring``), :mod:`.core`
(the ``Sidecar`` composing them), :mod:`.config` (``SidecarConfig``; light, so the package
imports the others on first use) and :mod:`.common` (errors and names they share).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import SidecarConfig

if TYPE_CHECKING:
    from .checkpoint import ResumeReport, list_checkpoints, read_checkpoint
    from .common import CheckpointLostError, SidecarError, SidecarWarning
    from .core import Sidecar
    from .ingest import SidecarStats
    from .loader import AttachedLoader, to_batch
    from .ring_feed import run_ring

#: Re-exported name -> the module that defines it, imported on first access (PEP 562), so that
#: importing :mod:`.config` (the command line's defaults) loads neither numpy nor Numba.
_LAZY = {"ResumeReport": ".checkpoint", "list_checkpoints": ".checkpoint",
         "read_checkpoint": ".checkpoint", "SidecarError": ".common",
         "CheckpointLostError": ".common",
         "SidecarWarning": ".common", "Sidecar": ".core", "SidecarStats": ".ingest",
         "AttachedLoader": ".loader", "to_batch": ".loader", "run_ring": ".ring_feed"}

__all__ = ["AttachedLoader", "CheckpointLostError", "ResumeReport", "Sidecar", "SidecarConfig", "SidecarError",
           "SidecarStats", "SidecarWarning", "list_checkpoints", "read_checkpoint", "run_ring",
           "to_batch"]


def __getattr__(name: str) -> Any:
    """Import a re-exported name on first access and keep it in the package namespace."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
