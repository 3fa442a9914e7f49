"""course.numerics.divergence: hooks record named outputs and gradients, and the first record beyond its bound is
named with its module or parameter, phase, step and rank."""

import pytest
import torch
from torch import nn

from course.numerics.divergence import FORWARD, GRADIENT, Recorder, first_divergence

pytestmark = pytest.mark.unit8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _records(model: nn.Module, steps: int = 2) -> list:
    recorder = Recorder(rank=1).watch_outputs(model).watch_gradients(model)
    for step in range(steps):
        recorder.step = step
        model.zero_grad()
        model(torch.ones(3, 4) * (step + 1)).sum().backward()
    recorder.close()
    return recorder.records


def test_hooks_record_outputs_then_gradients_in_the_order_they_are_computed():
    records = _records(_model(), steps=1)
    assert [(r.name, r.phase) for r in records] == [("0", FORWARD), ("1", FORWARD), ("2", FORWARD),
                                                    ("2.bias", GRADIENT), ("2.weight", GRADIENT),
                                                    ("0.bias", GRADIENT), ("0.weight", GRADIENT)]


def test_identical_runs_do_not_diverge_and_a_changed_weight_is_named_where_it_first_shows():
    reference = _records(_model())
    assert first_divergence(reference, reference, lambda record, want: 1e-6) is None
    changed = _model()
    with torch.no_grad():
        changed[2].bias[0] += 0.5  # the last layer's output is the first tensor it changes
    found = first_divergence(_records(changed), reference, lambda record, want: 1e-6)
    assert str(found).startswith("the first tensor that diverges is 2's output (forward, step 0, rank 1): beyond "
                                 "rounding: a bug (bound 1e-06, seen ")


def test_a_gradient_beyond_its_bound_is_named_with_its_chunk_and_a_shape_mismatch_says_both_shapes():
    mine, theirs = Recorder(rank=2, step=3), Recorder(rank=2, step=3)
    mine.add("x", GRADIENT, torch.tensor([1.0, 2.0]), chunk=2)
    theirs.add("x", GRADIENT, torch.tensor([1.0, 2.5]), chunk=2)
    found = first_divergence(mine.records, theirs.records, lambda record, want: 0.1)
    assert str(found) == ("the first tensor that diverges is x's gradient (backward, step 3, rank 2, chunk 2): "
                          "beyond rounding: a bug (bound 0.1, seen 0.5)")
    assert first_divergence(mine.records, theirs.records, lambda record, want: 0.5) is None
    wrong = Recorder(rank=2, step=3)
    wrong.add("x", GRADIENT, torch.zeros(3), chunk=2)
    assert str(first_divergence(wrong.records, theirs.records, lambda r, w: 0.1)).endswith(
        "it has shape (3,), expected shape (2,)")
