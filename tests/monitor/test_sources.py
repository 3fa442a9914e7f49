"""course.monitor.sources: NVML parsed (through a fake module), real rank processes found and measured."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from processes import live_children

from course.monitor import sampling as utilization
from course.monitor import sources as utilization_sources
from course.monitor import summary as utilization_summary
from course.monitor.sampling import Reading
from course.runtime.process_tree import kill_tree

TREE = str(Path(__file__).with_name("monitor_tree.py"))


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
    source, note = utilization_sources.source_for(psutil.Process().pid, emulated=False, nvml=FakeNvml())
    assert isinstance(source, utilization_sources.NvmlSource) and note == ""
    assert source.read(1.5) == [Reading(1.5, 0, 97.0, 30 * 2**30), Reading(1.5, 1, 3.0, 2**30)]
    assert source.label(1) == "GPU 1 utilization (NVML)"


def test_a_gpu_nvml_cannot_read_is_left_out_not_made_up():
    nvml = FakeNvml()
    nvml.util[0] = None
    source = utilization_sources.NvmlSource(nvml)
    assert source.read(0.0) == [Reading(0.0, 1, 3.0, 2**30)]


def test_without_a_driver_the_rank_processes_are_watched_and_the_note_says_so():
    source, note = utilization_sources.source_for(psutil.Process().pid, emulated=False,
                                          nvml=FakeNvml(fail=RuntimeError("Driver Not Loaded")))
    assert isinstance(source, utilization_sources.ProcessSource)
    assert "Driver Not Loaded" in note and "CPU%" in note


def test_emulated_gpus_are_never_read_through_nvml():
    source, note = utilization_sources.source_for(psutil.Process().pid, emulated=True, nvml=FakeNvml())
    assert isinstance(source, utilization_sources.ProcessSource) and note == ""


def test_the_real_nvml_fails_cleanly_on_a_machine_without_gpus():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    module, reason = utilization_sources.open_nvml()
    assert module is None
    assert "NVML is not usable here" in reason or "not installed" in reason


# ---- processes emulating GPUs ------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_ranks_are_found_by_local_rank_and_a_busy_one_shows_high_cpu_a_sleeping_one_low():
    # rank 0 spins; rank 1 sleeps; rank 2 sleeps, its worker spins
    tree = subprocess.Popen([sys.executable, TREE, "-1", "busy", "sleep", "loader"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        root = psutil.Process(tree.pid)
        while len(ranks := utilization_sources.find_ranks(root)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(ranks) == [0, 1, 2]
        assert all(p.parent().pid == tree.pid for p in ranks.values())  # the rank, not its worker
        assert [p.cmdline()[-2] for p in ranks.values()] == ["busy", "sleep", "loader"]
        with utilization.Sampler(utilization_sources.ProcessSource(tree.pid), interval_s=0.4) as history:
            time.sleep(3.0)
    finally:
        kill_tree(tree)
    means = {s.device: s.mean_utilization for s in utilization_summary.summarize(history)}
    # Generous: two cores shared with other jobs (a load of 6 leaves a spinner ~25%, of 18 ~8%), a sleeper gets ~0.
    assert means[0] > 2 and means[2] > 2, means  # rank 2's worker's CPU counts for rank 2
    assert means[1] < 4, means
    assert min(means[0], means[2]) > 4 * means[1], means
    assert history.kind == "process"
    assert history.labels[1] == "CPU% of the process emulating GPU 1"
    assert all(r.memory_bytes > 1_000_000 for r in history.readings)  # a python process's RSS
    assert live_children() == []


def test_a_process_that_has_exited_is_refused_with_the_fix():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(ValueError, match="already exited"):
        utilization_sources.ProcessSource(dead.pid)
