"""Model parallelism: cut the network into stages, one per rank; activations flow forward, gradients back.

:func:`layers` flattens ``DigitsCNN`` into one list of layers, :func:`split` cuts it into stages at given
split points (:func:`balanced_split_points` picks them so every stage does about the same FLOPs). On ranks,
stage ``r`` receives activations from rank ``r-1`` with ``dist.recv``, sends its output to ``r+1``, and in the
backward pass sends the gradient of its input back to ``r-1``: the gradients equal the unsplit model's.

Naive model parallelism (one micro-batch) keeps one stage busy at a time. A **pipeline** (GPipe) cuts the
batch into ``m`` micro-batches so stages overlap; with ``p`` equal stages the idle "bubble" is
``(p-1)/(m+p-1)`` of the time. :func:`pipeline_step` records when each stage computes as
``course.model_parallel.bubble.Event`` s; that module measures the bubble on them and draws the timeline.
Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from course.arguments import check_count
from course.model_parallel.bubble import Event


def layers(model: nn.Module) -> list[nn.Module]:
    """The model as one flat list of layers, in forward order (``DigitsCNN``: its features, then classifier).

    Raises:
        ValueError: a model without ``features`` and ``classifier`` that is not an ``nn.Sequential``.
    """
    if isinstance(model, nn.Sequential):
        return list(model)
    if isinstance(getattr(model, "features", None), nn.Sequential) and isinstance(
            getattr(model, "classifier", None), nn.Sequential):
        return list(model.features) + list(model.classifier)
    raise ValueError(f"cannot flatten {type(model).__name__} into layers: expected an nn.Sequential or a model with "
                     "nn.Sequential `features` and `classifier` (like course.models.DigitsCNN).")


def split(model: nn.Module, split_points: Sequence[int]) -> list[nn.Sequential]:
    """Cut the model's layers into stages: stage ``s`` holds layers ``split_points[s-1]:split_points[s]``.

    The stages share the model's parameters (no copies), so ``nn.Sequential(*stages)`` is the model.

    Args:
        split_points: strictly increasing layer indices in ``1 .. len(layers(model)) - 1``; k points, k+1 stages.

    Raises:
        ValueError: a split point outside the model, points not strictly increasing, or a stage without
            parameters (nothing to train on that rank).
    """
    flat = layers(model)
    points = list(split_points)
    if any(not 0 < s < len(flat) for s in points) or points != sorted(set(points)):
        raise ValueError(f"split points must be strictly increasing layer indices between 1 and {len(flat) - 1} "
                         f"(the model has {len(flat)} layers), got {points}.")
    bounds = [0, *points, len(flat)]
    stages = [nn.Sequential(*flat[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    empty = [s for s, stage in enumerate(stages) if not any(True for _ in stage.parameters())]
    if empty:
        raise ValueError(f"stage(s) {empty} of split points {points} hold no parameters (only {stages[empty[0]]}): "
                         "move a split point so every stage owns a Conv2d or Linear layer.")
    return stages


def layer_flops(model: nn.Module, input_shape: tuple[int, ...]) -> list[int]:
    """Forward FLOPs per sample of each layer (2 x multiply-adds of Conv2d and Linear, 0 for the rest)."""
    x = torch.zeros(1, *input_shape, device=next(model.parameters()).device)
    flops = []
    with torch.no_grad():
        for layer in layers(model):
            y = layer(x)
            if isinstance(layer, nn.Conv2d):
                flops.append(2 * y.numel() * layer.in_channels // layer.groups * int(np.prod(layer.kernel_size)))
            elif isinstance(layer, nn.Linear):
                flops.append(2 * layer.in_features * layer.out_features)
            else:
                flops.append(0)
            x = y
    return flops


def balanced_split_points(model: nn.Module, num_stages: int, input_shape: tuple[int, ...]) -> list[int]:
    """Split points for ``num_stages`` stages whose largest stage has the fewest FLOPs (tried exhaustively).

    Stages are cut just before a Conv2d or Linear layer, so each one owns parameters.

    Raises:
        ValueError: num_stages < 1, or more stages than the model has Conv2d/Linear layers.
    """
    flat = layers(model)
    candidates = [i for i, layer in enumerate(flat) if i > 0 and isinstance(layer, (nn.Conv2d, nn.Linear))]
    if not 1 <= num_stages <= len(candidates) + 1:
        raise ValueError(f"num_stages must be between 1 and {len(candidates) + 1} (the model's Conv2d and Linear "
                         f"layers), got {num_stages}.")
    cumulative = np.concatenate([[0], np.cumsum(layer_flops(model, input_shape))])

    def largest_stage(points: tuple[int, ...]) -> float:
        bounds = [0, *points, len(flat)]
        return max(cumulative[b] - cumulative[a] for a, b in zip(bounds, bounds[1:], strict=False))

    return list(min(itertools.combinations(candidates, num_stages - 1), key=largest_stage))


def pipeline_step(stages: Sequence[nn.Module], inputs: torch.Tensor, targets: torch.Tensor, num_micro_batches: int
                  ) -> tuple[float, list[Event]]:
    """Run inside a launched rank: one GPipe forward + backward of ``stages[rank]`` (its gradients accumulate).

    All forwards first, micro-batch by micro-batch, then all backwards in reverse order. Rank 0 reads
    ``inputs``, the last rank computes the loss on ``targets`` (each micro-batch's mean loss weighted by its share
    of the batch, so the gradients equal one pass over the whole batch); every rank gets the same arguments.

    Args:
        stages: from :func:`split`, one per rank; only ``stages[rank]`` is used and must be on this rank's device.
        inputs: ``(B, ...)``; targets: ``(B,)``.
        num_micro_batches: 1 = naive model parallelism; 1 <= m <= B.

    Returns:
        ``(loss, events)``: the batch loss (on the last rank; 0.0 elsewhere) and this stage's compute intervals,
        in seconds since the step began.

    Raises:
        ValueError: a number of stages other than the world size, or fewer samples than micro-batches.
    """
    from course.data_parallel import split_batch

    rank, world_size = dist.get_rank(), dist.get_world_size()
    if len(stages) != world_size:
        raise ValueError(f"a pipeline runs one stage per rank: got {len(stages)} stages on world_size={world_size}. "
                         f"Split the model at {world_size - 1} point(s), or launch {len(stages)} ranks.")
    num_micro_batches = check_count("num_micro_batches", num_micro_batches, unit="number of micro-batches",
                                    maximum=len(targets))
    stage = stages[rank]
    device = next(stage.parameters()).device
    micro = split_batch(inputs, targets, num_micro_batches)
    shapes = _input_shapes(stage, [x for x, _ in micro], rank, world_size)
    kept, events, loss_total = [], [], 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(micro):
        if rank == 0:
            x = x.to(device)
        else:
            x = torch.empty(shapes[i], device=device)
            dist.recv(x, rank - 1)
            x.requires_grad_()
        start = time.perf_counter()
        out = stage(x)
        if rank == world_size - 1:
            out = nn.functional.cross_entropy(out, y.to(device)) * (len(y) / len(targets))
            loss_total += out.item()
        _synchronize(device)
        events.append(Event(rank, "F", i, start - t0, time.perf_counter() - t0))
        if rank < world_size - 1:
            dist.send(out.detach().contiguous(), rank + 1)
        kept.append((x, out))
    for i in reversed(range(len(micro))):
        x, out = kept[i]
        grad = None
        if rank < world_size - 1:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
        start = time.perf_counter()
        out.backward(grad)
        _synchronize(device)
        events.append(Event(rank, "B", i, start - t0, time.perf_counter() - t0))
        if rank > 0:
            dist.send(x.grad.contiguous(), rank - 1)
    return loss_total, events


def _input_shapes(stage: nn.Module, micro_inputs: list[torch.Tensor], rank: int, world_size: int
                  ) -> list[torch.Size]:
    """Each micro-batch's activation shape at this stage's input, told by the previous stage (metadata only)."""
    device = next(stage.parameters()).device  # nccl sends only device tensors, even for metadata
    shapes = []
    for x in micro_inputs:
        meta = torch.zeros(8, dtype=torch.int64, device=device)
        if rank > 0:
            dist.recv(meta, rank - 1)
        shape = torch.Size(meta[1:1 + int(meta[0])].tolist()) if rank > 0 else x.shape
        if rank < world_size - 1:
            with torch.no_grad():
                out_shape = stage(torch.zeros(shape, device=device)).shape
            out = torch.zeros(8, dtype=torch.int64, device=device)
            out[0], out[1:1 + len(out_shape)] = len(out_shape), torch.tensor(out_shape)
            dist.send(out, rank + 1)
        shapes.append(shape)
    return shapes


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # time the kernels, not their launch


@dataclass(frozen=True)
class Config:
    """A pipeline experiment on the digits, one stage per rank."""

    batch_size: int = 128                        # samples per training step, split into micro-batches
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)  # m values to time; 1 = naive model parallelism
    width: int = 32                              # DigitsCNN width
    repeats: int = 3                             # timed steps per m (the median one's timeline is kept)
    seed: int = 0                                # model initialisation and batch choice


def training_batch(config: Config = Config()) -> tuple[torch.Tensor, torch.Tensor]:
    """The experiment's batch: the first ``config.batch_size`` training digits, ``(B, 1, 8, 8)`` and ``(B,)``."""
    from course.data import load

    images, labels = load("digits").train.tensors
    return images[:config.batch_size], labels[:config.batch_size]


