"""An emulated network path to a registry, for tests and benchmarks of a fresh node: the registry
runs in a network namespace of its own, reached over a veth pair shaped by ``tc tbf`` to a rate
(1 or 10 Gbit/s), on private addresses inside the pair only. The one owner of the ``ip``/``tc``
command lines that build it.

This kernel has no netem (nor fq/fq_codel), so no delay can be added by tc: the path has the veth's
own latency (tens of microseconds), not a data centre's ~1 ms RTT. With 1 MiB chunks and range GETs
of up to 8 MiB, a millisecond per request would add little; the figures say which path they ran on.
"""
from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass

from coldstart.errors import ColdstartError


def _run(*argv: str) -> None:
    p = subprocess.run(list(argv), capture_output=True, text=True)
    if p.returncode != 0:
        raise ColdstartError(f"{' '.join(argv)}: {p.stderr.strip() or p.returncode}")


@dataclass
class Link:
    """Node side: the root namespace at ``node_addr``; registry side: namespace ``netns`` at ``addr``."""
    netns: str
    node_if: str
    addr: str
    node_addr: str
    rate_gbit: float | None

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.node_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shape(dev: str, rate_gbit: float, netns: str | None = None) -> None:
    # tbf: rate; burst must hold at least one timer tick's worth of bytes at that rate (HZ=1000 -> 1 ms)
    rate_bit = int(rate_gbit * 1e9)
    burst = max(rate_bit // 8 // 1000 * 2, 64 << 10)
    argv = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_bit}bit",
            "burst", str(burst), "latency", "50ms"]
    _run(*(["ip", "netns", "exec", netns] if netns else []), *argv)


def make_link(rate_gbit: float | None, subnet: int | None = None) -> Link:
    """A new namespace and veth pair (10.201.N.0/30), shaped both ways to ``rate_gbit`` (None: not
    shaped). Close it (or use it as a context manager) to remove both."""
    tag = uuid.uuid4().hex[:6]
    n = subnet if subnet is not None else int(tag, 16) % 250 + 1
    ns, a, b = f"cs-reg-{tag}", f"csn{tag}", f"csr{tag}"
    link = Link(ns, a, f"10.201.{n}.2", f"10.201.{n}.1", rate_gbit)
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        _run("ip", "link", "set", b, "netns", ns)
        _run("ip", "addr", "add", f"{link.node_addr}/30", "dev", a)
        _run("ip", "link", "set", a, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{link.addr}/30", "dev", b)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if rate_gbit:
            _shape(a, rate_gbit)
            _shape(b, rate_gbit, ns)
    except Exception:
        link.close()
        raise
    return link
