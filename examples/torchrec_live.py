"""The whole hand-off in a 4-rank gloo world on CPU: loader -> re-sharder -> delta -> applied in the
running DMP, on MovieLens ratings in time order (their hot set drifts strongly).

Each rating is a sample: the rated movie (pooled table ``target``) and the user's previous
``HISTORY`` movies (sequence table ``history``). The first fifth of the ratings plans a FlexShard
placement (2 nodes x 2 GPUs), exported live (``hot_capacity``: room for four times the plan's hot
rows). Four processes train on the rest, ``--batch`` ratings per rank and step, through
the drop-in modules (SGD). Rank 0 feeds each global batch to a ``Resharder`` (the sidecar's
planning step); every ``--every`` steps it offers the re-sharder's latest plan as a live delta
(``live_delta``: the hot-tier moves), ``broadcast_delta`` hands it to every rank and each applies it
with ``apply_delta`` at that step. Rank 0 prints what moved (or why it was refused) and the share of
lookups served by the hot slots over the steps since the previous delta.

    python examples/torchrec_live.py --out /tmp/live --steps 60
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
from torchrec import KeyedJaggedTensor

from flexshard_stream.bridge.export import export_torchrec
from flexshard_stream.bridge.live import apply_delta, broadcast_delta, live_delta
from flexshard_stream.bridge.module import (
    ExportedEmbeddingBagCollection,
    ExportedEmbeddingCollection,
    build_dmp,
)
from flexshard_stream.errors import FlexShardError
from flexshard_stream.online.resharder import ReshardConfig, Resharder
from flexshard_stream.placement.planner import plan_flexshard
from flexshard_stream.plans.plan import Plan
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources.datasets import movielens_ratings
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.stream import StreamStats

NODES, GPUS = 2, 2
WORLD = NODES * GPUS
DIM = 32
LR = 0.05
HISTORY = 20
#: What the re-sharder charges per applied delta (seconds). Its model prices this small table on
#: the preset's GPUs, where a change saves microseconds per iteration, so against the default
#: pause (250 ms, a rebuild's order) or a CPU apply's (about 20 ms, bench/live_reshard.py) it
#: would never move here; a pause of a GPU-sized apply lets the hand-off show.
PAUSE_S = 1e-4


# ----------------------------------------------------------------------------- data
class Ratings:
    """Every rating in time order: the movie's row (IDs mapped to dense rows) and, per rating,
    where the user's previous ``HISTORY`` movies sit in ``by_user`` (the movies user by user)."""

    def __init__(self):
        df = movielens_ratings()
        self.movies = np.unique(df.get_column("movie").to_numpy(),
                                return_inverse=True)[1].astype(np.int64)
        users = df.get_column("user").to_numpy()
        order = np.lexsort((np.arange(users.size), users))     # user by user, in time order
        self.by_user = self.movies[order]
        first = np.r_[0, np.flatnonzero(np.diff(users[order])) + 1]
        run = np.repeat(first, np.diff(np.r_[first, users.size]))
        self.pos, self.run = np.empty_like(order), np.empty_like(order)
        self.pos[order], self.run[order] = np.arange(users.size), run
        rows = int(self.movies.max()) + 1
        self.tables = [EmbeddingTable("target", rows, DIM, kind="pooled"),
                       EmbeddingTable("history", rows, DIM, kind="sequence")]

    def batch(self, start: int, n: int) -> Batch:
        """Ratings ``[start, start + n)``: keys ``target`` (one ID each), ``history``."""
        idx = range(start, start + n)
        hist = [self.by_user[max(self.run[i], self.pos[i] - HISTORY):self.pos[i]] for i in idx]
        lens = np.r_[np.ones(n, np.int64), [h.size for h in hist]]
        return Batch(["target", "history"], np.concatenate([self.movies[start:start + n]] + hist),
                     lens.astype(np.int64))


def rank_kjts(batch: Batch, rank: int, per_rank: int) -> tuple[KeyedJaggedTensor, ...]:
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    out = []
    for k in batch.keys:
        lengths = batch.feature_lengths(k)
        offs = np.r_[0, np.cumsum(lengths)]
        out.append(KeyedJaggedTensor(
            keys=[k], values=torch.from_numpy(batch.feature_values(k)[offs[lo]:offs[hi]]),
            lengths=torch.from_numpy(lengths[lo:hi])))
    return tuple(out)


class Model(nn.Module):
    """The pooled target and the summed history into a linear head."""

    def __init__(self, sparse: nn.Module, seq: nn.Module):
        super().__init__()
        self.sparse, self.seq = sparse, seq
        self.head = nn.Linear(2 * DIM, 1)

    def forward(self, target, history) -> torch.Tensor:
        jt = self.seq(history)["history"]
        n = jt.lengths().numel()
        summed = torch.zeros(n, DIM).index_add(
            0, torch.repeat_interleave(torch.arange(n), jt.lengths()), jt.values())
        return self.head(torch.cat([self.sparse(target).values(), summed], 1)).squeeze(1)


