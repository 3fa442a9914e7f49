"""course.runtime: one run() with a capped reader, one tree kill, one classifier of how a run ended."""

import signal
import sys
import threading

import psutil
import pytest
from processes import live_children

from course.runtime import outcome, process
from course.runtime.outcome import Limits


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_finished_run_keeps_its_exit_code_and_both_streams():
    done = process.run(python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"), 30)
    assert (done.status, done.returncode, done.stdout, done.stderr) == ("error", 3, "out\n", "err\n")
    assert "exited with code 3" in done.detail
    assert process.run(python("pass"), 30).status == "ok"


def test_a_timeout_stops_the_command_and_what_it_started_even_outside_its_tree():
    # the grandchild is orphaned (its parent exits at once): it left the tree, only its process group finds it
    code = ("import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\n"
            "print(os.getpid(), flush=True)\ntime.sleep(60)")
    done = process.run(python(code), 2)
    assert (done.status, done.returncode) == ("timeout", None)
    assert "2 s" in done.detail
    assert live_children() == []
    assert [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == python(code)] == []


def test_the_output_kept_is_a_head_and_a_tail_with_the_dropped_size_between():
    done = process.run(python("print('head'); print('x' * 10000); print('the end')"), 30, capture=1000)
    assert done.stdout.startswith("head\nxxx") and done.stdout.endswith("xxx\nthe end\n")
    dropped = int(done.stdout.split("[")[1].split()[0])
    assert dropped == len("head\n") + 10001 + len("the end\n") - 1000


def test_a_limit_the_watchdog_sees_broken_stops_the_run_with_its_status():
    done = process.run(python("import sys\nwhile True: sys.stdout.write('flood ' * 1000)"), 30,
                       Limits(output_bytes=1000, max_output_bytes=2**20))
    assert done.status == "output limit" and "print on rank 0 only" in done.detail


def test_a_stop_request_asks_the_command_to_end_first():
    code = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: (print('bye', flush=True), "
            "sys.exit(0)))\nprint('up', flush=True)\ntime.sleep(60)")
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    done = process.run(python(code), 30, stop=stop)
    assert (done.status, done.stdout) == ("interrupted", "up\nbye\n")


@pytest.mark.parametrize(("returncode", "stderr", "status"), [
    (0, "", "ok"),
    (1, "MemoryError", "out of memory"),
    (1, "RuntimeError: std::bad_alloc", "out of memory"),
    (-signal.SIGXFSZ, "", "file too large"),
    (-signal.SIGXCPU, "", "cpu limit"),
    (1, "BlockingIOError: [Errno 11] Resource temporarily unavailable\n  os.fork()", "too many processes"),
    (1, "RuntimeError: can't start new thread", "too many processes"),
    (-signal.SIGKILL, "", "error"),
    (2, "Traceback", "error"),
    (None, "", "error"),
])
def test_how_a_run_ended_is_classified_once_for_course_and_grader(returncode, stderr, status):
    assert outcome.classify(returncode, stderr)[0] == status
    if status in ("out of memory", "too many processes"):
        assert outcome.resource_error(stderr) == status


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        process.run(python("pass"), 0)
    with pytest.raises(ValueError, match="non-empty list of strings"):
        process.run([], 10)


def test_finish_together_stops_the_blocked_ranks_once_none_makes_progress_saying_why():
    # rank 1 fails at once; ranks 0 and 2 would sleep a minute (no CPU), and each has a child that must go with it
    sleepers = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"
    runs = [process.Running(python(code), new_session=False) for code in (sleepers, "import sys; sys.exit(1)",
                                                                          sleepers)]
    stopped = process.finish_together(runs, window_s=1.0)
    assert stopped == {0: "stopped after rank 1 failed", 2: "stopped after rank 1 failed"}
    assert [run.process.returncode for run in runs] == [-signal.SIGKILL, 1, -signal.SIGKILL]
    assert live_children() == []


BUSY = "import time\nend = time.process_time() + {cpu_s}\nwhile time.process_time() < end: pass"


def test_finish_together_waits_for_a_rank_that_is_behind_but_working():
    # rank 0 ends at once; rank 1 computes for 3 s of CPU, three times the no-progress window: it is slow, not stuck,
    # however long the machine takes to give it those 3 s
    runs = [process.Running(python(code), new_session=False) for code in ("pass", BUSY.format(cpu_s=3.0))]
    assert process.finish_together(runs, window_s=1.0) == {}
    assert [run.process.returncode for run in runs] == [0, 0]


def test_finish_together_stops_ranks_that_are_all_blocked_even_when_none_has_ended():
    # a deadlock: nobody ends, nobody moves; stopped after the window, not at a time limit
    runs = [process.Running(python("import time; time.sleep(600)"), new_session=False) for _ in range(2)]
    assert process.finish_together(runs, window_s=1.0) == {0: "hang", 1: "hang"}
    assert live_children() == []


def test_finish_together_counts_output_and_events_as_progress():
    # a rank that prints every half second, or reports events, makes progress with next to no CPU
    printer = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)"
    runs = [process.Running(python(code), new_session=False) for code in ("pass", printer)]
    assert process.finish_together(runs, window_s=2.0) == {}
    counted = iter(range(10**6))
    runs = [process.Running(python(code), new_session=False) for code in ("pass", "import time; time.sleep(4)")]
    assert process.finish_together(runs, window_s=2.0, events=lambda: {1: next(counted)}) == {}


