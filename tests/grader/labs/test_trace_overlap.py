"""grader.labs.trace_overlap: the stub fails every check, the solution passes every one, each wrong reader fails
exactly the checks its mistake breaks with a message that names the mistake, and the synthetic traces hold what
each check needs."""

import os

import pytest

from grader import render
from grader.labs.core import run_lab
from grader.labs.trace_overlap import check as trace_overlap

pytestmark = [pytest.mark.unit9, pytest.mark.timeout(600)]
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EVERY = {check.name for check in trace_overlap.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(trace_overlap.LAB, os.path.join(ROOT, "grader", "labs", "trace_overlap", "stub.py"))
    assert set(result.failed()) == EVERY
    assert result.checks[0].message.startswith("Not attempted yet: your overlap_fraction still raises")


@pytest.mark.slow
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(trace_overlap.LAB, os.path.join(ROOT, "grader", "labs", "trace_overlap", "reference.py"),
                     hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    ("sums_durations", {"union", "real_trace"}, "counted twice; merge the intervals"),
    ("counts_forward", {"forward"}, "communication during forward as overlapped"),
    ("ignores_pid", {"per_rank", "real_trace"}, "the answer over every process"),
    ("imports_course", EVERY, "your file uses course.practice.profiling.overlap_fraction"),
])
def test_each_wrong_reader_fails_the_checks_its_mistake_breaks(attempt, fails, fragment):
    result = run_lab(trace_overlap.LAB, os.path.join(HERE, "attempts", f"trace_overlap_{attempt}.py"))
    # the real trace's own events may overlap (or not): a mistake may fail it too, never another check
    assert fails - {"real_trace"} <= set(result.failed()) <= fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)


@pytest.mark.parametrize("seed", range(20))
def test_each_kind_of_synthetic_trace_catches_its_mistake_and_no_other(seed):
    # kind -> the mistake it must expose; every other mistake must give the right answer there
    catches = {"one_rank": {"backward_end"}, "union": {"summed", "backward_end"},
               "forward": {"forward", "backward_end"}, "per_rank": {"every_pid", "backward_end"}}
    for kind, exposed in catches.items():
        trace, pids = trace_overlap.synthetic(kind, seed)
        for name, (mistake, _) in trace_overlap.MISTAKES.items():
            wrong = any(abs(mistake(trace, pid) - trace_overlap.expected(trace, pid)) > 1e-6 for pid in pids)
            assert wrong == (name in exposed), (kind, name)


def test_the_answer_is_the_union_inside_the_backward_window():
    events = [{"ph": "X", "pid": 7, "tid": 1, "name": "forward", "ts": 0, "dur": 100},
              {"ph": "X", "pid": 7, "tid": 1, "name": "backward", "ts": 100, "dur": 300},
              {"ph": "X", "pid": 7, "tid": 1, "name": trace_overlap.LAST_GRADIENT, "ts": 290, "dur": 10},
              {"ph": "X", "pid": 7, "tid": 2, "name": "gloo:all_reduce", "ts": 200, "dur": 200},
              {"ph": "X", "pid": 7, "tid": 3, "name": "nccl:all_gather", "ts": 250, "dur": 50}]
    assert trace_overlap.expected({"traceEvents": events}, 7) == pytest.approx(100 / 200)
