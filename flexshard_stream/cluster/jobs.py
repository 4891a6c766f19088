"""What a cluster run hands each spawned rank and what each rank hands back (torch-free, shared by
:mod:`~flexshard_stream.cluster.run` and the torch side :mod:`~flexshard_stream.cluster.rank`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..stats.batch import Batch

__all__ = ["ClusterJob", "CollectiveTiming", "StepRecord", "PHASES"]

#: The timed phases of a training step, in order.
PHASES = ("forward", "backward", "optimizer")


@dataclass
class ClusterJob:
    """Everything a spawned rank needs (pickled to it).

    Attributes
    ----------
    exports : list of str
        Export directories (``flexshard-stream export``), run one after the other in the same
        process group; ``labels`` names them.
    batches : list of Batch
        Global batches of ``world_size * B`` samples of the exports' original features; step
        ``s`` uses batch ``s % len(batches)``, rank ``r`` its samples ``[r B, (r + 1) B)``.
    warmup, steps : int
        Steps run before the measured ones (not reported), and measured steps, per export.
    interfaces : list of str
        Each rank's network interface (gloo binds to it; its HTB counters are read per step).
    switch, ports : str, list of str
        The switch's namespace and each rank's port there (what reaches the rank is counted on
        the port's egress).
    """

    exports: list[str]
    labels: list[str]
    batches: list[Batch]
    world_size: int
    local_world_size: int
    warmup: int
    steps: int
    interfaces: list[str]
    switch: str = ""
    ports: list[str] = field(default_factory=list)
    learning_rate: float = 0.01
    timeout_s: float = 300.0
    work_dir: str = ""
    seed: int = 0

    @property
    def local_batch_size(self) -> int:
        """Samples per rank per step (B)."""
        return self.batches[0].batch_size // self.world_size

    @property
    def store_path(self) -> str:
        return str(Path(self.work_dir) / "store")

    def result_path(self, rank: int) -> str:
        return str(Path(self.work_dir) / f"rank{rank}.pkl")

    def log_path(self, rank: int) -> str:
        return str(Path(self.work_dir) / f"rank{rank}.log")


@dataclass(frozen=True)
class CollectiveTiming:
    """One collective of a step as one rank saw it: the TorchRec component it belongs to
    (``bridge.world``'s names, ``barrier`` for the step's barrier), the phase, when it was
    issued and when it completed (seconds from the step's start) and this rank's input bytes."""

    component: str
    phase: str
    start_s: float
    end_s: float
    input_bytes: int


@dataclass
class StepRecord:
    """One measured step of one rank.

    Attributes
    ----------
    seconds : {phase: seconds}
        Wall time of ``forward`` (remap, lookups, output distribution, loss), ``backward``
        (gradient distribution, fused optimizer of the sharded tables, DDP's all-reduce) and
        ``optimizer`` (the dense tables' SGD step); the step starts when the barrier before it
        returns.
    cpu_s : float
        CPU seconds of this rank's process during the step (every thread: gloo's included).
    wire_bytes : {class: bytes}
        What the rank's veth sent from the barrier after the previous step to the barrier
        after this one (the step's data all delivered by then; HTB class counters,
        ``netem.CLASS_NAMES``): ``inter_node``, ``intra_node``, data packets with their
        Ethernet, IP and TCP headers; ``inter_node_acks``, ``intra_node_acks``, pure ACKs; the
        same names ending in ``_received``: what its switch port delivered to it.
    wire_packets : {class: packets}
    collectives : list of CollectiveTiming
    """

    step: int
    seconds: dict[str, float]
    cpu_s: float
    wire_bytes: dict[str, int]
    wire_packets: dict[str, int]
    collectives: list[CollectiveTiming] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        """Wall seconds of the whole step (sum of the phases)."""
        return float(sum(self.seconds.values()))
