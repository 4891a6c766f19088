"""The hot slots of a live export and the versioned remap that reads them (torch at the top).

A live export (``export_torchrec(..., hot_capacity=...)``) gives every table with cold rows a hot
table of ``capacity`` slots and a cold table holding *every* row (its cold index: the export's
:class:`~flexshard_stream.bridge.remap.IdRemap`, fixed for the life of the job). Which rows sit in
the slots changes at run time (:mod:`flexshard_stream.bridge.live`); this module holds that
state:

- :class:`SlotMap`: one table's slots (``slots[s]``: the original row in slot ``s``, -1 free),
  numpy, immutable (a move makes a new one);
- :class:`LiveRemap`: the ``KJTRemap`` of a set of slot maps: a row in a slot goes to
  ``<feature>__hot`` at its slot, every other row to ``<feature>__cold`` at its cold index. It
  carries the ``version`` of the slot maps it was built from; the drop-in module swaps a new
  one in, whole, when a delta is applied;
- :class:`RemappedBatch`: a KJT split under one version (e.g. in a DataLoader worker, by the
  drop-in module's ``remap_features``), with the original KJT, so that a batch split under an
  older version is split again (or refused with ``strict``), never looked up in the wrong rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torchrec import KeyedJaggedTensor

from ..errors import ConfigError
from .export import TorchRecExport
from .loader import KJTRemap, remap_arrays, remap_ids

__all__ = ["SlotMap", "LiveRemap", "RemappedBatch", "SlotState", "slot_maps_of",
           "split_live_rows"]


@dataclass(frozen=True, eq=False)
class SlotMap:
    """The hot slots of one live table.

    Attributes
    ----------
    table : str
        The original table.
    slots : ndarray of int64, shape (capacity,)
        Original row held by each slot, -1 for a free slot.
    """

    table: str
    slots: np.ndarray

    def __post_init__(self) -> None:
        s = np.ascontiguousarray(self.slots, dtype=np.int64).ravel()
        slot = np.flatnonzero(s >= 0).astype(np.int64)
        order = np.argsort(s[slot], kind="stable")
        rows = s[slot][order]
        if rows.size > 1 and np.any(rows[1:] == rows[:-1]):
            raise ConfigError(f"table {self.table!r}: a row sits in two hot slots")
        object.__setattr__(self, "slots", s)
        object.__setattr__(self, "_pairs", (rows, slot[order]))

    @property
    def capacity(self) -> int:
        """Hot slots (rows of ``<table>__hot``)."""
        return int(self.slots.size)

    @property
    def used(self) -> int:
        """Slots holding a row."""
        return int(np.count_nonzero(self.slots >= 0))

    def hot_ids(self) -> np.ndarray:
        """Rows in the slots, sorted (int64)."""
        return self._pairs[0].copy()  # type: ignore[attr-defined]

    def sorted_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, their slots)`` by row: what the remap searches (computed once)."""
        return self._pairs  # type: ignore[attr-defined]

    def slot_of(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each row (int64; -1 for a row not in a slot)."""
        rows, slot = self.sorted_pairs()
        ids = np.asarray(ids, np.int64)
        out = np.full(ids.size, -1, np.int64)
        if rows.size and ids.size:
            p = np.minimum(np.searchsorted(rows, ids), rows.size - 1)
            hit = rows[p] == ids
            out[hit] = slot[p[hit]]
        return out

    def moved(self, demote: np.ndarray, promote: np.ndarray) -> tuple["SlotMap", np.ndarray]:
        """The slot map after freeing the slots of ``demote`` and putting ``promote`` (sorted)
        into the lowest free slots; and the slot each promoted row gets. ConfigError when they
        do not fit (the numbers named)."""
        slots = self.slots.copy()
        slots[self.slot_of(demote)] = -1
        free = np.flatnonzero(slots < 0)
        if promote.size > free.size:
            raise ConfigError(
                f"table {self.table!r}: the delta does not fit the hot capacity: {self.used} "
                f"rows hot - {demote.size} demoted + {promote.size} promoted = "
                f"{self.used - demote.size + promote.size} > {self.capacity} slots "
                f"(export with a larger hot_capacity)")
        got = free[:promote.size].astype(np.int64)
        slots[got] = promote
        return SlotMap(self.table, slots), got


def slot_maps_of(export: TorchRecExport) -> Dict[str, SlotMap]:
    """The slot maps an export starts with: per live table its plan's hot rows in the first
    slots (by ID), the other slots free."""
    out = {}
    for e in export.manifest["tables"]:
        if not e.get("live"):
            continue
        ids = export.hot_ids[e["table"]]
        slots = np.full(int(e["live"]["hot_capacity"]), -1, np.int64)
        slots[:ids.size] = ids
        out[e["table"]] = SlotMap(e["table"], slots)
    return out


class LiveRemap(KJTRemap):
    """``KJTRemap`` of a live export under one set of slot maps (``version``): a row in a hot
    slot gets new index ``slot`` (``<feature>__hot``), any other row ``capacity + cold index``
    (``<feature>__cold`` at its cold index); static tables of the export as ``KJTRemap``.
    Built whole for each version; ``split`` and ``merge`` are ``KJTRemap``'s."""

    def __init__(self, export: TorchRecExport, slot_maps: Mapping[str, SlotMap], version: int,
                 like: "LiveRemap | None" = None):
        """``like``: a remap of the same export whose cold arrays (fixed for the job) are
        shared instead of copied again."""
        nn.Module.__init__(self)
        self.version = int(version)
        self.index: Dict[str, int] = {}
        self.hot_key: List[str] = []
        self.cold_key: List[str] = []
        self.hot_rows: List[int] = []
        self.num_rows: List[int] = []
        self.pooled: List[bool] = []
        self.live: List[bool] = []
        self._arrays: List[Sequence[torch.Tensor]] = []
        for e in export.manifest["tables"]:
            self._add_table_keys(e)
            self.live.append(bool(e.get("live")))
            cold = list(like._arrays[len(self._arrays)][:4]) if like is not None else \
                [torch.from_numpy(a) for a in remap_arrays(export.remaps[e["table"]])]
            hot: List[torch.Tensor] = []
            if e.get("live"):
                hot = [torch.from_numpy(a) for a in slot_maps[e["table"]].sorted_pairs()]
            self._arrays.append(cold + hot)
        self.keep_int32 = max(self.num_rows, default=0) <= 2**31

    def table_ids(self, j: int, ids: torch.Tensor) -> torch.Tensor:
        """New index of original IDs of the ``j``-th table under this version's slots."""
        a = self._arrays[j]
        cold = remap_ids(ids, a[0], a[1], a[2], a[3], self.num_rows[j])
        if not self.live[j]:
            return cold
        rows, slot = a[4], a[5]
        x = ids.to(torch.int64)
        if rows.numel() == 0:
            return cold + self.hot_rows[j]
        p = torch.searchsorted(rows, x).clamp(max=rows.numel() - 1)
        return torch.where(rows[p] == x, slot[p], cold + self.hot_rows[j])


@dataclass(frozen=True, eq=False)
class RemappedBatch:
    """A KJT split by the :class:`LiveRemap` of ``version`` (``split``, ``is_hot``), with the
    KJT it came from (``features``: this module's features in its order, IDs as rows). The
    drop-in module's ``forward`` takes one in place of a KJT: the current version is used as
    it is; an older one is split again from ``features`` (or refused with ``strict``)."""

    version: int
    features: KeyedJaggedTensor
    split: KeyedJaggedTensor
    is_hot: Dict[str, torch.Tensor]

    def to(self, device: Any) -> "RemappedBatch":
        return RemappedBatch(self.version, self.features.to(device), self.split.to(device),
                             {k: v.to(device) for k, v in self.is_hot.items()})


def split_live_rows(export: TorchRecExport, slot_map: SlotMap, rows: np.ndarray
                    ) -> Dict[str, np.ndarray]:
    """Per-row data of a live table (``rows[id]``: weights, optimizer state) as its exported
    tables hold it under ``slot_map``: ``<table>__hot`` the rows in the slots (zeros in the
    free ones), ``<table>__cold`` every row at its cold index. ``O(H)``."""
    e = export.entry(slot_map.table)
    remap = export.remaps[e["table"]]
    out = {e["cold"]["table"]: rows[remap.original(np.arange(remap.num_rows, dtype=np.int64))]}
    if e["hot"] is not None:
        hot = np.zeros((slot_map.capacity,) + rows.shape[1:], rows.dtype)
        held = slot_map.slots >= 0
        hot[held] = rows[slot_map.slots[held]]
        out[e["hot"]["table"]] = hot
    return out


class SlotState(nn.Module):
    """The slot maps and their version as persistent buffers (``version``: int64 scalar;
    ``slots_<i>``: int64[capacity] of the ``i``-th live table, export order), so they are saved
    with the model's state and a loaded state dict brings them back (the drop-in module routes
    by them from its next forward). Fixed shapes: loading never reallocates."""

    def __init__(self, slot_maps: Mapping[str, SlotMap]):
        super().__init__()
        self.register_buffer("version", torch.zeros((), dtype=torch.int64))
        for i, sm in enumerate(slot_maps.values()):
            self.register_buffer(f"slots_{i}", torch.from_numpy(sm.slots.copy()))

    def version_of(self) -> int:
        return int(self.version)

    def store(self, slot_maps: Mapping[str, SlotMap], version: int) -> None:
        """Write ``slot_maps`` (the live tables in order) and ``version`` into the buffers."""
        with torch.no_grad():
            for i, sm in enumerate(slot_maps.values()):
                getattr(self, f"slots_{i}").copy_(torch.from_numpy(sm.slots))
            self.version.fill_(int(version))

    def slot_maps(self, tables: Sequence[str], sources: Sequence[Any]) -> Dict[str, SlotMap]:
        """The slot maps held (``tables`` in order); ConfigError for a row out of its table's
        range or in two slots (a state dict of another export)."""
        rows = {t.name: t.num_rows for t in sources}
        out = {}
        for i, name in enumerate(tables):
            slots = getattr(self, f"slots_{i}").detach().cpu().numpy().copy()
            if slots.size and (slots.min() < -1 or slots.max() >= rows[name]):
                raise ConfigError(f"table {name!r}: the loaded slot map holds rows outside "
                                  f"[0, {rows[name]}) (a state dict of another export?)")
            out[name] = SlotMap(name, slots)
        return out
