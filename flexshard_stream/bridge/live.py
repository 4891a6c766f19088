"""Live re-sharding: a :class:`~flexshard_stream.plans.delta.PlanDelta` applied inside a running
TorchRec job at a step boundary, without rebuilding the ``DistributedModelParallel``.

A live export (``export_torchrec(plan, out, hot_capacity="auto")``) gives every table with cold
rows a data-parallel hot table of fixed capacity (slots) and a cold table that keeps every row
(:mod:`flexshard_stream.bridge.slots`), so no delta changes a shape. :func:`apply_delta`, called
by every rank at the same step (between ``optimizer.step()`` and the next forward):

1. stages the move on each rank: per table, the rows the delta promotes into the hot tier
   (global replicas; node replicas too when the export folds them into the hot table) and the
   rows it demotes out of it, checked against the module's slot map (a delta whose base is not
   the live state is an ``IncompatibleError``), the new slot map (promoted rows in the lowest
   free slots, by ID; more rows than slots is a ``ConfigError`` with the numbers);
2. agrees: an ``all_reduce`` of each rank's status; if any rank failed, every rank raises and
   keeps its old plan (nothing was written);
3. gathers the promoted rows (weights, and the row-wise Adagrad state) from their cold owners:
   each owner fills its rows into a zero buffer, one ``all_reduce`` (sum) per table gives every
   rank all of them (exact: one non-zero term per row);
4. agrees again, then commits: each demoted row's hot copy (every rank holds it, DDP keeps the
   copies equal) is written by the owner of its cold row into its cold shard, the gathered rows
   into their slots, and the remap is swapped whole under the next version (the drop-in module
   re-splits a :class:`~flexshard_stream.bridge.slots.RemappedBatch` of an older version).

Rows whose placement changes only inside the cold tier (placed rows, node replicas exported as
cold) do not move: the cold layout is fixed at export (their lookups stay correct, on the GPU the
export gave them). A change of a table's cold function needs a new export and a rebuild
(``ConfigError``).

Optimizers (:func:`check_optimizers`): fused ``EXACT_SGD`` on the cold tables with plain SGD
(``torch.optim.SGD``, no momentum, no weight decay, or no dense optimizer) on the hot tables; fused
``EXACT_ROWWISE_ADAGRAD`` with :class:`RowWiseAdagrad` on the hot tables (the same update, dense;
its per-row state moves with the rows). Anything else is refused: its state would not move.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError, FlexShardError, IncompatibleError
from ..plans.delta import COLD_CODE, PlanDelta, TableDelta
from ..plans.plan import Plan
from ..plans.topology import Topology
from .module import ExportedCollection, local_shards
from .slots import SlotMap

__all__ = ["apply_delta", "ApplyReport", "TableMove", "RowWiseAdagrad", "check_optimizers",
           "gather_original_state", "live_delta", "broadcast_delta",
           "gather_original_weights", "live_modules"]


# ----------------------------------------------------------------------------- the optimizer
class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad on dense 2-d parameters (the hot tables): per row ``m += mean(g^2)``,
    ``w -= lr * g / (sqrt(m) + eps)``, fbgemm's ``EXACT_ROWWISE_ADAGRAD`` (no weight decay) on
    every row; a row with a zero gradient does not change. State ``momentum1``: float32[rows]."""

    def __init__(self, params: Any, lr: float = 0.01, eps: float = 1e-8):
        if not lr > 0 or not eps > 0:
            raise ConfigError(f"RowWiseAdagrad: lr and eps must be > 0, got {lr}, {eps}")
        super().__init__(params, {"lr": float(lr), "eps": float(eps)})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # noqa: D102 (torch's signature)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ConfigError(f"RowWiseAdagrad: parameters must be 2-d tables, got "
                                      f"{list(p.shape)}")
                m = self.state[p].setdefault("momentum1", torch.zeros(p.shape[0],
                                                                      dtype=torch.float32))
                g = p.grad.to_dense() if p.grad.is_sparse else p.grad
                m.add_(g.pow(2).mean(dim=1))
                p.sub_(group["lr"] * g / (m.sqrt() + group["eps"]).unsqueeze(1))


