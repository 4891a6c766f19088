"""An emulated N-node x M-GPU network on one Linux machine: network namespaces, veth pairs, a
bridge and ``tc`` HTB shaping between emulated nodes.

Layout (``P`` = :attr:`EmulatedNetwork.prefix`, ``fsc-<pid>-<n>-``; nothing is created in the
namespace this process runs in)::

    namespace P r<k>   one per rank k: veth c<pid>e<k>, address 198.18.<node>.<local + 1>/16
    namespace P sw     the switch: bridge c<pid>br, one port c<pid>p<k> per rank

Addresses are in 198.18.0.0/15, the block reserved for network benchmarks (RFC 2544); no route
leads out of the namespaces. Every rank's traffic is shaped twice, as a GPU's network interface
is limited in each direction: on the egress of its own veth (what it sends) and on the egress of
its switch port (what it receives). Each of the two HTB qdiscs has two classes, chosen by a u32
filter on the peer's address: ``1:10`` inter-node (``inter_rate`` bits per second) and ``1:20``
intra-node (``intra_rate``; unshaped when None: 10 Gbit/s, above what veths carry here). The
classes' byte counters are the wire bytes (IP packets with their Ethernet, IP and TCP headers,
ACKs included) per link class (:meth:`EmulatedNetwork.counters`).

Clean-up removes exactly the namespaces named with this run's prefix (deleting a namespace
deletes its veths, its bridge and their qdiscs), after killing any process still inside them;
it runs on :meth:`close`, on leaving the ``with`` block (error or Ctrl-C included), at interpreter
exit and on SIGTERM. Namespaces of other names are never touched.
"""

from __future__ import annotations

import atexit
import itertools
import re
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Sequence

from ..errors import ClusterError, ClusterUnavailable

__all__ = ["EmulatedNetwork", "ClassCounters", "check_emulation", "emulation_available",
           "format_rate", "parse_class_counters", "INTER_CLASS", "INTRA_CLASS", "CLASS_NAMES", "UNSHAPED_RATE", "SUBNET"]

#: HTB class ids (minor) of inter-node and intra-node traffic: data packets (``10``, ``20``) and
#: pure TCP ACKs (``11``, ``21``; IP length < 64 bytes, only the ACK flag), children of ``1:1``
#: and ``1:2``, which carry the rate.
INTER_CLASS, INTRA_CLASS = 10, 20
#: Counter name of each leaf class.
CLASS_NAMES = {10: "inter_node", 11: "inter_node_acks", 20: "intra_node", 21: "intra_node_acks"}
#: u32 matches of a pure TCP ACK (LARTC's recipe): TCP, IP header of 20 bytes, IP length < 64,
#: flags byte (offset 33) = ACK only.
_PURE_ACK = ["match", "ip", "protocol", "6", "0xff", "match", "u8", "0x05", "0x0f", "at", "0",
             "match", "u16", "0x0000", "0xffc0", "at", "2", "match", "u8", "0x10", "0xff", "at",
             "33"]
#: Rate of an unshaped class (bits per second): far above what a veth pair carries on this CPU.
UNSHAPED_RATE = 10e9
#: TCP send and receive buffers in the emulated hosts (bytes; ``net.ipv4.tcp_wmem``, ``tcp_rmem``).
TCP_BUFFER_BYTES = 32 << 20
#: The benchmarking block (RFC 2544) the emulated hosts live in.
SUBNET = "198.18"
_SEQ = itertools.count()
#: One class of `tc -s class show` (iproute2 6.1 prints no JSON for HTB classes).
_CLASS_RE = re.compile(r"class htb 1:(\d+) .*?\n\s*Sent (\d+) bytes (\d+) pkt", re.S)
_LIVE: list["EmulatedNetwork"] = []
_LOCK = threading.Lock()


