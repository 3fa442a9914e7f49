"""grader.labs.tp_mlp: the stub fails every check, the solution passes every one, and each wrong attempt fails
exactly the checks its mistake breaks, with a message that names the mistake."""

import os

import pytest

from grader import render
from grader.labs.core import run_lab
from grader.labs.tp_mlp import check as tp_mlp

pytestmark = [pytest.mark.unit8, pytest.mark.timeout(600)]
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EVERY = {check.name for check in tp_mlp.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(tp_mlp.LAB, os.path.join(ROOT, "grader", "labs", "tp_mlp", "stub.py"))
    assert set(result.failed()) == EVERY
    assert result.checks[0].message.startswith("Not attempted yet: your ParallelMLP still raises")


@pytest.mark.slow
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(tp_mlp.LAB, os.path.join(ROOT, "grader", "labs", "tp_mlp", "reference.py"), hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    ("f_backward_identity", {"input_grad", "collectives"}, "this rank's share of the gradient only"),
    ("bias_before_reduce", {"outputs"}, "output (checked outside the ranks) differs from the unsplit MLP's by up to "
     "0.334: it is off by exactly (world_size - 1) = 3 times fc2's bias, so every rank added b2 before g's all_reduce"),
    ("g_all_gather", {"collectives"}, "in forward, rank 0 called all_gather x1"),
    ("g_backward_allreduce", {"input_grad", "weight_grads", "collectives"}, "x too large"),
])
def test_each_wrong_attempt_fails_the_checks_its_mistake_breaks(attempt, fails, fragment):
    result = run_lab(tp_mlp.LAB, os.path.join(HERE, "attempts", f"tp_mlp_{attempt}.py"))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)



def test_importing_the_course_classes_is_refused_without_starting_a_rank():
    result = run_lab(tp_mlp.LAB, os.path.join(HERE, "attempts", "tp_mlp_imports_course.py"))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert "your file uses course.model_parallel.tensor_parallel.ParallelMLP, a ready-made version" in \
        result.checks[0].message
