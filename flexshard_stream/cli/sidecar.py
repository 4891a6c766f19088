"""``flexshard-stream sidecar``: statistics and re-sharding fed by a shared-memory ring
(docs/SIDECAR.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from .common import (
    DEDUP_HELP,
    PROFILE_HELP,
    PROFILES,
    choice,
    default_dedup,
    ids_option,
    writing,
)


def _default(name: str) -> Any:
    """The ring command's default of sidecar setting ``name``: ``SidecarConfig``'s (the one
    definition the ring feed and ``Sidecar`` read too). Its module imports nothing heavy."""
    from ..online.sidecar.config import SidecarConfig
    return SidecarConfig.default(name, ring=True)


def sidecar_command(
        ring: str = typer.Option(..., "--ring", help="Shared-memory ring name (created if "
                                 "missing; DataLoader workers write into it)."),
        tables: Path = typer.Option(..., "--tables", help="Table TOML file."),
        topology: str = typer.Option(..., "--topology", help="Topology TOML file or preset."),
        out: Path = typer.Option(..., "--out", help="Directory for plans, deltas, counters and "
                                 "checkpoints."),
        batch_size: int = typer.Option(512, help="Samples per GPU per iteration (B)."),
        ring_dir: Optional[Path] = typer.Option(None, help="Directory of the ring file "
                                                "(default /dev/shm)."),
        slots: int = typer.Option(8, help="Producer slots when creating the ring (>= number of "
                                  "writer processes)."),
        capacity_mb: float = typer.Option(64.0, help="Ring capacity when creating it (MiB, "
                                          "shared by the slots)."),
        checksum: bool = typer.Option(False, help="CRC-32 on every ring record."),
        check_every: float = typer.Option(64.0, help="Batches (or seconds, --unit seconds) "
                                          "between re-sharder checks."),
        unit: str = typer.Option("batches", callback=choice(("batches", "seconds"), "--unit"),
                                 help="batches | seconds"),
        half_life: Optional[float] = typer.Option(_default("half_life"),
                                                  help="Decayed statistics with this "
                                                  "half-life (--unit); default: the re-sharder's "
                                                  "sliding window of 8 checks."),
        top_k: int = typer.Option(4096, help="Rows per table summarized for the planner."),
        horizon: Optional[float] = typer.Option(None, help="Iterations over which a saving "
                                                "must beat the migration and pause (default: "
                                                "from the measured drift rate)."),
        pause: Optional[float] = typer.Option(None, help="Seconds a training job stalls per "
                                              "applied plan change, whatever it moves (default: "
                                              "the re-sharder's, docs/RESHARDER.md)."),
        memory_bytes: Optional[float] = typer.Option(None, help="Per-GPU memory budget (bytes; "
                                                     "default: each GPU's HBM less TorchRec's "
                                                     "15% reservation, as plan)."),
        dedup: Optional[bool] = typer.Option(None, "--dedup/--no-dedup", help=DEDUP_HELP),
        profile: str = typer.Option("torchrec", callback=choice(PROFILES, "--profile"),
                                    help=PROFILE_HELP),
        ids: Optional[str] = typer.Option(None, "--ids", callback=ids_option,
                                          help="How the ring's IDs become rows of the --tables: "
                                               "raw (as written), hash (ID mod the table's "
                                               "num_rows, for producers that write raw sparse or "
                                               "hashed IDs) or hash:ROWS."),
        checkpoint_every: float = typer.Option(_default("checkpoint_every_s"),
                                               help="Seconds between checkpoints (0: only "
                                               "at shutdown)."),
        queue_batches: int = typer.Option(_default("queue_batches"),
                                          help="In-process queue between the ring and the "
                                          "statistics (batches)."),
        resume: bool = typer.Option(True, help="Resume from the last good checkpoint in --out."),
        status_every: float = typer.Option(0.0, help="Print a status line every this many "
                                           "seconds (0: never)."),
        unlink: bool = typer.Option(False, help="At shutdown, drain the ring and remove it."),
        cpu_budget: float = typer.Option(_default("cpu_budget"),
                                         help="Cores the ingestion may use: above it the "
                                         "sidecar samples one ID in k, k chosen from the offered "
                                         "rate (0: never sample; docs/SIDECAR.md)."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress to stderr.")):
    """Consume a shared-memory ring of batches: statistics, re-sharding, published plans and
    deltas, checkpoints; clean shutdown (final checkpoint) on SIGTERM/SIGINT. Prints JSON lines
    (events resume, ready, status, stopped) on stdout (docs/SIDECAR.md)."""
    import logging
    import warnings

    from ..online.resharder import ReshardConfig
    from ..online.sidecar import SidecarConfig, SidecarWarning, run_ring
    from ..placement.cost import CostModel
    from ..placement.planner import MemoryPolicy

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
                            stream=sys.stderr)
    reshard = ReshardConfig(check_every=check_every, unit=unit, horizon_iterations=horizon,
                            top_k=top_k, **({} if pause is None else {"pause_s": pause}))
    cfg = SidecarConfig.for_ring(reshard=reshard, half_life=half_life,
                                 checkpoint_every_s=checkpoint_every,   # 0: only at shutdown
                                 queue_batches=queue_batches, cpu_budget=cpu_budget or None)
    warnings.simplefilter("default", SidecarWarning)
    with writing(out):   # a refused --out is one error line, before the ring is created
        return run_ring(ring, tables, topology, out, batch_size=batch_size, config=cfg,
                        memory=MemoryPolicy(bytes_per_gpu=memory_bytes),
                        model=CostModel(dedup=default_dedup(profile) if dedup is None
                                         else dedup, profile=profile), resume=resume,
                        ring_dir=ring_dir, slots=slots,
                        capacity_bytes=int(capacity_mb * (1 << 20)), checksum=checksum, ids=ids,
                        status_every_s=status_every, unlink=unlink)
