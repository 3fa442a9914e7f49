"""course.runtime.launch: results in rank order, failures and hangs named by rank, nothing left behind."""


import ast
import operator
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import rank_functions as rf
import torch
from processes import live_children

from course.runtime import fork_server
from course.runtime import launch as launch_module
from course.runtime.launch import RankFailed, RankTimeout, launch
from course.runtime.pace import Pace

pytestmark = pytest.mark.slow


def test_results_come_back_in_rank_order():
    assert launch(rf.identity, 3, "x", timeout_s=60) == [(0, "x"), (1, "x"), (2, "x")]
    assert live_children() == []


def test_the_launching_process_serves_the_rendezvous_so_no_other_job_can_take_its_port():
    # Rank 0 used to serve it, on a port found free a moment before: another job sometimes took the port first.
    assert launch(rf.rendezvous_listener, 2, timeout_s=60) == [[os.getpid()], [os.getpid()]]


def test_a_numpy_integer_world_size_is_accepted():
    assert launch(rf.identity, np.int64(2), "x", timeout_s=60) == [(0, "x"), (1, "x")]


def test_a_plan_launches_its_world_size_and_says_so_on_a_gpu_machine(monkeypatch, capsys):
    from course import world

    two_gpus = world.Hardware(gpu_names=("Simulated T4",) * 2, cpu_count=2)
    monkeypatch.setattr(world, "detect_hardware", lambda: two_gpus)
    chosen = world.plan(3, (3,))  # a lesson that needs 3 ranks: more than the GPUs, so emulated on gloo
    assert launch(rf.identity, chosen, "x", timeout_s=60) == [(0, "x"), (1, "x"), (2, "x")]
    assert capsys.readouterr().out.splitlines()[0] == f"launch: {chosen.sentence}"


def test_tensor_results_arrive_by_value():
    results = launch(rf.rank_tensor, 2, 100_000, timeout_s=60)
    assert [r.sum().item() for r in results] == [0.0, 100_000.0]


def test_ranks_leave_the_group_together_before_launch_returns(tmp_path, capfd):
    # Killing a rank that has reported while a peer is still in shutdown's barrier printed a gloo traceback.
    assert launch(rf.slow_to_leave, 2, str(tmp_path), timeout_s=60) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["left-0", "left-1"]
    assert "Traceback" not in capfd.readouterr().err


def test_every_rank_gets_its_own_copy_of_the_arguments():
    # The spawn context's pickler would share tensor memory between the caller and all ranks.
    tensor = torch.zeros(3)
    assert launch(rf.add_rank_in_place, 2, tensor, timeout_s=60) == [3.0, 6.0]
    assert tensor.tolist() == [0.0, 0.0, 0.0]


def test_arguments_that_cannot_be_pickled_are_refused_clearly():
    with pytest.raises(TypeError, match="cannot be pickled"):
        launch(rf.identity, 2, threading.Lock(), timeout_s=60)
    assert live_children() == []


def test_the_echo_of_a_failure_on_the_other_ranks_is_counted_not_shown(capfd):
    with pytest.raises(RankFailed) as caught:
        launch(rf.noisy_when_a_peer_fails, 3, 1, timeout_s=60)
    assert caught.value.rank == 1 and "fails on purpose" in str(caught.value)
    err = capfd.readouterr().err
    assert "echo of the failure" not in err  # when it was written in time, a "[rank k] (1 line(s) ...)" stands in


def test_output_is_prefixed_by_rank(capsys):
    launch(rf.print_lines, 2, timeout_s=60)
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == ["[rank 0] first line", "[rank 0] second", "[rank 1] first line", "[rank 1] second"]


def test_a_crashing_rank_is_named_and_the_others_are_stopped():
    with pytest.raises(RankFailed) as caught:
        launch(rf.crash_on, 4, 2, timeout_s=60)
    assert caught.value.rank == 2
    assert "ZeroDivisionError: deliberate failure on rank 2" in str(caught.value)
    assert live_children() == []


