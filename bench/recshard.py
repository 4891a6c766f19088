"""RecShard memory-tier benchmark: frequency-aware vs frequency-blind HBM / host-memory splits.

Workload: ``synth.preset("production", scale)`` (32 pooled tables calibrated to Meta's 2022 reuse
histogram, 473 IDs per sample, Zipf exponents 0 .. 1.7), D = 128 fp32, s = 4 bytes of optimizer state
per row (row-wise Adagrad). Quick: ``2x8`` (16 GPUs), scale 1/8, B = 1,024 samples per GPU (the
preset's reference batch of 16,384 samples per iteration); full: ``16x8``, scale 1/4, B = 256
(32,768).

The first half of the trace (``--iterations`` iterations) is counted exactly (StreamStats with the
tables' row counts) and summarized (top ``--topk`` rows + tail per table); the plan is row-wise; for
each HBM fraction ``keep`` (default 10%, 25%, 50%) the per-GPU HBM budget is set so that exactly
``keep`` of each GPU's cold rows fit (``budget[g] = fixed[g] + keep * cold[g]``: replicas, placed
rows, buffers and reservation plus that share of the cold-row bytes). ``recshard.split_cold`` builds
the frequency-aware (RecShard) and the frequency-blind split with the same budget from the planning
summaries; both are evaluated in trace mode on the second half (out of sample) and analytically on
the planning summaries.

Note on the workload: the largest table (``prod_31``, Zipf 1.7) holds about three quarters of the
cold bytes and only a small fraction of its rows (about 1e4 of 4.2e6 in quick) is touched in the
planning half, so with 25% or more of HBM the frequency-aware split sends essentially only
never-seen rows to host memory; 10% forces the other tables to spill too. The analytic model gives
rows never seen in the planning half zero probability, hence its zero host lookups where the
out-of-sample trace finds a few.

Reported per HBM fraction and de-duplication setting: ``slow_memory_access_reduction_vs_blind``
(1 - host lookups aware / blind, out of sample), ``uvm_time_speedup_vs_blind`` (UVM time blind /
aware), ``iteration_time_speedup_vs_blind`` (comm + UVM), and the analytic / trace ratio of host
lookups for both splits (``analytic_vs_trace``); then the time of ``split_cold`` on 1,000 tables x
4,096 GPUs (``split_time``). The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import many_tables as paper_many_tables  # noqa: E402
from paper import plan_and_eval

from flexshard_stream.sources import synth  # noqa: E402
from flexshard_stream.placement.baselines import row_wise  # noqa: E402
from flexshard_stream.placement.cost import CostModel, evaluate_analytic, evaluate_trace  # noqa: E402
from flexshard_stream.placement.recshard import (  # noqa: E402
    cold_rows_per_gpu,
    slow_memory_report,
    split_cold,
)
from flexshard_stream.plans.tables import EmbeddingTable  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402

DIM, DTYPE, STATE_BYTES = 128, "fp32", 4
SETTINGS = (("dedup_on", True), ("dedup_off", False))


def log(msg: str = "") -> None:
    print(msg, flush=True)


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a == 0 else float("inf"))


def workload(args):
    spec = synth.preset("production", args.scale)
    tables = [EmbeddingTable(t.name, t.num_rows, DIM, DTYPE, t.kind,
                             optimizer_state_bytes=STATE_BYTES) for t in spec.tables]
    topo = Topology.preset(args.topology)
    G = topo.num_gpus
    B = args.batch_size
    spi = G * B
    n = args.iterations
    log(f"workload: preset 'production' scale {args.scale:g}: {len(tables)} pooled tables, "
        f"{sum(t.num_rows for t in tables) / 1e6:.2f} M rows, "
        f"{sum(t.mean_length for t in spec.tables):.0f} IDs per sample; {args.topology} ({G} GPUs), "
        f"B = {B} ({spi} samples/iteration); {n} iterations planned, the next {n} evaluated")
    sums, ev, ids_plan, ids_eval, _, gen_s = plan_and_eval(spec, tables, spi, n, args.seed,
                                                           args.topk)
    log(f"  generated and counted in {gen_s:.1f} s: {ids_plan / 1e6:.1f} M IDs planned on, "
        f"{ids_eval / 1e6:.1f} M IDs evaluated; summaries: top {args.topk} rows per table + tail")
    info = {"preset": "production", "scale": args.scale, "topology": args.topology, "gpus": G,
            "batch_size": B, "iterations_planned": n, "iterations_evaluated": len(ev),
            "ids_planned": ids_plan, "ids_evaluated": ids_eval, "topk": args.topk,
            "tables": len(tables), "rows": sum(t.num_rows for t in tables),
            "dim": DIM, "dtype": DTYPE, "optimizer_state_bytes": STATE_BYTES,
            "generate_and_count_s": gen_s}
    return tables, topo, sums, ev, B, info


def run_setting(plan, sums, ev, B, model, keeps):
    base = evaluate_analytic(plan, sums, B, model, want_matrices=False)
    rb = np.array([float(tp.table.row_bytes) for tp in plan.tables.values()])
    cold = cold_rows_per_gpu(plan) @ rb
    fixed = base.peak_memory_per_gpu - cold
    t0 = time.perf_counter()
    rw_trace = evaluate_trace(plan, ev, B, model).mean
    rw_s = time.perf_counter() - t0
    out = {"rw_comm_time_ms": 1e3 * rw_trace.comm_time_s,
           "rw_peak_memory_gb": base.peak_memory_bytes / 1e9,
           "cold_row_bytes_max_gb": float(cold.max()) / 1e9, "rw_trace_eval_s": rw_s}
    for aware in (True, False):  # warm-up (Numba compilation), untimed
        split_cold(plan, sums, B, fixed + keeps[0] * cold, model, frequency_aware=aware, cost=base)
    for keep in keeps:
        budget = fixed + keep * cold
        res = {"hbm_budget_gb_max": float(budget.max()) / 1e9}
        costs = {}
        for name, aware in (("aware", True), ("blind", False)):
            t0 = time.perf_counter()
            p = split_cold(plan, sums, B, budget, model, frequency_aware=aware, cost=base)
            split_s = time.perf_counter() - t0
            an = evaluate_analytic(p, sums, B, model, want_matrices=False)
            t0 = time.perf_counter()
            tr = evaluate_trace(p, ev, B, model).mean
            ev_s = time.perf_counter() - t0
            costs[name] = (an, tr)
            res[name] = {
                "split_s": split_s, "trace_eval_s": ev_s,
                "placed_rows_added": p.meta["recshard"]["placed_rows_added"],
                "tables_with_host_tier": sum(tp.has_host_tier for tp in p.tables.values()),
                "host_bytes_gb_max": float(p.host_bytes_per_gpu.max()) / 1e9,
                "hbm_peak_over_budget_analytic": float((an.peak_memory_per_gpu / budget).max()),
                "hbm_peak_over_budget_trace": float((tr.peak_memory_per_gpu / budget).max()),
                "host_lookups_per_iter_trace": tr.host_lookups_total,
                "host_lookups_per_iter_analytic": an.host_lookups_total,
                "uvm_time_ms_trace": 1e3 * tr.uvm_time_s, "uvm_time_ms_analytic": 1e3 * an.uvm_time_s,
                "comm_time_ms_trace": 1e3 * tr.comm_time_s,
                "iteration_time_ms_trace": 1e3 * tr.iteration_time_s,
                "analytic_vs_trace_host_lookups": ratio(an.host_lookups_total, tr.host_lookups_total),
                "analytic_vs_trace_uvm_time": ratio(an.uvm_time_s, tr.uvm_time_s)}
        oos = slow_memory_report(costs["aware"][1], costs["blind"][1])
        ana = slow_memory_report(costs["aware"][0], costs["blind"][0])
        res["out_of_sample"] = oos
        res["analytic"] = ana
        res["slow_memory_access_reduction_vs_blind"] = oos["slow_memory_access_reduction_vs_blind"]
        res["uvm_time_speedup_vs_blind"] = oos["uvm_time_speedup_vs_blind"]
        res["iteration_time_speedup_vs_blind"] = oos["iteration_time_speedup_vs_blind"]
        res["analytic_vs_trace"] = {k: res[k]["analytic_vs_trace_host_lookups"]
                                    for k in ("aware", "blind")}
        log(f"    HBM keeps {keep:.0%} of cold rows (budget {res['hbm_budget_gb_max'] * 1e3:.2f} MB "
            f"max): host lookups/iter aware {res['aware']['host_lookups_per_iter_trace']:.4g}, "
            f"blind {res['blind']['host_lookups_per_iter_trace']:.4g} -> reduction "
            f"{res['slow_memory_access_reduction_vs_blind']:.1%}; UVM ms aware "
            f"{res['aware']['uvm_time_ms_trace']:.4f}, blind {res['blind']['uvm_time_ms_trace']:.4f}"
            f" -> {res['uvm_time_speedup_vs_blind']:.2f}x; iteration (comm + UVM) "
            f"{res['iteration_time_speedup_vs_blind']:.2f}x")
        log(f"      analytic (planning summaries) / trace (out of sample) host lookups: aware "
            f"{res['analytic_vs_trace']['aware']:.3f}, blind {res['analytic_vs_trace']['blind']:.3f};"
            f" analytic reduction {ana['slow_memory_access_reduction_vs_blind']:.1%}; split "
            f"{res['aware']['split_s'] * 1e3:.0f} ms aware ({res['aware']['placed_rows_added']} rows "
            f"placed), {res['blind']['split_s'] * 1e3:.0f} ms blind; HBM peak / budget (trace) "
            f"{res['aware']['hbm_peak_over_budget_trace']:.4f} / "
            f"{res['blind']['hbm_peak_over_budget_trace']:.4f}")
        out[f"{keep:g}"] = res
    return out


def many_tables(T=1000, N=512, M=8, k=1000, seed=0):
    """bench/paper.py's planning-time workload: T tables on N x M GPUs, one Zipf summary each."""
    return paper_many_tables(T, N, M, k, seed)


