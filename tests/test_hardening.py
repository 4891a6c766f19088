"""Regression cases of the hardening issue: crafted inputs give a project error naming what and
where, before any allocation or kernel sees them."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from flexshard_stream import Batch
from flexshard_stream.errors import BatchError, ConfigError, FormatError
from flexshard_stream.formats.container import END, MAGIC, VERSION, pack, unpack
from flexshard_stream.placement.tables import tables_from_dict
from flexshard_stream.placement.topology import MAX_GPUS, Topology
from flexshard_stream.sources.windows import parse_window


def _forge(header: object, payload: bytes = b"\0" * 64) -> bytes:
    """A container whose header is ``header`` and whose checksum is right (an adversary can
    recompute it)."""
    h = json.dumps(header).encode()
    body = MAGIC + struct.pack("<HHQ", VERSION, 0, len(h)) + h + payload
    return body + struct.pack("<I", zlib.crc32(body)) + END


def _entry(**kw):
    e = {"name": "x", "dtype": "int64", "shape": [1], "offset": 0, "nbytes": 8}
    e.update(kw)
    return e


@pytest.mark.parametrize("header,match", [
    ([1, 2], "must be a JSON object"),
    ({"kind": "K"}, "'meta' must be an object"),
    ({"kind": "K", "meta": {}, "arrays": {"x": 1}}, "'arrays' must be a list"),
    ({"kind": "K", "meta": {}, "arrays": [7]}, "entry 0 must be an object"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(name=3)]}, "no string 'name'"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(dtype="object")]}, "unsupported dtype"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(shape=[1 << 40])]}, "does not fit the file"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(shape=[-1])]}, "invalid shape"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(shape="7")]}, "invalid shape"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(offset=1 << 70)]}, "'offset' must be an integer"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(offset=1.5)]}, "'offset' must be an integer"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(nbytes=None)]}, "'nbytes' must be an integer"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(nbytes=16)]}, "does not fit the file"),
    ({"kind": "K", "meta": {}, "arrays": [_entry(), _entry()]}, "appears twice"),
    ({"kind": "other", "meta": {}, "arrays": []}, "expected 'K'"),
])
def test_container_header_is_validated_before_use(header, match):
    with pytest.raises(FormatError, match=match):
        unpack(_forge(header), "K", "crafted.fss")


def test_container_header_with_nan_constant_is_refused():
    h = b'{"kind": "K", "meta": {"x": NaN}, "arrays": []}'
    body = MAGIC + struct.pack("<HHQ", VERSION, 0, len(h)) + h
    with pytest.raises(FormatError, match="not valid JSON"):
        unpack(body + struct.pack("<I", zlib.crc32(body)) + END, "K")


def test_container_round_trip_still_works():
    meta, arrays = unpack(pack("K", {"a": [1, 2]}, {"x": np.arange(3), "y": np.ones(2)}), "K")
    assert meta == {"a": [1, 2]}
    assert arrays["x"].tolist() == [0, 1, 2] and arrays["y"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("nodes,gpus", [(10**9, 8), (2**70, 8), (MAX_GPUS + 1, 1)])
def test_absurd_topology_sizes_refused_before_allocation(nodes, gpus):
    with pytest.raises(ConfigError, match="at most"):
        Topology.uniform(nodes, gpus)
    with pytest.raises(ConfigError, match=r"\[topology\].*at most"):
        Topology.from_dict({"topology": {"nodes": nodes, "gpus_per_node": gpus}})


@pytest.mark.parametrize("field,value", [("num_rows", 2**64), ("dim", 2**64),
                                         ("optimizer_state_bytes", 2**70)])
def test_table_integers_past_int64_are_config_errors(field, value):
    entry = {"name": "t", "num_rows": 10, "dim": 8, field: value}
    with pytest.raises(ConfigError, match=f"table 't': {field}.*at most"):
        tables_from_dict({"table": [entry]})


@pytest.mark.parametrize("spec", ["99999999999999999999999", 2**70])
def test_window_sample_counts_are_bounded(spec):
    with pytest.raises(ConfigError, match="number of samples must be in"):
        parse_window(spec)


def test_empty_batch_from_empty_lists():
    b = Batch(["a"], [], [])
    assert b.values.size == 0 and b.lengths.size == 0


@pytest.mark.parametrize("kw,match", [
    (dict(keys=["a"], values=[1], lengths=np.array([2**63], np.uint64)), "does not fit in int64"),
    (dict(keys=["a", "b", "c", "d"], values=[], lengths=np.array([2**62] * 4)),
     "exceeds the 0 values"),
    (dict(keys=["a"], values=[1], lengths=[1], timestamp=float("inf")), "not a finite number"),
    (dict(keys=["a"], values=[1], lengths=[1], timestamp=float("-inf")), "not a finite number"),
])
def test_batch_lengths_and_timestamps_checked(kw, match):
    with pytest.raises(BatchError, match=match):
        Batch(**kw)
