"""course.model_parallel.two_stage: split stages compose to the model; on ranks, a pipeline step gives the unsplit
model's
gradients and records every micro-batch in GPipe order."""

import naive_ranks
import pytest
import torch

from course.model_parallel import two_stage as mp
from course.models import MLP, DigitsCNN, flops_per_sample


def test_split_stages_compose_to_the_model():
    torch.manual_seed(0)
    model = DigitsCNN(width=4)
    x = torch.rand(5, 1, 8, 8)
    for stages in (2, 3, 4, 5):
        points = mp.balanced_split_points(model, stages, (1, 8, 8))
        parts = mp.split(model, points)
        assert len(parts) == stages
        assert torch.equal(torch.nn.Sequential(*parts)(x), model(x))


def test_balanced_split_puts_the_two_big_convolutions_on_different_stages():
    model = DigitsCNN()
    flops = mp.layer_flops(model, (1, 8, 8))
    assert sum(flops) == pytest.approx(flops_per_sample(model, (1, 8, 8)))
    assert mp.balanced_split_points(model, 2, (1, 8, 8)) == [5]  # before the third convolution


@pytest.mark.parametrize("points", [[0], [13], [5, 5], [6, 4], [1, 2]])
def test_split_rejects_points_outside_the_model_or_stages_without_parameters(points):
    with pytest.raises(ValueError, match="split points|hold no parameters"):
        mp.split(DigitsCNN(), points)


def test_layers_and_balanced_split_reject_what_they_cannot_split():
    with pytest.raises(ValueError, match="cannot flatten MLP"):
        mp.layers(MLP())
    with pytest.raises(ValueError, match="num_stages must be between 1 and 5"):
        mp.balanced_split_points(DigitsCNN(), 6, (1, 8, 8))


@pytest.fixture(scope="module")
def report():
    return [rank["pipe"] for rank in naive_ranks.report()]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("m", naive_ranks.PIPE.micro_batches)
def test_pipeline_gradients_equal_the_unsplit_model(report, m):
    loss, expected = mp.unsplit_gradients(naive_ranks.PIPE)
    assert report[-1]["loss"][m] == pytest.approx(loss, rel=1e-5)
    assert torch.allclose(torch.cat([rank["grads"][m] for rank in report]), expected, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pipeline_timeline_has_every_micro_batch_in_gpipe_order(report):
    for m in naive_ranks.PIPE.micro_batches:
        for stage, rank in enumerate(report):
            events = rank["events"][m]
            assert [(e.kind, e.micro_batch) for e in events] == (
                [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))])
            assert all(e.stage == stage and 0 <= e.start <= e.end for e in events)
            # every rank reports the same step times (the slowest stage's), one per timed repeat
            assert rank["step_s"][m] == report[0]["step_s"][m] and len(rank["step_s"][m]) == naive_ranks.PIPE.repeats
    assert "got 2 stages on world_size=4" in naive_ranks.report()[0]["errors"]["stages"]
    expected = "num_micro_batches must be an integer number of micro-batches from 1 to 6, got 7"
    assert expected in naive_ranks.report()[0]["errors"]["micro_batches"]
