"""course.optimization.linear_neuron: the noisy line, its closed-form optimum, the loss surface and the stable rate."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.functional import mse_loss

from course.optimization import linear_neuron as ln
from course.optimization.gradient_descent import gradient_descent, sgd

pytestmark = pytest.mark.unit1


def test_noisy_line_is_seeded_float64_columns_around_the_line():
    x, y = ln.noisy_line(n=2000, w=2.0, b=-1.0, noise=0.5, seed=3)
    assert x.shape == y.shape == (2000, 1) and x.dtype == y.dtype == torch.float64
    assert torch.equal(x, ln.noisy_line(n=2000, seed=3)[0])
    assert 0 <= x.min() and x.max() <= 2
    assert float((y - (2 * x - 1)).std()) == pytest.approx(0.5, rel=0.1)


@settings(max_examples=30, deadline=None)
@given(w=st.floats(-5, 5), b=st.floats(-5, 5), noise=st.floats(0, 2), n=st.integers(2, 200),
       seed=st.integers(0, 10_000))
def test_least_squares_matches_the_normal_equations_and_is_the_minimum(w, b, noise, n, seed):
    x, y = ln.noisy_line(n=n, w=w, b=b, noise=noise, seed=seed)
    w_opt, b_opt = ln.least_squares(x, y)
    xs, ys = x.numpy().ravel(), y.numpy().ravel()
    design = np.stack([xs, np.ones(n)], axis=1)
    np.testing.assert_allclose([w_opt, b_opt], np.linalg.solve(design.T @ design, design.T @ ys), atol=1e-6)
    best = ln.mse(w_opt, b_opt, x, y)
    nudges = np.array([[1e-3, 0], [-1e-3, 0], [0, 1e-3], [0, -1e-3]])
    assert np.all(ln.mse(w_opt + nudges[:, 0], b_opt + nudges[:, 1], x, y) >= best)


def test_noise_free_line_is_recovered_exactly():
    x, y = ln.noisy_line(n=5, w=3.0, b=0.25, noise=0.0)
    assert ln.least_squares(x, y) == pytest.approx((3.0, 0.25), abs=1e-12)


def test_mse_agrees_with_torch_on_a_grid():
    x, y = ln.noisy_line(n=20)
    ws, bs = np.meshgrid(np.linspace(-1, 3, 4), np.linspace(-2, 2, 3))
    surface = ln.mse(ws, bs, x, y)
    assert surface.shape == (3, 4)
    for (i, j), value in np.ndenumerate(surface):
        assert value == pytest.approx(float(mse_loss(ws[i, j] * x + bs[i, j], y)), rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), low=st.floats(-3, 3), width=st.floats(0.5, 4))
def test_max_stable_lr_is_the_edge_between_convergence_and_divergence(seed, low, width):
    x, y = ln.noisy_line(n=16, x_range=(low, low + width), seed=seed)
    limit = ln.max_stable_lr(x)
    below = gradient_descent(ln.neuron(), mse_loss, x, y, lr=0.95 * limit, epochs=300, record_params=False)
    above = gradient_descent(ln.neuron(), mse_loss, x, y, lr=1.1 * limit, epochs=300, record_params=False)
    assert below.loss[-1] < below.loss[0] and above.loss[-1] > 1e3 * above.loss[0]


def test_neuron_starts_where_asked_and_its_parameter_vector_is_w_then_b():
    model = ln.neuron(-2.0, 3.0)
    assert torch.nn.utils.parameters_to_vector(model.parameters()).tolist() == [-2.0, 3.0]
    assert model(torch.tensor([[1.0]], dtype=torch.float64)).item() == 1.0


@pytest.mark.parametrize("x_shape, y_shape", [((10, 2), (10, 1)), ((10, 1), (9, 1)), ((10,), (10, 3)), ((), ())])
def test_bad_shapes_are_refused_with_expected_vs_got(x_shape, y_shape):
    with pytest.raises(ValueError, match=r"expected x and y of shape \(N,\) or \(N, 1\) with the same N, got"):
        ln.least_squares(torch.zeros(x_shape), torch.zeros(y_shape))


def test_degenerate_and_invalid_data_are_refused():
    with pytest.raises(ValueError, match="no unique line"):
        ln.least_squares(torch.ones(4, 1), torch.arange(4.0).reshape(4, 1))
    with pytest.raises(ValueError, match="n must be an integer >= 2.*got 1"):
        ln.noisy_line(n=1)
    with pytest.raises(ValueError, match="noise must be a standard deviation >= 0, got -1"):
        ln.noisy_line(noise=-1)


def test_plot_loss_surface_draws_each_path_and_the_optimum():
    import matplotlib

    matplotlib.use("Agg")
    x, y = ln.noisy_line(n=16)
    runs = [sgd(ln.neuron(-1, 2), mse_loss, x, y, lr=0.05, epochs=2, batch_size=b) for b in (1, 16)]
    ax = ln.plot_loss_surface(x, y, runs)
    assert len(ax.lines) == 3
    np.testing.assert_allclose(ax.lines[0].get_xydata(), runs[0].params)
    np.testing.assert_allclose(ax.lines[-1].get_xydata(), [ln.least_squares(x, y)])


def test_plot_loss_surface_refuses_a_run_recorded_without_parameters():
    x, y = ln.noisy_line(16)
    run = sgd(ln.neuron(), mse_loss, x, y, lr=0.1, epochs=1, batch_size=4, record_params=False)
    with pytest.raises(ValueError, match=r"'batch 4' has no parameters \(record_params=False\).*record_params=True"):
        ln.plot_loss_surface(x, y, [run])


def test_least_squares_refuses_empty_data():
    with pytest.raises(ValueError, match=r"got x \(0,\) and y \(0,\); N must be at least 1"):
        ln.least_squares(torch.zeros(0), torch.zeros(0))


def test_noisy_line_accepts_a_numpy_integer():
    assert ln.noisy_line(np.int64(5))[0].shape == (5, 1)
