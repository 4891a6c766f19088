"""SidecarConfig: one frozen, validated value for every sidecar setting, and one definition of
each default, read by the CLI's sidecar command, the ring feed and Sidecar (issue 21)."""
import dataclasses
import math
import os
import re
import secrets
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from flexshard_stream.errors import ConfigError
from flexshard_stream.online.resharder import ReshardConfig
from flexshard_stream.online.sidecar import Sidecar, SidecarConfig
from flexshard_stream.online.sidecar import ring_feed
from flexshard_stream.online.sidecar.config import RING_MODE
from flexshard_stream.plans.tables import EmbeddingTable, save_tables
from flexshard_stream.plans.topology import Topology
from flexshard_stream.sources.ring import ring_path
from flexshard_stream.stats.window import DecayedStats, WindowedStats

TABLES = [EmbeddingTable("a", 500, 16), EmbeddingTable("b", 300, 8)]
TOPO = Topology.uniform(1, 2)
B = 8
CFG = ReshardConfig(check_every=4, top_k=64, pause_s=0.0)


# ----------------------------------------------------------------------------- the value
@pytest.mark.parametrize("name,value", [
    ("reshard", {"check_every": 4}), ("half_life", 0), ("half_life", math.inf),
    ("queue_batches", 0), ("queue_batches", 2.5), ("queue_batches", None),
    ("queue_ids", 0), ("queue_bytes", -1), ("queue_bytes", "1 MiB"), ("policy", "wait"),
    ("block_timeout", -0.1), ("block_timeout", math.nan), ("checkpoint_every_s", -1),
    ("checkpoint_every_s", math.nan), ("counters_every_s", 0), ("counters_every_s", None),
    ("keep_checkpoints", 0), ("keep_plans", True), ("keep_deltas", 0), ("copy", "yes"),
    ("nice", 20), ("nice", 1.5), ("cpu_budget", 0), ("cpu_budget", math.inf),
    ("cpu_budget", True), ("max_sample_k", 0), ("max_sample_k", 1 << 21),
    ("ingest_threads", 0)])
def test_a_bad_setting_is_a_config_error_naming_the_field_and_the_value(name, value):
    with pytest.raises(ConfigError, match=rf"SidecarConfig\.{name} must be .*got "
                                          rf"{re.escape(repr(value))}"):
        SidecarConfig(**{name: value})
    with pytest.raises(ConfigError, match=rf"SidecarConfig\.{name}"):
        SidecarConfig().replace(**{name: value})


def test_frozen_replaceable_and_one_spelling_per_value():
    cfg = SidecarConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.policy = "block"
    other = cfg.replace(queue_batches=8, policy="block")
    assert (other.queue_batches, other.policy, cfg.queue_batches, cfg.policy) == \
        (8, "block", 64, "drop")
    assert cfg.replace() is cfg and cfg.replace(queue_batches=64) == cfg
    # 0 and None both mean "only on close"; whole floats are ints
    assert SidecarConfig(checkpoint_every_s=0) == SidecarConfig(checkpoint_every_s=None)
    got = SidecarConfig(queue_bytes=512e6, queue_batches=8.0)
    assert (got.queue_bytes, got.queue_batches) == (512_000_000, 8)
    assert type(got.queue_bytes) is int and type(got.queue_batches) is int
    with pytest.raises(TypeError, match=r"\['queue_size'\].*queue_batches"):
        cfg.replace(queue_size=8)


def test_build_takes_a_reshard_config_as_config_and_settings_over_it():
    assert SidecarConfig.build() == SidecarConfig()
    assert SidecarConfig.build(ring=True) == SidecarConfig.for_ring()
    got = SidecarConfig.build(CFG, {"queue_batches": 3})
    assert got == SidecarConfig(reshard=CFG, queue_batches=3)
    assert SidecarConfig.build(CFG, ring=True) == SidecarConfig.for_ring(reshard=CFG)
    base = SidecarConfig(keep_plans=9)
    assert SidecarConfig.build(base, {"nice": 0}) == SidecarConfig(keep_plans=9, nice=0)
    with pytest.raises(ConfigError, match="twice"):
        SidecarConfig.build(CFG, {"reshard": CFG})
    with pytest.raises(ConfigError, match="config must be a SidecarConfig"):
        SidecarConfig.build({"nice": 0})
    with pytest.raises(TypeError, match="unknown sidecar setting"):
        SidecarConfig.build(None, {"bogus": 1})


def test_the_ring_mode_changes_only_its_queue_and_priority():
    ring, plain = SidecarConfig.for_ring(), SidecarConfig()
    changed = {f: getattr(ring, f) for f in SidecarConfig.fields()
               if getattr(ring, f) != getattr(plain, f)}
    assert changed == dict(RING_MODE)
    for name in SidecarConfig.fields():
        assert SidecarConfig.default(name, ring=True) == getattr(ring, name)
        assert SidecarConfig.default(name) == getattr(plain, name)


# ----------------------------------------------------------------------------- one definition
#: the ring command's option -> the SidecarConfig field it sets
CLI_SETTINGS = {"checkpoint_every": "checkpoint_every_s", "queue_batches": "queue_batches",
                "cpu_budget": "cpu_budget", "half_life": "half_life"}


def test_the_cli_sidecar_options_default_to_the_config():
    import typer.main

    from flexshard_stream.cli import app
    params = {p.name: p for p in typer.main.get_command(app).commands["sidecar"].params}
    for option, field in CLI_SETTINGS.items():
        assert params[option].default == SidecarConfig.default(field, ring=True), option
    # the one default unified (issue 21): the command, the ring feed and Sidecar all checkpoint
    # every 60 s
    assert params["checkpoint_every"].default == SidecarConfig().checkpoint_every_s == 60.0


