"""The parameter server: workers push gradients to one server rank, which averages, updates and sends back.

Rank 0 is the server and holds the optimizer; ranks 1..n-1 are workers. One **synchronous** step:

    workers pull the parameters  (server sends P bytes to each of the W = n-1 workers)
    each worker: forward/backward on its shard of the global batch
    workers push their gradients (server receives G bytes from each worker)
    server averages and steps

which is exactly data-parallel SGD (tested), but every byte goes through the server's one link:
``W·G`` in and ``W·P`` out per step (:func:`server_bytes_per_step`), growing with the number of workers,
while a ring allreduce moves ``2(W-1)/W·G`` per rank whatever W is (notebook 04). The **asynchronous**
variant lets the server apply each gradient as it arrives (Downpour SGD): nobody waits, but a gradient was
computed on parameters that are already some updates old; :mod:`course.naive.staleness` measures what that does to
convergence. Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course import world
from course.arguments import check_count
from course.collectives import cost_model
from course.data_parallel import forward_backward, split_batch, train_on_ranks
from course.runtime import observed

SERVER = 0


@dataclass(frozen=True)
class Config:
    """One parameter-server experiment on the digits (every rank builds the same model and batches)."""

    steps: int = 12          # synchronous steps (the async run applies steps x workers gradients)
    global_batch_size: int = 48  # samples per synchronous step, split over the workers
    lr: float = 0.1          # SGD learning rate for the averaged gradient
    width: int = 8           # DigitsCNN width: small, so the demo is about communication
    seed: int = 0            # model initialisation and data order


def server_bytes_per_step(gradient_bytes: int, parameter_bytes: int, num_workers: int) -> tuple[int, int]:
    """Bytes ``(into, out of)`` the server in one synchronous step: ``W·G`` pushed in, ``W·P`` pulled out."""
    num_workers = check_count("num_workers", num_workers, unit="number of workers (a parameter server needs one)")
    return num_workers * gradient_bytes, num_workers * parameter_bytes


def allreduce_bytes_per_rank(gradient_bytes: int, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring allreduce of ``G`` bytes: ``2(n-1)/n·G`` (notebook 04)."""
    _, b = cost_model.coefficients("ring", world_size)
    return b * gradient_bytes


class _Wire:
    """Point-to-point sends and receives of CPU tensors over gloo, counting the bytes this rank moved.

    Parameter servers keep parameters in host memory, and "receive from whichever worker is first" (the
    asynchronous server) exists in gloo but not in nccl, so messages always travel over a gloo group of their own,
    torch's gloo with gloo's rules (:func:`course.runtime.observed.unobserved`), on GPUs and on emulated ones.
    """

    def __init__(self) -> None:
        with observed.unobserved():
            self.group = dist.new_group(backend="gloo")
        self.bytes_in = 0
        self.bytes_out = 0

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor.cpu(), dst, group=self.group)
        self.bytes_out += tensor.numel() * tensor.element_size()

    def recv(self, tensor: torch.Tensor, src: int | None = None) -> int:
        """Receive into a CPU tensor from ``src`` (``None``: from any rank); returns the sender's rank."""
        sender = dist.recv(tensor, src, group=self.group)
        self.bytes_in += tensor.numel() * tensor.element_size()
        return sender


def _check_world_size() -> int:
    world_size = dist.get_world_size()
    if world_size < 2:
        raise ValueError(f"a parameter server needs a server and at least one worker: world_size >= 2, got "
                         f"{world_size}. Launch with world_size=2 or more.")
    return world_size


def worker_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A worker's job: the flat gradient ``(P,)`` of ``model``'s mean cross-entropy on ``(x, y)``, and that loss."""
    loss = forward_backward(model, x, y)
    return parameters_to_vector(p.grad for p in model.parameters()), loss.item()


def apply_gradient(model: nn.Module, optimizer: torch.optim.Optimizer, flat_grad: torch.Tensor) -> None:
    """The server's job: load a flat gradient ``(P,)`` into ``model``'s ``.grad`` and take ``optimizer``'s step."""
    for p, g in zip(model.parameters(), _split_like(flat_grad, model), strict=True):
        p.grad = g.view_as(p).clone()
    optimizer.step()


def _split_like(flat: torch.Tensor, model: nn.Module) -> list[torch.Tensor]:
    return list(torch.split(flat, [p.numel() for p in model.parameters()]))


def run_sync(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float) -> dict:
    """Run inside a launched rank: synchronous parameter-server SGD (rank 0 serves, the others work).

    Returns:
        ``{"losses": global-batch loss per step, "bytes_in", "bytes_out": this rank's totals,
        "params": the final flat parameters (on the server)}``.

    Raises:
        ValueError: world size below 2, or a global batch smaller than the number of workers.
    """
    rank, world_size = dist.get_rank(), _check_world_size()
    workers = world_size - 1
    wire = _Wire()
    device = next(model.parameters()).device
    params = torch.zeros(sum(p.numel() for p in model.parameters()))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr) if rank == SERVER else None
    losses = []
    for inputs, targets in batches:
        shards = split_batch(inputs, targets, workers)
        if rank == SERVER:
            params.copy_(parameters_to_vector(model.parameters()).detach())
            for worker in range(1, world_size):
                wire.send(params, worker)                                   # pull
            total = torch.zeros(params.numel() + 1)
            message = torch.empty_like(total)
            for worker in range(1, world_size):
                wire.recv(message, worker)                                  # push: [gradient, loss]
                total += message * len(shards[worker - 1][1]) / len(targets)  # weight by shard size
            apply_gradient(model, optimizer, total[:-1].to(device))
            losses.append(float(total[-1]))
        else:
            wire.recv(params, SERVER)
            vector_to_parameters(params.to(device), model.parameters())
            grad, loss = worker_gradient(model, *shards[rank - 1])
            wire.send(torch.cat([grad, grad.new_tensor([loss])]), SERVER)
    return {"losses": losses, "bytes_in": wire.bytes_in, "bytes_out": wire.bytes_out,
            "params": parameters_to_vector(model.parameters()).detach().cpu()}


