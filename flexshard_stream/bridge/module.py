"""A drop-in for a model's ``EmbeddingBagCollection`` / ``EmbeddingCollection``, built from an
export, and the ``DistributedModelParallel`` for it in one call.

This module imports torch and torchrec at the top; the package imports it only where torch is
wanted (``bridge/world.py``, users' training scripts). What changes in a training script is its
construction (docs/TORCHREC_RUNTIME.md, "A drop-in module")::

    model.sparse = ExportedEmbeddingBagCollection("export/")     # was EmbeddingBagCollection(...)
    model.seq = ExportedEmbeddingCollection("export/")           # was EmbeddingCollection(...)
    dmp = build_dmp(model, "export/", device="cpu")              # pg from the env, plan, sharders
    for kjt in loader:                                           # original features and IDs
        ...model as before: a KeyedTensor / dict of JaggedTensor per original feature...

- :class:`ExportedEmbeddingBagCollection` (pooled tables) and
  :class:`ExportedEmbeddingCollection` (sequence tables) take the KJT the loader yields (original
  feature names, original or raw IDs: ``ids="hash"`` takes them modulo the table's rows), split it
  into the hot and cold features of the export (``KJTRemap.split``) inside ``forward``, look the
  rows up in the exported tables and merge them back (``KJTRemap.merge``): the result is what the
  original module returns, same keys in the same order. A KJT with a feature the module does not
  hold, or without one it holds, is refused (:class:`~flexshard_stream.errors.BatchError`).
- :func:`build_dmp`: the process group (given, the default one, or initialised from the
  environment), ``ShardingEnv``, the export's ``ShardingPlan`` at the module paths of the drop-in
  modules in the model, and the sharders with the fused optimizer (:func:`embedding_sharders`).
- :func:`load_table_weights`: full per-table weights into a module's (local shards of) tables.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec import (
    EmbeddingBagConfig,
    EmbeddingConfig,
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
)
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv

from ..errors import BatchError, ConfigError
from ..plans.tables import EmbeddingTable
from ..sources.ids import IdMode
from .export import (
    TorchRecExport,
    export_id_mode,
    load_torchrec_export,
    torchrec_embedding_configs,
    torchrec_sharding_plan,
)
from .loader import EmbeddingModules, KJTRemap
from .slots import LiveRemap, RemappedBatch, SlotMap, SlotState, slot_maps_of, split_live_rows
from .sharding import OPENED_SHARDING_TYPES, POOLED_MODULE, SEQUENCE_MODULE

__all__ = ["ExportedEmbeddingBagCollection", "ExportedEmbeddingCollection", "ExportedCollection",
           "build_dmp",
           "embedding_sharders", "CpuEmbeddingBagCollectionSharder", "FUSED_OPTIMIZERS",
           "fused_optimizer_of", "load_table_weights", "local_shards", "exported_collections"]

#: The fused optimizers :func:`embedding_sharders` offers, by name (fbgemm's ``EmbOptimType``).
FUSED_OPTIMIZERS = {"sgd": "EXACT_SGD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD"}
#: Optimizer state bytes per row (``EmbeddingTable.optimizer_state_bytes``) of each fused
#: optimizer for fp32 tables: what :func:`fused_optimizer_of` reads an export's optimizer from.
_STATE_BYTES = {0: "sgd", 4: "rowwise_adagrad"}
#: What ``torch.distributed`` needs in the environment to initialise the default group.
_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# ----------------------------------------------------------------------------- the drop-in module
class ExportedCollection(nn.Module):
    """The tables of one kind (``pooled`` / ``sequence``) of an export behind the interface of
    the TorchRec module they replace (see the subclasses). Of a live export (``hot_capacity``)
    it routes by its slot maps (``slot_maps``, ``live_version``; :mod:`.live` moves rows)."""

    kind = ""

    def __init__(self, export: "TorchRecExport | str | os.PathLike", *,
                 ids: "IdMode | str | None" = None, is_weighted: bool = False,
                 device: str = "cpu", dense_sequence_hot: Optional[bool] = None,
                 strict_version: bool = False):
        super().__init__()
        ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
        entries = [e for e in ex.manifest["tables"] if e["source_table"]["kind"] == self.kind]
        if not entries:
            raise ConfigError(f"{ex.path}: the export has no {self.kind} tables for a "
                              f"{type(self).__name__}")
        self.export = TorchRecExport(ex.path, dict(ex.manifest, tables=entries),
                                     {e["table"]: ex.remaps[e["table"]] for e in entries},
                                     {e["table"]: ex.hot_ids[e["table"]] for e in entries
                                      if e["table"] in ex.hot_ids})
        self.source_tables = [EmbeddingTable(**e["source_table"]) for e in entries]
        self.features = [t.feature for t in self.source_tables]
        self.other_features = [EmbeddingTable(**e["source_table"]).feature
                               for e in ex.manifest["tables"]
                               if e["source_table"]["kind"] != self.kind]
        self.id_mode = _id_mode(ex, ids)
        self.moduli = _moduli(self.source_tables, self.id_mode)
        if dense_sequence_hot is None:
            dense_sequence_hot = torch.device(device).type == "cpu"
        self.dense_sequence_hot = bool(dense_sequence_hot)
        self.is_weighted = bool(is_weighted) and self.kind == "pooled"
        self.strict_version = bool(strict_version)
        self.stale_batches = 0          # batches split under an older version, split again
        self.slot_maps: Dict[str, SlotMap] = slot_maps_of(self.export)
        self.remap = LiveRemap(self.export, self.slot_maps, 0) if self.export.live \
            else KJTRemap(self.export)
        if self.slot_maps:      # saved with the model's state: a checkpoint resumes on its plan
            self.live_state = SlotState(self.slot_maps)
        self.embeddings = _kind_embeddings(self.export, self.kind, device, self.is_weighted,
                                           self.dense_sequence_hot)

    # -------------------------------------------------------------- what the original module had
    def original_configs(self) -> List[Any]:
        """The ``EmbeddingBagConfig`` / ``EmbeddingConfig`` of the original tables (the module
        this one replaces, e.g. the unsharded reference), in export order."""
        cls = EmbeddingBagConfig if self.kind == "pooled" else EmbeddingConfig
        return [cls(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                    feature_names=[t.feature]) for t in self.source_tables]

    def load_original_weights(self, weights: Mapping[str, Any]) -> None:
        """Copy full weights of the original tables (table name -> float32[H, D], array or
        tensor) into the exported tables, before or after ``DistributedModelParallel`` sharded
        them (each rank copies its local shards). Tables not given are left as they are."""
        split: Dict[str, np.ndarray] = {}
        for t in self.source_tables:
            if t.name not in weights:
                continue
            w = _as_numpy(weights[t.name])
            if w.shape != (t.num_rows, t.dim):
                raise ConfigError(f"table {t.name!r}: weights must be float32[{t.num_rows}, "
                                  f"{t.dim}], got {list(w.shape)}")
            if t.name in self.slot_maps:
                split.update(split_live_rows(self.export, self.slot_maps[t.name], w))
            else:
                split.update(self.export.split_rows(t.name, w))
        load_table_weights(self, split)

    # -------------------------------------------------------------- live slots
    @property
    def live_version(self) -> int:
        """Version of the slot maps the module routes by (0 as exported; each applied delta
        adds one; always 0 for a static export)."""
        self._sync_slots()
        return int(getattr(self.remap, "version", 0))

    def _sync_slots(self) -> None:
        """Route by the slot maps of the module's state (``live_state``) when a loaded state
        dict brought another version (a checkpoint resumes on the plan it had)."""
        state = getattr(self, "live_state", None)
        if state is not None and state.version_of() != self.remap.version:
            maps = state.slot_maps(list(self.slot_maps), self.source_tables)
            self.slot_maps, self.remap = maps, LiveRemap(self.export, maps, state.version_of(),
                                                         like=self.remap)

    def swap_slots(self, slot_maps: Mapping[str, SlotMap], version: int) -> None:
        """Route by ``slot_maps`` (every live table's) from now on, as ``version``: the remap
        is replaced whole, in one assignment (:func:`flexshard_stream.bridge.live.apply_delta`
        calls this after moving the rows)."""
        if set(slot_maps) != set(self.slot_maps):
            raise ConfigError(f"slot maps for {sorted(slot_maps)}, the module's live tables "
                              f"are {sorted(self.slot_maps)}")
        remap = LiveRemap(self.export, slot_maps, version, like=self.remap)
        self.live_state.store(slot_maps, version)
        self.slot_maps, self.remap = dict(slot_maps), remap

    def remap_features(self, features: KeyedJaggedTensor) -> RemappedBatch:
        """``features`` split under the current version, for a DataLoader worker: ``forward``
        takes the result in place of the KJT (split again there if a delta came between)."""
        self._sync_slots()
        features, split, is_hot = self._split(features)
        return RemappedBatch(self.live_version, features, split, is_hot)

    # -------------------------------------------------------------- forward
    def _split(self, features: KeyedJaggedTensor
               ) -> Tuple[KeyedJaggedTensor, KeyedJaggedTensor, Dict[str, torch.Tensor]]:
        """The KJT in this module's feature order, its IDs as rows, and its split into the
        exported features (with ``is_hot`` per feature)."""
        features = self._in_order(features)
        features = self._as_rows(features)
        split, is_hot = self.remap.split(features)
        return features, split, is_hot

    def _in_order(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with exactly this module's features, in its order (permuted if needed:
        a sharded module reads the key order of its first batch); BatchError otherwise."""
        keys = list(features.keys())
        if keys == self.features:
            return features
        unknown = [k for k in keys if k not in self.features]
        missing = [f for f in self.features if f not in keys]
        if unknown or missing or len(keys) != len(self.features):
            raise BatchError(self._key_error(keys, unknown, missing))
        return features.permute([keys.index(f) for f in self.features])

    def _key_error(self, keys: List[str], unknown: List[str], missing: List[str]) -> str:
        where = f"{type(self).__name__} of export {self.export.path}"
        if unknown:
            other = [k for k in unknown if k in self.other_features]
            hint = (f"; {other} are the export's {'sequence' if self.kind == 'pooled' else 'pooled'}"
                    f" features (the other drop-in module takes them)") if other else ""
            return (f"{where}: the KJT has features {unknown} it does not hold (it holds "
                    f"{self.features}){hint}")
        if missing:
            return f"{where}: the KJT lacks features {missing} (it has {keys})"
        return f"{where}: the KJT repeats a feature ({keys})"

    def _as_rows(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Raw IDs taken modulo each table's rows (``ids="hash"``), or checked to be rows
        (``ids="raw"``); BatchError naming the feature for an ID out of range."""
        values = features.values()
        per_key = features.length_per_key()
        if self.id_mode.hashed:
            if max(self.moduli) >= 2**31:
                values = values.to(torch.int64)
            mod = torch.repeat_interleave(torch.tensor(self.moduli, dtype=values.dtype,
                                                       device=values.device),
                                          torch.tensor(per_key, device=values.device))
            return KeyedJaggedTensor(keys=features.keys(), values=torch.remainder(values, mod),
                                     lengths=features.lengths(),
                                     weights=features.weights_or_none(),
                                     stride=features.stride())
        start = 0
        for f, t, n in zip(self.features, self.source_tables, per_key):
            v = values[start:start + n]
            start += n
            if n and (int(v.min()) < 0 or int(v.max()) >= t.num_rows):
                raise BatchError(f"{type(self).__name__}: feature {f!r}: IDs must lie in "
                                 f"[0, {t.num_rows}) (ids='raw'), got {int(v.min())}.."
                                 f"{int(v.max())}; ids='hash' takes raw IDs modulo the rows")
        return features

    def _outputs(self, features: "KeyedJaggedTensor | RemappedBatch"
                 ) -> Tuple[KeyedJaggedTensor, Dict[str, torch.Tensor]]:
        """The KJT as read (order, rows) and the outputs per original feature; a
        :class:`RemappedBatch` of an older version is split again (BatchError with
        ``strict_version``)."""
        self._sync_slots()
        if isinstance(features, RemappedBatch):
            if features.version == self.live_version:
                return features.features, self.remap.merge(self.embeddings(features.split),
                                                            features.is_hot)
            if self.strict_version:
                raise BatchError(f"{type(self).__name__}: the batch was split under slot "
                                 f"version {features.version}, the module routes by version "
                                 f"{self.live_version} (strict_version: refused, not re-split)")
            self.stale_batches += 1
            features = features.features
        features, split, is_hot = self._split(features)
        return features, self.remap.merge(self.embeddings(split), is_hot)


class ExportedEmbeddingBagCollection(ExportedCollection):
    """The pooled tables of an export where a model's ``EmbeddingBagCollection`` was.

    ``forward(features)`` takes a KJT of the original pooled features (any order; original IDs,
    or raw IDs with ``ids="hash"``) and returns a ``KeyedTensor`` of ``[B, D]`` sums per feature,
    keys in export order, as the original module does; under :func:`build_dmp` the hot and cold
    tables are sharded as the export says.

    Parameters
    ----------
    export : TorchRecExport or path
        The export (``flexshard-stream export --out DIR``).
    ids : {"raw", "hash", "hash:ROWS"} or None
        How the KJT's IDs become rows (:class:`~flexshard_stream.sources.ids.IdMode`): ``raw``
        (they are rows, checked), ``hash`` (ID mod the table's rows), ``hash:ROWS``. Default:
        the mode the plan was made with (``plan --ids``), recorded in the export; raw when the
        plan records none. Another than the recorded one is used with a warning.
    is_weighted : bool
        The KJT carries per-sample weights (as ``EmbeddingBagCollection(is_weighted=True)``).
    device : str
        ``"cpu"``, or ``"meta"`` for ``DistributedModelParallel`` to materialize on a GPU.
    """

    kind = "pooled"

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        _, out = self._outputs(features)
        return KeyedTensor.from_tensor_list(self.features, [out[f] for f in self.features])

    def embedding_bag_configs(self) -> List[Any]:
        """The original tables' configs (``EmbeddingBagCollection``'s method)."""
        return self.original_configs()


class ExportedEmbeddingCollection(ExportedCollection):
    """The sequence tables of an export where a model's ``EmbeddingCollection`` was.

    ``forward(features)`` takes a KJT of the original sequence features and returns, per feature
    in export order, a ``JaggedTensor`` of ``[n, D]`` embeddings (one row per ID, in the KJT's
    order) with the KJT's lengths, as the original module does. Parameters as
    :class:`ExportedEmbeddingBagCollection` (no weights); ``dense_sequence_hot`` (default: on
    CPU) runs the replicated hot tables as plain ``nn.Embedding`` (docs/TORCHREC_EXPORT.md).
    """

    kind = "sequence"

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        features, out = self._outputs(features)
        lengths = features.lengths().view(-1, features.stride())
        return {f: JaggedTensor(values=out[f], lengths=lengths[i])
                for i, f in enumerate(self.features)}

    def embedding_configs(self) -> List[Any]:
        """The original tables' configs (``EmbeddingCollection``'s method)."""
        return self.original_configs()


def exported_collections(export: "TorchRecExport | str | os.PathLike", **kwargs: Any
                         ) -> Dict[str, ExportedCollection]:
    """The drop-in modules of every kind the export has: ``{"pooled": ..., "sequence": ...}``
    (keyword arguments as the classes')."""
    ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
    kinds = {e["source_table"]["kind"] for e in ex.manifest["tables"]}
    out: Dict[str, ExportedCollection] = {}
    if "pooled" in kinds:
        out["pooled"] = ExportedEmbeddingBagCollection(ex, **kwargs)
    if "sequence" in kinds:
        kw = {k: v for k, v in kwargs.items() if k != "is_weighted"}
        out["sequence"] = ExportedEmbeddingCollection(ex, **kw)
    return out


def _id_mode(export: TorchRecExport, ids: "IdMode | str | None") -> IdMode:
    """``ids``, else the ID mode the export records (raw when it records none); a given mode
    other than a recorded one is used with a warning (the plan's statistics saw the recorded
    one)."""
    recorded = export_id_mode(export)
    if ids is None:
        return recorded or IdMode()
    mode = IdMode.parse(ids)
    if recorded is not None and mode != recorded:
        warnings.warn(f"ids={str(mode)!r} differs from {str(recorded)!r}, the ID mode the plan of "
                      f"{export.path} was made with; the plan's statistics saw its rows",
                      stacklevel=3)
    return mode


def _moduli(tables: Sequence[EmbeddingTable], mode: IdMode) -> List[int]:
    """The modulus of each table's IDs under ``mode`` (its rows, or ``hash:ROWS``'s)."""
    if mode.rows is None:
        return [t.num_rows for t in tables]
    small = [t.name for t in tables if t.num_rows < mode.rows]
    if small:
        raise ConfigError(f"ids='{mode}': tables {small} have fewer than {mode.rows} rows")
    return [int(mode.rows)] * len(tables)


def _kind_embeddings(ex: TorchRecExport, kind: str, device: str, weighted: bool,
                     dense_sequence_hot: bool) -> EmbeddingModules:
    """The exported tables of one kind as :class:`EmbeddingModules` (``ebc`` or ``ec``, and the
    plain replicated sequence tables under ``plain`` with ``dense_sequence_hot``)."""
    names = {p["table"] for e in ex.manifest["tables"] for p in (e["hot"], e["cold"]) if p}
    dp = {n for n, e in ex.sharding_plan_doc()["tables"].items()
          if e["sharding_type"] == "data_parallel"}
    configs = [c for c in torchrec_embedding_configs(ex.path) if c.name in names]
    if kind == "pooled":
        return EmbeddingModules(configs, [], [], weighted, device)
    plain = [c for c in configs if dense_sequence_hot and c.name in dp]
    return EmbeddingModules([], [c for c in configs if c not in plain], plain, False, device)


def _as_numpy(w: Any) -> np.ndarray:
    if isinstance(w, torch.Tensor):
        w = w.detach().cpu().numpy()
    return np.ascontiguousarray(w, dtype=np.float32)


# ----------------------------------------------------------------------------- weights
def local_shards(module: nn.Module) -> Dict[str, List[Tuple[Tuple[int, int], torch.Tensor]]]:
    """Per state-dict entry: (row offset, column offset) and tensor of each local shard."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: Dict[str, List[Tuple[Tuple[int, int], torch.Tensor]]] = {}
    for name, t in module.state_dict().items():
        if isinstance(t, ShardedTensor):
            out[name] = [(tuple(s.metadata.shard_offsets), s.tensor) for s in t.local_shards()]
        elif isinstance(t, torch.Tensor):
            out[name] = [((0, 0), t)]
    return out


def load_table_weights(module: nn.Module, weights: Mapping[str, Any]) -> None:
    """Copy full weights (table name -> float32[H, D]) into every ``<...>.<table>.weight`` of
    ``module``'s state dict: whole tensors, or this rank's shards of a sharded table."""
    with torch.no_grad():
        for name, shards in local_shards(module).items():
            parts = name.split(".")
            if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in weights:
                continue
            full = torch.from_numpy(_as_numpy(weights[parts[-2]]))
            for (r0, c0), tensor in shards:
                tensor.copy_(full[r0:r0 + tensor.shape[0], c0:c0 + tensor.shape[1]])


# ----------------------------------------------------------------------------- sharders
class CpuEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """TorchRec's pooled sharder, offering row-wise and table-row-wise on CPU as well.

    TorchRec 1.8 lists them for ``cuda`` (and ``mtia``) only (``embedding_types.py``,
    ``BaseEmbeddingSharder.sharding_types``), so its planner refuses them on CPU
    (``planner/enumerators.py``: "No available sharding type and compute kernel combination").
    Their CPU code paths (fbgemm's CPU block bucketization, gloo's reduce-scatter) run; an
    explicit ``plan=`` reaches them with TorchRec's own sharder too (``DistributedModelParallel``
    does not check a plan against the sharder's list). Give this sharder to the planner."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(dict.fromkeys(super().sharding_types(compute_device_type)
                                  + list(OPENED_SHARDING_TYPES["pooled"])))


