"""The DDP-by-hand lab (grader.labs.ddp): the stub fails every check, the solution passes all, each mistake its own.

The verdicts are also tested alone on timelines built by hand (no ranks): what counts as overlap, and the
diagnosis of a wrong update from its measured ratio to DDP's.
"""

import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.perf import protocol
from course.runtime.observed_record import Record
from grader import render
from grader.labs.core import run_lab
from grader.labs.ddp import check as ddp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "ddp", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "ddp", "reference.py")
ALL = [check.name for check in ddp.CHECKS]


@pytest.mark.timeout(600)
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(ddp.LAB, STUB)
    assert result.failed() == ALL and result.score == 0
    assert "Not attempted yet: your MyDDP still raises NotImplementedError" in render.lab_feedback(result)


@pytest.mark.timeout(900)
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(ddp.LAB, SOLUTION, hidden=True)  # the id "solution"'s variant, then 2 and 3 ranks
    assert result.passed, render.lab_feedback(result)
    assert result.runs == len(ddp.LAB.runs) + len(ddp.LAB.hidden_runs)
    assert result.variant == "your variant: world size 3, bucket cap 3,000 bytes"  # STUDENT_ID = "solution"
    speed = next(r for r in result.checks if r.name == "modelled_speed")  # a passing check's measure is kept
    assert speed.message.startswith("world_size=3, 3 SGD steps of a 4-layer MLP, buckets of at most 3000 bytes: ")
    assert "MODELLED step time" in speed.message


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("waits_in_hook", ["overlap"], "step 1: you waited for each allreduce inside the hook: backward could not "
     "compute the next gradient until it finished, so nothing overlapped"),
    ("after_backward", ["overlap"], "step 1: every allreduce started after backward ended"),
    ("sums", ["matches_ddp"], "your update is 4.00x DDP's; the gradients were summed, not averaged"),
    ("no_broadcast", ["broadcast"], "rank 1's parameters differ from rank 0's by"),
    # results land only at wait() (grader.labs.late_results): each synchronization mistake fails on every run
    ("no_wait", ["matches_ddp"], "an allreduce was never waited for, and its result is not there until"),
    ("no_copy_back", ["matches_ddp"], "every .grad still holds this rank's own gradient: the averaged bucket was "
     "never copied back"),
    ("reads_before_wait", ["matches_ddp"], "the bucket was read before its allreduce finished"),
    ("out_of_order", ["in_order"], "step 1 launched the buckets in the order 1, 0, 2, 3 (bytes 4224, 4136, 84, "
     "5376): bucket 1 filled first and went first. Every rank must launch bucket 0, then 1, 2, ..."),
    # torch's DDP reduces all its gradients in one bucket of 25 MB: the process group sees that one allreduce
    ("uses_torch_ddp", ["one_allreduce_per_bucket", "overlap", "no_torch_ddp"], "everything in one allreduce"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment, planted):
    result = run_lab(ddp.LAB, planted("ddp", attempt))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert first.startswith("world_size=4, ") and fragment in first, first
    if attempt == "uses_torch_ddp":
        built = next(r.message for r in result.checks if r.name == "no_torch_ddp")
        assert "you built torch's DistributedDataParallel" in built



@pytest.mark.timeout(600)
def test_the_self_check_without_an_id_also_runs_3_ranks_and_names_a_hard_coded_4(planted, tmp_path):
    result = run_lab(ddp.LAB, planted("ddp", "divides_by_four"))  # passes the published run: 4 ranks
    assert result.failed() == ["matches_ddp"] and result.runs == 2, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert first.startswith("your code assumes 4 ranks: it passes the published run, not this one with 3 ranks. "
                            "world_size=3, "), first
    mine = tmp_path / "mine.py"  # the solution as a student who set no id: both runs pass
    mine.write_text(open(SOLUTION).read().replace('STUDENT_ID = "solution"', 'STUDENT_ID = ""'))
    passed = run_lab(ddp.LAB, str(mine))
    assert passed.passed and passed.runs == 2, render.lab_feedback(passed)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("attempt", ["no_wait", "no_copy_back", "sums"])
