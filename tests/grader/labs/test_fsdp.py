"""The FSDP lab (grader.labs.fsdp): the stub fails every check, the solution passes all, each mistake its own.

The verdicts are also tested alone on numbers built by hand (no ranks).
"""

import os

import pytest

from grader import render
from grader.labs import fsdp
from grader.labs.core import run_lab

pytestmark = [pytest.mark.unit7, pytest.mark.timeout(600)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "course", "labs", "stubs", "fsdp.py")
SOLUTION = os.path.join(ROOT, "notebooks", "solutions", "labs", "fsdp.py")
ATTEMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attempts")
ALL = [check.name for check in fsdp.CHECKS]


def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(fsdp.LAB, STUB)
    assert result.failed() == ALL and result.runs == 0
    assert "Not attempted yet: your MyFSDP still raises NotImplementedError" in render.lab_feedback(result)


def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(fsdp.LAB, SOLUTION, hidden=True)  # 4 ranks, then 3 and 2 with seeds drawn now
    assert result.passed, render.lab_feedback(result)


@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("keeps_gathered", ["memory", "communication"], "18,352 bytes of gathered parameters were alive at once"),
    ("allreduce_grads", ["communication"], "2.00x DDP's allreduce of the same model (27,528); FSDP sends 1.5x"),
    ("sums", ["matches_adam"], "divide the reduce-scattered sum by world_size"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment):
    result = run_lab(fsdp.LAB, os.path.join(ATTEMPTS, f"fsdp_{attempt}.py"))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert first.startswith("world_size=4, ") and fragment in first, first


def test_torch_fsdp_is_refused_without_starting_a_rank(tmp_path):
    path = tmp_path / "fsdp.py"
    path.write_text("from torch.distributed.fsdp import fully_shard\n\nMyFSDP = fully_shard\n")
    result = run_lab(fsdp.LAB, str(path))
    assert result.failed() == ALL and result.runs == 0
    assert "your file uses torch.distributed.fsdp.fully_shard" in result.checks[0].message


def test_memory_passes_one_layer_and_fails_two():
    assert fsdp.judge_memory(4588, 8320, 18352, 8320, 4).passed
    two = fsdp.judge_memory(4588, 12544, 18352, 8320, 4)
    assert not two.passed and "1.5 layers' worth" in two.message
    assert "keep only your pieces" in fsdp.judge_memory(18352, 8320, 18352, 8320, 4).message


def test_communication_is_one_and_a_half_ddp_within_the_padding():
    ddp = 2 * 3 / 4 * 18352
    assert fsdp.judge_communication([1.5 * ddp], 18352, 4, 4).passed
    assert "reduce-scatter them instead" in fsdp.judge_communication([2 * ddp], 18352, 4, 4).message
    assert "one all-gather too few" in fsdp.judge_communication([ddp], 18352, 4, 4).message
