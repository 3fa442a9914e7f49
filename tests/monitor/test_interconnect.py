"""course.monitor.interconnect: the links between GPUs, read through a fake NVML (a unit test of the reading)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from course.monitor import interconnect


class FakeTopology:
    """pynvml's topology calls for ``count`` GPUs: ``nvlinks[i]`` lists the bus ids GPU i's active links reach."""

    class NVMLError(Exception):
        pass

    def __init__(self, count: int, nvlinks: list[list[str]], pcie_level: int = 30) -> None:
        self.count, self.nvlinks, self.pcie_level = count, nvlinks, pcie_level

    @classmethod
    def nvlinked(cls, count: int, links: int = 4) -> FakeTopology:
        """Every pair of GPUs joined by ``links`` direct NVLinks."""
        return cls(count, [[cls.bus(j) for j in range(count) if j != i for _ in range(links)] for i in range(count)])

    @staticmethod
    def bus(i: int) -> str:
        return f"00000000:{0x18 + i:02X}:00.0"

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.bus(handle).encode())

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if not self.nvlinks[handle]:
            raise self.NVMLError("Not Supported")
        return int(link < len(self.nvlinks[handle]))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.nvlinks[handle][link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.pcie_level


def test_direct_nvlinks_are_counted_per_pair():
    assert interconnect.describe(FakeTopology.nvlinked(3, links=6)) == [
        "GPU 0 <-> GPU 1: NVLink x6", "GPU 0 <-> GPU 2: NVLink x6", "GPU 1 <-> GPU 2: NVLink x6"]


def test_links_to_a_switch_are_nvswitch():
    switch = "00000000:C0:00.0"
    assert interconnect.describe(FakeTopology(2, [[switch] * 18, [switch] * 18])) == [
        "GPU 0 <-> GPU 1: NVLink through NVSwitch (18 links from GPU 0)"]


@pytest.mark.parametrize(("level", "said"), [(10, "PCIe through one switch (PIX)"),
                                             (50, "PCIe across CPU sockets (SYS)")])
def test_gpus_without_nvlink_show_their_pcie_path(level, said):
    assert interconnect.describe(FakeTopology(2, [[], []], pcie_level=level)) == [f"GPU 0 <-> GPU 1: {said}"]


def test_one_gpu_has_no_peer():
    assert interconnect.describe(FakeTopology(1, [[]])) == [
        "GPU 0: the only GPU, so no GPU-to-GPU link (0 NVLink(s) active)"]


def test_no_driver_is_said_not_raised():
    class NoDriver(FakeTopology):
        def nvmlInit(self) -> None:
            raise RuntimeError("Driver Not Loaded")

    assert interconnect.describe(NoDriver(1, [[]])) == [
        "unknown: NVML is not usable here (RuntimeError: Driver Not Loaded)"]
