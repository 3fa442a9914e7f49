"""Carry a rounding-error bound through a small network, layer by layer (the bounds of :mod:`.bounds`, composed).

Each :class:`Tracked` holds a tensor's exact value (float64, from inputs already rounded to the run's dtype) and
a bound on the error of the same tensor computed in that dtype. A linear layer adds the error of its dot
products (``gamma_k`` on the magnitudes of the products) to the errors it was given, multiplied by the
weights' magnitudes; with ``parts`` ranks each summing a slice of the inner dimension, the reduction of their
partial sums adds its own term, computed from the partial sums' exact magnitudes. An element-wise function
multiplies the error by its largest slope. A check compares a distributed result with the one-process result
within ``student.err + reference.err``: both are off the exact value by at most their own bound.
Used by the tensor- and sequence-parallel labs' checks (:mod:`grader.labs`) and notebook 08's parity table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course.numerics import bounds


@dataclass(frozen=True)
class Tracked:
    """A tensor as computed in ``dtype``: its exact ``value`` (float64) and ``err``, a bound on |computed - value|."""

    value: torch.Tensor
    err: torch.Tensor
    dtype: torch.dtype

    @property
    def magnitude(self) -> torch.Tensor:
        """The largest |computed value| the error bound allows: |value| + err."""
        return self.value.abs() + self.err


def leaf(tensor: torch.Tensor, dtype: torch.dtype) -> Tracked:
    """An input given to both computations in ``dtype``: exact as given (rounded to ``dtype`` first)."""
    value = tensor.detach().to(dtype).double().cpu()
    return Tracked(value, torch.zeros_like(value), dtype)


def _split(tensor: torch.Tensor, parts: int, dim: int) -> tuple[torch.Tensor, ...]:
    if tensor.shape[dim] % parts:
        raise ValueError(f"expected an inner dimension divisible by {parts} ranks, got {tensor.shape[dim]}")
    return torch.chunk(tensor, parts, dim=dim)


def _spread(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How errors ``a`` (or ``b``) spread through ``a @ b``: their worst case ``|a| @ |b|`` adds k errors of one
    sign; rounding errors have random signs, so they add like a random walk, ``lambda sqrt(a^2 @ b^2)``
    (Hoeffding's inequality; ``lambda`` as for the dot products, :data:`course.numerics.bounds.LAMBDA`)."""
    return torch.minimum(a @ b, bounds.LAMBDA * torch.sqrt((a * a) @ (b * b)))


def matmul(a: Tracked, b: Tracked, parts: int = 1) -> Tracked:
    """``a @ b`` (inner dimension k), computed whole, or by ``parts`` ranks on k/parts each and then summed
    across the ranks in ``a.dtype`` (an all-reduce or a reduce-scatter), in any order."""
    value = a.value @ b.value
    products = a.magnitude @ b.magnitude  # sum_i |a_i b_i|, errors included
    err = _spread(a.err, b.magnitude) + _spread(a.value.abs(), b.err)
    k = a.value.shape[-1]
    err = err + bounds.dot_bound(products, k // parts, a.dtype)
    if parts > 1:
        partials = [x @ y for x, y in zip(_split(a.value, parts, -1), _split(b.value, parts, -2), strict=True)]
        err = err + bounds.reduction_bound(sum(p.abs() for p in partials) + err, parts, a.dtype)
    return Tracked(value, err, a.dtype)


def add(a: Tracked, b: Tracked) -> Tracked:
    """``a + b`` (broadcast), rounded once."""
    value = a.value + b.value
    return Tracked(value, a.err + b.err + bounds.cast_bound(value.abs() + a.err + b.err, a.dtype), a.dtype)


def multiply(a: Tracked, b: Tracked) -> Tracked:
    """``a * b`` element-wise, rounded once."""
    value = a.value * b.value
    err = a.err * b.magnitude + a.value.abs() * b.err
    return Tracked(value, err + bounds.cast_bound(value.abs() + err, a.dtype), a.dtype)


def total(a: Tracked, dims: tuple[int, ...]) -> Tracked:
    """``a.sum(dims)``: n terms summed in the accumulation dtype, then rounded to ``a.dtype``."""
    n = 1
    for dim in dims:
        n *= a.value.shape[dim]
    wide = bounds.accumulation(a.dtype)
    err = a.err.sum(dims) + bounds.summation_bound(a.magnitude.sum(dims), n, wide)
    value = a.value.sum(dims)
    if wide != a.dtype:
        err = err + bounds.cast_bound(value.abs() + err, a.dtype)
    return Tracked(value, err, a.dtype)


def elementwise(a: Tracked, fn, slope: float, ulps: float = 2.0) -> Tracked:
    """``fn(a)`` element-wise, for a function whose slope is at most ``slope`` in size, evaluated to within
    ``ulps`` units of roundoff of its result (torch's GELU and its derivative: a few)."""
    value = fn(a.value)
    err = slope * a.err
    return Tracked(value, err + ulps * bounds.cast_bound(value.abs() + err, a.dtype), a.dtype)


def transpose(a: Tracked, dim0: int = -1, dim1: int = -2) -> Tracked:
    """``a.transpose(dim0, dim1)``: exact."""
    return Tracked(a.value.transpose(dim0, dim1), a.err.transpose(dim0, dim1), a.dtype)


def flatten(a: Tracked, start: int, end: int) -> Tracked:
    """``a.flatten(start, end)``: exact."""
    return Tracked(a.value.flatten(start, end), a.err.flatten(start, end), a.dtype)


def comparison_bound(student: Tracked, reference: Tracked) -> torch.Tensor:
    """The largest |student - reference| rounding allows: both are within their own bound of the exact value."""
    return student.err + reference.err


#: max |GELU'(z)| (at z ~ 0.75) and max |GELU''(z)| (at z = 0): the slopes of GELU and of its derivative
GELU_SLOPE, GELU_CURVATURE = 1.13, 0.8
