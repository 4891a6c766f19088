"""Exported plans measured on the emulated cluster: per step the slowest rank's time (forward,
backward, optimizer), the wire bytes per link class (HTB counters) and the CPU share.

:func:`run_on_cluster` stands up an :class:`~flexshard_stream.cluster.netem.EmulatedNetwork`,
starts one rank per namespace (``ip netns exec``; gloo bound to the namespace's veth), runs every
export in one ``DistributedModelParallel`` world after the other and removes the network when
done, when a rank fails or dies, and on Ctrl-C. Importing this module does not import torch.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..bridge.export import load_torchrec_export
from ..bridge.jobs import RunError
from ..errors import ConfigError
from ..optional import import_optional
from ..stats.batch import Batch
from .jobs import PHASES, ClusterJob, CollectiveTiming, StepRecord
from .netem import ClassCounters, EmulatedNetwork, check_emulation

__all__ = ["run_on_cluster", "ClusterRun", "PlanMeasurement", "model_component", "busy_seconds",
           "MODEL_COMPONENTS", "LINK_CLASSES"]

#: The evaluator's communication components, in order.
MODEL_COMPONENTS = ("index", "forward", "backward", "sync")
LINK_CLASSES = ("intra_node", "inter_node")


def model_component(c: CollectiveTiming) -> str:
    """The evaluator component a TorchRec collective belongs to: the KJT all-to-all
    (``input_*``) is ``index``, the embeddings' dist ``forward`` or ``backward`` by phase, DDP's
    all-reduce ``sync``; the step's barrier ``barrier``; anything else ``other``."""
    if c.component == "barrier":
        return "barrier"
    if c.component.startswith("input_"):
        return "index"
    if c.component == "data_parallel_all_reduce":
        return "sync"
    if c.component.startswith(("pooled_", "sequence_")):
        return "backward" if c.phase == "backward" else "forward"
    return "other"


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (seconds): time with at least one
    collective under way."""
    total, end = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return float(total)


def _median_iqr(x: Sequence[float]) -> dict[str, float]:
    a = np.asarray(x, dtype=np.float64)
    q1, q2, q3 = np.percentile(a, [25, 50, 75])
    return {"median": float(q2), "iqr": float(q3 - q1), "min": float(a.min()),
            "max": float(a.max())}


@dataclass
class PlanMeasurement:
    """What one export did on the emulated cluster: ``records[rank][step]``.

    Per step the figures are the slowest rank's (the step ends when its last rank ends) and the
    wire bytes the sum over ranks; summaries are medians over the measured steps."""

    label: str
    export_dir: str
    records: list[list[StepRecord]]

    @property
    def steps(self) -> int:
        return len(self.records[0]) if self.records else 0

    def _slowest(self, s: int) -> StepRecord:
        return max((r[s] for r in self.records), key=lambda x: x.total_s)

    def step_seconds(self) -> np.ndarray:
        """float64[steps]: each step's wall time on its slowest rank (seconds)."""
        return np.array([self._slowest(s).total_s for s in range(self.steps)])

    def phase_seconds(self) -> dict[str, np.ndarray]:
        """Per phase, float64[steps]: the slowest rank's time in it (seconds)."""
        return {p: np.array([self._slowest(s).seconds[p] for s in range(self.steps)])
                for p in PHASES}

    def wire_bytes(self, kind: str = "") -> dict[str, np.ndarray]:
        """Per link class, float64[steps]: bytes of data packets (headers included) all ranks
        sent (qdisc counters); ``kind="_received"``: that their switch ports delivered,
        ``"_acks"``: of pure ACKs sent."""
        return {c: np.array([sum(r[s].wire_bytes[c + kind] for r in self.records)
                             for s in range(self.steps)], np.float64) for c in LINK_CLASSES}

    def cpu_share(self) -> np.ndarray:
        """float64[steps]: CPU seconds of every rank's process over (ranks x step seconds): the
        share of the step the ranks were on a CPU (gloo's threads included)."""
        out = []
        for s in range(self.steps):
            wall = self.step_seconds()[s]
            out.append(sum(r[s].cpu_s for r in self.records) / (len(self.records) * wall)
                       if wall > 0 else 0.0)
        return np.asarray(out)

    def network_seconds(self, component: str | None = None) -> np.ndarray:
        """float64[steps]: the largest over ranks of the time with a collective under way
        (``component``: of that evaluator component only; the barrier left out)."""
        out = []
        for s in range(self.steps):
            per_rank = []
            for r in self.records:
                iv = [(c.start_s, c.end_s) for c in r[s].collectives
                      if model_component(c) != "barrier"
                      and (component is None or model_component(c) == component)]
                per_rank.append(busy_seconds(iv))
            out.append(max(per_rank) if per_rank else 0.0)
        return np.asarray(out)

    def summary(self) -> dict[str, Any]:
        """Medians and interquartile ranges of every figure (seconds, bytes)."""
        wire = self.wire_bytes()
        return {"label": self.label, "steps": self.steps,
                "step_s": _median_iqr(self.step_seconds()),
                "phase_s": {p: float(np.median(v)) for p, v in self.phase_seconds().items()},
                "network_s": _median_iqr(self.network_seconds()),
                "network_s_by_component": {c: float(np.median(self.network_seconds(c)))
                                           for c in MODEL_COMPONENTS},
                "wire_bytes": {c: float(np.median(v)) for c, v in wire.items()},
                "wire_bytes_mean": {c: float(np.mean(v)) for c, v in wire.items()},
                "wire_bytes_received_mean": {c: float(np.mean(v)) for c, v in
                                             self.wire_bytes("_received").items()},
                "ack_bytes_mean": {c: float(np.mean(v)) for c, v in
                                   self.wire_bytes("_acks").items()},
                "wire_packets_mean": {c: float(np.mean([sum(r[s].wire_packets[c]
                                                             for r in self.records)
                                                         for s in range(self.steps)]))
                                      for c in LINK_CLASSES},
                "cpu_share": float(np.median(self.cpu_share()))}


