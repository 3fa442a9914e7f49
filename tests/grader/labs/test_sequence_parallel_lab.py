"""grader.labs.sequence_parallel: the stub fails every check, the solution passes every one, and each wrong attempt
fails exactly the checks its mistake breaks, with a message that names the mistake."""

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
def test_each_wrong_attempt_fails_the_checks_its_mistake_breaks(attempt, fails, fragment):
    result = run_lab(sequence_parallel.LAB, os.path.join(HERE, "attempts", f"sequence_parallel_{attempt}.py"))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)

