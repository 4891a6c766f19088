"""The sidecar attached to a PyTorch DataLoader, in the training process.

The dataset yields one sample as ``{feature: row ID}``; the default collate function stacks a batch
into ``{feature: LongTensor[batch]}``, which the sidecar converts (one ID per sample per feature,
zero-copy through DLPack). ``submit`` never blocks the loop: a full queue drops and counts. The
loader runs ``--workers`` worker processes (2 by default); each yields its own share of the
samples (``get_worker_info``), and the sidecar sees the collated batches in the training process.

    python examples/torch_dataloader.py --out /tmp/sidecar-dl --steps 200 --workers 2
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.sidecar import Sidecar
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology

TABLES = [EmbeddingTable("user", 100_000, 64), EmbeddingTable("item", 50_000, 64)]


class ClickLog(IterableDataset):
    """Synthetic samples with Zipf-skewed row IDs (hot users and items). With several loader
    workers, worker ``w`` of ``n`` yields samples ``w, w + n, ...`` (each sample once)."""

    def __init__(self, samples: int, seed: int = 0):
        self.samples, self.seed = samples, seed

    def __iter__(self):
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(first, self.samples, step):
            rng = np.random.default_rng([self.seed, i])
            yield {t.name: int(min(rng.zipf(1.2), t.num_rows) - 1) for t in TABLES}


def train_step(batch: dict[str, torch.Tensor]) -> None:
    """Stands for the model's forward and backward pass."""
    for ids in batch.values():
        ids.sum()


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="sidecar output directory")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    args = ap.parse_args(argv)

    loader = DataLoader(ClickLog(args.steps * args.batch_size), batch_size=args.batch_size,
                        num_workers=args.workers)
    with Sidecar(TABLES, Topology.uniform(1, 2), batch_size=args.batch_size, out_dir=args.out,
                 reshard=ReshardConfig(check_every=50, top_k=1024), resume=True) as sidecar:
        for batch in sidecar.attach(loader):   # yields the loader's batches, submits each
            train_step(batch)
    stats = sidecar.stats()
    print(stats)
    return stats


if __name__ == "__main__":
    main()
