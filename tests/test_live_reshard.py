"""Live re-sharding (bridge/live.py) in a gloo world of 4 CPU ranks, 2 per node: training on
Amazon Beauty review histories with deltas applied mid-run (promotions and demotions) gives the
losses, outputs and final weights of an unsharded reference trained on the same batches with the
same optimizer (SGD; row-wise Adagrad, its state too); a delta over the hot capacity is refused
with the numbers and training goes on on the old plan; a rank that refuses keeps every rank on the
old plan; a batch split under an old version is split again, or refused by a strict module.
Skipped without TorchRec."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchrec")

from flexshard_stream.bridge.export import export_torchrec, load_torchrec_export  # noqa: E402
from flexshard_stream.errors import ConfigError  # noqa: E402
from flexshard_stream.plans.delta import PlanDelta  # noqa: E402
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan  # noqa: E402
from flexshard_stream.plans.tables import EmbeddingTable  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402

import live_worker as w  # noqa: E402

TOPO = Topology.uniform(2, w.PER_NODE)
ROWS = 12_102                 # Amazon Beauty item IDs 1..12101
HOT = 24                      # hot rows per plan; hot_capacity "auto": 30 slots
USERS_PER_STEP = w.WORLD * w.SAMPLES


def _tables(state: int) -> list[EmbeddingTable]:
    return [EmbeddingTable("item", ROWS, w.DIM, kind="pooled", optimizer_state_bytes=state),
            EmbeddingTable("hist", ROWS, w.DIM, kind="sequence", optimizer_state_bytes=state)]


def _top(steps: range, k: int) -> np.ndarray:
    """The ``k`` items most looked up in the training batches of ``steps`` (both features)."""
    drawn = [w.samples(s, r) for s in steps for r in range(w.WORLD)]
    ids = [np.concatenate([last] + hist) for last, hist in drawn]
    counts = np.bincount(np.concatenate(ids), minlength=ROWS)
    return np.sort(np.argsort(-counts, kind="stable")[:k])


def _plan(tables, hot: np.ndarray) -> Plan:
    item, hist = tables
    return Plan("live-test", TOPO, [
        TablePlan(item, ColdSharding.ranges(range(4), ROWS), global_ids=hot),
        TablePlan(hist, ColdSharding.hashed(range(4), seed=3), global_ids=hot)])


@pytest.fixture(scope="module")
def plans():
    """Plans A, B, C (the hottest rows of steps 0-2, 3-5, 6-8) and D (too many hot rows)."""
    return {"A": _top(range(0, 3), HOT), "B": _top(range(3, 6), HOT),
            "C": _top(range(6, 9), HOT), "D": _top(range(0, 9), 3 * HOT)}


def _setup(tmp: Path, hot: dict, state: int) -> tuple[Path, dict]:
    tables = _tables(state)
    ps = {k: _plan(tables, v) for k, v in hot.items()}
    export_torchrec(ps["A"], tmp / "export", hot_capacity="auto")
    paths = {}
    for a, b in ("AB", "BC", "CD", "BD"):
        paths[a + b] = str(PlanDelta.between(ps[a], ps[b]).save(tmp / f"{a}{b}.delta"))
    return tmp / "export", paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(export_dir: Path, out: Path, jobs: list) -> dict:
    import torch.multiprocessing as mp

    mp.start_processes(w.main, args=(str(export_dir), str(out), _free_port(), jobs),
                       nprocs=w.WORLD, start_method="spawn")
    return {j["name"]: [json.loads((out / f"{j['name']}{r}.json").read_text())
                        for r in range(w.WORLD)] for j in jobs}


@pytest.fixture(scope="module")
def runs(plans, tmp_path_factory):
    """The SGD run (deltas, refusals, a stale batch) and the row-wise Adagrad run, one world."""
    tmp = tmp_path_factory.mktemp("live_sgd")
    export_dir, d = _setup(tmp, plans, 0)
    job = {"name": "sgd", "adagrad": False, "steps": 9, "checkpoint": True, "deltas": {
        3: [d["AB"]],
        5: {"per_rank": [[d["BC"]], [d["BC"]], [d["BC"]], [d["BD"]]]},   # rank 3 refuses
        6: ["stale", d["BC"]],
        7: [d["CD"]]}}                                                   # over capacity
    adagrad = {"name": "adagrad", "adagrad": True, "steps": 8,
               "deltas": {3: [d["AB"]], 6: [d["BC"]]}}
    return _spawn(export_dir, tmp, [job, adagrad])


@pytest.fixture(scope="module")
def sgd(runs):
    return runs["sgd"]


def test_the_live_export_keeps_every_row_cold_and_fixed_hot_slots(plans, tmp_path):
    export_dir, _ = _setup(tmp_path, plans, 0)
    ex = load_torchrec_export(export_dir)
    for e in ex.manifest["tables"]:
        assert e["cold"]["rows"] == ROWS and sum(e["cold"]["shard_rows"]) == ROWS
        assert e["live"]["hot_capacity"] == e["hot"]["rows"] == int(np.ceil(HOT * 1.25))
        np.testing.assert_array_equal(ex.hot_ids[e["table"]], plans["A"])
    with pytest.raises(ConfigError, match="live export"):
        ex.apply("item", [1, 2])
    with pytest.raises(ConfigError, match=r"hot_capacity of table 'item'.*\[24, 12102\]"):
        export_torchrec(_plan(_tables(0), plans["A"]), tmp_path / "small", hot_capacity=10)


def test_training_through_two_deltas_matches_the_unsharded_reference(sgd):
    for r, res in enumerate(sgd):
        assert res["versions"] == [2, 2]
        np.testing.assert_allclose(res["losses"], res["ref_losses"], rtol=1e-5, atol=1e-6)
        assert res["logit_err"] <= 1e-5, r
        assert all(v > 1e-3 for v in res["weights_changed"].values())
        assert all(v <= 1e-5 for v in res["weight_err"].values()), (r, res["weight_err"])
    for key in ("3.0", "6.1"):
        moved = sgd[0]["applied"][key]
        assert moved["applied"], moved
        assert all(t["promoted"] > 0 and t["demoted"] > 0 for t in moved["tables"].values())
    assert all(res["slots"] == sgd[0]["slots"] for res in sgd)


def test_a_delta_over_capacity_is_refused_and_training_goes_on(sgd):
    for res in sgd:
        refused = res["applied"]["7.0"]
        assert not refused["applied"]
        assert "does not fit the hot capacity" in refused["error"] and "> 30 slots" in \
            refused["error"]
        assert refused["version_before"] == refused["version_after"] == 2


def test_a_rank_that_refuses_keeps_every_rank_on_the_old_plan(sgd):
    for r, res in enumerate(sgd):
        a = res["applied"]["5.0"]
        assert not a["applied"] and a["version_before"] == a["version_after"] == 1
        assert ("does not fit" in a["error"]) if r == 3 else ("rank(s) [3]" in a["error"])


def test_a_batch_split_under_an_old_version_is_not_misrouted(sgd):
    for res in sgd:
        st = res["stale"]
        assert st["batch_version"] == 1 and st["module_version"] == 2
        assert "split under slot version 1" in st["strict_refusal"]
        assert res["stale_batches"] == 2          # both modules split it again


def test_rowwise_adagrad_moves_its_state_with_the_rows(runs):
    """Fused EXACT_ROWWISE_ADAGRAD on the cold tables, RowWiseAdagrad on the hot ones: through
    two deltas the weights and the per-row state equal the reference's (RowWiseAdagrad on the
    whole tables)."""
    for r, res in enumerate(runs["adagrad"]):
        assert res["versions"] == [2, 2]
        assert all(a["applied"] for a in res["applied"].values())
        np.testing.assert_allclose(res["losses"], res["ref_losses"], rtol=1e-5, atol=1e-6)
        assert res["logit_err"] <= 1e-5, r
        assert all(v <= 1e-5 for v in res["weight_err"].values()), (r, res["weight_err"])
        assert all(v > 0 for v in res["state_max"].values())
        assert all(v <= 1e-4 * res["state_max"][t]
                   for t, v in res["state_err"].items()), (r, res["state_err"])


def test_a_checkpoint_resumes_on_the_plan_it_had(sgd):
    """The slot maps and their version are part of the state dict: a DMP built from the export
    (version 0) that loads it routes by version 2 and gives the same outputs."""
    for res in sgd:
        r = res["resumed"]
        assert r["version_before"] == 0 and r["versions"] == [2, 2] and r["same_slots"]
        assert r["logit_err"] <= 1e-6


def test_live_delta_keeps_the_cold_function_and_moves_only_the_hot_tier(plans):
    """A re-sharder's target with another cold function and node replicas: the live part makes
    the target's hot rows (global and node) the global replicas, nothing else changes."""
    from flexshard_stream.bridge.live import live_delta

    tables = _tables(0)
    current = _plan(tables, plans["A"])
    item, hist = tables
    node = np.setdiff1d(plans["C"], plans["B"])[:5]
    target = Plan("target", TOPO, [
        TablePlan(item, ColdSharding.hashed(range(4), seed=9), global_ids=plans["B"]),
        TablePlan(hist, ColdSharding.ranges(range(4), ROWS),
                  global_ids=np.setdiff1d(plans["B"], node), node_ids=node,
                  node_local=np.zeros(node.size, np.int32))])
    delta = live_delta(current, target)
    after = delta.apply(current)
    for name in ("item", "hist"):
        assert not delta.tables[name].cold_changed
        assert after.tables[name].cold == current.tables[name].cold
        want = np.union1d(target.tables[name].global_ids, target.tables[name].node_ids)
        np.testing.assert_array_equal(after.tables[name].global_ids, want)
        assert after.tables[name].node_ids.size == 0


