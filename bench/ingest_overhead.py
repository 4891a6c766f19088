"""What the statistics path costs around the counting kernels, per ID, on a realistic batch stream.

Stream: Zipf(1.05) over 50M rows (random ID permutation), cut into batches of 2**20 IDs per
feature, 100 IDs per sample, for 1, 2 and 4 features (``--quick``: 4M IDs per feature count, else
16M). Each path is timed in CPU seconds of this thread (``time.thread_time``: on a shared machine
wall time includes waiting for a core), the best of ``repeats`` runs:

- ``pipeline``: ``Batch(keys, values, lengths)`` from the raw arrays then ``StreamStats.update``
  (construction, validation, the kernel, the length sketch), what ``bench/ingest.py`` measures;
  the counting kernel (``update_table``) is timed inside it, by a wrapper, and
  ``overhead_ns_per_id`` is everything else: the fixed cost outside the kernels, per ID (the
  kernel's own time swings with the neighbours far more than the overhead does, so the two are
  measured in the same calls rather than as a difference of two runs);
- ``id_check_ns_per_id``: the ID check's kernel inside the pipeline (timed by a wrapper too);
- ``batch_ns_per_id``, ``validate_ns_per_id``: construction and ``validate_batch`` alone;
- ``decayed``: the same through ``DecayedStats.update`` (the sidecar's default statistics; no
  decay falls inside the run).

Also ``sidecar_like`` (``bench/sidecar.py``'s traffic: 2 tables, 2**18 IDs each per batch, 64 per
sample, one ID in 128 counted) and ``one_hot`` (4 tables, one ID per sample: the length sketch
takes one item per ID).

Last line: one JSON object.
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

from ingest import zipf_ids  # noqa: E402

import flexshard_stream.stats.stream as stream  # noqa: E402
import flexshard_stream.stats.table_stats as table_stats  # noqa: E402
from flexshard_stream import Batch, SketchConfig, StreamStats  # noqa: E402
from flexshard_stream.stats.stream import validate_batch  # noqa: E402
from flexshard_stream.stats.window import DecayedStats  # noqa: E402

ROWS = 50_000_000
IDS_PER_FEATURE = 1 << 20
IDS_PER_SAMPLE = 100


class CallClock:
    """Replaces ``module.name`` (a kernel) by a wrapper that adds up its CPU seconds; ``close``
    puts the kernel back."""

    def __init__(self, module, name):
        self.module, self.name = module, name
        self.kernel = getattr(module, name)
        self.seconds = 0.0
        setattr(module, name, self)

    def __call__(self, *args):
        t0 = time.thread_time()
        try:
            return self.kernel(*args)
        finally:
            self.seconds += time.thread_time() - t0

    def close(self):
        setattr(self.module, self.name, self.kernel)


def raw_batches(ids: np.ndarray, nkeys: int, per_feature: int = IDS_PER_FEATURE,
                per_sample: int = IDS_PER_SAMPLE) -> list[tuple[list[str], np.ndarray, np.ndarray]]:
    """``(keys, values, lengths)`` arrays of batches of ``per_feature`` IDs per feature,
    ``per_sample`` IDs per sample."""
    keys = [f"f{i}" for i in range(nkeys)]
    per = per_feature * nkeys
    nsamp = per_feature // per_sample
    ln = np.full(nsamp, per_feature // nsamp, np.int64)
    ln[: per_feature - ln.sum()] += 1
    return [(keys, ids[s:s + per], np.tile(ln, nkeys)) for s in range(0, ids.size - per + 1, per)]


def measure(ids: np.ndarray, nkeys: int, repeats: int, cfg: SketchConfig | None = None,
            **cut: int) -> dict[str, float]:
    """CPU ns per ID of each path and of the overhead around the kernel for ``nkeys`` features
    (``cut``: :func:`raw_batches`' sizes)."""
    cfg = cfg or SketchConfig()
    raws = raw_batches(ids, nkeys, **cut)
    n = sum(v.size for _, v, _ in raws)
    tables = {f"f{i}": ROWS for i in range(nkeys)}
    clock = CallClock(table_stats, "update_table")
    # the ID check inside the pipeline (named as in this checkout or in the one before it)
    check = CallClock(stream, "check_ids" if hasattr(stream, "check_ids") else "segment_min_max")
    best = {k: float("inf") for k in ("pipeline", "kernel", "overhead", "decayed",
                                      "decayed_overhead", "batch", "validate", "id_check")}
    try:
        for _ in range(repeats + 1):          # the first run compiles and warms up
            for name, make in (("pipeline", lambda: StreamStats(tables, cfg)),
                               ("decayed", lambda: DecayedStats(tables, cfg, half_life=1 << 20))):
                st = make()
                clock.seconds = check.seconds = 0.0
                t0 = time.thread_time()
                for keys, v, ln in raws:
                    st.update(Batch(keys, v, ln))
                total = time.thread_time() - t0
                best[name] = min(best[name], total)
                over = "overhead" if name == "pipeline" else "decayed_overhead"
                best[over] = min(best[over], total - clock.seconds)
                if name == "pipeline":
                    best["kernel"] = min(best["kernel"], clock.seconds)
                    best["id_check"] = min(best["id_check"], check.seconds)
            configs = StreamStats(tables, cfg).table_configs
            t0 = time.thread_time()
            batches = [Batch(keys, v, ln) for keys, v, ln in raws]
            t1 = time.thread_time()
            for b in batches:
                validate_batch(b, configs)
            t2 = time.thread_time()
            best["batch"] = min(best["batch"], t1 - t0)
            best["validate"] = min(best["validate"], t2 - t1)
    finally:
        clock.close()
        check.close()
    return {"ids": n, "pipeline_ids_per_s": n / best["pipeline"],
            "kernel_ids_per_s": n / best["kernel"], "decayed_ids_per_s": n / best["decayed"],
            **{f"{k}_ns_per_id": 1e9 * best[k] / n
               for k in ("overhead", "decayed_overhead", "batch", "validate", "id_check")}}


def profile(ids: np.ndarray, nkeys: int) -> None:
    """cProfile of the pipeline path (top functions by own time) to stderr."""
    import cProfile
    import pstats
    raws = raw_batches(ids, nkeys)
    st = StreamStats({f"f{i}": ROWS for i in range(nkeys)}, SketchConfig())
    for keys, v, ln in raws[:1]:
        st.update(Batch(keys, v, ln))
    pr = cProfile.Profile()
    pr.enable()
    for keys, v, ln in raws:
        st.update(Batch(keys, v, ln))
    pr.disable()
    pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(18)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="4M IDs per feature count")
    ap.add_argument("--profile", action="store_true", help="cProfile the pipeline to stderr")
    args = ap.parse_args(argv)
    n, repeats = (4 << 20, 3) if args.quick else (16 << 20, 5)
    ids = zipf_ids(n, ROWS, 1.05, 1)
    res = {}
    for nkeys in (1, 2, 4):
        if args.profile:
            profile(ids, nkeys)
        res[f"features_{nkeys}"] = r = measure(ids, nkeys, repeats)
        print(f"{nkeys} features: " + "  ".join(f"{k} {v:,.4g}" for k, v in r.items()))
    # the sidecar bench's traffic at the rate it samples at its limit: 2 tables, 2**18 IDs each
    # per batch, 64 IDs per sample, one ID in 128 counted
    res["sidecar_like"] = r = measure(ids, 2, repeats, SketchConfig(sample_k=128),
                                      per_feature=1 << 18, per_sample=64)
    print("sidecar-like (2 x 2**18 IDs, 64 per sample, sample_k 128): "
          + "  ".join(f"{k} {v:,.4g}" for k, v in r.items()))
    # one-hot features (one ID per sample): the length sketch is fed one item per ID
    res["one_hot"] = r = measure(ids, 4, repeats, per_feature=1 << 18, per_sample=1)
    print("one-hot (4 x 2**18 IDs, 1 per sample): "
          + "  ".join(f"{k} {v:,.4g}" for k, v in r.items()))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
