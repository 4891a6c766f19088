"""Cost-evaluator benchmark: IDs per second of the trace evaluator against a straightforward numpy
implementation of the same counts, and the time of the analytic mode on 1,000 tables x 4,096 GPUs.

Trace mode: the 16x8 preset (G = 128), B = 64 samples per GPU, 10 tables (7 sequence tables with
lognormal lengths of mean 100..200, 3 pooled tables), Zipf(1.05) over 1e6..1e8 rows with a random ID
permutation; about 9M IDs per iteration. Plans: row-wise (contiguous ranges) and row-wise plus
replicas (hottest 1,000 rows of each table global, the next 10,000 node replicas round-robin over
the 8 local GPUs). De-duplication on and off. The numpy peer (written here, vectorized per
iteration and table) must produce the same index / forward matrices as the evaluator's
``keep_matrices=True`` output; the bench checks that and reports it.

Analytic mode: ``Topology.uniform(512, 8)``, 1,000 tables of 1e6..1e8 rows, dim 64..256, one
FrequencySummary per table (1,000 top rows with Zipf estimates plus a uniform tail); a row-wise plan
and one with replicas (100 global + 1,000 node rows per table).

``--profile`` (default ``torchrec``; ``cost_profile`` in the JSON) is the execution profile of the
timed evaluations; the numpy peer computes the ``ideal`` profile, so the matrices are checked under ``ideal`` whatever the
profile timed. The analytic timings are given under both profiles
(``analytic_1000_tables_s_torchrec`` / ``_ideal``; ``analytic_1000_tables_s`` is the one of
``--profile``).

The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flexshard_stream.kernels.hashing import mix64_np  # noqa: E402
from flexshard_stream.kernels.traffic import table_traffic  # noqa: E402

from flexshard_stream.placement.baselines import row_wise  # noqa: E402
from flexshard_stream.placement.cost import CostModel, evaluate_analytic, evaluate_trace  # noqa: E402
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan  # noqa: E402
from flexshard_stream.plans.tables import EmbeddingTable  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402
from flexshard_stream.sources.synth import (  # noqa: E402
    IdPermutation,
    sample_lengths,
    zipf_pmf_head,
    zipf_ranks,
)
from flexshard_stream.stats.batch import Batch, rebatch  # noqa: E402
from flexshard_stream.stats.config import TableConfig  # noqa: E402
from flexshard_stream.stats.stream import validate_batch  # noqa: E402
from flexshard_stream.stats.summary import FrequencySummary  # noqa: E402

ALPHA = 1.05
# name, rows, dim, dtype, kind, mean IDs per sample
TRACE_TABLES = [
    ("seq_0", 100_000_000, 128, "fp32", "sequence", 200),
    ("seq_1", 60_000_000, 256, "fp16", "sequence", 150),
    ("seq_2", 30_000_000, 128, "fp32", "sequence", 120),
    ("seq_3", 10_000_000, 64, "fp32", "sequence", 180),
    ("seq_4", 5_000_000, 128, "fp16", "sequence", 100),
    ("seq_5", 2_000_000, 256, "fp32", "sequence", 160),
    ("seq_6", 1_000_000, 64, "fp32", "sequence", 130),
    ("pool_0", 80_000_000, 64, "fp32", "pooled", 20),
    ("pool_1", 4_000_000, 128, "fp32", "pooled", 40),
    ("pool_2", 1_500_000, 256, "fp16", "pooled", 5),
]


def timed(fn, repeats):
    """Median wall time of ``fn()`` over ``repeats`` runs (seconds) and the last result."""
    ts, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


# ============================================================================ workload
def trace_workload(G, B, iterations, seed=0):
    """Tables, their permutations, and ``iterations`` batches of exactly ``G * B`` samples."""
    tables = [EmbeddingTable(n, h, d, dt, k) for n, h, d, dt, k, _ in TRACE_TABLES]
    perms = [IdPermutation(t.num_rows, seed + 1 + j) for j, t in enumerate(tables)]
    batches = []
    for it in range(iterations):
        vals, lens = [], []
        for j, (t, perm) in enumerate(zip(tables, perms)):
            mean = TRACE_TABLES[j][5]
            rng = np.random.default_rng([seed, it, j])
            if t.kind == "sequence":
                ln = sample_lengths(G * B, "lognormal", mean, rng, max_length=8 * mean, sigma=0.6)
            else:
                ln = sample_lengths(G * B, "poisson", mean, rng)
            ranks = zipf_ranks(int(ln.sum()), t.num_rows, ALPHA, rng)
            vals.append(perm.forward(ranks))
            lens.append(ln)
        batches.append(Batch([t.name for t in tables], np.concatenate(vals), np.concatenate(lens)))
    return tables, perms, batches


def replica_plan(tables, perms, topo, k_global, k_node):
    """Row-wise ranges plus the hottest ``k_global`` rows global and the next ``k_node`` rows node
    replicas, round-robin over the local GPUs in rank order."""
    M = topo.gpus_per_node
    gpus = np.arange(topo.num_gpus)
    tps = []
    for t, perm in zip(tables, perms):
        g_ids = np.sort(perm.forward(np.arange(k_global)))
        n_ids = perm.forward(np.arange(k_global, k_global + k_node))
        n_loc = np.arange(k_node) % M
        o = np.argsort(n_ids)
        tps.append(TablePlan(t, ColdSharding.ranges(gpus, t.num_rows), global_ids=g_ids,
                             node_ids=n_ids[o], node_local=n_loc[o]))
    return Plan("rw+replicas", topo, tps, {"k_global": k_global, "k_node": k_node})


# ============================================================================ numpy peer
def _sorted_lookup(sorted_ids, ids):
    """(hit mask, position) of ``ids`` in the sorted array ``sorted_ids``."""
    pos = np.searchsorted(sorted_ids, ids)
    np.minimum(pos, sorted_ids.size - 1, out=pos)
    return sorted_ids[pos] == ids, pos


def numpy_iteration(plan, batch, B, dedup, index_bytes=8):
    """One iteration by plain vectorized numpy: (index matrix, forward matrix, s_global, s_node)."""
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    idx_m = np.zeros((G, G))
    fwd_m = np.zeros((G, G))
    s_global = 0.0
    s_node = np.zeros(M)
    samples = np.arange(G * B)
    for name in batch.keys:
        tp = plan[name]
        eb = float(tp.table.embedding_bytes)
        H = tp.table.num_rows
        ids = batch.feature_values(name)
        lens = batch.feature_lengths(name)
        pooled = tp.table.kind == "pooled"
        sample = np.repeat(samples, lens) if pooled else None
        src = sample // B if pooled else np.repeat(samples // B, lens)
        c = tp.cold
        if c.kind == "replicated":  # data parallel: every touched row is all-reduced
            s_global += np.unique(ids).size * eb
            continue
        # cold owner
        if c.kind == "range":
            j = np.searchsorted(c.bounds, ids, side="right") - 1
            np.clip(j, 0, c.gpus.size - 1, out=j)
            dst = c.gpus[j].astype(np.int64)
        else:  # hash
            dst = c.gpus[(mix64_np(ids, c.seed) % np.uint64(c.gpus.size)).astype(np.int64)]
            dst = dst.astype(np.int64)
        # tiers (disjoint): global replicas served locally, node replicas inside the node
        if tp.global_ids.size:
            hit, _ = _sorted_lookup(tp.global_ids, ids)
            dst[hit] = src[hit]
            s_global += np.unique(ids[hit]).size * eb
        if tp.node_ids.size:
            hit, pos = _sorted_lookup(tp.node_ids, ids)
            p = pos[hit]
            dst[hit] = (src[hit] // M) * M + tp.node_local[p]
            s_node += np.bincount(tp.node_local[np.unique(p)], minlength=M) * eb
        if tp.placed_ids.size:
            hit, pos = _sorted_lookup(tp.placed_ids, ids)
            dst[hit] = tp.placed_gpus[pos[hit]]
        remote = dst != src
        rs, rd = src[remote], dst[remote]
        if dedup:
            _, first = np.unique(rs * H + ids[remote], return_index=True)
            pair = rs[first] * G + rd[first]
        else:
            pair = rs * G + rd
        cnt_idx = np.bincount(pair, minlength=G * G).reshape(G, G)
        if pooled:  # one partial sum per distinct (sample, owner) pair
            sd = np.unique(sample[remote] * G + rd)
            cnt_emb = np.bincount((sd // G) // B * G + sd % G, minlength=G * G).reshape(G, G)
        else:
            cnt_emb = cnt_idx
        idx_m += cnt_idx * float(index_bytes)
        fwd_m += cnt_emb.T * eb
    return idx_m, fwd_m, s_global, s_node


def hierarchical_sync_total(topo, s_global, s_node):
    """Bytes sent by all GPUs in the hierarchical all-reduce (DESIGN.md section 3), written out."""
    G, N, M = topo.num_gpus, topo.nodes, topo.gpus_per_node
    tot = 0.0
    if M > 1:
        tot += G * 2 * (M - 1) / M * s_global
    if N > 1:
        tot += G * 2 * (N - 1) / N * s_global / M + N * 2 * (N - 1) / N * float(s_node.sum())
    return tot


# ============================================================================ profile helpers
def kernel_only(plan, batches, B, dedup, fresh_scratch=True):
    """The Numba kernel alone over the same inputs: seconds and seconds per table.

    ``fresh_scratch``: allocate the de-duplication hash set inside the timed call, as
    ``evaluate_trace`` does once per call (first-touch page faults included); otherwise reuse a set
    that was already touched by an untimed run.
    """
    topo = plan.topology
    G, M = topo.num_gpus, topo.gpus_per_node
    routers = {n: plan.router(n) for n in plan.tables}
    nmax = max(int(b.lengths.reshape(len(b.keys), -1).sum(axis=1).max()) for b in batches)
    size = 1 << max(4, int(np.ceil(np.log2(2 * nmax + 1))))
    feats = [[(n, b.feature_values(n), b.feature_lengths(n)) for n in b.keys] for b in batches]
    per_table = {n: 0.0 for n in plan.tables}
    held = {}

    def run():
        if fresh_scratch or not held:
            held["set"] = np.zeros((size, 2), np.int64)
            held["touch"] = {n: np.zeros(max(1, r.keys.size), np.int64)
                             for n, r in routers.items()}
            held["stamp"] = 0
        set_tab = held["set"]
        dp_tab = np.zeros((1, 2), np.int64)
        marks = np.full(G, -1, np.int64)
        for parts in feats:
            for n, ids, lens in parts:
                r = routers[n]
                tp = plan[n]
                held["stamp"] += G + 1
                marks.fill(-1)
                ci = np.zeros((G, G), np.int64)
                ce = np.zeros((G, G), np.int64)
                tn = np.zeros(M, np.int64)
                t0 = time.perf_counter()
                table_traffic(ids, lens, B, M, tp.table.num_rows, r.keys, r.vals, r.used, r.lg,
                              r.cold_kind, r.gpus,
                              r.bounds, r.seed, dedup, tp.table.kind == "pooled", set_tab,
                              held["stamp"], held["touch"][n], dp_tab, marks, ci, ce, tn)
                per_table[n] += time.perf_counter() - t0
    if not fresh_scratch:
        run()  # touch the scratch set once, untimed
        for n in per_table:
            per_table[n] = 0.0
    t, _ = timed(run, 1)
    return t, per_table


def profile_trace(plan, batches, B, dedup, eval_s, n_ids):
    """Where one evaluate_trace call spends its time (same batches, seconds per call)."""
    G = plan.topology.num_gpus
    spi = G * B
    t_rebatch, its = timed(lambda: list(rebatch(batches, spi)), 1)
    configs = {tp.table.feature: TableConfig(tp.name, tp.table.num_rows, tp.table.feature)
               for tp in plan.tables.values()}
    t_validate, _ = timed(lambda: [validate_batch(it, configs) for it in its], 1)
    t_kernel, per_table = kernel_only(plan, batches, B, dedup, fresh_scratch=True)
    t_kernel_warm, _ = kernel_only(plan, batches, B, dedup, fresh_scratch=False)
    other = eval_s - t_rebatch - t_validate - t_kernel
    ids_of = {n: sum(b.feature_values(n).size for b in batches) for n in plan.tables}
    return {"eval_s": eval_s, "rebatch_s": t_rebatch, "validate_s": t_validate,
            "kernel_s": t_kernel, "kernel_warm_scratch_s": t_kernel_warm, "other_s": other,
            "kernel_share": t_kernel / eval_s, "rebatch_share": t_rebatch / eval_s,
            "validate_share": t_validate / eval_s, "other_share": other / eval_s,
            "kernel_only_ids_per_s": n_ids / t_kernel,
            "kernel_ids_per_s_by_table": {n: ids_of[n] / per_table[n] for n in plan.tables}}


# ============================================================================ trace bench
def bench_trace(iterations, np_iterations, repeats, B=64, profile="torchrec"):
    topo = Topology.preset("16x8")
    G = topo.num_gpus
    t0 = time.perf_counter()
    tables, perms, batches = trace_workload(G, B, iterations)
    gen_s = time.perf_counter() - t0
    n_ids = int(sum(b.num_values for b in batches))
    plans = {"rw": row_wise(tables, topo),
             "replicas": replica_plan(tables, perms, topo, 1000, 10_000)}
    res = {"topology": "16x8", "G": G, "B": B, "tables": len(tables), "alpha": ALPHA,
           "iterations": iterations, "ids": n_ids, "ids_per_iteration": n_ids / iterations,
           "generate_s": gen_s, "cost_profile": profile, "numpy_peer_profile": "ideal",
           "eval_mode": "row-wise (contiguous ranges) plan, de-duplication on"}
    print(f"trace workload: {len(tables)} tables, G={G}, B={B}, {iterations} iterations, "
          f"{n_ids:,} IDs ({n_ids / iterations:,.0f} per iteration), generated in {gen_s:.1f} s")
    # one warm-up call (Numba compile / cache load, router build) on a small slice
    warm = [Batch(b.keys, *_head(b, G * 1)) for b in batches[:1]]
    for p in plans.values():
        for d in (True, False):
            for pr in {profile, "ideal"}:
                evaluate_trace(p, warm, 1, CostModel(dedup=d, profile=pr))
    matches = {}
    for pname, plan in plans.items():
        for dedup in (True, False):
            tag = f"{pname}{'' if dedup else '_no_dedup'}"
            model = CostModel(dedup=dedup, profile=profile)
            t_ev, tc = timed(lambda: evaluate_trace(plan, batches, B, model), repeats)
            assert tc.mean.iterations == iterations
            ev_rate = n_ids / t_ev
            # numpy peer on the first np_iterations iterations, checked against keep_matrices
            sub = batches[:np_iterations]
            n_sub = int(sum(b.num_values for b in sub))
            t_np, np_out = timed(lambda: [numpy_iteration(plan, b, B, dedup) for b in sub], 1)
            np_rate = n_sub / t_np
            ref = evaluate_trace(plan, sub, B, CostModel(dedup=dedup, profile="ideal"),
                                 keep_matrices=True)
            ok, worst = True, 0.0
            for (idx, fwd, s0, s1), mats in zip(np_out, ref.matrices):
                ok &= bool(np.allclose(mats["index"], idx, rtol=1e-12, atol=0))
                ok &= bool(np.allclose(mats["forward"], fwd, rtol=1e-12, atol=0))
                ok &= bool(np.allclose(mats["backward"], fwd.T, rtol=1e-12, atol=0))
                sync = hierarchical_sync_total(topo, s0, s1)
                ok &= bool(np.isclose(mats["sync"].sum(), sync, rtol=1e-12, atol=1e-6))
                worst = max(worst, float(np.abs(mats["index"] - idx).max()),
                            float(np.abs(mats["forward"] - fwd).max()))
            matches[tag] = ok
            res[f"eval_s_{tag}"] = t_ev
            res[f"eval_ids_per_s_{tag}"] = ev_rate
            res[f"numpy_ids_per_s_{tag}"] = np_rate
            res[f"speedup_vs_numpy_{tag}"] = ev_rate / np_rate
            res[f"a2a_bytes_per_iter_{tag}"] = tc.mean.a2a_bytes
            res[f"inter_node_bytes_per_iter_{tag}"] = tc.mean.inter_node_bytes
            print(f"  {tag:20s} evaluator {ev_rate / 1e6:7.2f} M IDs/s ({t_ev:.2f} s)   "
                  f"numpy {np_rate / 1e6:6.2f} M IDs/s   speedup {ev_rate / np_rate:5.1f}x   "
                  f"matrices match numpy on {len(sub)} iteration(s): {ok} (max |diff| {worst:g})   "
                  f"a2a {tc.mean.a2a_bytes / 1e9:.3f} GB/iter, inter-node "
                  f"{tc.mean.inter_node_bytes / 1e9:.3f} GB/iter")
    res["numpy_matches_by_config"] = matches
    res["numpy_matches"] = all(matches.values())
    res["numpy_iterations_checked"] = np_iterations
    res["eval_ids_per_s"] = res["eval_ids_per_s_rw"]
    res["eval_ids_per_s_no_dedup"] = res["eval_ids_per_s_rw_no_dedup"]
    res["numpy_ids_per_s"] = res["numpy_ids_per_s_rw"]
    res["speedup_vs_numpy"] = res["eval_ids_per_s"] / res["numpy_ids_per_s"]
    # where the evaluator's time goes (row-wise and replicas, dedup on)
    prof = {}
    for pname in ("rw", "replicas"):
        prof[pname] = profile_trace(plans[pname], batches, B, True, res[f"eval_s_{pname}"], n_ids)
        p = prof[pname]
        print(f"  profile {pname:9s}: kernel {p['kernel_s']:.2f} s ({p['kernel_share']:.0%}, "
              f"{p['kernel_only_ids_per_s'] / 1e6:.1f} M IDs/s alone; "
              f"{p['kernel_warm_scratch_s']:.2f} s with a pre-touched hash set), "
              f"rebatch {p['rebatch_s']:.2f} s "
              f"({p['rebatch_share']:.0%}), validate {p['validate_s']:.2f} s "
              f"({p['validate_share']:.0%}), other {p['other_s']:.2f} s ({p['other_share']:.0%})")
        print("    kernel M IDs/s by table: " + ", ".join(
            f"{n} {v / 1e6:.0f}" for n, v in p["kernel_ids_per_s_by_table"].items()))
    tn, _ = kernel_only(plans["rw"], batches, B, False)
    prof["rw_no_dedup_kernel_only_ids_per_s"] = n_ids / tn
    print(f"  kernel alone, rw, dedup off: {n_ids / tn / 1e6:.1f} M IDs/s")
    res["profile"] = prof
    return res


def _head(b, n):
    """Values and lengths of the first ``n`` samples of ``b`` (all keys)."""
    nk = len(b.keys)
    lens = b.lengths.reshape(nk, -1)
    offs = b.key_offsets()
    vals = [b.values[offs[i]:offs[i] + lens[i, :n].sum()] for i in range(nk)]
    return np.concatenate(vals), lens[:, :n].ravel()


# ============================================================================ analytic bench
def analytic_workload(T=1000, N=512, M=8, k=1000, seed=0):
    topo = Topology.uniform(N, M)
    rng = np.random.default_rng(seed)
    rows = np.round(10 ** rng.uniform(6, 8, T)).astype(np.int64)
    dims = rng.choice([64, 128, 256], T)
    kinds = np.where(rng.random(T) < 0.7, "sequence", "pooled")
    alphas = rng.uniform(0.9, 1.2, T)
    tables, summaries, perms = [], {}, []
    for i in range(T):
        H = int(rows[i])
        seq = kinds[i] == "sequence"
        L = float(rng.uniform(100, 200) if seq else rng.uniform(1, 40))
        t = EmbeddingTable(f"t{i:04d}", H, int(dims[i]), "fp32", str(kinds[i]))
        perm = IdPermutation(H, seed + 1 + i)
        total = 10**9
        p = zipf_pmf_head(k, H, float(alphas[i]))
        est = p * total
        top = perm.forward(np.arange(k))
        summaries[t.name] = FrequencySummary(
            t.name, total, top, est, est, est, float(H), float(H), float(H),
            float(total * max(0.0, 1.0 - p.sum())), float(H - k), H, True, int(total / L), L)
        tables.append(t)
        perms.append(perm)
    return topo, tables, perms, summaries


def bench_analytic(repeats, B=64, profile="torchrec"):
    t0 = time.perf_counter()
    topo, tables, perms, summaries = analytic_workload()
    build_s = time.perf_counter() - t0
    plans = {"rw": row_wise(tables, topo),
             "replicas": replica_plan(tables, perms, topo, 100, 1000)}
    res = {"analytic_tables": len(tables), "analytic_gpus": topo.num_gpus,
           "analytic_build_workload_s": build_s}
    print(f"analytic workload: {len(tables)} tables on {topo.num_gpus} GPUs "
          f"(built in {build_s:.1f} s)")
    for pr in (profile, *{"torchrec", "ideal"} - {profile}):
        model = CostModel(profile=pr)
        for pname, plan in plans.items():
            _analytic_timing(res, pname, plan, topo, summaries, B, model, repeats,
                             suffix="" if pr == profile else None)
    return res


def _analytic_timing(res, pname, plan, topo, summaries, B, model, repeats, suffix):
    """Time ``evaluate_analytic`` on one plan under ``model``: the keys of the profile
    (``analytic_1000_tables_s[_replicas]_<profile>``) and, with ``suffix == ""``, the same figures
    without the profile's name (the profile of ``--profile``)."""
    t0 = time.perf_counter()
    evaluate_analytic(plan, summaries, B, model)  # warm-up: Numba load, plan.flat, row bytes
    first = time.perf_counter() - t0
    t, cost = timed(lambda: evaluate_analytic(plan, summaries, B, model), repeats)

    def fresh():  # a new Plan object: plan.flat and row bytes are not cached yet
        p = Plan(plan.strategy, topo, list(plan.tables.values()))
        t1 = time.perf_counter()
        evaluate_analytic(p, summaries, B, model)
        return time.perf_counter() - t1
    tf = statistics.median(fresh() for _ in range(repeats))
    base = "analytic_1000_tables_s" + ("" if pname == "rw" else "_replicas")
    for key in [f"{base}_{model.profile}"] + ([base] if suffix == "" else []):
        res[key] = t
        res[key + "_first_call"] = first
        res[key + "_fresh_plan"] = tf
    tag = f"{pname}_{model.profile}"
    for k, v in (("a2a_bytes", cost.a2a_bytes), ("inter_node_bytes", cost.inter_node_bytes),
                 ("sync_bytes", cost.sync_bytes)):
        res[f"analytic_{k}_per_iter_{tag}"] = v
        if suffix == "":
            res[f"analytic_{k}_per_iter_{pname}"] = v
    print(f"  {pname:9s} {model.execution.label:12s} evaluate_analytic {t * 1e3:8.1f} ms (median "
          f"of {repeats}); first call {first * 1e3:.0f} ms; on a fresh Plan object "
          f"{tf * 1e3:.1f} ms   a2a {cost.a2a_bytes / 1e9:.2f} GB/iter, inter-node "
          f"{cost.inter_node_bytes / 1e9:.2f} GB/iter, sync {cost.sync_bytes / 1e9:.2f} GB/iter")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="2 iterations, numpy check on 1, 1 repeat (under a minute)")
    ap.add_argument("--profile", choices=("torchrec", "ideal"), default="torchrec",
                    help="execution profile of the timed evaluations (default torchrec)")
    args = ap.parse_args(argv)
    iterations, np_iterations, repeats, a_repeats = (2, 1, 1, 3) if args.quick else (6, 2, 3, 5)
    t0 = time.perf_counter()
    res = {"quick": args.quick}
    res.update(bench_trace(iterations, np_iterations, repeats, profile=args.profile))
    res.update(bench_analytic(a_repeats, profile=args.profile))
    res["targets"] = {"eval_ids_per_s>=50e6": res["eval_ids_per_s"] >= 50e6,
                      "analytic_1000_tables_s<0.1": res["analytic_1000_tables_s"] < 0.1}
    res["bench_s"] = time.perf_counter() - t0
    for k in ("eval_ids_per_s", "eval_ids_per_s_replicas", "eval_ids_per_s_no_dedup",
              "numpy_ids_per_s", "speedup_vs_numpy", "numpy_matches", "analytic_1000_tables_s",
              "analytic_1000_tables_s_replicas", "analytic_1000_tables_s_torchrec",
              "analytic_1000_tables_s_ideal", "targets"):
        print(f"{k:40s} {res[k]}")
    print(json.dumps(res, default=float))
    if not res["numpy_matches"]:  # the peer must compute the evaluator's numbers
        sys.exit("numpy peer and evaluate_trace disagree (see numpy_matches_by_config)")


if __name__ == "__main__":
    main()
