"""grader.labs.tp_mlp: the stub fails every check, the solution passes every one, and each wrong attempt fails
exactly the checks its mistake breaks, with a message that names the mistake."""

import dataclasses
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
     "0.334 (rounding allows 1e-06 there): it is off by exactly (world_size - 1) = 3 times fc2's bias, so every rank "
     "added b2 before g's all_reduce"),
    ("g_all_gather", {"collectives"}, "in forward, rank 0 called all_gather x1"),
    ("g_backward_allreduce", {"input_grad", "weight_grads", "collectives"}, "x too large"),
])
def test_each_wrong_attempt_fails_the_checks_its_mistake_breaks(attempt, fails, fragment, planted):
    result = run_lab(tp_mlp.LAB, planted("tp_mlp", attempt))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)



@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "first"), [
    ("bias_before_reduce", "the row-parallel layer's output (forward, step 0, rank 0): beyond rounding: a bug "
     "(bound 1e-06, seen 0.334). Then: "),
    ("g_backward_allreduce", "w2's gradient (backward, step 0, rank 0): beyond rounding: a bug"),
    ("f_backward_identity", "the input x's gradient (backward, step 0, rank 0): beyond rounding: a bug"),
])
def test_a_mismatch_names_the_first_tensor_that_diverges(attempt, first, planted):
    result = run_lab(tp_mlp.LAB, planted("tp_mlp", attempt))
    failed = [r.message for r in result.checks if not r.passed]
    assert failed and all(f"the first tensor that diverges is {first}" in m for m in failed), \
        render.lab_feedback(result)


@pytest.mark.slow
def test_the_solution_passes_in_every_dtype_on_2_to_6_ranks(planted):
    runs = tuple({**tp_mlp._run(world_size, world_size, 16 * world_size, "{dtype}"), "dtype": dtype}
                 for dtype, world_size in (("bfloat16", 5), ("float16", 6), ("float16", 2), ("bfloat16", 3)))
    lab = dataclasses.replace(tp_mlp.LAB, runs=runs, hidden_runs=(), variant={}, uneven={})
    result = run_lab(lab, os.path.join(ROOT, "grader", "labs", "tp_mlp", "reference.py"))
    assert result.passed and result.runs == 4, render.lab_feedback(result)
    wrong = run_lab(lab, planted("tp_mlp", "bias_before_reduce"))
    assert wrong.failed() == ["outputs"], render.lab_feedback(wrong)


def test_importing_the_course_classes_is_refused_without_starting_a_rank():
    result = run_lab(tp_mlp.LAB, os.path.join(HERE, "attempts", "tp_mlp_imports_course.py"))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert "your file uses course.model_parallel.tensor_parallel.ParallelMLP, a ready-made version" in \
        result.checks[0].message
