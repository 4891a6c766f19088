"""Wall-clock proof on an emulated cluster (issue 24): row-wise, TorchRec's own plan and FlexShard,
exported and trained in a real TorchRec ``DistributedModelParallel`` on an emulated 2 x 2 cluster
(one network namespace per rank, tc HTB between nodes at a network-bound rate), measured side by
side in one run and against the evaluator (flexshard_stream/cluster, docs/CLUSTER.md).

Workload: the sequence-heavy synthetic trace (four Zipf sequence tables, 86 IDs per sample,
``cluster.workload.sequence_workload``), D = 32 fp32, rows scaled by ``--scale``. Plans on the
2x2 preset scaled to the rate (its 12:1 intra/inter ratio kept): row-wise, TorchRec 1.8's
planner, FlexShard (calibrated cost model, TorchRec's plan among its references).

Keys of the last line (one JSON object): ``step_s`` per plan (median, interquartile range, min,
max; the slowest rank's step), ``speedup_vs_torchrec_measured`` and ``speedup_vs_rw_measured``
(median step time over FlexShard's), ``network_time_model_vs_measured_max_err`` (largest
|measured / modelled - 1| of the network time over the plans, calibrated model),
``wire_bytes_model_vs_measured_max_err`` (the same for the wire bytes of data packets, headers
included, per link class), ``cpu_share`` per plan, ``load_average`` (the machine is shared: 1, 5,
15 minutes, before and after), ``targets``. Without root, iproute2's ``ip`` / ``tc``, the
kernel's namespaces / veths / HTB or the ``torchrec`` extra it prints why and ``skipped``.

    sudo python bench/cluster.py --quick    # B = 128 per rank, 20 Mbit/s, 6 steps: under 10 min
    sudo python bench/cluster.py            # 20 steps
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flexshard_stream.cluster.netem import emulation_available  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402

TARGETS = {"speedup_vs_torchrec_measured": (">=", 1.5),
           "network_time_model_vs_measured_max_err": ("<=", 0.15),
           "wire_bytes_model_vs_measured_max_err": ("<=", 0.02)}


def targets(res: dict) -> dict:
    out = {}
    for key, (op, bound) in TARGETS.items():
        v = res.get(key)
        out[key] = {"target": f"{op} {bound}", "value": v,
                    "met": v is not None and (v >= bound if op == ">=" else v <= bound)}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="6 measured steps")
    ap.add_argument("--rate", type=float, default=20.0, help="inter-node Mbit/s per rank")
    ap.add_argument("--batch-size", type=int, default=128, help="samples per rank")
    ap.add_argument("--scale", type=float, default=0.02, help="row scale of the tables")
    args = ap.parse_args(argv)
    ok, why = emulation_available()
    res: dict = {"quick": args.quick, "rate_mbit_s": args.rate, "batch_size": args.batch_size}
    if not ok or importlib.util.find_spec("torchrec") is None:
        res.update(skipped=why or "the torchrec extra is not installed")
        print(json.dumps(res))
        return res
    from flexshard_stream.cli.cluster import print_comparison
    from flexshard_stream.cluster.experiment import cluster_experiment

    r = cluster_experiment(Topology.preset("2x2"), args.rate * 1e6, batch_size=args.batch_size,
                           steps=6 if args.quick else 20, warmup=2, dim=32, scale=args.scale,
                           batches=2 if args.quick else 4)
    print_comparison(r)
    h = r["headline"]
    res.update({k: h[k] for k in ("step_s", "speedup_vs_torchrec_measured",
                                  "speedup_vs_rw_measured", "speedup_vs_torchrec_model",
                                  "network_time_model_vs_measured_max_err",
                                  "wire_bytes_model_vs_measured_max_err", "cpu_share",
                                  "ranking_measured", "ranking_model")})
    res["load_average"] = {"before": r["run"]["load_average_before"],
                           "after": r["run"]["load_average_after"]}
    res["plans"] = r["plans"]
    res["comparison"] = r["comparison"]
    res["seconds"] = r["seconds"]
    res["targets"] = targets(res)
    print(json.dumps(res, default=float))
    return res


if __name__ == "__main__":
    main()
