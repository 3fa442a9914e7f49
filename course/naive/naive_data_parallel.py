"""Single-process data parallelism, as the course's sources built it: scatter, replicate, parallel_apply, gather.

Torch's and cunn's ``DataParallelTable``, Caffe2's ``data_parallel_model`` and ``torch.nn.DataParallel`` run one
process that drives every GPU (Rescale's "Deep Learning with Multiple GPUs on Rescale: Torch"; Caffe2's
documentation of ``data_parallel_model``). One step, in the five calls of
``torch.nn.DataParallel.forward``::

    chunks = scatter(inputs, devices)               # split the batch: one chunk to each device, from device 0
    replicas = replicate(module, devices,           # copy the parameters from device 0 to every device, every
                         differentiable=True)       # step, inside autograd (course.data_parallel.replicate)
    outputs = parallel_apply(replicas, chunks)      # one thread per device runs its replica on its chunk
    output = gather(outputs, devices[0])            # every output back to device 0
    loss(output).backward()                         # the loss on device 0; backward runs the copies in reverse:
                                                    # every replica's gradient is summed into device 0's parameters
    optimizer.step()                                # on device 0 only: the next replicate copies the result out

The output device does extra work every step (it sends the batch and the parameters, receives the outputs and
every gradient, computes the loss and steps the optimizer alone), and one Python process issues every device's
work under one GIL: why it stops scaling, and why DDP runs one process per GPU (:func:`device0_traffic`). Taught
in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from course.data_parallel import replicate, split_batch


def scatter(inputs: torch.Tensor, devices: Sequence[torch.device]) -> list[torch.Tensor]:
    """Split ``inputs`` ``(B, ...)`` along the batch into ``len(devices)`` chunks, chunk i moved to device i.

    The course's one split (:func:`course.data_parallel.split_batch`) of the inputs alone: chunk sizes differ by at
    most one sample, the first ``B % len(devices)`` chunks being the larger.

    Raises:
        ValueError: no devices, or fewer samples than devices (a device would get nothing).
    """
    if not devices:
        raise ValueError("scatter() needs at least one device, got none.")
    return [chunk.to(device) for (chunk, _), device in zip(split_batch(inputs, None, len(devices)), devices,
                                                            strict=True)]


def parallel_apply(replicas: Sequence[nn.Module], chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run replica i on chunk i, one thread each (the one process drives every device); outputs in device order.

    Raises:
        the first exception a replica raised, re-raised here with its device's index.
    """
    outputs: list[torch.Tensor | None] = [None] * len(replicas)
    errors: list[BaseException | None] = [None] * len(replicas)

    def run(i: int) -> None:
        try:
            outputs[i] = replicas[i](chunks[i])
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
    replicas = replicate(module, devices, differentiable=True)  # made inside autograd: backward reaches module
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
    bottleneck (the performance model's ``naive`` case, :mod:`course.perf.model`, times it on real links).
    """
    others = num_devices - 1
    batch = inputs.shape[0]
    kept = -(-batch // num_devices)  # device 0's own chunk, the largest
    sample_bytes = inputs[0].numel() * inputs.element_size()
    state_bytes = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return Traffic(num_devices, (batch - kept) * sample_bytes, others * state_bytes,
                   (batch - kept) * num_outputs * inputs.element_size(), others * grad_bytes)


@dataclass(frozen=True)
class System:
    """How one system does the five steps of data-parallel training, and where that is written down."""

    name: str
    processes: str   # who drives the GPUs
    split: str       # 1. each device gets its part of the batch
    replicate: str   # 2. each device gets the parameters
    compute: str     # 3. forward and backward on every device
    combine: str     # 4. the gradients become one
    update: str      # 5. the optimizer step
    source: str


STEPS = ("split", "replicate", "compute", "combine", "update")

#: The systems of the course's sources, and the two it teaches, on the same five steps.
SYSTEMS = (
    System("Torch / cunn DataParallelTable", "one process drives every GPU",
           "the input is split along the batch dimension, a part per GPU",
           "a clone of the network per GPU; :syncParameters() copies the primary GPU's parameters after each update",
           "forward and backward of each clone on its GPU",
           "gradients collected on the primary GPU, which alone looks like the model to the optimizer",
           "optim runs on the primary GPU's parameters only",
           "cunn documentation, DataParallelTable; Rescale blog, "
           "\"Deep Learning with Multiple GPUs on Rescale: Torch\""),
    System("Caffe2 data_parallel_model", "one process builds one copy of the net per GPU",
           "each GPU runs its share of the mini-batch (8 GPUs x 32 = one GPU with 256)",
           "each GPU holds the same parameters",
           "each GPU executes exactly the same code on its share",
           "the gradients of all GPUs are averaged between mini-batches",
           "every GPU executes the same parameter update",
           "Caffe2 documentation, data_parallel_model (synchronous SGD)"),
    System("torch.nn.DataParallel", "one process, a thread per GPU",
           "scatter: chunks of the batch from GPU 0", "replicate: GPU 0's parameters copied out every forward",
           "parallel_apply: a thread runs each replica", "gather the outputs to GPU 0; backward sums every "
           "replica's gradient into GPU 0's parameters", "the optimizer on GPU 0 only",
           "\"Multi GPU Training\" (blog post, 2020); https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html"),
    System("TF MirroredStrategy", "one process, a replica per GPU",
           "the dataset is distributed across the replicas", "variables mirrored on every GPU",
           "each replica runs the step on its part", "gradients all-reduced across the replicas",
           "every replica applies the same update",
           "\"Multi GPU Training\" (blog post, 2020); "
           "https://www.tensorflow.org/api_docs/python/tf/distribute/MirroredStrategy"),
    System("Horovod", "one process per GPU (MPI or Gloo)",
           "each process reads its shard", "broadcast of rank 0's parameters at the start",
           "each process runs forward and backward", "DistributedOptimizer averages gradients with ring-allreduce",
           "every process applies the same update",
           "\"Deep learning with Multi-GPUs\" (blog post on NVIDIA's course \"Fundamentals of Deep Learning for "
           "Multi-GPUs\"); Sergeev & Del Balso 2018, https://arxiv.org/abs/1802.05799"),
    System("PyTorch DDP", "one process per GPU (torchrun)",
           "DistributedSampler: a shard per rank", "broadcast of rank 0's parameters when the model is wrapped",
           "each rank runs forward and backward", "bucketed allreduce of the gradients, overlapping backward",
           "every rank applies the same update",
           "Li et al. 2020, https://arxiv.org/abs/2006.15704; notebook 05"),
)
