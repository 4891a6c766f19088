"""The drop-in modules (bridge/module.py): ExportedEmbeddingBagCollection and
ExportedEmbeddingCollection return what the original TorchRec modules return on the same KJT of
raw IDs (unsharded here, and sharded by build_dmp in a gloo world of 2 CPU ranks); a KJT with a
feature they do not hold is refused; build_dmp refuses what it cannot shard and runs fused SGD and
row-wise Adagrad; the example trains in a 4-rank world with the losses of the unsharded reference.
Skipped without TorchRec."""
from __future__ import annotations

import json
import socket

import numpy as np
import pytest

pytest.importorskip("torchrec")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor  # noqa: E402

from flexshard_stream.bridge.export import export_torchrec  # noqa: E402
from flexshard_stream.bridge.module import (  # noqa: E402
    ExportedEmbeddingBagCollection,
    ExportedEmbeddingCollection,
    build_dmp,
    exported_collections,
    fused_optimizer_of,
    load_table_weights,
)
from flexshard_stream.errors import BatchError, ConfigError  # noqa: E402
from flexshard_stream.plans.plan import ColdSharding, Plan, TablePlan  # noqa: E402
from flexshard_stream.plans.tables import EmbeddingTable  # noqa: E402
from flexshard_stream.plans.topology import Topology  # noqa: E402

import dropin_worker  # noqa: E402

WORLD = 2
TOPO = Topology.uniform(1, WORLD)
ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _tables(state_bytes: int = 0) -> list[EmbeddingTable]:
    return [EmbeddingTable("u", 300, 8, kind="pooled", optimizer_state_bytes=state_bytes),
            EmbeddingTable("c", 200, 8, kind="pooled", optimizer_state_bytes=state_bytes),
            EmbeddingTable("h", 250, 8, kind="sequence", optimizer_state_bytes=state_bytes),
            EmbeddingTable("s", 120, 8, kind="sequence", optimizer_state_bytes=state_bytes)]


def _plan(tables) -> Plan:
    """Hot rows replicated on u (pooled) and h (sequence); c hashed over both GPUs with a
    replica; s whole on GPU 1 (table-wise)."""
    u, c, h, s = tables
    return Plan("hand", TOPO, [
        TablePlan(u, ColdSharding.ranges(range(WORLD), u.num_rows), global_ids=[3, 17, 250]),
        TablePlan(c, ColdSharding.hashed(range(WORLD), seed=3), global_ids=[1]),
        TablePlan(h, ColdSharding.ranges(range(WORLD), h.num_rows),
                  global_ids=[0, 5, 9, 100]),
        TablePlan(s, ColdSharding.ranges([1], s.num_rows))])


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dropin") / "export"
    export_torchrec(_plan(_tables()), d)
    return d


def _weights(modules) -> dict[str, np.ndarray]:
    return dropin_worker.weights_of([t for m in modules for t in m.source_tables])


def _kjt(keys, lengths, values, weights=None) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=keys, values=torch.tensor(values, dtype=torch.int64),
                             lengths=torch.tensor(lengths, dtype=torch.int64),
                             weights=None if weights is None else torch.tensor(weights))


# ----------------------------------------------------------------------------- one process
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_dropin_returns_what_the_embedding_bag_collection_does(export_dir, weighted):
    m = ExportedEmbeddingBagCollection(export_dir, is_weighted=weighted)
    ref = EmbeddingBagCollection(m.original_configs(), is_weighted=weighted)
    w = _weights([m])
    m.load_original_weights(w)
    load_table_weights(ref, w)
    # hot rows (3, 17, 250 of u; 1 of c), cold rows, an empty bag; keys in the other order
    kjt = _kjt(["c", "u"], [2, 0, 1, 1, 3, 0], [1, 150, 199, 3, 17, 250, 4],
               [0.5, 2.0, 1.0, 1.5, -1.0, 3.0, 0.25] if weighted else None)
    got, want = m(kjt), ref(kjt)
    assert got.keys() == want.keys() == ["u", "c"]
    assert got.length_per_key() == want.length_per_key()
    torch.testing.assert_close(got.values(), want.values(), rtol=1e-5, atol=1e-6)


def test_sequence_dropin_returns_what_the_embedding_collection_does(export_dir):
    m = ExportedEmbeddingCollection(export_dir)
    ref = EmbeddingCollection(m.original_configs())
    w = _weights([m])
    m.load_original_weights(w)
    load_table_weights(ref, w)
    kjt = _kjt(["h", "s"], [3, 0, 2, 1, 2, 0], [0, 200, 5, 9, 101, 119, 0, 7])
    got, want = m(kjt), ref(kjt)
    assert list(got) == list(want) == ["h", "s"]
    for f in want:
        assert torch.equal(got[f].lengths(), want[f].lengths())
        torch.testing.assert_close(got[f].values(), want[f].values(), rtol=1e-5, atol=1e-6)


