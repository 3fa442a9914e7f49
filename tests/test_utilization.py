"""course.utilization: NVML parsed (through a fake module), the summaries, a sampler that outlives its view."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import psutil
import pytest
from histories import history_of
from hypothesis import given
from hypothesis import strategies as st

from course import monitor, utilization
from course.utilization import Reading

pytestmark = pytest.mark.unit6


# ---- NVML, through a fake module: a unit test of the parsing, not a GPU measurement -------------------------

class FakeNvml:
    """pynvml's calls the sampler uses, answering for two GPUs."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.util, self.used = fail, [97, 3], [30 * 2**30, 2**30]

    def nvmlInit(self) -> None:
        if self.fail:
            raise self.fail

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"handle-{i}"

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        if self.util[int(handle[-1])] is None:
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=self.util[int(handle[-1])], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=self.used[int(handle[-1])], total=80 * 2**30, free=0)


def test_nvml_readings_are_parsed_per_gpu():
    source, note = utilization.source_for(psutil.Process().pid, emulated=False, nvml=FakeNvml())
    assert isinstance(source, utilization.NvmlSource) and note == ""
    assert source.read(1.5) == [Reading(1.5, 0, 97.0, 30 * 2**30), Reading(1.5, 1, 3.0, 2**30)]
    assert source.label(1) == "GPU 1 utilization (NVML)"


def test_a_gpu_nvml_cannot_read_is_left_out_not_made_up():
    nvml = FakeNvml()
    nvml.util[0] = None
    source = utilization.NvmlSource(nvml)
    assert source.read(0.0) == [Reading(0.0, 1, 3.0, 2**30)]


def test_without_a_driver_the_rank_processes_are_watched_and_the_note_says_so():
    source, note = utilization.source_for(psutil.Process().pid, emulated=False,
                                          nvml=FakeNvml(fail=RuntimeError("Driver Not Loaded")))
    assert isinstance(source, utilization.ProcessSource)
    assert "Driver Not Loaded" in note and "CPU%" in note


def test_emulated_gpus_are_never_read_through_nvml():
    source, note = utilization.source_for(psutil.Process().pid, emulated=True, nvml=FakeNvml())
    assert isinstance(source, utilization.ProcessSource) and note == ""


def test_the_real_nvml_fails_cleanly_on_a_machine_without_gpus():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    module, reason = utilization.open_nvml()
    assert module is None
    assert "NVML is not usable here" in reason or "not installed" in reason


# ---- summaries ---------------------------------------------------------------------------------------------

def test_summary_by_hand():
    history = history_of({0: [100, 80, 20, 0], 1: [0, 0, 0, 10]})
    history.labels[3] = "device 3"  # seen, never read
    s0, s1, s3 = utilization.summarize(history, threshold=50)
    assert (s0.mean_utilization, s0.busy_fraction, s0.peak_memory_bytes, s0.readings) == (50.0, 0.5, 1000, 4)
    assert (s1.mean_utilization, s1.busy_fraction, s1.peak_memory_bytes) == (2.5, 0.0, 100)
    assert (s3.device, s3.mean_utilization, s3.busy_fraction, s3.readings) == (3, 0.0, 0.0, 0)
    text = monitor.format_summary(history, threshold=50)
    assert "device 0: mean 50%, busy (>= 50%) 50% of 4 readings" in text
    assert "device 1: mean 2%" in text  # 2.5 rounds half to even


def test_busy_means_half_of_what_a_device_can_get():
    four = history_of({d: [0.0] for d in range(4)})
    assert utilization.busy_threshold(history_of({0: [0.0]}, kind="nvml")) == 50.0
    assert utilization.busy_threshold(four, cpu_count=2) == 25.0  # 4 processes on 2 cores: 50% each at most
    assert utilization.busy_threshold(four, cpu_count=8) == 50.0  # a core each, and to spare
    s0 = utilization.summarize(history_of({0: [30.0, 20.0], 1: [0.0], 2: [0.0], 3: [0.0]}))[0]
    assert s0.busy_threshold == utilization.busy_threshold(four) and s0.busy_fraction in (0.5, 1.0)


percent = st.floats(0, 400, allow_nan=False)


@given(st.dictionaries(st.integers(0, 7), st.lists(percent, min_size=1, max_size=30), min_size=1),
       st.floats(0, 400, allow_nan=False), st.floats(0, 400, allow_nan=False))
def test_summary_matches_the_definitions(values, threshold, higher):
    higher = max(threshold, higher)
    history = history_of(values)
    summaries = utilization.summarize(history, threshold)
    assert [s.device for s in summaries] == sorted(values)
    for s, stricter in zip(summaries, utilization.summarize(history, higher), strict=True):
        series = values[s.device]
        assert s.mean_utilization == pytest.approx(statistics.fmean(series))
        assert s.busy_fraction == sum(v >= threshold for v in series) / len(series)
        assert stricter.busy_fraction <= s.busy_fraction  # a higher bar is cleared less often


def test_a_broken_display_does_not_stop_the_sampling():
    def broken(history):
        raise RuntimeError("comm closed")

    sampler = utilization.Sampler(utilization.ProcessSource(psutil.Process().pid), 0.1, on_sample=broken)
    with pytest.warns(UserWarning, match="comm closed"):
        sampler.sample()
    sampler.sample()  # no second warning, no error
    assert sampler.on_sample is None
