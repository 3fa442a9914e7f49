"""Which links join this machine's GPUs: NVLink (direct or through an NVSwitch) or PCIe, read from NVML.

The links decide how fast an all-reduce can be: NVLink moves hundreds of GB/s between GPUs, PCIe tens. ``course
info`` prints one line per pair of GPUs, like ``nvidia-smi topo -m`` (taught in ``notebooks/05b_nodes.ipynb``'s
bandwidth model). Pure reading: every function takes a pynvml-like module, so the tests pass a fake one.
"""

from __future__ import annotations

from typing import Any

from course.monitor.sources import open_nvml

#: NVML's ``nvmlDeviceGetTopologyCommonAncestor`` levels: where the PCIe paths of two GPUs meet
PCIE_LEVELS = {
    0: "PCIe, on one board",
    10: "PCIe through one switch (PIX)",
    20: "PCIe through several switches (PXB)",
    30: "PCIe through the CPU's host bridge (PHB)",
    40: "PCIe across host bridges of one CPU (NODE)",
    50: "PCIe across CPU sockets (SYS)",
}
#: NVML_NVLINK_MAX_LINKS: an H100 has 18 links
MAX_NVLINKS = 18


def _bus_id(pci: Any) -> str:
    bus = pci.busId
    return (bus.decode() if isinstance(bus, bytes) else str(bus)).lower()


def nvlink_peers(nvml: Any, handle: Any) -> list[str]:
    """The PCI bus id at the far end of each active NVLink of the GPU ``handle`` (a GPU's, or an NVSwitch's)."""
    peers = []
    for link in range(MAX_NVLINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link):
                peers.append(_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported (no NVLink, PCIe cards) or past the last link
            break
    return peers


def links(nvml: Any) -> list[str]:
    """One line per pair of GPUs: ``"GPU 0 <-> GPU 1: NVLink x12"``, ``"... NVLink through NVSwitch"`` or the
    PCIe path; for a single GPU, a line saying it has no peer."""
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    buses = [_bus_id(nvml.nvmlDeviceGetPciInfo(h)) for h in handles]
    peers = [nvlink_peers(nvml, h) for h in handles]
    if count == 1:
        return [f"GPU 0: the only GPU, so no GPU-to-GPU link ({len(peers[0])} NVLink(s) active)"]
    lines = []
    for i in range(count):
        for j in range(i + 1, count):
            direct = peers[i].count(buses[j])
            switched = [bus for bus in peers[i] if bus not in buses] and [bus for bus in peers[j] if bus not in buses]
            if direct:
                how = f"NVLink x{direct}"
            elif switched:
                how = f"NVLink through NVSwitch ({len(peers[i])} links from GPU {i})"
            else:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                how = PCIE_LEVELS.get(int(level), f"PCIe (NVML topology level {level})")
            lines.append(f"GPU {i} <-> GPU {j}: {how}")
    return lines


def describe(nvml: Any = None) -> list[str]:
    """:func:`links`, or one line saying why NVML could not tell (no driver, no pynvml)."""
    module, reason = open_nvml(nvml)
    if module is None:
        return [f"unknown: {reason}"]
    try:
        return links(module)
    except Exception as error:  # noqa: BLE001 - an old driver lacking a topology call: say so, do not fail `course info`
        return [f"unknown: NVML could not read the topology ({type(error).__name__}: {error})"]
