"""Sidecar benchmark: how much offered load it keeps up with inside a CPU budget, what it adds to
a training step, and how accurate its statistics are at the sampling rate it chose.

Traffic: two tables of 50M rows (sketched: above the exact-count limit), Zipf(1.05) IDs with a
random permutation, cut into host batches of ``--batch-ids`` IDs (2**19: 4096 samples, 64 IDs
per sample and table), a pool of 16 batches cycled. Offered rates are paced by the submitting
thread (a batch every ``batch_ids / rate`` seconds; the JSON holds the rates actually reached).

1. Capacity (``sidecar_max_offered_ids_per_s_without_drops``): ``Sidecar(cpu_budget=--budget)``
   (half a core) with the drop policy at nice 0 (the ring command's priority: the host's sidecar is
   a process of its own), fed at 25, 50, 100, 200, 400 M IDs/s; at each rate ``--adapt-s`` seconds
   to choose the rate, then ``--measure-s`` seconds counted: drops, the CPU share of the ingest
   threads, the sampling rate. The ladder stops at the first rate with drops, after one more rate
   halfway (geometrically) between it and the last good one. ``--runs`` runs; the median. Also:
   ``cpu_share_when_dropping`` (cores the ingest threads got at the first rate with drops: below
   the budget, the machine gave no more) and ``ids_per_s_the_budget_pays_for`` (the budget over
   the CPU seconds per ID measured: what a whole half core would ingest at that cost).
2. Step time (``step_time_overhead`` at ``--step-rate``, 50 M IDs/s): a one-thread training loop,
   each step a fixed amount of GIL-free compute (a Numba ``nogil`` loop calibrated to
   ``batch_ids / step_rate`` seconds: 10.5 ms) plus taking the next batch; interleaved blocks of
   ``--steps`` steps with and without submitting each batch (pairs alternate in order, the sidecar
   is flushed after a block with). Overhead = median step with / median step without - 1; also the
   median of the per-pair ratios, the mean, and the training thread's own CPU time. Sidecar
   defaults: decayed statistics, ``cpu_budget=0.5``, nice 19, checks every ``--check-every-s``.
   ``--runs`` runs; the median.
3. Accuracy (``sampled_recall_at_1000``, ``sampled_rel_err_top1000``): a sidecar with the budget,
   the block policy (no batch lost: exact counts are known) and undecayed statistics, fed at the
   capacity found in 1 (at most 200 M IDs/s) for as many IDs as the default decayed statistics
   hold at that rate (a half-life of 4 checks weighs as much as ``4 * check_every_s / ln 2``
   seconds counted in full: 14.4 s with checks every 2.5 s); the rate it chose and changed on the
   way, then top-1000 recall (ties allowed) and mean relative error of the true top 1000 against
   exact counts, the worse of the two tables (``bench/ingest.py``'s measures), from a checkpoint's
   statistics. The same at ``--accuracy-ids`` (200M, ``bench/ingest.py``'s length) in
   ``accuracy.by_stream_ids``: the error of a sampled count is about ``sqrt(k / f)``, so it
   depends on how many lookups the statistics hold.
4. Ring throughput between processes (``ring_bytes_per_s``).

The machine is shared (2 cores, other engineers' jobs): the JSON holds the load average before and
after, every run's figures and their medians. Last line of stdout: one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import SAMPLED_STREAM_IDS, as_batches, recall_and_err, zipf_ids

from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.sidecar import Sidecar, read_checkpoint
from flexshard_stream.plans.tables import EmbeddingTable
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources.ring import ring_throughput
from flexshard_stream.stats.batch import Batch
from flexshard_stream.stats.stream import StreamStats

ROWS = 50_000_000
KEYS = ("user", "item")
IDS_PER_SAMPLE = 64
POOL_BATCHES = 16
LADDER = (25e6, 50e6, 100e6, 200e6, 400e6)
TARGETS = {"max_offered": 200e6, "step_overhead": 0.01, "recall": 0.99, "rel_err": 0.05}


def log(msg: str = "") -> None:
    print(msg, file=sys.stderr, flush=True)


def tables() -> list[EmbeddingTable]:
    return [EmbeddingTable(k, ROWS, 64, optimizer_state_bytes=8) for k in KEYS]


def make_pool(batch_ids: int, seed: int = 0) -> list[Batch]:
    """``POOL_BATCHES`` host batches of ``batch_ids`` IDs over the two tables."""
    ids = zipf_ids(POOL_BATCHES * batch_ids, ROWS, 1.05, seed)
    return as_batches(ids, batch_ids // len(KEYS), keys=KEYS, mean_len=IDS_PER_SAMPLE)


@contextlib.contextmanager
def new_sidecar(args, **kw) -> Iterator[Sidecar]:
    """A running sidecar whose out dir is a temporary directory removed on exit."""
    kw.setdefault("reshard", ReshardConfig(check_every=args.check_every_s, unit="seconds",
                                           top_k=4096))
    kw.setdefault("checkpoint_every_s", None)
    with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as out, \
            Sidecar(tables(), Topology.preset("2x8"), 512, out_dir=Path(out), **kw) as sc:
        yield sc


def paced(sc: Sidecar, pool: list[Batch], rate: float, seconds: float | None = None,
          count: int | None = None) -> tuple[int, float]:
    """Submit pool batches in turn, one every ``batch_ids / rate`` seconds (no catching up in
    bursts beyond the schedule), for ``seconds`` or ``count`` batches. Returns the batches
    submitted and the seconds taken."""
    n = pool[0].num_values
    t0 = time.perf_counter()
    i = 0
    while True:
        now = time.perf_counter()
        if (seconds is not None and now - t0 >= seconds) or (count is not None and i >= count):
            return i, now - t0
        due = t0 + i * n / rate
        if due > now:
            time.sleep(due - now)
        sc.submit(pool[i % len(pool)])
        i += 1


# ----------------------------------------------------------------------------- 1. capacity


def capacity_level(sc: Sidecar, pool: list[Batch], rate: float, args) -> dict:
    paced(sc, pool, rate, seconds=args.adapt_s)
    s0 = sc.stats()
    n, dt = paced(sc, pool, rate, seconds=args.measure_s)
    s1 = sc.stats()
    ingested = s1.processed_ids - s0.processed_ids
    cost = (s1.cpu_s - s0.cpu_s) / ingested if ingested else math.nan
    return {"rate": rate, "offered_ids_per_s": n * pool[0].num_values / dt,
            "dropped_ids": s1.dropped_ids - s0.dropped_ids,
            "cpu_share": (s1.cpu_s - s0.cpu_s) / dt, "sample_k": s1.sample_k,
            "cpu_ns_per_id_measured": cost * 1e9,
            # what the budget would pay for at this cost, had the thread got all of it
            "ids_per_s_the_budget_pays_for": args.budget / cost,
            "sample_k_changes": s1.sample_k_changes - s0.sample_k_changes,
            "over_budget": s1.over_budget, "cpu_ns_per_id": s1.cpu_ns_per_id}


def capacity_run(pool: list[Batch], args) -> dict:
    """One run of the ladder; the highest rate without drops in its measured seconds."""
    levels = []
    with new_sidecar(args, cpu_budget=args.budget, nice=args.capacity_nice) as sc:
        paced(sc, pool, LADDER[0], count=4)    # compile, first check
        sc.flush(120)
        for rate in LADDER:
            levels.append(capacity_level(sc, pool, rate, args))
            log(f"  {rate / 1e6:5.0f} M IDs/s: {levels[-1]}")
            if levels[-1]["dropped_ids"]:
                break
        good = [lv["rate"] for lv in levels if not lv["dropped_ids"]]
        if levels[-1]["dropped_ids"] and good:     # one more rate between good and bad
            levels.append(capacity_level(sc, pool, math.sqrt(good[-1] * levels[-1]["rate"]),
                                         args))
            log(f"  {levels[-1]['rate'] / 1e6:5.0f} M IDs/s: {levels[-1]}")
    ok = [lv for lv in levels if not lv["dropped_ids"]]
    best = max(ok, key=lambda lv: lv["rate"]) if ok else None
    dropping = [lv for lv in levels if lv["dropped_ids"]]
    return {"max_offered_ids_per_s": best["offered_ids_per_s"] if best else 0.0,
            "sample_k": best["sample_k"] if best else None,
            "cpu_share": best["cpu_share"] if best else None,
            "cpu_share_when_dropping": dropping[0]["cpu_share"] if dropping else None,
            "ids_per_s_the_budget_pays_for": max(
                (lv["ids_per_s_the_budget_pays_for"] for lv in levels
                 if math.isfinite(lv["ids_per_s_the_budget_pays_for"])), default=math.nan),
            "levels": levels}


# ----------------------------------------------------------------------------- 2. step time


@njit(nogil=True, cache=True)
def spin(n: int) -> float:
    """About n floating-point operations, GIL released: the training step's compute."""
    acc = 0.0
    for i in range(n):
        acc = acc * 0.999999 + i
    return acc


