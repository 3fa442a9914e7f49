"""A single linear neuron ``y = w x + b`` fitted to a noisy line: the problem whose answer we know.

Its mean-squared-error loss is a bowl in the two parameters ``(w, b)``, so the optimum has a closed form
(least squares), the loss surface can be drawn as contours, and an optimizer's path across it can be
watched update by update. Taught in ``notebooks/01_gd_vs_sgd.ipynb``.

    x, y = noisy_line(n=64)
    w_opt, b_opt = least_squares(x, y)
    model = neuron(w=-2.0, b=3.0)          # start far away, to see the path
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from course.arguments import check_count
from course.optimization.gradient_descent import Trajectory

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def noisy_line(n: int = 64, w: float = 2.0, b: float = -1.0, noise: float = 0.5,
               x_range: tuple[float, float] = (0.0, 2.0),
               seed: int = 0, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points ``y = w x + b + noise * N(0, 1)`` with ``x`` uniform in ``x_range``, in float64.

    Returns:
        ``x`` and ``y``, each ``(n, 1)`` float64 on ``device``.

    Raises:
        ValueError: ``n < 2`` (a line needs two points) or ``noise < 0``.
    """
    n = check_count("n", n, minimum=2, unit="(a line needs two points)")
    if not noise >= 0:
        raise ValueError(f"noise must be a standard deviation >= 0, got {noise!r}.")
    generator = torch.Generator().manual_seed(seed)
    low, high = x_range
    x = low + (high - low) * torch.rand(n, 1, generator=generator, dtype=torch.float64)
    y = w * x + b + noise * torch.randn(n, 1, generator=generator, dtype=torch.float64)
    return x.to(device), y.to(device)


def _columns(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` as float64 vectors of equal length N, from ``(N,)`` or ``(N, 1)``."""
    xs = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    ys = np.asarray(y.detach().cpu() if isinstance(y, torch.Tensor) else y, dtype=np.float64)
    if (xs.shape[1:] not in ((), (1,)) or ys.shape[1:] not in ((), (1,)) or xs.ndim == 0 or ys.ndim == 0
            or len(xs) != len(ys) or len(xs) == 0):
        raise ValueError(f"expected x and y of shape (N,) or (N, 1) with the same N, got x {xs.shape} and "
                         f"y {ys.shape}; N must be at least 1.")
    return xs.reshape(-1), ys.reshape(-1)


def least_squares(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The ``(w, b)`` that minimise ``mean((w x + b - y)^2)``, in closed form (``np.linalg.lstsq``).

    Args:
        x, y: ``(N,)`` or ``(N, 1)``, any device.

    Raises:
        ValueError: shapes that are not N scalars each, or all ``x`` equal (then no unique line fits).
    """
    xs, ys = _columns(x, y)
    if np.ptp(xs) == 0:
        raise ValueError(f"all {len(xs)} x values equal {xs[0]}: no unique line; give at least two distinct x.")
    design = np.stack([xs, np.ones_like(xs)], axis=1)  # (N, 2): columns multiply w and b
    (w, b), *_ = np.linalg.lstsq(design, ys, rcond=None)
    return float(w), float(b)


def mse(w: np.ndarray | float, b: np.ndarray | float, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """``mean((w x + b - y)^2)`` for every ``(w, b)`` pair; ``w`` and ``b`` broadcast (e.g. a meshgrid)."""
    xs, ys = _columns(x, y)
    w, b = np.asarray(w, dtype=np.float64)[..., None], np.asarray(b, dtype=np.float64)[..., None]
    return ((w * xs + b - ys) ** 2).mean(axis=-1)


def max_stable_lr(x: torch.Tensor) -> float:
    """The largest learning rate at which gradient descent on the MSE does not diverge: ``2 / lambda_max(H)``.

    The loss is quadratic with Hessian ``H = 2 [[mean x^2, mean x], [mean x, 1]]``; a gradient step
    multiplies the error along each eigenvector by ``1 - lr * lambda``, which shrinks only if
    ``lr < 2 / lambda``.
    """
    xs, _ = _columns(x, x)
    hessian = 2 * np.array([[np.mean(xs ** 2), np.mean(xs)], [np.mean(xs), 1.0]])
    return float(2 / np.linalg.eigvalsh(hessian).max())


def neuron(w: float = 0.0, b: float = 0.0, device: torch.device | str = "cpu") -> nn.Linear:
    """A float64 ``nn.Linear(1, 1)`` starting at ``(w, b)``; its parameter vector is ``[w, b]``."""
    model = nn.Linear(1, 1, dtype=torch.float64, device=device)
    with torch.no_grad():
        model.weight.fill_(w)
        model.bias.fill_(b)
    return model


def plot_loss_surface(x: torch.Tensor, y: torch.Tensor, trajectories: Sequence[Trajectory] = (),
                      ax: Axes | None = None, margin: float = 0.5) -> Axes:
    """Contours of the MSE over ``(w, b)``, the least-squares optimum, and each trajectory's path.

    Args:
        trajectories: runs on a :func:`neuron`, recorded with ``record_params=True``.
        margin: extra room around the paths, as a fraction of their extent.

    Returns:
        The matplotlib axes.

    Raises:
        ValueError: a trajectory without recorded parameters, or not of a two-parameter neuron.
    """
    import matplotlib.pyplot as plt

    for traj in trajectories:
        if traj.params is None or traj.params.shape[1:] != (2,):
            got = "no parameters (record_params=False)" if traj.params is None else f"params {traj.params.shape}"
            raise ValueError(f"trajectory {traj.label!r} has {got}: expected the (w, b) path of a neuron, "
                             f"shape (R, 2); rerun it with record_params=True on ln.neuron().")

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 5))
    w_opt, b_opt = least_squares(x, y)
    points = np.concatenate([[[w_opt, b_opt]]] + [t.params for t in trajectories])
    low, high = points.min(axis=0), points.max(axis=0)
    pad = margin * np.maximum(high - low, 0.5)
    ws, bs = np.meshgrid(np.linspace(low[0] - pad[0], high[0] + pad[0], 200),
                         np.linspace(low[1] - pad[1], high[1] + pad[1], 200))
    loss = mse(ws, bs, x, y)
    levels = np.geomspace(loss.min() + 1e-3, loss.max(), 25)
    ax.contour(ws, bs, loss, levels=levels, cmap="Greys", linewidths=0.7)
    for traj in trajectories:
        ax.plot(traj.params[:, 0], traj.params[:, 1], ".-", ms=2, lw=0.8, label=traj.label, alpha=0.8)
    ax.plot([w_opt], [b_opt], "r*", ms=14, label="least squares")
    ax.set_xlabel("w")
    ax.set_ylabel("b")
    ax.legend(loc="best", fontsize=8)
    return ax