def run_async(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
              delay_s: float = 0.0) -> dict:
    """Run inside a launched rank: asynchronous parameter server; the server applies gradients as they arrive.

    Worker ``w`` computes one gradient per global batch, on its shard, from whatever parameters the server last
    sent it; the server steps with ``lr / W`` per gradient (so W gradients move as far as one synchronous step)
    and records each gradient's **staleness**: how many updates other workers applied since it pulled.

    Args:
        delay_s: extra seconds worker ``w`` sleeps per gradient, times ``w - 1``: a straggler makes staleness visible.

    Returns:
        ``{"losses": shard loss per update, "staleness": per update, "senders": per update, "bytes_in",
        "bytes_out", "params"}``; the lists are empty on workers.
    """
    rank, world_size = dist.get_rank(), _check_world_size()
    workers = world_size - 1
    wire = _Wire()
    device = next(model.parameters()).device
    numel = sum(p.numel() for p in model.parameters())
    # Messages carry [parameters, version] down and [gradient, version pulled, loss] up.
    down, up = torch.zeros(numel + 1), torch.zeros(numel + 2)
    result: dict = {"losses": [], "staleness": [], "senders": []}
    if rank == SERVER:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr / workers)
        version, remaining = 0, dict.fromkeys(range(1, world_size), len(batches))
        down[:-1] = parameters_to_vector(model.parameters()).detach()
        for worker in remaining:
            wire.send(down, worker)
        while any(remaining.values()):
            sender = wire.recv(up)  # from whichever worker is first
            apply_gradient(model, optimizer, up[:-2].to(device))
            result["staleness"].append(version - int(up[-2]))
            result["losses"].append(float(up[-1]))
            result["senders"].append(sender)
            version += 1
            remaining[sender] -= 1
            if remaining[sender]:
                down[:-1], down[-1] = parameters_to_vector(model.parameters()).detach(), version
                wire.send(down, sender)
    else:
        for inputs, targets in batches:
            wire.recv(down, SERVER)
            vector_to_parameters(down[:-1].to(device), model.parameters())
            grad, loss = worker_gradient(model, *split_batch(inputs, targets, workers)[rank - 1])
            time.sleep(delay_s * (rank - 1))
            wire.send(torch.cat([grad, grad.new_tensor([float(down[-1]), loss])]), SERVER)
    result.update(bytes_in=wire.bytes_in, bytes_out=wire.bytes_out,
                  params=parameters_to_vector(model.parameters()).detach().cpu())
    return result


def batches(config: Config = Config()) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The experiment's global batches of digits (load them once, before launching, and pass them in)."""
    from course.data import global_batches, load

    return global_batches(load("digits").train, config.global_batch_size, config.steps, config.seed)


def compare_on_ranks(config: Config = Config(), data: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
                     async_delay_s: float = 0.002) -> dict:
    """Run inside a launched rank: allreduce data parallelism, then the sync and async parameter servers.

    All three start from the same model (seeded) and see the same global batches (notebook 03); one launch
    does all three, since starting ranks is the slow part.

    Args:
        data: :func:`batches` of ``config``, loaded by the caller (each rank loading the dataset itself is slow).

    Returns:
        ``{"allreduce": losses, "sync": run_sync(...), "async": run_async(...), "allreduce_params": flat,
        "gradient_bytes": G, "parameter_bytes": P}``.
    """
    from course.models import DigitsCNN, gradient_bytes

    torch.manual_seed(config.seed)
    initial = DigitsCNN(width=config.width).to(world.current().device)
    data = batches(config) if data is None else data
    model = copy.deepcopy(initial)
    allreduce = train_on_ranks(model, data, config.lr)
    allreduce_params = parameters_to_vector(model.parameters()).detach().cpu()
    sync = run_sync(copy.deepcopy(initial), data, config.lr)
    asynchronous = run_async(copy.deepcopy(initial), data, config.lr, async_delay_s)
    return {"allreduce": allreduce, "allreduce_params": allreduce_params, "sync": sync, "async": asynchronous,
            "gradient_bytes": gradient_bytes(initial),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in initial.parameters())}


def modelled_seconds_per_step(gradient_bytes: int, num_workers: int, link: cost_model.AlphaBeta) -> dict[str, float]:
    """Communication seconds per step on ``link`` (alpha-beta model): the server's link vs a ring allreduce.

    The server's one link carries ``2W`` messages of ``G`` bytes (pushes in, pulls out, parameters = gradient
    bytes); the ring runs over the W workers, each link carrying ``2(W-1)/W·G`` (notebook 04).
    """
    server = 2 * num_workers * (link.alpha_s + gradient_bytes * link.beta_s_per_byte)
    ring = float(cost_model.predict("ring", gradient_bytes, num_workers, link)) if num_workers > 1 else 0.0
    return {"parameter server": server, "ring allreduce": ring}
