"""Where each row of a plan goes in TorchRec: the hot / cold split and the cold rows' blocks.

The TorchRec export (:mod:`flexshard_stream.bridge.export`) splits a table of ``H``
rows into a data-parallel hot table (``K`` rows: the plan's replicas) and a cold table (``C = H -
K`` rows) that TorchRec shards in equal, contiguous row blocks (``ceil(C / n)`` rows on each of its
``n`` ranks, :func:`torchrec_rw_shard_rows`; its type, ranks and blocks are the sharding rule's,
:func:`~flexshard_stream.bridge.sharding.torchrec_sharding`). :func:`map_table` chooses the new
index of every row as an :class:`~flexshard_stream.bridge.remap.IdRemap`, in memory proportional
to the rows chosen individually (replicas, explicitly placed rows) and the GPUs, never to ``H``:

1. hot rows get ``[0, K)`` in increasing original ID;
2. each cold rank keeps, up to its block size, the rows the plan put on it: its explicitly placed
   rows first (the planner places the hottest cold rows by load), by ID, then the rows of its
   ranges of the cold function, by ID;
3. the explicitly placed rows that did not fit fill the free slots, rank by rank, by ID; then the
   other rows that did not fit, by ID;
4. inside a block: its placed rows (by ID), then its runs of other rows (by ID).

The largest possible number of cold rows stays on its plan GPU (``sum over GPUs of min(plan rows,
block size)``) when the cold function is a set of ranges (equal or weighted), or a hash over at most
:data:`HASH_ROW_BY_ROW_ROWS` rows (laid out row by row: a remap entry per row). A larger hashed cold
function spreads rows that TorchRec's contiguous blocks cannot follow without a per-row table: its
rows are laid out in ID order (the explicitly placed rows still go first to their plan GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels.hashing import mix64_np
from ..plans.plan import ColdSharding, TablePlan
from ..plans.topology import Topology
from .remap import IdRemap, regular_rank
from .sharding import (
    TorchRecSharding,
    plan_cold_rows,
    torchrec_block_starts,
    torchrec_rw_shard_rows,
    torchrec_sharding,
)

__all__ = ["ColdLayout", "TableMapping", "map_table", "torchrec_rw_shard_rows",
           "torchrec_block_starts"]


# ----------------------------------------------------------------------------- the result
@dataclass
class ColdLayout:
    """The cold table of one exported table.

    Attributes
    ----------
    sharding_type : str
        ``row_wise``, ``table_row_wise`` or ``table_wise``.
    ranks : ndarray of int64
        TorchRec rank of each block, in block order.
    shard_rows : ndarray of int64
        Rows of each block (:func:`torchrec_rw_shard_rows` of the cold rows).
    rows_on_plan_gpu : int or None
        Cold rows on the GPU the plan gave them (None for a hashed cold function: its other rows
        land on their hash GPU only by chance, not counted).
    placed_on_plan_gpu : int
        Explicitly placed rows on their plan GPU.
    notes : list of str
        What the choice of sharding type assumed.
    """

    sharding_type: str
    ranks: np.ndarray
    shard_rows: np.ndarray
    rows_on_plan_gpu: int | None
    placed_on_plan_gpu: int
    plan_gpus: list[int]
    notes: list[str] = field(default_factory=list)

    def entry(self, rows: int, placed_rows: int, node_rows: int) -> dict[str, Any]:
        """The manifest's ``cold`` fields."""
        return {"rows": int(rows), "sharding_type": self.sharding_type,
                "ranks": self.ranks.tolist(), "shard_rows": self.shard_rows.tolist(),
                "plan_gpus": self.plan_gpus, "rows_on_plan_gpu": self.rows_on_plan_gpu,
                "placed_rows": int(placed_rows), "placed_on_plan_gpu": self.placed_on_plan_gpu,
                "node_rows": int(node_rows)}


