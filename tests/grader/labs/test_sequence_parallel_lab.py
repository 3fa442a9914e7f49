"""grader.labs.sequence_parallel: the stub fails every check, the solution passes every one, and each wrong attempt
fails exactly the checks its mistake breaks, with a message that names the mistake."""

import dataclasses
import os

import pytest

from grader import render
from grader.labs.core import run_lab
from grader.labs.sequence_parallel import check as sequence_parallel

pytestmark = [pytest.mark.unit8, pytest.mark.timeout(600)]
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EVERY = {check.name for check in sequence_parallel.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(sequence_parallel.LAB, os.path.join(ROOT, "grader", "labs", "sequence_parallel", "stub.py"))
    assert set(result.failed()) == EVERY
    assert result.checks[0].message.startswith("Not attempted yet: your GatherLinear still raises")


@pytest.mark.slow
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(sequence_parallel.LAB,
                     os.path.join(ROOT, "grader", "labs", "sequence_parallel", "reference.py"), hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    ("backward_all_reduce", {"collectives"}, "an all_reduce gives every rank every position"),
    ("identity_backward", {"input_grad", "collectives"}, "it is this rank's term only"),
    ("wrong_dim", EVERY, "stacked along the wrong dimension"),
    ("imports_course", EVERY, "your file uses course.model_parallel.sequence_parallel.GatherLinear"),
])
def test_each_wrong_attempt_fails_the_checks_its_mistake_breaks(attempt, fails, fragment, planted):
    result = run_lab(sequence_parallel.LAB, planted("sequence_parallel", attempt))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)



@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "first"), [
    ("identity_backward", "the input x's gradient (backward, step 0, rank 0, chunk 0): beyond rounding: a bug"),
    ("sums_bias_grad", "bias's gradient (backward, step 0, rank 0): beyond rounding: a bug"),
])
def test_a_mismatch_names_the_first_tensor_that_diverges(attempt, first, planted):
    result = run_lab(sequence_parallel.LAB, planted("sequence_parallel", attempt))
    failed = [r.message for r in result.checks if not r.passed and "first tensor" in r.message]
    assert failed and all(f"the first tensor that diverges is {first}" in m for m in failed), \
        render.lab_feedback(result)
    assert "weight_grads" in result.failed() or attempt != "sums_bias_grad", render.lab_feedback(result)


@pytest.mark.slow
def test_the_solution_passes_in_every_dtype_on_2_to_6_ranks():
    runs = tuple({**sequence_parallel._run(world_size, world_size, 2 * world_size, "{dtype}"), "dtype": dtype}
                 for dtype, world_size in (("bfloat16", 5), ("float16", 6), ("float16", 2), ("bfloat16", 3)))
    lab = dataclasses.replace(sequence_parallel.LAB, runs=runs, hidden_runs=(), variant={}, uneven={})
    result = run_lab(lab, os.path.join(ROOT, "grader", "labs", "sequence_parallel", "reference.py"))
    assert result.passed and result.runs == 4, render.lab_feedback(result)
