"""The rounding bounds of the moe_dispatch lab: how far expert parallelism may be from the one-process MoE layer.

Both compute the same router on the same tokens, so the gates and the routing agree. They differ in how rows meet:

* **an expert's rows.** The one-process layer runs an expert on one rank's rows at a time; under expert parallelism
  it runs once on the rows of every rank. The same MLP, ``fc2(gelu(fc1(x)))``, on other matrices: each side's
  forward and backward are carried through :mod:`course.numerics.propagate`, from the upstream ``gate x dy``
  (rounded once).
* **an expert's gradients.** The one-process layer adds one group's gradient after another into ``.grad``: each
  group's bound, plus :func:`course.numerics.bounds.reduction_bound` over the groups. Expert parallelism sums all
  rows in one product.
* **a token's output and gradient.** A token's output adds its ``k`` weighted rows; its gradient adds the ``k``
  experts' and the router's terms, in any order (``gamma_k`` on their magnitudes). The router's term moves with the
  gates' gradients ``dy . out``: through the gates' Jacobian (computed exactly here), plus the router backward's own
  rounding on the magnitudes it combines.

Both sides are within their bound of the exact result, so they may differ by the sum. The combine probes compare
two ways of adding ``k`` weighted rows (:func:`combine_bound`). Used by
:mod:`grader.labs.moe_dispatch.check`; the property test: ``tests/grader/labs/test_moe_dispatch_bounds.py``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course.experts import moe
from course.experts import router as gating
from course.numerics import bounds
from course.numerics import propagate as p

FLOAT = torch.float32
PARAMETERS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def _gelu_slope(z: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def _expert(expert: moe.Expert, rows: torch.Tensor, upstream: torch.Tensor) -> dict[str, p.Tracked]:
    """One expert run on ``rows`` (R, d) with ``upstream`` (R, d, float64: gate x dy, rounded once in float32):
    its output ``y``, the rows' gradient ``x`` and its parameters' gradients, each with its bound."""
    x = p.leaf(rows[None], FLOAT)
    w1, b1, w2, b2 = (p.leaf(t, FLOAT) for t in (expert.fc1.weight, expert.fc1.bias, expert.fc2.weight,
                                                  expert.fc2.bias))
    dy = p.Tracked(upstream[None], bounds.cast_bound(upstream[None].abs(), FLOAT), FLOAT)
    z = p.add(p.matmul(x, p.transpose(w1)), b1)
    h = p.elementwise(z, nn.functional.gelu, p.GELU_SLOPE)
    dz = p.multiply(p.matmul(dy, w2), p.elementwise(z, _gelu_slope, p.GELU_CURVATURE))
    dy_rows, h_rows, dz_rows = p.flatten(dy, 0, 1), p.flatten(h, 0, 1), p.flatten(dz, 0, 1)
    return {"y": p.add(p.matmul(h, p.transpose(w2)), b2), "x": p.matmul(dz, w1),
            "fc2.weight": p.matmul(p.transpose(dy_rows), h_rows), "fc2.bias": p.total(dy, (0, 1)),
            "fc1.weight": p.matmul(p.transpose(dz_rows), p.flatten(x, 0, 1)), "fc1.bias": _rows_sum(dz)}


def _rows_sum(a: p.Tracked) -> p.Tracked:
    """``a.sum((0, 1))`` over R rows: the rows' errors, of random sign, add like a random walk (as in
    :mod:`course.numerics.propagate`'s products), and the sum rounds within ``gamma~_R`` of its magnitudes."""
    rows = a.value.shape[0] * a.value.shape[1]
    spread = torch.minimum(a.err.sum((0, 1)), bounds.LAMBDA * a.err.square().sum((0, 1)).sqrt())
    err = spread + bounds.gamma_probable(rows, FLOAT) * a.magnitude.sum((0, 1))
    return p.Tracked(a.value.sum((0, 1)), err, FLOAT)


