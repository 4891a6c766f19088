"""Distributed replay statistics benchmark: the same windowed statistics of a synthetic log split into
many parquet files, computed by one process, by two worker processes and by Ray with two workers,
in the same run; IDs per second each, and whether the resulting plans are identical.

Log: the ``"default"`` synthetic preset (four tables: two sequence features, a pooled bag, one ID;
about 57 IDs per sample), written with ``synth.write_log`` as ``--files`` parquet files (16). Every
engine runs :func:`flexshard_stream.sources.distributed.window_stats` with ``num_workers=2`` (the same
division of the work), default sketch sizes, every table sketched (row counts not given). Each
engine's windows are merged into one :class:`StreamStats` and planned with ``plan_flexshard`` on the
``2x8`` topology; the plans are compared with ``==``.

Timings are wall seconds of one ``window_stats`` call with warm workers, as on a long-lived
cluster: the process engine gets a spawn pool (passed as ``executor``) warmed by a one-file call
(``process_warmup_s``: spawn, imports, first task); Ray's ``init`` and its one-file warm-up call are
timed separately (``ray_init_s``, ``ray_warmup_s``). On 2 shared cores Ray is not expected to
win; the point is identical answers. The last line of output is one JSON object.

    python bench/distributed.py --quick        # ~18 M IDs, under two minutes
    python bench/distributed.py                # ~116 M IDs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flexshard_stream import SketchConfig, StreamStats
from flexshard_stream.sources.distributed import window_stats


def write_logs(out: Path, samples: int, files: int, seed: int = 0) -> tuple[list[str], object]:
    """``files`` parquet files of consecutive samples of the default preset (1,000 samples/s)."""
    from flexshard_stream.sources import synth
    spec = synth.preset("default")
    per = -(-samples // files)
    paths = []
    for i in range(files):
        n = min(per, samples - i * per)
        if n <= 0:
            break
        # one seed per file, timestamps continuing where the previous file stopped
        batches = synth.generate(spec.tables, n, samples_per_batch=8192, seed=seed * 1000 + i,
                                 start_ts=i * per / spec.samples_per_second,
                                 samples_per_second=spec.samples_per_second)
        p = out / f"part-{i:03d}.parquet"
        synth.write_log(batches, p, spec.tables, row_group_size=16384)
        paths.append(str(p))
    return paths, spec


def plan_of(windows, spec):
    """FlexShard plan of the merged windows on the 2x8 topology."""
    from flexshard_stream.placement.planner import plan_flexshard
    from flexshard_stream.plans.tables import EmbeddingTable
    from flexshard_stream.plans.topology import Topology
    merged = StreamStats.from_bytes(windows[0].stats.to_bytes())
    for w in windows[1:]:
        merged.merge(w.stats)
    tabs = [EmbeddingTable(t.name, t.num_rows, 64, kind="sequence" if t.kind == "sequence"
                           else "pooled") for t in spec.tables]
    return plan_flexshard(tabs, Topology.preset("2x8"), merged.summary(4096), 256).plan, merged


def same_stats(a, b) -> bool:
    """Every array of every window equal (not the randomized KLL length sketch)."""
    if [w.index for w in a] != [w.index for w in b]:
        return False
    for x, y in zip(a, b):
        for f in x.stats:
            ax, ay = x.stats[f]._arrays(), y.stats[f]._arrays()
            if any(not np.array_equal(ax[k], ay[k]) for k in ax if k != "lengths"):
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="320k samples (about 18 M IDs)")
    ap.add_argument("--samples", type=int, default=None, help="samples in the log")
    ap.add_argument("--files", type=int, default=16, help="parquet files")
    ap.add_argument("--window", default="60s", help="window spec (duration or samples)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    args = ap.parse_args()
    samples = args.samples or (320_000 if args.quick else 2_000_000)
    cfg = SketchConfig()
    out: dict = {"samples": samples, "files": args.files, "window": args.window,
                 "workers": args.workers, "cores": os.cpu_count(),
                 "loadavg_1m_at_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="fss-bench-dist-") as tmp:
        t0 = time.perf_counter()
        paths, spec = write_logs(Path(tmp), samples, args.files)
        out["write_s"] = round(time.perf_counter() - t0, 3)
        print(f"wrote {len(paths)} files in {out['write_s']} s", flush=True)

        results, diags = {}, {}
        engines = ["local", "process"] + ([] if args.no_ray else ["ray"])
        for eng in engines:
            if eng == "ray":
                try:
                    import ray
                except ImportError:
                    print("ray not installed: skipped", flush=True)
                    continue
                t0 = time.perf_counter()
                ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
                out["ray_init_s"] = round(time.perf_counter() - t0, 3)
                t0 = time.perf_counter()
                window_stats(paths[:1], window=args.window, engine="ray",
                             num_workers=args.workers, config=cfg)
                out["ray_warmup_s"] = round(time.perf_counter() - t0, 3)
            pool = None
            if eng == "process":
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor
                t0 = time.perf_counter()
                pool = ProcessPoolExecutor(args.workers,
                                           mp_context=multiprocessing.get_context("spawn"))
                window_stats(paths[:1], window=args.window, engine="process",
                             num_workers=args.workers, config=cfg, executor=pool)
                out["process_warmup_s"] = round(time.perf_counter() - t0, 3)
            d: dict = {}
            t0 = time.perf_counter()
            ws = window_stats(paths, window=args.window, engine=eng, num_workers=args.workers,
                              config=cfg, executor=pool, diagnostics=d)
            sec = time.perf_counter() - t0
            if pool is not None:
                pool.shutdown()
                rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                out["process_worker_max_rss_mb"] = round(rss / 1024, 1)
            results[eng], diags[eng] = ws, d
            ids = d["ids"]
            out[f"{eng}_s"] = round(sec, 3)
            out[f"{eng}_ids_per_s"] = round(ids / sec)
            out[f"{eng}_s_per_billion_ids"] = round(sec / ids * 1e9, 1)
            print(f"{eng}: {ids:,} IDs in {sec:.2f} s = {ids / sec / 1e6:.2f} M IDs/s "
                  f"({len(ws)} windows, {d['tasks']} tasks)", flush=True)
        if "ray" in results:
            import ray
            ray.shutdown()
        ref = results["local"]
        d = diags["local"]
        out.update({"ids": d["ids"], "windows": len(ref), "tasks": d["tasks"],
                    "task_bytes": d["task_bytes"], "moved_bytes": d["moved_bytes"],
                    "state_bytes_per_window": d["state_bytes_per_window"],
                    "max_windows_per_task": d["max_windows_per_task"]})
        out["stats_identical"] = all(same_stats(ref, r) for r in results.values())
        plans = {e: plan_of(r, spec)[0] for e, r in results.items()}
        out["plans_identical"] = all(p == plans["local"] for p in plans.values())
        out["engines"] = list(results)
    for k in ("ray_ids_per_s", "process_ids_per_s"):
        out.setdefault(k, None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
