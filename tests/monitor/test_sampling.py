"""course.monitor.sampling: what each kind of history says it measured, a sampler that outlives its view."""

from __future__ import annotations

import psutil
import pytest

from course.monitor import sampling as utilization
from course.monitor import sources as utilization_sources
from course.monitor.sampling import History, Reading


class Constant:
    """A source that reads ``value`` percent on two devices: the sampler's loop without a process to measure."""

    kind = "nvml"

    def __init__(self, value: float) -> None:
        self.value = value

    def read(self, t_s: float) -> list[Reading]:
        return [Reading(t_s, device, self.value, 0) for device in (0, 1)]

    def label(self, device: int) -> str:
        return f"constant {device}"


def test_every_kind_of_history_says_whether_it_is_a_gpu_measurement():
    assert "NVML" in utilization.describe("nvml") and "Not a" not in utilization.describe("nvml")
    assert utilization.describe("process").endswith("Not a GPU measurement.")
    assert utilization.describe("modelled").endswith("Not a measurement.")


def test_a_sampler_records_every_reading_with_its_label():
    sampler = utilization.Sampler(Constant(40.0), interval_s=0.1)
    sampler.sample()
    sampler.sample()
    history = sampler.history
    assert history.kind == "nvml" and history.devices() == [0, 1]
    assert [r.utilization for r in history.of(1)] == [40.0, 40.0]
    assert history.labels == {0: "constant 0", 1: "constant 1"}
    assert history.readings[0].t_s <= history.readings[-1].t_s


def test_a_history_lists_a_labelled_device_that_has_no_reading_yet():
    history = History("process", labels={3: "device 3"}, readings=[Reading(0.0, 1, 5.0, 0)])
    assert history.devices() == [1, 3] and history.of(3) == []


def test_a_broken_display_does_not_stop_the_sampling():
    def broken(history):
        raise RuntimeError("comm closed")

    sampler = utilization.Sampler(utilization_sources.ProcessSource(psutil.Process().pid), 0.1, on_sample=broken)
    with pytest.warns(UserWarning, match="comm closed"):
        sampler.sample()
    sampler.sample()  # no second warning, no error
    assert sampler.on_sample is None


def test_a_sampler_refuses_an_interval_that_is_not_positive():
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        utilization.Sampler(utilization_sources.ProcessSource(psutil.Process().pid), interval_s=0)
