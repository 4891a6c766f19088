"""The torch side of a TorchRec export: the ID remap on a ``KeyedJaggedTensor``, model, plan.

This module imports torch and torchrec at the top; :mod:`flexshard_stream.bridge.export`
imports it only inside its loaders, so the package (and ``flexshard-stream export``) works without
torch. What a training script needs from an export directory ``out``::

    remap, model, plan = exported_modules(out, device="cuda")
    dmp = DistributedModelParallel(model, plan=plan, ...)     # placement: ours, not TorchRec's
    for kjt in loader:                                        # original IDs and keys
        split, is_hot = remap.split(kjt)                      # <feature>__hot / <feature>__cold
        outputs = remap.merge(dmp(split), is_hot)             # back to the original features

- :func:`remap_ids` and :class:`TableRemap`: the remap of one table on a tensor of IDs, the torch
  twin of :meth:`flexshard_stream.bridge.remap.IdRemap.apply` (same arrays, the same two
  ``torch.searchsorted``, identical IDs);
- :class:`KJTRemap`: every exported feature of a ``KeyedJaggedTensor`` split into its hot and cold
  features (lengths per sample, weights along), and :meth:`KJTRemap.merge` to put the embeddings
  back in the original order (sequence) or add them (pooled, SUM); both modules script with
  ``torch.jit.script``;
- :class:`EmbeddingModules` (:func:`exported_embeddings`): the exported tables as an
  ``EmbeddingBagCollection`` (``ebc``) and an ``EmbeddingCollection`` (``ec``), plus, with
  ``dense_sequence_hot``, the data-parallel tables of sequence features as plain ``nn.Embedding``
  modules (``plain``): fbgemm-gpu-cpu 1.8's dense kernel pools sequence lookups, so on CPU TorchRec
  cannot run them; ``DistributedModelParallel`` replicates such a module and DDP all-reduces its
  gradient, exactly what TorchRec's data-parallel sharding does (docs/TORCHREC_EXPORT.md);
- :func:`sharding_plan_from_doc`: the ``ShardingPlan`` of ``sharding_plan.json``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from ..errors import ConfigError
from .export import (
    TorchRecExport,
    load_torchrec_export,
    sharding_plan_from_doc,
    torchrec_embedding_configs,
    torchrec_sharding_plan,
)
from .remap import IdRemap
from .sharding import MODULE_PATHS

__all__ = ["remap_ids", "TableRemap", "KJTRemap", "EmbeddingModules", "exported_embeddings",
           "exported_modules", "sharding_plan_from_doc", "MODULE_PATHS"]

_INT32_ROWS = 2**31


def remap_ids(ids: torch.Tensor, exc_ids: torch.Tensor, exc_new: torch.Tensor,
              seg_rank: torch.Tensor, seg_new: torch.Tensor, num_rows: int) -> torch.Tensor:
    """New indices (int64) of original IDs under one :class:`IdRemap`'s arrays (``seg_rank``
    non-empty): the torch twin of :meth:`IdRemap.apply`. IDs outside ``[0, num_rows)`` raise
    ``ValueError``. TorchScript-able."""
    x = ids.to(torch.int64)
    if x.numel() > 0:
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi >= num_rows:
            raise ValueError(f"IDs must lie in [0, {num_rows}), got {lo}..{hi}")
    n_exc = exc_ids.numel()
    if n_exc == 0:
        s = torch.searchsorted(seg_rank, x, right=True) - 1
        return seg_new[s] + (x - seg_rank[s])
    p = torch.searchsorted(exc_ids, x)
    r = x - p
    pc = p.clamp(max=n_exc - 1)
    s = torch.searchsorted(seg_rank, r, right=True) - 1
    return torch.where(exc_ids[pc] == x, exc_new[pc], seg_new[s] + (r - seg_rank[s]))


def remap_arrays(remap: IdRemap) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four int64 columns :func:`remap_ids` reads (a run no ID reaches when every row is an
    exception)."""
    exc, seg = remap.exceptions, remap.segments
    if not seg.shape[0]:
        seg = np.zeros((1, 2), np.int64)
    return (np.ascontiguousarray(exc[:, 0]), np.ascontiguousarray(exc[:, 1]),
            np.ascontiguousarray(seg[:, 0]), np.ascontiguousarray(seg[:, 1]))


