"""Seeded drift scenarios for synthetic traces: the row distribution changes from window to window.

A trace is cut into *windows* of ``samples_per_window`` samples; window ``w`` is drawn from a
distribution that depends on the scenario and on ``w`` only (never on how many windows are asked for,
nor on the samples per batch). Scenarios (:data:`SCENARIOS`):

- ``"stationary"``: no drift (the control). Same distribution and same rank -> ID permutation as
  :func:`flexshard_stream.sources.synth.generate` with the same seed.
- ``"rotating"``: each window, ``round(rate * k)`` of the ``k`` hot rows are demoted and replaced by
  rows that were the coldest of the table.
- ``"zipf_shift"``: the Zipf exponent moves linearly from ``alpha0`` to ``alpha1`` over ``span``
  windows, then stays.
- ``"flash_crowd"``: from window ``start``, ``size`` brand-new IDs (never drawn before) take a share
  ``share`` of the lookups for ``duration`` windows, then fade out linearly over ``fade`` windows.
- ``"daily_cycle"``: ``sets`` hot sets (independent rank -> ID permutations) alternate with a period
  of ``period`` windows; the weight of set ``h`` is ``(1 + depth * cos(2 pi (w / period - h / sets)))
  / sets``.

Build a :class:`DriftSpec` (or :func:`scenario`), then :func:`generate_windows` yields one window at a
time as a list of :class:`~flexshard_stream.stats.batch.Batch`. :func:`true_top` and :func:`true_prob`
give the exact access probabilities of a window, for oracles and tests.

Randomness: window ``w`` of table ``t`` draws lengths, then ranks, then any mixture draws from
``SeedSequence(seed, spawn_key=(2, crc32(t.name), t.seed_offset, w))``; extra permutations (the
rotation order, the daily-cycle hot sets) come from ``spawn_key=(3, crc32(t.name), t.seed_offset, j)``.
The base rank -> ID permutation is the table's own :meth:`~flexshard_stream.sources.synth.TableSpec.permutation`.
See ``docs/SYNTHETIC.md``, section "Drift".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..compat import REMOVED_IN, renamed_keywords
from ..errors import ConfigError
from ..stats.batch import Batch
from .synth import (
    IdPermutation,
    TableSpec,
    checked_int,
    checked_tables,
    sample_lengths,
    zipf_normalizer,
    zipf_pmf_head,
    zipf_ranks,
)

__all__ = ["SCENARIOS", "DriftSpec", "scenario", "generate_windows", "true_top", "true_prob",
           "crowd_ids"]

#: Scenario names, in the order of the module docstring.
SCENARIOS = ("stationary", "rotating", "zipf_shift", "flash_crowd", "daily_cycle")

_REQUIRED = object()

#: Parameters of each scenario and their defaults (``_REQUIRED``: no default).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "stationary": {},
    "rotating": {"k": 1000, "rate": 0.1},
    "zipf_shift": {"alpha1": _REQUIRED, "alpha0": None, "span": 10},
    "flash_crowd": {"start": 5, "duration": 3, "share": 0.2, "size": 1000, "fade": 2,
                    "crowd_alpha": 1.0},
    "daily_cycle": {"period": 24, "sets": 2, "depth": 1.0},
}

#: What each parameter is, with its unit (used in error messages).
_WHAT = {
    "k": "hot-set size, rows",
    "rate": "fraction of the hot set replaced per window",
    "alpha1": "final Zipf exponent",
    "alpha0": "initial Zipf exponent, None = the table's alpha",
    "span": "windows to go from alpha0 to alpha1",
    "start": "first window of the crowd",
    "duration": "windows at full share",
    "share": "fraction of lookups going to the crowd",
    "size": "number of new IDs, rows",
    "fade": "windows of linear fade-out after the crowd",
    "crowd_alpha": "Zipf exponent within the crowd",
    "period": "windows per cycle",
    "sets": "number of alternating hot sets",
    "depth": "modulation depth of the mixture weights",
}

#: Largest candidate pool per hot set in :func:`true_top` for ``daily_cycle`` (rows).
_MAX_POOL = 1 << 22


def _float(value: Any, where: str, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number, got {value!r}") from None
    bad = not math.isfinite(v)
    bad |= lo is not None and (v < lo or (lo_open and v == lo))
    bad |= hi is not None and (v > hi or (hi_open and v == hi))
    if bad:
        lb = "" if lo is None else ("(" if lo_open else "[") + f"{lo:g}"
        ub = "" if hi is None else f"{hi:g}" + (")" if hi_open else "]")
        rng = f"in {lb}, {ub}" if lo is not None and hi is not None else (
            f"{'>' if lo_open else '>='} {lo:g}" if lo is not None else f"<= {hi:g}")
        raise ConfigError(f"{where} must be finite and {rng}, got {value!r}")
    return v


# ================================================================== the spec
@dataclass(frozen=True)
class DriftSpec:
    """A drift scenario and its parameters (validated; missing parameters take their defaults).

    Attributes
    ----------
    name : str
        One of :data:`SCENARIOS`.
    params : dict
        Scenario parameters (units: windows, rows, fractions of lookups, Zipf exponents):

        - ``rotating``: ``k`` (int >= 1, hot-set size, rows; default 1000), ``rate`` (float in
          [0, 1], fraction of the hot set replaced per window; default 0.1; the effective rate is
          ``round(rate * k) / k``).
        - ``zipf_shift``: ``alpha1`` (float >= 0, required), ``alpha0`` (float >= 0 or None = each
          table's own ``alpha``), ``span`` (int >= 1, windows; default 10): window ``w`` has
          exponent ``alpha0 + (alpha1 - alpha0) * min(w, span) / span``.
        - ``flash_crowd``: ``start`` (int >= 0, window; default 5), ``duration`` (int >= 1,
          windows; default 3), ``share`` (float in (0, 1], fraction of lookups; default 0.2),
          ``size`` (int >= 1, new IDs; default 1000), ``fade`` (int >= 0, windows; default 2),
          ``crowd_alpha`` (float >= 0, Zipf exponent within the crowd; default 1.0).
        - ``daily_cycle``: ``period`` (float >= 2, windows; default 24), ``sets`` (int >= 2; default
          2), ``depth`` (float in [0, 1]; default 1.0).

    Raises
    ------
    ConfigError
        Unknown scenario or parameter, missing required parameter, or a value out of range (the
        message names the parameter). Limits that depend on a table (``k``, ``size``) are checked
        by :meth:`check_table`, which :func:`generate_windows` and :func:`true_top` call.
    """

    name: str = "stationary"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in SCENARIOS:
            raise ConfigError(f"unknown drift scenario {self.name!r}; expected one of {SCENARIOS}")
        given = dict(self.params or {})
        defaults = _DEFAULTS[self.name]
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ConfigError(f"drift scenario {self.name!r}: unknown parameter {unknown[0]!r}; "
                              f"expected {sorted(defaults) or 'none'}")
        p = {**defaults, **given}
        for key, val in p.items():
            if val is _REQUIRED:
                raise ConfigError(f"drift scenario {self.name!r}: parameter {key!r} "
                                  f"({_WHAT[key]}) is required")
        w = f"drift scenario {self.name!r}: parameter"

        def where(key: str) -> str:
            return f"{w} {key!r} ({_WHAT[key]})"

        def integer(key: str, lo: int) -> int:
            try:
                return checked_int(p[key], where(key), lo)
            except ConfigError as e:
                raise ConfigError(str(e)) from None

        if self.name == "rotating":
            p["k"] = integer("k", 1)
            p["rate"] = _float(p["rate"], where("rate"), 0.0, 1.0)
        elif self.name == "zipf_shift":
            p["alpha1"] = _float(p["alpha1"], where("alpha1"), 0.0)
            if p["alpha0"] is not None:
                p["alpha0"] = _float(p["alpha0"], where("alpha0"), 0.0)
            p["span"] = integer("span", 1)
        elif self.name == "flash_crowd":
            p["start"] = integer("start", 0)
            p["duration"] = integer("duration", 1)
            p["share"] = _float(p["share"], where("share"), 0.0, 1.0, lo_open=True)
            p["size"] = integer("size", 1)
            p["fade"] = integer("fade", 0)
            p["crowd_alpha"] = _float(p["crowd_alpha"], where("crowd_alpha"), 0.0)
        elif self.name == "daily_cycle":
            p["period"] = _float(p["period"], where("period"), 2.0)
            p["sets"] = integer("sets", 2)
            p["depth"] = _float(p["depth"], where("depth"), 0.0, 1.0)
        object.__setattr__(self, "params", p)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params.items()))))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"scenario": name, "params": {...}}`` (defaults filled in)."""
        return {"scenario": self.name, "params": dict(self.params)}

    # ------------------------------------------------------------ per-table checks
    def check_table(self, table: TableSpec) -> None:
        """Check the parameters that depend on the table (``k``, ``size`` against its rows).

        Raises ConfigError naming the table and the parameter.
        """
        if not isinstance(table, TableSpec):
            raise ConfigError(f"table must be a TableSpec, got {type(table).__name__}")
        n = table.num_rows
        w = f"table {table.name!r} ({n} rows), drift scenario {self.name!r}: parameter"
        if self.name == "rotating":
            k, m = self.params["k"], self._replaced()
            if k + m > n:
                raise ConfigError(f"{w} 'k' ({_WHAT['k']}) = {k} plus the {m} rows replaced per "
                                  f"window (rate {self.params['rate']:g}) exceeds the table; need "
                                  f"k + round(rate * k) <= {n}")
        elif self.name == "flash_crowd" and self.params["size"] >= n:
            raise ConfigError(f"{w} 'size' ({_WHAT['size']}) = {self.params['size']} must be "
                              f"below the table's rows ({n}): the crowd's IDs are reserved")

    def _replaced(self) -> int:
        """Hot rows replaced per window (rotating): ``round(rate * k)``, half up."""
        return math.floor(self.params["rate"] * self.params["k"] + 0.5)

    # ------------------------------------------------------------ per-window state
    def alpha_at(self, table: TableSpec, window: int) -> float:
        """Zipf exponent of the table's base distribution in ``window`` (``zipf_shift`` moves it)."""
        window = checked_int(window, "window", 0)
        if self.name != "zipf_shift":
            return table.alpha
        a0 = table.alpha if self.params["alpha0"] is None else self.params["alpha0"]
        span = self.params["span"]
        return a0 + (self.params["alpha1"] - a0) * min(window, span) / span

    def crowd_share(self, window: int) -> float:
        """Fraction of lookups going to the flash crowd in ``window`` (0 outside ``flash_crowd``)."""
        window = checked_int(window, "window", 0)
        if self.name != "flash_crowd":
            return 0.0
        p = self.params
        j = window - p["start"] - p["duration"] + 1  # 1 .. fade in the fade-out
        if window < p["start"] or j > p["fade"]:
            return 0.0
        if j <= 0:
            return p["share"]
        return p["share"] * (1.0 - j / (p["fade"] + 1))

    def cycle_weights(self, window: int) -> np.ndarray:
        """Mixture weights of the hot sets in ``window``, float64 (sets,), summing to 1.

        ``[1.0]`` outside ``daily_cycle``.
        """
        window = checked_int(window, "window", 0)
        if self.name != "daily_cycle":
            return np.ones(1)
        h = np.arange(self.params["sets"], dtype=np.float64)
        theta = 2.0 * np.pi * (window / self.params["period"] - h / h.size)
        w = np.maximum(1.0 + self.params["depth"] * np.cos(theta), 0.0)
        return w / w.sum()


def scenario(name: str, **params: Any) -> DriftSpec:
    """``DriftSpec(name, params)``: e.g. ``scenario("rotating", k=500, rate=0.2)``."""
    return DriftSpec(name, params)


# ================================================================== rank <-> ID maps
def _derived_seed(table: TableSpec, seed: int, j: int) -> int:
    ss = np.random.SeedSequence(seed, spawn_key=(3, *table.seed_key, j))
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> 1)


