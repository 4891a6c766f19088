"""The sidecar on a loader of TorchRec KeyedJaggedTensors (multi-hot features).

The collate function builds one ``KeyedJaggedTensor`` per batch (key-major lengths and values,
TorchRec's layout) in the loader's ``--workers`` worker processes (2 by default); the sidecar
reads it in the training process through ``Batch.from_kjt`` (DLPack, zero-copy for int64 CPU
tensors: the Batch views the KJT's shared-memory tensors). Submit on the CPU copy, before
``kjt.to(device)``.

    python examples/torchrec_kjt.py --out /tmp/sidecar-kjt --steps 200 --workers 2
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.sidecar import Sidecar
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology

TABLES = [EmbeddingTable("history", 200_000, 64), EmbeddingTable("item", 50_000, 64)]
KEYS = [t.name for t in TABLES]


class Sessions(Dataset):
    """Sample i: a few history IDs and one item ID, Zipf-skewed."""

    def __init__(self, samples: int, seed: int = 0):
        self.samples, self.seed = samples, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        rng = np.random.default_rng([self.seed, i])
        n = int(rng.integers(1, 8))
        hist = np.minimum(rng.zipf(1.1, n), TABLES[0].num_rows) - 1
        item = min(int(rng.zipf(1.3)), TABLES[1].num_rows) - 1
        return {"history": hist.tolist(), "item": [item]}


def collate_kjt(samples: list[dict[str, list[int]]]) -> KeyedJaggedTensor:
    lengths = [len(s[k]) for k in KEYS for s in samples]          # key-major
    values = [v for k in KEYS for s in samples for v in s[k]]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=KEYS, values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64))


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="sidecar output directory")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    args = ap.parse_args(argv)

    loader = DataLoader(Sessions(args.steps * args.batch_size), batch_size=args.batch_size,
                        collate_fn=collate_kjt, num_workers=args.workers)
    with Sidecar(TABLES, Topology.uniform(1, 2), batch_size=args.batch_size, out_dir=args.out,
                 reshard=ReshardConfig(check_every=50, top_k=1024), resume=True) as sidecar:
        for kjt in sidecar.attach(loader):
            kjt = kjt.to("cuda") if torch.cuda.is_available() else kjt
            # ... model(kjt), loss.backward(), optimizer.step()
    stats = sidecar.stats()
    print(stats)
    return stats


if __name__ == "__main__":
    main()
