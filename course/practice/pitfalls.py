"""DDP pitfalls as runnable contrasts: the wrong way and the right way, with the measured consequence.

Every function runs on each rank (under :func:`course.runtime.launch.launch`) and returns plain numbers:

* :func:`augmentation_seeds`: a random crop drawn from a generator seeded the same on every rank gives every
  rank the *same* crops (the global batch holds duplicate augmentations); seeding with ``seed + rank`` does not.
* :func:`clipping`: clipping after ``backward`` under DDP clips the averaged gradients, so every rank computes
  the same norm. Under FSDP each rank holds only a shard of the gradients: the norm of the local shard is not the
  model's norm; ``clip_grad_norm_`` on FSDP's sharded (DTensor) parameters computes the total,
  ``sqrt(all_reduce(sum of squared shard norms))``, equal to the unsharded model's.
* :func:`uneven_inputs`: ranks with different numbers of batches. Without ``Join`` the rank with more batches
  waits in an allreduce nobody else joins (here: a group with a short timeout, so it raises instead of hanging);
  under ``torch.distributed.algorithms.Join`` the finished ranks shadow the collectives and every rank ends
  with the same parameters.
* :func:`unused_parameters`: a branch unused on some steps makes DDP raise on the next step; with
  ``find_unused_parameters=True`` it trains. :func:`unused_parameters_cost`: the price, a traversal of the
  autograd graph every step: both step times measured on a model that uses every parameter.

Taught in ``notebooks/09b_profiling_and_pitfalls.ipynb``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from course import world
from course.runtime import paths


def _crops(generator: torch.Generator, steps: int, size: int = 32, crop: int = 24) -> list[tuple[int, int]]:
    """Top-left corners of ``steps`` random ``crop x crop`` crops of a ``size x size`` image."""
    return [tuple(torch.randint(0, size - crop + 1, (2,), generator=generator).tolist()) for _ in range(steps)]


def augmentation_seeds(steps: int = 20, seed: int = 0) -> dict[str, float]:
    """Fraction of steps on which another rank drew the same crop as rank 0: one seed for all vs ``seed + rank``."""
    rank = world.current()
    shares = {}
    for name, own_seed in (("same seed", seed), ("seed + rank", seed + rank.rank)):
        crops = torch.tensor(_crops(torch.Generator().manual_seed(own_seed), steps), device=rank.device)  # (steps, 2)
        gathered = [torch.zeros_like(crops) for _ in range(rank.world_size)]
        dist.all_gather(gathered, crops)
        same = [(gathered[0] == other).all(dim=1) for other in gathered[1:]]
        shares[name] = torch.stack(same).float().mean().item()
    return shares


def _mlp() -> nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank and in both wrappers
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(world.current().device)


def _backward(model: nn.Module, seed: int) -> None:
    """One backward on this rank's own batch (seeded by ``seed + rank``)."""
    rank = world.current()
    torch.manual_seed(seed + rank.rank)
    model(torch.randn(32, 8, device=rank.device)).pow(2).sum().backward()


def clipping(seed: int = 0) -> dict[str, float]:
    """The gradient norm that clipping would use: under DDP, and under FSDP (``fully_shard``) two ways.

    Returns ``{"ddp norm", "shard norm", "fsdp norm"}``: DDP's averaged gradients (every rank holds all of them,
    the unsharded model's norm); the norm of this rank's FSDP shard alone (what a per-rank clip on local tensors
    sees: wrong); and FSDP's ``clip_grad_norm_`` over the sharded parameters, which all-reduces the shards'
    squared norms (right).
    """
    from torch.distributed.fsdp import fully_shard

    ddp = DDP(_mlp())
    _backward(ddp, seed)
    ddp_norm = nn.utils.get_total_norm([p.grad for p in ddp.parameters()]).item()
    sharded = _mlp()
    fully_shard(sharded)
    _backward(sharded, seed)  # FSDP reduce-scatters the averaged gradients: each rank keeps its shard
    shard_norm = nn.utils.get_total_norm([p.grad.to_local() for p in sharded.parameters()]).item()
    total = nn.utils.clip_grad_norm_(sharded.parameters(), max_norm=float("inf"))  # a DTensor: the global norm
    fsdp_norm = (total.full_tensor() if hasattr(total, "full_tensor") else total).item()
    return {"ddp norm": ddp_norm, "shard norm": shard_norm, "fsdp norm": fsdp_norm}


