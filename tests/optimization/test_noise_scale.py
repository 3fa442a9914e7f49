"""course.optimization.noise_scale: both estimators against the closed form of linear regression with Gaussian noise."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course import data_parallel as dp
from course import models
from course.optimization import noise_scale as ns

TRUE_WEIGHT = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
NOISE_STD = 0.7



def regression_model(weight: torch.Tensor) -> nn.Module:
    model = nn.Linear(len(weight), 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(weight)
    return model


def test_per_sample_gradients_match_one_backward_per_sample():
    torch.manual_seed(0)
    model, x, y = models.MLP(hidden=(8,)), torch.rand(5, 1, 8, 8), torch.randint(10, (5,))
    got = ns.per_sample_gradients(model, x, y)
    for i in range(5):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        assert torch.allclose(got[i], torch.cat([p.grad.reshape(-1) for p in model.parameters()]), atol=1e-6)


@pytest.mark.parametrize("weight, input_cov", [
    (torch.zeros(4, dtype=torch.float64), None),
    (torch.tensor([0.5, -1.0, 1.0, 0.3], dtype=torch.float64), None),
    (torch.zeros(4, dtype=torch.float64), torch.diag(torch.tensor([2.0, 1.0, 0.5, 0.1], dtype=torch.float64))),
])
def test_per_sample_estimate_matches_the_closed_form(weight, input_cov):
    exact = ns.linear_regression_noise_scale(weight, TRUE_WEIGHT, NOISE_STD, input_cov)
    x, y = ns.linear_regression_data(40_000, TRUE_WEIGHT, NOISE_STD, input_cov, torch.Generator().manual_seed(1))
    estimate = ns.from_per_sample(ns.per_sample_gradients(regression_model(weight), x, y, ns.half_squared_error))
    assert estimate.trace_sigma == pytest.approx(exact.trace_sigma, rel=0.05)
    assert estimate.grad_norm_sq == pytest.approx(exact.grad_norm_sq, rel=0.05)
    assert estimate.b_simple == pytest.approx(exact.b_simple, rel=0.1)


def test_closed_form_at_the_optimum_is_pure_label_noise():
    exact = ns.linear_regression_noise_scale(TRUE_WEIGHT, TRUE_WEIGHT, NOISE_STD)
    assert exact.grad_norm_sq == 0 and exact.trace_sigma == pytest.approx(4 * NOISE_STD**2)
    assert exact.b_simple == math.inf


@settings(max_examples=50, deadline=None)
@given(trace_sigma=st.floats(1e-3, 1e3), grad_norm_sq=st.floats(1e-3, 1e3), b_small=st.integers(1, 64),
       factor=st.integers(2, 64))
def test_two_batch_estimator_inverts_the_expected_norms_exactly(trace_sigma, grad_norm_sq, b_small, factor):
    b_big = b_small * factor
    expected_norm_sq = lambda b: grad_norm_sq + trace_sigma / b  # E|G_B|^2
    got = ns.two_batch_estimate(expected_norm_sq(b_small), expected_norm_sq(b_big), b_small, b_big)
    assert got.trace_sigma == pytest.approx(trace_sigma, rel=1e-6, abs=1e-9)
    assert got.grad_norm_sq == pytest.approx(grad_norm_sq, rel=1e-6, abs=1e-9)


def test_two_batch_estimator_is_unbiased_over_data_parallel_steps():
    weight = torch.tensor([0.5, -1.0, 1.0, 0.3], dtype=torch.float64)
    exact = ns.linear_regression_noise_scale(weight, TRUE_WEIGHT, NOISE_STD)
    x, y = ns.linear_regression_data(600 * 32, TRUE_WEIGHT, NOISE_STD, generator=torch.Generator().manual_seed(2))
    replicas = dp.replicate(regression_model(weight), ["cpu"] * 4)
    optimizers = [torch.optim.SGD(r.parameters(), lr=0.0) for r in replicas]
    estimates = [ns.from_step(dp.train_step(replicas, optimizers, xb, yb, ns.half_squared_error), 4, 32)
                 for xb, yb in zip(x.split(32), y.split(32), strict=True)]
    assert sum(e.trace_sigma for e in estimates) / len(estimates) == pytest.approx(exact.trace_sigma, rel=0.1)
    assert sum(e.grad_norm_sq for e in estimates) / len(estimates) == pytest.approx(exact.grad_norm_sq, rel=0.1)


@settings(max_examples=30, deadline=None)
@given(scale=st.floats(0.05, 0.95), noise_std=st.floats(0.1, 2.0))
def test_noise_scale_grows_as_the_parameters_approach_the_optimum(scale, noise_std):
    start = torch.zeros(4, dtype=torch.float64)
    closer = TRUE_WEIGHT * scale  # on the segment from start to the optimum: lower loss
    far = ns.linear_regression_noise_scale(start, TRUE_WEIGHT, noise_std)
    near = ns.linear_regression_noise_scale(closer, TRUE_WEIGHT, noise_std)
    assert near.b_simple > far.b_simple


def test_tracking_during_training_sees_the_loss_fall_and_the_noise_scale_grow():
    x, y = ns.linear_regression_data(512, TRUE_WEIGHT, NOISE_STD, generator=torch.Generator().manual_seed(3))
    points = ns.track_during_training(regression_model(torch.zeros(4, dtype=torch.float64)), x, y, global_batch_size=16,
                                      lr=0.05, steps=120, every=40, loss_fn=ns.half_squared_error)
    assert [p.step for p in points] == [40, 80, 120]
    assert points[-1].loss < points[0].loss
    assert points[-1].per_sample.b_simple > 2 * points[0].per_sample.b_simple
    assert points[-1].two_batch.trace_sigma == pytest.approx(points[-1].per_sample.trace_sigma, rel=0.5)


@pytest.mark.parametrize("call, message", [
    (lambda: ns.from_per_sample(torch.ones(1, 3)), "B >= 2"),
    (lambda: ns.two_batch_estimate(1.0, 0.5, 32, 32), "must be smaller than big_batch_size"),
    (lambda: ns.two_batch_estimate(1.0, 0.5, 0, 32), "small_batch_size must be a positive integer"),
    (lambda: ns.two_batch_estimate(-1.0, 0.5, 8, 32), "cannot be negative"),
    (lambda: ns.linear_regression_noise_scale(torch.zeros(3), TRUE_WEIGHT, 1.0), "must both have shape"),
    (lambda: ns.per_sample_gradients(nn.Linear(2, 1), torch.ones(3, 2), torch.ones(2)), "3 samples but targets hold 2"),
    (lambda: ns.track_during_training(nn.Linear(2, 1), torch.ones(8, 2), torch.ones(8), 6, 0.1, 10), "split evenly"),
    (lambda: ns.from_step(dp.StepStats(1.0, 2.0, 1.0), 1, 8), "no small batch"),
    (lambda: ns.track_during_training(nn.Linear(2, 1), torch.ones(8, 2), torch.ones(8), 0, 0.1, 10), "batch_size"),
    (lambda: ns.track_during_training(nn.Linear(2, 1), torch.ones(8, 2), torch.ones(8), 16, 0.1, 10), "1 to 8, got 16"),
    (lambda: ns.track_during_training(nn.Linear(2, 1), torch.ones(8, 2), torch.ones(8), 4, -1.0, 10), "lr"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_checker_accepts_the_answer_and_rejects_a_wrong_one(capsys):
    def answer(small, big, b_small, b_big):
        return (small - big) / (1 / b_small - 1 / b_big), (b_big * big - b_small * small) / (b_big - b_small)

    assert ns.check_two_batch_exercise(answer)
    assert "Correct" in capsys.readouterr().out
    assert not ns.check_two_batch_exercise(lambda small, big, b_small, b_big: (small - big, big))
    assert "expected" in capsys.readouterr().out


def test_checker_reports_the_notebook_stub_as_not_attempted(capsys):
    def stub(small, big, b_small, b_big):
        raise NotImplementedError("write two_batch")

    assert not ns.check_two_batch_exercise(stub)
    assert capsys.readouterr().out.startswith("Not attempted yet")


def test_whole_dataset_mode_uses_the_exact_mean_and_covariance():
    grads = torch.tensor([[1.0, 0.0], [3.0, 2.0]], dtype=torch.float64)  # mean (2, 1), deviations (+-1, +-1)
    whole = ns.from_per_sample(grads, whole_dataset=True)
    assert (whole.trace_sigma, whole.grad_norm_sq) == (2.0, 5.0)
    sample = ns.from_per_sample(grads)
    assert (sample.trace_sigma, sample.grad_norm_sq) == (4.0, 3.0)  # unbiased: variance / (B - 1), minus tr/B


def test_per_sample_gradients_refuse_a_model_that_does_not_fit():
    with pytest.raises(ValueError, match=r"one sample has shape \(3,\).*input_shape=\(3,\)"):
        ns.per_sample_gradients(nn.Linear(2, 1), torch.ones(4, 3), torch.ones(4, 1), ns.half_squared_error)
    with pytest.raises(ValueError, match=r"labels must be in 0..9"):
        ns.per_sample_gradients(models.LinearModel(), torch.rand(4, 1, 8, 8), torch.full((4,), 10))


def test_numpy_integers_are_accepted_as_batch_sizes():
    estimate = ns.two_batch_estimate(2.0, 1.0, np.int64(8), np.int64(32))
    assert estimate.trace_sigma == pytest.approx(1.0 / (1 / 8 - 1 / 32))
    x, _ = ns.linear_regression_data(np.int64(5), TRUE_WEIGHT, NOISE_STD)
    assert x.shape == (5, 4)
