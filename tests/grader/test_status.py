"""grader.runner's status of a run, from records alone: the grader's own errors, its limits, missing libraries,
processes a rank spawned are named first, in the grader's terms; a run that called torch.compile is told, in one
neutral sentence, that it ran without compiling (issue 24)."""

import signal
import subprocess

import pytest

from course.runtime import waits
from course.runtime.pace import Pace
from grader import runner
from grader.environment import python_argv, run_env
from grader.evidence import collect
from grader.sandbox import SandboxResult

pytestmark = pytest.mark.unit6
CONFIG = runner.GradingConfig()  # the class grade's limits: 64 MiB per file
LOST = "RuntimeError: [/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"


def exits(codes: dict[int, tuple[int, str]]) -> list[dict]:
    return [{"kind": "rank_exit", "rank": r, "returncode": code, "stderr": err, "exit_s": float(r),
             "signer": "launcher"} for r, (code, err) in codes.items()]


def status(raw: list[dict], result: str = "error") -> tuple[str, str]:
    records = collect(raw, world_size=4)
    sandboxed = SandboxResult(status=result, returncode=1 if result == "error" else None, stdout="", stderr="")
    return runner._status(records, sandboxed, CONFIG)


def test_a_failure_of_the_graders_own_probes_is_the_graders_error():
    raw = [{"kind": "probe_error", "rank": 3, "where": "optimizer step", "error": "RuntimeError: boom",
            "signer": 3}, *exits({r: (0, "") for r in range(4)})]
    got, detail = status(raw, "ok")
    assert got == runner.GRADER_ERROR and "rank 3" in detail and "not your submission's" in detail
    assert "crash" not in got


def test_a_missing_library_is_named_in_one_line():
    error = "Traceback (most recent call last):\n  File \"train_4gpu.py\", line 3\nModuleNotFoundError: " \
            "No module named 'lightning.pytorch'"
    got, detail = status(exits({r: (1, error) for r in range(4)}))
    assert got == runner.MISSING_LIBRARY
    assert detail.startswith("this library is not available in the grading environment: lightning (")
    assert detail.endswith("the assignment needs only torch and the course.")


def test_a_file_over_the_limit_names_the_graders_limit_and_torch_compile():
    compiler = "torch._inductor.exc.CppCompileError: C++ compile error\nCommand '['g++', ...]' died with " \
               "<Signals.SIGXFSZ: 25>."
    raw = [{"kind": "call", "rank": 1, "function": "torch.compile", "step": 0, "signer": 1},
           *exits({0: (1, LOST), 1: (1, compiler), 2: (1, LOST), 3: (1, LOST)})]
    got, detail = status(raw)
    assert got == "file too large"
    assert detail.startswith("the grader's limit stopped rank 1: torch.compile's C++ compiler wrote a file larger "
                             "than the grader allows (64 MiB per file).")
    assert status(exits({0: (0, ""), 1: (-signal.SIGXFSZ, ""), 2: (0, ""), 3: (0, "")}))[0] == "file too large"


def test_processes_spawned_under_torchrun_are_named_when_a_run_fails():
    raw = [{"kind": "call", "rank": r, "function": "torch.multiprocessing.spawn", "step": 0, "nprocs": 4,
            "signer": r} for r in range(4)]
    got, detail = status(raw, "timeout")
    assert got == "timeout"
    assert "torch.multiprocessing.spawn (rank 0: 4, rank 1: 4, rank 2: 4, rank 3: 4): 20 processes in all" in detail
    assert runner.COMPILED not in detail


COMPILE = {"kind": "call", "rank": 0, "function": "torch.compile", "step": 0, "signer": 0}


def test_a_run_that_called_torch_compile_is_told_it_ran_without_compiling_in_one_neutral_sentence():
    got, detail = status([COMPILE, *exits({r: (0, "") for r in range(4)})], "ok")
    assert (got, detail) == ("ok", f"all ranks finished. {runner.COMPILED}")
    assert status(exits({r: (0, "") for r in range(4)}), "ok") == ("ok", "all ranks finished")
    got, detail = status([COMPILE], "timeout")  # a failed run: said after what stopped it
    assert got == "timeout" and detail.endswith(f". {runner.COMPILED}")
    assert runner.COMPILED == "torch.compile ran without compiling in the grader; the grade does not depend on it."


