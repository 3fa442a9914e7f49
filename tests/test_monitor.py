"""course.monitor: real processes measured while they run, the views, and no process left behind.

The pure parts of the measurement (NVML parsing, summaries) are tested in test_utilization.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib
import psutil
import pytest
import rank_functions as rf
from histories import history_of
from processes import live_children

from course import monitor, utilization
from course.runtime.launch import launch
from course.runtime.process_tree import kill_tree
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
    # Generous: two cores shared with other jobs (a load of 6 leaves a spinner ~25%, of 18 ~8%), a sleeper gets ~0.
    assert means[0] > 2 and means[2] > 2, means  # rank 2's worker's CPU counts for rank 2
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


# ---- the view ----------------------------------------------------------------------------------------------

def test_sparkline():
    assert monitor.sparkline([0, 50, 100, 150]) == " ▄██"
    assert monitor.sparkline(range(100), width=5) == "███████"[:5]
    assert len(monitor.sparkline([10] * 100, width=40)) == 40


def _blocks(html: str) -> str:
    """The sparkline characters of a view's HTML, tags removed."""
    return re.sub(r"<[^>]+>", "", html)


def test_the_widget_is_built_and_updated_without_a_frontend(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    view = monitor.LiveView("process")
    view.update(history_of({0: [100, 250], 1: [30]}))
    assert sorted(view.rows) == [0, 1]
    bar, numbers, spark = view.rows[0]
    assert (bar.value, bar.max) == (100.0, 100.0)  # 2 processes on 2 cores: a core each; 250% fills the bar
    assert "250%" in numbers.value and "MiB" in numbers.value
    assert _blocks(spark.value) == "██"
    assert "Not a GPU measurement" in view.header.value
    assert "NVML" in monitor.LiveView("nvml").header.value
    assert len(view.panel.children) == 3  # the header and one row per device


def test_emulated_gpus_are_drawn_against_their_share_of_the_cores_busy_green_idle_grey(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    history = history_of({0: [50, 50], 1: [2, 2], 2: [48, 5], 3: [50, 50]})  # 4 ranks on 2 cores: 50% each at most
    view = monitor.LiveView("process")
    view.update(history)
    bar, _, spark = view.rows[0]
    assert (bar.value, bar.max, bar.bar_style) == (50.0, 50.0, "success")
    assert view.rows[1][0].bar_style == ""
    assert _blocks(spark.value) == "██" and _blocks(view.rows[1][2].value) == "  "
    assert spark.value.count("#2a8c3c") == 2 and view.rows[2][2].value.count("#9a9a9a") == 1


def test_a_finished_run_leaves_a_static_summary_that_survives_saving(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    history = history_of({0: [100] * 200, 1: [0] * 100 + [100] * 100})  # 2 ranks on 2 cores: a core each
    html = monitor.static_html(history, 12.34)
    assert html.startswith("<div><b>finished after 12.3 s.</b>") and "scaled to 100%" in html
    rows = html.split("<tr>")[1:]
    assert "busy 100% of the time" in rows[0] and "busy 50% of the time" in rows[1]
    assert _blocks(rows[1].split("<code>")[1]) == " " * 30 + "█" * 30  # the whole run in 60 characters
    view = monitor.LiveView("process")
    view.show()
    view.finish(history, 12.34, stopped=True)
    assert "stopped after 12.3 s" in view.header.value


def test_the_text_view_says_when_the_run_ended(capsys):
    monitor.TextView("process").finish(History(kind="process"), 3.0)
    assert capsys.readouterr().out.splitlines()[-1] == "finished after 3.0 s"


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

    fig = monitor.plot_timeline(history_of({0: [100, 0], 1: [0, 0], 2: [5, 5]}))
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