def _window_rng(table: TableSpec, seed: int, window: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, *table.seed_key, window)))


class _Maps:
    """The permutations one table needs under one seed (built once per trace)."""

    def __init__(self, table: TableSpec, spec: DriftSpec, seed: int):
        self.table, self.spec = table, spec
        self.base = table.permutation(seed)
        self.sigma = None
        self.sets: list[IdPermutation] = [self.base]
        if spec.name == "rotating":
            self.sigma = IdPermutation(spec.params["k"], _derived_seed(table, seed, 0))
        elif spec.name == "daily_cycle":
            self.sets += [IdPermutation(table.num_rows, _derived_seed(table, seed, h))
                          for h in range(1, spec.params["sets"])]

    # rotating: at window w the hot slots are [w m, w m + k) (mod N); hot rank r sits at position
    # p = sigma(r) and uses the slot q = w m + ((p - w m) mod k); cold rank k + i uses the slot
    # (w m - 1 - i) mod N. Each window, the m slots [w m, w m + m) leave the hot set (they become the
    # warmest cold rows) and the m coldest slots [w m + k, w m + k + m) enter it.
    def _rot(self, window: int) -> tuple[int, int, int, int]:
        n, k = self.table.num_rows, self.spec.params["k"]
        wm = window * self.spec._replaced()
        return n, k, wm % n, wm % k

    def rot_slots(self, ranks: np.ndarray, window: int) -> np.ndarray:
        n, k, a, b = self._rot(window)
        out = np.empty_like(ranks)
        hot = ranks < k
        p = self.sigma.forward(ranks[hot])
        out[hot] = (a + np.mod(p - b, k)) % n
        cold = ~hot
        out[cold] = np.mod(a - 1 - (ranks[cold] - k), n)
        return out

    def rot_ranks(self, slots: np.ndarray, window: int) -> np.ndarray:
        n, k, a, b = self._rot(window)
        d = np.mod(slots - a, n)
        out = np.empty_like(slots)
        hot = d < k
        out[hot] = self.sigma.inverse((b + d[hot]) % k)
        out[~hot] = k + (n - 1 - d[~hot])
        return out