def run_pipeline(config: Config = Config(), batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """Run inside a launched rank: split ``DigitsCNN`` into ``world_size`` balanced stages and time GPipe steps.

    Every rank builds the same seeded model and keeps its own stage. For each m in ``config.micro_batches``:
    one warm-up step, then ``repeats`` timed steps; the timeline of the median step (by its slowest stage,
    the same step on every rank) is kept.

    Args:
        batch: :func:`training_batch` of ``config``, loaded by the caller (each rank loading it itself is slow).

    Returns:
        ``{"split_points", "grads": {m: this stage's flat gradient of one step}, "loss": {m: loss},
        "events": {m: [Event, ...] of this stage}, "step_s": {m: [seconds of each timed step, slowest stage]}}``.
    """
    from course import world
    from course.models import DigitsCNN

    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(config.seed)
    model = DigitsCNN(width=config.width)
    points = balanced_split_points(model, world_size, (1, 8, 8))
    stages = split(model, points)
    stage = stages[rank].to(world.current().device)  # each device holds only its own stage
    inputs, targets = training_batch(config) if batch is None else batch
    result: dict = {"split_points": points, "grads": {}, "loss": {}, "events": {}}
    result["step_s"] = {}
    for m in config.micro_batches:
        timings = []
        for repeat in range(config.repeats + 1):
            stage.zero_grad(set_to_none=True)
            loss, events = pipeline_step(stages, inputs, targets, m)
            if repeat > 0:  # the first step warms up
                timings.append((max(e.end for e in events), events))
        result["grads"][m] = torch.cat([p.grad.flatten() for p in stage.parameters()]).cpu()
        result["loss"][m] = loss
        # A step lasts until its slowest stage ends; every rank keeps the same (median) step's timeline.
        steps = torch.tensor([t[0] for t in timings], dtype=torch.float64, device=world.current().device)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        median = int(torch.argsort(steps.cpu())[(len(timings) - 1) // 2])
        result["events"][m] = timings[median][1]
        result["step_s"][m] = steps.tolist()
    return result


def unsplit_gradients(config: Config = Config()) -> tuple[float, torch.Tensor]:
    """The reference: loss and flat gradient of the whole model on the whole batch, in one process."""
    from course.models import DigitsCNN

    torch.manual_seed(config.seed)
    model = DigitsCNN(width=config.width)
    inputs, targets = training_batch(config)
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])


def describe(stages: Sequence[nn.Module]) -> str:
    """One line per stage listing its layers, e.g. ``stage 0: Conv2d ReLU Conv2d ReLU MaxPool2d``."""
    return "\n".join(f"stage {s}: " + " ".join(type(layer).__name__ for layer in stage)
                     for s, stage in enumerate(stages))
