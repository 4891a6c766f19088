"""The sidecar attached to a PyTorch DataLoader, in the training process.

The dataset yields one sample as ``{feature: row ID}``; the default collate function stacks a batch
into ``{feature: LongTensor[batch]}``, which the sidecar converts (one ID per sample per feature,
zero-copy through DLPack). ``submit`` never blocks the loop: a full queue drops and counts.

    python examples/torch_dataloader.py --out /tmp/sidecar-dl --steps 200
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.sidecar import Sidecar
from flexshard_stream.placement.tables import EmbeddingTable
from flexshard_stream.placement.topology import Topology

TABLES = [EmbeddingTable("user", 100_000, 64), EmbeddingTable("item", 50_000, 64)]


class ClickLog(IterableDataset):
    """Synthetic samples with Zipf-skewed row IDs (hot users and items)."""

    def __init__(self, samples: int, seed: int = 0):
        self.samples, self.seed = samples, seed

    def __iter__(self):
        rng = np.random.default_rng(self.seed)
        for _ in range(self.samples):
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
    args = ap.parse_args(argv)

    loader = DataLoader(ClickLog(args.steps * args.batch_size), batch_size=args.batch_size)
    with Sidecar(TABLES, Topology.uniform(1, 2), batch_size=args.batch_size, out_dir=args.out,
                 config=ReshardConfig(check_every=50, top_k=1024), resume=True) as sidecar:
        for batch in sidecar.attach(loader):   # yields the loader's batches, submits each
            train_step(batch)
    stats = sidecar.stats()
    print(stats)
    return stats


if __name__ == "__main__":
    main()
