"""The workload a plan is priced on: one :class:`Workload`, built once at the API edge.

What the frequency summaries do not say about a training job lives here, in one place:

- ``batch_size``: B, samples per GPU per iteration (an iteration is ``G x B`` samples);
- ``model``: the cost model's choices (:class:`CostModel`: de-duplication, execution profile,
  bytes per ID and per length, all-reduce, reservation);
- ``mean_lengths``: IDs per sample per table (tables not listed take their summary's);
- ``iterations_profiled``: the iterations of ``G x B`` samples the statistics were counted over,
  :func:`iterations_from_samples` (the one definition: the CLI's hugectr plan, the planner's hugectr
  candidate, the baselines' balance and the replay all read it from here).

Public entry points (``plan_flexshard``, ``evaluate_analytic``, ``evaluate_trace``, ``replay``,
``Resharder``, ...) take ``workload=`` or their loose arguments (``batch_size``, ``model``,
``mean_lengths``) and build the one Workload with :func:`workload_of`; everything below them
(pricing, candidates, partition, baselines, host tier, profiles, the evaluator's internals)
receives it. :meth:`Workload.from_stats` builds one bound to a set of statistics (every table's
mean length, the iterations profiled): what a command line should call.

Why here (the placement floor) and not in the plan model: a workload prices plans (its cost model
names the execution profile, ``placement.profiles``); the plan model says where rows live and
stays free of costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..plans.tables import EmbeddingTable, summaries_by_table
from ..plans.topology import Topology
from ..stats.summary import FrequencySummary
from .profiles import ExecutionProfile, execution_profile

__all__ = ["CostModel", "Workload", "iterations_from_samples", "profiled_samples", "workload_of"]


@dataclass(frozen=True)
class CostModel:
    """Options of the cost model.

    dedup : bool            in-batch de-duplication: a GPU requests each distinct (table, row) once
                            per iteration (default); off: once per occurrence. Under ``torchrec``
                            it is TorchRec's index de-duplication of sequence tables
                            (``EmbeddingCollectionSharder(use_index_dedup=True)``; TorchRec's own
                            default is off); pooled tables are never de-duplicated there
    index_bytes : int       bytes per ID (8: int64): the index exchange (``ideal``), the KJT's
                            values (``torchrec``)
    allreduce : str         "hierarchical" (intra-node reduce-scatter, inter-node ring, intra-node
                            all-gather) or "ring" (one flat ring over all GPUs)
    reservation_bytes : float  per-GPU memory reserved for everything else (bytes)
    profile : str           execution profile, "torchrec" (default) or "ideal"
                            (:mod:`~flexshard_stream.placement.profiles`)
    length_bytes : int      bytes per KJT length (``torchrec``; 8: int64, TorchRec keeps the
                            input's dtype)
    wire_overhead : float   bytes on the wire per byte of payload (times only; 1.0: none, the
                            default). Measured over TCP/IP on Ethernet framing (MTU 1500: 66
                            bytes of headers per 1448-byte segment, plus the ACKs):
                            :data:`TCP_WIRE_OVERHEAD` (docs/CLUSTER.md)
    message_latency_s : float  seconds per message round of a collective (times only; 0.0, the
                            default): an all-to-all component pays one per collective it
                            issues (``torchrec``: 3 for the index exchange, splits, lengths
                            and values), times ``G - 1`` rounds when ``pairwise``; an all-reduce
                            one per ring step (ring: ``2 (G - 1)``; hierarchical:
                            ``2 (M - 1) + 2 (N - 1)``); a component that moves nothing pays none
    alltoall : str          "concurrent" (default: every pair at once, DESIGN.md section 3) or
                            "pairwise" (gloo's ``alltoall``: ``G - 1`` rounds one after the other,
                            in round ``i`` GPU ``g`` sends to ``g + i`` and receives from
                            ``g - i``; a round ends with its slowest transfer). Times only;
                            ``pairwise`` needs the G x G matrices (at most MATRIX_MAX_GPUS)
    """

    dedup: bool = True
    index_bytes: int = 8
    allreduce: str = "hierarchical"
    reservation_bytes: float = 0.0
    profile: str = "torchrec"
    length_bytes: int = 8
    wire_overhead: float = 1.0
    message_latency_s: float = 0.0
    alltoall: str = "concurrent"

    @property
    def execution(self) -> ExecutionProfile:
        """The execution profile: its label and what it can run
        (:meth:`~flexshard_stream.placement.profiles.ExecutionProfile.can_run`)."""
        return execution_profile(self.profile)

    @property
    def torchrec(self) -> bool:
        """Whether figures are TorchRec 1.8's (``profile == "torchrec"``)."""
        return self.profile == "torchrec"

    def __post_init__(self) -> None:
        execution_profile(self.profile)
        for name in ("index_bytes", "length_bytes", "reservation_bytes", "wire_overhead",
                     "message_latency_s"):  # e.g. from plan.json
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) \
                    or not np.isfinite(v):
                raise ConfigError(f"{name} must be a finite number, got {v!r}")
        if self.length_bytes not in (4, 8):
            raise ConfigError(f"length_bytes must be 4 (int32) or 8 (int64), got "
                              f"{self.length_bytes}")
        if self.alltoall not in ("concurrent", "pairwise"):
            raise ConfigError(f"alltoall must be 'concurrent' or 'pairwise', got "
                              f"{self.alltoall!r}")
        if self.allreduce not in ("hierarchical", "ring"):
            raise ConfigError(f"allreduce must be 'hierarchical' or 'ring', got {self.allreduce!r}")
        if self.index_bytes <= 0:
            raise ConfigError(f"index_bytes must be > 0, got {self.index_bytes}")
        if self.reservation_bytes < 0:
            raise ConfigError(f"reservation_bytes must be >= 0, got {self.reservation_bytes}")
        if self.wire_overhead < 1:
            raise ConfigError(f"wire_overhead must be >= 1 (wire bytes per payload byte), got "
                              f"{self.wire_overhead}")
        if self.message_latency_s < 0:
            raise ConfigError(f"message_latency_s must be >= 0 seconds, got "
                              f"{self.message_latency_s}")

    def a2a_rounds(self, component: str, topo: Topology) -> int:
        """Message rounds of an all-to-all ``component``: its collectives (the index exchange 3
        under ``torchrec``: splits, lengths, values; else 1), times ``G - 1`` if pairwise."""
        n = 3 if component == "index" and self.torchrec else 1
        return n * (topo.num_gpus - 1 if self.alltoall == "pairwise" else 1)

    def allreduce_rounds(self, topo: Topology) -> int:
        """Message rounds of one all-reduce on ``topo``: ``2 (G - 1)`` for a ring,
        ``2 (M - 1) + 2 (N - 1)`` for the hierarchical one."""
        if self.allreduce == "ring":
            return 2 * (topo.num_gpus - 1)
        return 2 * (topo.gpus_per_node - 1) + 2 * (topo.nodes - 1)


