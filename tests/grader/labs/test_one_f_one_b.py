"""grader.labs.one_f_one_b: the stub fails every check, the solution passes every one, and each wrong schedule
fails exactly the checks its mistake breaks (a schedule that is not well formed, or deadlocks, also fails the checks
that cannot run without it, saying "not run"), with a message that names the mistake.

The verdicts are also tested alone on the attempts' schedules (no ranks)."""

import importlib.util
import os

import pytest

from grader import render
from grader.labs.core import run_lab
from grader.labs.one_f_one_b import check as one_f_one_b

pytestmark = [pytest.mark.unit8, pytest.mark.timeout(600)]
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SOLUTION = os.path.join(ROOT, "grader", "labs", "one_f_one_b", "reference.py")
EVERY = {check.name for check in one_f_one_b.CHECKS}
MALFORMED = EVERY - {"simulator"}  # the schedule's other checks say "not run"; the simulator is judged alone

# attempt -> (the checks it fails over the visible and hidden runs, a fragment of the first failure's message)
WRONG = {
    "gpipe": ({"in_flight"}, "stage 0 holds 8 at once (after F0 F1 F2 F3 F4 F5 F6 F7); 1F1B never holds more "
              "than p - stage = 4"),
    "warmup_off_by_one": ({"in_flight"}, "stage 0 holds 5 at once"),
    "no_warmup": ({"bubble"}, "each stage is idle 75.0% of the step"),
    "reversed_warmup": ({"no_deadlock", "in_flight", "bubble"}, "stage 0 waits at its op 1 (B0) for stage 1's B0; "
                        "stage 1 waits at its op 1 (F1) for stage 0's F1"),
    "no_cooldown": (MALFORMED, "stage 0: the schedule never runs B5, B6, B7"),
    "uncapped_warmup": (MALFORMED, "world_size=4, 4 stages, 2 micro-batches (interleaved: 1·p micro-batches, 3 "
                        "chunks per rank): one_f_one_b(4 stages, 2 micro-batches): stage 0: op 2 (F2) is not a "
                        "forward"),
    "interleaved_backward_chunk_order": ({"no_deadlock", "bubble"}, "stage 3 waits at its op 5 (B0) for stage 0's "
                                         "B0/1"),
    "interleaved_one_more_warmup": ({"in_flight"}, "stage 0 holds 12 at once"),
    "interleaved_plain_warmup": (MALFORMED, "stage 0: op 4 runs B0/1 before F0/1: a backward needs its forward"),
    "simulator_backward_never_waits": ({"simulator"}, "on GPipe (4 stages, 8 micro-batches) your idle_fraction says"),
    "simulator_misses_deadlock": ({"simulator"}, "every stage ends up waiting for another (a deadlock), yet your "
                                  "idle_fraction returned"),
}