# ----------------------------------------------------------------------------- reports
@dataclass
class TableMove:
    """One table's part of a delta: rows promoted into slots, rows demoted out of them, their
    slots and cold indices, the slot map after; ``unmoved``: rows whose code changed inside the
    cold tier (not moved, see the module docstring)."""

    module: ExportedCollection
    table: str
    promote: np.ndarray
    demote: np.ndarray
    promote_slots: np.ndarray
    demote_slots: np.ndarray
    promote_cold: np.ndarray
    demote_cold: np.ndarray
    after: SlotMap
    unmoved: int
    _tensors: Optional[Dict[str, List[Tuple[int, torch.Tensor]]]] = None

    def module_tensors(self) -> Dict[str, List[Tuple[int, torch.Tensor]]]:
        """:func:`_table_tensors` of the module, read once per move."""
        if self._tensors is None:
            self._tensors = _table_tensors(self.module)
        return self._tensors


@dataclass
class ApplyReport:
    """What :func:`apply_delta` did: the version routed by afterwards, per table rows promoted,
    demoted and left in the cold tier, the changed tables no module of the model holds (not
    moved: nothing looks them up), rows moved in all and the seconds it took."""

    version: int
    tables: Dict[str, Dict[str, int]] = field(default_factory=dict)
    not_held: List[str] = field(default_factory=list)
    rows_moved: int = 0
    seconds: float = 0.0


# ----------------------------------------------------------------------------- finding tensors
def live_modules(model: nn.Module) -> List[ExportedCollection]:
    """The drop-in modules of live exports in ``model`` (a DMP or the model itself)."""
    return [m for m in model.modules() if isinstance(m, ExportedCollection) and m.slot_maps]


def _table_tensors(module: nn.Module) -> Dict[str, List[Tuple[int, torch.Tensor]]]:
    """Exported table name -> (first row, tensor) of each local shard of its weight."""
    out: Dict[str, List[Tuple[int, torch.Tensor]]] = {}
    for name, shards in local_shards(module).items():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-1] == "weight":
            out.setdefault(parts[-2], []).extend((int(o[0]), t) for o, t in shards)
    return out


def _fused_states(module: nn.Module) -> Dict[str, List[Tuple[int, torch.Tensor]]]:
    """Exported cold table -> (first row, tensor) of each local shard of its row-wise Adagrad
    ``momentum1`` (fbgemm's fused state; empty under SGD)."""
    out: Dict[str, List[Tuple[int, torch.Tensor]]] = {}
    for sub in module.modules():
        opt = getattr(sub, "fused_optimizer", None)
        if opt is None or sub is module:
            continue
        for key, state in opt.state_dict()["state"].items():
            for sk, st in state.items():
                if not sk.endswith("momentum1"):
                    continue
                table = key.split(".")[-2] if key.endswith(".weight") else key.split(".")[-1]
                shards = st.local_shards() if hasattr(st, "local_shards") else None
                if shards is None:
                    out.setdefault(table, []).append((0, st))
                else:
                    out.setdefault(table, []).extend(
                        (int(s.metadata.shard_offsets[0]), s.tensor) for s in shards)
        break
    return out


def _hot_param(module: ExportedCollection, hot_table: str,
               tensors: Optional[Dict[str, List[Tuple[int, torch.Tensor]]]] = None
               ) -> torch.Tensor:
    """The (replicated) weight of a hot table: one whole local tensor."""
    shards = (tensors if tensors is not None else _table_tensors(module)).get(hot_table, [])
    if len(shards) != 1 or shards[0][0] != 0:
        raise ConfigError(f"hot table {hot_table!r}: expected one whole replicated weight, "
                          f"found {len(shards)} shards")
    return shards[0][1]


# ----------------------------------------------------------------------------- optimizers
def _cold_tables_here(module: ExportedCollection) -> List[str]:
    """The module's live cold tables of which this rank holds a shard."""
    tensors = _table_tensors(module)
    return [module.export.entry(t)["cold"]["table"] for t in module.slot_maps
            if tensors.get(module.export.entry(t)["cold"]["table"])]


