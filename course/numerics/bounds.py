"""How far can a correct distributed result be from the one-process result? A bound derived from the arithmetic.

A learner's distributed code never matches the unsplit model bit for bit: it sums in another order, in pieces.
So every comparison needs a tolerance. A hand-set one is either too loose (it hides bugs) or too tight (a correct
bf16 run on 6 ranks fails). This module derives it instead, from what was computed: the dtype's unit roundoff
``u``, how many terms each sum had, how many ranks' partial sums were added, and the magnitudes seen.

The rule is Higham's ("Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 3-4): summing ``n`` terms
in floating point, in any order, errs by at most ``gamma_{n-1} * sum|x_i|``, where ``gamma_k = k u / (1 - k u)``.
A dot product (a matmul's element) of inner dimension ``k`` errs by at most ``gamma_k * sum|x_i y_i|``. Adding
``p`` ranks' partial sums adds ``gamma_{p-1}`` on the sum of their magnitudes, and rounding to a low precision
adds ``u |x|``. :class:`Tracked` carries these bounds through a small network, layer by layer.

:func:`verdict` then answers the learner's question, "bug or rounding?":
"within rounding (bound 2.4e-06, seen 3e-07)" or "beyond rounding: a bug (bound 2.4e-06, seen 0.334)".
Used by the labs' checks (:mod:`grader.labs`) and the parity table of notebook 08
(:mod:`course.model_parallel.parity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: u: the largest relative error of rounding one real number to the dtype (half its machine epsilon)
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u`` of a floating-point dtype: 2^-24 for float32, 2^-8 for bfloat16, 2^-11 for float16, 2^-53 float64.

    Raises:
        ValueError: for a dtype that is not floating point.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"expected a floating-point dtype ({', '.join(map(str, UNIT_ROUNDOFF))}), got {dtype}: "
                         "rounding error is only defined for floating-point tensors")
    return UNIT_ROUNDOFF[dtype]


def gamma(k: int, dtype: torch.dtype) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: the relative error of ``k`` roundings in a row, at most.

    Raises:
        ValueError: when ``k u >= 1``: so many terms that the dtype cannot bound their sum at all.
    """
    u = unit_roundoff(dtype)
    if k < 0:
        raise ValueError(f"expected a number of roundings >= 0, got {k}")
    if k * u >= 1:
        raise ValueError(f"{k} roundings in {dtype} (u = {u:g}) can lose every digit: k u = {k * u:g} >= 1. "
                         "Accumulate in a wider dtype (float32) or sum fewer terms at a time.")
    return k * u / (1 - k * u)


#: lambda of the probabilistic bounds (Higham and Mary, 2019): see :func:`gamma_probable`. With 1, every correct
#: lab solution tried (tests/numerics/test_bounds.py: float32, bfloat16, float16; 2-6 ranks; shuffled reduction
#: orders) stayed within its bound, and the worst came within 5-8x of it. Higham's worst case (``gamma``, k
#: roundings of one sign) is about sqrt(k) times larger: 60x the errors seen in float32 for k = 64.
LAMBDA = 1.0


def gamma_probable(k: int, dtype: torch.dtype, lam: float | None = None) -> float:
    """Higham and Mary's probabilistic ``gamma~_k(lambda) = exp(lambda sqrt(k) u + k u^2 / (1 - u)) - 1``, never
    above :func:`gamma`: rounding errors of random sign grow like sqrt(k), not k (SIAM J. Sci. Comput., 2019)."""
    u, lam = unit_roundoff(dtype), LAMBDA if lam is None else lam
    return min(gamma(k, dtype), math.expm1(lam * math.sqrt(k) * u + k * u * u / (1 - u)))


