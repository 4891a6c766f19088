"""TorchRec in the loop: exported plans run in a real DistributedModelParallel, their bytes measured
against the model, and the export of a 10^9-row table.

For each dataset of the shared real traces (MovieLens, Amazon, Criteo:
``online.torchrec_runtime.trace_workload``) and each plan (row-wise, table-wise, and FlexShard
planned on the trace's own statistics), the plan is exported (``export_torchrec``) and run in one
spawned gloo world of 4 CPU ranks, 2 per "node", the way a user runs an export: its ShardingPlan,
real KeyedJaggedTensors of original IDs through its ``KJTRemap``, outputs merged back. Per plan
and collective: the bytes per iteration TorchRec sent (counted at the process group, summed over
ranks; an output's backward moves the same bytes back), the model's, and their ratio; whether every
output and gradient equals the unsharded original tables'. The model is the evaluator's ``torchrec``
profile (``evaluate_trace`` of ``plan_from_export`` on the same batches, ``dedup=False``: TorchRec's
de-duplication has no CPU kernel) when this checkout has it, else the byte formulas
(``expected_export_collectives``); the JSON says which (``model``).

Then a 10^9-row table (FlexShard's node replicas plus 400,000 rows replicated or placed by hand,
weighted cold ranges, 4 x 8 GPUs) is exported: wall seconds, the peak of Python and numpy
allocations during the call (``tracemalloc``: ``export_peak_mb_1e9_rows``) and, as a check from the
operating system, the peak resident memory above the process's before the call (``VmHWM`` after a
reset: ``export_peak_rss_growth_mb_1e9_rows``); the same for hashed 64-bit IDs (2**63 - 1 rows).

    python bench/torchrec_real.py --quick    # B = 8 per rank, 2 iterations: under 3 minutes
    python bench/torchrec_real.py            # B = 32 per rank, 4 iterations

Keys of the last line (one JSON object): ``bytes_model_vs_measured_max_err`` (largest relative
error over components and plans), ``export_seconds_1e9_rows``, ``export_peak_mb_1e9_rows``,
``outputs_match``; targets 0.02, 10 s, 500 MB, true. Without torch / TorchRec the runs are skipped
(``torch: false``) and the export figures are still measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flexshard_stream.bridge.export import (  # noqa: E402
    export_torchrec,
    load_torchrec_export,
    plan_from_export,
)
from flexshard_stream.bridge.runtime import (  # noqa: E402
    TRACE_DATASETS,
    compare_components,
    expected_export_collectives,
    run_sharded_cases,
    run_unsharded,
    trace_workload,
)
from flexshard_stream.placement import baselines  # noqa: E402
from flexshard_stream.placement.cost import CostModel  # noqa: E402
from flexshard_stream.placement.planner import plan_flexshard  # noqa: E402
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan  # noqa: E402
from flexshard_stream.plans.tables import EmbeddingTable  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402
from flexshard_stream.stats.batch import Batch, slice_batch  # noqa: E402
from flexshard_stream.stats.stream import StreamStats  # noqa: E402

W, M = 4, 2
PLANS = ("row_wise", "table_wise", "flexshard")
SHARED = Path(os.environ.get("FLEXSHARD_SHARED_DATA", ROOT.parent / "shared" / "data"))


# ----------------------------------------------------------------------------- the plans
def _features(batch: Batch, keys) -> Batch:
    return Batch.from_features({k: batch.feature_values(k) for k in keys},
                               {k: batch.feature_lengths(k) for k in keys})


def dataset_plans(tables: list[EmbeddingTable], batch: Batch, b: int) -> dict[str, Plan]:
    """Row-wise, table-wise and FlexShard (planned on the trace's statistics) on W = 4, M = 2."""
    topo = Topology.uniform(W // M, M)
    stats = StreamStats(auto_tables=True)
    stats.update(batch)
    fs = plan_flexshard(tables, topo, stats.summary(k=4096), b, model=CostModel(dedup=False))
    return {"row_wise": baselines.row_wise(tables, topo),
            "table_wise": baselines.table_wise(tables, topo), "flexshard": fs.plan}


# ----------------------------------------------------------------------------- the model
def model_bytes(ex, batches: list[Batch], b: int) -> tuple[str, dict[str, float]]:
    """Bytes per iteration per component as the model prices them: the evaluator's ``torchrec``
    profile on the plan TorchRec runs, else the byte formulas."""
    try:
        model = CostModel(profile="torchrec", dedup=False)
    except TypeError:      # this checkout's evaluator has no execution profiles yet
        model = None
    if model is not None:
        from flexshard_stream.placement.cost import evaluate_trace

        plan = plan_from_export(ex)
        keys = [tp.table.feature for tp in plan.tables.values()]
        tc = evaluate_trace(plan, [_features(x, keys) for x in batches], b, model)
        return "evaluator torchrec profile", {k: float(v)
                                              for k, v in tc.mean.collectives.items()}
    per = [expected_export_collectives(ex, x).component_bytes() for x in batches]
    comps = set().union(*per)
    return "byte formulas (expected_export_collectives)", {
        c: float(np.mean([p.get(c, 0) for p in per])) for c in comps}


def outputs_match(run, ref, iterations: int) -> bool:
    for it in range(iterations):
        for r in range(W):
            for f, out in run.outputs[it][r].items():
                if not np.allclose(out, ref.outputs[it][r][f], rtol=1e-5, atol=1e-6):
                    return False
        for name, g in run.grads[it].items():
            if not np.allclose(g, ref.grads[it][name], rtol=1e-5, atol=1e-6):
                return False
    return True


# ----------------------------------------------------------------------------- the runs
def run_exports(b: int, iterations: int, work: Path) -> dict:
    """Every (dataset, plan) exported and run in one world; per case the comparison."""
    tables, full = trace_workload(SHARED, W * b * iterations)
    batches = [slice_batch(full, i * W * b, (i + 1) * W * b) for i in range(iterations)]
    exports, refs = {}, {}
    for ds, feats in TRACE_DATASETS.items():
        ts = [tables[f] for f in feats]
        local = [_features(x, feats) for x in batches]
        for name, plan in dataset_plans(ts, _features(full, feats), b).items():
            export_torchrec(plan, work / f"{ds}-{name}")
            exports[(ds, name)] = (load_torchrec_export(work / f"{ds}-{name}"), local)
        refs[ds] = run_unsharded(ts, local, world_size=W)
    t0 = time.perf_counter()
    # one world for every case; each case's batches are its dataset's features (the
    # others pass through the remap unused): give every case the full batches
    runs = run_sharded_cases([ex for ex, _ in exports.values()], batches, world_size=W,
                             local_world_size=M)
    seconds = time.perf_counter() - t0
    out = {}
    for ((ds, name), (ex, local)), run in zip(exports.items(), runs):
        label, model = model_bytes(ex, local, b)
        cmp = compare_components(run.counter.mean_component_bytes(), model)
        out[f"{ds}/{name}"] = {
            "model": label, "outputs_match": outputs_match(run, refs[ds], iterations),
            "components": cmp, "max_err": max(c["err"] for c in cmp.values())}
    return {"cases": out, "world_seconds": seconds}


# ----------------------------------------------------------------------------- a big export
def big_plan(num_rows: int, cold: ColdSharding, seed: int = 0) -> Plan:
    """One table of ``num_rows`` rows on 4 x 8 GPUs: 100,000 global replicas, 150,000 node
    replicas and 150,000 explicitly placed rows (random IDs), the rest by ``cold``."""
    topo = Topology.uniform(4, 8)
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(0, num_rows, 400_000, dtype=np.int64))
    rng.shuffle(ids)
    g, n, p = (np.sort(ids[:100_000]), np.sort(ids[100_000:250_000]), np.sort(ids[250_000:]))
    t = EmbeddingTable("item", num_rows, 128, optimizer_state_bytes=4)
    return Plan("flexshard", topo, [TablePlan(
        t, cold, global_ids=g, node_ids=n, node_local=np.arange(n.size) % 8, placed_ids=p,
        placed_gpus=rng.integers(0, 32, p.size).astype(np.int32))])


def _status_kb(field: str) -> int | None:
    """A ``VmRSS`` / ``VmHWM`` figure of this process (kB; None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's resident high-water mark (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def timed_export(plan: Plan, work: Path) -> dict:
    """Wall seconds of one export, its peak of Python and numpy allocations (``tracemalloc``,
    MB) and its peak resident memory above the process's before the call (``VmHWM`` after a
    reset, MB; None where Linux's counters are missing); the remap's bytes."""
    rss0 = _status_kb("VmRSS")
    reset = _reset_peak_rss()
    tracemalloc.start()
    t0 = time.perf_counter()
    m = export_torchrec(plan, work)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    hwm = _status_kb("VmHWM")
    rss_mb = (hwm - rss0) / 1e3 if (reset and rss0 is not None and hwm is not None) else None
    return {"seconds": seconds, "peak_mb": peak / 1e6, "peak_rss_growth_mb": rss_mb,
            "remap_bytes": sum(e["remap_bytes"] for e in m["tables"]),
            "rows": m["tables"][0]["source_table"]["num_rows"]}


def big_exports(work: Path) -> dict:
    rng = np.random.default_rng(1)
    weighted = ColdSharding.ranges(range(32), 10**9, rng.uniform(1, 4, 32))
    return {"1e9_rows": timed_export(big_plan(10**9, weighted), work / "big"),
            "hashed_64bit": timed_export(big_plan(2**63 - 1, ColdSharding.hashed(range(32), 3)),
                                         work / "hashed")}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ----------------------------------------------------------------------------- report
def print_cases(cases: dict) -> None:
    for key, c in cases.items():
        print(f"{key}: outputs match {c['outputs_match']}, model = {c['model']}")
        for comp, v in c["components"].items():
            print(f"  {comp:28s} measured {v['measured']:>12,.0f} B/iter  model "
                  f"{v['model']:>12,.0f}  ratio {v['ratio']:.4f}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="B = 8 per rank, 2 iterations")
    args = ap.parse_args(argv)
    b, iterations = (8, 2) if args.quick else (32, 4)
    res: dict = {"quick": args.quick, "world_size": W, "local_world_size": M,
                 "batch_size": b, "iterations": iterations}
    with tempfile.TemporaryDirectory(prefix="fs-torchrec-real-") as tmp:
        work = Path(tmp)
        big = big_exports(work)
        res["export"] = big
        res["export_seconds_1e9_rows"] = big["1e9_rows"]["seconds"]
        res["export_peak_mb_1e9_rows"] = big["1e9_rows"]["peak_mb"]
        res["export_peak_rss_growth_mb_1e9_rows"] = big["1e9_rows"]["peak_rss_growth_mb"]
        has_torch = all(_importable(m) for m in ("torch", "torchrec"))
        res["torch"] = has_torch
        if not has_torch:
            res["note"] = ("torch / torchrec not installed (the 'torchrec' extra): no runs, "
                           "export figures only")
            res["bytes_model_vs_measured_max_err"] = None
            res["outputs_match"] = None
        elif not SHARED.exists():
            res["note"] = f"shared traces not found at {SHARED}: no runs"
            res["bytes_model_vs_measured_max_err"] = None
            res["outputs_match"] = None
        else:
            runs = run_exports(b, iterations, work)
            print_cases(runs["cases"])
            res["runs"] = runs
            res["bytes_model_vs_measured_max_err"] = max(c["max_err"]
                                                         for c in runs["cases"].values())
            res["outputs_match"] = all(c["outputs_match"] for c in runs["cases"].values())
    print(json.dumps(res, default=float))
    return res


if __name__ == "__main__":
    main()
