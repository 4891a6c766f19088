"""The torch side of a cluster run: one rank, inside its network namespace, training exported plans
in a ``DistributedModelParallel`` and timing every step.

Started by :func:`flexshard_stream.cluster.run.run_on_cluster` as
``ip netns exec <ns> python -m flexshard_stream.cluster.rank JOB RANK``; imports torch and
torchrec. Per export: the export's model, ``ShardingPlan`` and ``KJTRemap``
(:mod:`flexshard_stream.bridge.loader`), TorchRec's fused exact SGD on the sharded tables (in the
backward pass) and ``torch.optim.SGD`` on the dense (data-parallel) ones. Each step starts at a
barrier and is timed in three phases (forward, backward, optimizer); every collective is timed
from issue to completion at the process group (:class:`TimingProcessGroup`) and the rank's HTB
class counters are read after the step and a barrier, outside the timed part.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.optimizers import in_backward_optimizer_filter

from ..bridge.export import load_torchrec_export, torchrec_sharding_plan
from ..bridge.jobs import upstream_gradient
from ..bridge.loader import KJTRemap, exported_embeddings
from ..bridge.world import (
    RECORDER,
    CountingProcessGroup,
    CpuEmbeddingBagCollectionSharder,
    kjt_from_batch,
)
from ..plans.tables import EmbeddingTable
from ..stats.batch import Batch, slice_batch
from .jobs import ClusterJob, CollectiveTiming, StepRecord
from .netem import CLASS_NAMES, parse_class_counters

__all__ = ["TimingProcessGroup", "BACKEND", "rank_main"]

#: Name under which the timing process group is registered with ``torch.distributed``.
BACKEND = "fs_timing"


class _Clock:
    """The collectives of the current step: (component, phase, issued, completed, bytes)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.entries: list[list[Any]] = []

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.entries = []


CLOCK = _Clock()


class TimingProcessGroup(CountingProcessGroup):
    """:class:`~flexshard_stream.bridge.world.CountingProcessGroup` (gloo) that also times each
    collective: issued when the call is made, completed when its future completes."""

    def _timed(self, work: Any, component: str, nbytes: int) -> Any:
        entry = [component, RECORDER.phase, time.perf_counter(), None, nbytes]
        CLOCK.entries.append(entry)

        def done(_fut: Any) -> None:
            entry[3] = time.perf_counter()
        work.get_future().add_done_callback(done)
        return work

    def _last(self) -> tuple[str, int]:
        r = RECORDER.records[-1]
        return r.component, r.input_bytes

    def all_to_all_single(self, out, inp, out_splits, in_splits, opts):
        work = super().all_to_all_single(out, inp, out_splits, in_splits, opts)
        return self._timed(work, *self._last())

    def reduce_scatter_single(self, out, inp, opts):
        work = super().reduce_scatter_single(out, inp, opts)
        return self._timed(work, *self._last())

    def all_gather_single(self, out, inp, opts):
        work = super().all_gather_single(out, inp, opts)
        return self._timed(work, *self._last())

    def allgather(self, out_lists, ins, opts):
        work = super().allgather(out_lists, ins, opts)
        return self._timed(work, *self._last())

    def allreduce(self, tensors, opts):
        work = super().allreduce(tensors, opts)
        return self._timed(work, *self._last())

    def broadcast(self, tensors, opts):
        work = super().broadcast(tensors, opts)
        return self._timed(work, *self._last())

    def barrier(self, opts):
        return self._timed(super().barrier(opts), "barrier", 0)


def _create_timing_pg(opts: Any, backend_options: Any) -> Any:
    inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return TimingProcessGroup(inner, opts.group_rank, opts.group_size)


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create_timing_pg, extended_api=True,
                                      devices=["cpu"])


# ----------------------------------------------------------------------------- counters
def _read_counters(job: ClusterJob, rank: int) -> tuple[dict[str, int], dict[str, int]]:
    """(bytes, packets) per class so far: sent by this rank's veth (``<class>``) and delivered
    to it by its switch port (``<class>_received``)."""
    out: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for ns, dev, suffix in ((None, job.interfaces[rank], ""),
                            (job.switch, job.ports[rank], "_received")):
        cmd = ["tc"] + (["-n", ns] if ns else []) + ["-s", "class", "show", "dev", dev]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        got = parse_class_counters(p.stdout)
        for c, n in CLASS_NAMES.items():
            out[0][n + suffix] = got.get(c, (0, 0))[0]
            out[1][n + suffix] = got.get(c, (0, 0))[1]
    return out


