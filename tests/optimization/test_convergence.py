"""course.optimization.convergence: the library criterion, and a checker that passes right answers and catches wrong
ones."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.optimization.convergence import CASES, check_updates_to_converge, updates_to_converge

pytestmark = pytest.mark.unit1


def windowed(loss, optimum, eps, k):
    """An independent answer: slide a window of k over the within-eps flags."""
    inside = np.abs(np.asarray(loss) - optimum) <= eps
    for start in range(len(inside) - k + 1):
        if inside[start:start + k].all():
            return start
    return None


@settings(max_examples=200, deadline=None)
@given(loss=st.lists(st.sampled_from([0.5, 0.9, 1.0, 1.1, 1.25, 1.5, 3.0]), max_size=12),
       eps=st.sampled_from([0.1, 0.25, 0.5]), k=st.integers(1, 4))
def test_library_criterion_matches_a_sliding_window(loss, eps, k):
    assert updates_to_converge(loss, 1.0, eps, k) == windowed(loss, 1.0, eps, k)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_hand_written_answer_agrees_with_the_sliding_window(case):
    assert case.expected == windowed(case.loss, case.optimum, case.eps, case.k)


def test_cases_cover_none_zero_a_later_index_and_every_k_from_1_to_3():
    expected = [case.expected for case in CASES]
    assert None in expected and 0 in expected and any(e is not None and e > 0 for e in expected)
    assert {case.k for case in CASES} == {1, 2, 3}
    # for every k, some case has an answer, so an implementation that mishandles one k fails a case
    assert {case.k for case in CASES if case.expected is not None} == {1, 2, 3}
    assert len({case.name for case in CASES}) == len({case.hint for case in CASES}) == len(CASES)


def correct(loss, optimum, eps, k):
    run = 0
    for i, value in enumerate(loss):
        run = run + 1 if abs(value - optimum) <= eps else 0
        if run == k:
            return i - k + 1
    return None


def returns_last_of_run(loss, optimum, eps, k):
    start = correct(loss, optimum, eps, k)
    return None if start is None else start + k - 1


def counts_without_resetting(loss, optimum, eps, k):
    seen = 0
    for i, value in enumerate(loss):
        seen += abs(value - optimum) <= eps
        if seen == k:
            return i - k + 1
    return None


def strict_inequality(loss, optimum, eps, k):
    run = 0
    for i, value in enumerate(loss):
        run = run + 1 if abs(value - optimum) < eps else 0
        if run == k:
            return i - k + 1
    return None


def signed_gap(loss, optimum, eps, k):
    run = 0
    for i, value in enumerate(loss):
        run = run + 1 if value - optimum <= eps else 0
        if run == k:
            return i - k + 1
    return None


def minus_one_when_never(loss, optimum, eps, k):
    answer = correct(loss, optimum, eps, k)
    return -1 if answer is None else answer


def skips_the_initial_loss(loss, optimum, eps, k):
    answer = correct(loss[1:], optimum, eps, k)
    return None if answer is None else answer + 1


def crashes(loss, optimum, eps, k):
    return loss[k * 10]


def returns_a_float(loss, optimum, eps, k):
    answer = correct(loss, optimum, eps, k)
    return None if answer is None else float(answer)


def test_the_library_answer_passes(capsys):
    assert check_updates_to_converge(updates_to_converge) is True
    assert capsys.readouterr().out.startswith(f"All {len(CASES)} of {len(CASES)} cases pass.")


def test_numpy_integers_are_accepted(capsys):
    assert check_updates_to_converge(lambda *a: None if correct(*a) is None else np.int64(correct(*a)))


@pytest.mark.parametrize("wrong, hint", [
    (returns_last_of_run, "FIRST of the k records"),
    (counts_without_resetting, "must be consecutive"),
    (strict_inequality, "(inclusive)"),
    (signed_gap, "|loss - optimum|"),
    (minus_one_when_never, "return None"),
    (skips_the_initial_loss, "record 0"),
    (crashes, "raised IndexError"),
    (returns_a_float, "of type float"),
])
def test_each_wrong_answer_is_caught_with_a_useful_hint(wrong, hint, capsys):
    assert check_updates_to_converge(wrong) is False
    out = capsys.readouterr().out
    assert out.startswith("Only ")
    assert hint in out


def test_checker_gives_feedback_for_something_that_is_not_a_function(capsys):
    assert check_updates_to_converge(3) is False
    assert "expected the function you wrote, got int 3" in capsys.readouterr().out


def test_the_notebook_stub_is_reported_as_not_attempted_not_as_failing(capsys):
    def stub(loss, optimum, eps, k):
        raise NotImplementedError("write updates_to_converge")

    assert check_updates_to_converge(stub) is False
    out = capsys.readouterr().out
    assert out.startswith("Not attempted yet") and "FAIL" not in out
