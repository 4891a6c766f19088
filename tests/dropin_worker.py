"""One rank of tests/test_dropin.py's gloo world: the drop-in modules sharded by build_dmp (process
group from the environment), their outputs on raw-ID KJTs against the unsharded original modules
in the same process, and what a KJT with a foreign feature gets. Writes ``rank<r>.json``."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor

from flexshard_stream.bridge.module import (
    ExportedEmbeddingBagCollection,
    ExportedEmbeddingCollection,
    build_dmp,
    load_table_weights,
)
from flexshard_stream.errors import BatchError

RAW = 10**6           # raw IDs lie in [0, RAW); the modules take them modulo the rows
SAMPLES = 6           # per rank


class Pair(nn.Module):
    """A model holding both drop-in modules (where its EBC and EC were)."""

    def __init__(self, pooled: nn.Module, sequence: nn.Module):
        super().__init__()
        self.pooled, self.sequence = pooled, sequence

    def forward(self, pooled_kjt, sequence_kjt):
        return self.pooled(pooled_kjt), self.sequence(sequence_kjt)


def weights_of(tables) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {t.name: rng.standard_normal((t.num_rows, t.dim)).astype(np.float32) for t in tables}


def raw_kjt(keys, rank: int, it: int, max_len: int) -> KeyedJaggedTensor:
    rng = np.random.default_rng([rank, it, len(keys)])
    lengths = rng.integers(0, max_len + 1, SAMPLES * len(keys))
    return KeyedJaggedTensor(keys=list(keys),
                             values=torch.from_numpy(rng.integers(0, RAW, int(lengths.sum()))),
                             lengths=torch.from_numpy(lengths))


def modulo(kjt: KeyedJaggedTensor, rows: dict[str, int]) -> KeyedJaggedTensor:
    """What a user of the original modules does by hand: IDs modulo each table's rows."""
    jt = kjt.to_dict()
    keys = list(kjt.keys())
    return KeyedJaggedTensor(keys=keys, values=torch.cat([jt[k].values() % rows[k] for k in keys]),
                             lengths=kjt.lengths())


def compare(dmp, ref_ebc, ref_ec, rows, pooled_keys, seq_keys, rank, it) -> dict:
    """Outputs of the sharded drop-ins against the unsharded originals on one local batch."""
    pk, sk = raw_kjt(pooled_keys, rank, it, 3), raw_kjt(seq_keys, rank, it, 5)
    kt, jts = dmp(pk, sk)
    rkt = ref_ebc(modulo(pk, rows))           # the original module reads any key order
    rjts = ref_ec(modulo(sk, rows))
    return {"pooled_keys": kt.keys(), "ref_pooled_keys": rkt.keys(),
            "length_per_key": kt.length_per_key(), "ref_length_per_key": rkt.length_per_key(),
            "pooled_err": float((kt.values() - rkt.values()).abs().max()),
            "pooled_scale": float(rkt.values().abs().max()),
            "sequence_keys": list(jts), "ref_sequence_keys": list(rjts),
            "lengths_equal": all(torch.equal(jts[k].lengths(), rjts[k].lengths())
                                 for k in rjts),
            "sequence_err": max(float((jts[k].values() - rjts[k].values()).abs().max())
                                if rjts[k].values().numel() else 0.0 for k in rjts),
            "sequence_rows": sum(int(rjts[k].values().shape[0]) for k in rjts)}


def refusal(dmp, pooled_keys, seq_keys, rank) -> str:
    """The message a KJT with a feature unknown to the pooled module gets."""
    try:
        dmp(raw_kjt(pooled_keys + ["bogus"], rank, 9, 2), raw_kjt(seq_keys, rank, 9, 2))
    except BatchError as e:
        return str(e)
    return ""


def adagrad_step(export_dir: str, weights, rank: int) -> dict:
    """One step of row-wise Adagrad (fused, learning rate 0.1) on a second DMP: per cold table of
    the pooled drop-in, its optimizer state's shapes and whether its rows moved."""
    pooled = ExportedEmbeddingBagCollection(export_dir, ids="hash")
    sequence = ExportedEmbeddingCollection(export_dir, ids="hash")
    dmp = build_dmp(Pair(pooled, sequence), device="cpu", optimizer="rowwise_adagrad",
                    learning_rate=0.1)
    dmp.module.pooled.load_original_weights(weights)
    before = {k: v.local_shards()[0].tensor.clone() for k, v in dmp.state_dict().items()
              if k.endswith("__cold.weight") and hasattr(v, "local_shards") and v.local_shards()}
    kt, jts = dmp(raw_kjt(pooled.features, rank, 5, 3), raw_kjt(sequence.features, rank, 5, 3))
    (kt.values().sum() + sum(jt.values().sum() for jt in jts.values())).backward()
    after = {k: v.local_shards()[0].tensor for k, v in dmp.state_dict().items() if k in before}
    state = dmp.fused_optimizer.state_dict()["state"]
    return {"moved": sorted(k for k in before if not torch.equal(before[k], after[k])),
            "state": sorted(f"{k}:{sk}" for k, v in state.items() for sk in v)}


def main(rank: int, world: int, export_dir: str, out_dir: str, port: int) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    pooled = ExportedEmbeddingBagCollection(export_dir, ids="hash")
    sequence = ExportedEmbeddingCollection(export_dir, ids="hash")
    tables = pooled.source_tables + sequence.source_tables
    rows = {t.feature: t.num_rows for t in tables}
    ref_ebc = EmbeddingBagCollection(pooled.original_configs())
    ref_ec = EmbeddingCollection(sequence.original_configs())
    weights = weights_of(tables)
    load_table_weights(ref_ebc, weights)
    load_table_weights(ref_ec, weights)
    dmp = build_dmp(Pair(pooled, sequence), device="cpu")
    dmp.module.pooled.load_original_weights(weights)
    dmp.module.sequence.load_original_weights(weights)
    pooled_keys, seq_keys = list(pooled.features), list(sequence.features)
    result = {"sharded": [type(dmp.module.pooled.embeddings.ebc).__name__,
                          type(dmp.module.sequence.embeddings.ec).__name__],
              "iterations": [compare(dmp, ref_ebc, ref_ec, rows, keys, seq_keys, rank, it)
                             for it, keys in enumerate([pooled_keys, pooled_keys[::-1]])],
              "refusal": refusal(dmp, pooled_keys, seq_keys, rank),
              "adagrad": adagrad_step(export_dir, weights, rank)}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()
