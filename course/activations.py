"""Activation memory: what the forward pass keeps for backward, estimated layer by layer and measured.

The estimate watches the real module's forward with hooks and applies what each layer's backward needs
(PyTorch's derivative formulas, ``tools/autograd/derivatives.yaml``): a convolution, linear or batch-norm layer
keeps its input (the weight gradient needs it), batch norm also its per-channel mean and inverse std; ReLU,
sigmoid and tanh keep their output; max pooling keeps its input and the int64 index of every output; the loss
keeps its log-probabilities and labels. A tensor two layers keep (a ReLU's output is the next convolution's
input) counts once. The measurement counts what autograd really saved, through
``torch.autograd.graph.saved_tensors_hooks``, one storage once, parameters and buffers left out (they are model
states, counted apart). Taught in ``notebooks/07_memory.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

KEEPS_INPUT = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GELU)
KEEPS_OUTPUT = (nn.ReLU, nn.Sigmoid, nn.Tanh)
KEEPS_INDICES = (nn.MaxPool1d, nn.MaxPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)


@dataclass(frozen=True)
class LayerActivation:
    """What one leaf layer adds to activation memory in one forward pass."""

    name: str  # the module's name in the model, e.g. "features.0"
    kind: str  # its class, e.g. "Conv2d"
    output_shape: tuple[int, ...]  # (B, ...) of its output
    saved_bytes: int  # bytes it keeps for backward that no earlier layer kept already
    input_bytes: int  # bytes of its input (what a checkpoint at this layer keeps)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def layer_activations(model: nn.Module, inputs: torch.Tensor) -> list[LayerActivation]:
    """Per-layer activation bytes of one forward pass of ``model`` on ``inputs`` (batch included), estimated.

    Shapes and dtypes come from the real forward (hooks on every leaf module); the bytes from the rule in the
    module docstring. Run at the precision you train in (``model.to(torch.bfloat16)`` halves them).
    """
    layers: list[LayerActivation] = []
    kept: dict[int, torch.Tensor] = {}  # by storage address; holding them stops no_grad reusing the address

    def keep(tensor: torch.Tensor) -> int:
        key = tensor.untyped_storage().data_ptr()
        if key in kept:
            return 0
        kept[key] = tensor
        return tensor.untyped_storage().nbytes()

    def record(name: str, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        saved = 0
        if isinstance(module, KEEPS_INPUT + KEEPS_INDICES):
            saved += keep(args[0])
        if isinstance(module, KEEPS_OUTPUT):
            saved += keep(output)
        if isinstance(module, KEEPS_INDICES):
            saved += output.numel() * 8  # int64 argmax of every output element
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)) and module.training:
            saved += 2 * module.num_features * 4  # the batch's fp32 mean and inverse std, per channel
        layers.append(LayerActivation(name, type(module).__name__, tuple(output.shape), saved, _nbytes(args[0])))

    handles = [module.register_forward_hook(lambda m, a, o, n=name: record(n, m, a, o))
               for name, module in model.named_modules() if not list(module.children())]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return layers


def loss_bytes(batch_size: int, num_classes: int, element_size: int = 4) -> int:
    """Bytes a cross-entropy loss keeps: ``(B, num_classes)`` log-probabilities and a 0-d total weight at the
    logits' precision, and the ``(B,)`` int64 labels."""
    return batch_size * (num_classes * element_size + 8) + element_size


def estimate_bytes(model: nn.Module, inputs: torch.Tensor, num_classes: int | None = None) -> int:
    """Estimated bytes saved for backward by a forward pass (plus, with ``num_classes``, a cross-entropy loss)."""
    total = sum(layer.saved_bytes for layer in layer_activations(model, inputs))
    if num_classes is not None:
        total += loss_bytes(len(inputs), num_classes, next(model.parameters()).element_size())
    return total


def measure_bytes(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> int:
    """Measured bytes autograd saves for backward in ``model(inputs)`` (and the cross-entropy loss with ``labels``).

    Counts each storage saved through ``saved_tensors_hooks`` once and leaves out the model's parameters and buffers.
    The graph is freed on return (no backward runs).
    """
    states = [*model.parameters(), *model.buffers()]  # weights, batch-norm running statistics: model states
    parameters = {t.untyped_storage().data_ptr() for t in states}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key not in parameters:
            storages[key] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(inputs)
        if labels is not None:
            nn.functional.cross_entropy(output, labels)
    return sum(storages.values())