def check_optimizers(model: nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> str:
    """The optimizer pair a live move supports, named (``"sgd"`` / ``"rowwise_adagrad"``), else
    ConfigError: fused ``EXACT_SGD`` with ``optimizer`` None or ``torch.optim.SGD`` without
    momentum, weight decay or Nesterov on the hot tables; fused ``EXACT_ROWWISE_ADAGRAD`` with
    :class:`RowWiseAdagrad` on them (its state moves with the rows). The pair is named by
    ``optimizer`` and checked against the fused state of the cold shards this rank holds (the
    same answer on every rank of one job, whichever shards it holds)."""
    modules = live_modules(model)
    kind = "rowwise_adagrad" if isinstance(optimizer, RowWiseAdagrad) else "sgd"
    held = [t for m in modules for t in _cold_tables_here(m)]
    stateful = [t for m in modules for t in _fused_states(m) if t in held]
    if kind == "rowwise_adagrad":
        if held and len(stateful) < len(held):
            raise ConfigError(f"RowWiseAdagrad on the hot tables needs fused row-wise Adagrad "
                              f"on the cold ones; cold tables {sorted(set(held) - set(stateful))} "
                              f"keep no momentum1 (build_dmp(optimizer='rowwise_adagrad'))")
        return kind
    if stateful:
        raise ConfigError(f"the cold tables {stateful} run fused row-wise Adagrad: give the hot "
                          f"tables' RowWiseAdagrad (flexshard_stream.bridge.live) as optimizer=, "
                          f"got {type(optimizer).__name__}")
    if kind == "sgd":
        if optimizer is None or (type(optimizer) is torch.optim.SGD and all(
                not g.get("momentum") and not g.get("weight_decay") and not g.get("nesterov")
                for g in optimizer.param_groups)):
            return kind
        raise ConfigError(f"live moves under fused SGD need plain SGD (no momentum, no weight "
                          f"decay) or no optimizer on the hot tables, got "
                          f"{type(optimizer).__name__}: its state would not move with the rows")
    return kind


def _hot_state(optimizer: Optional[torch.optim.Optimizer], param: torch.Tensor
               ) -> Optional[torch.Tensor]:
    """The RowWiseAdagrad ``momentum1`` of a hot weight (made, zero, if the optimizer has not
    stepped it yet); None without state. The hot weight is matched by storage."""
    if not isinstance(optimizer, RowWiseAdagrad):
        return None
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.data_ptr() == param.data_ptr() and p.shape == param.shape:
                return optimizer.state[p].setdefault(
                    "momentum1", torch.zeros(p.shape[0], dtype=torch.float32))
    raise ConfigError(f"the RowWiseAdagrad given does not hold the hot table of shape "
                      f"{list(param.shape)}")


# ----------------------------------------------------------------------------- staging
def _hot_codes(codes: np.ndarray, node_hot: bool) -> np.ndarray:
    """Whether each placement code puts its row in the hot table."""
    node = (codes <= -2) & (codes != COLD_CODE)
    return (codes == -1) | (node & node_hot)


def _stage_table(module: ExportedCollection, td: TableDelta, node_hot: bool) -> TableMove:
    """One table's move, checked against the module's slot map (nothing changed)."""
    name = td.name
    if td.cold_changed:
        raise ConfigError(f"table {name!r}: the delta changes its cold function "
                          f"({td.cold_old.kind} -> {td.cold_new.kind}); the cold layout is "
                          f"fixed at export: export the new plan and rebuild")
    old_hot, new_hot = _hot_codes(td.old_codes, node_hot), _hot_codes(td.new_codes, node_hot)
    promote, demote = td.ids[~old_hot & new_hot], td.ids[old_hot & ~new_hot]
    current = module.slot_maps[name]
    already, absent = promote[current.slot_of(promote) >= 0], demote[current.slot_of(demote) < 0]
    if already.size or absent.size:
        raise IncompatibleError(
            f"table {name!r}: the delta's base is not the live state (version "
            f"{module.live_version}): rows {already[:5].tolist()} to promote are hot already, "
            f"rows {absent[:5].tolist()} to demote are not hot")
    after, got = current.moved(demote, promote)
    cold = module.export.remaps[name]
    return TableMove(module, name, promote, demote, got, current.slot_of(demote),
                     cold.apply(promote), cold.apply(demote), after,
                     int(td.ids.size - promote.size - demote.size))


def _stage(modules: List[ExportedCollection], delta: PlanDelta) -> List[TableMove]:
    """Every table's move (ConfigError / IncompatibleError for a delta that cannot apply);
    tables of the export that no module of the model holds are left out (not looked up)."""
    if not isinstance(delta, PlanDelta):
        raise ConfigError(f"apply_delta needs a PlanDelta, got {type(delta).__name__}")
    if not modules:
        raise ConfigError("the model holds no drop-in module of a live export (export with "
                          "hot_capacity=...; a static export keeps no free hot slots)")
    ex = modules[0].export
    if Topology.from_dict(ex.manifest["topology"]) != delta.topology:
        raise IncompatibleError(f"the delta is for another topology than export {ex.path}")
    owner = {t: m for m in modules for t in m.slot_maps}
    static = {e["table"] for m in modules for e in m.export.manifest["tables"]}
    node_hot = ex.manifest.get("node_replicas") == "hot"
    moves = []
    for name, td in delta.tables.items():
        if td.is_empty:
            continue
        if name in owner:
            moves.append(_stage_table(owner[name], td, node_hot))
        elif name not in static:
            continue        # no module of the model looks it up: nothing to route or move
        elif td.cold_changed or _hot_codes(np.concatenate([td.old_codes, td.new_codes]),
                                           node_hot).any():
            raise ConfigError(f"table {name!r} has no hot slots in the export (not live, or "
                              f"data-parallel whole): the delta's moves of it need a rebuild")
    return moves


# ----------------------------------------------------------------------------- agreement
def _group(pg: Any) -> Any:
    if pg is not None:
        return pg
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def _agree(err: Optional[BaseException], pg: Any, what: str, version: int,
           failed: Optional[List[int]] = None) -> None:
    """Raise on every rank if any rank failed ``what`` (its own error on a failed rank, a
    ConfigError naming the failed ranks on the others); ``failed``: the ranks, already
    agreed (else one ``all_reduce`` of a flag per rank)."""
    if failed is None:
        failed = [0] if err is not None else []
        if pg is not None:
            flags = torch.zeros(dist.get_world_size(pg), dtype=torch.int32)
            flags[dist.get_rank(pg)] = int(err is not None)
            dist.all_reduce(flags, group=pg)
            failed = torch.nonzero(flags).flatten().tolist()
    if err is not None:
        raise err
    if failed:
        raise ConfigError(f"apply_delta: rank(s) {failed} failed to {what}; every rank stays "
                          f"on version {version}")


# ----------------------------------------------------------------------------- the move
def _fill_owned(buf: torch.Tensor, cold_idx: np.ndarray,
                shards: List[Tuple[int, torch.Tensor]], cols: slice) -> None:
    """Copy the rows at ``cold_idx`` this rank owns from its shards into ``buf[:, cols]``."""
    idx = torch.from_numpy(cold_idx)
    for r0, t in shards:
        mine = (idx >= r0) & (idx < r0 + t.shape[0])
        if bool(mine.any()):
            rows = (idx[mine] - r0).long()
            v = t[rows]
            buf[mine, cols] = v if v.dim() == 2 else v.unsqueeze(1)


def _write_owned(values: torch.Tensor, cold_idx: np.ndarray,
                 shards: List[Tuple[int, torch.Tensor]]) -> None:
    """Write ``values[k]`` into cold row ``cold_idx[k]`` where this rank owns it."""
    idx = torch.from_numpy(cold_idx)
    for r0, t in shards:
        mine = (idx >= r0) & (idx < r0 + t.shape[0])
        if bool(mine.any()):
            v = values[mine]
            t[(idx[mine] - r0).long()] = v if t.dim() == 2 else v.reshape(-1)


def _names(mv: TableMove) -> Tuple[str, str]:
    e = mv.module.export.entry(mv.table)
    return e["hot"]["table"], e["cold"]["table"]


def _gather(moves: List[TableMove], adagrad: bool, pg: Any
            ) -> Tuple[List[torch.Tensor], Optional[BaseException], List[int]]:
    """Per move, the promoted rows (``[P, D]``, then the Adagrad state column) from their cold
    owners, on every rank, and the ranks that failed to read theirs: one ``all_reduce`` (sum)
    of every table's rows behind a flag per rank (every rank calls it, even after a local
    failure, which is returned for the agreement)."""
    world = dist.get_world_size(pg) if pg is not None else 1
    dims = [int(mv.module.export.entry(mv.table)["source_table"]["dim"]) + int(adagrad)
            for mv in moves]
    sizes = [mv.promote.size * d for mv, d in zip(moves, dims)]
    flat = torch.zeros(world + sum(sizes), dtype=torch.float32)
    bufs = [b.view(mv.promote.size, d) for b, mv, d in
            zip(torch.split(flat[world:], sizes), moves, dims)]
    err = None
    for mv, buf, d in zip(moves, bufs, dims):
        cold = _names(mv)[1]
        try:
            _fill_owned(buf, mv.promote_cold, mv.module_tensors().get(cold, []),
                        slice(0, d - int(adagrad)))
            if adagrad:
                _fill_owned(buf, mv.promote_cold, _fused_states(mv.module).get(cold, []),
                            slice(d - 1, d))
        except (RuntimeError, IndexError, ValueError) as e:
            err = err or ConfigError(f"table {mv.table!r}: reading the promoted rows failed "
                                     f"({type(e).__name__}: {e})")
    flat[dist.get_rank(pg) if pg is not None else 0] = float(err is not None)
    if pg is not None:
        dist.all_reduce(flat, group=pg)
    failed = torch.nonzero(flat[:world]).flatten().tolist()
    return bufs, err, failed


def _commit(mv: TableMove, rows: torch.Tensor, optimizer: Optional[torch.optim.Optimizer]
            ) -> None:
    """Demoted rows back to their cold owners, the gathered rows into their slots."""
    hot, cold = _names(mv)
    w = _hot_param(mv.module, hot, mv.module_tensors())
    m = _hot_state(optimizer, w)
    dim = w.shape[1]
    ds, ps = torch.from_numpy(mv.demote_slots), torch.from_numpy(mv.promote_slots)
    with torch.no_grad():
        _write_owned(w[ds].clone(), mv.demote_cold, mv.module_tensors().get(cold, []))
        if m is not None:
            _write_owned(m[ds].clone(), mv.demote_cold, _fused_states(mv.module).get(cold, []))
            m[ds] = 0.0
            m[ps] = rows[:, dim]
        w[ps] = rows[:, :dim]


def apply_delta(model: nn.Module, delta: PlanDelta, *,
                optimizer: Optional[torch.optim.Optimizer] = None, pg: Any = None
                ) -> ApplyReport:
    """Apply ``delta`` to the live drop-in modules of ``model`` (a DMP from ``build_dmp``, or
    the unsharded model) at a step boundary; every rank calls it at the same step with the same
    delta (see the module docstring for what moves and how ranks agree).

    Parameters
    ----------
    model : nn.Module
        Holds the drop-in modules of a live export (``hot_capacity``).
    delta : PlanDelta
        From the plan the modules route by now (their slot maps) to the next.
    optimizer : torch.optim.Optimizer, optional
        The hot tables' optimizer (:func:`check_optimizers`): its state moves with the rows.
    pg : ProcessGroup, optional
        Default the default group (none: one process, no collectives).

    Raises
    ------
    ConfigError
        A delta over a table's hot capacity (the numbers named), a cold function change, an
        optimizer whose state cannot move, or another rank's failure. Nothing is changed.
    IncompatibleError
        The delta's base is not the live state, or another topology.
    """
    t0 = time.perf_counter()
    modules, group = live_modules(model), _group(pg)
    version = max((m.live_version for m in modules), default=0)
    err: Optional[BaseException] = None
    moves: List[TableMove] = []
    kind = "sgd"
    try:
        kind = check_optimizers(model, optimizer)
        moves = _stage(modules, delta)
        for mv in moves:                       # the hot state exists before anything moves
            _hot_state(optimizer, _hot_param(mv.module, _names(mv)[0], mv.module_tensors()))
    except FlexShardError as e:
        err = e
    _agree(err, group, "stage the delta", version)
    rows, err, failed = _gather(moves, kind == "rowwise_adagrad", group)
    _agree(err, group, "gather the promoted rows", version, failed)
    for mv, r in zip(moves, rows):
        _commit(mv, r, optimizer)
    report = ApplyReport(version + 1)
    for m in modules:
        after = {mv.table: mv.after for mv in moves if mv.module is m}
        m.swap_slots({t: after.get(t, s) for t, s in m.slot_maps.items()}, version + 1)
    for mv in moves:
        report.tables[mv.table] = {"promoted": int(mv.promote.size),
                                   "demoted": int(mv.demote.size), "unmoved": mv.unmoved}
        report.rows_moved += int(mv.promote.size + mv.demote.size)
    held = {e["table"] for m in modules for e in m.export.manifest["tables"]}
    report.not_held = [n for n, td in delta.tables.items() if not td.is_empty and n not in held]
    report.seconds = time.perf_counter() - t0
    return report


# ----------------------------------------------------------------------------- reading back
def _full_table(shards: List[Tuple[int, torch.Tensor]], rows: int, dim: int, pg: Any
                ) -> torch.Tensor:
    """A sharded table whole on every rank (sum of each rank's shards: O(rows) memory)."""
    full = torch.zeros(rows, dim, dtype=torch.float32)
    for r0, t in shards:
        full[r0:r0 + t.shape[0]] = t.detach().reshape(t.shape[0], -1)
    if pg is not None:
        dist.all_reduce(full, group=pg)
    return full


def gather_original_weights(model: nn.Module, pg: Any = None) -> Dict[str, np.ndarray]:
    """Every live table's weights on its original rows (float32[H, D]), on every rank: the cold
    table gathered (an ``all_reduce``: ``O(H D)``, for tests and checks), the rows in hot slots
    from the hot table. Collective: every rank calls it."""
    group = _group(pg)
    out = {}
    for m in live_modules(model):
        tensors = _table_tensors(m)
        for name, sm in m.slot_maps.items():
            e = m.export.entry(name)
            H, D = int(e["source_table"]["num_rows"]), int(e["source_table"]["dim"])
            cold = _full_table(tensors.get(e["cold"]["table"], []), H, D, group).numpy()
            w = cold[m.export.remaps[name].apply(np.arange(H, dtype=np.int64))]
            held = np.flatnonzero(sm.slots >= 0)
            if held.size:
                hot = _hot_param(m, e["hot"]["table"]).detach().numpy()
                w[sm.slots[held]] = hot[held]
            out[name] = w
    return out


def gather_original_state(model: nn.Module, optimizer: Optional[torch.optim.Optimizer],
                          pg: Any = None) -> Dict[str, np.ndarray]:
    """Every live table's row-wise Adagrad ``momentum1`` on its original rows (float32[H]), on
    every rank: the cold tables' fused state gathered, the slots' from ``optimizer`` (a
    :class:`RowWiseAdagrad`). Empty under SGD. Collective, ``O(H)``: for tests and checks."""
    group = _group(pg)
    out = {}
    for m in live_modules(model):
        states = _fused_states(m)
        if not states:
            continue
        for name, sm in m.slot_maps.items():
            e = m.export.entry(name)
            H = int(e["source_table"]["num_rows"])
            cold = _full_table(states.get(e["cold"]["table"], []), H, 1, group).numpy()[:, 0]
            s = cold[m.export.remaps[name].apply(np.arange(H, dtype=np.int64))]
            held = np.flatnonzero(sm.slots >= 0)
            if held.size:
                hot = _hot_state(optimizer, _hot_param(m, e["hot"]["table"]))
                s[sm.slots[held]] = hot.numpy()[held]
            out[name] = s
    return out


# ----------------------------------------------------------------------------- the hand-off
def live_delta(current: Plan, target: Plan, *, node_hot: bool = True) -> PlanDelta:
    """The part of the move ``current`` -> ``target`` (e.g. a re-sharder's decision) that a live
    job applies: per table, the target's hot rows (global replicas, and node replicas with
    ``node_hot``, the export's ``node_replicas="hot"``) become ``current``'s global replicas,
    everything else of ``current`` stays (its cold function; its placed rows, less those now
    hot). Data-parallel tables are left as they are. Same topology and tables, else
    IncompatibleError (from ``PlanDelta.between``)."""
    tps = []
    for name, tp in current.tables.items():
        tt = target.tables.get(name)
        if tt is None or tp.replicated or tt.replicated:
            tps.append(tp)
            continue
        hot = np.union1d(tt.global_ids, tt.node_ids) if node_hot else tt.global_ids
        keep = ~np.isin(tp.placed_ids, hot)
        tps.append(dataclasses.replace(
            tp, global_ids=hot, node_ids=np.zeros(0, np.int64),
            node_local=np.zeros(0, np.int32), placed_ids=tp.placed_ids[keep],
            placed_gpus=tp.placed_gpus[keep]))
    return PlanDelta.between(current, Plan(current.strategy, current.topology, tps,
                                           dict(current.meta)))


def broadcast_delta(delta: Optional[PlanDelta], src: int = 0, pg: Any = None
                    ) -> Optional[PlanDelta]:
    """``delta`` of rank ``src`` (its bytes, ``PlanDelta.to_bytes``) on every rank (None
    stays None): how one rank's sidecar or re-sharder offers a delta that every rank then
    applies at the same step. Collective; one process: ``delta`` itself."""
    group = _group(pg)
    if group is None:
        return delta
    box = [None if delta is None else delta.to_bytes()]
    dist.broadcast_object_list(box, src=src, group=group)
    return None if box[0] is None else PlanDelta.from_bytes(box[0], f"rank {src}'s delta")
