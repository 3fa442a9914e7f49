"""course.runtime.rank_stacks: a faulthandler dump read for the collective a rank waits in; a live process asked."""

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from course.runtime import rank_stacks

MAIN, OTHER = 0x7F00AA, 0x7F00BB


def dump(main_frames: list[tuple[str, str]], other_frames: list[tuple[str, str]] = ()) -> str:
    """A dump as faulthandler writes it (innermost frame first), after answer_requests' first line."""
    def thread(ident: int, current: bool, frames) -> list[str]:
        head = f"{'Current thread' if current else 'Thread'} {ident:#x} (most recent call first):"
        return [head, *(f'  File "{path}", line 7 in {name}' for path, name in frames)]

    return "\n".join([f"main thread {MAIN:#x}", *thread(OTHER, False, other_frames), "",
                      *thread(MAIN, True, main_frames)]) + "\n"


TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def test_the_innermost_frame_of_the_main_thread_names_the_collective():
    stacks = dump([(TORCH, "all_reduce"), (TORCH, "wrapper"), ("/course/train.py", "step")])
    assert rank_stacks.collective_in(stacks) == "all_reduce"


def test_the_interceptors_wrapper_around_torchs_wait_is_passed_over():
    # all_reduce calls work.wait(), which the one interceptor wraps (course.runtime.waits listens to it)
    stacks = dump([(rank_stacks._INTERCEPTOR, "intercepted"), (TORCH, "all_reduce"), ("/course/train.py", "step")])
    assert rank_stacks.collective_in(stacks) == "all_reduce"


def test_a_rank_outside_torch_distributed_is_not_waiting():
    assert rank_stacks.collective_in(dump([("/usr/lib/python3.11/time.py", "sleep"), (TORCH, "all_reduce")])) is None


def test_only_the_main_thread_counts():
    # a helper thread parked in a collective does not make the rank a waiter
    stacks = dump([("/course/train.py", "loop")], other_frames=[(TORCH, "barrier")])
    assert rank_stacks.collective_in(stacks) is None


def test_an_empty_or_foreign_file_says_nothing():
    assert rank_stacks.collective_in("") is None
    assert rank_stacks.collective_in("Thread 0x1 (most recent call first):\n") is None


@pytest.mark.timeout(60)
def test_a_live_process_answers_and_a_sleeping_one_is_not_in_a_collective(tmp_path):
    stacks = tmp_path / "rank-0.stacks"
    script = textwrap.dedent(f"""
        import sys, time
        from course.runtime import rank_stacks
        rank_stacks.answer_requests({str(stacks)!r})
        print("ready", flush=True)
        time.sleep(60)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "ready\n"
        found = rank_stacks.where_blocked([SimpleNamespace(pid=process.pid)], [0], str(tmp_path))
        assert found == {}
        text = stacks.read_text()
        assert "most recent call first" in text and "in <module>" in text
    finally:
        process.kill()
        process.wait()