def _optim_type(optimizer: str) -> Any:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if optimizer not in FUSED_OPTIMIZERS:
        raise ConfigError(f"fused optimizer {optimizer!r}: expected one of "
                          f"{sorted(FUSED_OPTIMIZERS)}")
    return EmbOptimType[FUSED_OPTIMIZERS[optimizer]]


def embedding_sharders(optimizer: str = "sgd", learning_rate: float = 0.01, *,
                       open_row_wise: bool = True, **fused_params: Any) -> List[Any]:
    """The pooled and sequence sharders, their fused kernels on ``optimizer``
    (:data:`FUSED_OPTIMIZERS`) at ``learning_rate`` (fbgemm's default 0.01); ``fused_params``
    (e.g. ``eps``, ``weight_decay``) go to fbgemm as they are. ``open_row_wise``: the pooled
    sharder is :class:`CpuEmbeddingBagCollectionSharder`."""
    if not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
        raise ConfigError(f"learning_rate {learning_rate!r}: expected a number > 0")
    fused = dict(fused_params, optimizer=_optim_type(optimizer),
                 learning_rate=float(learning_rate))
    pooled = CpuEmbeddingBagCollectionSharder if open_row_wise else EmbeddingBagCollectionSharder
    return [pooled(fused_params=fused), EmbeddingCollectionSharder(fused_params=fused)]