def calibrate(step_s: float) -> int:
    """Iterations of :func:`spin` that take ``step_s`` seconds of this thread's CPU time (the
    minimum of repeated timings: on a shared machine wall time includes waiting for a core)."""
    spin(10)
    n = 100_000
    for _ in range(3):
        ts = []
        for _ in range(7):
            t0 = time.thread_time()
            spin(n)
            ts.append(time.thread_time() - t0)
        n = max(1000, int(n * step_s / min(ts)))
    return n


def run_phase(sc: Sidecar | None, batches: list[Batch], n_iter: int, steps: int,
              offset: int) -> tuple[list[float], list[float], list[float]]:
    """Wall-clock step times, training-thread CPU times (s), and submit call times (s)."""
    wall, cpu, sub = [], [], []
    nb = len(batches)
    loader = (batches[(offset + i) % nb] for i in range(steps))
    for _ in range(steps):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        spin(n_iter)
        # the Python part of a step, in both modes: the loader hands over the next batch
        b = next(loader)
        if b.num_values <= 0:
            raise ValueError("empty batch")
        if sc is not None:
            t1 = time.perf_counter()
            sc.submit(b)
            sub.append(time.perf_counter() - t1)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return wall, cpu, sub


def step_run(pool: list[Batch], n_iter: int, args) -> dict:
    """Interleaved pairs of blocks with and without the sidecar."""
    w, wo, ratios, cpu_w, cpu_wo, sub = [], [], [], [], [], []
    with new_sidecar(args, cpu_budget=args.budget) as sc:
        run_phase(sc, pool, n_iter, 20, 0)     # warm-up: kernels, the rate, a first check
        sc.flush(120)
        s0 = sc.stats()
        for r in range(args.reps):
            res = {}
            for use in ((True, False) if r % 2 == 0 else (False, True)):
                res[use] = run_phase(sc if use else None, pool, n_iter, args.steps,
                                     r * args.steps)
                if use:
                    sc.flush(120)  # the next block starts with an idle sidecar
            w += res[True][0]
            wo += res[False][0]
            cpu_w += res[True][1]
            cpu_wo += res[False][1]
            sub += res[True][2]
            ratios.append(statistics.median(res[True][0]) / statistics.median(res[False][0]))
        s1 = sc.stats()
    return {"step_time_overhead": statistics.median(w) / statistics.median(wo) - 1,
            "overhead_median_of_pair_ratios": statistics.median(ratios) - 1,
            "overhead_mean": statistics.mean(w) / statistics.mean(wo) - 1,
            "overhead_thread_cpu": statistics.median(cpu_w) / statistics.median(cpu_wo) - 1,
            "median_step_s_with": statistics.median(w),
            "median_step_s_without": statistics.median(wo),
            "submit_us_median": statistics.median(sub) * 1e6,
            "dropped_ids": s1.dropped_ids - s0.dropped_ids, "sample_k": s1.sample_k,
            "sample_k_changes": s1.sample_k_changes - s0.sample_k_changes,
            "sidecar_cpu_share": (s1.cpu_s - s0.cpu_s) / sum(w),
            "checks": s1.checks - s0.checks}


