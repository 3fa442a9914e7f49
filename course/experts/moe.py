"""A mixture-of-experts layer on one process: the reference that expert parallelism must equal.

``E`` experts, each an MLP ``d -> d_ff -> d``, replace the dense MLP of a transformer block. The router
(``router``) sends each token to ``k`` of them; an expert runs only on the tokens sent to it, so the layer holds
``E`` MLPs' parameters but computes ``k`` per token. The output of a token is the sum over its kept assignments
of ``gate x expert(token)``; a dropped assignment adds nothing. Capacity counts the tokens of one call, one
*group* (GShard's term): under expert parallelism each rank's tokens are a group.
Taught in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from course.experts import router as gating


@dataclass(frozen=True)
class Config:
    """The layer's shape (small: a step takes milliseconds on one CPU core)."""

    d_model: int = 16               # token width
    d_ff: int = 32                  # hidden width of each expert's MLP
    num_experts: int = 4            # experts E
    k: int = 2                      # experts per token (top-k)
    capacity_factor: float = 1.25   # slack over a perfectly even load; below 1 some assignments always drop
    seed: int = 0                   # weights


class Expert(nn.Module):
    """One expert: ``fc2(gelu(fc1(x)))``."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(config.d_model, config.d_ff), nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


@dataclass
class Routing:
    """What the router decided for one group of tokens."""

    gates: torch.Tensor    # (T, k) weights
    experts: torch.Tensor  # (T, k) expert indices
    probs: torch.Tensor    # (T, E) router probabilities
    kept: torch.Tensor     # (T, k) True where the assignment fit under capacity
    loss: torch.Tensor     # the load-balancing loss of this group

    @property
    def dropped(self) -> int:
        """Assignments over capacity."""
        return int((~self.kept).sum())


class MoELayer(nn.Module):
    """Router plus ``E`` experts; ``forward((T, d)) -> (T, d)``, and :attr:`routing` of the last call."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.router = nn.Linear(config.d_model, config.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(config) for _ in range(config.num_experts))
        self.routing: Routing | None = None

    def route(self, x: torch.Tensor) -> Routing:
        """Top-k gating, capacity and the balancing loss for the ``(T, d)`` tokens ``x``."""
        config = self.config
        gates, experts, probs = gating.route(self.router(x), config.k)
        limit = gating.capacity(x.shape[0], config.num_experts, config.k, config.capacity_factor)
        kept, _ = gating.keep(experts, config.num_experts, limit)
        return Routing(gates, experts, probs, kept, gating.load_balancing_loss(probs, experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.routing = routing = self.route(x)
        y = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            token, choice = ((routing.experts == index) & routing.kept).nonzero(as_tuple=True)
            y = y.index_add(0, token, routing.gates[token, choice, None] * expert(x[token]))
        return y


def build(config: Config = Config()) -> MoELayer:
    """The layer with seeded weights (the same on every rank)."""
    torch.manual_seed(config.seed)
    return MoELayer(config)
