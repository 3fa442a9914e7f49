"""course.multinode.netns: two network namespaces joined by a tc-shaped veth pair, made, shaped and always deleted
(as root; elsewhere the tests that need them skip with the reason)."""

import subprocess

import pytest

from course.multinode import netns

UNAVAILABLE = netns.namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


def _links() -> str:
    return subprocess.run(["ip", "link"], capture_output=True, text=True, timeout=10).stdout


@needs_namespaces
@pytest.mark.timeout(60)
def test_namespaces_are_made_shaped_and_deleted():
    with netns.two_node_network(netns.SlowLink(rate_mbit=50)) as network:
        assert all(name in _namespaces() for name in network.namespaces)
        for shown in netns.shaping(network):
            assert "tbf" in shown and "rate 50Mbit" in shown, shown
        for namespace, interface, address in zip(network.namespaces, network.interfaces, network.addresses,
                                                 strict=True):
            shown = subprocess.run(["ip", "-n", namespace, "addr", "show", interface], capture_output=True,
                                   text=True, timeout=10).stdout
            assert f"inet {address}/30" in shown and "UP" in shown, shown
    assert not any(name in _namespaces() for name in network.namespaces)
    assert not any(name in _links() for name in network.interfaces)


@needs_namespaces
@pytest.mark.timeout(60)
def test_a_delay_is_shaped_with_netem_or_said_to_be_missing():
    with netns.two_node_network(netns.SlowLink(rate_mbit=100, delay_ms=5)) as network:
        shown = netns.shaping(network)
        if any("netem" in line for line in shown):
            assert all("delay 5ms" in line and "tbf" in line for line in shown), shown
            assert network.notes == []
        else:
            assert network.notes and "no netem" in network.notes[0]
            assert all("tbf" in line and "rate 100Mbit" in line for line in shown), shown


@needs_namespaces
@pytest.mark.timeout(60)
def test_namespaces_are_deleted_when_the_body_raises():
    with pytest.raises(KeyError), netns.two_node_network() as network:
        raise KeyError("boom")
    assert not any(name in _namespaces() for name in network.namespaces)


def test_namespaces_unavailable_says_why(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "root" in netns.namespaces_unavailable()
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    assert "iproute2" in netns.namespaces_unavailable()
    with pytest.raises(RuntimeError, match="cannot make network namespaces"), netns.two_node_network():
        pass