def test_the_cli_sidecar_command_builds_one_config_and_passes_it(tmp_path, monkeypatch):
    import flexshard_stream.online.sidecar as pkg
    from flexshard_stream.cli import app
    got = {}
    monkeypatch.setattr(pkg, "run_ring", lambda *a, **kw: got.update(args=a, kw=kw))
    save_tables(TABLES, tmp_path / "tables.toml")
    base = ["sidecar", "--ring", "r", "--tables", str(tmp_path / "tables.toml"), "--topology",
            "1x2", "--out", str(tmp_path / "out")]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0, r.output
    cfg = got["kw"]["config"]
    assert cfg == SidecarConfig.for_ring(reshard=ReshardConfig(check_every=64.0))
    settings = set(SidecarConfig.fields()) & set(got["kw"])
    assert settings == set(), f"settings passed beside the config: {settings}"
    r = CliRunner().invoke(app, base + ["--checkpoint-every", "0", "--cpu-budget", "0",
                                        "--half-life", "32", "--queue-batches", "5",
                                        "--unit", "seconds", "--pause", "0.5"])
    assert r.exit_code == 0, r.output
    cfg = got["kw"]["config"]
    assert (cfg.checkpoint_every_s, cfg.cpu_budget, cfg.half_life, cfg.queue_batches) == \
        (None, None, 32.0, 5)
    assert (cfg.reshard.unit, cfg.reshard.pause_s, cfg.policy) == ("seconds", 0.5, "block")


def test_the_sidecar_help_loads_no_heavy_module():
    code = ("import sys\nfrom flexshard_stream.cli import app\ntry:\n    app(['sidecar', "
            "'--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'numba', 'torch') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


class _Built(Exception):
    pass


@pytest.fixture
def ring_name(tmp_path):
    name = f"cfg-{os.getpid()}-{secrets.token_hex(3)}"
    yield name
    ring_path(name, tmp_path).unlink(missing_ok=True)


def _ring_config(tmp_path, monkeypatch, name, **kw):
    """The SidecarConfig run_ring hands to Sidecar (the sidecar itself is not built)."""
    got = {}

    def fake(*a, **skw):
        got.update(skw)
        raise _Built

    monkeypatch.setattr(ring_feed, "Sidecar", fake)
    with pytest.raises(_Built):
        ring_feed.run_ring(name, TABLES, TOPO, tmp_path / "out", ring_dir=tmp_path, slots=1,
                           capacity_bytes=1 << 16, handle_signals=False, **kw)
    return got["config"]


def test_the_ring_feed_reads_the_config_defaults(tmp_path, monkeypatch, ring_name):
    assert _ring_config(tmp_path, monkeypatch, ring_name) == SidecarConfig.for_ring()
    # today's keywords still work, built into the same config
    got = _ring_config(tmp_path, monkeypatch, ring_name, config=CFG, checkpoint_every_s=None,
                       half_life=8.0, cpu_budget=None, queue_batches=4)
    assert got == SidecarConfig.for_ring(reshard=CFG, checkpoint_every_s=None, half_life=8.0,
                                         cpu_budget=None, queue_batches=4)
    mine = SidecarConfig.for_ring(keep_plans=7)
    assert _ring_config(tmp_path, monkeypatch, ring_name, config=mine) is mine


@pytest.mark.parametrize("kw", [{"policy": "drop"}, {"queue_ids": 1000},
                                {"config": SidecarConfig()}])
def test_the_ring_feed_refuses_a_queue_that_could_drop(tmp_path, kw):
    with pytest.raises(ConfigError, match="policy='block'"):
        ring_feed.run_ring("never-made", TABLES, TOPO, tmp_path / "out", ring_dir=tmp_path,
                           handle_signals=False, **kw)
    assert not ring_path("never-made", tmp_path).exists()


def test_sidecar_reads_the_config_defaults_and_todays_keywords(tmp_path):
    with Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "a") as sc:
        assert sc.config == SidecarConfig()
        assert sc.checkpoint_every_s == SidecarConfig.default("checkpoint_every_s") == 60.0
        assert (sc.queue_batches, sc.policy, sc.cpu_budget) == (64, "drop", 0.5)
        assert sc.resharder.config == SidecarConfig().reshard
    with Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "b", config=CFG, queue_batches=3,
                 checkpoint_every_s=0, policy="block", cpu_budget=None) as sc:
        assert sc.config == SidecarConfig(reshard=CFG, queue_batches=3,
                                          checkpoint_every_s=None, policy="block",
                                          cpu_budget=None)
        assert (sc.queue_batches, sc.checkpoint_every_s, sc.policy) == (3, None, "block")
        assert sc.resharder.config is CFG and sc.room() == 3
        assert type(sc.stats_object) is WindowedStats
    mine = SidecarConfig(reshard=CFG, half_life=16.0, checkpoint_every_s=None)
    with Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "c", config=mine) as sc:
        assert sc.config is mine
        assert type(sc.stats_object) is DecayedStats and sc.stats_object.half_life == 16.0
    with pytest.raises(TypeError, match="unknown sidecar setting"):
        Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "d", queue_size=3)
    with pytest.raises(ConfigError, match="half_life"):
        Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "d", half_life=4.0,
                stats=DecayedStats({"a": 500, "b": 300}, half_life=4.0))
    with pytest.raises(ConfigError, match="SidecarConfig.policy"):
        Sidecar(TABLES, TOPO, B, out_dir=tmp_path / "d", policy="wait")
    assert not (tmp_path / "d").exists()