# ----------------------------------------------------------------------------- 3. accuracy


def memory_s(args) -> float:
    """Seconds of traffic the sidecar's default statistics hold: decayed with a half-life of 4
    checks, they weigh as much as ``half_life / ln 2`` seconds counted in full."""
    return 4 * args.check_every_s / math.log(2)


def accuracy_run(pool: list[Batch], rate: float, args) -> dict:
    """Whole cycles of the pool through a sidecar with the budget at ``rate``, undecayed
    statistics; at ``--accuracy-ids`` IDs and at what the default decayed statistics hold at this
    rate (:func:`memory_s`), a checkpoint's statistics against exact counts: recall and error of
    the worse table."""
    per_cycle = len(pool) * pool[0].num_values
    held = max(1, round(rate * memory_s(args) / per_cycle))     # the figure reported
    marks = sorted({max(1, round(args.accuracy_ids / per_cycle)), held})
    snapshots, done, t0 = {}, 0, time.perf_counter()
    with new_sidecar(args, cpu_budget=args.budget, nice=args.capacity_nice, policy="block",
                     stats=StreamStats({k: ROWS for k in KEYS})) as sc:
        for cycles in marks:
            paced(sc, pool, rate, count=(cycles - done) * len(pool))
            done = cycles
            snapshots[cycles] = read_checkpoint(sc.checkpoint(600))[3]["stats.fss"]
        st = sc.stats()
    res = {"offered_ids_per_s": done * per_cycle / (time.perf_counter() - t0),
           "sample_k": st.sample_k, "sample_k_changes": st.sample_k_changes, "by_stream_ids": {}}
    for cycles, blob in snapshots.items():
        stats = StreamStats.from_bytes(blob)
        res["by_stream_ids"][cycles * per_cycle] = acc = {
            "sample_k": stats.config.sample_k, "sampled_recall_at_1000": 1.0,
            "sampled_rel_err_top1000": 0.0, "distinct_rel_err": 0.0}
        for key in KEYS:
            ids = np.concatenate([b.values[b.key_offsets()[b.keys.index(key)]:
                                           b.key_offsets()[b.keys.index(key) + 1]] for b in pool])
            recall, err = recall_and_err(stats[key], ids, repeat=cycles)
            acc["sampled_recall_at_1000"] = min(acc["sampled_recall_at_1000"], recall)
            acc["sampled_rel_err_top1000"] = max(acc["sampled_rel_err_top1000"], err)
            true_distinct = np.unique(ids).size
            acc["distinct_rel_err"] = max(acc["distinct_rel_err"], abs(
                stats[key].distinct()[0] - true_distinct) / true_distinct)
    res.update(res["by_stream_ids"][held * per_cycle])
    res["stream_ids"] = held * per_cycle
    return res


