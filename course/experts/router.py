"""The router of a mixture-of-experts layer: which experts each token goes to, with what weight, and how many
tokens an expert may take.

* **Top-k gating**: a linear layer scores every expert for every token; a softmax turns the scores into
  probabilities; each token goes to its ``k`` most probable experts, weighted by those probabilities
  (renormalised over the ``k`` when ``k > 1``, as Mixtral does: Jiang et al. 2024, arXiv:2401.04088).
* **Capacity**: an expert takes at most ``ceil(capacity_factor · tokens · k / experts)`` tokens per step, so that
  its buffers have a fixed size. Assignments over capacity are **dropped**: the layer outputs zero for them and
  the residual connection carries the token past (Lepikhin et al. 2020, GShard, arXiv:2006.16668; Fedus et al.
  2021, Switch Transformers, arXiv:2101.03961). First choices are served before second choices.
* **Load-balancing loss** (Switch Transformers, equations 4-6): ``E · Σ_i f_i · P_i``, where ``f_i`` is the share
  of assignments that went to expert ``i`` and ``P_i`` the mean router probability of expert ``i``. It is 1 when
  the load is uniform and grows as the router favours a few experts; added to the loss with a small weight.
Taught in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

import math

import torch


def route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k gating of ``(T, E)`` router logits.

    Returns:
        ``(gates, experts, probs)``: ``(T, k)`` weights, ``(T, k)`` expert indices (most probable first) and the
        ``(T, E)`` softmax probabilities.

    Raises:
        ValueError: ``k`` outside ``1 .. E``.
    """
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"top-k gating picks k of the {logits.shape[-1]} experts, got k={k}: use 1 <= k <= experts.")
    probs = torch.softmax(logits, dim=-1)
    gates, experts = probs.topk(k, dim=-1)
    if k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates, experts, probs


def capacity(tokens: int, num_experts: int, k: int, factor: float) -> int:
    """Assignments one expert takes per step: ``ceil(factor · tokens · k / num_experts)``."""
    return math.ceil(factor * tokens * k / num_experts)


def keep(experts: torch.Tensor, num_experts: int, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which ``(token, choice)`` assignments fit under each expert's capacity ``limit``.

    Args:
        experts: ``(T, k)`` expert indices from :func:`route`.

    Returns:
        ``(kept, slot)``: ``(T, k)`` booleans, and each assignment's place in its expert's queue (first choices
        of every token first, in token order, then second choices, ...).
    """
    order = experts.T.reshape(-1)  # choice-major: every first choice before any second choice
    one_hot = torch.nn.functional.one_hot(order, num_experts)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)  # place in the queue of the chosen expert
    slot = slot.reshape(experts.shape[1], experts.shape[0]).T
    return slot < limit, slot


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch Transformers' auxiliary loss ``E · Σ_i f_i · P_i`` (1.0 when the load is uniform).

    Args:
        probs: ``(T, E)`` router probabilities; experts: ``(T, k)`` the chosen experts.
    """
    num_experts = probs.shape[-1]
    share = torch.bincount(experts.reshape(-1), minlength=num_experts).to(probs.dtype) / experts.numel()  # f_i
    return num_experts * (share * probs.mean(0)).sum()
