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


def layer_activations(model: nn.Module, inputs: torch.Tensor,
                      kept: dict[int, torch.Tensor] | None = None) -> list[LayerActivation]:
    """Per-layer activation bytes of one forward pass of ``model`` on ``inputs`` (batch included), estimated.

    Shapes and dtypes come from the real forward (hooks on every leaf module); the bytes from the rule in the
    module docstring. Run at the precision you train in (``model.to(torch.bfloat16)`` halves them). ``kept``:
    tensors already held by storage address (they count once, and are not counted again here).
    """
    layers: list[LayerActivation] = []
    kept = {} if kept is None else kept  # by storage address; holding them stops no_grad reusing the address

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


class _SavedBytes:
    """Sums the storages autograd saves for backward while active, each once, the model's own tensors left out."""

    def __init__(self, model: nn.Module) -> None:
        states = [*model.parameters(), *model.buffers()]  # weights, batch-norm running statistics: model states
        self.excluded = {t.untyped_storage().data_ptr() for t in states}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key not in self.excluded:
            self.storages[key] = tensor.untyped_storage().nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def measure_bytes(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> int:
    """Measured bytes autograd saves for backward in ``model(inputs)`` (and the cross-entropy loss with ``labels``).

    Counts each storage saved through ``saved_tensors_hooks`` once and leaves out the model's parameters and
    buffers. The graph is freed on return (no backward runs).
    """
    saved = _SavedBytes(model)
    with saved.hooks:
        output = model(inputs)
        if labels is not None:
            nn.functional.cross_entropy(output, labels)
    return saved.total


def last_segment_start(num_layers: int, segments: int) -> int:
    """Where ``checkpoint_sequential`` starts the last segment, the one it runs without checkpointing.

    It cuts ``num_layers`` into ``segments`` runs of ``num_layers // segments`` layers; the last run takes the rest.
    """
    if not 1 <= segments <= num_layers:
        raise ValueError(f"segments must be between 1 and the number of layers ({num_layers}), got {segments}.")
    return (num_layers // segments) * (segments - 1)


def checkpointed_estimate(model: nn.Sequential, inputs: torch.Tensor, segments: int,
                          num_classes: int | None = None) -> int:
    """Estimated bytes held between forward and backward under ``checkpoint_sequential(model, segments, inputs)``.

    Each checkpointed segment keeps only its input; the last segment keeps what its layers keep (the rule of
    :func:`layer_activations`); the loss keeps its own. Backward then recomputes one segment at a time, holding
    its activations on top of these while it runs (:func:`course.memory.budget.checkpointed` models that peak).
    """
    size, last = len(model) // segments, last_segment_start(len(model), segments)
    kept: dict[int, torch.Tensor] = {}  # segment inputs by storage (a flattened view shares its input's storage)
    x = inputs
    with torch.no_grad():
        for index, layer in enumerate(model[:last]):
            if index % size == 0:
                kept.setdefault(x.untyped_storage().data_ptr(), x)
            x = layer(x)
    held = sum(t.untyped_storage().nbytes() for t in kept.values())
    held += sum(layer.saved_bytes for layer in layer_activations(model[last:], x, kept))
    if num_classes is not None:
        held += loss_bytes(len(inputs), num_classes, next(model.parameters()).element_size())
    return held


def measure_checkpointed(model: nn.Sequential, inputs: torch.Tensor, labels: torch.Tensor, segments: int) -> int:
    """Measured bytes held for backward under ``checkpoint_sequential`` (reentrant, so each segment saves its
    input through autograd, where the hooks see it) followed by a cross-entropy loss. ``inputs`` gets
    ``requires_grad`` (reentrant checkpointing needs it to reach the parameters)."""
    from torch.utils.checkpoint import checkpoint_sequential

    last_segment_start(len(model), segments)
    saved = _SavedBytes(model)
    with saved.hooks:
        output = checkpoint_sequential(model, segments, inputs.detach().requires_grad_(), use_reentrant=True)
        nn.functional.cross_entropy(output, labels)
    return saved.total
