"""One rank of tests/test_live_reshard.py's gloo world (4 ranks, 2 per node): the drop-in modules
of a live export trained on Amazon Beauty review histories (the last item pooled, the history
before it as a sequence), deltas applied mid-run by ``apply_delta``, beside an unsharded reference
trained in the same process on the same batches with the same optimizer. Writes ``<name><r>.json``
(losses, logits error, final weights error, what each delta did or why it was refused)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor

from flexshard_stream.bridge.live import (
    RowWiseAdagrad,
    apply_delta,
    gather_original_state,
    gather_original_weights,
)
from flexshard_stream.bridge.module import (
    ExportedEmbeddingBagCollection,
    ExportedEmbeddingCollection,
    build_dmp,
    load_table_weights,
)
from flexshard_stream.errors import BatchError, FlexShardError
from flexshard_stream.plans.delta import PlanDelta
from flexshard_stream.sources.datasets import amazon_sequences

WORLD, PER_NODE = 4, 2
DIM = 8
SAMPLES = 16          # per rank and step
HISTORY = 8           # items of history per sample, at most
LR = 0.5
EPS = 1e-8


def samples(step: int, rank: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Rank ``rank``'s users of ``step``, in stream order: their last item and history."""
    values, lengths = amazon_sequences("Beauty")
    offs = np.concatenate([[0], np.cumsum(lengths)])
    users = range((step * WORLD + rank) * SAMPLES, (step * WORLD + rank + 1) * SAMPLES)
    last = np.array([values[offs[u + 1] - 1] for u in users], np.int64)
    hist = [values[max(offs[u], offs[u + 1] - 1 - HISTORY):offs[u + 1] - 1] for u in users]
    return last, hist


def kjts(step: int, rank: int) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor, torch.Tensor]:
    last, hist = samples(step, rank)
    pooled = KeyedJaggedTensor(keys=["item"], values=torch.from_numpy(last),
                               lengths=torch.ones(last.size, dtype=torch.int64))
    seq = KeyedJaggedTensor(keys=["hist"], values=torch.from_numpy(np.concatenate(hist)),
                            lengths=torch.tensor([h.size for h in hist], dtype=torch.int64))
    labels = torch.from_numpy((np.random.default_rng([step, rank]).random(last.size) < 0.5)
                              .astype(np.float32))
    return pooled, seq, labels


class Model(nn.Module):
    """Pooled last item and summed history into a linear head: a logit per sample."""

    def __init__(self, sparse: nn.Module, seq: nn.Module):
        super().__init__()
        self.sparse, self.seq = sparse, seq
        self.head = nn.Linear(2 * DIM, 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.from_numpy(np.random.default_rng(5).normal(
                0, 0.5, (1, 2 * DIM)).astype(np.float32)))
            self.head.bias.zero_()

    def forward(self, pooled, sequence) -> torch.Tensor:
        kt = self.sparse(pooled)
        jt = self.seq(sequence)["hist"]
        n = jt.lengths().numel()
        sample = torch.repeat_interleave(torch.arange(n), jt.lengths())
        summed = torch.zeros(n, DIM).index_add(0, sample, jt.values())
        return self.head(torch.cat([kt.values(), summed], dim=1)).squeeze(1)


def initial_weights(tables) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {t.name: rng.uniform(-0.5, 0.5, (t.num_rows, t.dim)).astype(np.float32)
            for t in tables}


def bce(logits, labels):
    return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def _optimizers(model: nn.Module, adagrad: bool, params) -> list:
    """SGD on everything dense; with ``adagrad`` RowWiseAdagrad on the tables instead."""
    params = list(params)
    tables = [p for n, p in params if "__hot" in n or "embedding" in n] if adagrad else []
    rest = [p for n, p in params if not any(p is q for q in tables)]
    opts = [torch.optim.SGD(rest, lr=LR)]
    if tables:
        opts.append(RowWiseAdagrad(tables, lr=LR, eps=EPS))
    return opts


