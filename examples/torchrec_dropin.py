"""Training with an exported FlexShard plan in a 4-rank gloo world on CPU, through the drop-in
modules: the model changes only where its ``EmbeddingBagCollection`` / ``EmbeddingCollection``
are built.

Statistics of a skewed synthetic stream -> FlexShard plan (2 nodes x 2 GPUs) -> export -> 4
processes (``torch.multiprocessing``), each building the model with
``ExportedEmbeddingBagCollection`` / ``ExportedEmbeddingCollection`` and sharding it with
``build_dmp`` (process group from the environment), then training ``--steps`` steps of SGD on raw
IDs (``ids="hash"``: taken modulo the tables' rows inside the module). The same steps run
unsharded in this process on the original TorchRec modules with the same initial weights; the
losses of both are printed side by side (they agree to fp32 rounding).

    python examples/torchrec_dropin.py --out /tmp/dropin --steps 5
"""
from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor

from flexshard_stream.bridge.export import export_torchrec
from flexshard_stream.bridge.module import (
    ExportedEmbeddingBagCollection,
    ExportedEmbeddingCollection,
    build_dmp,
    load_table_weights,
)
from flexshard_stream.placement.planner import plan_flexshard
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.stream import StreamStats

NODES, GPUS = 2, 2
WORLD = NODES * GPUS
DIM = 16
TABLES = [EmbeddingTable("user", 4_000, DIM, kind="pooled"),
          EmbeddingTable("item", 2_000, DIM, kind="pooled"),
          EmbeddingTable("history", 2_000, DIM, kind="sequence")]
POOLED = [t.feature for t in TABLES if t.kind == "pooled"]
SEQUENCE = [t.feature for t in TABLES if t.kind == "sequence"]
RAW_ID_SPACE = 10**9          # raw IDs; the modules take them modulo each table's rows


# ----------------------------------------------------------------------------- data
def raw_batch(step: int, samples: int, seed: int = 0) -> Batch:
    """Global batch ``step``: one user and one item ID per sample, 1-7 history IDs, Zipf-skewed
    raw IDs (a hot raw ID maps to a hot row)."""
    rng = np.random.default_rng([seed, step])
    keys, values, lengths = [], [], []
    for t in TABLES:
        n = rng.integers(1, 8, samples) if t.kind == "sequence" else np.ones(samples, np.int64)
        ranks = np.minimum(rng.zipf(1.2, int(n.sum())), t.num_rows) - 1
        keys.append(t.feature)
        values.append(ranks * 7919 % t.num_rows + t.num_rows * rng.integers(0, RAW_ID_SPACE
                                                                            // t.num_rows,
                                                                            ranks.size))
        lengths.append(n)
    return Batch(keys, np.concatenate(values).astype(np.int64),
                 np.concatenate(lengths).astype(np.int64))


def labels_of(step: int, samples: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng([99, step]).integers(0, 2, samples)
                            .astype(np.float32))


def kjt(batch: Batch, keys: list[str], lo: int, hi: int, modulo: bool = False
        ) -> KeyedJaggedTensor:
    """The KJT of samples ``[lo, hi)`` of ``keys`` (IDs taken modulo the rows with ``modulo``:
    what a user writes by hand for the original modules)."""
    rows = {t.feature: t.num_rows for t in TABLES}
    vals, lens = [], []
    for k in keys:
        offs = np.concatenate([[0], np.cumsum(batch.feature_lengths(k))])
        v = batch.feature_values(k)[offs[lo]:offs[hi]]
        vals.append(v % rows[k] if modulo else v)
        lens.append(batch.feature_lengths(k)[lo:hi])
    return KeyedJaggedTensor(keys=keys, values=torch.from_numpy(np.concatenate(vals)),
                             lengths=torch.from_numpy(np.concatenate(lens)))


# ----------------------------------------------------------------------------- the model
class Model(nn.Module):
    """Pooled user and item embeddings, the summed history, a linear head: a logit per sample.
    ``sparse`` and ``seq`` are whatever module the caller gives (the original TorchRec ones or
    the drop-ins); the rest of the model does not know which."""

    def __init__(self, sparse: nn.Module, seq: nn.Module):
        super().__init__()
        self.sparse, self.seq = sparse, seq
        self.head = nn.Linear(DIM * (len(POOLED) + len(SEQUENCE)), 1)
        rng = np.random.default_rng(5)
        with torch.no_grad():
            self.head.weight.copy_(torch.from_numpy(rng.normal(0, 0.3, self.head.weight.shape)
                                                    .astype(np.float32)))
            self.head.bias.zero_()

    def forward(self, pooled: KeyedJaggedTensor, sequence: KeyedJaggedTensor) -> torch.Tensor:
        kt = self.sparse(pooled)                          # KeyedTensor [B, D * features]
        parts = [kt.values()]
        for f, jt in self.seq(sequence).items():          # JaggedTensor per feature
            sample = torch.repeat_interleave(torch.arange(jt.lengths().numel()), jt.lengths())
            parts.append(torch.zeros(jt.lengths().numel(), DIM).index_add(0, sample,
                                                                          jt.values()))
        return self.head(torch.cat(parts, dim=1)).squeeze(1)