def fused_optimizer_of(export: TorchRecExport) -> str:
    """The fused optimizer an export's tables were sized for, read from their optimizer state
    bytes per row (``optimizer_state_bytes``): 0 is SGD, 4 (one fp32 per row) row-wise
    Adagrad; ConfigError for anything else (name the optimizer)."""
    state = {int(e["source_table"].get("optimizer_state_bytes", 0))
             for e in export.manifest["tables"]}
    if len(state) != 1 or next(iter(state)) not in _STATE_BYTES:
        raise ConfigError(f"{export.path}: the tables keep {sorted(state)} bytes of optimizer "
                          f"state per row, no fused optimizer of {sorted(FUSED_OPTIMIZERS)} "
                          f"alone ({_STATE_BYTES}); give optimizer=")
    return _STATE_BYTES[next(iter(state))]


# ----------------------------------------------------------------------------- the DMP
def _dropins(model: nn.Module) -> Dict[str, ExportedCollection]:
    """Module path -> drop-in module of each kind in ``model``; ConfigError for none or two of
    a kind."""
    found = {path: m for path, m in model.named_modules()
             if isinstance(m, ExportedCollection)}
    if not found:
        raise ConfigError(f"{type(model).__name__} holds no ExportedEmbeddingBagCollection or "
                          f"ExportedEmbeddingCollection")
    for kind in ("pooled", "sequence"):
        paths = [p for p, m in found.items() if m.kind == kind]
        if len(paths) > 1:
            raise ConfigError(f"the model holds {len(paths)} drop-in modules of the {kind} "
                              f"tables ({paths}); the export's tables can be sharded once")
    return found