# ----------------------------------------------------------------------------- the reference
class Reference:
    """The unsharded original modules, every rank's batch of a step in one update (the mean of
    the ranks' losses, as the sharded job averages its gradients over the ranks)."""

    def __init__(self, export_dir: str, adagrad: bool):
        p, s = ExportedEmbeddingBagCollection(export_dir), ExportedEmbeddingCollection(export_dir)
        self.model = Model(EmbeddingBagCollection(p.original_configs()),
                           EmbeddingCollection(s.original_configs()))
        load_table_weights(self.model, initial_weights(p.source_tables + s.source_tables))
        self.opts = _optimizers(self.model, adagrad, self.model.named_parameters())

    def step(self, step: int) -> tuple[list[float], list[torch.Tensor]]:
        losses, logits = [], []
        for r in range(WORLD):
            pk, sk, y = kjts(step, r)
            out = self.model(pk, sk)
            logits.append(out.detach())
            losses.append(bce(out, y))
        for o in self.opts:
            o.zero_grad()
        (sum(losses) / WORLD).backward()
        for o in self.opts:
            o.step()
        return [x.item() for x in losses], logits

    def state(self) -> dict[str, np.ndarray]:
        """RowWiseAdagrad's momentum1 per table (zeros for a table it has not stepped)."""
        if len(self.opts) < 2:
            return {}
        out = {}
        for k, v in self.model.state_dict().items():
            if k.endswith(".weight") and "head" not in k:
                p = dict(self.model.named_parameters())[k]
                st = self.opts[1].state.get(p, {}).get("momentum1")
                out[k.split(".")[-2]] = np.zeros(p.shape[0], np.float32) if st is None \
                    else st.numpy().copy()
        return out

    def weights(self) -> dict[str, np.ndarray]:
        sd = self.model.state_dict()
        return {k.split(".")[-2]: v.detach().numpy() for k, v in sd.items()
                if k.endswith(".weight") and "head" not in k}


# ----------------------------------------------------------------------------- one run
def _try_apply(dmp, delta, opt) -> dict:
    version = dmp.module.sparse.live_version
    try:
        rep = apply_delta(dmp, delta, optimizer=opt)
        return {"applied": True, "version": rep.version, "tables": rep.tables,
                "rows_moved": rep.rows_moved}
    except FlexShardError as e:
        return {"applied": False, "error": f"{type(e).__name__}: {e}",
                "version_before": version, "version_after": dmp.module.sparse.live_version}


def _resume(dmp, export_dir: str, adagrad: bool, step: int, rank: int) -> dict:
    """A new DMP of the export (version 0) loading ``dmp``'s state dict: its version, slots and
    outputs on the next batch against ``dmp``'s."""
    p = ExportedEmbeddingBagCollection(export_dir, ids="raw")
    s = ExportedEmbeddingCollection(export_dir, ids="raw")
    new = build_dmp(Model(p, s), device="cpu", optimizer="rowwise_adagrad" if adagrad else "sgd",
                    learning_rate=LR)
    before = new.module.sparse.live_version
    new.load_state_dict(dmp.state_dict())
    pk, sk, _ = kjts(step, rank)
    with torch.no_grad():
        err = float((new(pk, sk) - dmp(pk, sk)).abs().max())
    return {"version_before": before, "versions": [new.module.sparse.live_version,
                                                   new.module.seq.live_version],
            "same_slots": all(np.array_equal(a.slot_maps[t].slots, b.slot_maps[t].slots)
                              for a, b in ((new.module.sparse, dmp.module.sparse),
                                           (new.module.seq, dmp.module.seq))
                              for t in a.slot_maps),
            "logit_err": err}


