"""grader.runner's status of a run, from records alone: the grader's own errors, its limits, missing libraries,
processes a rank spawned are named first, in the grader's terms; a run that called torch.compile is told, in one
neutral sentence, that it ran without compiling (issue 24)."""

import signal
import subprocess

import pytest

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
