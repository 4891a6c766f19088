"""The cluster a plan is made for: N nodes x M GPUs, memory sizes and link bandwidths per GPU.

See ``DESIGN.md`` section 3: GPU ``g`` sits on node ``g // M`` (local index ``g % M``); a pair of GPUs
is linked by one of three link classes: local (the same GPU), intra-node (NVLink) or inter-node.
Bandwidths are per GPU and per direction, and may differ per node or per GPU (heterogeneous, skewed
networks). Units: bytes and bytes per second throughout.

TOML layout
-----------
::

    [topology]
    name = "2x8"                       # optional
    nodes = 2                          # N, required
    gpus_per_node = 8                  # M, required
    hbm_bytes_per_gpu = 80e9           # defaults: the values of Topology.uniform
    intra_node_bandwidth = 300e9       # per GPU, each direction
    inter_node_bandwidth = 25e9        # per GPU, each direction
    host_memory_bytes_per_node = 1e12
    uvm_bandwidth = 25e9               # per GPU
    [[topology.node]]                  # optional per-node overrides
    index = 1
    inter_node_bandwidth = 12.5e9      # or intra_node_bandwidth, hbm_bytes_per_gpu, uvm_bandwidth,
                                       # host_memory_bytes
    [[topology.gpu]]                   # optional per-GPU overrides (applied after per-node ones)
    index = 3                          # global GPU index = node * gpus_per_node + local
    inter_node_bandwidth = 10e9        # or intra_node_bandwidth, hbm_bytes_per_gpu, uvm_bandwidth
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Union

import numpy as np

from ..errors import ConfigError
from ..formats.toml import read_toml, toml_value, write_text_atomic

__all__ = ["Topology", "LINK_LOCAL", "LINK_INTRA", "LINK_INTER", "LINK_CLASSES", "PRESET_DIR",
           "available_presets", "MAX_GPUS"]

PathLike = Union[str, "os.PathLike[str]"]

#: Link classes, as stored in :meth:`Topology.link_class_matrix`.
LINK_LOCAL, LINK_INTRA, LINK_INTER = 0, 1, 2
LINK_CLASSES: tuple[str, ...] = ("local", "intra-node", "inter-node")
#: Largest cluster a topology may describe (GPUs): 4x the largest planned for in the benchmarks.
MAX_GPUS = 16384

#: Largest accepted value per topology field: far above any machine's, low enough that the
#: cost model's sums of bytes and seconds stay finite (1e308 bytes of HBM overflowed them).
_LIMITS = {"hbm_bytes": 1e15, "host_memory_bytes": 1e18, "intra_bw": 1e15, "inter_bw": 1e15,
           "uvm_bw": 1e15}

#: Folder of the preset topologies: ``<repo>/data/topologies``.
from ..data import TOPOLOGY_DIR as PRESET_DIR  # noqa: E402  (installed as package data)

# Defaults of the TOML file and of Topology.uniform (bytes, bytes/s).
_DEFAULTS: dict[str, float] = {
    "hbm_bytes_per_gpu": 80e9,
    "intra_node_bandwidth": 300e9,
    "inter_node_bandwidth": 25e9,
    "host_memory_bytes_per_node": 1e12,
    "uvm_bandwidth": 25e9,
}
# per-GPU TOML key -> Topology attribute
_GPU_FIELDS: dict[str, str] = {
    "hbm_bytes_per_gpu": "hbm_bytes",
    "intra_node_bandwidth": "intra_bw",
    "inter_node_bandwidth": "inter_bw",
    "uvm_bandwidth": "uvm_bw",
}
_TOP_KEYS = ("name", "nodes", "gpus_per_node", *_DEFAULTS, "node", "gpu")
_NODE_KEYS = ("index", *_GPU_FIELDS, "host_memory_bytes")
_GPU_KEYS = ("index", *_GPU_FIELDS)


# ----------------------------------------------------------------------------- helpers
def _positive_number(value: Any, where: str) -> float:
    """``value`` as a finite float > 0, else ConfigError naming ``where`` (file and key)."""
    unit = "bytes" if "bytes" in where.rsplit(" ", 1)[-1] else "bytes/s"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{where} = {value!r}: must be a number ({unit}), "
                          f"got {type(value).__name__}")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{where} = {value!r}: must be a finite number > 0 ({unit})")
    return x


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{where} = {value!r}: must be a positive integer, "
                          f"got {type(value).__name__}")
    if value <= 0:
        raise ConfigError(f"{where} = {value!r}: must be a positive integer (> 0)")
    return int(value)


def _checked_size(nodes: Any, gpus_per_node: Any, where: str) -> tuple[int, int]:
    """(N, M) as positive integers with N * M <= :data:`MAX_GPUS`, checked before anything is
    allocated per GPU."""
    n = _positive_int(nodes, f"{where}nodes")
    m = _positive_int(gpus_per_node, f"{where}gpus_per_node")
    if n * m > MAX_GPUS:
        raise ConfigError(f"{where}nodes x gpus_per_node = {n} x {m} = {n * m:,} GPUs: at most "
                          f"{MAX_GPUS:,} GPUs are supported (per-GPU arrays and G x G traffic "
                          f"matrices grow with it)")
    return n, m


def _check_keys(table: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = [k for k in table if k not in known]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (value {table[unknown[0]]!r}); "
                          f"known keys: {list(known)}")


def _mode(a: np.ndarray) -> float:
    """Most common value (the smallest one on ties)."""
    vals, counts = np.unique(a, return_counts=True)
    return float(vals[int(np.argmax(counts))])


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _span(a: np.ndarray, unit: str) -> str:
    lo, hi = float(a.min()), float(a.max())
    if lo == hi:
        return _si(lo, unit)
    return f"{_si(lo, unit)} to {_si(hi, unit)}"


def available_presets() -> list[str]:
    """Names of the preset topologies in :data:`PRESET_DIR` (file stems), sorted."""
    if not PRESET_DIR.is_dir():
        return []
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


# ----------------------------------------------------------------------------- Topology
@dataclass(frozen=True, eq=False, repr=False)
class Topology:
    """A cluster of ``nodes`` x ``gpus_per_node`` GPUs with per-GPU memory and link bandwidths.

    GPU ``g`` (global index, ``0 <= g < G``) is GPU ``g % M`` of node ``g // M``. Arrays are copied to
    read-only float64 on construction.

    Parameters
    ----------
    nodes : int
        N, number of nodes (> 0).
    gpus_per_node : int
        M, GPUs per node (> 0).
    hbm_bytes : ndarray of float64, shape (G,)
        HBM per GPU, bytes.
    intra_bw : ndarray of float64, shape (G,)
        Intra-node (NVLink) bandwidth per GPU, bytes/s, each direction.
    inter_bw : ndarray of float64, shape (G,)
        Inter-node bandwidth per GPU, bytes/s, each direction.
    uvm_bw : ndarray of float64, shape (G,)
        Host-memory (UVM) bandwidth per GPU, bytes/s.
    host_memory_bytes : ndarray of float64, shape (N,)
        Host memory per node, bytes.
    name : str
        Label (for reports); part of equality.

    Raises
    ------
    ConfigError
        Non-positive counts, wrong array shapes, non-finite or non-positive sizes or bandwidths.
    """

    nodes: int
    gpus_per_node: int
    hbm_bytes: np.ndarray
    intra_bw: np.ndarray
    inter_bw: np.ndarray
    uvm_bw: np.ndarray
    host_memory_bytes: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        n, m = _checked_size(self.nodes, self.gpus_per_node, "Topology.")
        object.__setattr__(self, "nodes", n)
        object.__setattr__(self, "gpus_per_node", m)
        if not isinstance(self.name, str):
            raise ConfigError(f"Topology.name = {self.name!r}: must be a string")
        for attr, size, unit in (("hbm_bytes", n * m, "bytes"), ("intra_bw", n * m, "bytes/s"),
                                 ("inter_bw", n * m, "bytes/s"), ("uvm_bw", n * m, "bytes/s"),
                                 ("host_memory_bytes", n, "bytes")):
            raw = getattr(self, attr)
            try:
                a = np.array(raw, dtype=np.float64)
            except (TypeError, ValueError):
                raise ConfigError(f"Topology.{attr}: must be numbers ({unit}), got {raw!r}") \
                    from None
            if a.ndim == 0:
                a = np.full(size, float(a))
            if a.shape != (size,):
                what = "N (nodes)" if attr == "host_memory_bytes" else "G = N * M (GPUs)"
                raise ConfigError(f"Topology.{attr}: shape {a.shape}, expected ({size},) = {what}")
            bad = np.flatnonzero(~(np.isfinite(a) & (a > 0)))
            if bad.size:
                i = int(bad[0])
                raise ConfigError(f"Topology.{attr}[{i}] = {float(a[i])!r}: must be a finite number > 0 "
                                  f"({unit})")
            big = np.flatnonzero(a > _LIMITS[attr])
            if big.size:
                i = int(big[0])
                raise ConfigError(f"Topology.{attr}[{i}] = {float(a[i]):g} {unit}: not a real "
                                  f"machine's (at most {_LIMITS[attr]:g} {unit}); check the unit")
            a.setflags(write=False)
            object.__setattr__(self, attr, a)

    # ------------------------------------------------------------------ shape
    @property
    def num_gpus(self) -> int:
        """G = N * M, the number of GPUs."""
        return self.nodes * self.gpus_per_node

    def _check_gpus(self, gpus: Any) -> np.ndarray:
        g = np.asarray(gpus)
        if g.size == 0:
            return g.astype(np.int64)
        if g.dtype.kind not in "iu":
            raise ConfigError(f"GPU indices must be integers, got dtype {g.dtype}")
        if g.size and (g.min() < 0 or g.max() >= self.num_gpus):
            bad = g[(g < 0) | (g >= self.num_gpus)].flat[0]
            raise ConfigError(f"GPU index {int(bad)} out of range [0, {self.num_gpus})")
        return g

    def node_of(self, gpus: Any) -> np.ndarray:
        """Node index of each GPU (``gpu // M``); same shape as ``gpus``."""
        return self._check_gpus(gpus) // self.gpus_per_node

    def local_of(self, gpus: Any) -> np.ndarray:
        """Index of each GPU within its node (``gpu % M``); same shape as ``gpus``."""
        return self._check_gpus(gpus) % self.gpus_per_node

    def gpus_of_node(self, node: int) -> np.ndarray:
        """Global indices of the M GPUs of ``node``, int64, ascending."""
        if isinstance(node, bool) or not isinstance(node, (int, np.integer)) \
                or not 0 <= node < self.nodes:
            raise ConfigError(f"node index {node!r} out of range [0, {self.nodes})")
        m = self.gpus_per_node
        return np.arange(int(node) * m, (int(node) + 1) * m, dtype=np.int64)

    def link_class_matrix(self) -> np.ndarray:
        """Link class of every (src, dst) GPU pair.

        Returns
        -------
        ndarray of int8, shape (G, G)
            0 (:data:`LINK_LOCAL`) on the diagonal, 1 (:data:`LINK_INTRA`) between GPUs of the same
            node, 2 (:data:`LINK_INTER`) between nodes.
        """
        node = np.arange(self.num_gpus) // self.gpus_per_node
        out = np.where(node[:, None] == node[None, :], LINK_INTRA, LINK_INTER).astype(np.int8)
        np.fill_diagonal(out, LINK_LOCAL)
        return out

    # ------------------------------------------------------------------ constructors
    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int, hbm_bytes_per_gpu: float = 80e9,
                intra_node_bandwidth: float = 300e9, inter_node_bandwidth: float = 25e9,
                host_memory_bytes_per_node: float = 1e12, uvm_bandwidth: float = 25e9,
                name: str = "") -> "Topology":
        """A homogeneous cluster: every GPU and node alike (bytes, bytes/s per GPU per direction)."""
        n, m = _checked_size(nodes, gpus_per_node, "")
        vals = {k: _positive_number(v, k) for k, v in (
            ("hbm_bytes_per_gpu", hbm_bytes_per_gpu), ("intra_node_bandwidth", intra_node_bandwidth),
            ("inter_node_bandwidth", inter_node_bandwidth),
            ("host_memory_bytes_per_node", host_memory_bytes_per_node),
            ("uvm_bandwidth", uvm_bandwidth))}
        g = n * m
        return cls(n, m, np.full(g, vals["hbm_bytes_per_gpu"]),
                   np.full(g, vals["intra_node_bandwidth"]),
                   np.full(g, vals["inter_node_bandwidth"]), np.full(g, vals["uvm_bandwidth"]),
                   np.full(n, vals["host_memory_bytes_per_node"]), name)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str | None = None) -> "Topology":
        """Build a topology from the TOML layout (a mapping with a ``topology`` table).

        Parameters
        ----------
        d : mapping
            As read from a topology TOML file (see the module docstring).
        source : str, optional
            File name used in error messages.

        Raises
        ------
        ConfigError
            Missing ``[topology]``, ``nodes`` or ``gpus_per_node``; unknown keys; non-numeric,
            zero or negative values; node or GPU index out of range or given twice.
        """
        src = source or "<topology dict>"
        if not isinstance(d, Mapping):
            raise ConfigError(f"{src}: expected a mapping with a [topology] table, "
                              f"got {type(d).__name__}")
        if "topology" not in d:
            raise ConfigError(f"{src}: missing [topology] table"
                              + (f" (found keys {list(d)})" if d else " (empty)"))
        _check_keys(d, ("topology",), src)
        top = d["topology"]
        if not isinstance(top, Mapping):
            raise ConfigError(f"{src}: topology = {top!r}: must be a table ([topology])")
        _check_keys(top, _TOP_KEYS, f"{src}: [topology]")
        for key in ("nodes", "gpus_per_node"):
            if key not in top:
                raise ConfigError(f"{src}: [topology] is missing the required key {key!r}")
        n, m = _checked_size(top["nodes"], top["gpus_per_node"], f"{src}: [topology] ")
        name = top.get("name", "")
        if not isinstance(name, str):
            raise ConfigError(f"{src}: [topology] name = {name!r}: must be a string")
        base = {k: _positive_number(top.get(k, v), f"{src}: [topology] {k}")
                for k, v in _DEFAULTS.items()}
        g = n * m
        arrays = {attr: np.full(g, base[key]) for key, attr in _GPU_FIELDS.items()}
        host = np.full(n, base["host_memory_bytes_per_node"])

        for section, count, keys in (("node", n, _NODE_KEYS), ("gpu", g, _GPU_KEYS)):
            entries = top.get(section, [])
            if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                raise ConfigError(f"{src}: [topology] {section} = {entries!r}: must be an array of "
                                  f"tables ([[topology.{section}]])")
            seen: dict[int, int] = {}
            for i, entry in enumerate(entries):
                where = f"{src}: [[topology.{section}]] entry {i} (0-based)"
                _check_keys(entry, keys, where)
                if "index" not in entry:
                    raise ConfigError(f"{where}: missing the required key 'index'")
                idx = entry["index"]
                if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
                    raise ConfigError(f"{where}: index = {idx!r}: must be an integer")
                if not 0 <= idx < count:
                    what = "nodes" if section == "node" else "GPUs (node * gpus_per_node + local)"
                    raise ConfigError(f"{where}: index = {idx} out of range [0, {count}): "
                                      f"the topology has {count} {what}")
                if idx in seen:
                    raise ConfigError(f"{where}: index = {idx} given twice (also in entry "
                                      f"{seen[idx]})")
                idx = int(idx)
                seen[idx] = i
                where = f"{src}: [[topology.{section}]] index = {idx}:"
                sel = slice(idx * m, (idx + 1) * m) if section == "node" else slice(idx, idx + 1)
                for key, value in entry.items():
                    if key == "index":
                        continue
                    x = _positive_number(value, f"{where} {key}")
                    if key == "host_memory_bytes":
                        host[idx] = x
                    else:
                        arrays[_GPU_FIELDS[key]][sel] = x
        return cls(n, m, name=name, host_memory_bytes=host, **arrays)

    @classmethod
    def from_toml(cls, path: PathLike) -> "Topology":
        """Read a topology TOML file.

        Raises
        ------
        FormatError
            The file cannot be read or is not valid TOML.
        ConfigError
            The content is invalid (see :meth:`from_dict`); the message names the file.
        """
        return cls.from_dict(read_toml(path), source=str(path))

    @classmethod
    def preset(cls, name: str) -> "Topology":
        """A preset topology: ``data/topologies/<name>.toml`` (e.g. ``"2x8"``, ``"16x8_skewed"``;
        any case: ``"16X8"`` is ``"16x8"``)."""
        names = available_presets()
        if isinstance(name, str) and name not in names and name.lower() in names:
            name = name.lower()
        if not isinstance(name, str) or name not in names:
            raise ConfigError(f"unknown topology preset {name!r}; available presets: {names} "
                              f"(in {PRESET_DIR})")
        return cls.from_toml(PRESET_DIR / f"{name}.toml")

    @classmethod
    def load(cls, path_or_preset: PathLike) -> "Topology":
        """A topology file if ``path_or_preset`` is an existing path, else a preset name, else
        ``NxM`` (``"4x8"``: N nodes of M GPUs, each GPU and node as the presets' DGX-style
        ones, :meth:`uniform`'s defaults)."""
        if os.path.exists(path_or_preset):
            return cls.from_toml(path_or_preset)
        s = os.fspath(path_or_preset)
        if s.lower() in available_presets():
            return cls.preset(s)
        shape = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", s)
        if shape:
            n, m = int(shape[1]), int(shape[2])
            return cls.uniform(n, m, name=f"{n}x{m}")
        raise ConfigError(f"{s!r} is neither an existing topology file, a preset nor NxM (N nodes "
                          f"of M GPUs, e.g. 4x8); available presets: {available_presets()} (in "
                          f"{PRESET_DIR})")

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict[str, Any]:
        """The TOML layout: defaults are the most common values; overrides only where they differ.

        Per-node overrides are written where all (most) GPUs of a node differ from the default,
        per-GPU overrides where a GPU differs from its node. ``from_dict(to_dict())`` is equal.
        """
        top: dict[str, Any] = {}
        if self.name:
            top["name"] = self.name
        top["nodes"] = self.nodes
        top["gpus_per_node"] = self.gpus_per_node
        m = self.gpus_per_node
        node_vals: dict[str, np.ndarray] = {}
        for key in _DEFAULTS:
            if key == "host_memory_bytes_per_node":
                top[key] = _mode(self.host_memory_bytes)
            else:
                a = getattr(self, _GPU_FIELDS[key]).reshape(self.nodes, m)
                top[key] = _mode(a)
                node_vals[key] = np.array([_mode(row) for row in a])
        node_entries = []
        for i in range(self.nodes):
            e: dict[str, Any] = {}
            for key in _GPU_FIELDS:
                if node_vals[key][i] != top[key]:
                    e[key] = float(node_vals[key][i])
            if self.host_memory_bytes[i] != top["host_memory_bytes_per_node"]:
                e["host_memory_bytes"] = float(self.host_memory_bytes[i])
            if e:
                node_entries.append({"index": i, **e})
        gpu_entries = []
        for g in range(self.num_gpus):
            e = {}
            for key, attr in _GPU_FIELDS.items():
                v = getattr(self, attr)[g]
                if v != node_vals[key][g // m]:
                    e[key] = float(v)
            if e:
                gpu_entries.append({"index": g, **e})
        if node_entries:
            top["node"] = node_entries
        if gpu_entries:
            top["gpu"] = gpu_entries
        return {"topology": top}

    def to_toml(self, path: PathLike) -> None:
        """Write the topology as TOML (layout of :meth:`to_dict`); atomic."""
        top = self.to_dict()["topology"]
        comment = " ".join(self.summary().splitlines())
        lines = [f"# {comment}", "[topology]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in top.items() if k not in ("node", "gpu")]
        for section in ("node", "gpu"):
            for entry in top.get(section, []):
                lines += ["", f"[[topology.{section}]]"]
                lines += [f"{k} = {toml_value(v)}" for k, v in entry.items()]
        write_text_atomic(path, "\n".join(lines) + "\n", kind="topology")

    # ------------------------------------------------------------------ misc
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (self.nodes == other.nodes and self.gpus_per_node == other.gpus_per_node
                and self.name == other.name
                and all(np.array_equal(getattr(self, a), getattr(other, a))
                        for a in ("hbm_bytes", "intra_bw", "inter_bw", "uvm_bw",
                                  "host_memory_bytes")))

    def __hash__(self) -> int:
        return hash((self.nodes, self.gpus_per_node, self.name, self.hbm_bytes.tobytes(),
                     self.intra_bw.tobytes(), self.inter_bw.tobytes(), self.uvm_bw.tobytes(),
                     self.host_memory_bytes.tobytes()))

    def __repr__(self) -> str:
        return (f"Topology(name={self.name!r}, nodes={self.nodes}, "
                f"gpus_per_node={self.gpus_per_node})")

    def summary(self) -> str:
        """One line: shape, HBM, bandwidths (ranges where they differ), host memory."""
        label = f"{self.name}: " if self.name else ""
        inter = _span(self.inter_bw, "B/s")
        slow = int((self.inter_bw < self.inter_bw.max()).sum())
        if slow:
            inter += f" ({slow} of {self.num_gpus} GPUs below the max)"
        return (f"{label}{self.nodes} node(s) x {self.gpus_per_node} GPU(s) = {self.num_gpus} GPUs; "
                f"HBM {_span(self.hbm_bytes, 'B')} per GPU; "
                f"per GPU and direction: intra-node {_span(self.intra_bw, 'B/s')}, "
                f"inter-node {inter}, UVM {_span(self.uvm_bw, 'B/s')}; "
                f"host memory {_span(self.host_memory_bytes, 'B')} per node")
