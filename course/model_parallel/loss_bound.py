"""How far may a split transformer's training loss be from the unsplit one's, for rounding alone? A derived bound.

Two correct runs of the same training differ only where they round differently. This module bounds that
difference for the course's transformer (``transformer.Transformer``) trained with SGD, to first order:

* **the loss at step t** (``forward``): every operation that rounds (each linear layer's dot products, the
  attention's scores, softmax and weighted sum, each layer norm, each residual add, the cross-entropy) adds a
  local error, bounded with :mod:`course.numerics.bounds` from the magnitudes seen. Each local error reaches the
  loss multiplied by the loss's gradient with respect to that tensor (its *adjoint*). A tensor-parallel split
  cuts the row-parallel layers' inner dimension, and its all-reduce adds one more rounding.
* **the weights at step t** (``drift``): each gradient is a sum over the batch's tokens. A run that sums it in
  ``pieces`` parts (data-parallel ranks, micro-batches) rounds in another order. That difference, times the
  learning rate (and momentum's echo of it), moves the weights; the weights' move reaches the loss through the
  loss's gradient. Each update's own rounding adds ``u |w|``.

Errors of random sign add like a random walk (:data:`course.numerics.bounds.LAMBDA`), as in
:mod:`course.numerics.propagate`. Left out: second-order terms (the learning rate times the curvature, small over a
few steps) and the backward pass's rounding of activation gradients. Used by :mod:`course.model_parallel.parity`
(notebook 08's parity table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from course.arguments import check_count
from course.model_parallel import corpus, transformer
from course.numerics import bounds

FLOAT = torch.float32
#: the row-parallel layers (their inner dimension is split under tensor parallelism)
ROW_PARALLEL = ("attention.proj", "mlp.fc2")


@dataclass(frozen=True)
class Layout:
    """How a strategy cuts the arithmetic: what decides where it may round differently from one process."""

    tensor_parallel: int = 1  # ranks a row-parallel layer's inner dimension is split over, then all-reduced
    pieces: int = 1  # partial sums each gradient is added from (data-parallel ranks x micro-batches)


def carried(adjoint: torch.Tensor, local: torch.Tensor) -> float:
    """What local errors ``local`` (bounds, element-wise) can do to a scalar whose gradient is ``adjoint``: at most
    ``sum |a e|``, and, for errors of random sign, ``lambda sqrt(sum (a e)^2)`` (the smaller is used)."""
    terms = (adjoint.double().abs() * local.double()).reshape(-1)
    return min(float(terms.sum()), bounds.LAMBDA * float(terms.square().sum().sqrt()))


def _dot(products: torch.Tensor, k: int, parts: int = 1) -> torch.Tensor:
    """A dot product's error bound, inner dimension ``k`` split over ``parts`` ranks, then all-reduced."""
    err = bounds.dot_bound(products, k // parts, FLOAT)
    return err + bounds.reduction_bound(products, parts, FLOAT) if parts > 1 else err


@dataclass
class _Seen:
    """What the hooks saw in one forward and backward: tensors by module name, then their gradients."""

    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_in: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_out: dict[str, torch.Tensor] = field(default_factory=dict)


def _watch(model: nn.Module, seen: _Seen) -> list:
    """Hooks keeping every linear, norm and embedding's input and output, and their gradients once backward ran."""

    def keep(name: str):
        def hook(_module, args, out):  # noqa: ANN001, ANN202
            x = args[0]
            seen.inputs[name], seen.outputs[name] = x.detach().double(), out.detach().double()
            if x.requires_grad:
                x.register_hook(lambda g: seen.grad_in.__setitem__(name, g.detach().double()))
            out.register_hook(lambda g: seen.grad_out.__setitem__(name, g.detach().double()))
        return hook

    return [m.register_forward_hook(keep(name)) for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.LayerNorm, nn.Embedding))]


def _linear(m: nn.Linear, x: torch.Tensor, y: torch.Tensor, parts: int) -> torch.Tensor:
    products = x.abs() @ m.weight.detach().double().abs().T
    return _dot(products, m.in_features, parts) + bounds.cast_bound(y.abs(), FLOAT)


def _norm(m: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """A layer norm over d features: the mean's and variance's sums (gamma_d), a few roundings more, times |w|."""
    d = x.shape[-1]
    u, g = bounds.unit_roundoff(FLOAT), bounds.gamma_probable(d, FLOAT)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + m.eps).sqrt()
    x_hat = (x - x.mean(-1, keepdim=True)) / sigma
    err = x_hat.abs() * (g / 2 + 4 * u) + g * x.abs().mean(-1, keepdim=True) / sigma
    return err * m.weight.detach().double().abs() + 2 * u * (x_hat * m.weight.detach().double()).abs()


