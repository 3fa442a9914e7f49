"""course.runtime.forked: a fork running a function starts as a fresh program would, and is watched like one."""

import atexit
import os
import signal
import subprocess
import sys
import time

from course.runtime import process
from course.runtime.forked import Forked

PIPES = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}


def run(target, **kwargs) -> tuple[int, str, str]:
    child = Forked(target, **{**PIPES, **kwargs})
    out, err = child.communicate(timeout=60)
    return child.returncode, out.decode(), err.decode()


def test_the_exit_code_is_what_the_function_returned_or_exited_with():
    assert run(lambda: 7)[0] == 7
    assert run(lambda: None)[0] == 0
    assert run(lambda: sys.exit(4))[0] == 4
    assert run(lambda: sys.exit("bye"))[0] == 1


def test_an_exception_exits_1_with_its_traceback_on_the_childs_stderr():
    def fail():
        raise ValueError("planted")

    code, _, err = run(fail)
    assert code == 1
    assert "Traceback" in err and "ValueError: planted" in err


def test_the_child_has_exactly_the_given_environment_and_streams():
    def show():
        print(sorted(os.environ.items()))
        print("to stderr", file=sys.stderr)

    code, out, err = run(show, env={"ONLY": "this"})
    assert (code, out, err) == (0, "[('ONLY', 'this')]\n", "to stderr\n")


def open_fds() -> list[int]:
    def is_open(fd: int) -> bool:
        try:
            os.fstat(fd)
        except OSError:
            return False
        return True

    return [fd for fd in range(1024) if is_open(fd)]


def test_the_child_keeps_only_the_standard_streams_and_pass_fds():
    kept_r, kept_w = os.pipe()
    other_r, other_w = os.pipe()
    try:
        code, out, _ = run(lambda: print(open_fds()), pass_fds=(kept_w,))
    finally:
        for fd in (kept_r, kept_w, other_r, other_w):
            os.close(fd)
    assert (code, out) == (0, f"{[0, 1, 2, kept_w]}\n")


def test_the_parents_signal_handlers_and_exit_handlers_are_not_the_childs():
    ran = []
    previous = signal.signal(signal.SIGTERM, lambda *_: ran.append("handler"))
    marker = "parent's atexit ran in the child"
    atexit.register(print, marker)
    try:
        child = Forked(lambda: time.sleep(60), **PIPES)
        time.sleep(0.5)
        child.terminate()
        out, _ = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGTERM  # the default action, not the parent's handler
        assert run(lambda: 0)[1] == ""  # and at a normal exit no handler of the parent's printed anything
    finally:
        signal.signal(signal.SIGTERM, previous)
        atexit.unregister(print)
    assert ran == [] and marker.encode() not in out


def test_a_fork_is_watched_like_a_command_output_and_all():
    forks = [Forked(lambda i=i: print(f"rank {i}") or i, **PIPES) for i in range(3)]
    runs = [process.Running.of(fork, capture=(1024, 1024), new_session=False) for fork in forks]
    assert process.finish_together(runs, window_s=30) == {}
    assert [(r.process.returncode, r.stdout.text()) for r in runs] == [(i, f"rank {i}\n") for i in range(3)]