def _pmf(ranks: np.ndarray, num_rows: int, alpha: float) -> np.ndarray:
    """Zipf probabilities of arbitrary 0-based ranks (rows of a ``num_rows`` table)."""
    return (ranks.astype(np.float64) + 1.0) ** -alpha / zipf_normalizer(num_rows, alpha)


def _sample_ids(maps: _Maps, window: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` IDs of one table in ``window`` (after the lengths were drawn from ``rng``)."""
    t, spec = maps.table, maps.spec
    alpha = spec.alpha_at(t, window)
    if spec.name == "flash_crowd":
        size = spec.params["size"]
        nb = t.num_rows - size
        slots = zipf_ranks(n, nb, alpha, rng)
        s = spec.crowd_share(window)
        if s > 0.0:
            crowd = rng.random(n) < s
            slots[crowd] = nb + zipf_ranks(int(crowd.sum()), size, spec.params["crowd_alpha"], rng)
        return maps.base.forward(slots)
    ranks = zipf_ranks(n, t.num_rows, alpha, rng)
    if spec.name == "rotating":
        return maps.base.forward(maps.rot_slots(ranks, window))
    if spec.name == "daily_cycle":
        cum = np.cumsum(spec.cycle_weights(window))
        which = np.minimum(np.searchsorted(cum, rng.random(n), side="right"), cum.size - 1)
        ids = np.empty(n, dtype=np.int64)
        for h, perm in enumerate(maps.sets):
            m = which == h
            ids[m] = perm.forward(ranks[m])
        return ids
    return maps.base.forward(ranks)


# ================================================================== generation
@renamed_keywords(REMOVED_IN, batch_size="samples_per_batch")
def generate_windows(tables: Sequence[TableSpec], spec: DriftSpec, num_windows: int,
                     samples_per_window: int, samples_per_batch: int, seed: int = 0, *,
                     start_ts: float = 0.0, samples_per_second: float = 1000.0
                     ) -> Iterator[list[Batch]]:
    """Generate a drifting trace lazily, one window (a list of batches) at a time.

    Window ``w`` holds samples ``w * samples_per_window ...`` of the trace, cut into batches of
    ``samples_per_batch`` samples (the window's last batch may be shorter; batches never straddle
    windows). Each sample has, per table, a length from the table's length distribution and that
    many IDs drawn from the window's distribution. Window ``w`` depends only on ``(tables[i], spec,
    w, samples_per_window, seed)``: not on ``num_windows``, ``samples_per_batch`` or the other
    tables.

    Parameters
    ----------
    tables : sequence of TableSpec
        The features, in key order (their ``alpha`` is the base Zipf exponent).
    spec : DriftSpec
        The scenario.
    num_windows : int
        Windows to generate, >= 0.
    samples_per_window : int
        Samples per window, >= 1.
    samples_per_batch : int
        Samples per yielded batch, >= 1 (``batch_size``: its deprecated name, one release).
    seed : int
        Trace seed, >= 0.
    start_ts : float
        Timestamp of the first sample, seconds.
    samples_per_second : float
        Arrival rate, samples per second, > 0: sample ``i`` has timestamp
        ``start_ts + i / samples_per_second``.

    Yields
    ------
    list of Batch
        One list per window: keys = table names, int64 IDs in ``[0, num_rows)``, key-major lengths,
        one float64 timestamp per sample.

    Raises
    ------
    ConfigError
        At the call (not at the first ``next``): bad tables, counts, seed, or a parameter too large
        for a table.
    """
    tables = checked_tables(tables)
    if not isinstance(spec, DriftSpec):
        raise ConfigError(f"spec must be a DriftSpec (see drift.scenario), got {type(spec).__name__}")
    for t in tables:
        spec.check_table(t)
    num_windows = checked_int(num_windows, "num_windows", 0)
    samples_per_window = checked_int(samples_per_window, "samples_per_window", 1)
    samples_per_batch = checked_int(samples_per_batch, "samples_per_batch", 1)
    seed = checked_int(seed, "seed", 0)
    start_ts = _float(start_ts, "start_ts (seconds)")
    sps = _float(samples_per_second, "samples_per_second", 0.0, lo_open=True)
    return _generate_windows(tables, spec, num_windows, samples_per_window, samples_per_batch,
                             seed, start_ts, sps)


def _generate_windows(tables: tuple[TableSpec, ...], spec: DriftSpec, num_windows: int, spw: int,
                      samples_per_batch: int, seed: int, start_ts: float, sps: float
                      ) -> Iterator[list[Batch]]:
    keys = tuple(t.name for t in tables)
    maps = [_Maps(t, spec, seed) for t in tables]
    for w in range(num_windows):
        lens_all, vals_all = [], []
        for t, m in zip(tables, maps):
            rng = _window_rng(t, seed, w)
            lens = sample_lengths(spw, t.length, t.mean_length, rng, t.max_length, t.sigma)
            lens_all.append(lens)
            vals_all.append(_sample_ids(m, w, int(lens.sum()), rng))
        offs = [np.concatenate([[0], np.cumsum(l)]) for l in lens_all]
        ts_all = start_ts + np.arange(w * spw, (w + 1) * spw, dtype=np.float64) / sps
        window = []
        for start in range(0, spw, samples_per_batch):
            stop = min(start + samples_per_batch, spw)
            lengths = np.concatenate([l[start:stop] for l in lens_all])
            values = np.concatenate([v[o[start]:o[stop]] for v, o in zip(vals_all, offs)])
            window.append(Batch(keys, values, lengths, timestamp=ts_all[start:stop]))
        yield window


# ================================================================== oracles
def _check_oracle_args(table: TableSpec, spec: DriftSpec, window: int, seed: int
                       ) -> tuple[int, int]:
    if not isinstance(spec, DriftSpec):
        raise ConfigError(f"spec must be a DriftSpec, got {type(spec).__name__}")
    spec.check_table(table)
    return checked_int(window, "window", 0), checked_int(seed, "seed", 0)


def true_prob(table: TableSpec, spec: DriftSpec, window: int, ids: Any, seed: int = 0
              ) -> np.ndarray:
    """Exact probability that one lookup of ``table`` in ``window`` hits each of ``ids``.

    Parameters
    ----------
    table, spec, window, seed
        As in :func:`generate_windows` (``window`` >= 0).
    ids : array-like of int
        Row IDs in ``[0, num_rows)``.

    Returns
    -------
    ndarray of float64, shape like ``ids``
        Probabilities per lookup; they sum to 1 over all rows of the table.
    """
    window, seed = _check_oracle_args(table, spec, window, seed)
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise ConfigError(f"ids must be integers, got dtype {ids.dtype}")
    shape = ids.shape
    ids = ids.reshape(-1).astype(np.int64)
    maps = _Maps(table, spec, seed)
    n = table.num_rows
    alpha = spec.alpha_at(table, window)
    if spec.name == "flash_crowd":
        size = spec.params["size"]
        slots = maps.base.inverse(ids)
        s = spec.crowd_share(window)
        out = (1.0 - s) * _pmf(np.minimum(slots, n - size - 1), n - size, alpha)
        crowd = slots >= n - size
        out[crowd] = s * _pmf(slots[crowd] - (n - size), size, spec.params["crowd_alpha"])
        return out.reshape(shape)
    if spec.name == "daily_cycle":
        out = np.zeros(ids.size)
        for wt, perm in zip(spec.cycle_weights(window), maps.sets):
            out += wt * _pmf(perm.inverse(ids), n, alpha)
        return out.reshape(shape)
    ranks = maps.base.inverse(ids)
    if spec.name == "rotating":
        ranks = maps.rot_ranks(ranks, window)
    return _pmf(ranks, n, alpha).reshape(shape)


def true_top(table: TableSpec, spec: DriftSpec, window: int, k: int, seed: int = 0
             ) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` rows of ``table`` most likely to be looked up in ``window``, and their probabilities.

    Parameters
    ----------
    table, spec, window, seed
        As in :func:`generate_windows`.
    k : int
        Rows to return, 0 <= k <= num_rows.

    Returns
    -------
    ids : ndarray of int64, shape (k,)
        Row IDs, most likely first (ties keep rank order).
    probs : ndarray of float64, shape (k,)
        Probability per lookup of each row in that window (as :func:`true_prob`).

    Exact for every scenario; for ``daily_cycle`` the candidates are the top rows of each hot set,
    enlarged until no outside row can qualify (up to 4M rows per set, beyond which, for exponents
    near 0, the result can miss rows within a factor ``(4M / k)^-alpha`` of the cut).
    """
    window, seed = _check_oracle_args(table, spec, window, seed)
    n = table.num_rows
    k = checked_int(k, "k (number of top rows)", 0, n)
    maps = _Maps(table, spec, seed)
    alpha = spec.alpha_at(table, window)
    if spec.name in ("stationary", "zipf_shift", "rotating"):
        ranks = np.arange(k, dtype=np.int64)
        slots = maps.rot_slots(ranks, window) if spec.name == "rotating" else ranks
        return maps.base.forward(slots), zipf_pmf_head(k, n, alpha)
    if spec.name == "flash_crowd":
        size = spec.params["size"]
        s = spec.crowd_share(window)
        kb, kc = min(k, n - size), min(k, size)
        slots = np.concatenate([np.arange(kb), (n - size) + np.arange(kc)]).astype(np.int64)
        probs = np.concatenate([(1.0 - s) * zipf_pmf_head(kb, n - size, alpha),
                                s * zipf_pmf_head(kc, size, spec.params["crowd_alpha"])])
        order = np.argsort(-probs, kind="stable")[:k]
        return maps.base.forward(slots[order]), probs[order]
    # daily_cycle: any row of rank >= K in every set has probability <= pmf(K)
    pool = min(n, max(2 * k, 16))
    while True:
        cand = np.unique(np.concatenate([p.forward(np.arange(pool, dtype=np.int64))
                                         for p in maps.sets]))
        probs = true_prob(table, spec, window, cand, seed)
        order = np.lexsort((cand, -probs))[:k]
        if (pool >= n or pool >= _MAX_POOL or k == 0
                or probs[order[-1]] >= _pmf(np.array([pool]), n, alpha)[0]):
            return cand[order], probs[order]
        pool = min(n, pool * 4)


def crowd_ids(table: TableSpec, spec: DriftSpec, seed: int = 0) -> np.ndarray:
    """The ``size`` IDs reserved for the flash crowd of ``table`` (crowd rank order, hottest first).

    They are never drawn outside the crowd's windows. int64 (size,). ConfigError for other scenarios.
    """
    if not isinstance(spec, DriftSpec) or spec.name != "flash_crowd":
        raise ConfigError("crowd_ids needs a 'flash_crowd' DriftSpec")
    spec.check_table(table)
    seed = checked_int(seed, "seed", 0)
    n, size = table.num_rows, spec.params["size"]
    return table.permutation(seed).forward(np.arange(n - size, n, dtype=np.int64))