# ----------------------------------------------------------------------------- iterations
def profiled_samples(summaries: Mapping[str, FrequencySummary]) -> float:
    """Samples the summaries were counted over: the most any table saw (a summary without a
    sample count: its lookups over its mean length). 0 for no summaries."""
    seen = [float(s.samples) if s.samples else s.total / max(s.mean_length or 1.0, 1e-12)
            for s in summaries.values()]
    return max(seen, default=0.0)


def iterations_from_samples(samples: float, samples_per_iteration: int) -> int:
    """Iterations profiled: ``samples`` over ``samples_per_iteration`` (``G x B``), rounded to the
    nearest whole iteration (half to even), at least 1.

    The one definition. HugeCTR's threshold counts lookups over the profiled iterations, so the
    count must be the number of iterations the lookups were made in: rounding stays within half
    an iteration of ``samples / (G B)``, where a floor can nearly halve it (1.99 iterations of
    lookups counted as 1 doubles every row's apparent rate).
    """
    if not samples_per_iteration > 0:
        raise ConfigError(f"samples_per_iteration must be > 0 (G x B samples), got "
                          f"{samples_per_iteration!r}")
    return max(1, int(round(float(samples) / samples_per_iteration)))


# ----------------------------------------------------------------------------- the workload
def _whole_positive(name: str, v: Any, what: str) -> int:
    """``v`` as an int >= 1 (a whole number), else ConfigError naming ``name``."""
    ok = isinstance(v, (int, np.integer)) or (isinstance(v, (float, np.floating))
                                              and math.isfinite(v) and float(v).is_integer())
    if isinstance(v, bool) or not ok or v < 1:
        raise ConfigError(f"Workload.{name} must be a whole number > 0 {what}, got {v!r}")
    return int(v)