def _run(args: Sequence[str], *, check: bool = True, timeout: float = 30.0
         ) -> subprocess.CompletedProcess:
    """Run one ``ip`` / ``tc`` command; :class:`ClusterError` naming it when it fails."""
    try:
        p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ClusterError(f"`{' '.join(args)}` failed: {e}") from None
    if check and p.returncode != 0:
        raise ClusterError(f"`{' '.join(args)}` exited with {p.returncode}: "
                           f"{(p.stderr or p.stdout).strip()}")
    return p


def format_rate(bits_per_s: float) -> str:
    """A rate as ``tc`` reads it, in bits per second (``"50000000bit"``)."""
    return f"{int(round(bits_per_s))}bit"


def check_emulation() -> None:
    """Refuse, with the reason, where the emulation cannot run: not root, no ``ip`` / ``tc``,
    or the kernel lacks network namespaces, veth pairs, bridges or HTB (tried on a scratch
    namespace of this run's prefix, removed at once). Raises :class:`ClusterUnavailable`."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        raise ClusterUnavailable("the emulated cluster needs Linux (network namespaces)")
    if os.geteuid() != 0:
        raise ClusterUnavailable("the emulated cluster needs root (network namespaces, tc); "
                                 f"running as uid {os.geteuid()}")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterUnavailable(f"`{tool}` (iproute2) not found on PATH")
    try:
        with EmulatedNetwork(1, 2, inter_rate=1e6):
            pass
    except ClusterError as e:
        raise ClusterUnavailable(f"the kernel refused the emulation: {e}") from None


def emulation_available() -> tuple[bool, str]:
    """(True, "") where :func:`check_emulation` passes, else (False, its reason)."""
    try:
        check_emulation()
    except ClusterUnavailable as e:
        return False, str(e)
    return True, ""


def parse_class_counters(text: str) -> dict[int, tuple[int, int]]:
    """{HTB class minor: (bytes, packets)} from the output of ``tc -s class show``."""
    return {int(m.group(1)): (int(m.group(2)), int(m.group(3)))
            for m in _CLASS_RE.finditer(text)}


@dataclass(frozen=True)
class ClassCounters:
    """Wire bytes and packets of the HTB classes, summed over ranks (bytes as the qdisc counts
    them: whole IP packets with their Ethernet header).

    ``sent``: on the ranks' own veths (what they send); ``received``: on the switch ports (what
    they receive). Keys (:data:`CLASS_NAMES`): ``inter_node``, ``intra_node`` (data packets,
    headers included) and ``inter_node_acks``, ``intra_node_acks`` (pure TCP ACKs)."""

    sent: dict[str, int]
    received: dict[str, int]
    packets: dict[str, int]

    def __sub__(self, other: "ClassCounters") -> "ClassCounters":
        return ClassCounters({k: v - other.sent[k] for k, v in self.sent.items()},
                             {k: v - other.received[k] for k, v in self.received.items()},
                             {k: v - other.packets[k] for k, v in self.packets.items()})

    def to_json(self) -> dict:
        return {"sent": dict(self.sent), "received": dict(self.received),
                "packets": dict(self.packets)}


class EmulatedNetwork:
    """The namespaces, veths, bridge and qdiscs of one emulated cluster (see the module text).

    Parameters
    ----------
    nodes, gpus_per_node : int
        N and M; one rank (namespace) per GPU, rank ``k`` on node ``k // M``.
    inter_rate : float
        Inter-node rate per rank and direction, bits per second.
    intra_rate : float, optional
        Intra-node rate per rank and direction, bits per second; None: unshaped.
    mtu : int
        MTU of every veth (bytes).

    Use as a context manager; :meth:`close` is idempotent.
    """

    def __init__(self, nodes: int, gpus_per_node: int, *, inter_rate: float,
                 intra_rate: float | None = None, mtu: int = 1500):
        if nodes < 1 or gpus_per_node < 1 or nodes * gpus_per_node > 250:
            raise ClusterError(f"an emulated cluster of {nodes} x {gpus_per_node} ranks: "
                               "1 to 250 ranks")
        if not inter_rate > 0 or (intra_rate is not None and not intra_rate > 0):
            raise ClusterError(f"rates must be > 0 bits per second, got inter {inter_rate}, "
                               f"intra {intra_rate}")
        self.nodes, self.gpus_per_node = int(nodes), int(gpus_per_node)
        self.inter_rate = float(inter_rate)
        self.intra_rate = None if intra_rate is None else float(intra_rate)
        self.mtu = int(mtu)
        self.pid = os.getpid()
        self.prefix = f"fsc-{self.pid}-{next(_SEQ)}-"
        self._tag = f"c{self.pid}"
        self.created: list[str] = []
        self._closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ names
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def namespace(self, rank: int) -> str:
        """The network namespace of ``rank``."""
        return f"{self.prefix}r{rank}"

    @property
    def switch(self) -> str:
        """The namespace holding the bridge."""
        return f"{self.prefix}sw"

    def interface(self, rank: int) -> str:
        """The veth of ``rank`` inside its namespace (what gloo binds to)."""
        return f"{self._tag}e{rank}"

    def port(self, rank: int) -> str:
        """The bridge port (in :attr:`switch`) of ``rank``."""
        return f"{self._tag}p{rank}"

    def address(self, rank: int) -> str:
        node, local = divmod(rank, self.gpus_per_node)
        return f"{SUBNET}.{node}.{local + 1}"

    def namespaces(self) -> list[str]:
        """Every namespace this network created (and will remove)."""
        return list(self.created)

    # ------------------------------------------------------------------ build
    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        # no IPv6: its router and multicast solicitations would add noise to the counters
        # TCP buffers that take a whole collective's message in one write: gloo writes what
        # fits, and each partial write under back-pressure ends in a short segment (TCP_NODELAY),
        # whose headers made the wire bytes vary by a few percent from run to run
        _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w",
              "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
              f"net.ipv4.tcp_wmem=4096 {TCP_BUFFER_BYTES} {TCP_BUFFER_BYTES}",
              f"net.ipv4.tcp_rmem=4096 {TCP_BUFFER_BYTES} {TCP_BUFFER_BYTES}"])

    def _build(self) -> None:
        with _LOCK:
            _LIVE.append(self)
        _install_handlers()
        sw = self.switch
        self._add_namespace(sw)
        br = f"{self._tag}br"
        _run(["ip", "-n", sw, "link", "add", br, "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", br, "up"])
        for k in range(self.world_size):
            ns, e, p = self.namespace(k), self.interface(k), self.port(k)
            self._add_namespace(ns)
            _run(["ip", "link", "add", e, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                  "peer", "name", p, "netns", sw, "mtu", str(self.mtu)])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(k)}/16", "dev", e])
            _run(["ip", "-n", ns, "link", "set", e, "up"])
            _run(["ip", "-n", sw, "link", "set", p, "master", br, "up"])
            self._shape(ns, e, k, "dst")
            self._shape(sw, p, k, "src")

    def _shape(self, ns: str, dev: str, rank: int, peer_field: str) -> None:
        """HTB on ``dev``'s egress: inter-node (peer ``peer_field`` on another node) and
        intra-node parents carrying the rates, each with a data and a pure-ACK leaf."""
        intra = self.intra_rate or UNSHAPED_RATE
        tc = ["tc", "-n", ns]
        _run(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default",
                   str(INTRA_CLASS)])
        for parent, leaf, rate in ((1, INTER_CLASS, self.inter_rate), (2, INTRA_CLASS, intra)):
            r = format_rate(rate)
            _run(tc + ["class", "add", "dev", dev, "parent", "1:", "classid", f"1:{parent}",
                       "htb", "rate", r, "ceil", r, "quantum", str(self.mtu + 14)])
            for minor, share in ((leaf, 0.9), (leaf + 1, 0.1)):
                _run(tc + ["class", "add", "dev", dev, "parent", f"1:{parent}", "classid",
                           f"1:{minor}", "htb", "rate", format_rate(rate * share), "ceil", r,
                           "quantum", str(self.mtu + 14)])
        me = rank // self.gpus_per_node
        flt = tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip"]
        for node in range(self.nodes):
            if node != me:
                peer = ["match", "ip", peer_field, f"{SUBNET}.{node}.0/24"]
                _run(flt + ["prio", "1", "u32", *peer, *_PURE_ACK,
                            "flowid", f"1:{INTER_CLASS + 1}"])
                _run(flt + ["prio", "2", "u32", *peer, "flowid", f"1:{INTER_CLASS}"])
        _run(flt + ["prio", "3", "u32", *_PURE_ACK, "flowid", f"1:{INTRA_CLASS + 1}"])

    # ------------------------------------------------------------------ counters
    @staticmethod
    def _class_bytes(ns: str, dev: str) -> dict[int, tuple[int, int]]:
        """{class minor: (bytes, packets)} of ``dev``'s HTB classes in namespace ``ns``."""
        p = _run(["tc", "-n", ns, "-s", "class", "show", "dev", dev])
        return parse_class_counters(p.stdout)

    def counters(self) -> ClassCounters:
        """The leaf classes' counters now, summed over ranks (subtract two readings)."""
        sent = dict.fromkeys(CLASS_NAMES.values(), 0)
        received = dict.fromkeys(CLASS_NAMES.values(), 0)
        packets = dict.fromkeys(CLASS_NAMES.values(), 0)
        for k in range(self.world_size):
            for cls, (b, n) in self._class_bytes(self.namespace(k), self.interface(k)).items():
                if cls in CLASS_NAMES:
                    sent[CLASS_NAMES[cls]] += b
                    packets[CLASS_NAMES[cls]] += n
            for cls, (b, _) in self._class_bytes(self.switch, self.port(k)).items():
                if cls in CLASS_NAMES:
                    received[CLASS_NAMES[cls]] += b
        return ClassCounters(sent, received, packets)

    # ------------------------------------------------------------------ processes
    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``rank``'s namespace (``ip netns exec``; it execs, so the process
        started is the command itself)."""
        return ["ip", "netns", "exec", self.namespace(rank), *argv]

    def pids(self) -> list[int]:
        """Processes still running inside this network's namespaces."""
        out = []
        for ns in self.created:
            p = _run(["ip", "netns", "pids", ns], check=False)
            out += [int(x) for x in p.stdout.split() if x.isdigit()]
        return out

    # ------------------------------------------------------------------ clean-up
    def close(self) -> None:
        """Kill what runs inside the namespaces, then delete them (veths, bridge and qdiscs go
        with them). Idempotent; never touches a namespace of another name."""
        if self._closed:
            return
        self._closed = True
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        errors = []
        for ns in reversed(self.created):
            assert ns.startswith(self.prefix)
            p = _run(["ip", "netns", "del", ns], check=False)
            if p.returncode != 0 and ns in _existing_namespaces():
                errors.append(f"{ns}: {p.stderr.strip()}")
        self.created = [ns for ns in self.created if ns in _existing_namespaces()]
        with _LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
        if errors:
            raise ClusterError("could not remove " + "; ".join(errors))

    def __enter__(self) -> "EmulatedNetwork":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EmulatedNetwork({self.nodes} x {self.gpus_per_node}, inter "
                f"{self.inter_rate / 1e6:g} Mbit/s, prefix {self.prefix!r})")


def _existing_namespaces() -> set[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return {line.split()[0] for line in p.stdout.splitlines() if line.strip()}


def _close_all() -> None:
    for net in list(_LIVE):
        try:
            net.close()
        except ClusterError:
            pass


_HANDLED = {"done": False}


def _install_handlers() -> None:
    """At exit and on SIGTERM (main thread only), remove every live network of this process;
    SIGTERM then exits as it would have (status 128 + 15). Ctrl-C raises KeyboardInterrupt,
    which the ``with`` block's exit handles."""
    if _HANDLED["done"]:
        return
    _HANDLED["done"] = True
    atexit.register(_close_all)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        _close_all()
        if callable(previous) and previous not in (signal.SIG_IGN, signal.SIG_DFL):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