def _same_export(found: Mapping[str, ExportedCollection],
                 export: "TorchRecExport | str | os.PathLike | None") -> TorchRecExport:
    """The export the drop-in modules were built from (``export`` must be it if given: the same
    topology and table entries, remap checksums included)."""
    if export is None:
        export = next(iter(found.values())).export.path
    ex = export if isinstance(export, TorchRecExport) else load_torchrec_export(export)
    for path, m in found.items():
        if m.export.manifest["topology"] != ex.manifest["topology"] or \
                any(e not in ex.manifest["tables"] for e in m.export.manifest["tables"]):
            raise ConfigError(f"module {path or '(root)'} was built from export "
                              f"{m.export.path}, not {ex.path}")
    return ex


def _process_group(pg: Any, device: torch.device) -> Any:
    """``pg``, else the default group (initialised from the environment if need be)."""
    if pg is not None:
        return pg
    if not dist.is_initialized():
        missing = [v for v in _ENV_VARS if v not in os.environ]
        if missing:
            raise ConfigError(f"no process group given and none initialised; torch.distributed "
                              f"needs {missing} in the environment (torchrun sets them)")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.group.WORLD


def _device(device: "str | torch.device | None", local_world_size: int) -> torch.device:
    if device is not None:
        return torch.device(device)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    rank = int(os.environ.get("RANK", 0))
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % local_world_size)))