def initial_weights(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.uniform(-0.1, 0.1, (t.num_rows, t.dim)).astype(np.float32)
            for t in TABLES}


def bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(logits, labels)


# ----------------------------------------------------------------------------- one rank
def rank_main(rank: int, export_dir: str, port: int, steps: int, batch_size: int, lr: float,
              out_dir: str) -> None:
    """One trainer: the drop-in modules, ``build_dmp``, ``steps`` steps of SGD (fused on the
    sharded tables, ``torch.optim.SGD`` on the rest); writes its losses."""
    import warnings

    from torchrec.optim.optimizers import in_backward_optimizer_filter

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank % GPUS))
    model = Model(ExportedEmbeddingBagCollection(export_dir, ids="hash"),   # the two lines
                  ExportedEmbeddingCollection(export_dir, ids="hash"))      # that change
    dmp = build_dmp(model, device="cpu", optimizer="sgd", learning_rate=lr)
    for m in (dmp.module.sparse, dmp.module.seq):      # the same start as the reference
        m.load_original_weights(initial_weights())
    dense = torch.optim.SGD([p for _, p in in_backward_optimizer_filter(dmp.named_parameters())],
                            lr=lr)
    lo, hi = rank * batch_size, (rank + 1) * batch_size
    losses = []
    for step in range(steps):
        batch = raw_batch(step, WORLD * batch_size)
        loss = bce(dmp(kjt(batch, POOLED, lo, hi), kjt(batch, SEQUENCE, lo, hi)),
                   labels_of(step, WORLD * batch_size)[lo:hi])
        loss.backward()                 # the fused optimizer updates the sharded tables here
        dense.step()
        dense.zero_grad()
        losses.append(loss.item())
    Path(out_dir, f"losses{rank}.json").write_text(json.dumps(losses))
    torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------- the reference
def reference_losses(export_dir: Path, steps: int, batch_size: int,
                     lr: float) -> list[list[float]]:
    """The same steps on the original (unsharded) modules: the loss is the mean of the ranks'
    losses, as the sharded gradients are averaged over the ranks; per step, every rank's loss."""
    ebc = EmbeddingBagCollection(ExportedEmbeddingBagCollection(export_dir).original_configs())
    ec = EmbeddingCollection(ExportedEmbeddingCollection(export_dir).original_configs())
    model = Model(ebc, ec)
    load_table_weights(model, initial_weights())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for step in range(steps):
        batch, labels = raw_batch(step, WORLD * batch_size), labels_of(step, WORLD * batch_size)
        per_rank = []
        for r in range(WORLD):
            lo, hi = r * batch_size, (r + 1) * batch_size
            per_rank.append(bce(model(kjt(batch, POOLED, lo, hi, modulo=True),
                                      kjt(batch, SEQUENCE, lo, hi, modulo=True)),
                                labels[lo:hi]))
        opt.zero_grad()
        (sum(per_rank) / WORLD).backward()
        opt.step()
        out.append([x.item() for x in per_rank])
    return out


# ----------------------------------------------------------------------------- plan and export
def export_plan(out: Path, batch_size: int) -> dict:
    """Statistics of 8 batches -> FlexShard plan -> export in ``out``; per table its hot rows."""
    stats = StreamStats(auto_tables=True)
    rows = {t.feature: t.num_rows for t in TABLES}
    for step in range(8):
        b = raw_batch(1000 + step, WORLD * batch_size)
        offs = b.key_offsets()
        mod = np.concatenate([np.full(offs[i + 1] - offs[i], rows[k], np.int64)
                              for i, k in enumerate(b.keys)])
        stats.update(Batch(b.keys, b.values % mod, b.lengths))
    plan = plan_flexshard(TABLES, Topology.uniform(NODES, GPUS), stats.summary(k=256),
                          batch_size).plan
    manifest = export_torchrec(plan, out)
    return {e["table"]: e["hot_rows"] for e in manifest["tables"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the export and the losses")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hot = export_plan(out / "export", args.batch_size)
    mp.start_processes(rank_main, args=(str(out / "export"), _free_port(), args.steps,
                                        args.batch_size, args.lr, str(out)),
                       nprocs=WORLD, start_method="spawn")
    sharded = [json.loads((out / f"losses{r}.json").read_text()) for r in range(WORLD)]
    ref = reference_losses(out / "export", args.steps, args.batch_size, args.lr)
    for step in range(args.steps):
        print(f"step {step}: loss " + " ".join(f"{sharded[r][step]:.6f}" for r in range(WORLD))
              + "   reference " + " ".join(f"{x:.6f}" for x in ref[step]))
    err = max(abs(sharded[r][s] - ref[s][r]) for s in range(args.steps) for r in range(WORLD))
    result = {"hot_rows": hot, "losses": [[sharded[r][s] for r in range(WORLD)]
                                          for s in range(args.steps)],
              "reference_losses": ref, "max_loss_diff": err}
    print(json.dumps({"hot_rows": hot, "max_loss_diff": err}))
    return result


if __name__ == "__main__":
    main()
