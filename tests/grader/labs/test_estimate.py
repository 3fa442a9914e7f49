"""The estimate lab (grader.labs.estimate): the stub fails every check, the solution passes all, each mistake its
own; a variant is a function of the student id; the verdicts are tested alone against closed forms."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader import render
from grader.labs.core import run_lab
from grader.labs.estimate import check as estimate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "estimate", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "estimate", "reference.py")
ATTEMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attempts")
ALL = [check.name for check in estimate.CHECKS]


def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(estimate.LAB, STUB)
    assert result.failed() == ALL and result.score == 0
    assert "Not attempted yet: your model_states_bytes still raises NotImplementedError" in render.lab_feedback(result)


@pytest.mark.timeout(300)
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(estimate.LAB, SOLUTION, hidden=True)
    assert result.passed, render.lab_feedback(result)
    assert result.runs == 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("forgets_optimizer_state", ["memory"], "12 bytes per parameter short: the optimizer state is missing"),
    ("allreduce_once", ["tp_allreduce"], "that counts each all-reduce's bytes once"),
    ("imports_course", ALL, "your file uses course.perf.planner.memory_per_gpu, a ready-made version"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment):
    result = run_lab(estimate.LAB, os.path.join(ATTEMPTS, f"estimate_{attempt}.py"))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert fragment in first, first


@pytest.mark.timeout(300)
def test_a_file_without_a_student_id_is_checked_on_the_published_problem_and_told_to_set_it(tmp_path):
    path = tmp_path / "estimate_plan.py"
    path.write_text(open(SOLUTION).read().replace('STUDENT_ID = "solution"', 'STUDENT_ID = ""'))
    result = run_lab(estimate.LAB, str(path))
    assert result.passed, render.lab_feedback(result)
    assert result.variant.startswith("the published variant: 24 layers, hidden size 2048")
    assert "INFO: STUDENT_ID is empty" in render.lab_feedback(result)


@pytest.mark.timeout(300)
def test_one_function_written_is_judged_and_the_other_is_named_not_attempted(tmp_path):
    path = tmp_path / "estimate_plan.py"
    solution = open(SOLUTION).read()
    body = solution[solution.index("    n = tensor_parallel"):solution.index("\n\n\nif __name__")]
    path.write_text(solution.replace(body, '    raise NotImplementedError("two ring all-reduces")'))
    result = run_lab(estimate.LAB, str(path))
    assert result.failed() == ["tp_allreduce"], render.lab_feedback(result)
    assert "your tp_allreduce_seconds still raises NotImplementedError" in result.checks[1].message


def test_a_variant_is_the_same_for_the_same_id_and_differs_between_ids():
    assert estimate.student_problem("ada") == estimate.student_problem(" Ada ")
    assert len({estimate.student_problem(f"student{i}") for i in range(20)}) >= 15
    assert estimate.student_problem("") == estimate.problem(estimate.LAB.runs[0])  # the published problem


@given(st.text(min_size=1, max_size=12))
def test_every_variant_is_a_plan_course_perf_can_price(student_id):
    p = estimate.student_problem(student_id)
    assert p.tensor_parallel <= 8 and p.model.hidden % p.model.heads == 0
    assert estimate.reference_states(p, 3) < estimate.reference_states(p, 0)
    assert estimate.reference_tp_seconds(p) > 0


def _solution():
    namespace: dict = {}
    exec(compile(open(SOLUTION).read(), SOLUTION, "exec"), namespace)
    return namespace


@given(st.text(min_size=1, max_size=12), st.integers(0, 3))
def test_memory_verdicts(student_id, stage):
    p, solved = estimate.student_problem(student_id), _solution()
    right = {s: solved["model_states_bytes"](p.model.params, p.tensor_parallel, p.data_parallel, s) for s in range(4)}
    assert estimate.judge_memory(right, p).passed
    per_gpu = p.model.params / p.tensor_parallel
    shards = p.data_parallel if stage >= 1 else 1
    forgot = {**right, stage: right[stage] - 12 * per_gpu / shards}
    assert "the optimizer state is missing" in estimate.judge_memory(forgot, p).message
    if stage:
        replicated = {**right, stage: 16 * per_gpu}
        assert "that is every state replicated" in estimate.judge_memory(replicated, p).message


@given(st.text(min_size=1, max_size=12))
def test_tp_verdicts(student_id):
    p = estimate.student_problem(student_id)
    expected = estimate.reference_tp_seconds(p)
    assert estimate.judge_tp(expected, p).passed
    assert "a layer's forward runs two all-reduces" in estimate.judge_tp(expected / 2, p).message
    assert not estimate.judge_tp(float("nan"), p).passed
