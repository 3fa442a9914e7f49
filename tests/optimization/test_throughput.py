"""course.optimization.throughput: the sweep's structure and arithmetic (never its speed: the CPU here is shared)."""

import numpy as np
import pytest
import torch
from torch import nn

from course.models import DigitsCNN
from course.optimization.throughput import Sweep, plot_sweep, seconds_per_step, step_seconds, sweep

pytestmark = pytest.mark.unit1


def test_sweep_measures_every_batch_size_in_ascending_order():
    model = DigitsCNN(width=2)
    before = [p.detach().clone() for p in model.parameters()]
    result = sweep(model, (1, 8, 8), 10, batch_sizes=[8, 1, 2], device="cpu", min_seconds=0.0)
    assert result.batch_sizes.tolist() == [1, 2, 8] and result.device == "cpu"
    assert result.seconds_per_step.shape == result.samples_per_s.shape == (3,)
    assert np.all(result.seconds_per_step > 0)
    np.testing.assert_allclose(result.samples_per_s, result.batch_sizes / result.seconds_per_step)
    assert [t.median for t in result.steps] == result.seconds_per_step.tolist()  # medians, with their intervals
    assert all(t.low <= t.median <= t.high and t.repeats >= 5 for t in result.steps)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # measuring does not train


def test_seconds_per_step_runs_forward_and_backward_on_the_requested_batch():
    shapes = []
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    model.register_forward_hook(lambda module, inputs, output: shapes.append(tuple(inputs[0].shape)))
    seconds = seconds_per_step(model, (2, 2), 3, batch_size=5, device="cpu", min_seconds=0.0, min_steps=4)
    assert seconds > 0
    assert shapes == [(5, 2, 2)] * 5  # one untimed warm-up, then min_steps timed steps
    assert all(p.grad is not None for p in model.parameters())
    times = step_seconds(model, (2, 2), 3, batch_size=2, device="cpu", min_seconds=0.0, min_steps=3)
    assert len(times) == 3 and all(t > 0 for t in times)


def fake_sweep(samples_per_s):
    batch = np.array([1, 2, 4, 8, 16])
    rate = np.array(samples_per_s, dtype=float)
    return Sweep(batch, batch / rate, rate, "cpu")


def test_saturation_batch_size_is_the_first_to_reach_the_fraction_of_peak():
    result = fake_sweep([10, 50, 91, 100, 95])
    assert result.saturation_batch_size() == 4
    assert result.saturation_batch_size(1.0) == 8
    assert result.saturation_batch_size(0.05) == 1
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 0"):
        result.saturation_batch_size(0)


@pytest.mark.parametrize("batch_sizes", [[], [0], [4, -1], [2.5], [True]])
def test_bad_batch_sizes_are_refused(batch_sizes):
    with pytest.raises(ValueError, match="batch_sizes (is empty|must be a positive integer number of samples, got)"):
        sweep(DigitsCNN(width=2), (1, 8, 8), 10, batch_sizes=batch_sizes, device="cpu")


def test_plot_sweep_marks_the_saturation_point():
    import matplotlib

    matplotlib.use("Agg")
    axes = plot_sweep(fake_sweep([10, 50, 91, 100, 95]))
    assert axes[0].get_xscale() == "log" and len(axes[0].lines) == 2
    assert "from batch 4" in axes[0].get_legend().get_texts()[0].get_text()


@pytest.mark.parametrize("input_shape, num_classes, match", [
    ((1, 7, 7), 10, r"one sample has shape \(1, 7, 7\).*input_shape=\(1, 7, 7\)"),
    ((), 10, r"input_shape must be the shape of one sample.*got \(\)"),
    ((1, 8, 8), 0, r"num_classes must be a positive integer, got 0"),
    ((1, 8, 8), 11, r"labels must be in 0..9 for a model with 10 outputs"),
])
def test_a_sweep_that_cannot_run_is_refused_before_timing(input_shape, num_classes, match):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    with pytest.raises(ValueError, match=match):
        sweep(model, input_shape, num_classes, batch_sizes=[1, 2], device="cpu", min_seconds=0.0)


def test_numpy_batch_sizes_and_classes_are_accepted():
    result = sweep(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), (1, 8, 8), np.int64(10),
                   batch_sizes=np.array([2, 1]), device="cpu", min_seconds=0.0)
    assert result.batch_sizes.tolist() == [1, 2]
