"""What a network costs to train, layer by layer: the published models the performance model is validated on,
and the course's own DigitsCNN.

A :class:`Workload` is a tuple of :class:`Layer` s in forward order, each with its FLOPs, parameters and the
tensor elements its kernels read and write for one sample: the inputs :mod:`course.perf.model` turns into time.
The published models are built from their papers' architecture tables and checked (``tests/perf/test_workloads.py``)
against the parameter and multiply-add counts torchvision lists for them. Taught in ``notebooks/05_ddp.ipynb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    """One layer's work for one sample in the forward pass (backward costs twice this).

    Attributes:
        name: e.g. ``"layer3.2.conv2"``.
        flops: forward FLOPs for one sample, 2 per multiply-add.
        params: trainable parameters (its gradient: ``params`` values per step).
        activations: tensor elements its forward kernels read and write for one sample (the memory traffic).
        kernels: kernels launched in forward (conv, batch norm, ReLU: 3).
        kind: what its FLOPs run on: ``"conv"`` (cuDNN convolution) or ``"matmul"`` (a GEMM).
        winograd: a 3x3 stride-1 convolution, which cuDNN runs in FP32 with Winograd's F(2x2, 3x3): 2.25x
            fewer multiplications than ``flops`` counts (Lavin & Gray 2016, https://arxiv.org/abs/1509.09308).
    """

    name: str
    flops: float
    params: int
    activations: float
    kernels: int = 3
    kind: str = "conv"
    winograd: bool = False


@dataclass(frozen=True)
class Workload:
    """A network as the model sees it: its layers in forward order, and what one input sample weighs."""

    name: str
    layers: tuple[Layer, ...]
    sample_bytes: float  # bytes of one input sample, e.g. 3 x 224 x 224 x 4 for an ImageNet image in FP32
    source: str = ""

    @property
    def flops(self) -> float:
        return sum(layer.flops for layer in self.layers)

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    def gradient_bytes(self, element_bytes: int = 4) -> float:
        """Bytes of one copy of the gradients: 4 per parameter in FP32 (and under autocast, whose gradients
        stay FP32), 2 when the model itself is FP16/BF16 (``course.perf.model.Assumptions.gradient_element_bytes``)."""
        return float(element_bytes) * self.params



def conv(name: str, c_in: int, c_out: int, kernel: int, size_out: int, stride: int = 1, norm: bool = True) -> Layer:
    """A ``kernel x kernel`` convolution (no bias) with batch norm and ReLU, ``size_out`` x ``size_out`` output."""
    pixels_out, pixels_in = size_out**2, (size_out * stride) ** 2
    return Layer(name, 2.0 * kernel**2 * c_in * c_out * pixels_out, kernel**2 * c_in * c_out + 2 * c_out * norm,
                 c_in * pixels_in + (5 if norm else 1) * c_out * pixels_out, 3 if norm else 1,
                 winograd=kernel == 3 and stride == 1)


def linear(name: str, n_in: int, n_out: int) -> Layer:
    return Layer(name, 2.0 * n_in * n_out, n_in * n_out + n_out, n_in + n_out, 1, kind="matmul")


def vgg16() -> Workload:
    """VGG-16 on 224 x 224 images (Simonyan & Zisserman 2015, configuration D; 138.4 M parameters, 15.5 G
    multiply-adds, as torchvision lists them): thirteen 3x3 convolutions with bias and ReLU, three large
    fully-connected layers that hold 89% of the parameters."""
    layers, c_in, size = [], 3, 224
    for stage, (width, count) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))):
        for i in range(count):
            relu = conv(f"features.{stage}.{i}", c_in, width, 3, size, norm=False)
            layers.append(Layer(relu.name, relu.flops, relu.params + width, relu.activations + 2 * width * size**2,
                                2, winograd=True))
            c_in = width
        size //= 2
    layers += [linear("fc6", 512 * 7 * 7, 4096), linear("fc7", 4096, 4096), linear("fc8", 4096, 1000)]
    return Workload("VGG-16", tuple(layers), 3 * 224 * 224 * 4, "https://arxiv.org/abs/1409.1556")


def resnet(blocks: tuple[int, ...] = (3, 4, 6, 3), name: str = "ResNet-50") -> Workload:
    """ResNet with bottleneck blocks on 224 x 224 images (He et al. 2016, torchvision's v1.5: stride in the 3x3).

    ``(3, 4, 6, 3)`` is ResNet-50 (25.6 M parameters, 4.1 G multiply-adds per image), ``(3, 4, 23, 3)``
    ResNet-101 (44.5 M, 7.8 G), as torchvision's model pages list them (tests check both).
    """
    layers, c_in = [conv("conv1", 3, 64, 7, 112, 2)], 64
    for stage, (count, size) in enumerate(zip(blocks, (56, 28, 14, 7), strict=True)):
        width = 64 * 2**stage
        for block in range(count):
            stride = 2 if block == 0 and stage > 0 else 1
            prefix = f"layer{stage + 1}.{block}"
            layers += [conv(f"{prefix}.conv1", c_in, width, 1, size * stride),
                       conv(f"{prefix}.conv2", width, width, 3, size, stride),
                       conv(f"{prefix}.conv3", width, 4 * width, 1, size)]
            if block == 0:
                layers.append(conv(f"{prefix}.downsample", c_in, 4 * width, 1, size, stride))
            c_in = 4 * width
    layers.append(linear("fc", c_in, 1000))
    return Workload(name, tuple(layers), 3 * 224 * 224 * 4,
                    "He et al. 2016, https://arxiv.org/abs/1512.03385; totals as listed at "
                    "https://pytorch.org/vision/stable/models/generated/torchvision.models.resnet50.html")


def wide_resnet(depth: int = 28, k: int = 10) -> Workload:
    """Wide ResNet WRN-depth-k on 32 x 32 CIFAR images (Zagoruyko & Komodakis 2016; WRN-28-10: 36.5 M parameters)."""
    per_group, layers, c_in = (depth - 4) // 6, [conv("conv1", 3, 16, 3, 32)], 16
    for group, size in enumerate((32, 16, 8)):
        width = 16 * k * 2**group
        for block in range(per_group):
            stride = 2 if block == 0 and group > 0 else 1
            layers += [conv(f"group{group}.{block}.conv1", c_in, width, 3, size, stride),
                       conv(f"group{group}.{block}.conv2", width, width, 3, size)]
            if c_in != width:
                layers.append(conv(f"group{group}.{block}.shortcut", c_in, width, 1, size, stride, norm=False))
            c_in = width
    layers.append(linear("fc", c_in, 10))
    return Workload(f"WRN-{depth}-{k}", tuple(layers), 3 * 32 * 32 * 4, "https://arxiv.org/abs/1605.07146")


def digits_cnn(input_shape: tuple[int, ...] = (1, 8, 8)) -> Workload:
    """The course's DigitsCNN (:mod:`course.models`), layer by layer, counted with forward hooks."""
    import torch
    from torch import nn

    from course.models import DigitsCNN

    model, layers = DigitsCNN(input_shape[0]), []

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        macs = (module.in_channels * module.kernel_size[0] * module.kernel_size[1] * output[0].numel()
                if isinstance(module, nn.Conv2d) else module.in_features * module.out_features)
        layers.append(Layer(f"{type(module).__name__}{len(layers)}", 2.0 * macs,
                            sum(p.numel() for p in module.parameters()), inputs[0][0].numel() + 3 * output[0].numel(),
                            2))

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(torch.zeros(1, *input_shape))
    for handle in handles:
        handle.remove()
    return Workload("DigitsCNN", tuple(layers), 4.0 * math.prod(input_shape), "course/models.py")
