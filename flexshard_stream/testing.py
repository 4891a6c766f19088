"""Test helpers for plans: hypothesis strategies and a plan invariant checker.

Public and meant for users' own test suites, whichever planner made the plan::

    from hypothesis import given
    from flexshard_stream.testing import workloads, assert_plan_ok

    @given(workloads())
    def test_my_planner(w):
        plan = my_planner(w.tables, w.topology, w.summaries, w.batch_size)
        assert_plan_ok(plan, summaries=w.summaries, batch_size=w.batch_size,
                       budget_bytes=my_budget)

Three parts:

- :func:`check_never_worse` / :func:`assert_never_worse`: a planner's plan is, in the model, at most
  as slow as every baseline that fits the same budget and runs on the same runtime (the FlexShard
  planner's invariant; run it on your own planner's plans);
- :func:`check_plan` / :func:`assert_plan_ok`: the invariants of ``DESIGN.md`` section 4 on ANY
  :class:`~flexshard_stream.plans.plan.Plan` (routing from every GPU, replicas staying on their GPU or node,
  tiers as frequency prefixes, the memory budget, the file round trip, bytes conservation). Needs
  numpy only.
- hypothesis strategies (:func:`topologies`, :func:`tables`, :func:`skewed_summaries`,
  :func:`skewed_streams`, :func:`plans`, :func:`workloads`). ``hypothesis`` is a development
  dependency: it is imported when a strategy is built, with an ImportError telling how to install it
  when it is missing (``pip install hypothesis``, or ``pip install flexshard-stream[dev]``).

:func:`zipf_summary` and :func:`sample_batches` are the plain-numpy generators behind the strategies
(:func:`many_tables`, the planning benchmarks' workload, is another),
usable without hypothesis.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import FlexShardError
from .placement.baselines import BASELINES, baseline_plans
from .placement.cost import COMPONENTS, CostModel, evaluate_analytic, evaluate_trace
from .placement.workload import workload_of
from .placement.profiles import execution_profile
from .plans.plan import SHARDING_KINDS, ColdSharding, Plan, TablePlan
from .plans.tables import (
    DTYPE_BYTES,
    TABLE_KINDS,
    EmbeddingTable,
    summaries_by_table,
)
from .plans.topology import Topology
from .sources.synth import IdPermutation, zipf_pmf_head
from .stats.batch import Batch
from .stats.summary import FrequencySummary

__all__ = [
    # checkers
    "check_plan", "assert_plan_ok", "check_never_worse", "assert_never_worse",
    # plain generators
    "zipf_summary", "many_tables", "summary_order", "sample_batches", "Workload",
    # hypothesis strategies
    "topologies", "tables", "skewed_summaries", "summaries_for", "skewed_streams", "plans",
    "workloads",
]

_RTOL = 1e-9          # relative slack of float comparisons (memory, conservation, estimates)
_MAX_EXAMPLES = 5     # offending IDs quoted per violation


# =============================================================================== hypothesis
def _hypothesis():
    """``hypothesis.strategies``, or an ImportError that says how to get it."""
    try:
        from hypothesis import strategies as st
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "flexshard_stream.testing strategies need the 'hypothesis' package, a development "
            "dependency of flexshard_stream: pip install hypothesis (or pip install "
            "'flexshard-stream[dev]'). check_plan / assert_plan_ok work without it.") from e
    return st


def _is_strategy(x: Any) -> bool:
    try:
        from hypothesis.strategies import SearchStrategy
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, SearchStrategy)


def _value(draw, x: Any) -> Any:
    """``x`` itself, or a value drawn from it when it is a strategy."""
    return draw(x) if _is_strategy(x) else x


# =============================================================================== plain generators
def zipf_summary(table: EmbeddingTable, alpha: float, *, total: int = 10**6, top_k: int | None = None,
                 seed: int = 0, mean_length: float = 1.0, integer_counts: bool = False
                 ) -> FrequencySummary:
    """The exact frequency summary of a Zipf(``alpha``) access distribution over ``table``.

    Rank ``r`` (0 = hottest) has probability ``(r + 1)^-alpha / H(num_rows, alpha)`` and is row
    ``IdPermutation(num_rows, seed).forward(r)`` (hot rows scattered over the ID space). The summary
    lists the ``top_k`` hottest rows (default: ``min(num_rows, 256)``) with estimates ``p * total``
    (``floor(p * total)`` with ``integer_counts``, which makes ties), and models the rest as a
    uniform tail of ``num_rows - top_k`` rows carrying the remaining lookups.
    """
    H = table.num_rows
    k = min(H, 256 if top_k is None else int(top_k))
    p = zipf_pmf_head(k, H, float(alpha))
    ids = IdPermutation(H, int(seed)).forward(np.arange(k, dtype=np.int64))
    est = np.floor(p * total) if integer_counts else p * total
    order = np.lexsort((ids, -est))                  # decreasing estimate, ties by ID
    ids, est = ids[order].astype(np.int64), est[order].astype(np.float64)
    tail_mass = max(0.0, float(total) - float(est.sum()))
    tail_rows = float(H - k)
    if tail_rows == 0:
        tail_mass = 0.0
    return FrequencySummary(table.name, int(total), ids, est.copy(), est.copy(), est.copy(),
                            float(H), float(H), float(H), tail_mass, tail_rows, H, True,
                            max(1, int(total / max(mean_length, 1e-9))), float(mean_length),
                            {})


def many_tables(T: int, seed: int = 0, *, min_rows_log10: float = 5.0, max_rows_log10: float = 8.0,
                top_k: int = 1000, optimizer_state_bytes: int = 4
                ) -> tuple[list[EmbeddingTable], dict[str, FrequencySummary]]:
    """T tables of 10**min_rows_log10..10**max_rows_log10 rows (dim 64..256, 70% sequence), one
    Zipf summary each (``top_k`` top rows at random IDs, 1e9 lookups); the planning benchmarks'
    and tests' workload, the same draws for the same arguments."""
    rng = np.random.default_rng(seed)
    rows = np.round(10 ** rng.uniform(min_rows_log10, max_rows_log10, T)).astype(np.int64)
    dims = rng.choice([64, 128, 256], T)
    kinds = np.where(rng.random(T) < 0.7, "sequence", "pooled")
    alphas = rng.uniform(0.9, 1.2, T)
    tables, sums = [], {}
    for i in range(T):
        H = int(rows[i])
        L = float(rng.uniform(100, 200) if kinds[i] == "sequence" else rng.uniform(1, 40))
        t = EmbeddingTable(f"t{i:04d}", H, int(dims[i]), "fp32", str(kinds[i]),
                           optimizer_state_bytes=optimizer_state_bytes)
        kk = min(top_k, H)
        p = zipf_pmf_head(kk, H, float(alphas[i]))
        total = 10 ** 9
        est = p * total
        ids = rng.choice(H, kk, replace=False).astype(np.int64)
        sums[t.name] = FrequencySummary(t.name, total, ids, est, est, est, float(H), float(H),
                                        float(H), float(total * max(0.0, 1.0 - p.sum())),
                                        float(H - kk), H, True, int(total / L), L)
        tables.append(t)
    return tables, sums