def _unsharded(plans, tmp_path):
    from flexshard_stream.bridge.module import ExportedEmbeddingBagCollection

    export_dir, deltas = _setup(tmp_path, plans, 0)
    module = ExportedEmbeddingBagCollection(export_dir, ids="raw")
    weights = w.initial_weights(module.source_tables)
    module.load_original_weights(weights)
    return module, weights, deltas


def test_an_unsharded_module_moves_rows_and_keeps_every_weight(plans, tmp_path):
    """One process, no collectives: after a delta the module routes the promoted rows to their
    slots, and its weights on the original rows are the ones it had."""
    import torch

    from flexshard_stream.bridge.live import apply_delta, gather_original_weights

    module, weights, deltas = _unsharded(plans, tmp_path)
    kjt = w.kjts(0, 0)[0]
    before = module(kjt).values()
    report = apply_delta(module, PlanDelta.load(deltas["AB"]), optimizer=None)
    assert report.version == module.live_version == 1
    assert report.tables["item"]["promoted"] > 0 and report.tables["item"]["demoted"] > 0
    assert report.not_held == ["hist"]          # the sequence table: no module here holds it
    np.testing.assert_array_equal(module.slot_maps["item"].hot_ids(), plans["B"])
    np.testing.assert_array_equal(gather_original_weights(module)["item"], weights["item"])
    torch.testing.assert_close(module(kjt).values(), before, rtol=0, atol=0)


