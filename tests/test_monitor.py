"""course.utilization and course.monitor: real processes measured, NVML parsed, summaries, widgets, cleanup."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import psutil
import pytest
import rank_functions as rf
from hypothesis import given
from hypothesis import strategies as st
from processes import live_children

from course import monitor, utilization
from course.launch import kill_tree, launch
from course.utilization import History, Reading

matplotlib.use("Agg")

pytestmark = pytest.mark.unit6

TREE = str(Path(__file__).with_name("monitor_tree.py"))


def _tree(seconds: float, *roles: str, pid_file: Path | None = None) -> subprocess.Popen:
    env = None if pid_file is None else {**os.environ, "MONITOR_TREE_PIDS": str(pid_file)}
    return subprocess.Popen([sys.executable, TREE, str(seconds), *roles], env=env, start_new_session=True)


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _pids(pid_file: Path, expected: int, timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []
        if len(pids) >= expected:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"expected {expected} processes to start, saw {pids}")


# ---- measuring real processes -----------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_ranks_are_found_by_local_rank_and_a_busy_one_shows_high_cpu_a_sleeping_one_low():
    tree = _tree(-1, "busy", "sleep", "loader")  # rank 0 spins; rank 1 sleeps; rank 2 sleeps, its worker spins
    try:
        deadline = time.monotonic() + 30
        while len(ranks := utilization.find_ranks(psutil.Process(tree.pid))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(ranks) == [0, 1, 2]
        assert all(p.parent().pid == tree.pid for p in ranks.values())  # the rank, not its worker
        assert [p.cmdline()[-2] for p in ranks.values()] == ["busy", "sleep", "loader"]
        with utilization.Sampler(utilization.ProcessSource(tree.pid), interval_s=0.4) as history:
            time.sleep(3.0)
    finally:
        kill_tree(tree)
    means = {s.device: s.mean_utilization for s in utilization.summarize(history)}
    # Generous: two cores shared with other jobs (a load of 6 leaves a spinner ~25%), but a sleeper gets ~0.
    assert means[0] > 8 and means[2] > 8, means  # rank 2's worker's CPU counts for rank 2
    assert means[1] < 4, means
    assert min(means[0], means[2]) > 4 * means[1], means
    assert history.kind == "process"
    assert history.labels[1] == "CPU% of the process emulating GPU 1"
    assert all(r.memory_bytes > 1_000_000 for r in history.readings)  # a python process's RSS
    assert live_children() == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_real_torchrun_job_is_watched_to_the_end():
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run = monitor.run_and_watch([*torchrun, TREE, "--act", "busy", "3"], timeout_s=150, interval_s=0.3,
                                display=False)
    assert run.returncode == 0, run.stderr
    assert run.history.devices() == [0, 1]
    assert all(s.mean_utilization > 5 for s in run.summary()), run.summary()  # both spun (on shared cores)
    assert live_children() == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_ranks_of_course_launch_are_watched():
    with monitor.watch(None, interval_s=0.2, display=False) as history:
        launch(rf.identity, 2, "x", timeout_s=120)
    assert history.devices() == [0, 1]
    assert live_children() == []


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

def _history(values: dict[int, list[float]], kind: str = "process") -> History:
    history = History(kind=kind)
    for device, series in values.items():
        history.labels[device] = f"device {device}"
        history.readings += [Reading(0.5 * i, device, v, int(10 * v)) for i, v in enumerate(series)]
    history.readings.sort(key=lambda r: r.t_s)
    return history


def test_summary_by_hand():
    history = _history({0: [100, 80, 20, 0], 1: [0, 0, 0, 10]})
    history.labels[3] = "device 3"  # seen, never read
    s0, s1, s3 = utilization.summarize(history, threshold=50)
    assert (s0.mean_utilization, s0.busy_fraction, s0.peak_memory_bytes, s0.readings) == (50.0, 0.5, 1000, 4)
    assert (s1.mean_utilization, s1.busy_fraction, s1.peak_memory_bytes) == (2.5, 0.0, 100)
    assert (s3.device, s3.mean_utilization, s3.busy_fraction, s3.readings) == (3, 0.0, 0.0, 0)
    text = monitor.format_summary(history, threshold=50)
    assert "device 0: mean 50%, busy (>= 50%) 50% of 4 readings" in text
    assert "device 1: mean 2%" in text  # 2.5 rounds half to even


def test_busy_means_half_of_what_a_device_can_get():
    four = _history({d: [0.0] for d in range(4)})
    assert utilization.busy_threshold(_history({0: [0.0]}, kind="nvml")) == 50.0
    assert utilization.busy_threshold(four, cpu_count=2) == 25.0  # 4 processes on 2 cores: 50% each at most
    assert utilization.busy_threshold(four, cpu_count=8) == 50.0  # a core each, and to spare
    s0 = utilization.summarize(_history({0: [30.0, 20.0], 1: [0.0], 2: [0.0], 3: [0.0]}))[0]
    assert s0.busy_threshold == utilization.busy_threshold(four) and s0.busy_fraction in (0.5, 1.0)


percent = st.floats(0, 400, allow_nan=False)


@given(st.dictionaries(st.integers(0, 7), st.lists(percent, min_size=1, max_size=30), min_size=1),
       st.floats(0, 400, allow_nan=False), st.floats(0, 400, allow_nan=False))
def test_summary_matches_the_definitions(values, threshold, higher):
    higher = max(threshold, higher)
    history = _history(values)
    summaries = utilization.summarize(history, threshold)
    assert [s.device for s in summaries] == sorted(values)
    for s, stricter in zip(summaries, utilization.summarize(history, higher), strict=True):
        series = values[s.device]
        assert s.mean_utilization == pytest.approx(statistics.fmean(series))
        assert s.busy_fraction == sum(v >= threshold for v in series) / len(series)
        assert stricter.busy_fraction <= s.busy_fraction  # a higher bar is cleared less often


# ---- the view ----------------------------------------------------------------------------------------------

def test_sparkline():
    assert monitor.sparkline([0, 50, 100, 150]) == " ▄██"
    assert monitor.sparkline(range(100), width=5) == "███████"[:5]
    assert len(monitor.sparkline([10] * 100, width=40)) == 40


def test_the_widget_is_built_and_updated_without_a_frontend():
    view = monitor.LiveView("process")
    view.update(_history({0: [100, 250], 1: [30]}))
    assert sorted(view.rows) == [0, 1]
    bar, numbers, spark = view.rows[0]
    assert bar.value == 100.0  # 250% (more than one core) fills the bar
    assert "250%" in numbers.value and "MiB" in numbers.value
    assert "██" in spark.value
    assert "Not a GPU measurement" in view.header.value
    assert "NVML" in monitor.LiveView("nvml").header.value
    assert len(view.panel.children) == 3  # the header and one row per device


def test_the_text_view_prints_a_line_every_few_seconds(capsys):
    view = monitor.TextView("process", every_s=1.0)
    history = History(kind="process")
    for t_s in (0.0, 0.5, 1.0, 1.5):
        history.readings.append(Reading(t_s, 0, 99.0, 2**20))
        view.update(history)
    out = capsys.readouterr().out.splitlines()
    assert "Not a GPU measurement" in out[0]
    assert out[1:] == ["   0.0 s | GPU 0   99%     1 MiB", "   1.0 s | GPU 0   99%     1 MiB"]


def test_the_timeline_has_a_row_per_device():
    import matplotlib.pyplot as plt

    fig = monitor.plot_timeline(_history({0: [100, 0], 1: [0, 0], 2: [5, 5]}))
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel() == "GPU 2"
    plt.close(fig)


# ---- running, timeouts, interruptions, bad input -----------------------------------------------------------

def test_run_and_watch_returns_what_subprocess_run_would():
    run = monitor.run_and_watch([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], display=False)
    assert (run.returncode, run.stdout, run.stderr) == (3, "out\n", "")


ORPHAN = """import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # holds the pipes
print(child.pid)"""


@pytest.mark.timeout(120)
def test_a_process_orphaned_by_a_clean_exit_is_not_left_behind():
    run = monitor.run_and_watch([sys.executable, "-c", ORPHAN], display=False, timeout_s=60)
    assert run.returncode == 0 and _gone([int(run.stdout)])


@pytest.mark.timeout(120)
def test_a_timeout_kills_the_whole_tree(tmp_path):
    pid_file = tmp_path / "pids"
    env = {**os.environ, "MONITOR_TREE_PIDS": str(pid_file)}
    with pytest.raises(subprocess.TimeoutExpired):
        monitor.run_and_watch([sys.executable, TREE, "-1", "sleep", "loader"], env=env, timeout_s=5,
                              display=False)
    pids = pid_file.read_text().split()
    assert len(pids) == 4, pids  # the launcher, two ranks, one worker: all started before the timeout
    assert _gone([int(p) for p in pids])
    assert live_children() == []


@pytest.mark.timeout(120)
def test_an_interrupted_watch_kills_the_whole_tree(tmp_path):
    tree = _tree(-1, "sleep", "loader", pid_file=tmp_path / "pids")
    pids = _pids(tmp_path / "pids", 4)
    with pytest.raises(KeyboardInterrupt), monitor.watch(tree, display=False):
        raise KeyboardInterrupt
    assert _gone(pids) and tree.returncode is not None
    assert live_children() == []


@pytest.mark.timeout(120)
def test_ctrl_c_during_run_and_watch_kills_the_whole_tree(tmp_path):
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    pid_file = tmp_path / "pids"
    env = {**os.environ, "MONITOR_TREE_PIDS": str(pid_file)}
    previous = signal.signal(signal.SIGUSR1, interrupt)
    # Ctrl-C once the whole tree is up (SIGUSR1 stands in for SIGINT, which pytest handles itself).
    waiter = threading.Thread(target=lambda: (_pids(pid_file, 4), os.kill(os.getpid(), signal.SIGUSR1)))
    try:
        waiter.start()
        with pytest.raises(KeyboardInterrupt):
            monitor.run_and_watch([sys.executable, TREE, "-1", "sleep", "loader"], env=env, timeout_s=60,
                                  display=False)
    finally:
        waiter.join()
        signal.signal(signal.SIGUSR1, previous)
    assert _gone([int(p) for p in pid_file.read_text().split()])
    assert live_children() == []


def test_a_broken_display_does_not_stop_the_sampling():
    def broken(history):
        raise RuntimeError("comm closed")

    sampler = utilization.Sampler(utilization.ProcessSource(psutil.Process().pid), 0.1, on_sample=broken)
    with pytest.warns(UserWarning, match="comm closed"):
        sampler.sample()
    sampler.sample()  # no second warning, no error
    assert sampler.on_sample is None


def test_bad_input_is_explained():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(ValueError, match="already exited"):
        utilization.ProcessSource(dead.pid)
    with pytest.raises(ValueError, match="already exited"), monitor.watch(dead, display=False):
        pass
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        utilization.Sampler(utilization.ProcessSource(psutil.Process().pid), interval_s=0)
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        monitor.run_and_watch([sys.executable, "-c", "pass"], timeout_s=-1)
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        monitor.run_and_watch([sys.executable, "-c", "import time; time.sleep(60)"], interval_s=0)
    assert live_children() == []  # refused before it started anything