def test_hashed_ids_are_taken_modulo_the_rows(export_dir):
    m = ExportedEmbeddingCollection(export_dir, ids="hash")
    raw = ExportedEmbeddingCollection(export_dir)
    w = _weights([m])
    m.load_original_weights(w)
    raw.load_original_weights(w)
    big = [250 * 7 + 5, 250 * 1000 + 9, 120 * 3 + 1]
    got = m(_kjt(["h", "s"], [2, 1], big))
    want = raw(_kjt(["h", "s"], [2, 1], [5, 9, 1]))
    for f in want:
        torch.testing.assert_close(got[f].values(), want[f].values())
    with pytest.raises(BatchError, match=r"feature 'h'.*\[0, 250\).*ids='hash'"):
        raw(_kjt(["h", "s"], [2, 1], big))
    with pytest.raises(ConfigError, match=r"\['s'\] have fewer than 200 rows"):
        ExportedEmbeddingCollection(export_dir, ids="hash:200")


def test_the_drop_ins_default_to_the_id_mode_the_plan_recorded(tmp_path):
    """``plan --ids hash`` records the mode; the export carries it and the drop-ins take IDs
    modulo the rows without ``ids=``; another mode given is used with a warning; a plan that
    records none leaves raw, silently; a manifest whose ``ids`` is not a mode is refused."""
    plan = _plan(_tables())
    plan.meta["ids"] = "hash"
    d = tmp_path / "hashed"
    export_torchrec(plan, d)
    assert json.loads((d / "torchrec_export.json").read_text())["ids"] == "hash"
    assert str(ExportedEmbeddingCollection(d).id_mode) == "hash"
    with pytest.warns(UserWarning, match=r"ids='raw' differs from 'hash'"):
        assert str(ExportedEmbeddingBagCollection(d, ids="raw").id_mode) == "raw"
    plain = tmp_path / "plain"
    export_torchrec(_plan(_tables()), plain)
    assert json.loads((plain / "torchrec_export.json").read_text())["ids"] is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert str(ExportedEmbeddingCollection(plain).id_mode) == "raw"
        assert str(ExportedEmbeddingCollection(plain, ids="hash").id_mode) == "hash"
    doc = json.loads((d / "torchrec_export.json").read_text())
    doc["ids"] = "mod:7"
    (d / "torchrec_export.json").write_text(json.dumps(doc))
    from flexshard_stream.errors import FormatError
    with pytest.raises(FormatError, match=r"torchrec_export.json.*ids 'mod:7'"):
        ExportedEmbeddingCollection(d)


@pytest.mark.parametrize("keys,match", [
    (["u", "c", "bogus"], r"features \['bogus'\] it does not hold \(it holds \['u', 'c'\]\)"),
    (["u", "c", "h"], r"\['h'\] are the export's sequence features"),
    (["u"], r"lacks features \['c'\]"),
    (["u", "c", "u"], r"repeats a feature")])
def test_a_kjt_with_other_features_is_refused(export_dir, keys, match):
    m = ExportedEmbeddingBagCollection(export_dir)
    with pytest.raises(BatchError, match=match):
        m(_kjt(keys, [1] * len(keys), [2] * len(keys)))


def test_an_export_without_the_kind_is_refused(tmp_path):
    t = EmbeddingTable("p", 50, 4, kind="pooled")
    export_torchrec(Plan("p", TOPO, [TablePlan(t, ColdSharding.ranges(range(WORLD), 50))]),
                    tmp_path / "e")
    assert list(exported_collections(tmp_path / "e")) == ["pooled"]
    with pytest.raises(ConfigError, match="no sequence tables"):
        ExportedEmbeddingCollection(tmp_path / "e")


class _Group:
    """A stand-in process group of a given size (build_dmp checks the size first)."""

    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n