@dataclass
class TableMapping:
    """One table's split: the remap, the hot table's rows (``hot_rows``, K; of them
    ``global_rows`` global and ``node_rows_hot`` node replicas; ``hot_ids`` the replicated rows'
    original IDs, empty for a data-parallel table), the cold layout (None without cold rows) and
    the sharding rule's answer it follows (:func:`~flexshard_stream.bridge.sharding.
    torchrec_sharding` with the export's options)."""

    remap: IdRemap
    hot_rows: int
    hot_ids: np.ndarray
    global_rows: int
    node_rows_hot: int
    node_rows_cold: int
    cold: ColdLayout | None
    notes: list[str]
    sharding: TorchRecSharding | None = None
    live: bool = False

    @property
    def cold_rows(self) -> int:
        """C: rows of the cold table (every row in a live export's, ``H - K`` otherwise)."""
        return self.remap.num_rows if self.live else self.remap.num_rows - self.hot_rows


#: Largest table whose hashed cold function is exported row by row (about a remap entry, 16
#: bytes, per row: 64 MiB at this size); larger hashed tables are laid out in ID order.
HASH_ROW_BY_ROW_ROWS = 1 << 22


# ----------------------------------------------------------------------------- the mapping
def map_table(tp: TablePlan, topo: Topology, cold_sharding: str, node_replicas: str
              ) -> TableMapping:
    """Split one table plan into its hot and cold TorchRec tables (see the module docstring).

    ``cold_sharding``: ``auto``, ``row_wise``, ``table_row_wise`` or ``table_wise``;
    ``node_replicas``: ``hot`` (into the data-parallel table) or ``cold`` (regular rows of the cold
    function). Memory ``O(replicas + placed rows + GPUs)``; ``O(rows)`` for a hashed cold function
    of at most :data:`HASH_ROW_BY_ROW_ROWS` rows (laid out row by row).
    """
    H = tp.table.num_rows
    rule = torchrec_sharding(tp, topo, cold_sharding=cold_sharding, node_replicas=node_replicas)
    if tp.replicated:
        return TableMapping(IdRemap.identity(H), H, np.zeros(0, np.int64), H, 0, 0, None,
                            ["data-parallel table: exported whole as the hot (data_parallel) "
                             "table with the identity remap"], rule)
    notes: list[str] = []
    hot_ids = tp.global_ids
    if node_replicas == "hot" and tp.node_ids.size:
        hot_ids = np.union1d(hot_ids, tp.node_ids)
        notes.append(f"{tp.node_ids.size} node replicas folded into the data-parallel hot table "
                     f"(stored on every GPU instead of once per node)")
    elif tp.node_ids.size:
        notes.append(f"{tp.node_ids.size} node replicas exported as cold rows (TorchRec has no "
                     f"one-copy-per-node sharding); each goes where the plan's cold function "
                     f"puts it")
    node_hot = int(tp.node_ids.size) if node_replicas == "hot" else 0
    K = int(hot_ids.size)
    hot = np.stack([hot_ids, np.arange(K, dtype=np.int64)], axis=1)
    if K == H:
        return TableMapping(IdRemap(H, hot, np.zeros((0, 2), np.int64)), K, hot_ids,
                            int(tp.global_ids.size), node_hot, 0, None, notes, rule)
    exc_ids = np.union1d(hot_ids, tp.placed_ids)
    counts = plan_cold_rows(tp, topo, node_replicas)
    # the cold table as the sharding rule lays out what TorchRec runs: type, ranks, its blocks
    run = rule.runs_as
    kind, ranks, cnotes = run.sharding_type, np.asarray(run.ranks, np.int64), list(run.notes)
    C = H - K
    caps = np.asarray(run.shard_rows, np.int64)
    layout = _ColdFill(tp, exc_ids, ranks, caps, C)
    placed, segments = layout.run()
    exceptions = np.concatenate([hot, np.stack([tp.placed_ids, K + placed], axis=1)])
    exceptions = exceptions[np.argsort(exceptions[:, 0], kind="stable")]
    segments[:, 1] += K
    in_id_order = tp.cold.kind == "hash" and not layout.row_by_row
    cold = ColdLayout(kind, ranks, caps, None if in_id_order else layout.kept,
                      layout.placed_kept, np.flatnonzero(counts).tolist(), cnotes)
    if in_id_order:
        cold.notes.append("hashed cold function: TorchRec's blocks are contiguous, so its rows "
                          "are laid out in ID order (explicitly placed rows still go to their "
                          f"plan GPU first; tables up to {HASH_ROW_BY_ROW_ROWS:,} rows are laid "
                          f"out row by row)")
    elif tp.cold.kind == "hash":
        cold.notes.append("hashed cold function laid out row by row: each row in its hash GPU's "
                          "block while the block has room (a remap entry per row)")
    return TableMapping(IdRemap(H, exceptions, _merge_runs(segments)), K, hot_ids,
                        int(tp.global_ids.size), node_hot,
                        int(tp.node_ids.size) - node_hot, cold, notes + cnotes, rule)