def _set_local_world_size(ex: TorchRecExport) -> None:
    """TorchRec reads the ranks per node from ``LOCAL_WORLD_SIZE`` (``comm.get_local_size``;
    torchrun sets it), else takes the whole world as one node and cuts table-row-wise tables
    wrongly: set it to the export's when absent, refuse another value."""
    local = int(ex.manifest["local_world_size"])
    have = os.environ.get("LOCAL_WORLD_SIZE")
    if have is None:
        os.environ["LOCAL_WORLD_SIZE"] = str(local)
    elif have.strip() != str(local):
        raise ConfigError(f"{ex.path} was exported for {local} ranks per node; "
                          f"LOCAL_WORLD_SIZE is {have!r}")


def _module_paths(found: Mapping[str, ExportedCollection]) -> Dict[str, str]:
    """Where the ``ShardingPlan`` puts each collection: inside its drop-in module."""
    out = {}
    for path, m in found.items():
        prefix = f"{path}.embeddings." if path else "embeddings."
        if m.kind == "pooled":
            out["EmbeddingBagCollection"] = prefix + POOLED_MODULE
        else:
            out["EmbeddingCollection"] = prefix + SEQUENCE_MODULE
    return out


def _plan(ex: TorchRecExport, found: Mapping[str, ExportedCollection],
          device: torch.device) -> Any:
    """The export's ``ShardingPlan`` at the drop-in modules' paths (tables of a kind no module
    holds left out)."""
    from torchrec.distributed.types import ShardingPlan

    seq = [m for m in found.values() if m.kind == "sequence"]
    dense_hot = seq[0].dense_sequence_hot if seq else device.type == "cpu"
    paths = _module_paths(found)
    plan = torchrec_sharding_plan(ex.path, device=device.type, module_paths=paths,
                                  dense_sequence_hot=dense_hot)
    return ShardingPlan({p: v for p, v in plan.plan.items() if p in paths.values()})