@dataclass
class ClusterRun:
    """A whole run: one :class:`PlanMeasurement` per export, the network's shape and rates
    (bits per second; ``intra_rate`` None: unshaped), the load average before and after (1, 5,
    15 minutes), the wall seconds and the counters over the whole run (setup included)."""

    plans: dict[str, PlanMeasurement]
    nodes: int
    gpus_per_node: int
    inter_rate: float
    intra_rate: float | None
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    seconds: float
    counters: ClassCounters | None = None
    batch_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "inter_rate_bits_per_s": self.inter_rate,
                "intra_rate_bits_per_s": self.intra_rate, "batch_size": self.batch_size,
                "load_average_before": list(self.load_before),
                "load_average_after": list(self.load_after), "seconds": self.seconds,
                "whole_run_counters": self.counters.to_json() if self.counters else None,
                "plans": {k: p.summary() for k, p in self.plans.items()}}


def _load() -> tuple[float, float, float]:
    try:
        return tuple(float(x) for x in os.getloadavg())   # type: ignore[return-value]
    except OSError:
        return (float("nan"),) * 3   # type: ignore[return-value]


def _child_env(interface: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.update(GLOO_SOCKET_IFNAME=interface, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _failure(job: ClusterJob, rank: int, code: int | None) -> RunError:
    log = Path(job.log_path(rank))
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    what = "timed out" if code is None else (f"was killed by signal {-code}" if code < 0
                                             else f"exited with code {code}")
    return RunError(f"cluster rank {rank} of {job.world_size} {what}:\n{tail}")


def _wait(job: ClusterJob, procs: Mapping[int, subprocess.Popen], deadline: float) -> None:
    """Wait for every rank; :class:`RunError` for the first that fails, dies or outlives
    ``deadline`` (``time.monotonic`` seconds)."""
    while True:
        codes = {r: p.poll() for r, p in procs.items()}
        # a rank killed by a signal first: its peers then fail on their broken connections
        failed = sorted((r for r, c in codes.items() if c not in (None, 0)),
                        key=lambda r: (codes[r] > 0, r))
        if failed:
            raise _failure(job, failed[0], codes[failed[0]])
        running = [r for r, c in codes.items() if c is None]
        if not running:
            return
        if time.monotonic() > deadline:
            raise _failure(job, running[0], None)
        time.sleep(0.1)


def _stop(procs: Mapping[int, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for p in procs.values():
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def _check_exports(exports: Mapping[str, str], nodes: int, gpus_per_node: int) -> None:
    for label, d in exports.items():
        m = load_torchrec_export(d).manifest
        if (m["world_size"], m["local_world_size"]) != (nodes * gpus_per_node, gpus_per_node):
            raise ConfigError(f"export {label!r} ({d}) was made for {m['world_size']} ranks, "
                              f"{m['local_world_size']} per node; the cluster has "
                              f"{nodes * gpus_per_node}, {gpus_per_node}")


def _spawn(net: EmulatedNetwork, job: ClusterJob, job_path: Path,
           procs: dict[int, subprocess.Popen]) -> None:
    for r in range(job.world_size):
        argv = [sys.executable, "-m", "flexshard_stream.cluster.rank", str(job_path), str(r)]
        with open(job.log_path(r), "wb") as log:
            procs[r] = subprocess.Popen(net.command(r, argv), env=_child_env(job.interfaces[r]),
                                        stdout=log, stderr=subprocess.STDOUT)


def run_on_cluster(exports: Mapping[str, str | os.PathLike] | Sequence[str | os.PathLike],
                   batches: Sequence[Batch], *, nodes: int, gpus_per_node: int,
                   inter_rate: float, intra_rate: float | None = None, steps: int = 10,
                   warmup: int = 2, learning_rate: float = 0.01, timeout_s: float = 600.0,
                   started: Callable[[EmulatedNetwork, dict[int, subprocess.Popen]], None]
                   | None = None) -> ClusterRun:
    """Run exported plans in a real ``DistributedModelParallel`` across an emulated cluster.

    Parameters
    ----------
    exports : mapping of label to export directory, or sequence of directories
        Made for ``nodes * gpus_per_node`` ranks, ``gpus_per_node`` per node
        (``flexshard-stream export``); run one after the other in one world.
    batches : sequence of Batch
        Global batches of ``nodes * gpus_per_node * B`` samples of the exports' original
        features; step ``s`` uses ``batches[s % len(batches)]``.
    nodes, gpus_per_node : int
        The emulated cluster: one rank (network namespace) per GPU.
    inter_rate : float
        Inter-node rate per rank and direction (bits per second).
    intra_rate : float, optional
        Intra-node rate per rank and direction (bits per second); None: unshaped.
    steps, warmup : int
        Measured steps per export, and steps run before them (start-up, first-iteration work).
    learning_rate : float
        SGD's (sharded tables: fused in the backward pass; dense tables: ``torch.optim.SGD``).
    timeout_s : float
        Collective timeout, and the run's deadline beyond start-up (seconds).
    started : callable, optional
        Called with the network and the rank processes once they run (monitoring, tests).

    Returns
    -------
    ClusterRun

    Raises
    ------
    ClusterUnavailable
        Not root, no ``ip`` / ``tc``, or the kernel lacks what the emulation needs.
    RunError
        A rank failed or died (its log in the message); the others are stopped.
    ConfigError
        Exports made for another world, empty batches or steps.
    """
    import_optional("torchrec", extra="torchrec", purpose="a run on the emulated cluster")
    labelled = ({str(k): str(v) for k, v in exports.items()} if isinstance(exports, Mapping)
                else {Path(d).name: str(d) for d in exports})
    if not labelled or not batches or steps < 1 or warmup < 0:
        raise ConfigError("give at least one export, one batch and one measured step "
                          f"(got {len(labelled)} exports, {len(batches)} batches, {steps} steps)")
    world = nodes * gpus_per_node
    if any(b.batch_size % world or b.batch_size != batches[0].batch_size for b in batches):
        raise ConfigError(f"every batch must hold the same multiple of {world} samples")
    _check_exports(labelled, nodes, gpus_per_node)
    check_emulation()
    load0, t0 = _load(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fs-cluster-") as tmp, \
            EmulatedNetwork(nodes, gpus_per_node, inter_rate=inter_rate,
                            intra_rate=intra_rate) as net:
        job = ClusterJob(list(labelled.values()), list(labelled), list(batches), world,
                         gpus_per_node, warmup, steps, [net.interface(r) for r in range(world)],
                         net.switch, [net.port(r) for r in range(world)], learning_rate,
                         timeout_s, tmp)
        job_path = Path(tmp) / "job.pkl"
        job_path.write_bytes(pickle.dumps(job))
        procs: dict[int, subprocess.Popen] = {}
        c0 = net.counters()
        try:
            _spawn(net, job, job_path, procs)
            if started is not None:
                started(net, procs)
            _wait(job, procs, time.monotonic() + timeout_s + 120.0 * (1 + len(labelled)))
        finally:
            _stop(procs)
        counters = net.counters() - c0
        per_rank = [pickle.loads(Path(job.result_path(r)).read_bytes()) for r in range(world)]
    plans = {label: PlanMeasurement(label, d, [per_rank[r][i] for r in range(world)])
             for i, (label, d) in enumerate(labelled.items())}
    return ClusterRun(plans, nodes, gpus_per_node, float(inter_rate),
                      None if intra_rate is None else float(intra_rate), load0, _load(),
                      time.perf_counter() - t0, counters, batches[0].batch_size // world)