def test_a_synchronization_mistake_names_the_first_parameter_gradient_that_diverges(attempt, planted):
    result = run_lab(ddp.LAB, planted("ddp", attempt))
    first = next(r.message for r in result.checks if not r.passed)
    assert "the first tensor that diverges is last.bias's gradient (backward, step 1, rank 0): beyond rounding: " \
           "a bug (bound " in first, first


@pytest.mark.timeout(600)
def test_the_solution_passes_on_5_and_6_ranks_within_the_derived_bound():
    runs = tuple({**ddp.LAB.runs[0], "world_size": world_size, "seed": world_size} for world_size in (5, 6))
    lab = dataclasses.replace(ddp.LAB, runs=runs, hidden_runs=(), variant={}, uneven={})
    result = run_lab(lab, SOLUTION)
    assert result.passed and result.runs == 2, render.lab_feedback(result)


@pytest.mark.timeout(600)
def test_the_solution_runs_under_torchrun_and_every_rank_ends_with_the_same_parameters():
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          SOLUTION], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    sums = re.findall(r"rank (\d): parameters sum to (\S+) ", run.stdout)
    assert sorted(rank for rank, _ in sums) == ["0", "1"] and len({total for _, total in sums}) == 1, run.stdout

# -- the verdicts alone, on timelines built by hand ---------------------------------------------------------------
READY = [1.0, 2.0, 3.0, 4.0]  # four gradients; backward returns at 4.5


def _record(*calls: Record) -> ddp.StepRecord:
    return ddp.StepRecord(list(calls), READY, [40, 1280, 128, 4096], backward_end=4.5)


def _allreduce(launched: float, waited: float | None, async_op: bool = True, nbytes: int = 0) -> Record:
    return Record(op="all_reduce", kind="collective", api="all_reduce", method="allreduce", group="", group_size=2,
                  peer=None, tag=None, nbytes=nbytes, sent_bytes=0.0, shapes=(), dtype="", where="", caller="",
                  by_torch=False, thread=0, start=launched, waited=waited, async_op=async_op)


def test_overlap_needs_an_allreduce_still_unwaited_when_a_later_gradient_is_ready():
    assert ddp.judge_overlap([_record(_allreduce(1.1, 5.0), _allreduce(4.1, 5.0))]).passed
    assert ddp.judge_overlap([_record(_allreduce(1.1, None))]).passed  # never waited for: still in flight


@pytest.mark.parametrize(("calls", "fragment"), [
    ((), "no allreduce was made"),
    ((_allreduce(4.6, 5.0), _allreduce(4.7, 5.0)), "every allreduce started after backward ended"),
    ((_allreduce(4.1, 4.2),), "started once backward's last gradient was ready"),
    ((_allreduce(1.1, 1.2), _allreduce(3.1, 3.2)), "you waited for each allreduce inside the hook"),
    ((_allreduce(1.1, 1.2, async_op=False),), "without async_op=True inside the hook"),
])
def test_no_overlap_is_explained_by_what_the_timeline_shows(calls, fragment):
    finding = ddp.judge_overlap([_record(_allreduce(1.1, 5.0))] + [_record(*calls)])
    assert not finding.passed and finding.message.startswith("step 2: ") and fragment in finding.message


@pytest.mark.parametrize(("made", "fragment"), [(4, "one per gradient"), (1, "everything in one allreduce"),
                                                (0, "no allreduce at all"), (3, "made 3 allreduces for 2 buckets")])
def test_bucket_count_is_judged_against_assign_buckets_in_the_order_gradients_were_ready(made, fragment):
    record = _record(*[_allreduce(1.0, 5.0)] * made)  # 40, 1280, 128 | 4096 with 4224-byte buckets: 2 buckets
    finding = ddp.judge_buckets([record], 4224)
    assert not finding.passed and fragment in finding.message
    assert ddp.judge_buckets([_record(*[_allreduce(1.0, 5.0)] * 2)], 4224).passed


