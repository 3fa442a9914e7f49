"""Two "nodes" on one machine, as the network sees them: network namespaces joined by a shaped virtual cable.

Each node is a network namespace of its own (its own interfaces, addresses and ports), and the two are joined
by a veth pair: a virtual cable. ``tc`` shapes the cable to be much slower than the link inside a node (a
token bucket, ``tbf``, caps its rate; ``netem`` adds delay where the kernel has it), as a network between
machines is slower than NVLink. Inside a namespace, ``node0`` names the rendezvous host, as on a cluster.

Namespaces need root and iproute2 (``ip``, ``tc``): :func:`namespaces_unavailable` says why not. Traffic stays
on the veth pair between the namespaces made here, which use private addresses (10.213.x.0/30) and are deleted
afterwards. ``course.multinode.nodes`` runs the two torchrun invocations in them; taught in
``notebooks/05b_nodes.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: ``ip netns exec NAME`` shows the files of /etc/netns/NAME/ in place of /etc's (here: hosts).
NETNS_ETC = "/etc/netns"
#: The name the nodes use for the rendezvous host, as on a cluster.
RENDEZVOUS_HOST = "node0"


@dataclass(frozen=True)
class SlowLink:
    """The cable between the nodes, shaped with tc, each way.

    Attributes:
        rate_mbit: bandwidth cap (tbf), in megabits per second.
        delay_ms: added latency (netem), in milliseconds; 0 for none. Kernels without netem skip it (noted).
    """

    rate_mbit: float = 200.0  # 25 MB/s: a 2 MB tensor takes ~80 ms, shared memory ~1 ms
    delay_ms: float = 0.0


#: The cable :func:`two_node_network` and ``course.multinode.nodes.run_two_nodes`` shape when not told otherwise.
DEFAULT_LINK = SlowLink()


@dataclass
class Network:
    """Two namespaces joined by a shaped veth pair: node i is ``namespaces[i]``, reached at ``addresses[i]``."""

    namespaces: tuple[str, str]
    interfaces: tuple[str, str]
    addresses: tuple[str, str]
    link: SlowLink
    notes: list[str] = field(default_factory=list)  # what could not be shaped, and why


def namespaces_unavailable() -> str | None:
    """Why two network namespaces cannot be made here, or None if they can (root and iproute2)."""
    if os.geteuid() != 0:
        return "network namespaces and tc need root (run as root, or in CI's root job)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} from iproute2 (apt-get install iproute2)"
    return None


def _run(*command: str) -> subprocess.CompletedProcess:
    """Run an ip/tc command (bounded); raise RuntimeError with its stderr if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def two_node_network(link: SlowLink = DEFAULT_LINK) -> Iterator[Network]:
    """Make two network namespaces joined by a veth pair shaped as ``link``; delete them on exit, whatever happens.

    Names carry this process's id and a random tag (several runs at once never collide); addresses are a
    random /30 in 10.213.0.0/16, used only inside the namespaces.

    Raises:
        RuntimeError: not root, no iproute2, or an ip/tc command failed (the namespaces made so far are deleted).
    """
    reason = namespaces_unavailable()
    if reason:
        raise RuntimeError(f"cannot make network namespaces: {reason}.")
    tag = f"cn{os.getpid() % 100_000}{secrets.token_hex(2)}"
    subnet = secrets.randbelow(256)
    network = Network((f"{tag}a", f"{tag}b"), (f"{tag}x", f"{tag}y"),
                      (f"10.213.{subnet}.1", f"10.213.{subnet}.2"), link)
    made: list[str] = []
    try:
        for node, namespace in enumerate(network.namespaces):
            _run("ip", "netns", "add", namespace)
            made.append(namespace)
            _hosts_file(namespace, network.addresses, node)
        _run("ip", "link", "add", network.interfaces[0], "type", "veth", "peer", "name", network.interfaces[1])
        for namespace, interface, address in zip(network.namespaces, network.interfaces, network.addresses,
                                                 strict=True):
            _run("ip", "link", "set", interface, "netns", namespace)
            _run("ip", "-n", namespace, "addr", "add", f"{address}/30", "dev", interface)
            _run("ip", "-n", namespace, "link", "set", interface, "up")
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
            _shape(namespace, interface, link, network.notes)
        yield network
    finally:
        for namespace in made:  # deleting a namespace deletes its end of the veth, and so the pair
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _run("ip", "netns", "del", namespace)
            shutil.rmtree(os.path.join(NETNS_ETC, namespace), ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(NETNS_ETC)  # only if empty: another tool's namespaces may have files there


def _hosts_file(namespace: str, addresses: tuple[str, str], node: int) -> None:
    """``/etc/hosts`` as seen inside ``namespace`` (``ip netns exec`` mounts ``/etc/netns/<name>/hosts`` over it):
    ``node0`` is the rendezvous host, and this machine's name is this node's address, so the torchrun on node 0
    knows that it hosts the rendezvous store (it compares the endpoint with its own addresses)."""
    directory = os.path.join(NETNS_ETC, namespace)
    os.makedirs(directory, exist_ok=True)
    lines = ["127.0.0.1 localhost", f"{addresses[0]} {RENDEZVOUS_HOST}",
             f"{addresses[node]} {socket.gethostname()}", f"{addresses[1]} node1"]
    Path(directory, "hosts").write_text("\n".join(lines) + "\n")


def _shape(namespace: str, interface: str, link: SlowLink, notes: list[str]) -> None:
    """Outgoing traffic of ``interface``: netem delay (if asked and available), then a tbf rate cap."""
    tc = ("ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", interface)
    rate = f"{link.rate_mbit:g}mbit"
    burst = f"{max(16, int(link.rate_mbit * 1e6 / 8 / 1000 * 4 / 1024))}kb"  # ~4 ms of traffic, as the rate allows
    parent: tuple[str, ...] = ("root",)
    if link.delay_ms > 0:
        try:
            _run(*tc, "root", "handle", "1:", "netem", "delay", f"{link.delay_ms:g}ms")
            parent = ("parent", "1:1")
        except RuntimeError as error:
            note = f"delay not shaped: this kernel has no netem ({error})"
            if note not in notes:
                notes.append(note)
    _run(*tc, *parent, "handle", "10:", "tbf", "rate", rate, "burst", burst, "latency", "200ms")


def shaping(network: Network) -> list[str]:
    """``tc qdisc show`` for each end of the cable: what the kernel actually applied."""
    return [_run("ip", "netns", "exec", namespace, "tc", "qdisc", "show", "dev", interface).stdout.strip()
            for namespace, interface in zip(network.namespaces, network.interfaces, strict=True)]