def _load(path):
    spec = importlib.util.spec_from_file_location("attempt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verdicts(path):
    """Every check's first failure over the lab's visible and hidden runs, judged without ranks."""
    module, failed = _load(path), {}
    for run in one_f_one_b.LAB.runs + one_f_one_b.LAB.hidden_runs:
        attempts = [one_f_one_b.analyse(module.one_f_one_b, "one_f_one_b", run["world_size"], run["micro_batches"]),
                    one_f_one_b.analyse(module.interleaved, "interleaved", run["world_size"],
                                        run["interleaved_groups"] * run["world_size"], run["chunks"])]
        findings = [judge(attempts) for judge in (one_f_one_b.judge_well_formed, one_f_one_b.judge_no_deadlock,
                                                  one_f_one_b.judge_in_flight, one_f_one_b.judge_bubble)]
        findings.append(one_f_one_b.judge_simulator(module.idle_fraction, one_f_one_b.simulator_cases(attempts[0])))
        for finding in findings:
            if not finding.passed:
                failed.setdefault(finding.check, finding.message)
    return failed


def test_the_solution_passes_every_verdict_in_every_run():
    assert _verdicts(SOLUTION) == {}


@pytest.mark.parametrize("attempt", sorted(WRONG))
def test_each_wrong_schedule_fails_exactly_the_verdicts_its_mistake_breaks(attempt):
    fails, fragment = WRONG[attempt]
    failed = _verdicts(os.path.join(HERE, "attempts", f"one_f_one_b_{attempt}.py"))
    assert set(failed) == fails, failed
    assert any(fragment.split(": ")[-1] in message for message in failed.values()), failed


def test_the_solution_passes_every_verdict_in_every_students_variant():
    import itertools

    from grader.labs import variant

    keys = sorted(one_f_one_b.LAB.variant)
    for values in itertools.product(*(one_f_one_b.LAB.variant[key] for key in keys)):
        drawn = {**one_f_one_b.LAB.runs[0], **dict(zip(keys, values, strict=True))}
        module = _load(SOLUTION)
        p = drawn["world_size"]
        attempts = [one_f_one_b.analyse(module.one_f_one_b, "one_f_one_b", p, drawn["micro_batches"]),
                    one_f_one_b.analyse(module.interleaved, "interleaved", p, drawn["interleaved_groups"] * p,
                                        drawn["chunks"])]
        for judge in (one_f_one_b.judge_well_formed, one_f_one_b.judge_no_deadlock, one_f_one_b.judge_in_flight,
                      one_f_one_b.judge_bubble):
            assert judge(attempts).passed, (drawn, judge(attempts).message)
    assert variant.variant_runs(one_f_one_b.LAB, "solution")[0] != one_f_one_b.LAB.runs[0]


def test_the_in_flight_bounds_are_one_f_one_b_and_megatron_interleaved():
    plain = one_f_one_b.Attempt("one_f_one_b", 4, 8, 1)
    chunked = one_f_one_b.Attempt("interleaved", 4, 8, 2)
    assert [plain.bound(s) for s in range(4)] == [4, 3, 2, 1]
    assert [chunked.bound(s) for s in range(4)] == [11, 9, 7, 5]
    assert plain.closed_form == pytest.approx(3 / 11) and chunked.closed_form == pytest.approx(3 / 19)


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(one_f_one_b.LAB, os.path.join(ROOT, "grader", "labs", "one_f_one_b", "stub.py"))
    assert set(result.failed()) == EVERY
    assert result.checks[0].message.startswith("Not attempted yet: your one_f_one_b still raises")


@pytest.mark.slow
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(one_f_one_b.LAB, SOLUTION, hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", ["gpipe", "no_warmup", "reversed_warmup", "interleaved_backward_chunk_order",
                                     "uncapped_warmup", "simulator_misses_deadlock"])
def test_each_wrong_schedule_fails_the_same_checks_on_ranks(attempt):
    fails, fragment = WRONG[attempt]
    result = run_lab(one_f_one_b.LAB, os.path.join(HERE, "attempts", f"one_f_one_b_{attempt}.py"))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    assert any(fragment in r.message for r in result.checks if not r.passed), render.lab_feedback(result)


def test_the_simulator_is_shown_no_right_schedule_but_its_own():
    plain = one_f_one_b.analyse(_load(SOLUTION).one_f_one_b, "one_f_one_b", 4, 8)
    labels = [label for label, _ in one_f_one_b.simulator_cases(plain)]
    assert labels[-1] == "your one_f_one_b" and not any("1F1B" in label for label in labels)


def test_importing_the_course_schedule_is_refused_without_starting_a_rank():
    result = run_lab(one_f_one_b.LAB, os.path.join(HERE, "attempts", "one_f_one_b_imports_course.py"))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert result.checks[0].message.startswith("your file uses course.model_parallel.schedules.one_f_one_b, a "
                                                "ready-made version of what this lab asks you to write")


def test_the_course_simulation_is_refused_for_idle_fraction(tmp_path):
    path = tmp_path / "one_f_one_b.py"
    path.write_text("from course.model_parallel import schedules\n\n\ndef idle_fraction(plans):\n"
                    "    return schedules.simulated_bubble(lambda p, m, s: plans[s], len(plans), 1)\n")
    result = run_lab(one_f_one_b.LAB, str(path))
    assert set(result.failed()) == EVERY and result.runs == 0
    assert "course.model_parallel.schedules.simulated_bubble" in result.checks[0].message