def test_a_hanging_rank_is_named_once_nobody_makes_progress(short_window):
    # however loaded the machine: ranks still starting use CPU, so only a rank asleep while the others wait is stuck
    with pytest.raises(RankTimeout) as caught:
        launch(rf.hang_on, 3, 1, timeout_s=600)
    assert live_children() == []
    assert caught.value.ranks == [1] and caught.value.idle_s == short_window
    assert caught.value.waiting == {0: "finished", 2: "finished"}
    assert "rank(s) 1 made no progress for 5 s (no processor time used) (ranks 0, 2 had finished and were waiting " \
           "for it)" in str(caught.value)


def test_a_hanging_rank_is_told_apart_from_the_peers_waiting_for_it_in_a_collective(short_window):
    with pytest.raises(RankTimeout) as caught:
        launch(rf.sleep_while_peers_all_reduce, 4, 1, timeout_s=600)
    assert live_children() == []
    assert caught.value.ranks == [1]
    assert caught.value.waiting == {0: "all_reduce", 2: "all_reduce", 3: "all_reduce"}
    assert "rank(s) 1 made no progress for 5 s (no processor time used) (ranks 0, 2, 3 were waiting for it in " \
           "all_reduce)" in str(caught.value)


def test_a_rank_that_is_slow_but_working_is_waited_for(short_window):
    # rank 1 computes for 8 s of CPU while the others wait in all_reduce: longer than the window, yet no hang
    assert launch(rf.busy_while_peers_all_reduce, 3, 1, 8.0, timeout_s=600) == [0, 1, 2]


def test_the_time_limit_says_when_the_machine_made_it_longer(monkeypatch):
    monkeypatch.setattr(launch_module, "machine_pace", lambda: Pace(2.0, 0.28))
    with pytest.raises(RankTimeout) as caught:  # a lone rank asleep: nobody waits for it, so the limit decides
        launch(rf.hang_on, 1, 0, timeout_s=3)
    assert caught.value.idle_s is None
    assert str(caught.value).startswith("rank(s) 0 did not finish within 6 s (the usual 3 s times 2.0, because this "
                                        "machine ran a fixed test 2.0 times slower than usual (other programs were "
                                        "using its processors)), and every rank was stopped.")


def test_ranks_all_stuck_in_collectives_are_all_named():
    # Ranks that called different collectives each wait for the others: nobody is outside a collective to blame.
    error = RankTimeout([0, 1], 5, {0: "all_reduce", 1: "barrier", 2: "finished"})
    assert str(error).startswith(
        "rank(s) 0, 1 did not finish within 5 s (rank 0 was waiting in all_reduce, a collective no other rank "
        "joined; rank 1 was waiting in barrier, a collective no other rank joined; rank 2 had finished and was "
        "waiting for them)")


def test_a_stretched_time_limit_is_said_to_a_tenth_of_a_second():
    assert str(RankTimeout([1], 6.96779, {0: "all_reduce"})).startswith("rank(s) 1 did not finish within 7 s (")


def test_a_rank_that_dies_without_reporting_is_named():
    with pytest.raises(RankFailed) as caught:
        launch(rf.vanish_on, 2, 1, timeout_s=60)
    assert caught.value.rank == 1
    assert "exited with code 3 without reporting a result" in str(caught.value)
    assert "--- end of rank 1's stderr ---\nrank 1 is about to vanish" in str(caught.value)
    assert live_children() == []


@pytest.mark.timeout(180)
def test_a_script_that_launches_without_a_main_guard_is_told_the_fix(tmp_path):
    # Each spawned rank re-imports the script; unguarded, its launch() call fails inside every rank at start-up.
    script = tmp_path / "unguarded.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent.parent)!r})\n"
                      "import rank_functions\nfrom course.runtime.launch import launch\n"
                      "launch(rank_functions.identity, 2, None, timeout_s=60)\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert result.returncode == 1
    error = result.stderr[result.stderr.index("course.runtime.launch.RankFailed"):]
    assert re.search(r"rank \d failed; .*\n--- on rank \d ---\n"
                     r"process exited with code 1 without reporting a result, before it could call fn", error)
    assert f"imports your script ({script})" in error and 'under `if __name__ == "__main__":`' in error
    # the error the ranks printed as they started is quoted, whichever rank is blamed (both print it, to one file)
    assert "--- end of what the ranks wrote as they started ---" in error
    assert "bootstrapping phase" in error.split("as they started ---")[1]