def _regular_runs(cold: ColdSharding, exc_ids: np.ndarray, num_rows: int
                  ) -> list[tuple[int, int, int]]:
    """``(first rank, end rank, plan GPU)`` of each run of regular rows the cold function keeps
    together: one per non-empty range; a hash keeps none together (one run, GPU -1)."""
    regular = num_rows - exc_ids.size
    if cold.kind != "range":
        return [(0, regular, -1)] if regular else []
    bounds = np.minimum(cold.bounds, num_rows)
    rb = regular_rank(exc_ids, bounds)
    return [(int(rb[j]), int(rb[j + 1]), int(cold.gpus[j])) for j in range(cold.gpus.size)
            if rb[j + 1] > rb[j]]


def _first_in_room(block: np.ndarray, ids: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Which items stay in their block: per block ``j`` (``room.size`` for none), the first
    ``room[j]`` of its items by ID. A bool mask in the items' order."""
    n = room.size
    order = np.lexsort((ids, block))
    js = block[order]
    first = np.searchsorted(js, np.arange(n + 1))
    keep = np.empty(ids.size, np.bool_)
    keep[order] = np.arange(js.size) - first[np.minimum(js, n)] < np.append(room, 0)[js]
    return keep


class _ColdFill:
    """The cold rows of one table filled into TorchRec's blocks (steps 2-4 of the module
    docstring). :meth:`run` returns the cold index of every placed row and the regular rows'
    segments ``(rank start, cold index start)``."""

    def __init__(self, tp: TablePlan, exc_ids: np.ndarray, ranks: np.ndarray, caps: np.ndarray,
                 cold_rows: int):
        self.tp, self.exc_ids, self.ranks, self.caps = tp, exc_ids, ranks, caps
        self.n = ranks.size
        self.block = -(-cold_rows // self.n)
        self.starts = torchrec_block_starts(cold_rows, self.n)
        top = max(int(ranks.max()), int(tp.placed_gpus.max()) if tp.placed_gpus.size else 0,
                  int(tp.cold.gpus.max()) if tp.cold.gpus.size else 0)
        self.pos = np.full(top + 1, self.n, np.int64)      # block of each GPU, n if none
        self.pos[ranks] = np.arange(self.n)
        self.room = caps.astype(np.int64).copy()
        self.kept = 0
        self.placed_kept = 0
        self.row_by_row = tp.cold.kind == "hash" and tp.table.num_rows <= HASH_ROW_BY_ROW_ROWS

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        placed_block = self._keep_placed()
        pieces, overflow = self._keep_hashed() if self.row_by_row else self._keep_regular()
        self._fill_placed(placed_block)
        filled = self._fill_regular(overflow)
        both = [np.asarray(x, np.int64).reshape(-1, 3) for x in (pieces, filled)]
        return self._layout(placed_block, np.concatenate(both))

    def _keep_placed(self) -> np.ndarray:
        """Block of each placed row kept on its plan GPU (-1 for the others)."""
        tp, n = self.tp, self.n
        pj = self.pos[tp.placed_gpus]
        keep = _first_in_room(pj, tp.placed_ids, self.caps)
        block = np.full(tp.placed_ids.size, -1, np.int64)
        block[keep] = pj[keep]
        self.room -= np.bincount(pj[keep], minlength=n + 1)[:n]
        self.placed_kept = int(keep.sum())
        self.kept += self.placed_kept
        return block

    def _keep_regular(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """Pieces ``(rank start, rows, block)`` of the runs kept on their plan GPU, and the
        overflow ``(rank start, rows)`` in rank order."""
        pieces, overflow = [], []
        for r0, r1, gpu in _regular_runs(self.tp.cold, self.exc_ids, self.tp.table.num_rows):
            j = int(self.pos[gpu]) if 0 <= gpu < self.pos.size else self.n
            keep = min(r1 - r0, int(self.room[j])) if j < self.n else 0
            if keep:
                pieces.append((r0, keep, j))
                self.room[j] -= keep
                self.kept += keep
            if r1 - r0 > keep:
                overflow.append((r0 + keep, r1 - r0 - keep))
        return pieces, overflow

    def _keep_hashed(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """:meth:`_keep_regular` for a hashed cold function, row by row: each regular row (by
        rank, i.e. by ID) stays in its hash GPU's block while the block has room; pieces of one
        row, and the overflow as runs ``(rank start, rows)``."""
        tp, n, c = self.tp, self.n, self.tp.cold
        regular = np.setdiff1d(np.arange(tp.table.num_rows, dtype=np.int64), self.exc_ids)
        gpu = c.gpus[(mix64_np(regular, c.seed) % np.uint64(c.gpus.size)).astype(np.int64)]
        j = np.where(gpu < self.pos.size, self.pos[np.minimum(gpu, self.pos.size - 1)], n)
        keep = _first_in_room(j, regular, self.room)
        kept = np.flatnonzero(keep)
        self.room -= np.bincount(j[kept], minlength=n + 1)[:n]
        self.kept += int(kept.size)
        pieces = np.stack([kept, np.ones(kept.size, np.int64), j[kept]], axis=1)
        lost = np.flatnonzero(~keep)
        starts = np.flatnonzero(np.diff(lost, prepend=-2) != 1)     # runs of consecutive ranks
        ends = np.append(starts[1:], lost.size)
        return pieces, [(int(lost[a]), int(b - a)) for a, b in zip(starts, ends)]

    def _fill_placed(self, block: np.ndarray) -> None:
        """Placed rows not kept take the free slots, block by block, by ID (in place)."""
        rest = np.flatnonzero(block < 0)
        if rest.size:
            got = np.searchsorted(np.cumsum(self.room), np.arange(rest.size), side="right")
            block[rest] = got
            self.room -= np.bincount(got, minlength=self.n)

    def _fill_regular(self, overflow: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """The regular rows not kept take the remaining slots, block by block, in rank order."""
        pieces, j = [], 0
        for r0, rows in overflow:
            while rows:
                while j < self.n and self.room[j] == 0:
                    j += 1
                if j == self.n:
                    raise AssertionError("cold rows exceed TorchRec's blocks")
                take = min(rows, int(self.room[j]))
                pieces.append((r0, take, j))
                self.room[j] -= take
                r0 += take
                rows -= take
        return pieces

    def _layout(self, placed_block: np.ndarray, pieces: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Cold indices: each block holds its placed rows (by ID), then its pieces (by rank)."""
        n = self.n
        order = np.lexsort((self.tp.placed_ids, placed_block))
        pb = placed_block[order]
        first = np.searchsorted(pb, np.arange(n))
        placed = np.empty(pb.size, np.int64)
        placed[order] = self.starts[pb] + (np.arange(pb.size) - first[pb])
        per_block = np.bincount(pb, minlength=n).astype(np.int64)
        if not len(pieces):
            return placed, np.zeros((0, 2), np.int64)
        p = np.asarray(pieces, np.int64).reshape(-1, 3)
        p = p[np.lexsort((p[:, 0], p[:, 2]))]
        ends = np.cumsum(p[:, 1])
        block_first = np.searchsorted(p[:, 2], p[:, 2])         # first piece of each block
        offset = ends - p[:, 1] - (ends[block_first] - p[block_first, 1])
        cold_start = self.starts[p[:, 2]] + per_block[p[:, 2]] + offset
        seg = np.stack([p[:, 0], cold_start], axis=1)
        return placed, seg[np.argsort(seg[:, 0], kind="stable")]


def _merge_runs(segments: np.ndarray) -> np.ndarray:
    """Join segments that continue each other (the next rank start and new start both follow on);
    ``segments`` sorted by rank start."""
    if segments.shape[0] < 2:
        return segments
    lengths = np.diff(segments[:, 0])
    joins = np.diff(segments[:, 1]) == lengths
    keep = np.concatenate([[True], ~joins])
    return np.ascontiguousarray(segments[keep])