def _assignments(layer: moe.MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(token, choice, expert, gate)`` of every kept assignment of the tokens ``x``, by the layer's router."""
    routing = layer.route(x.detach())
    token, choice = routing.kept.nonzero(as_tuple=True)
    return token, choice, routing.experts[token, choice], routing.gates.detach()[token, choice].double()


def _router_jacobian(layer: moe.MoELayer, x: torch.Tensor) -> torch.Tensor:
    """``(T, k, d)``: d gates[t, c] / d x[t], exactly (float64): the router's path from a gate's gradient to x."""
    tokens = x.detach().double().requires_grad_()
    gates, _, _ = gating.route(tokens @ layer.router.weight.detach().double().T, layer.config.k)
    return torch.stack([torch.autograd.grad(gates[:, c].sum(), tokens, retain_graph=True)[0]
                        for c in range(layer.config.k)], dim=1)


def _token_side(out: p.Tracked, dx: p.Tracked, found: tuple, dy: torch.Tensor, jacobian: torch.Tensor,
                shape: tuple[int, ...], experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One side's bounds on a rank's output and token gradient, from its experts' rows ``out`` and ``dx``."""
    token, choice, _, gate = found
    k, d = jacobian.shape[1], shape[1]
    weighted = gate[:, None] * out.value
    w_err = gate[:, None] * out.err + bounds.cast_bound(weighted.abs() + gate[:, None] * out.err, FLOAT)
    y_err = torch.zeros(shape, dtype=torch.float64).index_add(0, token, w_err)
    y_mag = torch.zeros(shape, dtype=torch.float64).index_add(0, token, weighted.abs() + w_err)
    y_err = y_err + bounds.summation_bound(y_mag, k, FLOAT)
    g_gate = (dy[token] * out.value).sum(-1)  # the gate's gradient dy . out, and its error
    moved = dy[token].abs() * out.err  # the outputs' errors, of random sign, add like a random walk over d
    e_gate = torch.minimum(moved.sum(-1), bounds.LAMBDA * moved.square().sum(-1).sqrt())
    e_gate = e_gate + bounds.dot_bound((dy[token] * out.value).abs().sum(-1), d, FLOAT)
    e_path, g_path = torch.zeros(shape[0], k, dtype=torch.float64), torch.zeros(shape[0], k, dtype=torch.float64)
    e_path[token, choice], g_path[token, choice] = e_gate, g_gate.abs()
    router = (jacobian.abs() * e_path[..., None]).sum(1)
    rounding = _router_rounding(experts) * (jacobian.abs() * g_path[..., None]).sum(1)
    x_err = torch.zeros(shape, dtype=torch.float64).index_add(0, token, dx.err) + router + rounding
    x_mag = torch.zeros(shape, dtype=torch.float64).index_add(0, token, dx.magnitude)
    x_mag = x_mag + (jacobian.abs() * g_path[..., None]).sum(1)
    return y_err, x_err + bounds.summation_bound(x_mag + x_err, k + 1, FLOAT)


def _rows(xs: list[torch.Tensor], upstreams: list[torch.Tensor], found: list[tuple], source: int, expert: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(which, rows, upstream)``: which of ``source``'s assignments go to ``expert``, their tokens, gate x dy."""
    token, _, chosen, gate = found[source]
    which = (chosen == expert).nonzero(as_tuple=True)[0]
    rows = xs[source].detach().cpu()[token[which]]
    return which, rows, gate[which, None] * upstreams[source].detach().cpu().double()[token[which]]


def _empty(count: int, width: int) -> dict[str, torch.Tensor]:
    return {key: torch.zeros(count, width, dtype=torch.float64) for key in ("y", "y_err", "x", "x_err")}


def _keep(side: dict, where: torch.Tensor, tracked: dict[str, p.Tracked], start: int) -> None:
    """Copy rows ``start..`` of an expert run's ``y`` and ``x`` into ``side`` at the assignments ``where``."""
    rows = slice(start, start + len(where))
    for key in ("y", "x"):
        side[key][where], side[f"{key}_err"][where] = tracked[key].value[0, rows], tracked[key].err[0, rows]


def comparison_bounds(layer: moe.MoELayer, xs: list[torch.Tensor], upstreams: list[torch.Tensor], rank: int,
                      experts: list[int]) -> dict[str, torch.Tensor]:
    """The largest |expert parallel - one process| rounding allows, element by element (float64, on the CPU):
    ``"y"`` and ``"x"``, rank ``rank``'s output and token gradient, and ``"{e}.{parameter}"`` for the experts
    ``experts`` (``PARAMETERS``). ``xs``, ``upstreams``: every rank's tokens and output gradient, in rank order;
    ``layer``: the one-process layer (its router and capacity decide the assignments)."""
    layer = _on_cpu(layer)
    found = [_assignments(layer, x.cpu()) for x in xs]
    count, width = len(found[rank][0]), xs[rank].shape[1]
    reference, parallel, out = _empty(count, width), _empty(count, width), {}
    for e in range(layer.config.num_experts):
        parts = [_rows(xs, upstreams, found, s, e) for s in range(len(xs))]
        if not sum(len(which) for which, _, _ in parts):
            out.update({f"{e}.{name}": torch.zeros(()) for name in PARAMETERS})
            continue
        groups = [_expert(layer.experts[e], rows, up) if len(which) else None for which, rows, up in parts]
        whole = _expert(layer.experts[e], torch.cat([r for _, r, _ in parts]), torch.cat([u for _, _, u in parts]))
        if groups[rank] is not None:
            _keep(reference, parts[rank][0], groups[rank], 0)
            _keep(parallel, parts[rank][0], whole, sum(len(which) for which, _, _ in parts[:rank]))
        if e in experts:
            for name in PARAMETERS:
                ran = [g[name] for g in groups if g is not None]
                summed = bounds.reduction_bound(sum(t.magnitude for t in ran), len(ran), FLOAT)
                out[f"{e}.{name}"] = sum(t.err for t in ran) + summed + whole[name].err
    jacobian, dy = _router_jacobian(layer, xs[rank]), upstreams[rank].detach().cpu().double()
    shape, num = tuple(xs[rank].shape), layer.config.num_experts
    sides = [_token_side(*(p.Tracked(side[key], side[f"{key}_err"], FLOAT) for key in ("y", "x")), found[rank], dy,
                         jacobian, shape, num) for side in (reference, parallel)]
    return out | {"y": sides[0][0] + sides[1][0], "x": sides[0][1] + sides[1][1]}


def combine_bound(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """How far two combines of the same rows may differ: each multiplies ``k`` rows by their gates (one rounding)
    and adds them in its own order (``gamma_k``, the zeros it starts from included), on ``magnitude``, the sum of
    ``|gate x row|`` per token."""
    return 2 * (bounds.unit_roundoff(FLOAT) + bounds.gamma(k, FLOAT)) * magnitude


def _on_cpu(layer: moe.MoELayer) -> moe.MoELayer:
    """``layer`` itself on the CPU, else a CPU copy of its weights (the RNG left as it was)."""
    if next(layer.parameters()).device.type == "cpu":
        return layer
    with torch.random.fork_rng(devices=[]):
        copy = moe.MoELayer(layer.config)
    copy.load_state_dict({name: t.detach().cpu() for name, t in layer.state_dict().items()})
    return copy


def _router_rounding(experts: int) -> float:
    """The router backward's own rounding, relative to ``|J| |g|``: the gates' normalisation and the softmax's
    backward (a sum over the experts each) and the router's linear backward (a dot product over the experts)."""
    return 3 * bounds.gamma_probable(experts, FLOAT) + 6 * bounds.unit_roundoff(FLOAT)