def _uneven_steps(model: nn.Module, batches: int, lr: float = 0.1) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(batches):
        model(torch.full((4, 4), float(step + 1), device=next(model.parameters()).device)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def uneven_inputs(join: bool, timeout_s: float = 3.0) -> dict[str, object]:
    """Rank r has ``3 + r`` batches. ``join=False``: DDP on a gloo group with a ``timeout_s`` timeout (the
    hang, made to end); ``join=True``: the same loop inside ``Join([model])``.

    Returns ``{"error": the exception's first line or None, "params": the flattened parameters}``.
    """
    rank = world.current()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1), process_group=group)
    error = None
    try:
        if join:
            with Join([model]):
                _uneven_steps(model, 3 + rank.rank)
        else:
            _uneven_steps(model, 3 + rank.rank)
    except RuntimeError as exc:
        error = paths.shorten(str(exc).splitlines()[0])[:160]  # gloo names its C++ file where torch was built
    return {"error": error, "params": torch.cat([p.detach().flatten() for p in model.parameters()])}


def unused_parameters(find_unused_parameters: bool) -> str:
    """The "unused" drill's model (a branch used on even steps only) for 3 steps, on this rank: DDP's error
    message (wrong: ``find_unused_parameters=False``) or the last loss (right: ``True``)."""
    from course.practice.drills import unused_branch

    try:
        return f"trained, last loss {unused_branch(3, find_unused_parameters):.4f}"
    except RuntimeError as error:
        return str(error)


def unused_parameters_cost(steps: int = 20, depth: int = 24) -> dict[str, float]:
    """Seconds per step (forward + backward) of a ``depth``-layer MLP that uses every parameter, under DDP with
    ``find_unused_parameters`` False and True, measured alternately after a warm-up step each."""
    rank = world.current()
    inputs = torch.ones(8, 16, device=rank.device)
    models = {}
    for flag in (False, True):
        torch.manual_seed(0)
        layers = nn.Sequential(*[nn.Linear(16, 16) for _ in range(depth)]).to(rank.device)
        models[flag] = DDP(layers, find_unused_parameters=flag)
        models[flag](inputs).sum().backward()  # warm-up: DDP rebuilds its buckets after the first step
    seconds = {False: 0.0, True: 0.0}
    for _ in range(steps):
        for flag, model in models.items():
            start = time.perf_counter()
            model(inputs).sum().backward()
            seconds[flag] += time.perf_counter() - start
    return {f"find_unused_parameters={flag}": total / steps for flag, total in seconds.items()}


def all_contrasts() -> dict[str, object]:
    """Every contrast above, on this rank, in one launch (the notebook's single multi-rank cell), each with the
    seconds it took under ``"<name> s"``. Launch it with ``TORCH_DISTRIBUTED_DEBUG=INFO`` for the unused
    parameters to be named (:func:`course.practice.drills.debug_level`)."""
    timed = {}
    for name, contrast in (("unused error", lambda: unused_parameters(False)),
                           ("unused fixed", lambda: unused_parameters(True)),
                           ("seeds", augmentation_seeds), ("clipping", clipping),
                           ("unused cost", unused_parameters_cost), ("join", lambda: uneven_inputs(join=True)),
                           ("no join", lambda: uneven_inputs(join=False))):
        start = time.perf_counter()
        timed[name] = contrast()
        timed[name + " s"] = time.perf_counter() - start
    return timed
