"""grader.labs.one_f_one_b: the stub fails every check, the solution passes every one, and each wrong schedule
fails exactly the checks its mistake breaks, with a message that names the mistake."""

import os

import pytest

from grader import render
from grader.labs import one_f_one_b
from grader.labs.core import run_lab

pytestmark = [pytest.mark.unit8, pytest.mark.timeout(600)]
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EVERY = {check.name for check in one_f_one_b.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(one_f_one_b.LAB, os.path.join(ROOT, "course", "labs", "stubs", "one_f_one_b.py"))
    assert set(result.failed()) == EVERY
    assert result.checks[0].message.startswith("Not attempted yet: your one_f_one_b still raises")


@pytest.mark.slow
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(one_f_one_b.LAB, os.path.join(ROOT, "notebooks", "solutions", "labs", "one_f_one_b.py"),
                     hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    ("gpipe", {"in_flight", "order"}, "stage 0 held 8 micro-batches at once"),
    ("no_warmup", {"order"}, "stage 0's op 1 is B0, 1F1B runs F1 there"),
    ("warmup_off_by_one", {"in_flight", "order"}, "stage 0 held 5 micro-batches at once"),
    ("no_cooldown", EVERY, "the schedule never runs B"),
    ("uncapped_warmup", EVERY, "world_size=4, 4 stages, 2 micro-batches: stage 0 of 4, 2 micro-batches: "),
])
def test_each_wrong_schedule_fails_the_checks_its_mistake_breaks(attempt, fails, fragment):
    result = run_lab(one_f_one_b.LAB, os.path.join(HERE, "attempts", f"one_f_one_b_{attempt}.py"))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)



def test_importing_the_course_schedule_is_refused_without_starting_a_rank():
    result = run_lab(one_f_one_b.LAB, os.path.join(HERE, "attempts", "one_f_one_b_imports_course.py"))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert result.checks[0].message.startswith("your file uses course.model_parallel.schedules.one_f_one_b, a "
                                                "ready-made version of what this lab asks you to write")
