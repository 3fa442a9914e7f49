"""course.optimization.gradient_descent: GD reaches the closed form, SGD with a full batch is GD, trajectories are
right."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.functional import cross_entropy, mse_loss

from course.models import DigitsCNN, LinearModel
from course.optimization import linear_neuron as ln
from course.optimization.gradient_descent import gradient_descent, minibatches, plot_loss_curves, sgd, step

pytestmark = pytest.mark.unit1


def line(n=32, seed=0):
    return ln.noisy_line(n=n, w=1.5, b=0.5, noise=0.3, seed=seed)


def test_gradient_descent_converges_to_least_squares():
    x, y = line()
    w_opt, b_opt = ln.least_squares(x, y)
    model = ln.neuron(-3.0, 4.0)
    traj = gradient_descent(model, mse_loss, x, y, lr=0.8 * ln.max_stable_lr(x), epochs=500)
    np.testing.assert_allclose(traj.params[-1], [w_opt, b_opt], rtol=0, atol=1e-9)
    assert traj.loss[-1] == pytest.approx(float(ln.mse(w_opt, b_opt, x, y)), abs=1e-12)
    assert np.all(np.diff(traj.loss) <= 1e-15)  # below the stability limit GD never goes uphill


def test_gradient_descent_diverges_just_above_the_stable_rate():
    x, y = line()
    traj = gradient_descent(ln.neuron(), mse_loss, x, y, lr=1.05 * ln.max_stable_lr(x), epochs=500)
    assert traj.loss[-1] > 1e6


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 40), seed=st.integers(0, 10_000), epochs=st.integers(1, 5))
def test_sgd_with_a_full_batch_is_gradient_descent_bit_for_bit(n, seed, epochs):
    x, y = line(n, seed)
    gd = gradient_descent(ln.neuron(0.3, -0.2), mse_loss, x, y, lr=0.1, epochs=epochs)
    full = sgd(ln.neuron(0.3, -0.2), mse_loss, x, y, lr=0.1, epochs=epochs, batch_size=n, seed=seed)
    assert np.array_equal(gd.params, full.params)
    assert np.array_equal(gd.loss, full.loss)
    assert np.array_equal(gd.updates, full.updates) and np.array_equal(gd.samples, full.samples)


def test_one_sgd_update_matches_the_hand_derived_gradient():
    x, y = line(8)
    w, b, lr = 0.7, -0.4, 0.05
    traj = sgd(ln.neuron(w, b), mse_loss, x, y, lr=lr, epochs=1, batch_size=1, seed=5)
    first = next(minibatches(8, 1, torch.Generator().manual_seed(5)))  # the same shuffle as the run
    xi, yi = float(x[first]), float(y[first])
    residual = w * xi + b - yi  # d/dw (w x + b - y)^2 = 2 r x, d/db = 2 r
    np.testing.assert_allclose(traj.params[1], [w - lr * 2 * residual * xi, b - lr * 2 * residual], atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 50), batch_size=st.integers(1, 50), seed=st.integers(0, 1000))
def test_minibatches_partition_the_epoch(n, batch_size, seed):
    batch_size = min(batch_size, n)
    batches = list(minibatches(n, batch_size, torch.Generator().manual_seed(seed)))
    assert len(batches) == math.ceil(n / batch_size)
    assert all(len(b) == batch_size for b in batches[:-1]) and 1 <= len(batches[-1]) <= batch_size
    assert sorted(torch.cat(batches).tolist()) == list(range(n))
    assert all(torch.equal(b, b.sort().values) for b in batches)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 30), batch_size=st.integers(1, 30), epochs=st.integers(1, 3),
       record_every=st.integers(1, 7), seed=st.integers(0, 1000))
def test_sgd_trajectory_shapes_and_recording(n, batch_size, epochs, record_every, seed):
    batch_size = min(batch_size, n)
    x, y = line(n, seed)
    model = ln.neuron(1.0, 1.0)
    traj = sgd(model, mse_loss, x, y, lr=0.05, epochs=epochs, batch_size=batch_size, seed=seed,
               record_every=record_every)
    total = epochs * math.ceil(n / batch_size)
    expected_updates = sorted(set(range(0, total + 1, record_every)) | {total})
    assert traj.updates.tolist() == expected_updates
    rows = len(expected_updates)
    assert traj.params.shape == (rows, 2) and traj.loss.shape == traj.wall_time.shape == (rows,)
    assert traj.samples[-1] == epochs * n and traj.epochs[-1] == epochs
    assert np.all(np.diff(traj.samples) > 0) and np.all(np.diff(traj.wall_time) >= 0) and traj.wall_time[0] == 0
    np.testing.assert_array_equal(traj.params[-1], [model.weight.item(), model.bias.item()])
    # each recorded loss is the full-data loss at the recorded parameters
    np.testing.assert_allclose(traj.loss, ln.mse(traj.params[:, 0], traj.params[:, 1], x, y), rtol=1e-12)


def test_sgd_is_repeatable_by_seed_and_differs_across_seeds():
    x, y = line(32)
    runs = [sgd(ln.neuron(), mse_loss, x, y, lr=0.05, epochs=2, batch_size=4, seed=s).params for s in (1, 1, 2)]
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


def test_step_returns_the_batch_loss_and_moves_against_the_gradient():
    x, y = line(16)
    model = ln.neuron(0.0, 0.0)
    before = ln.mse(0.0, 0.0, x, y)
    assert float(step(model, mse_loss, x, y, lr=0.01)) == pytest.approx(before)
    assert ln.mse(model.weight.item(), model.bias.item(), x, y) < before


def test_sgd_trains_the_cnn_on_digits_without_keeping_parameters():
    torch.manual_seed(0)
    images = torch.rand(40, 1, 8, 8)
    labels = torch.randint(0, 10, (40,))
    model = DigitsCNN(width=4)
    traj = sgd(model, cross_entropy, images, labels, lr=0.1, epochs=3, batch_size=8, record_every=5,
               record_params=False)
    assert traj.params is None and traj.updates.tolist() == [0, 5, 10, 15]
    assert traj.loss[-1] < traj.loss[0]
    assert traj.label == "batch 8"


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), r"batch_size must be a positive integer number of samples \(at most 10\), got 0"),
    (dict(batch_size=11), r"from 1 to the number of samples \(10\), got 11"),
    (dict(batch_size=2.0), r"got 2.0"),
    (dict(lr=0.0), r"lr must be a positive finite number, got 0.0"),
    (dict(lr=-0.1), r"got -0.1"),
    (dict(lr=float("nan")), r"got nan"),
    (dict(epochs=0), r"epochs must be a positive integer, got 0"),
    (dict(record_every=0), r"record_every must be a positive integer, got 0"),
])
def test_bad_arguments_raise_value_errors_that_say_expected_vs_got(kwargs, match):
    x, y = line(10)
    args = dict(lr=0.1, epochs=1, batch_size=2) | kwargs
    with pytest.raises(ValueError, match=match):
        sgd(ln.neuron(), mse_loss, x, y, **args)


def test_mismatched_x_and_y_are_refused_by_both_optimizers():
    x, y = line(10)
    with pytest.raises(ValueError, match=r"expected x \(N, ...\) and y \(N, ...\), got x \(10, 1\) and y \(9, 1\)"):
        sgd(ln.neuron(), mse_loss, x, y[:9], lr=0.1, epochs=1, batch_size=2)
    with pytest.raises(ValueError, match=r"got x \(10, 1\) and y \(\)"):
        gradient_descent(ln.neuron(), mse_loss, x, y[0, 0], lr=0.1, epochs=1)
    with pytest.raises(ValueError, match="lr must be"):
        gradient_descent(ln.neuron(), mse_loss, x, y, lr=-1, epochs=1)


def test_regression_targets_that_would_broadcast_are_refused():
    x, y = line(10)
    with pytest.raises(ValueError, match=r"the model outputs \(10, 1\) but y is \(10,\): expected targets"):
        sgd(ln.neuron(), mse_loss, x, y.ravel(), lr=0.1, epochs=1, batch_size=2)


def test_sgd_with_a_full_batch_is_gradient_descent_bit_for_bit_on_the_cnn():
    images, labels = torch.rand(24, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(24) % 10
    runs = []
    for optimize in (gradient_descent, lambda *a, **k: sgd(*a, **k, batch_size=24, seed=7)):
        torch.manual_seed(0)
        model = DigitsCNN(width=4)
        runs.append((optimize(model, cross_entropy, images, labels, lr=0.5, epochs=3), model))
    (gd_run, gd_model), (sgd_run, sgd_model) = runs
    assert np.array_equal(gd_run.params, sgd_run.params) and np.array_equal(gd_run.loss, sgd_run.loss)
    assert gd_run.loss[-1] < gd_run.loss[0]


def test_plot_loss_curves_draws_one_line_per_run_on_each_panel():
    import matplotlib

    matplotlib.use("Agg")
    x, y = line(16)
    runs = [sgd(ln.neuron(), mse_loss, x, y, lr=0.05, epochs=2, batch_size=b) for b in (1, 16)]
    axes = plot_loss_curves(runs, optimum=float(ln.mse(*ln.least_squares(x, y), x, y)))
    assert [len(ax.lines) for ax in axes] == [2, 2, 2]
    assert axes[0].get_yscale() == "log"
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["batch 1", "full batch (N=16)"]


def test_a_model_built_for_other_inputs_is_refused_before_training():
    x, labels = torch.rand(12, 1, 7, 7), torch.arange(12) % 10
    with pytest.raises(ValueError, match=r"one sample has shape \(1, 7, 7\).*input_shape=\(1, 7, 7\)"):
        sgd(LinearModel(), cross_entropy, x, labels, lr=0.1, epochs=1, batch_size=4)
    with pytest.raises(ValueError, match=r"labels must be in 0..9"):
        gradient_descent(DigitsCNN(width=2), cross_entropy, torch.rand(12, 1, 8, 8), labels + 5, lr=0.1, epochs=1)


def test_numpy_integers_are_accepted_as_counts():
    x, y = line(10)
    traj = sgd(ln.neuron(), mse_loss, x, y, lr=0.1, epochs=np.int64(2), batch_size=np.int64(5),
               record_every=np.int32(1))
    assert traj.updates.tolist() == [0, 1, 2, 3, 4] and traj.batch_size == 5 and type(traj.batch_size) is int
