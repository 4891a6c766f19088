"""The torch side of :mod:`flexshard_stream.bridge.runtime`: what runs inside each rank.

This module imports torch and torchrec at the top; only :mod:`torchrec_runtime` imports it, inside
its functions, so that the package imports without torch. It holds

- :class:`CountingProcessGroup`, a ``torch.distributed.ProcessGroup`` written in Python that wraps a
  real gloo (or torch's fake) process group and records every collective that reaches it, from
  TorchRec's Python code and from DDP's C++ reducer alike (backend name ``fs_counting``);
- the sharders of a run (:func:`cpu_sharders`: exact SGD at learning rate 1, the opened CPU
  sharder of :mod:`~flexshard_stream.bridge.module`, re-exported here);
- the model of a run: one ``EmbeddingBagCollection`` (pooled tables) and one
  ``EmbeddingCollection`` (sequence tables) under one module, built from
  :class:`~flexshard_stream.plans.tables.EmbeddingTable` rows, or an export's drop-in modules
  (:class:`ExportedModel`, sharded by :func:`~flexshard_stream.bridge.module.build_dmp`: what a
  user of the export runs);
- :func:`rank_main`, the entry point of one spawned rank.
"""

from __future__ import annotations

import inspect
import os
import pickle
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagConfig, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv, ShardingPlan

from ..plans.tables import EmbeddingTable
from ..stats.batch import Batch, slice_batch
from .jobs import (
    CaseJob,
    CollectiveRecord,
    RankJob,
    RankResult,
    RunError,
    upstream_gradient,
)
from .loader import EmbeddingModules
from .module import (
    CpuEmbeddingBagCollectionSharder,
    build_dmp,
    embedding_sharders,
    exported_collections,
    load_table_weights,
    local_shards,
)
from .sharding import POOLED_MODULE, SEQUENCE_MODULE, TableSharding

__all__ = ["CountingProcessGroup", "BACKEND", "FAKE_WORLD", "register_backend",
           "CpuEmbeddingBagCollectionSharder", "cpu_sharders", "FUSED_PARAMS",
           "build_collections", "parameter_sharding", "module_sharding_plan", "kjt_from_batch",
           "load_weights", "rank_main", "spawn_ranks", "run_reference", "ExportedModel"]

#: Name under which the counting process group is registered with ``torch.distributed``.
BACKEND = "fs_counting"
#: Module paths of the model's collections (``sharding.MODULE_PATHS``).
POOLED_PATH, SEQUENCE_PATH = POOLED_MODULE, SEQUENCE_MODULE

# TorchRec functions (``co_qualname``) whose collectives make up each component.
_COMPONENT_OF = {
    "SplitsAllToAllAwaitable.__init__": "input_splits",
    "All2All_Pooled_Req.forward": "pooled_all_to_all",
    "All2All_Pooled_Wait.backward": "pooled_all_to_all",
    "Variable_Batch_All2All_Pooled_Req.forward": "pooled_all_to_all",
    "Variable_Batch_All2All_Pooled_Wait.backward": "pooled_all_to_all",
    "All2All_Seq_Req.forward": "sequence_all_to_all",
    "All2All_Seq_Req_Wait.backward": "sequence_all_to_all",
    "ReduceScatterBase_Req.forward": "pooled_reduce_scatter",
    "ReduceScatterBase_Wait.backward": "pooled_reduce_scatter",
    "ReduceScatterV_Req.forward": "pooled_reduce_scatter",
    "ReduceScatterV_Wait.backward": "pooled_reduce_scatter",
    "ReduceScatter_Req.forward": "pooled_reduce_scatter",
    "ReduceScatter_Wait.backward": "pooled_reduce_scatter",
    "AllGatherBase_Req.forward": "pooled_all_gather",
    "AllGatherBase_Wait.backward": "pooled_all_gather",
}


class _Recorder:
    """The records of this process and the (iteration, phase) they are filed under."""

    def __init__(self) -> None:
        self.records: list[CollectiveRecord] = []
        self.iteration: int | None = None
        self.phase = "setup"

    def at(self, iteration: int | None, phase: str) -> None:
        self.iteration, self.phase = iteration, phase