# ----------------------------------------------------------------------------- main


def median_of(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="under two minutes")
    ap.add_argument("--budget", type=float, default=0.5, help="Sidecar(cpu_budget=...), cores")
    ap.add_argument("--runs", type=int, default=None, help="runs of 1 and 2 (3; full: 5)")
    ap.add_argument("--batch-ids", type=int, default=1 << 19, help="IDs per host batch")
    ap.add_argument("--adapt-s", type=float, default=None, help="seconds per rate to adapt "
                    "(1; full: 3)")
    ap.add_argument("--measure-s", type=float, default=None, help="seconds per rate measured "
                    "(1.25; full: 5)")
    ap.add_argument("--capacity-nice", type=int, default=0, help="nice of the capacity and "
                    "accuracy sidecars (0, as the ring command)")
    ap.add_argument("--step-rate", type=float, default=5e7, help="offered IDs/s of the step test")
    ap.add_argument("--reps", type=int, default=None, help="pairs of blocks per step run "
                    "(8; full: 60)")
    ap.add_argument("--steps", type=int, default=10, help="steps per block")
    ap.add_argument("--check-every-s", type=float, default=2.5, help="seconds between checks "
                    "(the decayed statistics' half-life is 4 checks)")
    ap.add_argument("--accuracy-ids", type=float, default=SAMPLED_STREAM_IDS,
                    help="IDs of the second accuracy figure (bench/ingest.py's stream length)")
    args = ap.parse_args(argv)
    quick = args.quick
    args.runs = args.runs or (3 if quick else 5)
    args.adapt_s = args.adapt_s or (1.0 if quick else 3.0)
    args.measure_s = args.measure_s or (1.25 if quick else 5.0)
    args.reps = args.reps or (8 if quick else 60)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    pool = make_pool(args.batch_ids)
    log(f"pool: {len(pool)} batches of {pool[0].num_values} IDs; budget {args.budget} cores")

    capacity = []
    for r in range(args.runs):
        log(f"capacity run {r + 1}/{args.runs}")
        capacity.append(capacity_run(pool, args))
    max_rate = median_of(capacity, "max_offered_ids_per_s")
    log(f"capacity: {max_rate / 1e6:.1f} M IDs/s ({time.perf_counter() - t_start:.0f} s so far)")

    step_s = args.batch_ids / args.step_rate
    n_iter = calibrate(step_s)
    log(f"step: {step_s * 1e3:.2f} ms of nogil compute per {args.batch_ids} IDs -> "
        f"{args.step_rate / 1e6:g} M IDs/s offered")
    steps = []
    for r in range(args.runs):
        steps.append(step_run(pool, n_iter, args))
        log(f"step run {r + 1}/{args.runs} ({time.perf_counter() - t_start:.0f} s so far): "
            f"{steps[-1]}")

    acc_rate = min(max_rate, TARGETS["max_offered"]) if max_rate > 0 else LADDER[0]
    log(f"accuracy at {acc_rate / 1e6:.0f} M IDs/s offered ...")
    accuracy = accuracy_run(pool, acc_rate, args)
    log(f"accuracy: {accuracy} ({time.perf_counter() - t_start:.0f} s so far)")
    ring_bps = ring_throughput(seconds=1.0 if args.quick else 3.0)

    res = {
        "sidecar_max_offered_ids_per_s_without_drops": max_rate,
        "step_time_overhead": median_of(steps, "step_time_overhead"),
        "sampled_recall_at_1000": accuracy["sampled_recall_at_1000"],
        "sampled_rel_err_top1000": accuracy["sampled_rel_err_top1000"],
        "chosen_sample_k": accuracy["sample_k"],
        "chosen_sample_k_at_max_rate": median_of(capacity, "sample_k"),
        "cpu_share_at_max_rate": median_of(capacity, "cpu_share"),
        "cpu_share_when_dropping": median_of(capacity, "cpu_share_when_dropping"),
        "ids_per_s_the_budget_pays_for": median_of(capacity, "ids_per_s_the_budget_pays_for"),
        "step_overhead_median_of_pair_ratios": median_of(steps, "overhead_median_of_pair_ratios"),
        "step_overhead_mean": median_of(steps, "overhead_mean"),
        "step_overhead_thread_cpu": median_of(steps, "overhead_thread_cpu"),
        "step_sample_k": median_of(steps, "sample_k"),
        "step_dropped_ids": sum(s["dropped_ids"] for s in steps),
        "ring_bytes_per_s": ring_bps,
        "budget_cores": args.budget, "batch_ids": args.batch_ids, "step_rate": args.step_rate,
        "runs": args.runs, "capacity_runs": capacity, "step_runs": steps, "accuracy": accuracy,
        "seconds": time.perf_counter() - t_start, "cpus": os.cpu_count(),
        "loadavg_before": load0[0], "loadavg_after": os.getloadavg()[0],
    }
    res["targets"] = {
        "keeps up with 200 M IDs/s within the budget":
            res["sidecar_max_offered_ids_per_s_without_drops"] >= TARGETS["max_offered"],
        "step_time_overhead<=0.01": res["step_time_overhead"] <= TARGETS["step_overhead"],
        "sampled_recall_at_1000>=0.99": res["sampled_recall_at_1000"] >= TARGETS["recall"],
        "sampled_rel_err_top1000<0.05": res["sampled_rel_err_top1000"] < TARGETS["rel_err"]}
    print(json.dumps(res, default=float))


if __name__ == "__main__":
    main()