def test_dataloader_workers_of_a_hung_rank_are_killed_too(capsys, short_window):
    # rank 1 waits for rank 0, so the progress rule stops them: only once the worker has started (its CPU time is
    # rank 0's progress) and rank 0 has printed its pid, however loaded the machine
    with pytest.raises(RankTimeout) as caught:
        launch(rf.spawn_worker_then_hang, 2, 0, timeout_s=600)
    assert caught.value.idle_s == short_window and caught.value.ranks == [0]
    assert live_children() == []
    out = capsys.readouterr().out
    workers = ast.literal_eval("[" + out.split("worker pids [")[-1].strip().split("]")[0] + "]")
    assert workers and not any(alive(pid, started) for pid, started in workers)


def alive(pid: int, started: float) -> bool:
    """The process started at ``started`` as ``pid`` still runs (a new process reusing the pid does not count)."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True])
def test_bad_world_sizes_are_refused_before_anything_starts(bad):
    with pytest.raises(ValueError, match="world_size must be a positive integer number of ranks"):
        launch(rf.identity, bad, None)
    assert live_children() == []


def test_a_function_from_a_notebook_cell_is_refused_with_the_fix():
    def local():
        return 1

    with pytest.raises(ValueError, match="Put it in a .py module"):
        launch(local, 2)


def test_in_turn_runs_each_call_in_order_and_returns_every_result():
    from course.runtime.launch import in_turn

    assert in_turn((operator.add, (2, 3)), (max, (1, 4, 2)), (list, ())) == [5, 4, []]


def test_a_launch_under_other_torch_variables_restarts_the_fork_server_and_later_ones_fork_again(monkeypatch):
    def forked() -> bool:  # a spawned rank's parent is this process; a forked one's is the server
        return launch(rf.parent_pid, 1, timeout_s=120)[0] != os.getpid()

    assert forked()
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "INFO")
    assert forked() and launch(rf.debug_level, 1, timeout_s=120) == ["INFO"]
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    assert forked() and launch(rf.debug_level, 1, timeout_s=120) == ["OFF"]


def test_ranks_see_the_environment_of_the_launch_not_of_the_first_one(monkeypatch):
    launch(rf.environment_variable, 1, "COURSE_TEST_LAUNCH_VARIABLE", timeout_s=60)  # the fork server is up by now
    monkeypatch.setenv("COURSE_TEST_LAUNCH_VARIABLE", "set later")
    assert launch(rf.environment_variable, 2, "COURSE_TEST_LAUNCH_VARIABLE", timeout_s=60) == ["set later"] * 2
    # a variable torch reads at import needs a new fork server: the test above


def test_a_fork_server_file_left_by_a_killed_process_is_removed_by_the_next_one(tmp_path, monkeypatch):
    # A killed launching process cannot remove its fork server's stderr file; the next process to make one does.
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    prefix = fork_server._STDERR_PREFIX
    stale = tmp_path / f"{prefix}{ended.pid}-x1.stderr"
    alive = tmp_path / f"{prefix}{os.getpid()}-x2.stderr"
    older = tmp_path / f"{prefix}ab12cd.stderr"  # a name without a pid: nothing says whose it is
    other = tmp_path / "unrelated-1.stderr"
    for path in (stale, alive, older, other):
        path.write_text("")
    monkeypatch.setattr(fork_server.tempfile, "tempdir", str(tmp_path))
    made = Path(fork_server._server_stderr())
    assert made.parent == tmp_path and made.name.startswith(f"{prefix}{os.getpid()}-")
    assert not stale.exists() and alive.exists() and older.exists() and other.exists()
    fork_server._remove(str(made))