def _lengths(mean_lengths: Mapping[str, float]) -> Mapping[str, float]:
    """The mean lengths as a read-only {table name: float}, each finite and >= 0 (ConfigError
    naming the table)."""
    if not isinstance(mean_lengths, Mapping):
        raise ConfigError(f"Workload.mean_lengths must map table names to IDs per sample, got "
                          f"{type(mean_lengths).__name__}")
    out = {}
    for name, v in mean_lengths.items():
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(v, bool) or not (math.isfinite(x) and x >= 0):
            raise ConfigError(f"Workload.mean_lengths[{name!r}] must be a finite number >= 0 "
                              f"IDs per sample, got {v!r}")
        out[str(name)] = x
    return MappingProxyType(out)


@dataclass(frozen=True)
class Workload:
    """The workload plans are priced on (validated on construction, ConfigError naming the field).

    batch_size : int         B, samples per GPU per iteration
    model : CostModel        the cost model's choices (de-duplication, execution profile, ...)
    mean_lengths : {table name: float}   IDs per sample; a table not listed takes its summary's
                             mean length; 0 (a table never seen) is priced as 1
    iterations_profiled : int | None   iterations of ``G x B`` samples the statistics cover
                             (:func:`iterations_from_samples`); None: not profiled (the hugectr
                             rule and lookups per iteration then refuse)

    :meth:`from_stats` binds one to a set of statistics; :meth:`for_stats` binds this one's
    B and model (and its explicit mean lengths) to new statistics.
    """

    batch_size: int
    model: CostModel = field(default_factory=CostModel)
    mean_lengths: Mapping[str, float] = field(default_factory=dict)
    iterations_profiled: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", _whole_positive(
            "batch_size", self.batch_size, "of samples per GPU per iteration"))
        if not isinstance(self.model, CostModel):
            raise ConfigError(f"Workload.model must be a CostModel, got "
                              f"{type(self.model).__name__}")
        object.__setattr__(self, "mean_lengths", _lengths(self.mean_lengths))
        if self.iterations_profiled is not None:
            object.__setattr__(self, "iterations_profiled", _whole_positive(
                "iterations_profiled", self.iterations_profiled, "of iterations (or None)"))

    def __hash__(self) -> int:
        return hash((self.batch_size, self.model, tuple(sorted(self.mean_lengths.items())),
                     self.iterations_profiled))

    # ------------------------------------------------------------------ built from statistics
    @classmethod
    def from_stats(cls, tables: Sequence[EmbeddingTable], topology: Topology,
                   summaries: Mapping[str, FrequencySummary], batch_size: int, *,
                   model: CostModel | None = None,
                   mean_lengths: Mapping[str, float] | None = None) -> "Workload":
        """The workload of ``tables`` on ``topology`` profiled by ``summaries`` (keyed by table
        name or feature): every table's mean length (``mean_lengths`` first, then its summary's)
        and the iterations profiled (:func:`iterations_from_samples`), with ``batch_size``
        samples per GPU and ``model`` (default ``CostModel()``). ConfigError for a missing
        summary or a bad field."""
        return cls(batch_size, model or CostModel(), mean_lengths or {}).for_stats(
            tables, topology, summaries)

    def for_stats(self, tables: Sequence[EmbeddingTable], topology: Topology,
                  summaries: Mapping[str, FrequencySummary]) -> "Workload":
        """This workload bound to ``summaries``: its B, model and listed mean lengths, every
        other table's mean length from its summary, and the iterations profiled (kept when set,
        else :func:`iterations_from_samples` of the summaries' samples over ``G x B``)."""
        sums = summaries_by_table(tables, summaries)
        lengths = {t.name: self.mean_length(t.name, sums[t.name]) for t in tables}
        its = self.iterations_profiled
        if its is None:
            its = iterations_from_samples(profiled_samples(sums),
                                          self.samples_per_iteration(topology))
        return replace(self, mean_lengths=lengths, iterations_profiled=its)

    # ------------------------------------------------------------------ what it gives
    @property
    def dedup(self) -> bool:
        """In-batch de-duplication (the cost model's)."""
        return self.model.dedup

    @property
    def profile(self) -> str:
        """The execution profile's name (the cost model's)."""
        return self.model.profile

    def samples_per_iteration(self, topology: Topology) -> int:
        """``G x B``: samples of one iteration on ``topology``."""
        return topology.num_gpus * self.batch_size

    def mean_length(self, name: str, summary: FrequencySummary) -> float:
        """IDs per sample of table ``name``: listed, else ``summary``'s; 0 or unknown: 1."""
        return float(self.mean_lengths.get(name, summary.mean_length) or 1.0)

    def lookups_per_iteration(self, summaries: Mapping[str, FrequencySummary]
                              ) -> dict[str, float]:
        """Lookups per iteration of each summary (``total / iterations_profiled``), keyed as
        ``summaries`` are; ConfigError when the workload was not profiled."""
        its = self.profiled()
        return {n: s.total / its for n, s in summaries.items()}

    def profiled(self) -> int:
        """:attr:`iterations_profiled`, or ConfigError when the workload was not profiled."""
        if self.iterations_profiled is None:
            raise ConfigError("the workload has no profiled iterations: build it with "
                              "Workload.from_stats (or workload.for_stats) from the statistics")
        return self.iterations_profiled