def build_dmp(model: nn.Module, export: "TorchRecExport | str | os.PathLike | None" = None, *,
              device: "str | torch.device | None" = None, pg: Any = None,
              optimizer: Optional[str] = None, learning_rate: float = 0.01,
              sharders: Optional[List[Any]] = None, **fused_params: Any
              ) -> DistributedModelParallel:
    """``DistributedModelParallel`` of a model holding drop-in modules, in one call.

    Parameters
    ----------
    model : nn.Module
        Holds one :class:`ExportedEmbeddingBagCollection` and / or one
        :class:`ExportedEmbeddingCollection` (at any module path), and anything else.
    export : TorchRecExport or path, optional
        The export; default the one the drop-in modules were built from (checked to be it).
    device : str or torch.device, optional
        Default ``cuda:<LOCAL_RANK>`` where CUDA is, else the CPU.
    pg : ProcessGroup, optional
        Default the default group, initialised from the environment (``RANK``, ``WORLD_SIZE``,
        ``MASTER_ADDR``, ``MASTER_PORT``; gloo on CPU, nccl on CUDA) if it is not yet.
    optimizer : {"sgd", "rowwise_adagrad"}, optional
        The fused optimizer of the sharded tables; default the one the export's tables were
        sized for (:func:`fused_optimizer_of`).
    learning_rate : float
        Its learning rate (fbgemm's default 0.01).
    sharders : list, optional
        Instead of :func:`embedding_sharders` (``optimizer`` and ``learning_rate`` then unused).
    **fused_params
        More fbgemm optimizer settings (``eps``, ``weight_decay``, ...).

    Raises
    ------
    ConfigError
        No drop-in module, two of a kind, another export, a world of another size than the
        export's (or ``LOCAL_WORLD_SIZE`` other than its ranks per node; set to it when
        absent), no process group and no environment to make one, an unknown optimizer.
    """
    found = _dropins(model)
    ex = _same_export(found, export)
    dev = _device(device, int(ex.manifest["local_world_size"]))
    group = _process_group(pg, dev)
    world = int(ex.manifest["world_size"])
    if group.size() != world:
        raise ConfigError(f"{ex.path} was exported for {world} ranks; the process group has "
                          f"{group.size()}")
    _set_local_world_size(ex)
    if sharders is None:
        sharders = embedding_sharders(optimizer or fused_optimizer_of(ex), learning_rate,
                                      **fused_params)
    return DistributedModelParallel(model, env=ShardingEnv.from_process_group(group),
                                    device=dev, plan=_plan(ex, found, dev), sharders=sharders)
