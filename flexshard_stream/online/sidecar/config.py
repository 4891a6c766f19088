"""The sidecar's settings in one frozen, validated value: :class:`SidecarConfig`.

One definition for the in-process :class:`~flexshard_stream.online.sidecar.Sidecar`, the ring
feed (:func:`~flexshard_stream.online.sidecar.run_ring`) and the ``flexshard-stream sidecar``
command: each reads its defaults from here (the command through :meth:`SidecarConfig.default`,
the ring feed and the command through :meth:`SidecarConfig.for_ring`).

Light on purpose: the standard library and two light project modules at import, so the command
line reads the defaults for ``--help`` without loading numpy or Numba. The re-sharder's
:class:`~flexshard_stream.online.resharder.ReshardConfig` (the ``reshard`` field) is imported when
a config is built.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import MISSING, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from ...errors import ConfigError
from ...stats.config import MAX_SAMPLE_K

if TYPE_CHECKING:
    from ..resharder import ReshardConfig

__all__ = ["POLICIES", "RING_MODE", "SidecarConfig"]

#: ``SidecarConfig.policy`` values: what ``submit`` does with a batch the queue has no room for.
POLICIES = ("drop", "block")

#: What the ring feed changes from the in-process defaults: the ring is the buffer (the feed polls
#: only as many batches as the queue has room for, and every one must be accepted for the exact
#: loss count), and the sidecar has a process of its own (it need not yield to a training loop).
RING_MODE: Mapping[str, Any] = {"policy": "block", "queue_ids": None, "queue_bytes": None,
                                "nice": 0}


def _default_reshard() -> ReshardConfig:
    from ..resharder import ReshardConfig
    return ReshardConfig()


@dataclass(frozen=True)
class SidecarConfig:
    """Every setting of a sidecar, each with one default (units in brackets).

    reshard : ReshardConfig      when and how much the re-sharder moves: its check schedule
                                 (``check_every`` batches or seconds), ``top_k`` rows summarized,
                                 the pause per change, ... (default ``ReshardConfig()``)
    half_life : float | None     the default statistics (when no ``stats=`` is given): None, the
                                 re-sharder's sliding window of 8 checks (``default_stats``); a
                                 number, decayed statistics with that half-life [``reshard.unit``]
    queue_batches : int          most batches waiting in the queue [batches] (64)
    queue_ids : int | None       most IDs waiting [IDs] (2^24; None: no bound)
    queue_bytes : int | None     most bytes of values, lengths, weights, timestamps waiting
                                 [bytes] (512 MiB; None: no bound). A single batch larger than a
                                 bound is accepted only into an empty queue.
    policy : str                 "drop" (``submit`` never waits; a batch that does not fit is
                                 dropped and counted) or "block" (``submit`` waits for room up to
                                 ``block_timeout``, then drops and counts) ("drop")
    block_timeout : float | None  longest wait of a blocking ``submit`` [seconds] (None: forever)
    checkpoint_every_s : float | None  time between periodic checkpoints [seconds] (60; None or
                                 0, stored as None: only on close). A crash loses at most a minute
                                 of statistics, for at most 2% of the ingest thread's time
                                 (docs/SIDECAR.md, "Checkpoints and restart")
    counters_every_s : float     time between rewrites of ``out_dir/counters.json`` [seconds] (1)
    keep_checkpoints, keep_plans : int   checkpoints and published plans kept on disk (2, 4)
    keep_deltas : int | None     published deltas kept on disk (1000; None: all)
    copy : bool                  copy each submitted batch (a loader that reuses its buffers)
                                 (False)
    nice : int                   added to the nice value of the background threads, -20 to 19
                                 (19: they yield the CPU to the training loop; 0: same priority)
    cpu_budget : float | None    cores the ingestion may use; above it the sidecar samples one ID
                                 occurrence in k, k adapting to the offered rate, instead of
                                 dropping batches [cores] (0.5: what a host of tens of cores gives
                                 without competing with its loaders; None: the statistics' own
                                 rate; docs/SIDECAR.md, "Sampling within a CPU budget")
    max_sample_k : int           the sparsest sampling rate the budget may choose, 1 to 2^20
                                 (1024: beyond it what every ID costs whatever the rate is all
                                 that is left to save)
    ingest_threads : int | None  threads updating the tables of a batch in parallel, each table
                                 on one thread in stream order (None: one per started core of the
                                 budget, at most the tables and the machine's cores)

    Frozen; every value is checked here (ConfigError naming the field and the value). Change a
    copy with :meth:`replace`. The ring feed's defaults are :meth:`for_ring` (:data:`RING_MODE`).
    Checkpoints do not record the settings: a restart runs with the settings it is given.
    """

    reshard: ReshardConfig = field(default_factory=_default_reshard)
    half_life: float | None = None
    queue_batches: int = 64
    queue_ids: int | None = 1 << 24
    queue_bytes: int | None = 512 << 20
    policy: str = "drop"
    block_timeout: float | None = None
    checkpoint_every_s: float | None = 60.0
    counters_every_s: float = 1.0
    keep_checkpoints: int = 2
    keep_plans: int = 4
    keep_deltas: int | None = 1000
    copy: bool = False
    nice: int = 19
    cpu_budget: float | None = 0.5
    max_sample_k: int = 1024
    ingest_threads: int | None = None

    def __post_init__(self) -> None:
        from ..resharder import ReshardConfig
        if not isinstance(self.reshard, ReshardConfig):
            self._bad("reshard", "a ReshardConfig")
        if self.policy not in POLICIES:
            self._bad("policy", "'drop' or 'block'")
        if not isinstance(self.copy, bool):
            self._bad("copy", "True or False")
        self._check_counts()
        self._check_seconds()
        if not (_is_integer(self.nice) and -20 <= self.nice <= 19):
            self._bad("nice", "an integer from -20 to 19")
        if self.cpu_budget is not None and not _positive(self.cpu_budget):
            self._bad("cpu_budget", "a finite number of cores > 0 (0.5: half a core) or None")
        if not (_is_integer(self.max_sample_k) and 1 <= self.max_sample_k <= MAX_SAMPLE_K):
            self._bad("max_sample_k", f"an integer from 1 to {MAX_SAMPLE_K}")
        if self.checkpoint_every_s == 0:   # one spelling of "only on close"
            object.__setattr__(self, "checkpoint_every_s", None)

    def _check_counts(self) -> None:
        """Whole numbers: the queue bounds, what is kept on disk, the ingest threads."""
        for name, optional in (("queue_batches", False), ("queue_ids", True),
                               ("queue_bytes", True), ("keep_checkpoints", False),
                               ("keep_plans", False), ("keep_deltas", True),
                               ("ingest_threads", True)):
            v = getattr(self, name)
            if v is None and optional:
                continue
            if not (_is_integer(v) and v >= 1):
                self._bad(name, "a whole number >= 1" + (" or None" if optional else ""))
            object.__setattr__(self, name, int(v))

    def _check_seconds(self) -> None:
        """Durations: the half-life (in the re-sharder's unit), the waits and periods."""
        if self.half_life is not None and not _positive(self.half_life):
            self._bad("half_life", f"a finite number of {self.reshard.unit} > 0 or None")
        if self.block_timeout is not None and not _at_least_zero(self.block_timeout):
            self._bad("block_timeout", "a number of seconds >= 0 or None")
        if self.checkpoint_every_s is not None and not _at_least_zero(self.checkpoint_every_s):
            self._bad("checkpoint_every_s", "a number of seconds >= 0 or None")
        if not (_at_least_zero(self.counters_every_s) and self.counters_every_s > 0):
            self._bad("counters_every_s", "a number of seconds > 0")

    def _bad(self, name: str, expected: str) -> None:
        raise ConfigError(f"SidecarConfig.{name} must be {expected}, got "
                          f"{getattr(self, name)!r}")

    # ------------------------------------------------------------------ building one
    def replace(self, **settings: Any) -> SidecarConfig:
        """A copy with ``settings`` (field names) changed, validated again. TypeError names an
        unknown setting and lists the known ones."""
        self._known(settings)
        return dataclasses.replace(self, **settings) if settings else self

    @classmethod
    def for_ring(cls, **settings: Any) -> SidecarConfig:
        """The ring feed's config: the defaults with :data:`RING_MODE` (block policy, no bound
        in IDs or bytes, nice 0), then ``settings``."""
        return cls(**{**RING_MODE, **settings})

    @classmethod
    def build(cls, config: Any = None, settings: Mapping[str, Any] | None = None, *,
              ring: bool = False) -> SidecarConfig:
        """The config of a sidecar from what its caller was given: ``config`` (a SidecarConfig;
        a :class:`~flexshard_stream.online.resharder.ReshardConfig` is its ``reshard``, as
        ``Sidecar(config=ReshardConfig(...))`` has always meant; None: the defaults, the ring
        feed's with ``ring``), then ``settings`` (keywords named like the fields) on top."""
        from ..resharder import ReshardConfig
        settings = dict(settings or {})
        if isinstance(config, ReshardConfig):
            if "reshard" in settings:
                raise ConfigError("the ReshardConfig is given twice: as config= and as "
                                  "reshard=; pass one")
            settings["reshard"] = config
            config = None
        if config is None:
            cls._known(settings)
            return cls.for_ring(**settings) if ring else cls(**settings)
        if not isinstance(config, SidecarConfig):
            raise ConfigError(f"config must be a SidecarConfig (or a ReshardConfig), got "
                              f"{type(config).__name__}")
        return config.replace(**settings)

    @classmethod
    def _known(cls, settings: Mapping[str, Any]) -> None:
        """TypeError naming the keywords that are no setting, and listing the settings."""
        unknown = sorted(set(settings) - set(cls.fields()))
        if unknown:
            raise TypeError(f"unknown sidecar setting(s) {unknown}; the settings are "
                            f"{list(cls.fields())} (SidecarConfig)")

    # ------------------------------------------------------------------ reading the defaults
    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The setting names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def default(cls, name: str, *, ring: bool = False) -> Any:
        """The default of setting ``name`` (the ring feed's with ``ring``), without building a
        config: the simple fields import nothing (the command line's ``--help``)."""
        if ring and name in RING_MODE:
            return RING_MODE[name]
        cls._known({name: None})
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        return f.default_factory() if f.default is MISSING else f.default


def _is_integer(v: Any) -> bool:
    """An int, or a float holding a whole number (``512e6``); never a bool."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return False
    return isinstance(v, numbers.Integral) or (math.isfinite(v) and float(v).is_integer())


def _at_least_zero(v: Any) -> bool:
    """A real number >= 0 (infinity allowed: never), not a bool nor NaN."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and v >= 0


def _positive(v: Any) -> bool:
    """A finite real number > 0, not a bool."""
    return _at_least_zero(v) and math.isfinite(v) and v > 0