def workload_of(batch_size: Any = None, model: CostModel | None = None,
                mean_lengths: Mapping[str, float] | None = None,
                workload: Workload | None = None, *, where: str = "") -> Workload:
    """The one :class:`Workload` of a public entry point ``where``: ``workload`` (also accepted
    in the place of ``batch_size``), else one built from ``batch_size``, ``model`` (default
    ``CostModel()``) and ``mean_lengths``.

    Loose arguments given beside a workload must agree with it (ConfigError naming the field);
    without either a workload or ``batch_size``, ConfigError.
    """
    if isinstance(batch_size, Workload):
        if workload is not None and workload != batch_size:
            raise ConfigError(f"{where or 'workload'}: two different workloads given")
        workload, batch_size = batch_size, None
    if workload is None:
        if batch_size is None:
            raise ConfigError(f"{where or 'workload'}: give batch_size (samples per GPU per "
                              "iteration) or workload=")
        return Workload(batch_size, model or CostModel(), mean_lengths or {})
    if not isinstance(workload, Workload):
        raise ConfigError(f"{where or 'workload'}: workload must be a Workload, got "
                          f"{type(workload).__name__}")
    clash = [n for n, v, w in (("batch_size", batch_size, workload.batch_size),
                               ("model", model, workload.model)) if v is not None and v != w]
    if mean_lengths and any(workload.mean_lengths.get(k) != float(v)
                            for k, v in mean_lengths.items()):
        clash.append("mean_lengths")
    if clash:
        raise ConfigError(f"{where or 'workload'}: {', '.join(clash)} disagree with the "
                          "workload given; give one or the other")
    return workload
