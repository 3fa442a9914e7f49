"""course.runtime.process_tree: kill_tree returns only once the process and everything it started are gone."""

import signal
import subprocess
import sys

import psutil

from course.runtime import process_tree


def test_a_process_and_its_child_are_both_gone_when_kill_tree_returns():
    code = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n" \
           "print('up', flush=True)\ntime.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline() == "up\n"
    child = psutil.Process(parent.pid).children()[0]
    process_tree.kill_tree(parent)
    assert parent.returncode == -signal.SIGKILL
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_a_killed_child_that_left_the_tree_is_waited_for_and_a_new_process_on_its_pid_is_spared(monkeypatch):
    # the parent dies first and its child, handed to init, is no longer below it while it dies (slow under load)
    parent, child, looks = 100, 101, {"n": 0}
    signals: list[tuple[int, int]] = []

    def alive_since(pid):
        if pid != child:
            return None if signals else 7.0  # the parent goes at once
        looks["n"] += 1
        return 7.0 if looks["n"] <= 6 else None  # the child takes a few looks to die

    monkeypatch.setattr(process_tree, "_victims", lambda pid, *_: {parent, child} if not signals else set())
    monkeypatch.setattr(process_tree, "process_table", dict)
    monkeypatch.setattr(process_tree, "_alive_since", alive_since)
    monkeypatch.setattr(process_tree, "_signal", lambda pids, sig: signals.extend((p, sig) for p in sorted(pids)))
    process_tree.kill_tree(parent)
    assert signals.count((child, signal.SIGKILL)) >= 2 and looks["n"] > 6  # killed again until it was gone

    signals.clear()
    times = iter([7.0] + [8.0] * 100)  # the child's start time when first seen, then a new process's on its pid
    monkeypatch.setattr(process_tree, "_alive_since",
                        lambda pid: next(times) if pid == child else (None if signals else 7.0))
    process_tree.kill_tree(parent)
    assert signals.count((child, signal.SIGKILL)) == 1  # the new process is not a victim
