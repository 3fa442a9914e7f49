"""The course's models, and what the performance model needs to know about them.

Three models, smallest to largest: :class:`LinearModel`, :class:`MLP` and :class:`DigitsCNN`, an
AlexNet-style network sized for 8x8 digits that also accepts 28x28 or 32x32 images. The helpers count
parameters, gradient bytes (what data parallelism must all-reduce every step) and approximate FLOPs per
sample (what each GPU must compute). Taught in ``notebooks/00_start_here.ipynb``.
"""

from __future__ import annotations

import torch
from torch import nn


class LinearModel(nn.Module):
    """Multinomial logistic regression: flatten, then one linear layer. Input ``(B, C, H, W)``."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 8, 8), num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(_numel(input_shape), num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MLP(nn.Module):
    """Flatten, then ``len(hidden)`` ReLU layers and a linear classifier. Input ``(B, C, H, W)``."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 8, 8), num_classes: int = 10,
                 hidden: tuple[int, ...] = (128, 64)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = _numel(input_shape)
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DigitsCNN(nn.Module):
    """A small AlexNet: three 3x3 conv layers with ReLU and max-pooling, then two linear layers.

    Args:
        in_channels: 1 for digits and Fashion-MNIST, 3 for CIFAR-10.
        num_classes: number of output logits.
        width: channels of the first conv layer (the others are 2x).
        dropout: dropout before the classifier, as in AlexNet; 0 keeps training deterministic.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32, dropout: float = 0.0) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveMaxPool2d(2),  # (B, 2*width, 2, 2) for any input size >= 2x2
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(8 * width, 128), nn.ReLU(), nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def parameter_count(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with ``requires_grad`` unless told otherwise)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of gradient one rank contributes to the all-reduce each step (one per trainable parameter)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def flops_per_sample(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Approximate forward FLOPs for one sample: 2 x multiply-adds of every Conv2d and Linear layer.

    Elementwise layers (ReLU, pooling) are ignored; they are a few percent. A training step costs about
    3x this (forward, plus backward for inputs and weights).

    Args:
        input_shape: one sample's shape, e.g. ``(1, 8, 8)``.
    """
    total = 0

    def count(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            kernel = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            total += 2 * output[0].numel() * kernel
        elif isinstance(module, nn.Linear):
            total += 2 * module.in_features * module.out_features

    handles = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        device = next(model.parameters()).device
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return total


def build(name: str, input_shape: tuple[int, ...] = (1, 8, 8), num_classes: int = 10) -> nn.Module:
    """A model by name: ``linear``, ``mlp`` or ``cnn``.

    Raises:
        ValueError: unknown name.
    """
    if name == "linear":
        return LinearModel(input_shape, num_classes)
    if name == "mlp":
        return MLP(input_shape, num_classes)
    if name == "cnn":
        return DigitsCNN(input_shape[0], num_classes)
    raise ValueError(f"unknown model {name!r}; choose 'linear', 'mlp' or 'cnn'.")