@pytest.mark.parametrize("make, match", [
    (lambda ps: __import__("torch").optim.SGD(ps, lr=0.1, momentum=0.9), "plain SGD"),
    (lambda ps: __import__("torch").optim.Adam(ps), "plain SGD"),
    (lambda ps: __import__("flexshard_stream.bridge.live", fromlist=["x"]).RowWiseAdagrad(ps),
     "keep no momentum1")])
def test_optimizers_whose_state_cannot_move_are_refused(plans, tmp_path, make, match):
    from flexshard_stream.bridge.live import apply_delta

    module, _, deltas = _unsharded(plans, tmp_path)
    slots = module.slot_maps["item"].slots.copy()
    with pytest.raises(ConfigError, match=match):
        apply_delta(module, PlanDelta.load(deltas["AB"]),
                    optimizer=make(list(module.parameters())))
    assert module.live_version == 0
    np.testing.assert_array_equal(module.slot_maps["item"].slots, slots)


def test_the_hand_off_example_applies_the_resharders_delta(tmp_path):
    """examples/torchrec_live.py: rank 0's re-sharder decides, the delta reaches every rank and
    is applied in the running DMP, and the hot slots serve more lookups after it."""
    from example_runner import run_example

    log, _ = run_example("torchrec_live", ["--out", str(tmp_path), "--steps", "30"])
    applied = [e for e in log if "tables" in e]
    assert applied and applied[0]["version"] == 1
    assert applied[0]["tables"]["history"]["promoted"] > 0
    after = [e for e in log if e["step"] > applied[0]["step"] and "hot_share_before" in e]
    assert after[0]["hot_share_before"] > applied[0]["hot_share_before"]
