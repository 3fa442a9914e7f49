"""ResNet-50 as a real ``nn.Module`` (torchvision's v1.5 layout, built here: the course does not depend on
torchvision), so its activation memory can be measured rather than assumed.

Same parameter count as torchvision's ``resnet50`` (25,557,032) and as :func:`course.perf.workloads.resnet`, which
``tests/memory/test_budget.py`` checks. Taught in ``notebooks/07_memory.ipynb``.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(c_out)]


class Bottleneck(nn.Module):
    """1x1 down, 3x3 (carrying the stride), 1x1 up to 4x width, plus the shortcut; ReLU after the sum."""

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(c_in, width, 1), nn.ReLU(), *_conv_bn(width, width, 3, stride), nn.ReLU(),
                                  *_conv_bn(width, 4 * width, 1))
        changes = stride != 1 or c_in != 4 * width
        self.shortcut = nn.Sequential(*_conv_bn(c_in, 4 * width, 1, stride)) if changes else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> nn.Sequential:
    """ResNet-50 (He et al. 2016, https://arxiv.org/abs/1512.03385) for ``(B, 3, 224, 224)`` images."""
    layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    c_in = 64
    for stage, count in enumerate(blocks):
        width = 64 * 2**stage
        for block in range(count):
            layers.append(Bottleneck(c_in, width, 2 if block == 0 and stage > 0 else 1))
            c_in = 4 * width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes))
