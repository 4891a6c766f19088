"""Out of process: DataLoader workers write batches into a shared-memory ring; the sidecar is a
separate process (``flexshard-stream sidecar``) that reads it. The training process does no
statistics work at all.

Each worker process claims its own ring slot on its first submit (the producer pickles to an
unclaimed one). The collate function runs in the worker, so the batch is submitted there, right
after it is built; ``submit`` never blocks (a full slot drops and counts, see ring.stats()).

    python examples/ring_workers.py --out /tmp/sidecar-ring --workers 2 --steps 200

starts the sidecar itself (``--no-spawn`` if one already runs with the same ``--ring``), trains,
then stops it with SIGTERM (a clean shutdown: final checkpoint; the sidecar it started drains and
removes the ring).
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from flexshard_stream.plans.tables import EmbeddingTable, save_tables
from flexshard_stream.sources.ring import Ring
from flexshard_stream.stats.batch import Batch

TABLES = [EmbeddingTable("user", 100_000, 64), EmbeddingTable("item", 50_000, 64)]
KEYS = [t.name for t in TABLES]


class Clicks(Dataset):
    def __init__(self, samples: int):
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, int]:
        rng = np.random.default_rng(i)
        return {t.name: int(min(rng.zipf(1.2), t.num_rows) - 1) for t in TABLES}


class SubmittingCollate:
    """Default collate, then a copy of the IDs into the ring (runs in the worker process)."""

    def __init__(self, producer):
        self.producer = producer  # picklable: each worker claims a slot on its first submit

    def __call__(self, samples):
        batch = torch.utils.data.default_collate(samples)   # {feature: LongTensor[B]}
        ids = torch.cat([batch[k] for k in KEYS])
        self.producer.submit(Batch.from_dlpack(KEYS, ids, torch.ones_like(ids)))
        return batch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ring", default="example-train")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--no-spawn", action="store_true", help="a sidecar already runs")
    args = ap.parse_args(argv)

    sidecar = None
    if not args.no_spawn:
        tables = Path(tempfile.mkdtemp()) / "tables.toml"
        save_tables(TABLES, tables)
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "flexshard_stream.cli", "sidecar", "--ring", args.ring,
             "--tables", str(tables), "--topology", "2x8", "--out", args.out,
             "--batch-size", str(args.batch_size), "--slots", str(max(8, args.workers)),
             "--unlink"],                             # it made the ring: remove it at the end
            stdout=subprocess.PIPE, text=True)
        for line in sidecar.stdout:                   # JSON lines: wait until it is ready
            if json.loads(line)["event"] == "ready":
                break
    done = {}
    try:
        ring = Ring.attach(args.ring)
        loader = DataLoader(Clicks(args.steps * args.batch_size), batch_size=args.batch_size,
                            num_workers=args.workers,
                            collate_fn=SubmittingCollate(ring.producer(lazy=True)))
        for batch in loader:
            pass  # ... the training step
        total = ring.stats().total
        print(f"ring: {total.batches_written} batches written, {total.batches_dropped} dropped")
        deadline = time.monotonic() + 60
        while ring.stats().total.lag_bytes and time.monotonic() < deadline:
            time.sleep(0.05)  # let the sidecar read what is left (else it waits for its next run)
        ring.close()
    finally:
        if sidecar is not None:
            sidecar.send_signal(signal.SIGTERM)           # clean shutdown, final checkpoint
            for line in sidecar.stdout:
                done = json.loads(line)
            sidecar.wait()
            print(done)
    return done


if __name__ == "__main__":
    main()
