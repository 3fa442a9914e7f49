"""How far may two correct Adam runs drift apart, for rounding alone? Adam's step with its inputs perturbed.

Two runs of the same training with Adam (ZeRO-1 against DDP + ``torch.optim.Adam``, say) see gradients that
differ by a little rounding. Adam then divides by ``sqrt(v) + eps``. Where a gradient is small, so is ``v``, and
that division amplifies the difference: by up to ``lr / eps`` (10 in the zero lab). A bound set by hand cannot
follow this; this one is carried element by element, step by step, from what was computed.

For each element, with ``g_s`` the exact gradient of step ``s`` and ``dg_s`` a bound on |g_student - g_reference|
there, ``u`` the dtype's unit roundoff, ``M = m / (1 - b1^t)``, ``V = v / (1 - b2^t)``, ``S = sqrt(V)``:

* the update ``f = lr M / (S + eps)`` depends on every gradient so far: ``m`` holds ``a_s g_s`` and ``v`` holds
  ``c_s g_s^2``, with ``a_s = (1 - b1) b1^(t-s) / (1 - b1^t)`` and ``c_s = (1 - b2) b2^(t-s) / (1 - b2^t)``. So
  ``df/dg_s = lr (a_s / (S + eps) - M c_s g_s / (S (S + eps)^2))``. The two terms nearly cancel where
  ``|g| >> eps`` (Adam then steps by about ``lr``, whatever the gradient), and the first is ``lr / eps`` where
  ``g ~ 0``. The two runs' updates differ by at most ``sum_s |df/dg_s| dg_s``;
* each run rounds its moments (``m``: twice a step, ``v``: three times), its update (about six times) and the
  parameter (once): ``2 x`` each of those, carried through ``df/dm`` and ``df/dv`` for the moments.

This is a first-order bound: terms in ``dg^2`` are left out. Where ``|g| >> eps`` they are ``dg / |g|`` of the
kept terms (about 1e-7 in float32). Where ``g`` is near 0, ``f``'s curvature is at most about ``lr / eps^2``, so
they are about ``dg / eps`` of the kept ``lr dg / eps`` (1e-6 in the labs: ``dg`` near 1e-9, ``eps`` 1e-3). Summing
``|df/dg_s| dg_s`` over the steps treats the gradients' errors as of any sign (no cancellation between steps).

How tight? Measured in ``tests/numerics/test_adam.py`` (the labs' models, 2-6 ranks, shuffled orders): after step
1 correct code comes within 2x of the bound, after step 3 within 8x, after step 4 within about 12x. The bound
grows by a worst case each step: both runs' own rounding of every gradient, although two runs whose parameters
still agree bit for bit compute the same gradient (the zero lab's step 1; most parameters still agree later).

The drift of the parameters is the sum of these over the steps. Used by the zero and fsdp labs
(:mod:`grader.labs.zero.bounds`) through :class:`Drift`; notebook 07 teaches Adam's sharded state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course.numerics import bounds

#: roundings of one Adam update ``lr * (m / bc1) / (sqrt(v / bc2) + eps)`` (the bias corrections, the square
#: root, adding eps, the division, the learning rate) and of each moment's update (``m``: a scale and an add;
#: ``v``: a scale, a square and an add)
UPDATE_ROUNDINGS, M_ROUNDINGS, V_ROUNDINGS = 6, 2, 3


@dataclass
class Drift:
    """The running bound on |student - reference| of Adam's parameters, one tensor of elements (float64).

    Call :meth:`step` once per optimizer step, with the exact gradient, its bound, and the parameters after it.
    """

    lr: float
    betas: tuple[float, float]
    eps: float
    dtype: torch.dtype = torch.float32
    gradients: list[torch.Tensor] = field(default_factory=list)  # the exact gradient of each step so far
    gradient_bounds: list[torch.Tensor] = field(default_factory=list)
    m_round: torch.Tensor | float = 0.0  # bound on the two runs' rounding of m, carried (|m_student - m_reference|)
    v_round: torch.Tensor | float = 0.0
    drift: torch.Tensor | float = 0.0  # bound on |p_student - p_reference|
    updates: list[torch.Tensor] = field(default_factory=list)  # each step's bound on the updates' difference

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact bias-corrected moments ``M``, ``V`` after the steps so far."""
        (b1, b2), t = self.betas, len(self.gradients)
        m = sum((1 - b1) * b1 ** (t - s) * g for s, g in enumerate(self.gradients, start=1))
        v = sum((1 - b2) * b2 ** (t - s) * g * g for s, g in enumerate(self.gradients, start=1))
        return m / (1 - b1 ** t), v / (1 - b2 ** t)

    def update_bound(self) -> torch.Tensor:
        """Bound on |update_student - update_reference| at the current step: the gradients' bounds through
        ``df/dg_s``, the moments' rounding through ``df/dm`` and ``df/dv``, and the update's own rounding."""
        (b1, b2), t, u = self.betas, len(self.gradients), bounds.unit_roundoff(self.dtype)
        big_m, big_v = self.moments()
        s = big_v.sqrt()
        d = s + self.eps
        inverse_s = torch.where(s > 0, 1 / s, 0.0)  # where S = 0 every g_s is 0: the second term is 0 there
        moved = 0.0
        for step, (g, dg) in enumerate(zip(self.gradients, self.gradient_bounds, strict=True), start=1):
            a, c = (1 - b1) * b1 ** (t - step) / (1 - b1 ** t), (1 - b2) * b2 ** (t - step) / (1 - b2 ** t)
            moved = moved + (a / d - big_m * c * g * inverse_s / (d * d)).abs() * dg
        rounded = self.m_round / (1 - b1 ** t) / d + big_m.abs() * (self.v_round / (1 - b2 ** t)) * inverse_s / (
            2 * d * d)
        return self.lr * (moved + rounded + 2 * UPDATE_ROUNDINGS * u * big_m.abs() / d)

    def step(self, gradient: torch.Tensor, gradient_bound: torch.Tensor, params_after: torch.Tensor
             ) -> torch.Tensor:
        """One Adam step of both runs: ``gradient`` the exact gradient (float64), ``gradient_bound`` the bound on
        the two runs' gradients' difference, ``params_after`` the reference's parameters after the step.
        Returns the bound on |p_student - p_reference| after it.

        Raises:
            ValueError: when the three tensors' shapes differ.
        """
        if not gradient.shape == gradient_bound.shape == params_after.shape:
            raise ValueError(f"expected the gradient, its bound and the parameters in one shape, got "
                             f"{tuple(gradient.shape)}, {tuple(gradient_bound.shape)}, {tuple(params_after.shape)}")
        (b1, b2), u = self.betas, bounds.unit_roundoff(self.dtype)
        self.gradients.append(gradient.double())
        self.gradient_bounds.append(gradient_bound.double())
        t = len(self.gradients)
        big_m, big_v = self.moments()
        self.m_round = b1 * self.m_round + 2 * M_ROUNDINGS * u * big_m.abs() * (1 - b1 ** t)
        self.v_round = b2 * self.v_round + 2 * V_ROUNDINGS * u * big_v * (1 - b2 ** t)
        update = self.update_bound()
        self.updates.append(update)
        self.drift = self.drift + update + 2 * bounds.cast_bound(params_after.double().abs() + self.drift, self.dtype)
        return self.drift