def test_the_grading_environment_turns_compiling_off():
    """torch reads TORCH_COMPILE_DISABLE when imported: torch.compile then still returns its wrapper (state_dict
    keys "_orig_mod."), whose forward runs the module as written (no frame is compiled)."""
    env = run_env()
    assert env["TORCH_COMPILE_DISABLE"] == "1"
    probe = ("import torch, torch._dynamo\n"
             "from torch._dynamo.utils import counters\n"
             "m = torch.nn.Linear(3, 2)\n"
             "c = torch.compile(m)\n"
             "assert torch.equal(c(torch.ones(1, 3)), m(torch.ones(1, 3)))\n"
             "print(torch._dynamo.config.disable, list(c.state_dict())[0], counters['frames']['total'])")
    out = subprocess.run([*python_argv(), "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "_orig_mod.weight", "0"], out.stderr[-2000:]


def stopped_as_hung(ranks: list[int]) -> list[dict]:
    return [{"kind": "rank_exit", "rank": r, "returncode": -9, "stopped": "hang", "stderr": "", "signer": "launcher"}
            for r in ranks]


def in_collective(rank: int, op: str, seq: int) -> dict:
    return {"kind": "collective", "rank": rank, "op": op, "step": 0, "seq": seq, "signer": rank}


def test_a_hang_names_the_rank_the_others_waited_for_and_how_long_nothing_moved():
    # the launcher stopped every rank once none had made progress for idle_s; rank 3 was not in a collective
    raw = [*(in_collective(r, "barrier", 2) for r in range(3)), *stopped_as_hung([0, 1, 2, 3])]
    got, detail = status(raw, "error")
    assert got == "hang on rank 3"
    assert detail.startswith(f"no rank made progress for {CONFIG.idle_s:g} s (none computed or called a "
                             "collective), so the run was stopped. Rank(s) 3 never got to where the other ranks "
                             "were: rank 0 waits in barrier() (its collective #2);")
    assert detail.endswith("Every rank must reach every collective, in the same order.")


def test_ranks_each_waiting_in_a_different_collective_are_all_named():
    raw = [in_collective(0, "all_reduce", 5), in_collective(1, "barrier", 5), *stopped_as_hung([0, 1])]
    got, detail = runner._status(collect(raw, world_size=2), SandboxResult("error", 1, "", ""), CONFIG)
    assert got == "hang on rank 0, 1"
    assert "Rank(s) 0, 1 each wait in a collective the others never join: rank 0 waits in all_reduce() (its " \
           "collective #5); rank 1 waits in barrier() (its collective #5)." in detail


def waits_for(rank: int, peer: int, number: int, sent: dict[int, int], received: dict[int, int]) -> dict:
    """A ``wait`` record: ``rank`` begins to wait for its irecv ``number`` from ``peer`` (course.runtime.waits)."""
    messages = waits.Record(number, sent, received, (waits.Message("receive", peer, number, "irecv"),))
    return {"kind": "wait", "rank": rank, "step": 0, "messages": messages.to_dict(), "seq": 3, "signer": rank}


def test_ranks_waiting_for_messages_nobody_sends_are_named_with_whom_they_wait_for_and_the_wrong_send():
    # rank 0 sent its message to rank 2 (meant for rank 1); rank 1 waits for it, rank 2 waits for rank 1
    raw = [waits_for(0, 1, 1, {2: 1}, {1: 1}), waits_for(1, 0, 1, {}, {0: 1}), waits_for(2, 1, 1, {}, {1: 1}),
           *stopped_as_hung([0, 1, 2])]
    got, detail = runner._status(collect(raw, world_size=3), SandboxResult("error", 1, "", ""), CONFIG)
    assert got == "hang on rank 0, 1, 2"
    assert ("Rank(s) 0, 1, 2 each wait for what the others never send or join: rank 0 waits to receive from rank 1 "
            "(its irecv number 1 from rank 1; rank 1 had sent it 0); rank 1 waits to receive from rank 0 (its irecv "
            "number 1 from rank 0; rank 0 had sent it 0)") in detail
    assert detail.endswith("rank 0 sent 1 message(s) to rank 2, which never receives from rank 0. Every message a "
                           "rank waits for must be sent to it: check the peer ranks of your sends and receives.")


def test_a_run_still_working_at_the_time_limit_is_a_timeout_not_a_hang_and_states_the_limit():
    # rank 0 computed to the end while the others waited for it: slow (or looping), never called stuck
    config = runner.GradingConfig(pace=Pace(2.0, 0.28))
    raw = [in_collective(r, "all_reduce", 4) for r in (1, 2, 3)]
    sandboxed = SandboxResult(status="timeout", returncode=None, stdout="", stderr="")
    got, detail = runner._status(collect(raw, world_size=4), sandboxed, config)
    assert got == "timeout"
    assert "It was not stuck: rank 0 was still using processor time when the limit ran out (rank 1 waits in " \
           "all_reduce() (its collective #4);" in detail
    assert detail.endswith("The time limit was 360 s: the usual 180 s times 2.0, because this machine ran a fixed "
                           "test 2.0 times slower than usual (other programs were using its processors).")
