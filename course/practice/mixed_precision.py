"""Mixed precision under DDP: bf16 autocast, fp16 with loss scaling, and what stays fp32.

``torch.autocast`` runs the matrix products of the forward pass (and so of backward) in 16 bits, while the
parameters, their ``.grad`` (the tensors DDP all-reduces) and the optimizer state stay fp32. bf16 has fp32's
exponent range, so it trains as is; fp16 has 5 exponent bits, so small gradients flush to zero unless the loss is
multiplied by a scale first (``torch.amp.GradScaler``: scale, ``unscale_`` before clipping, skip a step whose
gradients overflowed and halve the scale). The same code runs on CPU here and on GPUs: ``device.type`` picks.

The bytes per parameter are measured beside the ZeRO paper's mixed-precision accounting (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020, section 3.1: 2 + 2 + 12 = 16 bytes
per parameter for mixed-precision Adam), which :mod:`course.memory.budget` implements. Taught in
``notebooks/09_real_gpu_practice.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import data, models, world
from course.memory.measure import optimizer_state_bytes, tensor_bytes

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The smallest positive fp16 number (a subnormal): anything smaller in magnitude becomes 0.
FP16_SMALLEST = 2.0**-24
#: The smallest positive normal fp16 number: below it fp16 keeps fewer significant bits.
FP16_NORMAL = 2.0**-14


@dataclass(frozen=True)
class Underflow:
    """What casting gradients to fp16 after multiplying them by ``scale`` loses.

    Attributes:
        scale: the loss scale (1 = no scaling).
        flushed: fraction of the nonzero fp32 gradient elements that became exactly 0 in fp16.
        subnormal: fraction of them that became fp16 subnormals (below 2**-14: fewer than 10 significant bits).
    """

    scale: float
    flushed: float
    subnormal: float


def underflow(gradients: torch.Tensor, scale: float = 1.0) -> Underflow:
    """Cast fp32 ``gradients`` (any shape) times ``scale`` to fp16 and measure what was lost.

    Raises:
        ValueError: ``scale`` is not a positive finite number, or ``gradients`` has no nonzero element.
    """
    if not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
        raise ValueError(f"scale should be a positive finite number, got {scale!r}")
    g = gradients.detach().double().flatten()
    nonzero = g != 0
    if not bool(nonzero.any()):
        raise ValueError("gradients are all zero: there is nothing to lose; pass the gradients of a real step")
    half = (g * scale).to(torch.float16)
    flushed = (half[nonzero] == 0).double().mean().item()
    subnormal = ((half[nonzero] != 0) & (half[nonzero].abs() < FP16_NORMAL)).double().mean().item()
    return Underflow(float(scale), flushed, subnormal)


def trained_gradients(steps: int = 100, batch_size: int = 64, lr: float = 1e-2, seed: int = 0) -> torch.Tensor:
    """The fp32 gradients of one minibatch of the digits MLP after ``steps`` full-batch Adam steps.

    Late in training the loss is small, and so are its gradients: the ones fp16 cannot hold.

    Args:
        steps: Adam steps on the whole training set before the gradient is taken (0: at initialization).
        batch_size: samples in the minibatch whose gradient is returned.

    Returns:
        All parameters' gradients, concatenated, shape ``(num_params,)``.
    """
    torch.manual_seed(seed)
    inputs, targets = data.tensors(data.load("digits").train, torch.device("cpu"))
    model = models.build("mlp")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    model.zero_grad()
    F.cross_entropy(model(inputs[:batch_size]), targets[:batch_size]).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@dataclass(frozen=True)
class StateBytes:
    """Bytes of the model states one rank holds, measured from the tensors that exist."""

    num_params: int
    parameters: int
    gradients: int
    optimizer_state: int

    @property
    def per_parameter(self) -> float:
        """(parameters + gradients + optimizer state) / parameters, in bytes."""
        return (self.parameters + self.gradients + self.optimizer_state) / self.num_params


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> StateBytes:
    """Measure parameters, ``.grad`` and optimizer state of ``model`` (call after a step)."""
    params = list(model.parameters())
    return StateBytes(sum(p.numel() for p in params), tensor_bytes(params), tensor_bytes(p.grad for p in params),
                      optimizer_state_bytes(optimizer, model))


@dataclass
class AmpRun:
    """One rank's record of :func:`train_ddp`."""

    precision: str
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)  # the loss scale each step used (1.0 when not scaling)
    skipped: list[int] = field(default_factory=list)  # steps whose update was skipped (inf/nan gradients)
    dtypes: dict[str, str] = field(default_factory=dict)  # logits, loss, parameters, gradients, optimizer state
    state: StateBytes | None = None
    parameters: torch.Tensor | None = None  # all parameters after training, flattened (to compare ranks)


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision should be one of {list(PRECISIONS)}, got {precision!r}")


def train_ddp(precision: str = "bf16", steps: int = 20, batch_size: int = 32, lr: float = 1e-3,
              init_scale: float = 2.0**16, max_norm: float = 1.0, seed: int = 0) -> AmpRun:
    """Train the digits MLP with DDP and Adam under ``precision`` on this rank (call through ``launch``).

    fp16 uses ``GradScaler``: ``scale(loss).backward()``; ``unscale_`` so that clipping sees the true gradient
    norm; ``step`` (skipped when a gradient is inf/nan); ``update`` (halve the scale after a skip, double it after
    2000 clean steps). DDP all-reduces the fp32 ``.grad``, so every rank sees the same inf and skips the same steps.

    Args:
        precision: "fp32", "bf16" or "fp16". batch_size: samples per rank per step.
        init_scale: fp16's first loss scale (a huge one shows skipped steps).

    Raises:
        ValueError: an unknown ``precision``.
    """
    _check_precision(precision)
    rank = world.current()
    torch.manual_seed(seed)
    model = DDP(models.build("mlp").to(rank.device))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(rank.device.type, init_scale=init_scale, enabled=precision == "fp16")
    run = AmpRun(precision)
    for step, (inputs, targets) in enumerate(data.global_batches(data.load("digits").train,
                                                                 batch_size * rank.world_size, steps, seed)):
        inputs = inputs.chunk(rank.world_size)[rank.rank].to(rank.device)
        targets = targets.chunk(rank.world_size)[rank.rank].to(rank.device)
        with torch.autocast(rank.device.type, dtype=PRECISIONS[precision], enabled=precision != "fp32"):
            logits = model(inputs)
            loss = F.cross_entropy(logits, targets)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        run.scales.append(scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() < run.scales[-1]:
            run.skipped.append(step)
        run.losses.append(loss.item())
    _record(run, model.module, optimizer, logits, loss)
    world.settle()
    return run


def train_each(precisions: tuple[str, ...] = ("fp32", "bf16", "fp16"), **kwargs: int | float) -> dict[str, AmpRun]:
    """:func:`train_ddp` once per precision on this rank, in one launch (``kwargs`` go to each run)."""
    return {precision: train_ddp(precision, **kwargs) for precision in precisions}


def _record(run: AmpRun, model: nn.Module, optimizer: torch.optim.Optimizer, logits: torch.Tensor,
            loss: torch.Tensor) -> None:
    first = next(iter(model.parameters()))
    moment = next(iter(optimizer.state.values()))["exp_avg"]
    run.dtypes = {"logits": str(logits.dtype), "loss": str(loss.dtype), "parameters": str(first.dtype),
                  "gradients": str(first.grad.dtype), "optimizer state": str(moment.dtype)}
    run.state = state_bytes(model, optimizer)
    run.parameters = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
