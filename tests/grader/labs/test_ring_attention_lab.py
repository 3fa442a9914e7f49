"""grader.labs.ring_attention: the stub fails every check, the reference passes every one (visible and hidden),
and each planted mistake fails exactly the check that names it, with a message in the learner's terms."""

import pytest

from grader import render
from grader.labs.core import reference_path, run_lab, stub_path
from grader.labs.ring_attention import check as ring_attention

pytestmark = [pytest.mark.unit8b, pytest.mark.timeout(600)]
EVERY = {check.name for check in ring_attention.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(ring_attention.LAB, str(stub_path(ring_attention.LAB)))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert result.checks[0].message.startswith("Not attempted yet: your ring_attention_forward still raises")


@pytest.mark.slow
def test_the_reference_passes_every_check_visible_and_hidden():
    result = run_lab(ring_attention.LAB, str(reference_path(ring_attention.LAB)), hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    ("merge_no_max", {"online_softmax"}, "Subtract the running maximum, m = max(lse_a, lse_b)"),
    ("mask_wrong_blocks", {"causal_mask"}, "the query at position 0 (rank 0) also saw the later key(s)"),
    ("wrong_neighbour", {"ring"}, "rank 0 sent a message to rank 3; the ring passes each block to the next rank"),
    ("no_return_trip", {"kv_gradients"}, "it is the gradient of rank 1's keys, finished but never sent home"),
])
def test_each_planted_mistake_fails_exactly_its_check(attempt, fails, fragment, planted):
    result = run_lab(ring_attention.LAB, planted("ring_attention", attempt))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)
    if attempt == "no_return_trip":  # a rounding bound derived from the arithmetic, and where it is exceeded
        assert "rank 0's dk differs from full attention's at position " in render.lab_feedback(result)
        assert ": beyond rounding: a bug (bound " in render.lab_feedback(result)


def test_a_half_done_file_is_told_which_part_is_missing(tmp_path):
    reference = reference_path(ring_attention.LAB).read_text()
    start = reference.index("def ring_attention_backward(")
    body = reference.index('    rank, world_size = dist.get_rank(), dist.get_world_size()', start)
    end = reference.index("\n\n\nif __name__", body)
    half = reference[:body] + '    raise NotImplementedError("not yet")' + reference[end:]
    path = tmp_path / "ring_attention.py"
    path.write_text(half)
    result = run_lab(ring_attention.LAB, str(path))
    assert set(result.failed()) == {"q_gradient", "kv_gradients"}, render.lab_feedback(result)
    assert "your ring_attention_backward still raises NotImplementedError" in result.checks[3].message


def test_importing_the_course_ring_is_refused_without_starting_a_rank(planted):
    result = run_lab(ring_attention.LAB, planted("ring_attention", "imports_course"))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert "your file uses course.long_context.ring_attention.ring_forward" in result.checks[0].message