def test_finish_together_lets_every_rank_end_by_itself_and_stops_all_at_once_on_request():
    runs = [process.Running(python("pass"), new_session=False) for _ in range(3)]
    assert process.finish_together(runs, window_s=30) == {}
    assert [run.process.returncode for run in runs] == [0, 0, 0]
    stop = threading.Event()
    stop.set()
    runs = [process.Running(python("import time; time.sleep(60)"), new_session=False) for _ in range(2)]
    assert process.finish_together(runs, window_s=30, stop=stop) == {0: "interrupted", 1: "interrupted"}
    hung = [process.Running(python(code), new_session=False) for code in ("pass", "import time; time.sleep(60)")]
    assert process.finish_together(hung, window_s=0.5) == {1: "hang"}
    assert live_children() == []


def test_a_capture_of_head_and_tail_keeps_exactly_those():
    run = process.Running(python("print('h' * 100 + 't' * 50, end='')"), capture=(10, 5), new_session=False)
    process.finish_together([run], window_s=30)
    assert run.stdout.text() == "h" * 10 + "\n[135 bytes of output dropped here]\n" + "t" * 5


def test_commands_run_together_end_together_when_one_fails(tmp_path):
    up = tmp_path / "up"  # the peer fails only once the waiting node is up: no race on who starts first
    failing = python(f"import os, sys, time\nwhile not os.path.exists({str(up)!r}): time.sleep(0.05)\n"
                     "print('gone', file=sys.stderr); sys.exit(3)")
    waiting = python(f"import pathlib, time; print('up', flush=True); pathlib.Path({str(up)!r}).touch(); "
                     "time.sleep(600)")  # a node waiting for its dead peer
    first, second = process.run_together([failing, waiting], 100)
    assert (first.status, first.returncode, first.stderr.strip()) == ("error", 3, "gone")
    assert second.status == "interrupted" and second.stdout.strip() == "up"
    assert second.elapsed_s < 120  # stopped, not waited for: its own sleep is 600 s, run_together's limit 100 s


def test_commands_run_together_keep_each_ones_output_and_environment():
    env = {"PATH": "/usr/bin:/bin"}
    outcomes = process.run_together([python("import os; print(os.environ.get('NODE'))")] * 2, 60,
                                    envs=[{**env, "NODE": "0"}, {**env, "NODE": "1"}])
    assert [(o.status, o.stdout.strip()) for o in outcomes] == [("ok", "0"), ("ok", "1")]


def test_commands_run_together_stop_all_at_the_time_limit():
    statuses = [o.status for o in process.run_together([python("import time; time.sleep(120)")] * 2, 2)]
    assert "timeout" in statuses and set(statuses) <= {"timeout", "interrupted"}  # the second may be stopped first
    with pytest.raises(ValueError, match="at least one command"):
        process.run_together([], 10)


# a parent that wrote 64 MiB, then 7 forks of it that never write: 8 x 64 MiB by each process's own count
FORKS_OF_A_BIG_PARENT = (
    "import os, time\n"
    "heap = bytearray(64 * 2**20)\n"
    "for i in range(0, len(heap), 4096):\n    heap[i] = 1\n"
    "for _ in range(7):\n"
    "    if os.fork() == 0:\n        time.sleep(3)\n        os._exit(0)\n"
    "for _ in range(7):\n    os.wait()\n")


def test_pages_that_forks_share_count_once_against_the_memory_limit():
    done = process.run(python(FORKS_OF_A_BIG_PARENT), 60, Limits(memory_total_bytes=256 * 2**20, wall_s=60))
    assert (done.status, done.returncode) == ("ok", 0), done.detail


def test_memory_that_forks_write_themselves_counts_for_each():
    written = FORKS_OF_A_BIG_PARENT.replace("time.sleep(3)", "heap[:] = b'y' * len(heap)\n        time.sleep(3)")
    done = process.run(python(written), 60, Limits(memory_total_bytes=256 * 2**20, wall_s=60))
    assert done.status == "out of memory"
