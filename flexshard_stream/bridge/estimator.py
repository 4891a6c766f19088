"""TorchRec-compatible communication cost: what TorchRec 1.8's planner charges a shard for comms.

This module reproduces, with plain numbers and no TorchRec/torch import, the communication terms of
TorchRec 1.8.0's default planner estimator (``EmbeddingPerfEstimator`` in
``torchrec/distributed/planner/shard_estimators.py``, which in 1.8 delegates to the evaluator classes
of ``torchrec/distributed/planner/estimator/estimator.py`` with the default
``EmbeddingPerfEstimatorConfig`` of ``estimator/config.py``) for table-wise (TW), row-wise (RW) and
table-row-wise (TWRW) sharding of pooled (``EmbeddingBag``) and sequence (``Embedding``) tables.

Source read: the ``torchrec==1.8.0`` wheel from PyPI (``torchrec/version.py``:
``git_version = 'e2a8e5b8f489fb02bc5a2d065ed9c343d2656b41'``). Line numbers quoted below are from
that release. ``docs/TORCHREC_COMPAT.md`` lists every formula with its source lines.

Units
-----
* Bytes are bytes (per iteration, per **shard**, as TorchRec's ``Perf`` is per shard).
* TorchRec's bandwidth constants are ``GiB/s`` written as bytes per millisecond
  (``600 * 1024 * 1024 * 1024 / 1000  # bytes/ms``), so every TorchRec perf figure is in
  **milliseconds**, even where its docstrings say "seconds". Here bandwidths are taken in
  **bytes per second** (``600 * 2**30`` for "600 GB/s", i.e. GiB-based, 644.2e9 B/s) and times are
  returned both in seconds (``*_s``) and in TorchRec's milliseconds (``*_ms``, equal to the
  ``Perf`` fields TorchRec would print).
* Bandwidth is per rank: ``BasicCommsBandwidths.get_bw`` returns the intra- or inter-host figure
  unscaled for all-to-all / reduce-scatter / all-gather (only all-reduce, which TW/RW/TWRW do not
  use, is scaled by ``local_world_size``, "1 NIC per GPU").

What TorchRec models (and therefore this module)
------------------------------------------------
* Uniform access, no de-duplication: every lookup of every sample travels (``batch_inputs =
  sum(input_lengths * num_poolings * batch_sizes)``), whatever the row distribution.
* One bandwidth for a whole collective: the inter-host bandwidth as soon as the collective spans
  more ranks than one host holds (``world_size > local_world_size``), else the intra-host one. A TW
  or RW table on a 2-host job is charged entirely at 12.5 GiB/s, even the bytes between GPUs of one
  host.
* Index bytes: ``input_dist_comms`` is computed (8 bytes per index, all sharding types) but is not
  part of ``Perf.total``, so it does not enter the plan's score.
* ``is_weighted`` doubles ``input_read_size`` (a compute term) but changes no comm term; the
  input-dist formula is explicitly evaluated without the weighted factor.

What else TorchRec adds to a shard's score (not computed here)
--------------------------------------------------------------
``Perf.total = fwd_compute + bwd_compute + fwd_comms + bwd_comms + prefetch_compute`` with
``fwd_compute = (input_read_size + embedding_lookup_size + fwd_output_write_size) * block_penalty /
device_bw`` (block penalty 1.15 / 1.75 for TW with dim < 128 / < 64; TW also uses ``max(dim, 32)``
for the lookup), ``bwd_compute = fwd_compute * 2`` (``BWD_COMPUTE_MULTIPLIER``; weighted features
add ``fwd_compute * 1.1``), and ``prefetch_compute`` for UVM-caching kernels. RW and TWRW also put a
device-bandwidth "batched copy" (``output_size * 2.455 / device_bw``) inside ``bwd_comms``; it is
included in ``bwd_comm_s`` here (because TorchRec books it there) and reported on its own. The
planner's ``NoopPerfModel`` rates a plan as the maximum over ranks of the summed ``Perf.total``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError
from .sharding import torchrec_sharding

__all__ = [
    "GIB", "TORCHREC_VERSION", "TORCHREC_GIT_VERSION",
    "TORCHREC_INTRA_HOST_BW", "TORCHREC_INTER_HOST_BW", "TORCHREC_HBM_MEM_BW",
    "TORCHREC_DDR_MEM_BW", "TORCHREC_HBM_TO_DDR_MEM_BW", "TORCHREC_BIGINT_DTYPE",
    "TORCHREC_BATCHED_COPY_PERF_FACTOR", "TORCHREC_BWD_COMPUTE_MULTIPLIER",
    "TORCHREC_WEIGHTED_KERNEL_MULTIPLIER", "TORCHREC_WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER",
    "TORCHREC_BATCH_SIZE", "SHARDING_TYPES", "KINDS",
    "torchrec_comms_bw", "torchrec_batch_inputs", "torchrec_batch_outputs",
    "torchrec_default_num_shards", "torchrec_shard_comm", "torchrec_sharding_of",
    "torchrec_plan_comm",
]

TORCHREC_VERSION = "1.8.0"
TORCHREC_GIT_VERSION = "e2a8e5b8f489fb02bc5a2d065ed9c343d2656b41"  # torchrec/version.py of 1.8.0

# ---------------------------------------------------------------------------------------------
# Constants of torchrec/distributed/planner/constants.py (1.8.0), converted to bytes per SECOND.
# TorchRec writes them in bytes/ms with a 1024**3 "GB": e.g. line 16
#   INTRA_NODE_BANDWIDTH: float = 600 * 1024 * 1024 * 1024 / 1000  # bytes/ms
# so "600 GB/s" there is 600 GiB/s = 644.245e9 B/s, not 600e9.
# ---------------------------------------------------------------------------------------------
GIB = 1024 ** 3
TORCHREC_INTRA_HOST_BW = 600 * GIB     # l.16 INTRA_NODE_BANDWIDTH = 600 * 1024**3 / 1000 (B/ms)
TORCHREC_INTER_HOST_BW = 12.5 * GIB    # l.17 CROSS_NODE_BANDWIDTH = 12.5 * 1024**3 / 1000 (B/ms)
TORCHREC_DDR_MEM_BW = 51 * GIB         # l.28 DDR_MEM_BW = 51 * 1024**3 / 1000 (B/ms)
TORCHREC_HBM_MEM_BW = 897 * GIB        # l.29 HBM_MEM_BW = 897 * 1024**3 / 1000 (B/ms)
TORCHREC_HBM_TO_DDR_MEM_BW = 32 * GIB  # l.33 HBM_TO_DDR_MEM_BW = 32 * 1024**3 / 1000 (B/ms)
TORCHREC_BIGINT_DTYPE = 8              # l.23 BIGINT_DTYPE: int = 8 (bytes per index)
TORCHREC_BATCH_SIZE = 512              # l.36 BATCH_SIZE: int = 512 (per-rank default)
TORCHREC_BATCHED_COPY_PERF_FACTOR = 2.455  # l.38
TORCHREC_BWD_COMPUTE_MULTIPLIER = 2.0      # l.42 (compute only; no comm multiplier exists)
TORCHREC_WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER = 1.0  # l.43 (compute only)
TORCHREC_WEIGHTED_KERNEL_MULTIPLIER = 1.1  # l.44 (compute only)

SHARDING_TYPES = ("table_wise", "row_wise", "table_row_wise")
KINDS = ("sequence", "pooled")

_A2A, _RS, _AG = "all_to_all", "reduce_scatter", "all_gather"


def torchrec_comms_bw(collective: str, world_size: int, local_world_size: int,
                      intra_host_bw: float = TORCHREC_INTRA_HOST_BW,
                      inter_host_bw: float = TORCHREC_INTER_HOST_BW) -> float:
    """Bandwidth (bytes/s) TorchRec charges a collective: ``BasicCommsBandwidths.get_bw``.

    ``torchrec/distributed/planner/types.py`` l.283-288 (1.8.0)::

        if collective_type == CollectiveType.ALL_REDUCE:
            return self.inter_host_bw * local_world_size  # 1 NIC per GPU
        if world_size <= local_world_size:
            return self.intra_host_bw
        else:
            return self.inter_host_bw
    """
    if collective == "all_reduce":
        return inter_host_bw * local_world_size
    return intra_host_bw if world_size <= local_world_size else inter_host_bw


def torchrec_batch_inputs(batch_size: float, mean_length: float, num_poolings: float = 1.0) -> float:
    """``ShardPerfContext.batch_inputs`` (estimator/types.py l.808-813), for one input feature:
    ``sum(x * y * z for x, y, z in zip(input_lengths, num_poolings, batch_sizes))``."""
    return mean_length * num_poolings * batch_size


def torchrec_batch_outputs(batch_size: float, mean_length: float, pooled: bool,
                           num_poolings: float = 1.0) -> float:
    """``ShardPerfContext.batch_outputs`` (estimator/types.py l.816-834): pooled tables emit one
    vector per sample (``min(1.0, il) * x * y``), sequence tables one per lookup (``batch_inputs``)."""
    if pooled:
        return min(1.0, mean_length) * num_poolings * batch_size
    return torchrec_batch_inputs(batch_size, mean_length, num_poolings)


def torchrec_default_num_shards(sharding: str, world_size: int, local_world_size: int,
                                pod_size: int | None = None) -> int:
    """Shards TorchRec's enumerator makes: TW 1, RW ``world_size``, TWRW ``intra_group_size``.

    ``sharding_plan.calculate_shard_sizes_and_offsets``: RW over ``world_size``; TWRW
    ``_calculate_rw_shard_sizes_and_offsets(rows, local_world_size, columns)`` with
    ``enumerators.py`` l.104 ``self._local_world_size: int = topology.intra_group_size``, and
    ``types.py`` l.1043 ``intra_group_size = pod_size * local_world_size`` (or ``local_world_size``).
    """
    _check_sharding(sharding)
    if sharding == "table_wise":
        return 1
    if sharding == "row_wise":
        return world_size
    return _intra_group_size(local_world_size, pod_size)


def _intra_group_size(local_world_size: int, pod_size: int | None) -> int:
    # types.py l.1043-1047: pod_size * local_world_size if pod_size is not None else local_world_size
    return pod_size * local_world_size if pod_size is not None else local_world_size


def _check_sharding(sharding: str) -> None:
    if sharding not in SHARDING_TYPES:
        raise ConfigError(f"sharding {sharding!r} is not modelled; expected one of "
                          f"{', '.join(SHARDING_TYPES)}")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _positive_float(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{name} must be a finite positive number, got {value!r}")
    return v


def torchrec_shard_comm(sharding: str, kind: str, batch_size: int, world_size: int,
                        local_world_size: int, num_rows: int, dim: int, element_bytes: int,
                        mean_length: float, num_shards: int | None = None, *,
                        intra_host_bw: float = TORCHREC_INTRA_HOST_BW,
                        inter_host_bw: float = TORCHREC_INTER_HOST_BW,
                        device_bw: float = TORCHREC_HBM_MEM_BW, pod_size: int | None = None,
                        num_poolings: float = 1.0, is_weighted: bool = False,
                        fwd_a2a_bytes: float | None = None, bwd_a2a_bytes: float | None = None,
                        fwd_rs_bytes: float | None = None, bwd_rs_bytes: float | None = None
                        ) -> dict[str, Any]:
    """Communication bytes and times TorchRec 1.8 charges ONE shard of a table, and the table.

    Parameters
    ----------
    sharding : ``"table_wise" | "row_wise" | "table_row_wise"``
    kind : ``"sequence"`` (``EmbeddingCollection``, ``is_pooled=False``) or ``"pooled"``.
    batch_size : per-rank batch B (TorchRec's ``sharding_option.batch_size``; default there 512).
    world_size, local_world_size : ranks in the job, ranks per host. (TorchRec's ``Topology``
        defaults ``local_world_size`` to ``world_size``, i.e. one host, when it is not given.)
    num_rows : rows of the table. No TorchRec comm formula uses it (reported back only).
    dim : embedding dimension D of the shard (TW/RW/TWRW shards keep the full D).
    element_bytes : bytes per element of the table (4 fp32, 2 fp16); also the default size of the
        comm dtypes, as TorchRec's ``extract_comm_data_type_size`` does without qcomm codecs.
    mean_length : input length L (TorchRec ``input_lengths``: pooling factor / sequence length).
    num_shards : must be ``None`` or TorchRec's own count (TW 1, RW ``world_size``, TWRW
        ``intra_group_size``); it only scales the ``table_*`` totals. TorchRec's per-shard formulas
        do not depend on it, so any other value is refused rather than silently mis-modelled.
    intra_host_bw, inter_host_bw : bytes/s; defaults are TorchRec 1.8's 600 GiB/s and 12.5 GiB/s.
    device_bw : bytes/s of the lookup kernel (``kernel_bw_lookup``: HBM 897 GiB/s for the default
        cuda ``fused`` kernel); used only by the RW/TWRW backward batched copy.
    pod_size : TorchRec 1.8 ``Topology(pod_size=...)``: hosts per NVLink domain; the TWRW group is
        ``pod_size * local_world_size`` ranks. ``None`` (default) means one host.
    num_poolings : TorchRec ``num_poolings`` (1.0 by default).
    is_weighted : accepted for completeness; TorchRec 1.8 changes no comm term for it.
    fwd_a2a_bytes, bwd_a2a_bytes, fwd_rs_bytes, bwd_rs_bytes : bytes per element of quantized comms
        (qcomm codecs); ``None`` means ``element_bytes``.

    Returns
    -------
    dict with, per shard (TorchRec ``Perf`` is per shard, charged to the rank holding it):

    ``fwd_comm_bytes``, ``bwd_comm_bytes``
        bytes the output dist moves (forward) and the gradient dist moves (backward).
    ``input_dist_bytes``
        index bytes of the input dist (8 B per index).
    ``fwd_comm_s``, ``bwd_comm_s``, ``input_dist_s`` and the same in ``*_ms``
        TorchRec's ``fwd_comms``, ``bwd_comms``, ``input_dist_comms``. ``bwd_comm_*`` includes the
        RW/TWRW batched copy exactly as TorchRec books it; ``bwd_network_s`` excludes it,
        ``bwd_batched_copy_s`` is the copy alone.
    ``score_comm_s`` / ``score_comm_ms``
        ``fwd_comms + bwd_comms``: the comm part of ``Perf.total`` (input dist excluded).
    ``fwd_links``, ``bwd_links``
        bandwidth class charged per component ("intra" / "inter").
    ``components``
        tuple of dicts (pass, collective, link, bytes, bandwidth, seconds).
    ``num_shards`` and ``table_*``
        the per-table sums (``num_shards`` times the per-shard figures).
    ``note``
        what was modelled and what TorchRec leaves out.
    """
    _check_shard(sharding, kind, batch_size, world_size, local_world_size, num_rows, dim,
                 element_bytes, pod_size)
    L = _mean_length(mean_length)
    num_poolings = _positive_float("num_poolings", num_poolings)
    comms = _Collectives(_positive_float("intra_host_bw", intra_host_bw),
                         _positive_float("inter_host_bw", inter_host_bw))
    device_bw = _positive_float("device_bw", device_bw)
    dt = _CommDtypes.of(element_bytes, fwd_a2a_bytes, bwd_a2a_bytes, fwd_rs_bytes, bwd_rs_bytes)
    num_shards = _num_shards(sharding, world_size, local_world_size, pod_size, num_shards)
    pooled = kind == "pooled"
    W, LW = world_size, local_world_size
    batch_inputs = torchrec_batch_inputs(batch_size, L, num_poolings)
    batch_outputs = torchrec_batch_outputs(batch_size, L, pooled, num_poolings)
    if sharding == "table_wise":
        copy_bytes = _table_wise_comms(comms, batch_outputs, W, LW, dim, dt)
    elif sharding == "row_wise":
        copy_bytes = _row_wise_comms(comms, batch_outputs, pooled, W, LW, dim, dt)
    else:
        copy_bytes = _table_row_wise_comms(comms, batch_outputs, pooled, W, LW, dim, dt,
                                           pod_size)
    result: dict[str, Any] = {
        "sharding": sharding, "kind": kind, "num_rows": num_rows, "num_shards": num_shards,
        "batch_inputs": batch_inputs, "batch_outputs": batch_outputs,
        **_shard_totals(comms, copy_bytes, device_bw, batch_inputs, W, LW),
        "note": _shard_note(sharding, kind, W > LW),
    }
    for key in ("fwd_comm", "bwd_comm", "bwd_network", "bwd_batched_copy", "input_dist",
                "score_comm"):
        result[f"{key}_ms"] = result[f"{key}_s"] * 1000.0
    for key in ("fwd_comm_bytes", "bwd_comm_bytes", "input_dist_bytes", "fwd_comm_s",
                "bwd_comm_s", "input_dist_s", "score_comm_s"):
        result[f"table_{key}"] = result[key] * num_shards
    return result


def _shard_totals(comms: _Collectives, copy_bytes: float, device_bw: float,
                  batch_inputs: float, W: int, LW: int) -> dict[str, Any]:
    """Bytes (per iteration) and seconds of one shard's forward and backward passes, its batched
    copy and its input dist, from the collectives charged (see :func:`torchrec_shard_comm`)."""
    # estimator.py l.111-130 (_compute_batched_copy), used by RW l.1306-1313 and TWRW l.1497-1505:
    #   return output_size * BATCHED_COPY_PERF_FACTOR / device_bw   (added into bwd_comms)
    bwd_copy_s = copy_bytes * TORCHREC_BATCHED_COPY_PERF_FACTOR / device_bw
    # estimator.py l.1027-1072 (_default_input_dist_comms), same for TW, RW and TWRW:
    #   input_read_size = math.ceil(ctx.batch_inputs * ctx.world_size * ctx.input_data_type_size)
    #   comms_bw = get_bw(world_size=ctx.world_size, local_world_size=..., ALL_TO_ALL)
    # computed without the is_weighted doubling, and NOT part of Perf.total (types.py l.99-105).
    input_dist_bytes = float(math.ceil(batch_inputs * W * TORCHREC_BIGINT_DTYPE))
    input_dist_s = input_dist_bytes / torchrec_comms_bw(_A2A, W, LW, comms.intra_host_bw,
                                                        comms.inter_host_bw)
    fwd = [c for c in comms.components if c["pass"] == "fwd"]
    bwd = [c for c in comms.components if c["pass"] == "bwd"]
    fwd_s = sum(c["seconds"] for c in fwd)
    bwd_net_s = sum(c["seconds"] for c in bwd)
    bwd_s = bwd_net_s + bwd_copy_s
    return {"fwd_comm_bytes": sum(c["bytes"] for c in fwd),
            "bwd_comm_bytes": sum(c["bytes"] for c in bwd),
            "input_dist_bytes": input_dist_bytes, "bwd_batched_copy_bytes": copy_bytes,
            "fwd_comm_s": fwd_s, "bwd_comm_s": bwd_s, "bwd_network_s": bwd_net_s,
            "bwd_batched_copy_s": bwd_copy_s, "input_dist_s": input_dist_s,
            "score_comm_s": fwd_s + bwd_s,
            "fwd_links": tuple(c["link"] for c in fwd),
            "bwd_links": tuple(c["link"] for c in bwd),
            "components": tuple(comms.components)}


def _check_shard(sharding: str, kind: str, batch_size: Any, world_size: Any,
                 local_world_size: Any, num_rows: Any, dim: Any, element_bytes: Any,
                 pod_size: Any) -> None:
    """The shape arguments of :func:`torchrec_shard_comm` (ConfigError naming the bad one):
    hosts hold equal numbers of ranks, a pod divides the job."""
    _check_sharding(sharding)
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r} is not modelled; expected 'sequence' or 'pooled'")
    _positive_int("batch_size", batch_size)
    _positive_int("world_size", world_size)
    _positive_int("local_world_size", local_world_size)
    _positive_int("num_rows", num_rows)
    _positive_int("dim", dim)
    _positive_int("element_bytes", element_bytes)
    if world_size % local_world_size != 0:
        raise ConfigError(f"world_size {world_size} is not a multiple of local_world_size "
                          f"{local_world_size}: hosts must hold the same number of ranks")
    if pod_size is not None:
        _positive_int("pod_size", pod_size)
        if pod_size * local_world_size > world_size or world_size % (pod_size * local_world_size):
            raise ConfigError(f"pod_size {pod_size} x local_world_size {local_world_size} must "
                              f"divide world_size {world_size}")


def _mean_length(mean_length: Any) -> float:
    """``mean_length`` as a finite number >= 0 (IDs per sample)."""
    try:
        L = float(mean_length)
    except (TypeError, ValueError):
        raise ConfigError(f"mean_length must be a number, got {mean_length!r}") from None
    if not math.isfinite(L) or L < 0:
        raise ConfigError(f"mean_length must be a finite number >= 0, got {mean_length!r}")
    return L


def _num_shards(sharding: str, world_size: int, local_world_size: int, pod_size: int | None,
                num_shards: Any) -> int:
    """TorchRec's own shard count (TW 1, RW ``world_size``, TWRW ``intra_group_size``); any
    other ``num_shards`` is refused (TorchRec's per-shard formulas do not depend on it)."""
    default_shards = torchrec_default_num_shards(sharding, world_size, local_world_size, pod_size)
    if num_shards is None:
        return default_shards
    if _positive_int("num_shards", num_shards) != default_shards:
        raise ConfigError(f"num_shards {num_shards} for {sharding}: TorchRec 1.8 always makes "
                          f"{default_shards} shard(s) here (TW 1, RW world_size, TWRW "
                          f"intra_group_size); pass None")
    return num_shards


class _CommDtypes(NamedTuple):
    """Bytes per element of the comms (qcomm codecs): forward / backward all-to-all and
    reduce-scatter (TorchRec's SR dtype)."""

    fwd_a2a: float
    bwd_a2a: float
    fwd_rs: float
    bwd_rs: float

    @classmethod
    def of(cls, element_bytes: int, fwd_a2a: Any, bwd_a2a: Any, fwd_rs: Any, bwd_rs: Any
           ) -> "_CommDtypes":
        """The given sizes (checked), ``element_bytes`` where None (no qcomm codec)."""
        e = float(element_bytes)
        return cls(*(e if v is None else _positive_float(f"{n}_bytes", v) for n, v in (
            ("fwd_a2a", fwd_a2a), ("bwd_a2a", bwd_a2a), ("fwd_rs", fwd_rs), ("bwd_rs", bwd_rs))))


class _Collectives:
    """The collectives of one shard as TorchRec charges them, with the bandwidths (bytes/s)."""

    def __init__(self, intra_host_bw: float, inter_host_bw: float):
        self.intra_host_bw = intra_host_bw
        self.inter_host_bw = inter_host_bw
        self.components: list[dict[str, Any]] = []

    def charge(self, pass_: str, collective: str, nbytes: float, coll_world: int,
               coll_local: int) -> None:
        """One collective of ``nbytes`` bytes over ``coll_world`` ranks, ``coll_local`` per host."""
        # estimator.py l.102-109 (_compute_collective_comms): comms_bw = get_bw(world_size=...,
        # local_world_size=..., collective_type=...); return output_size / comms_bw
        bandwidth = torchrec_comms_bw(collective, coll_world, coll_local, self.intra_host_bw,
                                      self.inter_host_bw)
        link = "intra" if coll_world <= coll_local else "inter"
        self.components.append({"pass": pass_, "collective": collective, "link": link,
                                "bytes": float(nbytes), "bandwidth": bandwidth,
                                "seconds": float(nbytes) / bandwidth})


def _table_wise_comms(c: _Collectives, batch_outputs: float, W: int, LW: int, D: int,
                      dt: _CommDtypes) -> float:
    """TW: one world-wide all-to-all each way; no batched copy (returns 0 bytes)."""
    # TableWiseEvaluator, estimator.py l.1132-1155, with the base _get_output_write_size l.581:
    #   return ctx.batch_outputs * ctx.world_size * ctx.emb_dim * data_type_size
    # and _get_comm_data_type_size l.583-601 (A2A dtype); one world-wide ALL_TO_ALL each way.
    c.charge("fwd", _A2A, batch_outputs * W * D * dt.fwd_a2a, W, LW)
    c.charge("bwd", _A2A, batch_outputs * W * D * dt.bwd_a2a, W, LW)
    return 0.0


def _row_wise_comms(c: _Collectives, batch_outputs: float, pooled: bool, W: int, LW: int,
                    D: int, dt: _CommDtypes) -> float:
    """RW: world-wide reduce-scatter forward, all-gather backward; returns the bytes of the
    backward batched copy."""
    # RowWiseEvaluator, estimator.py l.1207-1238 (_get_output_write_size):
    #   pooled:   ctx.batch_outputs * ctx.world_size * ctx.emb_dim * data_type_size
    #   sequence: ctx.batch_outputs / world_size * ctx.world_size * ctx.emb_dim * data_type_size
    # l.1240-1253: SR dtype if pooled else A2A dtype.
    # l.1281-1313: fwd REDUCE_SCATTER, bwd ALL_GATHER (+ batched copy), world-wide.
    f_dt, b_dt = (dt.fwd_rs, dt.bwd_rs) if pooled else (dt.fwd_a2a, dt.bwd_a2a)
    out = batch_outputs * W * D if pooled else batch_outputs / W * W * D
    c.charge("fwd", _RS, out * f_dt, W, LW)
    c.charge("bwd", _AG, out * b_dt, W, LW)
    return out * b_dt


def _table_row_wise_comms(c: _Collectives, batch_outputs: float, pooled: bool, W: int, LW: int,
                          D: int, dt: _CommDtypes, pod_size: int | None) -> float:
    """TWRW: reduce-scatter / all-gather inside a group, all-to-all between groups; returns the
    bytes of the backward batched copy."""
    # TableRowWiseEvaluator, estimator.py l.1319-1509. Group = intra_group_size ranks
    # (estimator/types.py l.803-805: num_twrw_groups = max(1, world_size // intra_group_size)).
    igs = _intra_group_size(LW, pod_size)
    groups = max(1, W // igs)
    # l.1372-1388: pooled batch_outputs * world_size * emb_dim * dt;
    #              sequence batch_outputs / intra_group_size * world_size * emb_dim * dt
    # l.1390-1395: always the SR dtype for this intra-group part.
    out = batch_outputs * W * D if pooled else batch_outputs / igs * W * D
    intra_local = min(igs, LW)  # l.1433: intra_local_world_size = min(igs, lws)
    # l.1434-1439 fwd: REDUCE_SCATTER(world_size=igs, local_world_size=min(igs, lws))
    c.charge("fwd", _RS, out * dt.fwd_rs, igs, intra_local)
    if groups > 1:
        # l.1445-1457: if num_groups > 1: batch_outputs * num_groups * emb_dim * fwd_a2a,
        # ALL_TO_ALL(world_size=num_groups, local_world_size=1). NB: batch_outputs is NOT
        # divided by the group size here, for sequence tables either.
        c.charge("fwd", _A2A, batch_outputs * groups * D * dt.fwd_a2a, groups, 1)
        # l.1473-1485: same for bwd with bwd_a2a
        c.charge("bwd", _A2A, batch_outputs * groups * D * dt.bwd_a2a, groups, 1)
    # l.1489-1494 bwd: ALL_GATHER(world_size=igs, local_world_size=min(igs, lws)); + copy
    c.charge("bwd", _AG, out * dt.bwd_rs, igs, intra_local)
    return out * dt.bwd_rs


def _shard_note(sharding: str, kind: str, spans_hosts: bool) -> str:
    """What :func:`torchrec_shard_comm` modelled and what TorchRec leaves out."""
    return (f"TorchRec {TORCHREC_VERSION} ({sharding}, {kind}): per-shard Perf comm terms, "
            f"uniform access, no de-duplication; "
            + ("job spans hosts, so world-wide collectives are charged at inter_host_bw; "
               if spans_hosts else "single host, all collectives at intra_host_bw; ")
            + "input dist (8 B/index) computed but excluded from Perf.total; "
              "bwd_comm includes the device batched copy for RW/TWRW"
            + ("; NB: TorchRec 1.8's EmbeddingCollectionSharder does not offer table_row_wise, "
               "so the planner never proposes this (formula evaluated as written)"
               if sharding == "table_row_wise" and kind != "pooled" else ""))


def torchrec_sharding_of(tp: Any, topo: Any) -> str:
    """TorchRec's sharding type of one :class:`~flexshard_stream.plans.plan.TablePlan`, if it is
    one table TorchRec's estimator prices here (TW, RW or TWRW).

    The type of the sharding rule (:func:`~flexshard_stream.bridge.sharding.torchrec_sharding`):
    the table plan's own when TorchRec runs it directly, else the export's cold table's (its
    rows renumbered; TorchRec's estimate, uniform access, does not depend on which rows). A
    sequence table on one node is priced with TorchRec's TWRW formula as written (TorchRec's
    evaluator has it; its sharder never proposes it, and the export runs the table row-wise,
    the rule's ``fallback``). Replicas (global or node) have none: the export makes them a
    second, data-parallel table.
    """
    return _estimated(tp, topo)[0]


def _estimated(tp: Any, topo: Any) -> tuple[str, tuple[int, ...]]:
    """(sharding type, rank of each shard) that :func:`torchrec_plan_comm` prices for ``tp``."""
    r = torchrec_sharding(tp, topo)
    if r.hot_rows:
        raise ConfigError(f"table {tp.name!r}: replicated rows have no TorchRec sharding type of "
                          f"one table (the export makes them a data-parallel hot table beside "
                          f"the cold one; only TW, RW and TWRW are modelled)")
    if r.sharding_type not in SHARDING_TYPES:
        raise ConfigError(f"table {tp.name!r}: TorchRec shards it {r.sharding_type}; no "
                          f"TorchRec sharding type modelled here (only TW, RW and TWRW are)")
    return r.sharding_type, r.ranks


def torchrec_plan_comm(plan: Any, batch_size: int, mean_lengths: dict[str, float]) -> dict:
    """TorchRec 1.8's communication estimate for every table of a TW/RW/TWRW plan.

    Returns ``{"tables": {name: {...per-table totals...}}, "fwd_comm_bytes": .., "bwd_comm_bytes":
    .., "input_dist_bytes": .., "score_comm_s": ..}``: bytes per iteration summed over shards, and
    the communication part of the score as TorchRec rates a plan (the slowest rank's sum).
    """
    topo = plan.topology
    W, M = topo.num_gpus, topo.gpus_per_node
    out: dict[str, Any] = {"tables": {}, "fwd_comm_bytes": 0.0, "bwd_comm_bytes": 0.0,
                           "input_dist_bytes": 0.0}
    per_rank = np.zeros(W)
    for name, tp in plan.tables.items():
        sh, ranks = _estimated(tp, topo)
        t = tp.table
        r = torchrec_shard_comm(sh, t.kind, batch_size, W, M, t.num_rows, t.dim,
                                t.element_bytes, float(mean_lengths.get(name, 1.0)))
        out["tables"][name] = {"sharding": sh, **{k: v for k, v in r.items()
                                                  if k.startswith("table_") or k == "num_shards"}}
        for k in ("fwd_comm_bytes", "bwd_comm_bytes", "input_dist_bytes"):
            out[k] += r[f"table_{k}"]
        per_rank[list(ranks)] += r["fwd_comm_s"] + r["bwd_comm_s"]
    out["score_comm_s"] = float(per_rank.max()) if W else 0.0
    return out
