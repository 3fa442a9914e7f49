"""grader.evidence: the checkpoint is graded only if it holds parameters rank 0's optimizer produced; the
evidence is frozen once built."""

import dataclasses

import pytest

from course import models
from grader.evidence import Checkpoint, Evidence, RunRecords, bind_checkpoint, judge_checkpoint
from grader.inrank import probes
from grader.inrank.records import End, Initial, Step

pytestmark = pytest.mark.unit6


def step(number: int, digests: list[str], before: list[str]) -> Step:
    return Step(rank=0, step=number, epoch=0, indices=(), lr=(0.1,), fingerprint=(0.0,), digests=tuple(digests),
                digests_before=tuple(before))


def trained(steps: int, end_digests=None, broken_before: int | None = None) -> tuple[RunRecords, list[list[str]]]:
    """Records of ``steps`` rank-0 steps with the digests of as many different models, and those digests;
    with ``broken_before``, that step (0-based) started from another model's parameters."""
    states = [probes.digests(list(models.DigitsCNN().parameters())) for _ in range(steps)]
    befores = [states[i - 1] if i else ["initial"] for i in range(steps)]
    if broken_before is not None:
        befores[broken_before] = probes.digests(list(models.DigitsCNN().parameters()))
    records = RunRecords(world_size=4, steps={0: [step(i + 1, d, befores[i]) for i, d in enumerate(states)]},
                         ends={0: [End(rank=0, how="returned", exit_code=0, steps=steps, error=None,
                                       digests=tuple(end_digests or states[-1]))]})
    return records, states


def test_the_model_after_the_last_step_is_bound_in_any_parameter_order():
    records, states = trained(3)
    assert bind_checkpoint(records, list(reversed(states[-1])), "checkpoint.pt") == Checkpoint(step=3)


def test_a_model_after_an_earlier_step_is_bound_to_that_step():
    records, states = trained(3)
    assert bind_checkpoint(records, states[0], "checkpoint.pt") == Checkpoint(step=1)


def test_parameters_no_recorded_step_produced_are_refused_with_the_fix():
    other = probes.digests(list(models.DigitsCNN().parameters()))
    records, _ = trained(3)
    bound = bind_checkpoint(records, other, "checkpoint.pt")
    assert bound.step is None
    assert "the last: step 3" in bound.error and "right after the last optimizer step" in \
        bound.error and "outside optimizer.step()" not in bound.error


def test_parameters_changed_between_two_steps_break_the_chain():
    """E.g. another model's weights copied in, then one more optimizer step: that step's result is refused."""
    records, states = trained(3, broken_before=2)
    bound = bind_checkpoint(records, states[2], "checkpoint.pt")
    assert bound.step is None and "changed between its optimizer steps 2 and 3, outside optimizer.step()" in \
        bound.error
    assert bind_checkpoint(records, states[1], "checkpoint.pt") == Checkpoint(step=2)  # before it


def test_parameters_changed_after_the_last_step_are_named():
    other = probes.digests(list(models.DigitsCNN().parameters()))
    records, _ = trained(2, end_digests=other)
    assert "changed after that step, outside optimizer.step()" in bind_checkpoint(records, other, "c.pt").error


def test_one_tensor_changed_is_enough_to_refuse():
    params = list(models.DigitsCNN().parameters())
    records = RunRecords(world_size=4, steps={0: [step(1, probes.digests(params), ["initial"])]})
    params[-1].data[0] += 1e-6
    assert bind_checkpoint(records, probes.digests(params), "checkpoint.pt").step is None


def test_without_a_recorded_step_nothing_is_evaluated():
    bound = bind_checkpoint(RunRecords(world_size=4), ["x"], "checkpoint.pt")
    assert bound.step is None and "no optimizer step was recorded on rank 0" in bound.error


def test_the_scores_are_kept_only_for_a_bound_checkpoint():
    records, states = trained(2)
    verdict = {"accuracy": 0.97, "val_accuracy": 0.9, "fingerprint": [1.0, 2.0], "digests": states[-1]}
    assert judge_checkpoint(records, verdict, "c.pt") == Checkpoint(0.97, 0.9, (1.0, 2.0), None, 2)
    unbound = judge_checkpoint(records, {**verdict, "digests": ["other"]}, "c.pt")
    assert unbound.test_accuracy is None and unbound.val_accuracy is None and "c.pt does not hold" in unbound.error
    failed = judge_checkpoint(records, {"error": "the checkpoint is not a state_dict"}, "c.pt")
    assert failed == Checkpoint(error="the checkpoint is not a state_dict")


def test_evidence_is_frozen_once_built():
    records, _ = trained(2)
    evidence = Evidence.of(records, expected_backend="gloo", status="ok", train_size=10,
                           checkpoint=Checkpoint(test_accuracy=0.9, step=2))
    assert evidence.test_accuracy == 0.9 and evidence.checkpoint_step == 2 and len(evidence.steps[0]) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        evidence.status = "crash on rank 0"
    with pytest.raises(TypeError):
        evidence.steps[1] = ()  # the mappings are read-only views
    with pytest.raises(AttributeError):
        evidence.steps[0].append(None)  # and each rank's records a tuple
    with pytest.raises(dataclasses.FrozenInstanceError):
        evidence.steps[0][0].step = 5  # and each record frozen


def test_an_average_of_the_recorded_weights_is_graded_and_said_so_not_flagged():
    """A checkpoint whose fingerprint is the mean of the last two steps' is evaluated (an SWA mean); the same
    checkpoint after a chain broken by weights copied in is still refused."""
    records, states = trained(3)
    prints = [(1.0, 2.0, 3.0, 4.0), (2.0, 1.0, 5.0, 3.0), (4.0, 2.0, 1.0, 7.0)]
    steps = [dataclasses.replace(s, fingerprint=(*p, 9.0)) for s, p in zip(records.steps[0], prints, strict=True)]
    initial = Initial(rank=0, fingerprint=(0.5, 0.5, 0.5, 0.5, 1.0), device="cpu")
    records = dataclasses.replace(records, steps={0: steps}, initials={0: [initial]})
    verdict = {"accuracy": 0.95, "val_accuracy": 0.9, "fingerprint": [3.0, 1.5, 3.0, 5.0, 8.0], "digests": ["x"]}
    judged = judge_checkpoint(records, verdict, "c.pt")
    assert judged.test_accuracy == 0.95 and not judged.foreign and judged.error is None
    assert judged.relation == "the mean of rank 0's weights after steps 2-3 (SWA)"
    broken, _ = trained(3, broken_before=2)
    broken = dataclasses.replace(broken, steps={0: [dataclasses.replace(s, fingerprint=t.fingerprint) for s, t in
                                                    zip(broken.steps[0], steps, strict=True)]}, initials={0: [initial]})
    refused = judge_checkpoint(broken, verdict, "c.pt")
    assert refused.foreign and refused.test_accuracy is None and refused.relation is None