def _attention(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Causal attention's own rounding, at its output ``(B, S, d)``: the scores' dot products (head_dim terms)
    reach the output through the softmax (``p (v - o)``), the softmax's sum over S and the weighted sum over S."""
    batch_size, seq_len, width = qkv.shape
    q, k, v = (t.reshape(batch_size, seq_len, num_heads, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    head_dim, u = q.shape[-1], bounds.unit_roundoff(FLOAT)
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    p = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)  # (B, H, S, S)
    out = p @ v
    e_scores = bounds.dot_bound(q.abs() @ k.abs().transpose(-1, -2), head_dim, FLOAT) / math.sqrt(head_dim)
    e_scores = e_scores + bounds.cast_bound(scores.abs(), FLOAT)
    spread = (v.unsqueeze(-3) - out.unsqueeze(-2)).abs()  # (B, H, S, S, hd): |v_j - o_i|
    through_softmax = ((p * e_scores).unsqueeze(-1) * spread).sum(-2)
    sums = (p @ v.abs()) * (bounds.gamma_probable(seq_len, FLOAT) + 4 * u)
    return (through_softmax + sums).transpose(1, 2).reshape(batch_size, seq_len, width // 3)


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The loss's own rounding. Each token's ``lse = m + log sum exp(z - m)``: the differences ``z - m``, the exps
    and their sum over V (``gamma_V``), the log, the add of ``m``, then ``lse - z_target``; then the mean over the
    N tokens (``gamma_N`` on the mean of |loss|, in any order)."""
    z = logits.detach().double().flatten(0, 1)
    n, vocab = z.shape
    u = bounds.unit_roundoff(FLOAT)
    top, lse = z.amax(-1), torch.logsumexp(z, -1)
    losses = lse - z.gather(1, targets.flatten()[:, None]).squeeze(1)
    spread = (z - top[:, None]).abs().amax(-1)
    per_token = bounds.gamma_probable(vocab, FLOAT) + u * (1 + spread + (lse - top).abs() + lse.abs() + losses.abs())
    return float(per_token.mean() + bounds.gamma_probable(n, FLOAT) * losses.abs().mean())


def forward(model: transformer.Transformer, seen: _Seen, logits: torch.Tensor, targets: torch.Tensor,
            tensor_parallel: int) -> float:
    """Bound on the loss's own rounding in one forward, given what the hooks saw after backward."""
    total = _cross_entropy(logits, targets)
    for name, m in model.named_modules():
        if name not in seen.grad_out:
            continue
        x, y, adjoint = seen.inputs[name], seen.outputs[name], seen.grad_out[name]
        if isinstance(m, nn.Linear):
            parts = tensor_parallel if name.endswith(ROW_PARALLEL) else 1
            total += carried(adjoint, _linear(m, x, y, parts))
            if name.endswith("attention.proj"):  # its input: the attention's output
                qkv = seen.outputs[name.replace("proj", "qkv")]
                total += carried(seen.grad_in[name], _attention(qkv, model.config.num_heads))
            if name.endswith("mlp.fc2"):  # its input: gelu's output, a few ulps
                total += carried(seen.grad_in[name], bounds.cast_bound(2 * x.abs(), FLOAT))
        elif isinstance(m, nn.LayerNorm):
            total += carried(adjoint, _norm(m, x))
            total += carried(seen.grad_in[name], bounds.cast_bound(x.abs(), FLOAT))  # x: a residual add
    return total


def token_sums(model: nn.Module, seen: _Seen) -> dict[str, torch.Tensor]:
    """parameter name -> the sum over the batch's tokens of |each token's term| of its gradient."""
    out = {}
    for name, m in model.named_modules():
        if name not in seen.grad_out:
            continue
        x, g = seen.inputs[name], seen.grad_out[name].abs()
        if isinstance(m, nn.Linear):
            out[f"{name}.weight"] = g.flatten(0, -2).T @ x.abs().flatten(0, -2)
            out[f"{name}.bias"] = g.flatten(0, -2).sum(0)
        elif isinstance(m, nn.LayerNorm):
            x_hat = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + m.eps).sqrt()
            out[f"{name}.weight"] = (g * x_hat.abs()).flatten(0, -2).sum(0)
            out[f"{name}.bias"] = g.flatten(0, -2).sum(0)
        elif isinstance(m, nn.Embedding):
            rows, ids = g.flatten(0, -2), x.long().flatten()
            if x.dim() == 1 and "embedding" in seen.grad_out:  # positions, added to every sequence: one term each
                tokens = seen.grad_out["embedding"].abs()  # (B, S, d): each sequence's term
                rows, ids = tokens.flatten(0, -2), x.long().repeat(tokens.shape[0])
            out[f"{name}.weight"] = torch.zeros_like(m.weight, dtype=torch.float64).index_add_(0, ids, rows)
    return out


def gradient_sums(model: transformer.Transformer, inputs: torch.Tensor, targets: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """One forward and backward of ``model`` on the batch (its gradients left in ``.grad``, the reference a split
    run is compared with) and :func:`token_sums` of it: parameter name -> sum over the tokens of |each term|."""
    return token_sums(model, _step(model, inputs, targets)[1])


def gradient_bound(sums: dict[str, torch.Tensor], tokens: int, pieces: int) -> dict[str, torch.Tensor]:
    """How far one run's gradients may be from exact: ``tokens`` terms summed in ``pieces`` partial sums, then
    added (``pieces = 1``: in one sum). Both runs' bounds add up to the difference allowed between them."""
    inner = bounds.gamma_probable(max(tokens // pieces, 1), FLOAT)
    outer = bounds.unit_roundoff(FLOAT) + bounds.gamma(pieces - 1, FLOAT) if pieces > 1 else 0.0
    return {name: (inner + outer) * total for name, total in sums.items()}


@dataclass(frozen=True)
class Training:
    """The run every strategy repeats: SGD with momentum on fixed global batches of the grammar corpus."""

    steps: int = 4            # SGD steps
    batch_size: int = 8       # sequences per global batch
    lr: float = 0.1           # SGD learning rate
    momentum: float = 0.9     # SGD momentum (state that ZeRO-1 shards)
    seed: int = 0             # corpus, weights and batches

    def __post_init__(self) -> None:
        check_count("steps", self.steps, unit="number of SGD steps")
        check_count("batch_size", self.batch_size, unit="sequences per global batch")

    def batches(self, config: transformer.Config) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``steps`` global batches, ``(inputs, targets)`` of ``(batch_size, seq_len)`` token ids each."""
        tokens = transformer.corpus_tokens(config, 200, self.seed)
        generator = torch.Generator().manual_seed(self.seed)
        return [corpus.batch(tokens, self.batch_size, config.seq_len, generator)
                for _ in range(self.steps)]

    def optimizer(self, params) -> torch.optim.Optimizer:  # noqa: ANN001
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)

    def echo(self, since: int) -> float:
        """How many times a gradient error of ``since`` steps ago has been applied: momentum's geometric sum."""
        mu = self.momentum
        return float(since) if mu == 0 else (1 - mu**since) / (1 - mu)


@dataclass
class Reference:
    """The one-process run, and for each layout the bound on |its loss - the reference's loss|, step by step."""

    losses: list[float]
    bound: dict[Layout, list[float]]


def _step(model: transformer.Transformer, inputs: torch.Tensor, targets: torch.Tensor
          ) -> tuple[float, _Seen, torch.Tensor]:
    seen = _Seen()
    handles = _watch(model, seen)
    logits = model(inputs)
    step_loss = transformer.loss(logits, targets)
    step_loss.backward()
    for handle in handles:
        handle.remove()
    return step_loss.item(), seen, logits


def reference(config: transformer.Config, training: Training, layouts: list[Layout]) -> Reference:
    """Train the unsplit model as ``training`` says and derive each layout's bound at every step.

    A step's bound: both runs' forward rounding (:func:`forward`), plus what earlier steps' gradient rounding
    (:func:`gradient_bound`, both runs) and update rounding did to the weights, carried to the loss by its gradient.
    """
    model = transformer.build(config, training.seed)
    optimizer = training.optimizer(model.parameters())
    names = [name for name, _ in model.named_parameters()]
    losses, out = [], {layout: [] for layout in layouts}
    gradient_errors: list[dict[Layout, dict[str, torch.Tensor]]] = []
    update_errors: list[dict[str, torch.Tensor]] = []
    for t, (inputs, targets) in enumerate(training.batches(config)):
        optimizer.zero_grad(set_to_none=True)
        loss, seen, logits = _step(model, inputs, targets)
        losses.append(loss)
        adjoint = {name: p.grad.detach().double() for name, p in model.named_parameters()}
        sums, tokens = token_sums(model, seen), inputs.numel()
        one = gradient_bound(sums, tokens, 1)
        own = {tp: forward(model, seen, logits, targets, tp) for tp in {1, *(x.tensor_parallel for x in layouts)}}
        for layout in layouts:
            moved = {name: sum(training.lr * training.echo(t - s) * gradient_errors[s][layout][name]
                               + 2 * update_errors[s][name] for s in range(t)) for name in names}
            drift = sum(carried(adjoint[name], moved[name]) for name in names) if t else 0.0
            out[layout].append(own[1] + own[layout.tensor_parallel] + drift)
        theirs = {layout: gradient_bound(sums, tokens, layout.pieces) for layout in layouts}
        gradient_errors.append({layout: {n: theirs[layout][n] + one[n] for n in names} for layout in layouts})
        optimizer.step()
        update_errors.append({name: bounds.cast_bound(p.detach().double().abs(), FLOAT)
                              for name, p in model.named_parameters()})
    return Reference(losses, out)
