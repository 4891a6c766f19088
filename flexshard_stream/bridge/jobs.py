"""What the runtime harness hands a spawned rank and what the rank hands back: the job and result
types shared by :mod:`~flexshard_stream.bridge.runtime` (torch-free) and
:mod:`~flexshard_stream.bridge.world` (torch), so neither imports the other's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FlexShardError
from ..plans.tables import EmbeddingTable
from ..stats.batch import Batch
from .sharding import TableSharding

__all__ = ["RunError", "CollectiveRecord", "upstream_gradient", "CaseJob", "RankJob",
           "RankResult"]


class RunError(FlexShardError, RuntimeError):
    """A spawned TorchRec rank failed; the message holds its traceback."""


# ----------------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class CollectiveRecord:
    """One collective as one rank issued it, counted at the process group.

    Attributes
    ----------
    rank : int
        Global rank that issued it.
    group : tuple of int
        Global ranks of the process group, in group order.
    op : str
        ``all_to_all``, ``reduce_scatter``, ``all_gather``, ``all_reduce`` or ``broadcast``.
    component : str
        The TorchRec dist it belongs to: ``input_splits``, ``input_lengths``, ``input_values``,
        ``input_weights`` (the KJT all-to-all), ``pooled_all_to_all``, ``pooled_reduce_scatter``,
        ``sequence_all_to_all``, ``data_parallel_all_reduce``; else the TorchRec function name.
    phase : str
        ``forward`` or ``backward`` of an iteration; ``setup`` / ``teardown`` outside them.
    iteration : int or None
        Index of the batch; None outside iterations.
    dtype : str
        Element type of the buffer (``int64``, ``int32``, ``float32`` ...).
    elem_bytes, input_bytes, output_bytes : int
        Bytes per element; of this rank's input and output buffers.
    send_bytes, recv_bytes : tuple of int
        Per group member (group order), the bytes of this rank's input destined to it and of its
        output coming from it (all-to-all: the splits; reduce-scatter: one chunk each;
        all-gather: the whole input each). Empty for all-reduce and broadcast.
    """

    rank: int
    group: tuple[int, ...]
    op: str
    component: str
    phase: str
    iteration: int | None
    dtype: str
    elem_bytes: int
    input_bytes: int
    output_bytes: int
    send_bytes: tuple[int, ...] = ()
    recv_bytes: tuple[int, ...] = ()

    @property
    def remote_send_bytes(self) -> int:
        """Bytes of ``send_bytes`` to members other than this rank (all-reduce: the input)."""
        if not self.send_bytes:
            return self.input_bytes
        return sum(b for r, b in zip(self.group, self.send_bytes) if r != self.rank)

    def inter_node_send_bytes(self, local_world_size: int) -> int:
        """Bytes of ``send_bytes`` to ranks on other nodes (``rank // local_world_size``)."""
        node = self.rank // local_world_size
        return sum(b for r, b in zip(self.group, self.send_bytes) if r // local_world_size != node)


def upstream_gradient(seed: int, iteration: int, rank: int, feature: int,
                      shape: tuple[int, ...]) -> np.ndarray:
    """The fixed float32 gradient that flows into output ``feature`` (index in sorted feature
    order) of ``rank`` at ``iteration``: the loss of a run is ``sum_f <output_f, g_f>``."""
    rng = np.random.default_rng([seed, 1 + iteration, rank, feature])
    return rng.standard_normal(shape).astype(np.float32)


@dataclass
class CaseJob:
    """One model and plan of a run: its tables, their shardings (empty for the unsharded
    reference), initial weights, and whether pooled inputs carry weights.

    An export case (``export_dir`` set) runs the exported tables of that directory
    (``tables``: ``<table>__hot`` / ``<table>__cold``) under the export's own ``ShardingPlan``,
    fed through its ``KJTRemap``; ``source`` holds the original tables, whose features the
    batches carry and whose outputs and gradients the run reports."""

    tables: tuple[EmbeddingTable, ...]
    shardings: dict[str, TableSharding]
    weights: dict[str, np.ndarray]
    weighted: bool = False
    export_dir: str = ""
    source: tuple[EmbeddingTable, ...] = ()

    @property
    def input_tables(self) -> tuple[EmbeddingTable, ...]:
        """The tables whose features the batches carry (the original ones of an export)."""
        return self.source or self.tables


@dataclass
class RankJob:
    """Everything a spawned rank needs (pickled to it): the cases, run one after the other in the
    same process group, and the batches they share."""

    cases: list[CaseJob]
    batches: list[Batch]
    world_size: int
    local_world_size: int
    seed: int = 0
    values_dtype: str = "int64"
    lengths_dtype: str = "int64"
    open_row_wise: bool = True
    timeout_s: float = 120.0
    work_dir: str = ""
    fake: bool = False
    ranks: tuple[int, ...] = ()

    @property
    def run_ranks(self) -> tuple[int, ...]:
        """The ranks started: :attr:`ranks`, or every rank when empty."""
        return self.ranks or tuple(range(self.world_size))

    @property
    def local_batch_size(self) -> int:
        """Samples per rank (each global batch is cut into ``world_size`` equal parts)."""
        return self.batches[0].batch_size // self.world_size

    @property
    def store_path(self) -> str:
        """The file store the ranks meet at."""
        return str(Path(self.work_dir) / "store")

    def result_path(self, rank: int) -> str:
        """Where ``rank`` writes its list of :class:`RankResult` (one per case)."""
        return str(Path(self.work_dir) / f"rank{rank}.pkl")


@dataclass
class RankResult:
    """What one rank returns for one case: per iteration its outputs (feature -> array) and its
    gradient shards (table -> [((row offset, column offset), gradient)]), and its collectives."""

    rank: int
    outputs: list[dict[str, np.ndarray]]
    grads: list[dict[str, list[tuple[tuple[int, int], np.ndarray]]]]
    records: list[CollectiveRecord]