def split_time(repeats=3, B=64, keep=0.5):
    """Seconds of split_cold on 1,000 tables x 4,096 GPUs (row-wise, every GPU overflowing), with
    and without the plan's analytic cost passed in (median of ``repeats`` after a warm-up)."""
    t0 = time.perf_counter()
    topo, tables, sums = many_tables()
    plan = row_wise(tables, topo)
    build_s = time.perf_counter() - t0
    base = evaluate_analytic(plan, sums, B, want_matrices=False)
    rb = np.array([float(t.row_bytes) for t in tables])
    cold = cold_rows_per_gpu(plan) @ rb
    budget = base.peak_memory_per_gpu - cold + keep * cold
    out = {"tables": len(tables), "gpus": topo.num_gpus, "build_s": build_s}
    for aware in (True, False):
        name = "aware" if aware else "blind"
        split_cold(plan, sums, B, budget, frequency_aware=aware, cost=base)   # warm-up
        for with_cost in (True, False):
            ts = []
            for _ in range(repeats):
                t1 = time.perf_counter()
                p = split_cold(plan, sums, B, budget, frequency_aware=aware,
                               cost=base if with_cost else None)
                ts.append(time.perf_counter() - t1)
            out[f"{name}_s" + ("" if with_cost else "_with_evaluation")] = float(np.median(ts))
        out[f"{name}_placed_rows_added"] = p.meta["recshard"]["placed_rows_added"]
    log(f"split_cold on {len(tables)} tables x {topo.num_gpus} GPUs (all overflowing, HBM keeps "
        f"{keep:.0%}): aware {out['aware_s'] * 1e3:.0f} ms ({out['aware_placed_rows_added']} rows "
        f"placed), blind {out['blind_s'] * 1e3:.0f} ms with the plan's cost given; "
        f"{out['aware_s_with_evaluation'] * 1e3:.0f} / {out['blind_s_with_evaluation'] * 1e3:.0f} "
        f"ms evaluating it first")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2x8, scale 1/8, 3 + 3 iterations "
                                                         "(under a minute)")
    ap.add_argument("--topology", default=None, help="preset topology (default 16x8; quick 2x8)")
    ap.add_argument("--scale", type=float, default=None,
                    help="row-count scale of the 'production' preset (default 1/4; quick 1/8)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="samples per GPU (default: the preset's reference batch over the GPUs)")
    ap.add_argument("--iterations", type=int, default=None,
                    help="iterations planned (and as many evaluated); default 6, quick 3")
    ap.add_argument("--topk", type=int, default=None,
                    help="explicit top rows per table summary (default 131072; quick 32768)")
    ap.add_argument("--keep", type=float, nargs="+", default=[0.1, 0.25, 0.5],
                    help="fractions of each GPU's cold rows that fit in HBM")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", choices=("torchrec", "ideal"), default="torchrec",
                    help="execution profile of the cost model (default torchrec)")
    args = ap.parse_args(argv)
    args.topology = args.topology or ("2x8" if args.quick else "16x8")
    args.scale = args.scale or (1 / 8 if args.quick else 1 / 4)
    args.iterations = args.iterations or (3 if args.quick else 6)
    args.topk = args.topk or ((1 << 15) if args.quick else (1 << 17))
    if args.batch_size is None:
        ref = synth.preset("production", args.scale).samples_per_batch
        args.batch_size = max(1, ref // Topology.preset(args.topology).num_gpus)
    t_start = time.perf_counter()
    tables, topo, sums, ev, B, info = workload(args)
    plan = row_wise(tables, topo)
    res = {"quick": args.quick, "workload": info, "plan": "rw", "keep": args.keep,
           "profile": args.profile}
    for key, dedup in SETTINGS:
        log(f"== {key}")
        res[key] = run_setting(plan, sums, ev, B, CostModel(dedup=dedup, profile=args.profile),
                               args.keep)
    main_ = res["dedup_on"]
    for k in ("slow_memory_access_reduction_vs_blind", "uvm_time_speedup_vs_blind",
              "iteration_time_speedup_vs_blind", "analytic_vs_trace"):
        res[k] = {f"{keep:g}": main_[f"{keep:g}"][k] for keep in args.keep}
    res["split_time"] = split_time()
    res["bench_s"] = time.perf_counter() - t_start
    red, spd = res["slow_memory_access_reduction_vs_blind"], res["uvm_time_speedup_vs_blind"]
    log("== summary (dedup on, out of sample): " + ", ".join(
        f"HBM {keep:.0%}: slow-memory accesses -{red[f'{keep:g}']:.1%}, UVM {spd[f'{keep:g}']:.2f}x"
        for keep in args.keep))
    print(json.dumps(res, default=float))


if __name__ == "__main__":
    main()