def test_build_dmp_refuses_what_it_cannot_shard(export_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="holds no ExportedEmbeddingBagCollection"):
        build_dmp(nn.Linear(2, 2), device="cpu", pg=_Group(WORLD))
    two = nn.ModuleDict({"a": ExportedEmbeddingBagCollection(export_dir),
                         "b": ExportedEmbeddingBagCollection(export_dir)})
    with pytest.raises(ConfigError, match="2 drop-in modules of the pooled tables"):
        build_dmp(two, device="cpu", pg=_Group(WORLD))
    one = nn.ModuleDict({"a": ExportedEmbeddingBagCollection(export_dir)})
    with pytest.raises(ConfigError, match="exported for 2 ranks; the process group has 3"):
        build_dmp(one, device="cpu", pg=_Group(3))
    with pytest.raises(ConfigError, match="exported for 2 ranks per node; LOCAL_WORLD_SIZE is '1'"):
        build_dmp(one, device="cpu", pg=_Group(WORLD))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="fused optimizer 'adam'"):
        build_dmp(one, device="cpu", pg=_Group(WORLD), optimizer="adam")
    other = tmp_path / "other"
    export_torchrec(Plan("o", TOPO, [TablePlan(t, ColdSharding.ranges(range(WORLD), t.num_rows))
                                     for t in _tables()]), other)
    with pytest.raises(ConfigError, match="was built from export"):
        build_dmp(one, other, device="cpu", pg=_Group(WORLD))
    if not torch.distributed.is_initialized():
        for var in ENV_VARS:
            monkeypatch.delenv(var, raising=False)
        with pytest.raises(ConfigError, match=r"needs \['RANK', 'WORLD_SIZE', 'MASTER_ADDR', "
                                              r"'MASTER_PORT'\] in the environment"):
            build_dmp(one, device="cpu")


@pytest.mark.parametrize("state,optimizer", [(0, "sgd"), (4, "rowwise_adagrad"), (8, None)])
def test_the_fused_optimizer_is_the_one_the_tables_were_sized_for(tmp_path, state, optimizer):
    export_torchrec(_plan(_tables(state)), tmp_path / "e")
    ex = ExportedEmbeddingBagCollection(tmp_path / "e").export
    if optimizer is None:
        with pytest.raises(ConfigError, match=r"\[8\] bytes of optimizer state.*give optimizer="):
            fused_optimizer_of(ex)
    else:
        assert fused_optimizer_of(ex) == optimizer


# ----------------------------------------------------------------------------- gloo worlds
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world(export_dir, tmp_path_factory):
    """Each rank's results (dropin_worker.main) from a spawned gloo world of 2 CPU ranks."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("world")
    mp.start_processes(dropin_worker.main, args=(WORLD, str(export_dir), str(out), _free_port()),
                       nprocs=WORLD, start_method="spawn")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_sharded_dropins_return_what_the_original_modules_do(world):
    for r, res in enumerate(world):
        assert res["sharded"] == ["ShardedEmbeddingBagCollection", "ShardedEmbeddingCollection"]
        for it in res["iterations"]:
            assert it["pooled_keys"] == it["ref_pooled_keys"] == ["u", "c"]
            assert it["length_per_key"] == it["ref_length_per_key"] == [8, 8]
            assert it["pooled_scale"] > 0 and it["pooled_err"] <= 1e-5, (r, it)
            assert it["sequence_keys"] == it["ref_sequence_keys"] == ["h", "s"]
            assert it["lengths_equal"] and it["sequence_rows"] > 0
            assert it["sequence_err"] <= 1e-5, (r, it)


def test_sharded_dropin_refuses_an_unknown_feature(world):
    for res in world:
        assert "features ['bogus'] it does not hold" in res["refusal"]


def test_example_trains_like_the_unsharded_modules(tmp_path):
    from example_runner import run_example

    r, stdout = run_example("torchrec_dropin", ["--out", str(tmp_path), "--steps", "4"])
    assert "step 3: loss" in stdout
    assert any(k > 0 for k in r["hot_rows"].values())
    losses, ref = np.array(r["losses"]), np.array(r["reference_losses"])
    assert losses.shape == ref.shape == (4, 4)
    np.testing.assert_allclose(losses, ref, rtol=1e-5, atol=1e-6)


def test_rowwise_adagrad_keeps_one_state_per_cold_table(world):
    """build_dmp(optimizer="rowwise_adagrad"): fbgemm's row-wise Adagrad on every cold table a
    rank holds (one momentum1 each), and one step moves exactly those tables' rows."""
    held = set()
    for res in world:
        a = res["adagrad"]
        tables = {s.split(":")[1].rsplit(".", 1)[0] for s in a["state"]}
        assert all(s.endswith(".momentum1") for s in a["state"])
        assert tables == {m.split(".")[-2] for m in a["moved"]}
        held |= tables
    assert held == {"u__cold", "c__cold", "h__cold", "s__cold"}
