"""grader.labs.moe_dispatch: the stub fails every check, the reference passes every one (visible and hidden),
and each planted mistake fails exactly the check that names it, with a message in the learner's terms."""

import pytest

from grader import render
from grader.labs.core import reference_path, run_lab, stub_path
from grader.labs.moe_dispatch import check as moe_dispatch

pytestmark = [pytest.mark.unit8b, pytest.mark.timeout(600)]
EVERY = {check.name for check in moe_dispatch.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(moe_dispatch.LAB, str(stub_path(moe_dispatch.LAB)))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert result.checks[0].message.startswith("Not attempted yet: your dispatch still raises")


@pytest.mark.slow
def test_the_reference_passes_every_check_visible_and_hidden():
    result = run_lab(moe_dispatch.LAB, str(reference_path(moe_dispatch.LAB)), hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    ("no_count_exchange", {"split_sizes"}, "a rank cannot know what it will receive until the counts are exchanged"),
    ("no_gates", {"gates"}, "got 2 from experts that each returned 1 with gates [0.3, 0.3]: multiply"),
    ("no_gates", {"gates"}, "before adding it at its token (beyond rounding: a bug (bound "),
    ("out_of_order", {"token_order"}, "token 0 on rank 0 got back rows of token(s) [7]"),
    ("ignores_capacity", {"capacity"}, "rank 0 sent 32 rows, but 24 of its 32 assignments fit under capacity 6"),
])
def test_each_planted_mistake_fails_exactly_its_check(attempt, fails, fragment, planted):
    result = run_lab(moe_dispatch.LAB, planted("moe_dispatch", attempt))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)


def test_importing_the_course_exchange_is_refused_without_starting_a_rank(planted):
    result = run_lab(moe_dispatch.LAB, planted("moe_dispatch", "imports_course"))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert "your file uses course.experts.expert_parallel.exchange_counts" in result.checks[0].message
