"""Pipeline parallelism for the transformer: one stage per rank, activations sent forward and gradients back.

:func:`split` cuts a ``transformer.Transformer`` into stages of consecutive blocks (the first also embeds, the last
also normalises and projects to logits), keeping the model's parameter names so gradients compare by name.
:func:`run` executes one rank's list of ops (``schedules``: GPipe or 1F1B) with point-to-point messages:

    F i: receive micro-batch i's activations from rank-1 (rank 0 embeds the tokens), run the stage, keep what
         backward needs, send the output to rank+1 (the last rank computes the loss instead)
    B i: receive the gradient of that output from rank+1 (the last rank starts from the loss), backward, send the
         gradient of the stage's input to rank-1, free the micro-batch

Sends are ``isend`` (a rank never waits for its receiver), receives block: the order of the ops alone decides who
waits for whom. Every op is recorded: when it ran (``course.model_parallel.bubble.Event``), how many micro-batches were
in flight and how many bytes of saved activations the rank held (measured with ``saved_tensors_hooks``).
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from course import world
from course.arguments import check_choice
from course.memory.activations import _SavedBytes
from course.model_parallel.bubble import Event
from course.model_parallel.schedules import SCHEDULES, Op, check_ops
from course.model_parallel.transformer import Config as TransformerConfig
from course.model_parallel.transformer import Transformer, build, loss, sample_batch

#: The schedules this runner executes: one model chunk per rank (interleaved 1F1B is simulated only).
RUNNABLE = ("gpipe", "1f1b")


class Stage(nn.Module):
    """Blocks ``first_block .. last_block-1`` of a transformer (shared, not copied), under the model's names."""

    def __init__(self, model: Transformer, first_block: int, last_block: int, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last, self.config = first, last, model.config
        if first:
            self.embedding, self.position = model.embedding, model.position
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(first_block, last_block)})
        if last:
            self.norm, self.head = model.norm, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # (B, S) token ids -> (B, S, d)
            x = self.embedding(x) + self.position(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def split(model: Transformer, num_stages: int) -> list[Stage]:
    """``num_stages`` stages of (nearly) equal numbers of blocks.

    Raises:
        ValueError: more stages than blocks.
    """
    num_layers = model.config.num_layers
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} blocks into {num_stages} stages: use 1 to {num_layers} stages, "
                         "or a model with more layers.")
    bounds = [round(s * num_layers / num_stages) for s in range(num_stages + 1)]
    return [Stage(model, bounds[s], bounds[s + 1], s == 0, s == num_stages - 1) for s in range(num_stages)]


@dataclass
class Record:
    """What one rank saw while running its schedule."""

    events: list[Event] = field(default_factory=list)  # compute intervals, seconds since the step began
    ops: list[str] = field(default_factory=list)       # the ops in the order they ran, e.g. ["F0", "F1", "B0"]
    in_flight: list[int] = field(default_factory=list)  # micro-batches held after each op
    held_bytes: list[int] = field(default_factory=list)  # saved activation bytes held after each op
    loss: float = 0.0                                   # the batch loss (last rank only)


def run(stage: Stage, ops: Sequence[Op], inputs: torch.Tensor, targets: torch.Tensor, num_micro_batches: int
        ) -> Record:
    """Run inside a launched rank (rank ``r`` runs stage ``r``): one training step's forwards and backwards of
    ``stage`` in the order ``ops``; the stage's gradients accumulate. Every rank gets the same whole batch.

    Args:
        inputs, targets: ``(B, S)`` token ids; ``B`` must divide into ``num_micro_batches``.

    Raises:
        ValueError: ops that do not run every micro-batch forward then backward once, or an uneven split.
    """
    check_ops(ops, num_micro_batches)
    if len(inputs) % num_micro_batches:
        raise ValueError(f"{len(inputs)} sequences do not split into {num_micro_batches} equal micro-batches.")
    rank, device = dist.get_rank(), next(stage.parameters()).device
    micro_inputs, micro_targets = inputs.chunk(num_micro_batches), targets.chunk(num_micro_batches)
    shape = (len(micro_inputs[0]), inputs.shape[1], stage.config.d_model)  # (b, S, d) activations
    record, held, sends = Record(), {}, []
    dist.barrier()
    t0 = time.perf_counter()
    for op in ops:
        i = op.micro_batch
        if op.kind == "F":
            x = micro_inputs[i] if stage.first else _receive(shape, rank - 1, device)
            start, saved = time.perf_counter(), _SavedBytes(stage)
            with saved.hooks:
                out = stage(x)
                if stage.last:  # each micro-batch's mean loss, weighted by its share of the batch
                    out = loss(out, micro_targets[i]) / num_micro_batches
            held[i] = (x, out, saved.total)
            if stage.last:
                record.loss += out.item()
            else:
                sends.append(dist.isend(out.detach().contiguous(), rank + 1))
        else:
            x, out, _ = held[i]
            grad = None if stage.last else _receive(out.shape, rank + 1, device)
            start = time.perf_counter()
            out.backward(grad)
            del held[i]
            if not stage.first:
                sends.append(dist.isend(x.grad.contiguous(), rank - 1))
        record.events.append(Event(rank, op.kind, i, start - t0, time.perf_counter() - t0))
        record.ops.append(str(op))
        record.in_flight.append(len(held))
        record.held_bytes.append(sum(saved_bytes for _, _, saved_bytes in held.values()))
    for send in sends:
        send.wait()
    return record


def _receive(shape: Sequence[int], source: int, device: torch.device) -> torch.Tensor:
    x = torch.empty(shape, device=device)  # nccl receives into the rank's GPU only
    dist.recv(x, source)
    return x.requires_grad_()


def step_on_rank(config: TransformerConfig, schedule: str = "1f1b", num_micro_batches: int = 4, batch_size: int = 8,
                 seed: int = 0) -> dict:
    """Run inside a launched rank: one pipelined step of the transformer (one stage per rank; after one warm-up
    step) and, on the same batch, the unsplit model's gradients for this stage's parameters.

    Returns:
        ``{"record": Record, "grad_error": {name: largest |difference| from the unsplit model}, "ops": planned}``.
    """
    schedule = check_choice("schedule", schedule, RUNNABLE)
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), world.current().device
    inputs, targets = sample_batch(config, batch_size, seed, device)
    stage = split(build(config, seed, device), world_size)[rank]
    ops = SCHEDULES[schedule](world_size, num_micro_batches, rank)
    run(stage, ops, inputs, targets, num_micro_batches)  # warm-up: the first backward pays one-off costs
    stage.zero_grad(set_to_none=True)
    record = run(stage, ops, inputs, targets, num_micro_batches)
    full = build(config, seed, device)
    loss(full(inputs), targets).backward()
    reference = dict(full.named_parameters())
    return {"record": record, "ops": [str(op) for op in ops],
            "grad_error": {name: float((p.grad - reference[name].grad).abs().max())
                           for name, p in stage.named_parameters()}}
