"""Single-process data parallelism, as the course's sources built it: scatter, replicate, parallel_apply, gather.

Torch's and cunn's ``DataParallelTable``, Caffe2's ``data_parallel_model`` and ``torch.nn.DataParallel`` run one
process that drives every GPU (``../shared/seeds/000``, ``002``). One step, in the five calls of
``torch.nn.DataParallel.forward``::

    chunks = scatter(inputs, devices)              # split the batch: one chunk to each device, from device 0
    replicas = replicate(module, devices)          # copy the parameters from device 0 to every device, every step
    outputs = parallel_apply(replicas, chunks)     # one thread per device runs its replica on its chunk
    output = gather(outputs, devices[0])           # every output back to device 0
    loss(output).backward()                        # the loss on device 0; backward runs the copies in reverse:
                                                   # every replica's gradient is summed into device 0's parameters
    optimizer.step()                               # on device 0 only: the next replicate copies the result out

The output device does extra work every step (it sends the batch and the parameters, receives the outputs and
every gradient, computes the loss and steps the optimizer alone), and one Python process issues every device's
work under one GIL: why it stops scaling, and why DDP runs one process per GPU (:func:`device0_traffic`). Taught
in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

Replica = tuple[nn.Module, dict[str, torch.Tensor]]  # the module, and its parameters and buffers on one device


def scatter(inputs: torch.Tensor, devices: Sequence[torch.device]) -> list[torch.Tensor]:
    """Split ``inputs`` ``(B, ...)`` along the batch into ``len(devices)`` chunks, chunk i moved to device i.

    Chunk sizes differ by at most one sample, the first ``B % len(devices)`` chunks being the larger.

    Raises:
        ValueError: no devices, or fewer samples than devices (a device would get nothing).
    """
    if not devices:
        raise ValueError("scatter() needs at least one device, got none.")
    if inputs.shape[0] < len(devices):
        raise ValueError(f"a batch of {inputs.shape[0]} sample(s) cannot feed {len(devices)} devices: use a batch "
                         f"of at least {len(devices)} or fewer devices.")
    return [chunk.to(device) for chunk, device in zip(inputs.tensor_split(len(devices)), devices, strict=True)]


def replicate(module: nn.Module, devices: Sequence[torch.device]) -> list[Replica]:
    """One replica per device: ``module`` with a copy of its parameters and buffers on that device.

    The copies are made inside autograd (``to`` onto another device, ``clone`` onto the same one), so backward
    through a replica sums its gradient into ``module``'s own parameters, as DataParallel's ``Broadcast`` does.
    Each replica has a module object of its own: the threads of :func:`parallel_apply` run them at once.
    """
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return [(copy.deepcopy(module), {name: tensor.to(device) if tensor.device != torch.device(device)
                                     else tensor.clone() for name, tensor in state.items()}) for device in devices]


def parallel_apply(replicas: Sequence[Replica], chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run replica i on chunk i, one thread each (the one process drives every device); outputs in device order.

    Raises:
        the first exception a replica raised, re-raised here with its device's index.
    """
    outputs: list[torch.Tensor | None] = [None] * len(replicas)
    errors: list[BaseException | None] = [None] * len(replicas)

    def run(i: int) -> None:
        module, state = replicas[i]
        try:
            outputs[i] = functional_call(module, state, (chunks[i],))
        except BaseException as error:  # noqa: B036 - handed to the caller's thread below
            errors[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(replicas))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, error in enumerate(errors):
        if error is not None:
            raise RuntimeError(f"the replica on device {i} failed: {error}") from error
    return outputs  # type: ignore[return-value]


def gather(outputs: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenate the replicas' outputs along the batch on ``device`` (the output device, device 0)."""
    return torch.cat([output.to(device) for output in outputs])


def forward(module: nn.Module, inputs: torch.Tensor, devices: Sequence[torch.device]) -> torch.Tensor:
    """``torch.nn.DataParallel.forward``: scatter, replicate, parallel_apply, gather."""
    chunks = scatter(inputs, devices)
    replicas = replicate(module, devices)
    outputs = parallel_apply(replicas, chunks)
    return gather(outputs, devices[0])


def train_step(module: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
               devices: Sequence[torch.device],
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy) -> float:
    """One step of single-process data parallelism; returns the loss (computed on device 0).

    ``module`` and ``optimizer`` live on ``devices[0]``. The result equals one device training on the whole batch.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(forward(module, inputs, devices), targets.to(devices[0]))
    loss.backward()
    optimizer.step()
    return loss.item()


@dataclass(frozen=True)
class Traffic:
    """Bytes device 0 sends and receives in one step of single-process data parallelism on ``num_devices``."""

    num_devices: int
    inputs_sent: int        # scatter: every other device's chunk of the batch
    parameters_sent: int    # replicate: a copy of every parameter and buffer to every other device
    outputs_received: int   # gather: every other device's outputs
    gradients_received: int  # backward: every other device's gradient, summed on device 0

    @property
    def total(self) -> int:
        return self.inputs_sent + self.parameters_sent + self.outputs_received + self.gradients_received


def device0_traffic(module: nn.Module, inputs: torch.Tensor, num_devices: int, num_outputs: int) -> Traffic:
    """What device 0 moves in one step on ``num_devices`` for a batch ``inputs`` with ``num_outputs`` per sample.

    Every number grows with the number of devices while device 0's link stays the same: the output device is the
    bottleneck (the performance model's ``naive`` case, :mod:`course.perf_model`, times it on real links).
    """
    others = num_devices - 1
    batch = inputs.shape[0]
    kept = -(-batch // num_devices)  # device 0's own chunk, the largest
    sample_bytes = inputs[0].numel() * inputs.element_size()
    state_bytes = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return Traffic(num_devices, (batch - kept) * sample_bytes, others * state_bytes,
                   (batch - kept) * num_outputs * inputs.element_size(), others * grad_bytes)
