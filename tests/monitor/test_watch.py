"""course.monitor.watch: real runs watched to the end, timeouts and interruptions, and no process left behind.

The measurement is tested in test_sampling.py, test_sources.py and test_summary.py, the drawing in test_views.py
and test_summary_plot.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import rank_functions as rf
from processes import live_children

from course.monitor import watch as monitor
from course.runtime.launch import launch

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
def test_the_ranks_of_course_launch_are_watched(tmp_path):
    history = launch_watched_until_seen(2, tmp_path)
    assert history.devices() == [0, 1]
    assert live_children() == []


def launch_watched_until_seen(world_size: int, tmp_path: Path):
    """Launch ``world_size`` ranks under the monitor; they stay up until it has read every one (forked ranks can
    finish before a loaded sampler looks). Returns the history."""
    release, ranks = tmp_path / "release", list(range(world_size))

    def release_once_all_are_seen(history) -> None:
        deadline = time.monotonic() + 100
        while history.devices() != ranks and time.monotonic() < deadline:
            time.sleep(0.05)
        release.touch()

    with monitor.watch(None, interval_s=0.2, display=False) as history:
        releaser = threading.Thread(target=release_once_all_are_seen, args=(history,), daemon=True)
        releaser.start()
        assert launch(rf.stay_until, world_size, str(release), 110.0, timeout_s=120) == ranks
        releaser.join()
    return history


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


def test_bad_input_is_explained():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(ValueError, match="already exited"), monitor.watch(dead, display=False):
        pass
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        monitor.run_and_watch([sys.executable, "-c", "pass"], timeout_s=-1)
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        monitor.run_and_watch([sys.executable, "-c", "import time; time.sleep(60)"], interval_s=0)
    assert live_children() == []  # refused before it started anything


def test_ranks_forked_by_the_fork_server_are_found_in_start_order(tmp_path):
    launch(rf.identity, 1, "x", timeout_s=120)  # the fork server is up: these ranks are its children
    history = launch_watched_until_seen(3, tmp_path)
    assert history.devices() == [0, 1, 2]


def test_real_gpus_are_shown_even_when_the_ranks_are_emulated(monkeypatch, capsys):
    from test_sources import FakeNvml

    from course import world

    monkeypatch.setattr(world, "gpus_present", lambda: True)
    monkeypatch.setenv(world.EMULATE_ENV, "1")  # the ranks run on the CPU; the GPUs are still there
    with monitor.watch(None, interval_s=0.05, display=True, nvml=FakeNvml()) as history:
        time.sleep(0.2)
    assert history.kind == "nvml" and history.devices() == [0, 1]
    assert "COURSE_EMULATE=1 runs the ranks on the CPU" in capsys.readouterr().out


def test_without_gpus_the_rank_processes_are_shown(monkeypatch):
    from test_sources import FakeNvml

    from course import world

    monkeypatch.setattr(world, "gpus_present", lambda: False)
    with monitor.watch(None, interval_s=0.05, display=False, nvml=FakeNvml()) as history:
        time.sleep(0.1)
    assert history.kind == "process"
