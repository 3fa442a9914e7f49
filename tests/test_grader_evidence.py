"""grader.evidence: the checkpoint is graded only if it holds parameters rank 0's optimizer produced."""

import pytest

from course import models
from grader import probes
from grader.evidence import Evidence, bind_checkpoint

pytestmark = pytest.mark.unit6


def trained(steps: int, end_digests=None) -> tuple[Evidence, list[list[str]]]:
    """Evidence of ``steps`` rank-0 steps with the digests of as many different models, and those digests."""
    states = [probes.digests(list(models.DigitsCNN().parameters())) for _ in range(steps)]
    evidence = Evidence(world_size=4, expected_backend="gloo")
    evidence.steps[0] = [{"kind": "step", "rank": 0, "step": i + 1, "digests": d,
                          "digests_before": states[i - 1] if i else ["initial"]} for i, d in enumerate(states)]
    evidence.ends[0] = [{"kind": "end", "rank": 0, "digests": end_digests or states[-1]}]
    return evidence, states


def test_the_model_after_the_last_step_is_bound_in_any_parameter_order():
    evidence, states = trained(3)
    assert bind_checkpoint(evidence, list(reversed(states[-1])), "checkpoint.pt")
    assert evidence.checkpoint_step == 3 and evidence.checkpoint_error is None


def test_a_model_after_an_earlier_step_is_bound_to_that_step():
    evidence, states = trained(3)
    assert bind_checkpoint(evidence, states[0], "checkpoint.pt") and evidence.checkpoint_step == 1


def test_parameters_no_recorded_step_produced_are_refused_with_the_fix():
    other = probes.digests(list(models.DigitsCNN().parameters()))
    evidence, _ = trained(3)
    assert not bind_checkpoint(evidence, other, "checkpoint.pt")
    assert evidence.checkpoint_step is None
    assert "the last: step 3" in evidence.checkpoint_error and "right after the last optimizer step" in \
        evidence.checkpoint_error and "outside optimizer.step()" not in evidence.checkpoint_error


def test_parameters_changed_between_two_steps_break_the_chain():
    """E.g. another model's weights copied in, then one more optimizer step: that step's result is refused."""
    evidence, states = trained(3)
    evidence.steps[0][2]["digests_before"] = probes.digests(list(models.DigitsCNN().parameters()))
    assert not bind_checkpoint(evidence, states[2], "checkpoint.pt")
    assert "changed between its optimizer steps 2 and 3, outside optimizer.step()" in evidence.checkpoint_error
    assert bind_checkpoint(evidence, states[1], "checkpoint.pt") and evidence.checkpoint_step == 2  # before it


def test_parameters_changed_after_the_last_step_are_named():
    other = probes.digests(list(models.DigitsCNN().parameters()))
    evidence, _ = trained(2, end_digests=other)
    assert not bind_checkpoint(evidence, other, "checkpoint.pt")
    assert "changed after that step, outside optimizer.step()" in evidence.checkpoint_error


def test_one_tensor_changed_is_enough_to_refuse():
    evidence, states = trained(1)
    model = models.DigitsCNN()
    params = list(model.parameters())
    evidence.steps[0][0]["digests"] = probes.digests(params)
    params[-1].data[0] += 1e-6
    assert not bind_checkpoint(evidence, probes.digests(params), "checkpoint.pt")


def test_without_a_recorded_step_nothing_is_evaluated():
    evidence = Evidence(world_size=4, expected_backend="gloo")
    assert not bind_checkpoint(evidence, ["x"], "checkpoint.pt")
    assert "no optimizer step was recorded on rank 0" in evidence.checkpoint_error