# ----------------------------------------------------------------------------- one export
def _sharders(lr: float) -> list[Any]:
    """TorchRec's sharders with fused exact SGD at ``lr`` (the pooled one offering row-wise and
    table-row-wise on CPU)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    fused = {"learning_rate": lr, "optimizer": EmbOptimType.EXACT_SGD}
    return [CpuEmbeddingBagCollectionSharder(fused_params=fused),
            EmbeddingCollectionSharder(fused_params=fused)]


class _Trainer:
    """One export in a ``DistributedModelParallel``, trained with a fixed-gradient loss."""

    def __init__(self, job: ClusterJob, export_dir: str, rank: int):
        ex = load_torchrec_export(export_dir)
        self.job, self.rank = job, rank
        self.source = [EmbeddingTable(**e["source_table"]) for e in ex.manifest["tables"]]
        model = exported_embeddings(export_dir, "cpu", False, dense_sequence_hot=True)
        plan = torchrec_sharding_plan(export_dir, device="cpu", dense_sequence_hot=True)
        self.remap = KJTRemap(export_dir)
        self.dmp = DistributedModelParallel(
            model, env=ShardingEnv.from_process_group(dist.group.WORLD),
            device=torch.device("cpu"), plan=plan, sharders=_sharders(job.learning_rate))
        dense = [p for _, p in in_backward_optimizer_filter(self.dmp.named_parameters())]
        self.opt = torch.optim.SGD(dense, lr=job.learning_rate) if dense else None
        self.grads: dict[tuple, torch.Tensor] = {}

    def _features(self, kind: str) -> list[str]:
        return [t.feature for t in self.source if t.kind == kind]

    def forward(self, batch: Batch, step: int) -> torch.Tensor:
        outputs: dict[str, torch.Tensor] = {}
        masks: dict[str, torch.Tensor] = {}
        kjts = []
        for kind in ("pooled", "sequence"):
            kjt = kjt_from_batch(batch, self._features(kind))
            if kjt is not None:
                kjt, m = self.remap.split(kjt)
                masks.update(m)
            kjts.append(kjt)
        outputs = self.remap.merge(dict(self.dmp(*kjts)), masks)
        return self._loss(outputs, step)

    def _loss(self, outputs: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        """``sum_f <out_f, g_f>`` with fixed upstream gradients (``bridge.jobs``)."""
        total = torch.zeros(())
        for i, f in enumerate(sorted(outputs)):
            key = (step % len(self.job.batches), i, tuple(outputs[f].shape))
            if key not in self.grads:
                self.grads[key] = torch.from_numpy(upstream_gradient(
                    self.job.seed, key[0], self.rank, i, key[2]))
            total = total + (outputs[f] * self.grads[key]).sum()
        return total

    def step(self, batch: Batch, step: int) -> tuple[dict[str, float], float]:
        """One training step after a barrier: (seconds per phase, CPU seconds)."""
        dist.barrier()
        RECORDER.records.clear()
        CLOCK.reset()
        c0, t0 = time.process_time(), time.perf_counter()
        RECORDER.at(step, "forward")
        loss = self.forward(batch, step)
        t1 = time.perf_counter()
        RECORDER.at(step, "backward")
        loss.backward()
        t2 = time.perf_counter()
        RECORDER.at(step, "optimizer")
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        RECORDER.at(None, "teardown")
        return ({"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2},
                time.process_time() - c0)


def _collectives(t0: float) -> list[CollectiveTiming]:
    """The step's collectives, times from the step's start ``t0`` (perf_counter seconds)."""
    out = []
    for comp, phase, s, e, b in CLOCK.entries:
        end = e if e is not None else time.perf_counter()
        out.append(CollectiveTiming(comp, phase, s - t0, end - t0, int(b)))
    return out


def _run_export(job: ClusterJob, export_dir: str, rank: int) -> list[StepRecord]:
    trainer = _Trainer(job, export_dir, rank)
    b = job.local_batch_size
    local = [slice_batch(x, rank * b, (rank + 1) * b) for x in job.batches]
    records = []
    wire0, pk0 = _read_counters(job, rank)
    for s in range(job.warmup + job.steps):
        seconds, cpu = trainer.step(local[s % len(local)], s)
        t0 = CLOCK.t0
        # the collectives' futures complete on gloo's threads: let the last callbacks land
        for _ in range(200):
            if all(e[3] is not None for e in CLOCK.entries):
                break
            time.sleep(0.001)
        colls = _collectives(t0)
        # a barrier before the counters: a rank's step can end while what it sent is still
        # queued; once every rank has entered the barrier after its step, all of the step's
        # data was delivered (gloo's pairs are in-order streams), so it counts in this step
        dist.barrier()
        wire, pk = _read_counters(job, rank)
        if s >= job.warmup:
            records.append(StepRecord(s - job.warmup, seconds, cpu,
                                      {k: wire[k] - wire0[k] for k in wire},
                                      {k: pk[k] - pk0[k] for k in pk}, colls))
        wire0, pk0 = wire, pk
    dist.barrier()
    return records


def rank_main(rank: int, job: ClusterJob) -> None:
    """Entry point of one rank: every export in turn, then its results file."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    os.environ.update(LOCAL_WORLD_SIZE=str(job.local_world_size),
                      LOCAL_RANK=str(rank % job.local_world_size), RANK=str(rank),
                      WORLD_SIZE=str(job.world_size), GLOO_SOCKET_IFNAME=job.interfaces[rank])
    _register()
    dist.init_process_group(BACKEND, init_method=f"file://{job.store_path}", rank=rank,
                            world_size=job.world_size, timeout=timedelta(seconds=job.timeout_s))
    try:
        results = [_run_export(job, d, rank) for d in job.exports]
        tmp = Path(job.result_path(rank) + ".tmp")
        tmp.write_bytes(pickle.dumps(results))
        tmp.replace(job.result_path(rank))
    finally:
        dist.destroy_process_group()


def _main(argv: Sequence[str]) -> None:
    job = pickle.loads(Path(argv[0]).read_bytes())
    np.seterr(all="ignore")
    rank_main(int(argv[1]), job)


if __name__ == "__main__":
    from flexshard_stream.cluster import rank as _self  # the importable copy

    _self._main(sys.argv[1:])