def run(rank: int, export_dir: str, deltas: dict, adagrad: bool, steps: int,
        job_checkpoint: bool = False) -> dict:
    """``steps`` steps; before step ``s`` the deltas listed under ``s`` (this rank's own, which
    may differ from the others'); before the last step the batch is split under the old version
    (a DataLoader worker's) and a delta applied after it."""
    p = ExportedEmbeddingBagCollection(export_dir, ids="raw")
    s = ExportedEmbeddingCollection(export_dir, ids="raw")
    dmp = build_dmp(Model(p, s), device="cpu", optimizer="rowwise_adagrad" if adagrad else "sgd",
                    learning_rate=LR, **({"eps": EPS} if adagrad else {}))
    for m in (dmp.module.sparse, dmp.module.seq):
        m.load_original_weights(initial_weights(p.source_tables + s.source_tables))
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    opts = _optimizers(dmp, adagrad, in_backward_optimizer_filter(dmp.named_parameters()))
    hot_opt = opts[-1] if adagrad else opts[0]
    ref = Reference(export_dir, adagrad)
    out = {"losses": [], "ref_losses": [], "logit_err": 0.0, "applied": {}, "stale": {}}
    for step in range(steps):
        pk, sk, y = kjts(step, rank)
        early = None
        for i, d in enumerate(deltas.get(step, [])):
            if d == "stale":      # the batch split before the delta, as a loader worker would
                early = dmp.module.sparse.remap_features(pk), dmp.module.seq.remap_features(sk)
                continue
            out["applied"][f"{step}.{i}"] = _try_apply(dmp, PlanDelta.load(d), hot_opt)
        if early is not None:
            out["stale"] = _stale_check(dmp, early)
            pk, sk = early
        logits = dmp(pk, sk)
        loss = bce(logits, y)
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad()
        ref_losses, ref_logits = ref.step(step)
        out["losses"].append(loss.item())
        out["ref_losses"].append(ref_losses[rank])
        out["logit_err"] = max(out["logit_err"],
                               float((logits.detach() - ref_logits[rank]).abs().max()))
    got, want = gather_original_weights(dmp), ref.weights()
    out["weight_err"] = {t: float(np.abs(got[t] - want[t]).max()) for t in got}
    out["weights_changed"] = {t: float(np.abs(want[t] - initial_weights(
        p.source_tables + s.source_tables)[t]).max()) for t in want}
    if adagrad:
        got_s, want_s = gather_original_state(dmp, hot_opt), ref.state()
        out["state_err"] = {t: float(np.abs(got_s[t] - want_s[t]).max()) for t in got_s}
        out["state_max"] = {t: float(want_s[t].max()) for t in want_s}
    if job_checkpoint:
        out["resumed"] = _resume(dmp, export_dir, adagrad, steps, rank)
    out["versions"] = [dmp.module.sparse.live_version, dmp.module.seq.live_version]
    out["stale_batches"] = dmp.module.sparse.stale_batches + dmp.module.seq.stale_batches
    out["slots"] = {t: m.slot_maps[t].slots.tolist() for m in (dmp.module.sparse, dmp.module.seq)
                    for t in m.slot_maps}
    return out


def _stale_check(dmp, early) -> dict:
    """A batch split under the old version: refused by a strict module (then re-split)."""
    m = dmp.module.sparse
    m.strict_version = True
    try:
        m(early[0])
        refused = ""
    except BatchError as e:
        refused = str(e)
    m.strict_version = False
    return {"batch_version": early[0].version, "module_version": m.live_version,
            "strict_refusal": refused}


def main(rank: int, export_dir: str, out_dir: str, port: int, jobs: list) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank % PER_NODE))
    for job in jobs:
        deltas = {int(k): v["per_rank"][rank] if isinstance(v, dict) else v
                  for k, v in job["deltas"].items()}
        res = run(rank, export_dir, deltas, job["adagrad"], job["steps"],
                  job.get("checkpoint", False))
        Path(out_dir, f"{job['name']}{rank}.json").write_text(json.dumps(res))
    torch.distributed.destroy_process_group()
