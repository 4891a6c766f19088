"""Sidecar overhead on a simulated training loop, and ring throughput between processes.

Training loop: one thread. Each step stands for a training step on a batch of ``--batch-ids`` IDs
(two tables, one ID per sample) at ``--rate`` IDs per second of offered load (10 M/s by default):
the step is a fixed amount of GIL-free compute (a Numba ``nogil`` loop calibrated to
``batch_ids / rate`` seconds, 6.55 ms for 65 536 IDs) -- a real step runs in C++/CUDA with the GIL
released too. With the sidecar attached, the step also submits the batch.

Measured in the same run, interleaved in short blocks (the load of a shared machine changes
from second to second): ``--reps`` pairs of a block of ``--steps`` steps without submitting and a
block with (the order alternates; the sidecar is flushed after a block with, so a block without is
not slowed by a backlog). ``step_time_overhead`` = median step time with / median without - 1
(wall clock, all steps of each kind). Also reported: the median of the per-pair ratios, the
mean-based overhead (GIL waits while the planner runs show up in the tail, not in the median), the
overhead in the training thread's own CPU time (``time.thread_time``: what submitting costs the
loop, insensitive to other processes) and the median cost of one ``submit`` call.

Sidecar: decayed statistics of two tables of 1 M rows, re-sharder checks every ``--check-every-s``
seconds (planner on its own thread, top 4096 rows), drop policy, a 64-batch queue, a checkpoint
every 10 s. Ring: ``flexshard_stream.online.ring.ring_throughput`` (one producer process, this process
consuming).

The machine has 2 cores shared with other processes; the training loop takes one, the sidecar's
threads the other. Numbers move with the load of the machine; the JSON holds the load average.
Last line of stdout: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.ring import ring_throughput
from flexshard_stream.online.sidecar import Sidecar
from flexshard_stream.placement.tables import EmbeddingTable
from flexshard_stream.placement.topology import Topology
from flexshard_stream.stats.batch import Batch

ROWS = 1_000_000


def log(msg: str = "") -> None:
    print(msg, file=sys.stderr, flush=True)


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


def make_batches(batch_ids: int, count: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    per = batch_ids // 2
    perm = rng.permutation(ROWS)
    out = []
    for _ in range(count):
        ids = [perm[np.minimum(rng.zipf(1.1, per), ROWS) - 1] for _ in range(2)]
        out.append(Batch(["user", "item"], np.concatenate(ids), np.ones(2 * per, np.int64)))
    return out


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
        # the Python part of a step, in both modes: the loader hands over the next batch (the
        # first Python code after the long compute kernel runs on cold caches: ~20 us here)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="under a minute")
    ap.add_argument("--rate", type=float, default=1e7, help="offered load, IDs per second")
    ap.add_argument("--batch-ids", type=int, default=1 << 16, help="IDs per step")
    ap.add_argument("--reps", type=int, default=None,
                    help="interleaved pairs of blocks (default 60, --quick; 300)")
    ap.add_argument("--steps", type=int, default=None, help="steps per block (default 10)")
    ap.add_argument("--check-every-s", type=float, default=2.0, help="seconds between checks")
    ap.add_argument("--nice", type=int, default=19,
                    help="Sidecar(nice=...): added to the sidecar threads' nice value (default "
                         "19, the Sidecar default)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval (s) for the run; default: Python's (0.005)")
    args = ap.parse_args()
    reps = args.reps or (60 if args.quick else 300)
    steps = args.steps or 10
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    load0 = os.getloadavg()

    step_s = args.batch_ids / args.rate
    n_iter = calibrate(step_s)
    batches = make_batches(args.batch_ids, 32)
    log(f"step: {step_s * 1e3:.2f} ms of nogil compute ({n_iter} iterations) per "
        f"{args.batch_ids} IDs -> {args.rate / 1e6:g} M IDs/s offered")

    tables = [EmbeddingTable("user", ROWS, 64, optimizer_state_bytes=8),
              EmbeddingTable("item", ROWS, 64, optimizer_state_bytes=8)]
    out = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    cfg = ReshardConfig(check_every=args.check_every_s, unit="seconds", top_k=4096)
    with_t, without_t, ratios, cpu_w, cpu_wo, submit_t = [], [], [], [], [], []
    with Sidecar(tables, Topology.preset("2x8"), 512, out_dir=out, config=cfg,
                 queue_batches=64, policy="drop", checkpoint_every_s=10.0,
                 nice=args.nice) as sc:
        run_phase(sc, batches, n_iter, 30, 0)  # warm-up: kernels, first check
        sc.flush(120)
        warm = sc.stats()
        t_run = time.perf_counter()
        for r in range(reps):
            order = (True, False) if r % 2 == 0 else (False, True)
            res = {}
            for use in order:
                res[use] = run_phase(sc if use else None, batches, n_iter, steps, r * steps)
                if use:
                    sc.flush(120)  # the next block starts with an idle sidecar
            with_t += res[True][0]
            without_t += res[False][0]
            cpu_w += res[True][1]
            cpu_wo += res[False][1]
            submit_t += res[True][2]
            ratios.append(statistics.median(res[True][0]) / statistics.median(res[False][0]))
            if r % 10 == 9:
                log(f"pair {r + 1}/{reps}: median with {statistics.median(with_t) * 1e3:.3f} ms, "
                    f"without {statistics.median(without_t) * 1e3:.3f} ms")
        t_run = time.perf_counter() - t_run
        st = sc.stats()
    plans = st.plans_published
    ingest_rate = (st.processed_ids - warm.processed_ids) / max(st.ingest_s - warm.ingest_s, 1e-9)

    med_w, med_wo = statistics.median(with_t), statistics.median(without_t)
    overhead = med_w / med_wo - 1
    log("ring throughput (one producer process -> this process) ...")
    ring_bps = ring_throughput(seconds=1.0 if args.quick else 3.0)
    load1 = os.getloadavg()
    res = {
        "step_time_overhead": overhead,
        "ring_bytes_per_s": ring_bps,
        "drops": st.dropped,
        "offered_ids_per_s": args.rate,
        "achieved_ids_per_s_with_sidecar": args.batch_ids / statistics.mean(with_t),
        "step_s": step_s,
        "median_step_s_with": med_w,
        "median_step_s_without": med_wo,
        "overhead_median_of_rep_ratios": statistics.median(ratios) - 1,
        "overhead_mean": statistics.mean(with_t) / statistics.mean(without_t) - 1,
        "overhead_thread_cpu": statistics.median(cpu_w) / statistics.median(cpu_wo) - 1,
        "submit_us_median": statistics.median(submit_t) * 1e6,
        "submit_us_max": max(submit_t) * 1e6,
        "p99_step_s_with": float(np.percentile(with_t, 99)),
        "p99_step_s_without": float(np.percentile(without_t, 99)),
        "submitted": st.submitted, "accepted": st.accepted,
        "max_queued_batches": st.max_queued_batches,
        "sidecar_ingest_ids_per_s": ingest_rate,
        "checks": st.checks, "checks_coalesced": st.checks_coalesced, "plans_published": plans,
        "checkpoints": st.checkpoints,
        "pairs": reps, "steps_per_block": steps, "check_every_s": args.check_every_s,
        "switch_interval_s": sys.getswitchinterval(), "nice": args.nice,
        "seconds": t_run, "cpus": os.cpu_count(),
        "loadavg_before": load0[0], "loadavg_after": load1[0],
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