# ----------------------------------------------------------------------------- one rank
def rank_main(rank: int, work: str, port: int, steps: int, per_rank: int, every: int,
              start: int) -> None:
    import warnings

    from torchrec.optim.optimizers import in_backward_optimizer_filter

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank % GPUS))
    data = Ratings()
    export = Path(work, "export")
    dmp = build_dmp(Model(ExportedEmbeddingBagCollection(export),
                          ExportedEmbeddingCollection(export)),
                    device="cpu", optimizer="sgd", learning_rate=LR)
    dense = torch.optim.SGD([p for _, p in in_backward_optimizer_filter(dmp.named_parameters())],
                            lr=LR)
    plan = Plan.load(Path(work, "plan")) if rank == 0 else None
    resharder = Resharder(data.tables, plan.topology, per_rank, plan=plan,
                          config=ReshardConfig(check_every=every, pause_s=PAUSE_S)) \
        if rank == 0 else None
    hits, lookups, log = 0, 0, []
    for step in range(steps):
        batch = data.batch(start + step * WORLD * per_rank, WORLD * per_rank)
        if rank == 0:
            decision = resharder.update(batch)             # the sidecar's statistics and checks
            if decision is not None:
                log.append({"step": step, "decision": decision.action,
                            "reason": decision.reason})
        delta = None
        if step and step % every == 0:                     # the step the loop chooses
            delta = broadcast_delta(live_delta(plan, resharder.plan) if rank == 0 else None)
        if delta is not None and delta:
            try:
                report = apply_delta(dmp, delta, optimizer=dense)
                plan = delta.apply(plan) if rank == 0 else None
                log.append({"step": step, "version": report.version, "tables": report.tables,
                            "ms": round(report.seconds * 1e3, 1),
                            "hot_share_before": hits / max(lookups, 1)})
            except FlexShardError as e:
                log.append({"step": step, "refused": str(e),
                            "hot_share_before": hits / max(lookups, 1)})
            hits, lookups = 0, 0
        target, history = rank_kjts(batch, rank, per_rank)
        split = (dmp.module.sparse.remap_features(target),      # as a loader worker would
                 dmp.module.seq.remap_features(history))
        for part in split:
            hits += sum(int(m.sum()) for m in part.is_hot.values())
            lookups += sum(int(m.numel()) for m in part.is_hot.values())
        y = torch.from_numpy((np.random.default_rng([step, rank]).random(per_rank) < 0.5)
                             .astype(np.float32))
        loss = nn.functional.binary_cross_entropy_with_logits(dmp(*split), y)
        loss.backward()
        dense.step()
        dense.zero_grad()
    if rank == 0:
        log.append({"step": steps, "hot_share_before": hits / max(lookups, 1)})
        Path(work, "log.json").write_text(json.dumps(log))
    torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------- the run
def export_first_fifth(out: Path, per_rank: int) -> int:
    """Statistics of the first fifth of the ratings -> plan -> live export; where training
    starts (the first rating after it)."""
    data = Ratings()
    start = data.movies.size // 5
    stats = StreamStats(auto_tables=True)
    for lo in range(0, start, 4096):
        stats.update(data.batch(lo, min(4096, start - lo)))
    plan = plan_flexshard(data.tables, Topology.uniform(NODES, GPUS), stats.summary(k=512),
                          per_rank).plan
    plan.save(out / "plan")
    hot = {n: int(tp.global_ids.size + tp.node_ids.size) for n, tp in plan.tables.items()}
    export_torchrec(plan, out / "export",
                    hot_capacity={n: max(16, 4 * k) for n, k in hot.items()
                                  if not plan.tables[n].replicated})
    return start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="work directory (plan, export)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=256, help="ratings per rank and step")
    ap.add_argument("--every", type=int, default=15, help="steps between offered deltas")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = export_first_fifth(args.out, args.batch)
    mp.start_processes(rank_main, args=(str(args.out), _free_port(), args.steps, args.batch,
                                        args.every, start), nprocs=WORLD, start_method="spawn")
    log = json.loads((args.out / "log.json").read_text())
    for e in log:
        share = f"hot share {e.get('hot_share_before', 0.0):.1%} over the steps before"
        if "decision" in e:
            print(f"step {e['step']}: re-sharder {e['decision']}: {e['reason'][:150]}")
        elif "tables" in e:
            moved = ", ".join(f"{t}: +{v['promoted']} -{v['demoted']}"
                              for t, v in e["tables"].items())
            print(f"step {e['step']}: applied version {e['version']} ({moved}; "
                  f"{e['ms']} ms); {share}")
        elif "refused" in e:
            print(f"step {e['step']}: refused ({e['refused'][:120]}); {share}")
        else:
            print(f"end: {share}")
    return log


if __name__ == "__main__":
    main()