@settings(deadline=None)  # the first call builds torch kernels: its time says nothing about the verdict
@given(world_size=st.integers(2, 8), size=st.floats(1e-3, 1.0))
def test_an_update_world_size_times_ddps_is_diagnosed_as_a_sum(world_size, size):
    reference = [torch.zeros(6), torch.full((6,), -size)]
    summed = [torch.zeros(6), torch.full((6,), -size * world_size)]
    finding = ddp.judge_matches(summed, reference, [0.0, 0.0], 0, world_size)
    assert not finding.passed and "summed, not averaged" in finding.message
    assert f"{world_size:.2f}x DDP's" in finding.message
    twice = [torch.zeros(6), torch.full((6,), -size / world_size)]
    assert "divided by world_size twice" in ddp.judge_matches(twice, reference, [0.0, 0.0], 0, world_size).message
    assert ddp.judge_matches(reference, reference, [0.0, 0.0], 0, world_size).passed


def test_ranks_that_disagree_are_named_before_any_ratio():
    reference = [torch.zeros(3), torch.ones(3)]
    finding = ddp.judge_matches([torch.zeros(3), torch.full((3,), 2.0)], reference, [0.0, 0.5], 2, 4)
    assert "rank 2's parameters differ from DDP's" in finding.message and "no longer agree" in finding.message


def test_broadcast_verdicts():
    assert ddp.judge_broadcast(0.0, 0.0, 1).passed
    assert "rank 3's parameters differ from rank 0's by 0.3" in ddp.judge_broadcast(0.3, 0.0, 3).message
    assert "not an average" in ddp.judge_broadcast(0.0, 0.2, 1).message


def test_the_modelled_speed_times_the_recorded_schedule_beside_ddps(monkeypatch):
    overlapped = _record(_allreduce(2.1, 5.0), _allreduce(4.1, 5.0))  # 40, 1280 | 128, 4096: launched as ready
    late = _record(_allreduce(4.6, 5.0), _allreduce(4.7, 5.0))      # the same buckets, after backward
    found = {name: ddp.judge_speed(record) for name, record in (("overlapped", overlapped), ("late", late))}
    assert all(f.passed for f in found.values())  # informational: reported, never failed
    for cluster in ("8 H100s over NVLink", "4 nodes over InfiniBand"):
        assert f"{cluster}: yours " in found["overlapped"].message
    # the error bar comes from the protocol's test set, as course.perf computes it now
    assert f"typically within {protocol.typical_error():.0%}" in found["late"].message
    ratio = {name: float(re.search(r"\(([\d.]+)x;", f.message).group(1)) for name, f in found.items()}
    assert ratio["overlapped"] < ratio["late"]
    # an instructor's points: a schedule within the factor passes, one beyond it fails
    monkeypatch.setattr(ddp, "SPEED", ddp.modelled.SpeedGrading(points=2, within=ratio["late"] - 0.005))
    assert ddp.judge_speed(overlapped).passed and not ddp.judge_speed(late).passed
    assert not ddp.judge_speed(_record()).passed


def _sized(*nbytes: int) -> list[Record]:
    return [_allreduce(float(i), None, nbytes=n) for i, n in enumerate(nbytes)]


@given(st.permutations([4136, 4224, 84, 5376]))
def test_in_order_passes_the_planned_order_or_the_ready_order_and_fails_any_other_reordering(order):
    planned = [40, 1280, 128, 2688, 128, 4096, 84, 5376]  # reverse parameters(): buckets of 4136, 4224, 84, 5376
    ready = [40, 1280, 128, 4096, 128, 2688, 84, 5376]  # backward's order: buckets of 1448, 4224, 2772, 5376
    record = ddp.StepRecord(_sized(*order), READY, ready, 4.5, planned)
    verdict = ddp.judge_in_order([record], 4224)
    assert verdict.passed == (order == [4136, 4224, 84, 5376]), verdict.message
    assert ddp.judge_in_order([ddp.StepRecord(_sized(1448, 4224, 2772, 5376), READY, ready, 4.5, planned)],
                              4224).passed