class TableRemap(nn.Module):
    """The remap of one table on a tensor of original IDs: new indices (int64, same shape).

    The torch twin of :meth:`IdRemap.apply` (:func:`remap_ids`): ``p = searchsorted(exception
    IDs, x)``, an exception if it is there, else regular rank ``x - p`` and the run
    ``searchsorted(run starts, rank, right=True) - 1``. Buffers are not saved in ``state_dict``
    (the export directory is the source). IDs outside ``[0, num_rows)`` raise ``ValueError``.
    """

    def __init__(self, remap: IdRemap):
        super().__init__()
        self.num_rows = int(remap.num_rows)
        for name, arr in zip(("exc_ids", "exc_new", "seg_rank", "seg_new"), remap_arrays(remap)):
            self.register_buffer(name, torch.from_numpy(arr), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return remap_ids(ids, self.exc_ids, self.exc_new, self.seg_rank, self.seg_new,
                         self.num_rows)


class KJTRemap(nn.Module):
    """Split every exported feature of a ``KeyedJaggedTensor`` into ``<feature>__hot`` and
    ``<feature>__cold`` (the parts the table has, hot first; other keys pass through).

    Parameters
    ----------
    export : TorchRecExport or path
        A loaded export or its directory.

    Notes
    -----
    The output keeps the input's lengths dtype, and its values dtype unless an exported table has
    more than 2**31 rows (then int64); weights follow their IDs. A KJT with a variable batch per
    feature is refused (``ValueError``). The remaps of all tables sit in four concatenated
    buffers (they move with ``.to(device)``); the module scripts with ``torch.jit.script``.
    :meth:`TorchRecExport.remap_batch` is the numpy twin.
    """

    def __init__(self, export: "TorchRecExport | str | os.PathLike"):
        super().__init__()
        ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
        if ex.live:
            raise ConfigError(f"{ex.path}: a live export (hot_capacity) is remapped by "
                              f"flexshard_stream.bridge.live.LiveRemap, not KJTRemap")
        self.index: Dict[str, int] = {}
        self.hot_key: List[str] = []
        self.cold_key: List[str] = []
        self.hot_rows: List[int] = []
        self.num_rows: List[int] = []
        self.pooled: List[bool] = []
        self.exc_off: List[int] = [0]
        self.seg_off: List[int] = [0]
        cols: List[List[np.ndarray]] = [[], [], [], []]
        for e in ex.manifest["tables"]:
            self._add_table_keys(e)
            arrays = remap_arrays(ex.remaps[e["table"]])
            for col, arr in zip(cols, arrays):
                col.append(arr)
            self.exc_off.append(self.exc_off[-1] + arrays[0].size)
            self.seg_off.append(self.seg_off[-1] + arrays[2].size)
        for name, col in zip(("exc_ids", "exc_new", "seg_rank", "seg_new"), cols):
            flat = np.concatenate(col).astype(np.int64) if col else np.zeros(0, np.int64)
            self.register_buffer(name, torch.from_numpy(flat), persistent=False)
        self.keep_int32 = max(self.num_rows, default=0) <= _INT32_ROWS

    def _add_table_keys(self, e: Dict[str, Any]) -> None:
        """One manifest entry's feature keys, hot rows, rows and kind appended to the per-table
        lists (its feature mapped to its index); used while building, not scripted."""
        self.index[e["source_table"]["feature"] or e["table"]] = len(self.hot_key)
        self.hot_key.append(e["hot"]["feature"] if e["hot"] else "")
        self.cold_key.append(e["cold"]["feature"] if e["cold"] else "")
        self.hot_rows.append(int(e["hot_rows"]))
        self.num_rows.append(int(e["source_table"]["num_rows"]))
        self.pooled.append(e["source_table"]["kind"] == "pooled")

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return self.split(kjt)[0]

    def table_ids(self, j: int, ids: torch.Tensor) -> torch.Tensor:
        """New indices of original IDs of the ``j``-th exported table."""
        e0, e1, s0, s1 = self.exc_off[j], self.exc_off[j + 1], self.seg_off[j], self.seg_off[j + 1]
        return remap_ids(ids, self.exc_ids[e0:e1], self.exc_new[e0:e1], self.seg_rank[s0:s1],
                         self.seg_new[s0:s1], self.num_rows[j])

    def split(self, kjt: KeyedJaggedTensor
              ) -> Tuple[KeyedJaggedTensor, Dict[str, torch.Tensor]]:
        """The split KJT and, per exported feature, ``is_hot`` (bool per value, in order)."""
        if kjt.variable_stride_per_key():
            raise ValueError("KJTRemap: the KJT has a variable batch size per feature; give one "
                             "batch size for all features")
        keys = kjt.keys()
        stride = kjt.stride()
        values, lengths, weights = kjt.values(), kjt.lengths(), kjt.weights_or_none()
        per_key = kjt.length_per_key()
        out_keys: List[str] = []
        vals: List[torch.Tensor] = []
        lens: List[torch.Tensor] = []
        wts: List[torch.Tensor] = []
        masks: Dict[str, torch.Tensor] = {}
        start = 0
        for i, key in enumerate(keys):
            v = values[start:start + per_key[i]]
            ln = lengths[i * stride:(i + 1) * stride]
            w: Optional[torch.Tensor] = None
            if weights is not None:
                w = weights[start:start + per_key[i]]
            start += per_key[i]
            j = self.index.get(key, -1)
            if j < 0:
                _append(out_keys, vals, lens, wts, key, v.to(torch.int64), ln, w)
                continue
            new = self.table_ids(j, v)
            hot = new < self.hot_rows[j]
            masks[key] = hot
            ends = torch.cumsum(ln.to(torch.int64), 0)
            csum = torch.cat([torch.zeros(1, dtype=torch.int64, device=v.device),
                              torch.cumsum(hot.to(torch.int64), 0)])
            hl = (csum[ends] - csum[ends - ln.to(torch.int64)]).to(ln.dtype)
            if self.hot_key[j]:
                _append(out_keys, vals, lens, wts, self.hot_key[j], new[hot], hl,
                        None if w is None else w[hot])
            if self.cold_key[j]:
                cold = ~hot
                _append(out_keys, vals, lens, wts, self.cold_key[j],
                        new[cold] - self.hot_rows[j], ln - hl, None if w is None else w[cold])
        vdtype = values.dtype if (values.dtype == torch.int64 or self.keep_int32) else torch.int64
        out_weights: Optional[torch.Tensor] = None
        if len(wts) > 0:
            out_weights = torch.cat(wts)
        return KeyedJaggedTensor(keys=out_keys, values=torch.cat(vals).to(vdtype),
                                 lengths=torch.cat(lens), weights=out_weights,
                                 stride=stride), masks

    def merge(self, outputs: Dict[str, torch.Tensor], is_hot: Dict[str, torch.Tensor]
              ) -> Dict[str, torch.Tensor]:
        """Outputs per original feature from the outputs per exported feature: pooled features
        add their two parts (SUM pooling); sequence features put each row back where its ID was
        (``is_hot`` from :meth:`split`). Other outputs pass through. Differentiable."""
        out: Dict[str, torch.Tensor] = {}
        for k, v in outputs.items():
            out[k] = v
        for feature, j in self.index.items():
            hk, ck = self.hot_key[j], self.cold_key[j]
            if not (hk in outputs or ck in outputs):
                continue
            if hk == "" or ck == "":        # one part: the table is all hot or all cold
                out[feature] = out.pop(ck if hk == "" else hk)
            elif self.pooled[j]:
                out[feature] = out.pop(hk) + out.pop(ck)
            else:
                mask = is_hot[feature]
                order = torch.cat([torch.nonzero(mask).flatten(),
                                   torch.nonzero(~mask).flatten()])
                inverse = torch.empty_like(order)
                inverse[order] = torch.arange(order.numel(), device=order.device)
                out[feature] = torch.cat([out.pop(hk), out.pop(ck)])[inverse]
        return out


def _append(keys: List[str], vals: List[torch.Tensor], lens: List[torch.Tensor],
            wts: List[torch.Tensor], key: str, values: torch.Tensor, lengths: torch.Tensor,
            weights: Optional[torch.Tensor]) -> None:
    """One feature of :meth:`KJTRemap.split`'s output."""
    keys.append(key)
    vals.append(values)
    lens.append(lengths)
    if weights is not None:
        wts.append(weights)


class EmbeddingModules(nn.Module):
    """Embedding tables as TorchRec modules: ``ebc`` (an ``EmbeddingBagCollection``, SUM pooling),
    ``ec`` (an ``EmbeddingCollection``; the attribute names are :data:`MODULE_PATHS`, the module
    paths of every ``ShardingPlan`` built here) and ``plain`` (tables as plain ``nn.EmbeddingBag`` /
    ``nn.Embedding`` modules, which ``DistributedModelParallel`` leaves unsharded: it replicates
    them and DDP all-reduces their gradients, as TorchRec's data-parallel sharding does).

    ``forward(pooled, sequence=None)`` returns, per feature, the pooled ``[B, D]`` or the sequence
    ``[n, D]`` embeddings; ``sequence`` defaults to ``pooled`` (one KJT holding every feature).

    Parameters
    ----------
    pooled, sequence : list of EmbeddingBagConfig / EmbeddingConfig
        The tables of ``ebc`` and ``ec`` (either may be empty: the module is then None).
    plain : list of EmbeddingBagConfig or EmbeddingConfig
        Tables run as plain torch modules (bags: SUM pooling).
    is_weighted : bool
        Pooled inputs carry per-sample weights.
    device : str
        ``"cpu"``, or ``"meta"`` for ``DistributedModelParallel`` to materialize elsewhere.
    """

    def __init__(self, pooled: List[Any], sequence: List[Any], plain: List[Any] = (),
                 is_weighted: bool = False, device: str = "cpu"):
        super().__init__()
        dev = torch.device(device)
        self.ebc = EmbeddingBagCollection(list(pooled), is_weighted=is_weighted, device=dev) \
            if pooled else None
        self.ec = EmbeddingCollection(list(sequence), device=dev) if sequence else None
        self.is_weighted = is_weighted
        self.plain = nn.ModuleDict({c.name: _plain_module(c, dev) for c in plain})
        self.plain_feature = {c.name: c.feature_names[0] for c in plain}
        self.plain_pooled = {c.name: isinstance(c, EmbeddingBagConfig) for c in plain}

    def forward(self, pooled: Optional[KeyedJaggedTensor],
                sequence: Optional[KeyedJaggedTensor] = None) -> Dict[str, torch.Tensor]:
        sequence = pooled if sequence is None else sequence
        out: Dict[str, torch.Tensor] = {}
        if self.ebc is not None and pooled is not None:
            out.update(self.ebc(pooled).to_dict())
        if self.ec is not None and sequence is not None:
            out.update({k: jt.values() for k, jt in self.ec(sequence).items()})
        for name, module in self.plain.items():
            kjt = pooled if self.plain_pooled[name] else sequence
            if kjt is None:
                continue
            jt = kjt[self.plain_feature[name]]
            ids = jt.values().to(torch.int64)
            if self.plain_pooled[name]:
                w = jt.weights() if self.is_weighted else None
                out[self.plain_feature[name]] = module(ids, jt.offsets().to(torch.int64),
                                                       per_sample_weights=w)
            else:
                out[self.plain_feature[name]] = module(ids)
        return out


def _plain_module(config: Any, device: torch.device) -> nn.Module:
    """``nn.EmbeddingBag`` (SUM) or ``nn.Embedding`` for one table, initialized as TorchRec would
    (uniform in the config's ``weight_init_min`` .. ``weight_init_max``, by default
    ``±sqrt(1 / num_embeddings)``)."""
    if isinstance(config, EmbeddingBagConfig):
        m = nn.EmbeddingBag(config.num_embeddings, config.embedding_dim, mode="sum",
                            device=device)
    else:
        m = nn.Embedding(config.num_embeddings, config.embedding_dim, device=device)
    if device.type != "meta":
        bound = math.sqrt(1.0 / config.num_embeddings)     # TorchRec's default range
        lo = -bound if config.weight_init_min is None else config.weight_init_min
        hi = bound if config.weight_init_max is None else config.weight_init_max
        with torch.no_grad():
            m.weight.uniform_(lo, hi)
    return m


def exported_embeddings(export: "TorchRecExport | str | os.PathLike", device: str = "cpu",
                        is_weighted: bool = False,
                        dense_sequence_hot: Optional[bool] = None) -> EmbeddingModules:
    """The exported tables as :class:`EmbeddingModules`: ``forward`` takes :class:`KJTRemap`'s
    output. With ``dense_sequence_hot`` (default: on CPU and meta devices) the data-parallel tables
    of sequence features are plain ``nn.Embedding`` modules (``plain``): fbgemm-gpu-cpu 1.8's dense
    kernel pools sequence lookups, so TorchRec cannot run them on CPU, and DDP syncs a plain
    module exactly as TorchRec's data-parallel sharding would."""
    ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
    if dense_sequence_hot is None:
        dense_sequence_hot = torch.device(device).type in ("cpu", "meta")
    dp = {n for n, e in ex.sharding_plan_doc()["tables"].items()
          if e["sharding_type"] == "data_parallel"}
    configs = torchrec_embedding_configs(ex.path)
    pooled = [c for c in configs if isinstance(c, EmbeddingBagConfig)]
    seq = [c for c in configs if not isinstance(c, EmbeddingBagConfig)]
    plain = [c for c in seq if dense_sequence_hot and c.name in dp]
    return EmbeddingModules(pooled, [c for c in seq if c not in plain], plain, is_weighted,
                            device)


def exported_modules(path: "str | os.PathLike", *, device: str = "cuda",
                     is_weighted: bool = False, dense_sequence_hot: Optional[bool] = None
                     ) -> Tuple[KJTRemap, EmbeddingModules, Any]:
    """Everything a training script needs from an export directory: the :class:`KJTRemap`
    (for the data loader), the model (:func:`exported_embeddings` (built on ``"meta"`` for
    ``DistributedModelParallel`` to materialize on a GPU, on the CPU otherwise) and its
    ``ShardingPlan``."""
    ex = load_torchrec_export(path)
    if dense_sequence_hot is None:
        dense_sequence_hot = device == "cpu"
    model = exported_embeddings(ex, device="cpu" if device == "cpu" else "meta",
                                is_weighted=is_weighted, dense_sequence_hot=dense_sequence_hot)
    plan = torchrec_sharding_plan(ex.path, device=device, dense_sequence_hot=dense_sequence_hot)
    return KJTRemap(ex), model, plan