RECORDER = _Recorder()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _component(op: str) -> str:
    """The TorchRec dist a collective belongs to, read from the Python stack of the caller.

    The KJT tensors all-to-all is named by its label (``input_lengths``, ``input_values``,
    ``input_weights``, ``input_strides``); an all-reduce with no TorchRec frame on the stack is
    DDP's gradient all-reduce of the data-parallel tables (DDP's reducer calls the process group
    from C++)."""
    frame = inspect.currentframe()
    first = ""
    while frame is not None:
        code = frame.f_code
        if f"torchrec{os.sep}" in code.co_filename:
            if code.co_qualname == "KJTAllToAllTensorsAwaitable.__init__":
                return f"input_{frame.f_locals.get('label', 'tensor')}"
            if code.co_qualname in _COMPONENT_OF:
                return _COMPONENT_OF[code.co_qualname]
            first = first or code.co_qualname
        frame = frame.f_back
    if first:
        return first
    return "data_parallel_all_reduce" if op == "all_reduce" else op


def _split_bytes(t: torch.Tensor, splits: Sequence[int], n: int) -> tuple[int, ...]:
    """Bytes of ``t`` per destination when dim 0 is cut into ``splits`` (equal if empty)."""
    row = _nbytes(t) // t.size(0) if t.dim() and t.size(0) else 0
    if not splits:
        return (row * (t.size(0) // n if t.dim() else 0),) * n
    return tuple(row * int(s) for s in splits)


def _mirror_all_to_all(out: torch.Tensor, inp: torch.Tensor, in_splits: Sequence[int], me: int,
                       n: int) -> None:
    rows = list(in_splits) if in_splits else [inp.size(0) // n] * n
    mine = inp.narrow(0, sum(rows[:me]), rows[me])
    out.copy_(torch.cat([mine] * n).view_as(out))


def _done_with(value: Any) -> Any:
    """A completed ``Work`` whose future holds ``value``."""
    from torch._C._distributed_c10d import _create_work_from_future

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return _create_work_from_future(fut)


class CountingProcessGroup(dist.ProcessGroup):
    """A process group that records each collective, then runs it on the wrapped group.

    With ``fake=True`` the wrapped group is torch's ``FakeProcessGroup`` (no communication, one
    process per simulated rank) and the world simulated is one in which every rank holds this
    rank's local batch. There, what any rank sends this one in the KJT all-to-all is what this
    rank sends itself, so the input dist is mirrored exactly (this rank's own chunk from every
    peer) and every size TorchRec derives from it is right; embeddings held by other ranks are
    not known, so the other collectives get zeros (all-to-all), ``n`` copies of this rank's part
    (reduce-scatter, all-reduce) or the repeated input (all-gather). Byte counts are exact for
    that world; outputs and gradients are not.

    Parameters
    ----------
    inner : torch.distributed.Backend
        The group doing the work (``ProcessGroupGloo`` or ``FakeProcessGroup``).
    rank, size : int
        This rank in the group and the group size.
    fake : bool
        Mirror this rank's inputs instead of communicating.
    """

    def __init__(self, inner: Any, rank: int, size: int, fake: bool = False):
        super().__init__(rank, size)
        self._inner = inner
        self._fake = fake
        self._ranks: tuple[int, ...] | None = None

    def getBackendName(self) -> str:  # noqa: N802  (torch's name)
        return BACKEND

    @property
    def group_name(self) -> str:
        return dist.distributed_c10d._world.pg_names[self]

    def _record(self, op: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                send: tuple[int, ...] = (), recv: tuple[int, ...] = ()) -> str:
        """File one collective with :data:`RECORDER`; returns its component."""
        if self._ranks is None:
            self._ranks = tuple(dist.get_process_group_ranks(self))
        t = inputs[0] if inputs else outputs[0]
        component = _component(op)
        RECORDER.records.append(CollectiveRecord(
            rank=dist.get_rank(), group=self._ranks, op=op, component=component,
            phase=RECORDER.phase, iteration=RECORDER.iteration, dtype=str(t.dtype).split(".")[-1],
            elem_bytes=t.element_size(), input_bytes=sum(_nbytes(x) for x in inputs),
            output_bytes=sum(_nbytes(x) for x in outputs), send_bytes=send, recv_bytes=recv))
        return component

    def _done(self) -> Any:
        return self._inner.barrier(dist.BarrierOptions())

    def all_to_all_single(self, out, inp, out_splits, in_splits, opts):
        n = self.size()
        component = self._record("all_to_all", [inp], [out], _split_bytes(inp, in_splits, n),
                                 _split_bytes(out, out_splits, n))
        if self._fake:
            if component.startswith("input_"):
                _mirror_all_to_all(out, inp, in_splits, self.rank(), n)
            else:
                out.zero_()
            return self._done()
        return self._inner.alltoall_base(out, inp, out_splits, in_splits, opts)

    def reduce_scatter_single(self, out, inp, opts):
        n = self.size()
        self._record("reduce_scatter", [inp], [out], (_nbytes(inp) // n,) * n,
                     (_nbytes(out),) * n)
        if self._fake:
            out.copy_(inp.reshape(n, -1)[self.rank()].view_as(out) * n)
            return self._done()
        return self._inner._reduce_scatter_base(out, inp, opts)

    def all_gather_single(self, out, inp, opts):
        n = self.size()
        self._record("all_gather", [inp], [out], (_nbytes(inp),) * n, (_nbytes(out) // n,) * n)
        if self._fake:
            out.copy_(torch.cat([inp.reshape(-1)] * n).view_as(out))
            return self._done()
        return self._inner._allgather_base(out, inp, opts)

    def allgather(self, out_lists, ins, opts):
        outs = list(out_lists[0])
        self._record("all_gather", ins, outs, (_nbytes(ins[0]),) * len(outs),
                     tuple(_nbytes(x) for x in outs))
        if self._fake:
            for o in outs:
                o.copy_(ins[0])
            return self._done()
        return self._inner.allgather(out_lists, ins, opts)

    def allreduce(self, tensors, opts):
        self._record("all_reduce", tensors, tensors)
        if not self._fake:
            return self._inner.allreduce(tensors, opts)
        if opts.reduceOp == dist.ReduceOp.SUM:
            for t in tensors:
                t.mul_(self.size())
        return _done_with(list(tensors))  # DDP's reducer reads the result from the future

    def broadcast(self, tensors, opts):
        self._record("broadcast", tensors, tensors)
        return self._done() if self._fake else self._inner.broadcast(tensors, opts)

    def barrier(self, opts):
        return self._inner.barrier(opts)


#: Set in a rank process that simulates a fake world (see :class:`CountingProcessGroup`).
FAKE_WORLD = {"on": False}


def _create_counting_pg(opts: Any, backend_options: Any) -> Any:
    """``torch.distributed`` backend factory: gloo, or the fake group in a fake world."""
    if FAKE_WORLD["on"]:
        from torch._C._distributed_c10d import FakeProcessGroup

        inner = FakeProcessGroup._create_internal(opts.group_rank, opts.group_size,
                                                  FakeProcessGroup.Options())
        return CountingProcessGroup(inner, opts.group_rank, opts.group_size, fake=True)
    inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return CountingProcessGroup(inner, opts.group_rank, opts.group_size)


def register_backend() -> None:
    """Register :data:`BACKEND` with ``torch.distributed`` (once per process)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create_counting_pg, extended_api=True,
                                      devices=["cpu"])


# ----------------------------------------------------------------------------- sharders and plans
#: Fused kernels update their rows in the backward pass; plain SGD with learning rate 1 makes
#: the update the gradient itself (``w_before - w_after``), which is how a run reads it.
FUSED_PARAMS = {"learning_rate": 1.0}


def cpu_sharders(open_row_wise: bool = True) -> list[Any]:
    """The sharders of a CPU run: pooled (opened or TorchRec's own) and sequence, their fused
    kernels on exact SGD with learning rate 1 (:data:`FUSED_PARAMS`)."""
    return embedding_sharders("sgd", FUSED_PARAMS["learning_rate"], open_row_wise=open_row_wise)


def parameter_sharding(table: EmbeddingTable, sh: TableSharding, world_size: int,
                       local_world_size: int) -> Any:
    """TorchRec's ``ParameterSharding`` of one table, built with TorchRec's own generators
    (``sharding_plan.py``: ``table_wise``, ``row_wise``, ``column_wise``, ``table_row_wise``,
    ``data_parallel``); table-column-wise is column-wise relabelled, as TorchRec's planner
    makes it (``TwCwPooledEmbeddingSharding`` subclasses the column-wise sharding)."""
    import dataclasses

    from torchrec.distributed import sharding_plan as sp

    kernel = sh.kernel
    st = sh.sharding_type
    if st == "data_parallel":
        gen = sp.data_parallel()
    elif st == "table_wise":
        gen = sp.table_wise(rank=sh.ranks[0], compute_kernel=kernel)
    elif st in ("column_wise", "table_column_wise"):
        gen = sp.column_wise(ranks=list(sh.ranks), compute_kernel=kernel)
    elif st == "row_wise":
        gen = sp.row_wise(compute_kernel=kernel)
    elif st == "table_row_wise":
        gen = sp.table_row_wise(host_index=sh.host)  # takes no kernel: set below
    else:
        raise ValueError(f"table {table.name!r}: unknown sharding type {st!r}")
    param = nn.Parameter(torch.empty(table.num_rows, table.dim, device="meta"))
    sharder = cpu_sharders()[0 if table.kind == "pooled" else 1]
    ps = gen(param, local_world_size, world_size, "cpu", sharder)
    return dataclasses.replace(ps, sharding_type=st, compute_kernel=kernel)


def module_sharding_plan(tables: Sequence[EmbeddingTable], shardings: Mapping[str, TableSharding],
                         world_size: int, local_world_size: int) -> Any:
    """A TorchRec ``ShardingPlan`` for the module of :func:`build_collections` (tables run as
    plain torch modules are not in it)."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    plans: dict[str, Any] = {}
    for t in tables:
        if shardings[t.name].plain_module:     # not TorchRec's: DMP replicates it, DDP syncs it
            continue
        path = POOLED_PATH if t.kind == "pooled" else SEQUENCE_PATH
        plans.setdefault(path, EmbeddingModuleShardingPlan())[t.name] = parameter_sharding(
            t, shardings[t.name], world_size, local_world_size)
    return ShardingPlan(plans)


# ----------------------------------------------------------------------------- the model
def build_collections(tables: Sequence[EmbeddingTable], weighted: bool = False,
                      device: str = "cpu",
                      shardings: Mapping[str, TableSharding] | None = None) -> EmbeddingModules:
    """The model of a run: ``tables`` (fp32; weights to be loaded) as an
    ``EmbeddingBagCollection`` (pooled, under ``ebc``) and an ``EmbeddingCollection`` (sequence,
    under ``ec``); tables whose sharding is a plain torch module (``TableSharding.plain_module``)
    as ``nn.EmbeddingBag`` / ``nn.Embedding`` under ``plain``."""
    def config(t: EmbeddingTable) -> Any:
        cls = EmbeddingBagConfig if t.kind == "pooled" else EmbeddingConfig
        return cls(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                   feature_names=[t.feature])

    plain = {t.name for t in tables if shardings and shardings[t.name].plain_module}
    pooled = [config(t) for t in tables if t.kind == "pooled" and t.name not in plain]
    seq = [config(t) for t in tables if t.kind == "sequence" and t.name not in plain]
    return EmbeddingModules(pooled, seq, [config(t) for t in tables if t.name in plain], weighted,
                            device)


def kjt_from_batch(batch: Batch, keys: Sequence[str], values_dtype: str = "int64",
                   lengths_dtype: str = "int64",
                   weighted: bool = False) -> KeyedJaggedTensor | None:
    """The ``KeyedJaggedTensor`` of the features ``keys`` of ``batch`` (None if ``keys`` is empty).

    Values and lengths are cast to ``values_dtype`` / ``lengths_dtype`` (``"int64"`` or
    ``"int32"``); weights (float32) are passed when ``weighted``."""
    if not keys:
        return None
    vals = [batch.feature_values(k) for k in keys]
    lens = [batch.feature_lengths(k) for k in keys]
    weights = None
    if weighted:
        offs = batch.key_offsets()
        idx = [list(batch.keys).index(k) for k in keys]
        w = batch.weights if batch.weights is not None else np.ones(batch.num_values, np.float32)
        weights = torch.from_numpy(np.concatenate([w[offs[i]:offs[i + 1]] for i in idx])
                                   .astype(np.float32))
    return KeyedJaggedTensor(
        keys=list(keys),
        values=torch.from_numpy(np.concatenate(vals).astype(values_dtype)),
        lengths=torch.from_numpy(np.concatenate(lens).astype(lengths_dtype)),
        weights=weights)


def _features(tables: Sequence[EmbeddingTable], kind: str) -> list[str]:
    return [t.feature for t in tables if t.kind == kind]


def _forward(job: RankJob, case: CaseJob, model: nn.Module,
             batch: Batch) -> dict[str, torch.Tensor]:
    """The model's outputs per feature on one local batch: a pooled and a sequence KJT of the
    batch's features (an export case's original ones: its drop-in modules split and merge)."""
    tables = case.input_tables
    pooled = kjt_from_batch(batch, _features(tables, "pooled"), job.values_dtype,
                            job.lengths_dtype, case.weighted)
    seq = kjt_from_batch(batch, _features(tables, "sequence"), job.values_dtype,
                         job.lengths_dtype)
    return dict(model(pooled, seq))


class ExportedModel(nn.Module):
    """An export's drop-in modules (:mod:`~flexshard_stream.bridge.module`) as the model of a
    run: ``forward(pooled, sequence)`` gives per original feature the pooled ``[B, D]`` or the
    sequence ``[n, D]`` embeddings, as :class:`EmbeddingModules` does for the tables."""

    def __init__(self, export_dir: str, weighted: bool = False):
        super().__init__()
        modules = exported_collections(export_dir, is_weighted=weighted)
        self.pooled = modules.get("pooled")
        self.sequence = modules.get("sequence")

    def forward(self, pooled: KeyedJaggedTensor | None,
                sequence: KeyedJaggedTensor | None) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self.pooled is not None and pooled is not None:
            out.update(self.pooled(pooled).to_dict())
        if self.sequence is not None and sequence is not None:
            out.update({f: jt.values() for f, jt in self.sequence(sequence).items()})
        return out


def _loss(outputs: Mapping[str, torch.Tensor], job: RankJob, iteration: int,
          rank: int) -> torch.Tensor:
    """``sum_f <out_f, g_f>`` with the fixed upstream gradients of :func:`upstream_gradient`."""
    total = torch.zeros(())
    for i, f in enumerate(sorted(outputs)):
        g = upstream_gradient(job.seed, iteration, rank, i, tuple(outputs[f].shape))
        total = total + (outputs[f] * torch.from_numpy(g)).sum()
    return total


# ----------------------------------------------------------------------------- one rank
def _skip_collective_validation() -> None:
    """In a fake world, skip the one TorchRec collective a fake rank cannot mirror: DMP's
    start-up broadcast of rank 0's collective-validation setting (``collective_utils.py``
    ``init_collective_validation``, a ``broadcast_object_list`` whose size a non-root rank
    cannot know). Validation stays off, its default."""
    from torchrec.distributed import collective_utils

    collective_utils._INITIALIZED = True
    collective_utils._USE_COLLECTIVE_VALIDATION = False


def _init_rank(rank: int, job: RankJob) -> None:
    os.environ.update(LOCAL_WORLD_SIZE=str(job.local_world_size),
                      LOCAL_RANK=str(rank % job.local_world_size), RANK=str(rank),
                      WORLD_SIZE=str(job.world_size))
    register_backend()
    timeout = timedelta(seconds=job.timeout_s)
    if job.fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        FAKE_WORLD["on"] = True
        _skip_collective_validation()
        dist.init_process_group(BACKEND, store=FakeStore(), rank=rank, world_size=job.world_size,
                                timeout=timeout)
    else:
        dist.init_process_group(BACKEND, init_method=f"file://{job.store_path}", rank=rank,
                                world_size=job.world_size, timeout=timeout)


def _table_of(name: str, tables: Sequence[EmbeddingTable]) -> EmbeddingTable | None:
    parts = name.split(".")
    if len(parts) >= 2 and parts[-1] == "weight":
        for t in tables:
            if t.name == parts[-2]:
                return t
    return None


def load_weights(model: nn.Module, tables: Sequence[EmbeddingTable],
                 weights: Mapping[str, np.ndarray]) -> None:
    """Copy the full ``weights`` of each table into the (local shards of the) model."""
    load_table_weights(model, {t.name: weights[t.name] for t in tables})


def _fused_tables(case: CaseJob) -> list[EmbeddingTable]:
    return [t for t in case.tables if case.shardings and case.shardings[t.name].kernel == "fused"]


def _snapshot(model: nn.Module, tables: Sequence[EmbeddingTable]
              ) -> dict[str, list[tuple[tuple[int, int], torch.Tensor]]]:
    """Copies of the local shards of ``tables`` (before a fused kernel's update)."""
    names = {t.name for t in tables}
    out: dict[str, list[tuple[tuple[int, int], torch.Tensor]]] = {}
    for name, shards in local_shards(model).items():
        t = _table_of(name, tables)
        if t is not None and t.name in names:
            out[t.name] = [(o, x.detach().clone()) for o, x in shards if x.numel()]
    return out


def _gradients(model: nn.Module, case: CaseJob,
               before: Mapping[str, list[tuple[tuple[int, int], torch.Tensor]]]
               ) -> dict[str, list[tuple[tuple[int, int], np.ndarray]]]:
    """Per table: (offsets, gradient) of each local shard. Dense kernels: the parameter's
    ``.grad``; fused kernels (SGD, learning rate 1): ``before - after``."""
    out: dict[str, list[tuple[tuple[int, int], np.ndarray]]] = {}
    after = _snapshot(model, [t for t in case.tables if t.name in before])
    for name, shards in before.items():
        out[name] = [(o, (b - a).numpy()) for (o, b), (_, a) in zip(shards, after[name])]
    offsets = {name: [o for o, _ in shards] for name, shards in local_shards(model).items()}
    for name, p in model.named_parameters():
        t = _table_of(name, case.tables)
        if t is None or t.name in before or p.grad is None or p.numel() == 0:
            continue
        key = next(k for k in offsets if k.endswith(f".{t.name}.weight"))
        out.setdefault(t.name, []).append((offsets[key][0], p.grad.detach().numpy().copy()))
    return out


def _iterate(job: RankJob, case: CaseJob, model: nn.Module, ranks: Sequence[int],
             record: bool) -> list[RankResult]:
    """Forward and backward of every batch, on the initial weights each time; one result per
    rank in ``ranks`` (a sharded model runs its own rank; the reference runs every rank's
    samples and sums their losses)."""
    results = [RankResult(rank=r, outputs=[], grads=[], records=[]) for r in ranks]
    b = job.local_batch_size
    fused = _fused_tables(case)
    for it, batch in enumerate(job.batches):
        before = _snapshot(model, fused)
        total = torch.zeros(())
        for res in results:
            RECORDER.at(it, "forward")
            out = _forward(job, case, model, slice_batch(batch, res.rank * b,
                                                         (res.rank + 1) * b))
            total = total + _loss(out, job, it, res.rank)
            res.outputs.append({k: v.detach().numpy().copy() for k, v in out.items()})
        RECORDER.at(it, "backward")
        (total / (job.world_size if len(results) > 1 else 1)).backward()
        RECORDER.at(None, "teardown")
        results[0].grads.append(_gradients(model, case, before))
        model.zero_grad(set_to_none=True)
        load_weights(model, fused, case.weights)
    if record:
        results[0].records = list(RECORDER.records)
    return results


def _run_case(rank: int, job: RankJob, case: CaseJob) -> RankResult:
    RECORDER.records.clear()
    RECORDER.at(None, "setup")
    if case.export_dir:     # what a user of the export runs: its drop-in modules, build_dmp
        dmp = build_dmp(ExportedModel(case.export_dir, case.weighted), device="cpu",
                        pg=dist.group.WORLD, sharders=cpu_sharders(job.open_row_wise))
    else:
        model = build_collections(case.tables, case.weighted, shardings=case.shardings)
        plan = module_sharding_plan(case.tables, case.shardings, job.world_size,
                                    job.local_world_size)
        dmp = DistributedModelParallel(model,
                                       env=ShardingEnv.from_process_group(dist.group.WORLD),
                                       device=torch.device("cpu"), plan=plan,
                                       sharders=cpu_sharders(job.open_row_wise))
    load_weights(dmp, case.tables, case.weights)
    return _iterate(job, case, dmp, [rank], record=True)[0]


def rank_main(rank: int, job: RankJob) -> None:
    """Entry point of one rank: run every case, write the results file."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    _init_rank(rank, job)
    try:
        results = [_run_case(rank, job, case) for case in job.cases]
        Path(job.result_path(rank)).write_bytes(pickle.dumps(results))
    finally:
        dist.destroy_process_group()


def _rank_command(job_path: Path, rank: int) -> list[str]:
    return [sys.executable, "-m", "flexshard_stream.bridge.world", str(job_path),
            str(rank)]


def _child_env() -> dict[str, str]:
    """This environment, with the directory holding this package first on ``PYTHONPATH``."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    return env


def _stop(procs: Mapping[int, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for p in procs.values():
        p.wait()


def _failure(job: RankJob, rank: int, code: int | None) -> RunError:
    log = Path(job.work_dir) / f"rank{rank}.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    what = "timed out" if code is None else f"exited with code {code}"
    return RunError(f"TorchRec rank {rank} of {job.world_size} {what}:\n{tail}")


def _wait(job: RankJob, procs: Mapping[int, subprocess.Popen], deadline: float) -> None:
    """Wait for every rank; :class:`RunError` for the first that fails or outlives
    ``deadline`` (``time.monotonic`` seconds)."""
    while True:
        codes = {r: p.poll() for r, p in procs.items()}
        failed = [r for r, c in codes.items() if c not in (None, 0)]
        if failed:
            raise _failure(job, failed[0], codes[failed[0]])
        running = [r for r, c in codes.items() if c is None]
        if not running:
            return
        if time.monotonic() > deadline:
            raise _failure(job, running[0], None)
        time.sleep(0.05)


def spawn_ranks(job: RankJob) -> list[list[RankResult]]:
    """Start one Python process per rank of ``job.run_ranks`` (``python -m`` this module), wait
    for them and return each rank's results (one per case).

    Raises :class:`RunError` with the log of the first rank that fails; the others are killed.
    The whole run may take ``job.timeout_s`` plus one minute per case for start-up."""
    work = Path(job.work_dir)
    job_path = work / "job.pkl"
    job_path.write_bytes(pickle.dumps(job))
    procs: dict[int, subprocess.Popen] = {}
    try:
        for r in job.run_ranks:
            with open(work / f"rank{r}.log", "wb") as log:
                procs[r] = subprocess.Popen(_rank_command(job_path, r), env=_child_env(),
                                            stdout=log, stderr=subprocess.STDOUT)
        _wait(job, procs, time.monotonic() + job.timeout_s + 60.0 * (1 + len(job.cases)))
    finally:
        _stop(procs)
    return [pickle.loads(Path(job.result_path(r)).read_bytes()) for r in job.run_ranks]


def run_reference(job: RankJob, case: CaseJob) -> list[RankResult]:
    """The unsharded module on the same weights and batches, one result per rank's samples.

    The loss is the sum of the ranks' losses divided by ``world_size``: the gradient each
    trainer applies after TorchRec's backward all-to-all (``GRADIENT_DIVISION``) and DDP's
    all-reduce, both of which average over the ranks. Gradients are in the first result."""
    model = build_collections(case.tables, case.weighted)
    load_weights(model, case.tables, case.weights)
    return _iterate(job, case, model, range(job.world_size), record=False)


def _main(argv: Sequence[str]) -> None:
    job = pickle.loads(Path(argv[0]).read_bytes())
    rank_main(int(argv[1]), job)


if __name__ == "__main__":
    from flexshard_stream.bridge import world as _self  # the importable copy

    _self._main(sys.argv[1:])
