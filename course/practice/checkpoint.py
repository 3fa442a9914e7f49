"""A checkpoint that training can resume from: everything a step depends on, not only the weights.

Bit-for-bit resumption needs the model, the optimizer (momentum buffers), the learning-rate scheduler, where the
data stream was (the sampler's epoch and how many batches of it were done) and every random number generator
(dropout, augmentation): each rank's own, because ranks seed them differently. Rank 0 gathers the ranks' RNG
states and writes the file (atomically: a crash mid-write leaves the previous checkpoint intact); every rank
loads it and takes its own RNG state back. Taught in ``notebooks/09_real_gpu_practice.ipynb``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from course import world


def rng_states() -> dict[str, Any]:
    """This process's random number generators: torch (CPU, and CUDA when present), Python, numpy."""
    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Put back what :func:`rng_states` returned."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model  # DDP keeps the model in .module


def _every_rank(value: Any) -> list[Any]:
    rank = world.current()
    if rank.world_size == 1:
        return [value]
    gathered: list[Any] = [None] * rank.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def save(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, epoch: int,
         step: int) -> None:
    """Write a full checkpoint (call on every rank: they all send their RNG states; rank 0 writes).

    Args:
        epoch: the sampler's epoch. step: batches of that epoch already trained (the position to resume at).
    """
    rank = world.current()
    checkpoint = {"model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                  "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step,
                  "world_size": rank.world_size, "rng": _every_rank(rng_states())}
    if rank.is_main:
        path = Path(path)
        partial = path.with_name(path.name + ".partial")
        torch.save(checkpoint, partial)
        os.replace(partial, path)  # atomic: readers see the old file or the new one, never half of one
    if rank.world_size > 1:
        dist.barrier()  # nobody runs ahead (or crashes) before the file exists


def load(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> tuple[int, int]:
    """Load a :func:`save` checkpoint on every rank; returns ``(epoch, step)`` to resume at.

    Raises:
        ValueError: the checkpoint was written by a job with another number of ranks (its RNG states and data
            shards belong to those ranks).
    """
    rank = world.current()
    checkpoint = torch.load(path, map_location=rank.device, weights_only=False)
    if checkpoint["world_size"] != rank.world_size:
        raise ValueError(f"{path} was saved by {checkpoint['world_size']} ranks but this job has {rank.world_size}; "
                         f"resume with --nproc_per_node={checkpoint['world_size']}, or start from its model alone.")
    _unwrap(model).load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    set_rng_states(checkpoint["rng"][rank.rank])
    return checkpoint["epoch"], checkpoint["step"]


def epoch_batches(num_samples: int, batch_size: int, epoch: int, start_step: int = 0, seed: int = 0
                  ) -> list[list[int]]:
    """This rank's batches of sample indices for ``epoch``, from batch ``start_step`` on (the resume position).

    ``DistributedSampler`` shuffles with ``seed + epoch``, so the epoch alone fixes the order; the position is how
    many of its batches were already trained.

    Args:
        batch_size: samples per rank per step.
    """
    rank = world.current()
    sampler = DistributedSampler(range(num_samples), num_replicas=rank.world_size, rank=rank.rank, shuffle=True,
                                 seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    indices = list(sampler)
    batches = [indices[i:i + batch_size] for i in range(0, len(indices) - batch_size + 1, batch_size)]
    return batches[start_step:]
