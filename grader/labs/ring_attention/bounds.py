"""The rounding bounds of the ring attention lab: how far a correct ring may be from full attention, element by element.

Both the student's ring and the checker's full attention compute in float32 from the same ``q, k, v`` (and, in
backward, the same ``out``, ``lse`` and ``dout``). Each is within its own bound of the exact result, so they may
differ by the sum of the two bounds. A side that works in ``parts`` blocks of keys (the ring: one per rank) sums
``parts`` partial results, in any order; full attention is one block. With ``u`` float32's unit roundoff:

* **scores** ``s = q.k / sqrt(D)``: a dot product of ``D`` terms and a scaling, ``e_s = gamma~_D a + 2u a``,
  ``a = |q|.|k| / sqrt(D)`` (:func:`course.numerics.bounds.dot_bound`);
* **forward**: a score error moves ``out_i`` by ``sum_j p_ij e_s,ij |v_j - out_i|`` (the softmax's derivative,
  first order) and ``lse_i`` by ``sum_j p_ij e_s,ij``. Each block's log-sum-exp and each online-softmax merge
  round ``lse`` about once relative to ``|lse|`` and a few times relative to the exponents' size
  ``sum_j p_ij |s_ij - lse_i|``. A block's probabilities then sum to ``exp`` of its ``lse``'s rounding, which
  scales its ``out``; each merge rounds ``out`` about ``ROUNDINGS_PER_MERGE`` times, relative to
  ``sum_j p_ij |v_j|``;
* **backward**: ``p = exp(s - lse)`` carries ``e_s`` and two roundings; ``ds = p (dout.v - dout.out) / sqrt(D)``
  the dot products' errors; ``dq = ds k``, ``dk = ds^T q`` and ``dv = p^T dout`` are sums over ``parts`` blocks
  (:func:`course.numerics.bounds.reduction_bound`), their errors spread as in :mod:`course.numerics.propagate`.

Used by :mod:`grader.labs.ring_attention.check`; the property test: ``tests/grader/labs/test_ring_attention_bounds.py``.
"""

from __future__ import annotations

import math

import torch

from course.numerics import bounds
from course.numerics import propagate as p

FLOAT = torch.float32
#: roundings of ``out`` in one online-softmax merge, relative to ``sum_j p_ij |v_j|``: the two weights'
#: exponentials, the two products, their sum and the division
ROUNDINGS_PER_MERGE = 6


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact scores (masked with -inf) and each score's rounding bound (0 where masked)."""
    scale = 1 / math.sqrt(q.shape[-1])
    exact = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, -math.inf)
    size = (q.abs() @ k.abs().transpose(-1, -2) * scale).masked_fill(~mask, 0.0)
    return exact, bounds.dot_bound(size, q.shape[-1], FLOAT) + 2 * bounds.cast_bound(size, FLOAT)


def _spread_sum(weights: torch.Tensor, errors: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sum_j w_ij e_ij |values_j|``: errors ``e`` of random sign add like a random walk (propagate's rule)."""
    worst = (weights * errors) @ values.abs()
    return torch.minimum(worst, bounds.LAMBDA * torch.sqrt((weights * errors) ** 2 @ values ** 2))


def _forward_side(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, parts: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One side's bound on |computed - exact| for ``out`` and ``lse``, working in ``parts`` blocks of keys."""
    s, e_s = _scores(q, k, mask)
    lse = torch.logsumexp(s, dim=-1)
    prob = torch.exp(s - lse[..., None])
    out = prob @ v
    exponents = (prob * (s - lse[..., None]).nan_to_num(0.0, 0.0, 0.0).abs()).sum(-1)
    u, keys = bounds.unit_roundoff(FLOAT), int(mask.sum(-1).max())
    merges = (parts + 1) * u  # one per block's log-sum-exp and one per merge
    lse_err = (prob * e_s).sum(-1) + merges * (lse.abs() + 2 * exponents + 4) + bounds.gamma_probable(keys, FLOAT)
    weighted = prob @ v.abs()  # (B, H, S, D): sum_j p_ij |v_j|
    moved = ((prob * e_s)[..., None] * (v[..., None, :, :] - out[..., :, None, :]).abs()).sum(-2)
    # each block's probabilities sum to exp(its lse's rounding): out_b is scaled by it, about u (|lse| + exponents)
    scaled = u * (lse.abs() + 2 * exponents + 2)
    rounding = bounds.gamma_probable(max(keys // parts, 1), FLOAT) + ROUNDINGS_PER_MERGE * merges + scaled[..., None]
    return moved + rounding * weighted, lse_err


def forward_bounds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, world_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """How far a ring of ``world_size`` ranks may be from full attention, for ``out`` (B, H, S, D) and ``lse``
    (B, H, S), under ``mask`` (S, S; True where a query sees a key). Inputs float32, bounds float64."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    ring, full = _forward_side(q, k, v, mask, world_size), _forward_side(q, k, v, mask, 1)
    return ring[0] + full[0], ring[1] + full[1]


def _product(a: torch.Tensor, a_err: torch.Tensor, b: torch.Tensor, parts: int) -> torch.Tensor:
    """Bound on ``a @ b`` computed from ``a`` within ``a_err`` (``b`` exact), its inner dimension in ``parts``
    blocks summed in any order."""
    products = a.abs() @ b.abs()
    k = a.shape[-1]
    err = p._spread(a_err, b.abs()) + bounds.dot_bound(products, max(k // parts, 1), FLOAT)
    return err + bounds.reduction_bound(products, parts, FLOAT)


def _backward_side(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, mask: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
    """One side's bounds on |computed - exact| for dq, dk, dv, working in ``parts`` blocks."""
    u, scale, d = bounds.unit_roundoff(FLOAT), 1 / math.sqrt(q.shape[-1]), q.shape[-1]
    s, e_s = _scores(q, k, mask)
    shifted = (s - lse[..., None]).masked_fill(~mask, 0.0)
    prob = torch.exp(shifted).masked_fill(~mask, 0.0)
    e_p = prob * (e_s + u * shifted.abs() + 2 * u)
    dp = dout @ v.transpose(-1, -2)
    delta = (dout * out).sum(-1, keepdim=True)
    e_g = (bounds.dot_bound(dout.abs() @ v.abs().transpose(-1, -2), d, FLOAT)
           + bounds.dot_bound((dout * out).abs().sum(-1, keepdim=True), d, FLOAT))
    g = dp - delta
    e_g = e_g + bounds.cast_bound(g.abs() + e_g, FLOAT)
    ds = prob * g * scale
    e_ds = (e_p * g.abs() + prob * e_g) * scale + 2 * bounds.cast_bound(ds.abs(), FLOAT)
    e_ds = e_ds.masked_fill(~mask, 0.0)
    dq = _product(ds, e_ds, k, parts)
    dk = _product(ds.transpose(-1, -2), e_ds.transpose(-1, -2), q, parts)
    dv = _product(prob.transpose(-1, -2), e_p.transpose(-1, -2), dout, parts)
    return dq, dk, dv


def backward_bounds(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, mask: torch.Tensor, world_size: int) -> tuple[torch.Tensor, ...]:
    """How far a ring's ``(dq, dk, dv)`` may be from full attention's, given the same float32 ``out`` and
    ``lse`` (the forward's) and ``dout``, under ``mask``. Bounds float64, in the inputs' shapes."""
    tensors = [t.detach().double().cpu() for t in (dout, q, k, v, out, lse)]
    ring = _backward_side(*tensors, mask, world_size)
    full = _backward_side(*tensors, mask, 1)
    return tuple(a + b for a, b in zip(ring, full, strict=True))
