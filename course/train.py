"""The single-device training loop every later notebook starts from, kept deliberately plain.

Taught in ``notebooks/00_start_here.ipynb``; notebook 05 and the assignment turn it into a multi-GPU loop.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from course.arguments import check_choice

#: The optimizers the course builds by name: plain SGD, SGD with momentum 0.9, Adam.
OPTIMIZERS = {"sgd": lambda params, lr: torch.optim.SGD(params, lr=lr),
              "momentum": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
              "adam": lambda params, lr: torch.optim.Adam(params, lr=lr)}


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float = 0.01) -> torch.optim.Optimizer:
    """The optimizer called ``name`` (:data:`OPTIMIZERS`: ``"sgd"``, ``"momentum"`` or ``"adam"``) over ``params``.

    Raises:
        ValueError: another name, listing the names there are.
    """
    return OPTIMIZERS[check_choice("optimizer", name, OPTIMIZERS)](params, lr)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so a run can be repeated exactly."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                device: torch.device | str = "cpu") -> float:
    """One pass over ``loader`` with cross-entropy loss; returns the mean loss per sample."""
    model.train()
    total, count = 0.0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
        count += len(labels)
    return total / max(count, 1)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device | str = "cpu") -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy (fraction in [0, 1]) of ``model`` over ``loader``."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = model(images)
        loss_sum += nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        count += len(labels)
    if count == 0:
        raise ValueError("evaluate() got an empty loader: there is nothing to evaluate.")
    return loss_sum / count, correct / count