def accumulation(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch sums a matmul or a ``sum()`` of ``dtype`` in: float32 for bfloat16 and float16 (on CPUs,
    and cuBLAS's default on GPUs), else ``dtype`` itself. The result is then rounded once to ``dtype``."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def summation_bound(values_abs_sum: torch.Tensor | float, n_terms: int, dtype: torch.dtype) -> torch.Tensor | float:
    """Largest error of a sum of ``n_terms`` values in ``dtype``, in any order: ``gamma_{n-1} * sum|x_i|``."""
    return gamma(max(n_terms - 1, 0), dtype) * values_abs_sum


def dot_bound(products_abs_sum: torch.Tensor | float, k: int, dtype: torch.dtype) -> torch.Tensor | float:
    """Largest error of a dot product (a matmul element) of inner dimension ``k`` of ``dtype`` operands:
    ``gamma_k * sum|x_i y_i|`` in the accumulation dtype, plus the final rounding to ``dtype`` when they differ."""
    wide = accumulation(dtype)
    last = unit_roundoff(dtype) if wide != dtype else 0.0
    return (gamma_probable(k, wide) + last) * products_abs_sum


def reduction_bound(partials_abs_sum: torch.Tensor | float, world_size: int, dtype: torch.dtype
                    ) -> torch.Tensor | float:
    """Largest error added by a distributed reduction of ``world_size`` partial sums, in ``dtype``, in any order
    (ring, tree, or rank 0 first): each partial rounded to ``dtype``, then ``gamma_{p-1}`` on their magnitudes."""
    if world_size < 2:
        return 0.0 * partials_abs_sum
    return (unit_roundoff(dtype) + gamma(world_size - 1, dtype)) * partials_abs_sum


def cast_bound(abs_value: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor | float:
    """Largest error of rounding a value of magnitude ``abs_value`` to ``dtype``: ``u |x|``."""
    return unit_roundoff(dtype) * abs_value


@dataclass(frozen=True)
class Verdict:
    """Bug or rounding: the comparison's worst element, its error ``seen`` and its ``bound``."""

    within: bool
    bound: float  # the derived bound at the element nearest to (or furthest beyond) it
    seen: float  # |got - expected| there
    index: tuple[int, ...] = ()  # that element

    @property
    def ratio(self) -> float:
        """seen / bound: at most 1 within rounding; how close correct code comes to the bound."""
        return self.seen / self.bound if self.bound > 0 else (0.0 if self.seen == 0 else math.inf)

    def __str__(self) -> str:
        numbers = f"bound {self.bound:.2g}, seen {self.seen:.3g}"
        return f"within rounding ({numbers})" if self.within else f"beyond rounding: a bug ({numbers})"


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, at = divmod(flat, size)
        index.append(at)
    return tuple(reversed(index))


def verdict(got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor | float) -> Verdict:
    """Compare ``got`` with ``expected`` element by element against ``bound`` (a number, or a tensor broadcast
    to their shape). NaN or infinity where ``expected`` is finite is beyond any bound.

    Raises:
        ValueError: when the shapes differ (say which: a shape mismatch is a bug of its own, not rounding).
    """
    if got.shape != expected.shape:
        raise ValueError(f"expected a tensor of shape {tuple(expected.shape)}, got {tuple(got.shape)}")
    error = (got.detach().double().cpu() - expected.detach().double().cpu()).abs()
    error = torch.where(torch.isnan(error), torch.full_like(error, math.inf), error)
    limit = torch.as_tensor(bound, dtype=torch.float64).expand_as(error)
    if error.numel() == 0:
        return Verdict(True, 0.0, 0.0)
    beyond = error > limit
    # beyond: the element furthest beyond its bound; within: the element closest to it (seen / bound largest)
    score = (error - limit) if bool(beyond.any()) else torch.where(limit > 0, error / limit, 0.0)
    flat = int(torch.argmax(score))
    index = _unravel(flat, tuple(error.shape))
    seen, at = float(error.reshape(-1)[flat]), float(limit.reshape(-1)[flat])
    return Verdict(seen <= at, at, seen, index)