def _summary_of(summaries: Mapping[str, FrequencySummary] | None, t: EmbeddingTable
                ) -> FrequencySummary | None:
    if summaries is None:
        return None
    return summaries_by_table([t], summaries, required=False)[t.name]


def _top_of(s: FrequencySummary, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The summary's explicit rows inside ``[0, num_rows)``, by decreasing estimate (ties by ID),
    each ID once (its largest estimate)."""
    ids = np.asarray(s.top_ids, dtype=np.int64)
    est = np.asarray(s.top_est, dtype=np.float64)
    ok = (ids >= 0) & (ids < num_rows)
    ids, est = ids[ok], est[ok]
    order = np.lexsort((ids, -est))
    ids, est = ids[order], est[order]
    _, first = np.unique(ids, return_index=True)
    keep = np.sort(first)
    return ids[keep], est[keep]


def summary_order(table: EmbeddingTable, summary: FrequencySummary, k: int) -> np.ndarray:
    """The first ``k`` rows of the summary's frequency order (explicit top rows by decreasing
    estimate, ties by ID); ``k`` is capped at the number of explicit rows in range."""
    ids, _ = _top_of(summary, table.num_rows)
    return ids[:max(0, int(k))].copy()


def _draw_ids(t: EmbeddingTable, s: FrequencySummary, n: int, rng: np.random.Generator
              ) -> np.ndarray:
    """``n`` IDs from the distribution a summary describes: explicit rows with probability
    ``estimate / total``, the rest uniformly over the rows not listed."""
    H = t.num_rows
    ids, est = _top_of(s, H)
    total = float(s.total)
    p_top = est / total if total > 0 else np.zeros(ids.size)
    rest = H - ids.size
    tail = max(0.0, 1.0 - float(p_top.sum())) if rest > 0 else 0.0
    w = np.concatenate([p_top, [tail]])
    if w.sum() <= 0:  # nothing known: uniform
        return rng.integers(0, H, size=n, dtype=np.int64)
    w = w / w.sum()
    pick = rng.choice(w.size, size=n, p=w)
    out = np.empty(n, dtype=np.int64)
    hot = pick < ids.size
    out[hot] = ids[pick[hot]]
    m = int((~hot).sum())
    if m:
        # uniform over the rows not listed: the r-th unlisted row is r + #{j : S[j] - j <= r}
        # (S: the listed IDs, sorted; S[j] - j unlisted rows lie below S[j])
        S = np.sort(ids)
        r = rng.integers(0, rest, size=m, dtype=np.int64)
        x = r + np.searchsorted(S - np.arange(S.size), r, side="right")
        out[~hot] = x
    return out


def sample_batches(tables: Sequence[EmbeddingTable], summaries: Mapping[str, FrequencySummary],
                   topology: Topology, batch_size: int, iterations: int = 1, seed: int = 0
                   ) -> list[Batch]:
    """``iterations`` batches of ``G * batch_size`` samples each (one training iteration each: sample
    ``i`` on GPU ``i // batch_size``), keyed by feature, IDs drawn from each table's summary
    distribution (:func:`zipf_summary` for the model), Poisson lengths of the summary's mean
    length (at least 1 ID per sample on average)."""
    rng = np.random.default_rng(seed)
    n = topology.num_gpus * int(batch_size)
    out = []
    for _ in range(int(iterations)):
        keys, vals, lens = [], [], []
        for t in tables:
            s = _summary_of(summaries, t)
            if s is None:
                raise FlexShardError(f"sample_batches: no summary for table {t.name!r}")
            L = max(float(s.mean_length or 1.0), 1e-3)
            ln = rng.poisson(L, size=n).astype(np.int64)
            keys.append(t.feature)
            lens.append(ln)
            vals.append(_draw_ids(t, s, int(ln.sum()), rng))
        out.append(Batch(keys, np.concatenate(vals) if vals else np.zeros(0, np.int64),
                         np.concatenate(lens) if lens else np.zeros(0, np.int64)))
    return out


@dataclass(frozen=True)
class Workload:
    """Planner inputs drawn together by :func:`workloads`."""

    tables: list[EmbeddingTable]
    topology: Topology
    summaries: dict[str, FrequencySummary]
    batch_size: int


# =============================================================================== strategies
_INTER_BW = (6.25e9, 12.5e9, 25e9, 50e9, 100e9)
_SKEW = (0.125, 0.25, 0.5, 1.0, 1.0, 2.0)


def topologies(max_nodes: int = 4, max_gpus_per_node: int = 4, skewed: bool = True, *,
               min_nodes: int = 1, min_gpus_per_node: int = 1):
    """Strategy of :class:`Topology`: ``N x M`` GPUs, uniform or (``skewed``) heterogeneous
    inter-node bandwidths per node or per GPU (factors 1/8 .. 2 of a base of 6.25 .. 100 GB/s);
    intra-node 100 .. 600 GB/s."""
    st = _hypothesis()

    @st.composite
    def _topo(draw):
        N = draw(st.integers(min_nodes, max_nodes))
        M = draw(st.integers(min_gpus_per_node, max_gpus_per_node))
        G = N * M
        intra = draw(st.sampled_from((100e9, 300e9, 600e9)))
        base = draw(st.sampled_from(_INTER_BW))
        inter = np.full(G, base)
        mode = draw(st.sampled_from(("uniform", "node", "gpu"))) if skewed else "uniform"
        if mode == "node":
            f = draw(st.lists(st.sampled_from(_SKEW), min_size=N, max_size=N))
            inter = inter * np.repeat(f, M)
        elif mode == "gpu":
            f = draw(st.lists(st.sampled_from(_SKEW), min_size=G, max_size=G))
            inter = inter * np.asarray(f)
        return Topology(N, M, np.full(G, 80e9), np.full(G, intra), inter, np.full(G, 25e9),
                        np.full(N, 1e12), f"test-{mode}")

    return _topo()


def tables(max_tables: int = 3, max_rows: int = 5000, *, min_tables: int = 1, min_rows: int = 1,
           kinds: Sequence[str] = TABLE_KINDS, dtypes: Sequence[str] = tuple(DTYPE_BYTES),
           dims: Sequence[int] = (1, 4, 8, 16, 32, 64, 128)):
    """Strategy of lists of :class:`EmbeddingTable` with unique names (``t0``, ``t1``, ...):
    sequence or pooled, dims, dtypes, optimizer state of 0 bytes, a few bytes or Adam-like
    (2 x the embedding); the feature is sometimes a different name than the table."""
    st = _hypothesis()

    @st.composite
    def _tables(draw):
        out = []
        for i in range(draw(st.integers(min_tables, max_tables))):
            H = draw(st.integers(min_rows, max_rows))
            dim = draw(st.sampled_from(tuple(dims)))
            dtype = draw(st.sampled_from(tuple(dtypes)))
            kind = draw(st.sampled_from(tuple(kinds)))
            opt = draw(st.sampled_from(("none", "small", "adam")))
            s = {"none": 0, "small": 4, "adam": 2 * dim * DTYPE_BYTES[dtype]}[opt]
            feature = draw(st.sampled_from((f"t{i}", f"feat{i}")))
            out.append(EmbeddingTable(f"t{i}", H, dim, dtype, kind, feature, s))
        return out

    return _tables()


def skewed_summaries(tables: Any, *, min_alpha: float = 0.6, max_alpha: float = 1.6,
                     max_top: int = 512, mean_lengths: Sequence[float] = (1.0, 2.0, 5.0, 20.0, 100.0),
                     ties: bool = True):
    """Strategy of ``{table name: FrequencySummary}``: per table a Zipf-like distribution with a
    random exponent in ``[min_alpha, max_alpha]`` and a random row permutation; explicit top rows
    with estimates ``p * total`` (sometimes integer counts, which create ties) and a uniform tail
    (see :func:`zipf_summary`). ``tables`` may be a list or a strategy of lists."""
    st = _hypothesis()

    @st.composite
    def _summ(draw):
        tabs = _value(draw, tables)
        out = {}
        for t in tabs:
            alpha = draw(st.floats(min_alpha, max_alpha, allow_nan=False))
            k = draw(st.integers(min(t.num_rows, 1), min(t.num_rows, max_top)))
            total = draw(st.sampled_from((10**3, 10**5, 10**7)))
            seed = draw(st.integers(0, 2**31 - 1))
            L = draw(st.sampled_from(tuple(mean_lengths)))
            integer = draw(st.booleans()) if ties else False
            out[t.name] = zipf_summary(t, alpha, total=total, top_k=k, seed=seed, mean_length=L,
                                       integer_counts=integer)
        return out

    return _summ()


summaries_for = skewed_summaries


def skewed_streams(tables: Any, topology: Any, batch_size: Any, *, summaries: Any = None,
                   max_iterations: int = 3):
    """Strategy of lists of :class:`Batch`, one per iteration (``G * batch_size`` samples, sample
    ``i`` on GPU ``i // batch_size``), IDs drawn from ``summaries`` (drawn by
    :func:`skewed_summaries` when not given). Any argument may be a strategy."""
    st = _hypothesis()

    @st.composite
    def _streams(draw):
        tabs = _value(draw, tables)
        topo = _value(draw, topology)
        B = _value(draw, batch_size)
        summ = _value(draw, summaries) if summaries is not None else draw(skewed_summaries(tabs))
        iters = draw(st.integers(1, max_iterations))
        seed = draw(st.integers(0, 2**31 - 1))
        return sample_batches(tabs, summ, topo, B, iters, seed)

    return _streams()


def plans(topology: Any, tables: Any, *, summaries: Any = None, max_tier_rows: int = 64,
          cold_kinds: Sequence[str] = ("hash", "range", "wrange", "subset", "replicated"),
          strategy: str = "random", host_tier: bool = False):
    """Strategy of valid :class:`Plan` s: per table random global / node / placed tiers (node rows on
    random local GPUs, placed rows on random GPUs) and a cold function among hash, equal ranges,
    weighted ranges, ranges over a subset of GPUs, all-replicated, or ``"columns"`` (column shards
    of random widths on distinct random GPUs, global replicas only; not drawn unless listed). With
    ``summaries``, the global and node tiers are prefixes of each summary's frequency order (so the
    plans pass :func:`check_plan` with those summaries); otherwise any rows. With ``host_tier``,
    some tables that are neither replicated nor column-wise also get a host memory tier
    (``hbm_fraction``: per GPU 0, 1 or a random fraction). Arguments may be strategies."""
    st = _hypothesis()

    @st.composite
    def _plans(draw):
        topo = _value(draw, topology)
        tabs = _value(draw, tables)
        summ = _value(draw, summaries)
        G, M = topo.num_gpus, topo.gpus_per_node
        rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
        tps = []
        for t in tabs:
            H = t.num_rows
            kind = draw(st.sampled_from(tuple(cold_kinds)))
            if kind == "replicated":
                tps.append(TablePlan(t, ColdSharding.replicated()))
                continue
            if kind == "columns":
                tps.append(_column_table(draw, st, t, G, _summary_of(summ, t), max_tier_rows))
                continue
            if kind == "hash":
                cold = ColdSharding.hashed(range(G), seed=draw(st.integers(0, 2**32)))
            elif kind == "range":
                cold = ColdSharding.ranges(range(G), H)
            elif kind == "subset":
                gp = draw(st.lists(st.integers(0, G - 1), min_size=1, max_size=G, unique=True))
                cold = ColdSharding.ranges(gp, H)
            else:
                w = draw(st.lists(st.floats(0.05, 5.0), min_size=G, max_size=G))
                cold = ColdSharding.ranges(range(G), H, w)
            cap = min(max_tier_rows, H // 3)
            k0, k1, k2 = (draw(st.integers(0, cap)) for _ in range(3))
            s = _summary_of(summ, t)
            if s is not None:
                hot = summary_order(t, s, k0 + k1)
                k0 = min(k0, hot.size)
                k1 = hot.size - k0
                cand = np.unique(rng.integers(0, H, size=2 * k2 + 8))
                cand = cand[~np.isin(cand, hot)]
                placed = rng.permutation(cand)[:k2]
                rows = np.concatenate([hot, placed])
            else:
                rows = rng.choice(H, size=k0 + k1 + k2, replace=False)
            g0, n1, p2 = rows[:k0], rows[k0:k0 + k1], rows[k0 + k1:]
            nl = rng.integers(0, M, size=n1.size)
            pg = rng.integers(0, G, size=p2.size)
            o1, o2 = np.argsort(n1), np.argsort(p2)
            hf = np.zeros(0)
            if host_tier and draw(st.booleans()):
                hf = rng.choice([0.0, 1.0, -1.0], size=G)
                hf[hf < 0] = rng.random(int((hf < 0).sum()))
            tps.append(TablePlan(t, cold, global_ids=np.sort(g0), node_ids=n1[o1],
                                 node_local=nl[o1], placed_ids=p2[o2], placed_gpus=pg[o2],
                                 hbm_fraction=hf))
        return Plan(strategy, topo, tps)

    return _plans()


def _column_table(draw, st, t: EmbeddingTable, G: int, s: FrequencySummary | None,
                  max_tier_rows: int) -> TablePlan:
    """A column-wise table: 1..min(G, D) shards of random widths on distinct GPUs, and a global
    tier (a prefix of the summary's order when there is one)."""
    n = draw(st.integers(1, min(G, t.dim)))
    cuts = sorted(draw(st.lists(st.integers(1, t.dim - 1), min_size=n - 1, max_size=n - 1,
                                unique=True))) if n > 1 else []
    widths = np.diff([0, *cuts, t.dim])
    gpus = draw(st.permutations(range(G)))[:n]
    k0 = draw(st.integers(0, min(max_tier_rows, t.num_rows // 3)))
    if s is not None:
        g0 = summary_order(t, s, k0)
    else:
        g0 = np.asarray(draw(st.lists(st.integers(0, t.num_rows - 1), max_size=k0, unique=True)),
                        np.int64)
    return TablePlan(t, ColdSharding.columns(gpus, widths), global_ids=np.sort(g0))


def workloads(max_nodes: int = 3, max_gpus_per_node: int = 3, max_tables: int = 3,
              max_rows: int = 3000, *, skewed: bool = True, min_nodes: int = 1,
              batch_sizes: Sequence[int] = (1, 8, 64, 256),
              dims: Sequence[int] = (1, 4, 8, 16, 32, 64, 128), **summary_kw: Any):
    """Strategy of :class:`Workload` (tables, topology, summaries, batch size): a planner's inputs
    (``dims``: the tables' dims drawn from; 256 and more split into column shards)."""
    st = _hypothesis()

    @st.composite
    def _w(draw):
        topo = draw(topologies(max_nodes, max_gpus_per_node, skewed, min_nodes=min_nodes))
        tabs = draw(tables(max_tables, max_rows, dims=dims))
        summ = draw(skewed_summaries(tabs, **summary_kw))
        B = draw(st.sampled_from(tuple(batch_sizes)))
        return Workload(tabs, topo, summ, B)

    return _w()


# =============================================================================== checker
class _Report:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, msg: str) -> None:
        self.items.append(msg)


def _ex(ids: np.ndarray) -> str:
    ids = np.asarray(ids).ravel()
    s = ", ".join(str(int(x)) for x in ids[:_MAX_EXAMPLES])
    return s + (f", ... ({ids.size} in all)" if ids.size > _MAX_EXAMPLES else "")


def _subsample(a: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    if a.size <= cap:
        return a
    pick = rng.choice(a.size, size=cap, replace=False)
    return np.unique(np.concatenate([a[:1], a[-1:], a[np.sort(pick)]]))


def _sample_for(tp: TablePlan, G: int, sample_ids: Any, rng: np.random.Generator,
                full_route_limit: int, max_tier_ids: int) -> tuple[np.ndarray, bool]:
    """IDs to route for one table and whether they are all its IDs."""
    H = tp.table.num_rows
    if H * G <= full_route_limit:
        return np.arange(H, dtype=np.int64), True
    parts = [np.array([0, H - 1], np.int64)]
    for a in (tp.global_ids, tp.node_ids, tp.placed_ids):
        parts.append(_subsample(a, max_tier_ids, rng))
    b = tp.cold.bounds
    if b.size:
        parts.append(np.clip(np.concatenate([b, b - 1]), 0, H - 1))
    if isinstance(sample_ids, Mapping):
        extra = sample_ids.get(tp.name, sample_ids.get(tp.table.feature, ()))
        parts.append(np.asarray(extra, dtype=np.int64).ravel())
    elif np.ndim(sample_ids) == 0:
        parts.append(rng.integers(0, H, size=int(sample_ids), dtype=np.int64))
    else:
        parts.append(np.asarray(sample_ids, dtype=np.int64).ravel())
    ids = np.unique(np.concatenate(parts))
    bad = ids[(ids < 0) | (ids >= H)]
    if bad.size:
        raise ValueError(f"sample_ids for table {tp.name!r} out of [0, {H}): {_ex(bad)}")
    return ids, False


def _check_structure(plan: Plan, tp: TablePlan, r: _Report) -> bool:
    """Tier arrays well formed and disjoint; GPU indices in range. False if routing cannot be
    checked meaningfully."""
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    H = tp.table.num_rows
    name = tp.name
    ok = True
    for what in ("global_ids", "node_ids", "placed_ids"):
        a = getattr(tp, what)
        if a.size and (np.any(a[1:] <= a[:-1]) or a[0] < 0 or a[-1] >= H):
            r.add(f"table {name!r}: {what} must be sorted, unique and in [0, {H})")
            ok = False
    if tp.node_local.size != tp.node_ids.size or tp.placed_gpus.size != tp.placed_ids.size:
        r.add(f"table {name!r}: node_local / placed_gpus do not match node_ids / placed_ids")
        return False
    if tp.node_local.size and (tp.node_local.min() < 0 or tp.node_local.max() >= M):
        r.add(f"table {name!r}: node_local outside [0, {M}): {_ex(tp.node_local)}")
        ok = False
    for what, g in (("placed_gpus", tp.placed_gpus), ("cold GPUs", tp.cold.gpus)):
        bad = g[(g < 0) | (g >= G)]
        if bad.size:
            r.add(f"table {name!r}: {what} outside [0, {G}): {_ex(bad)}")
            ok = False
    for a, b, what in ((tp.global_ids, tp.node_ids, "global and node"),
                       (tp.global_ids, tp.placed_ids, "global and placed"),
                       (tp.node_ids, tp.placed_ids, "node and placed")):
        both = np.intersect1d(a, b)
        if both.size:
            r.add(f"table {name!r}: tiers are not disjoint: rows in both the {what} tiers: "
                  f"{_ex(both)}")
    if tp.replicated and (tp.global_ids.size or tp.node_ids.size or tp.placed_ids.size):
        r.add(f"table {name!r}: an all-replicated table lists tier rows as well")
    ok &= _check_sharding(plan, tp, r)
    hf = np.asarray(getattr(tp, "hbm_fraction", np.zeros(0)))
    if hf.size:
        if tp.replicated:
            r.add(f"table {name!r}: an all-replicated table has a host memory tier (hbm_fraction)")
        if hf.size != G:
            r.add(f"table {name!r}: hbm_fraction has {hf.size} values for {G} GPUs")
            ok = False
        bad = np.flatnonzero(~((hf >= 0) & (hf <= 1)))
        if bad.size:
            r.add(f"table {name!r}: hbm_fraction outside [0, 1] on GPUs {_ex(bad)}")
    return ok


def _check_sharding(plan: Plan, tp: TablePlan, r: _Report) -> bool:
    """The sharding kind is one of :data:`SHARDING_KINDS` and fits the cold function: column
    shards on distinct GPUs covering the dim with global replicas only; one node for
    table_row_wise / table_column_wise. False if routing cannot be checked meaningfully."""
    name, topo = tp.name, plan.topology
    kind = plan.sharding_kinds.get(name)
    if kind not in SHARDING_KINDS:
        r.add(f"table {name!r}: sharding kind {kind!r} is not one of {list(SHARDING_KINDS)}")
        return False
    c = tp.cold
    if (kind in ("column_wise", "table_column_wise")) != (c.kind == "columns"):
        r.add(f"table {name!r}: sharding {kind} with a {c.kind!r} cold function")
        return False
    if kind in ("table_row_wise", "table_column_wise") and \
            np.unique(c.gpus // topo.gpus_per_node).size > 1:
        r.add(f"table {name!r}: {kind} on GPUs {c.gpus.tolist()} of several nodes")
    if c.kind != "columns":
        return True
    if int(c.widths.sum()) != tp.table.dim or np.any(c.widths <= 0):
        r.add(f"table {name!r}: column widths {c.widths.tolist()} do not cover dim "
              f"{tp.table.dim}")
    if np.unique(c.gpus).size != c.gpus.size:
        r.add(f"table {name!r}: two column shards on one GPU ({c.gpus.tolist()})")
    if tp.node_ids.size or tp.placed_ids.size or tp.has_host_tier:
        r.add(f"table {name!r}: a column-wise table with node replicas, placed rows or a host "
              f"memory tier (global replicas only)")
    return True


def _check_routing(plan: Plan, tp: TablePlan, ids: np.ndarray, complete: bool, r: _Report) -> None:
    """Every sampled ID routes to exactly one owner in [0, G) from every GPU, as the tiers say; when
    ``complete``, the stored-row accounting (``rows_per_gpu``) matches the routing."""
    out = _route_from_every_gpu(plan, tp, ids, r)
    if out is None:
        return
    G = plan.topology.num_gpus
    if tp.replicated:
        wrong = out != np.arange(G, dtype=np.int64)[:, None]
        if wrong.any():
            s, j = np.argwhere(wrong)[0]
            r.add(f"table {tp.name!r} is all-replicated but ID {int(ids[j])} requested from GPU "
                  f"{int(s)} routes to GPU {int(out[s, j])} (replicated lookups must stay local)")
        return
    expected, kind = _expected_owners(plan.topology, tp, ids)
    _check_expected_owners(tp.name, ids, out, expected, kind, r)
    cold = kind == 0
    if tp.column_wise:
        _check_column_owners(plan, tp, ids, cold, r)
        if complete:
            _check_column_bytes(plan.topology, tp, r)
        return
    if cold.any():
        _check_cold_owners(tp, ids[cold], out[:, cold], r)
    if complete:
        _check_stored_rows(plan.topology, tp, out[0, cold], r)


def _check_column_owners(plan: Plan, tp: TablePlan, ids: np.ndarray, cold: np.ndarray,
                         r: _Report) -> None:
    """Column shards: :meth:`Plan.owners` sends every cold lookup to every shard's GPU and a
    global replica's lookup to the requester."""
    G, name = plan.topology.num_gpus, tp.name
    for src in (0, G - 1):
        own = np.asarray(plan.owners(name, ids, src))
        want = np.where(cold[:, None], tp.cold.gpus[None, :], src)
        if own.shape != want.shape or not np.array_equal(own, want):
            j = int(np.flatnonzero(np.any(own != want, axis=1))[0]) if own.shape == want.shape \
                else 0
            r.add(f"table {name!r}: ID {int(ids[j])} requested from GPU {src} is served by GPUs "
                  f"{own[j].tolist()}, expected {want[j].tolist()} (every column shard's GPU)")
            return


def _check_column_bytes(topo: Topology, tp: TablePlan, r: _Report) -> None:
    """Column shards: each shard's GPU stores its ``w / D`` of every cold row, every GPU the
    global replicas, and the bytes add up to the table's rows."""
    c, rb = tp.cold, float(tp.table.row_bytes)
    want = np.full(topo.num_gpus, tp.global_ids.size * rb)
    want[c.gpus] += (tp.table.num_rows - tp.global_ids.size) * rb * c.widths / tp.table.dim
    got = tp.row_bytes_per_gpu(topo)
    if not np.allclose(got, want, rtol=_RTOL, atol=1e-9):
        g = int(np.flatnonzero(~np.isclose(got, want, rtol=_RTOL, atol=1e-9))[0])
        r.add(f"table {tp.name!r}: GPU {g} stores {got[g]:.6g} bytes of the table by the "
              f"accounting, its column shards and replicas take {want[g]:.6g}")


def _route_from_every_gpu(plan: Plan, tp: TablePlan, ids: np.ndarray, r: _Report
                          ) -> np.ndarray | None:
    """Owners (int64, G x n) of ``ids`` requested from every GPU by :meth:`Plan.route`; None
    (and a violation reported) when it raises or returns the wrong shape, dtype or GPUs."""
    G = plan.topology.num_gpus
    name, n = tp.name, ids.size
    src = np.repeat(np.arange(G, dtype=np.int64), n)
    all_ids = np.tile(ids, G)
    try:
        out = np.asarray(plan.route(name, all_ids, src))
    except Exception as e:  # noqa: BLE001 - any failure is a violation to report
        r.add(f"table {name!r}: Plan.route raised {type(e).__name__}: {e}")
        return None
    if out.shape != all_ids.shape:
        r.add(f"table {name!r}: Plan.route returned shape {out.shape} for {all_ids.shape} IDs "
              f"(one owner per ID expected)")
        return None
    if out.dtype.kind not in "iu":
        r.add(f"table {name!r}: Plan.route returned dtype {out.dtype}, expected integers")
        return None
    out = out.astype(np.int64).reshape(G, n)
    bad = (out < 0) | (out >= G)
    if bad.any():
        s, j = np.argwhere(bad)[0]
        r.add(f"table {name!r}: ID {int(ids[j])} requested from GPU {int(s)} routes to GPU "
              f"{int(out[s, j])}, outside [0, {G}) ({int(bad.sum())} such lookups)")
        return None
    return out


def _members(tier_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``ids`` are in the sorted ``tier_ids`` (bool), and their positions there."""
    pos = np.searchsorted(tier_ids, ids)
    pos = np.minimum(pos, max(tier_ids.size - 1, 0))
    m = (tier_ids[pos] == ids) if tier_ids.size > 0 else np.zeros(ids.size, bool)
    return m, pos


def _expected_owners(topo: Topology, tp: TablePlan, ids: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """What the tiers say: the owner of each ID from each GPU (G x n, -1 where the cold function
    is a hash, checked apart) and the tier of each ID (0 cold, 1 global, 2 node, 3 placed)."""
    G, M, n = topo.num_gpus, topo.gpus_per_node, ids.size
    g = np.arange(G, dtype=np.int64)[:, None]
    expected = np.full((G, n), -1, dtype=np.int64)
    kind = np.zeros(n, dtype=np.int8)
    mg, _ = _members(tp.global_ids, ids)
    mn, pn = _members(tp.node_ids, ids)
    mp, pp = _members(tp.placed_ids, ids)
    kind[mg], kind[mn], kind[mp] = 1, 2, 3
    expected[:, mg] = np.broadcast_to(g, (G, n))[:, mg]
    if mn.any():
        expected[:, mn] = (g // M) * M + tp.node_local[pn[mn]][None, :]
    if mp.any():
        expected[:, mp] = tp.placed_gpus[pp[mp]][None, :]
    cold = kind == 0
    c = tp.cold
    if cold.any() and c.kind == "range":
        j = np.searchsorted(c.bounds, ids[cold], side="right") - 1
        j = np.clip(j, 0, c.gpus.size - 1)
        expected[:, cold] = c.gpus[j][None, :]
    return expected, kind


_TIER_LABELS = {1: "a global replica (must be served by the requester itself)",
                2: "a node replica (must be served inside the requester's node, by local GPU "
                   "node_local)",
                3: "a placed row (must be served by its placed GPU)",
                0: "a cold row (must be served by the cold function's owner)"}


def _check_expected_owners(name: str, ids: np.ndarray, out: np.ndarray, expected: np.ndarray,
                           kind: np.ndarray, r: _Report) -> None:
    """One violation per tier whose IDs route elsewhere than the tiers say."""
    wrong = (expected >= 0) & (out != expected)
    for k in (1, 2, 3, 0):
        w = wrong & (kind == k)[None, :]
        if w.any():
            s, j = np.argwhere(w)[0]
            r.add(f"table {name!r}: ID {int(ids[j])} is {_TIER_LABELS[k]}; requested from GPU "
                  f"{int(s)} it routes to GPU {int(out[s, j])}, expected GPU "
                  f"{int(expected[s, j])} ({int(w.sum())} such lookups)")


def _check_cold_owners(tp: TablePlan, cold_ids: np.ndarray, oc: np.ndarray, r: _Report) -> None:
    """Cold rows: a hash owner among the cold GPUs, and one owner whatever the requester."""
    name, c = tp.name, tp.cold
    if c.kind == "hash":
        notin = ~np.isin(oc, c.gpus)
        if notin.any():
            s, j = np.argwhere(notin)[0]
            r.add(f"table {name!r}: cold ID {int(cold_ids[j])} routes to GPU {int(oc[s, j])}, "
                  f"not one of the cold GPUs {c.gpus.tolist()}")
    varies = np.any(oc != oc[:1], axis=0)
    if varies.any():
        r.add(f"table {name!r}: cold rows {_ex(cold_ids[varies])} route to different owners "
              f"from different GPUs (one owner per cold row expected)")


def _check_stored_rows(topo: Topology, tp: TablePlan, cold_owner: np.ndarray,
                       r: _Report) -> None:
    """Every ID was routed (``cold_owner``: the owner of each cold row): the memory accounting
    must store exactly the rows the routing serves, host memory included."""
    G, M, name = topo.num_gpus, topo.gpus_per_node, tp.name
    stored = np.full(G, tp.global_ids.size, dtype=np.int64)
    stored += np.tile(np.bincount(tp.node_local, minlength=M)[:M], topo.nodes)
    np.add.at(stored, tp.placed_gpus, 1)
    np.add.at(stored, cold_owner, 1)
    acct = tp.rows_per_gpu(topo)
    if tp.has_host_tier:
        # HBM (placed rows, replicas, fraction f of the other cold rows) + host = stored
        cold_rows = np.bincount(cold_owner, minlength=G).astype(np.float64)
        host = tp.host_rows_per_gpu(topo)
        if not np.allclose(host, (1.0 - tp.hbm_fraction) * cold_rows, rtol=_RTOL, atol=1e-9):
            gpu = int(np.flatnonzero(~np.isclose(host, (1.0 - tp.hbm_fraction) * cold_rows,
                                                 rtol=_RTOL, atol=1e-9))[0])
            r.add(f"table {name!r}: GPU {gpu} keeps {host[gpu]:.6g} rows in host memory by "
                  f"the accounting, expected (1 - hbm_fraction) x {int(cold_rows[gpu])} cold "
                  f"rows it serves")
    if not np.array_equal(acct, stored):
        gpu = int(np.flatnonzero(acct != stored)[0])
        r.add(f"table {name!r}: rows_per_gpu says GPU {gpu} stores {int(acct[gpu])} rows but "
              f"the routing serves {int(stored[gpu])} rows from it (memory accounting and "
              f"routing disagree)")


def _check_prefix(tp: TablePlan, s: FrequencySummary, r: _Report) -> None:
    """Global, and global + node, tiers hold the hottest rows of the summary (ties allowed)."""
    if tp.replicated:
        return
    H = tp.table.num_rows
    ids, est = _top_of(s, H)
    tail_est = s.tail_probability() * float(s.total)
    sorted_ids = np.argsort(ids)
    ids_sorted = ids[sorted_ids]

    def est_of(rows):
        pos = np.searchsorted(ids_sorted, rows)
        pos = np.minimum(pos, max(ids_sorted.size - 1, 0))
        inside = (ids_sorted[pos] == rows) if ids_sorted.size else np.zeros(rows.size, bool)
        return np.where(inside, est[sorted_ids][pos] if ids_sorted.size else 0.0, tail_est)

    for tier, label in ((tp.global_ids, "the global tier"),
                        (np.union1d(tp.global_ids, tp.node_ids), "the global + node tiers")):
        if tier.size == 0:
            continue
        e = est_of(tier)
        i_min = int(np.argmin(e))
        out = ~np.isin(ids, tier)
        if not out.any():
            continue
        # explicit rows outside the tier, hottest first (rows are sorted by decreasing estimate)
        j = int(np.flatnonzero(out)[0])
        if est[j] > e[i_min] * (1 + _RTOL) and est[j] - e[i_min] > 1e-12 * max(1.0, s.total):
            hotter = ids[out & (est > e[i_min] * (1 + _RTOL))]
            r.add(f"table {tp.name!r}: {label} are not a prefix of the frequency order: row "
                  f"{int(ids[j])} (estimate {est[j]:.6g}) is outside but row {int(tier[i_min])} "
                  f"(estimate {e[i_min]:.6g}) is inside; hotter rows left out: {_ex(hotter)}")


def _check_conservation(cost: Any, label: str, r: _Report) -> None:
    """Bytes sent equal bytes received, per component and link class; backward is the forward
    transposed; matrices agree with the per-GPU sums. Only the ``torchrec`` profile may count
    bytes on the local class (a rank's own chunk of TorchRec's buffers)."""
    own_chunks = getattr(cost, "profile", "ideal") == "torchrec"
    for comp in COMPONENTS:
        s, v = cost.send[comp], cost.recv[comp]
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(v))):
            r.add(f"{label}: {comp} bytes are not finite")
            continue
        if (s < 0).any() or (v < 0).any():
            r.add(f"{label}: negative {comp} bytes")
        scale = max(1.0, float(s.sum()), float(v.sum()))
        if abs(float(s.sum()) - float(v.sum())) > _RTOL * scale:
            r.add(f"{label}: {comp} bytes sent ({s.sum():.6g}) != received ({v.sum():.6g})")
        for i, cls in enumerate(("local", "intra-node", "inter-node")):
            if abs(float(s[:, i].sum()) - float(v[:, i].sum())) > _RTOL * scale:
                r.add(f"{label}: {comp} {cls} bytes sent ({s[:, i].sum():.6g}) != received "
                      f"({v[:, i].sum():.6g})")
        if float(np.abs(s[:, 0]).sum()) > _RTOL * scale and not (own_chunks and comp != "sync"):
            r.add(f"{label}: {comp} counts {s[:, 0].sum():.6g} bytes on the local link class "
                  f"(local lookups must cost nothing)")
    mats = cost.matrices
    if mats:
        f, b = mats.get("forward"), mats.get("backward")
        if f is not None and b is not None:
            scale = max(1.0, float(np.abs(f).max()) if f.size else 1.0)
            if f.shape != b.T.shape or not np.allclose(b, f.T, rtol=_RTOL, atol=_RTOL * scale):
                r.add(f"{label}: backward bytes are not the forward bytes transposed")
        for comp, m in mats.items():
            if m is None:
                continue
            scale = max(1.0, float(np.abs(m).sum()))
            if np.abs(np.diag(m)).sum() > _RTOL * scale and not (own_chunks and comp != "sync"):
                r.add(f"{label}: {comp} matrix has bytes on its diagonal (a GPU sending to itself)")
            if comp in cost.send:
                if not np.allclose(m.sum(axis=1), cost.send[comp].sum(axis=1), rtol=1e-7,
                                   atol=_RTOL * scale):
                    r.add(f"{label}: {comp} matrix row sums differ from the bytes sent per GPU")
                if not np.allclose(m.sum(axis=0), cost.recv[comp].sum(axis=1), rtol=1e-7,
                                   atol=_RTOL * scale):
                    r.add(f"{label}: {comp} matrix column sums differ from the bytes received "
                          f"per GPU")


def _check_round_trip(plan: Plan, r: _Report) -> None:
    with tempfile.TemporaryDirectory(prefix="flexshard-check-") as d:
        try:
            plan.save(Path(d) / "plan")
            back = Plan.load(Path(d) / "plan")
        except Exception as e:  # noqa: BLE001
            r.add(f"plan file round trip failed: {type(e).__name__}: {e}")
            return
    if back == plan:
        return
    what = []
    if back.strategy != plan.strategy:
        what.append(f"strategy {plan.strategy!r} -> {back.strategy!r}")
    if back.topology != plan.topology:
        what.append("topology")
    if list(back.tables) != list(plan.tables):
        what.append(f"tables {list(plan.tables)} -> {list(back.tables)}")
    else:
        for n in plan.tables:
            a, b = plan.tables[n], back.tables[n]
            if a == b:
                continue
            diff = [f for f in ("table", "cold", "sharding") if getattr(a, f) != getattr(b, f)]
            diff += [f for f in ("global_ids", "node_ids", "node_local", "placed_ids",
                                 "placed_gpus", "hbm_fraction")
                     if not np.array_equal(getattr(a, f), getattr(b, f))]
            what.append(f"table {n!r} ({', '.join(diff) or 'unequal'})")
    r.add(f"plan changed through Plan.save / Plan.load: {'; '.join(what) or 'unequal'}")


def check_plan(plan: Plan, *, summaries: Mapping[str, FrequencySummary] | None = None,
               budget_bytes: float | None = None, batch_size: int | None = None,
               model: CostModel | None = None, sample_ids: Any = 256,
               mean_lengths: Mapping[str, float] | None = None,
               batches: Iterable[Batch] | None = None, round_trip: bool = True, seed: int = 0,
               full_route_limit: int = 1 << 22, max_tier_ids: int = 4096) -> list[str]:
    """Check the invariants of ``DESIGN.md`` section 4 on any plan; return the violations found
    (an empty list: all good).

    Checks
    ------
    - structure: tier arrays sorted, unique, in range and disjoint; GPU indices in ``[0, G)``;
      the sharding kind one of ``SHARDING_KINDS`` and consistent with the cold function (column
      shards on distinct GPUs covering the dim, global replicas only; table_row_wise and
      table_column_wise on one node);
    - routing, from every GPU: every checked ID of every table routes to exactly one owner in
      ``[0, G)``; global replicas are served by the requester itself, node replicas by local GPU
      ``node_local`` of the requester's node, placed rows by their GPU, cold rows by the cold function
      (the same owner from every GPU; ranges: by the bounds; hash: one of the cold GPUs);
      all-replicated tables stay local; column-wise tables: every cold lookup goes to every
      shard's GPU (:meth:`Plan.owners`) and each shard stores ``w / D`` of every cold row's
      bytes. Checked IDs: every ID when ``num_rows * G <=
      full_route_limit`` (then also: ``rows_per_gpu`` agrees with what the routing serves), else
      0, ``num_rows - 1``, the tier members (up to ``max_tier_ids`` per tier), the range bounds and
      ``sample_ids`` (a count of random IDs, an array of IDs, or ``{table: IDs}``);
    - with ``summaries``: the global tier, and the global + node tiers, are prefixes of the
      summary's frequency order: no explicit row outside a tier has a strictly larger estimate than
      a row inside (ties allowed; a tiered row not listed in the summary counts with the tail's
      per-row estimate); a table without a summary is a violation;
    - with ``budget_bytes``: every GPU's peak memory is within the budget: the analytic evaluator's
      rows + buffers + reservation when ``summaries`` and ``batch_size`` are given, else the stored
      rows only (HBM: rows a host memory tier keeps in host memory do not count);
    - host memory tier: ``hbm_fraction`` empty or one value in ``[0, 1]`` per GPU (never on an
      all-replicated table); with all IDs checked, the host rows accounted are ``1 - f`` of the cold
      rows each GPU serves; each node's host bytes fit its ``host_memory_bytes``;
    - with ``summaries`` and ``batch_size`` (and for ``batches``, replayed with ``evaluate_trace``):
      bytes sent equal bytes received per component and link class, nothing on the local class
      (but a rank's own chunk under the ``torchrec`` profile), backward equals forward
      transposed, matrix sums match the per-GPU sums;
    - ``round_trip``: ``Plan.load(plan.save(tmp)) == plan``.
    """
    r = _Report()
    topo = plan.topology
    G = topo.num_gpus
    rng = np.random.default_rng(seed)
    model = model or CostModel()
    for name, tp in plan.tables.items():
        if name != tp.name:
            r.add(f"plan lists table {tp.name!r} under the name {name!r}")
        if not _check_structure(plan, tp, r):
            continue
        ids, complete = _sample_for(tp, G, sample_ids, rng, full_route_limit, max_tier_ids)
        _check_routing(plan, tp, ids, complete, r)
        if summaries is not None:
            s = _summary_of(summaries, tp.table)
            if s is None:
                r.add(f"table {name!r}: no frequency summary (keyed by table name or feature)")
            else:
                _check_prefix(tp, s, r)

    cost = None
    if summaries is not None and batch_size is not None:
        try:
            cost = evaluate_analytic(plan, summaries, batch_size, model, mean_lengths=mean_lengths,
                                     want_matrices=G <= 512)
        except Exception as e:  # noqa: BLE001
            r.add(f"evaluate_analytic failed: {type(e).__name__}: {e}")
        if cost is not None:
            _check_conservation(cost, "analytic cost", r)
    if batches is not None:
        if batch_size is None:
            raise ValueError("check_plan: batches need batch_size (samples per GPU)")
        try:
            tr = evaluate_trace(plan, batches, batch_size, model)
        except Exception as e:  # noqa: BLE001
            r.add(f"evaluate_trace failed: {type(e).__name__}: {e}")
        else:
            _check_conservation(tr.mean, "trace cost", r)

    if budget_bytes is not None:
        if cost is not None:
            per, what = cost.peak_memory_per_gpu, "peak memory (rows + buffers + reservation)"
        else:
            per, what = plan.row_bytes_per_gpu, "stored rows"
        over = np.flatnonzero(per > budget_bytes * (1 + _RTOL))
        if over.size:
            g = int(over[np.argmax(per[over])])
            r.add(f"memory: GPU {g} needs {per[g]:.6g} bytes of {what}, over the budget of "
                  f"{budget_bytes:.6g} bytes per GPU ({over.size} of {G} GPUs over)")
    if any(tp.has_host_tier for tp in plan.tables.values()):
        try:
            per_node = plan.host_bytes_per_gpu.reshape(topo.nodes, topo.gpus_per_node).sum(axis=1)
        except Exception as e:  # noqa: BLE001
            r.add(f"host memory accounting failed: {type(e).__name__}: {e}")
            per_node = np.zeros(topo.nodes)
        over_n = np.flatnonzero(per_node > topo.host_memory_bytes * (1 + _RTOL))
        if over_n.size:
            n = int(over_n[0])
            r.add(f"memory: node {n} keeps {per_node[n]:.6g} bytes of cold rows in host memory, "
                  f"over its host_memory_bytes of {float(topo.host_memory_bytes[n]):.6g}")
    if round_trip:
        _check_round_trip(plan, r)
    return r.items


def assert_plan_ok(plan: Plan, **kwargs: Any) -> None:
    """:func:`check_plan`, raising AssertionError listing every violation."""
    v = check_plan(plan, **kwargs)
    if v:
        raise AssertionError(f"{len(v)} invariant violation(s) in {plan!r}:\n  - "
                             + "\n  - ".join(v))


def check_never_worse(plan: Plan, summaries: Mapping[str, FrequencySummary], batch_size: int,
                      budget_bytes: float, *, model: CostModel | None = None,
                      mean_lengths: Mapping[str, float] | None = None, target: str | None = None,
                      strategies: Sequence[str] = BASELINES) -> list[str]:
    """Whether ``plan`` is never worse than a baseline; return the violations (empty: none).

    Every baseline of ``strategies`` (``placement.baselines.baseline_plans``: built on the plan's
    tables and topology from the same ``summaries`` and ``batch_size``, samples per GPU) that the
    ``target`` runtime executes (default: the model's profile; ``ExecutionProfile.can_run``) and
    whose analytic peak per-GPU memory fits ``budget_bytes`` must not have a smaller modelled
    ``iteration_time_s`` (seconds, relative slack 1e-9) than ``plan`` under the same ``model``
    and ``mean_lengths`` (IDs per sample, default the summaries'). The plan itself must fit the
    budget too. ``batch_size`` may be a :class:`~flexshard_stream.placement.workload.Workload`
    (B, model and mean lengths in one; ``model`` and ``mean_lengths`` then stay None).
    """
    work = workload_of(batch_size, model, mean_lengths, where="check_never_worse")
    model = work.model
    runtime = execution_profile(model.profile if target is None else target)
    tables = [tp.table for tp in plan.tables.values()]

    def cost(p: Plan):
        return evaluate_analytic(p, summaries, workload=work, want_matrices=False)

    mine = cost(plan)
    out = []
    if mine.peak_memory_bytes > budget_bytes * (1 + _RTOL):
        out.append(f"the plan's peak memory {mine.peak_memory_bytes:.6g} bytes per GPU exceeds "
                   f"the budget of {budget_bytes:.6g}")
    for name, base in baseline_plans(tables, plan.topology, summaries, work,
                                     strategies).items():
        if not runtime.can_run(base):
            continue
        c = cost(base)
        if c.peak_memory_bytes > budget_bytes * (1 + _RTOL):
            continue
        if mine.iteration_time_s > c.iteration_time_s * (1 + _RTOL):
            out.append(f"baseline {name!r} fits the budget ({c.peak_memory_bytes:.6g} of "
                       f"{budget_bytes:.6g} bytes per GPU) and is faster: "
                       f"{c.iteration_time_s:.6g} s per iteration against the plan's "
                       f"{mine.iteration_time_s:.6g} s ({runtime.label} profile "
                       f"{model.profile!r})")
    return out


def assert_never_worse(plan: Plan, summaries: Mapping[str, FrequencySummary], batch_size: int,
                       budget_bytes: float, **kwargs: Any) -> None:
    """:func:`check_never_worse`, raising AssertionError listing every violation."""
    v = check_never_worse(plan, summaries, batch_size, budget_bytes, **kwargs)
    if v:
        raise AssertionError(f"{plan!r} is worse than a baseline:\n  - " + "\n  - ".join(v))
