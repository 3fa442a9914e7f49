"""Lab: a full checkpoint under DDP, resumed bit-for-bit (notebook 09).
Check: course.labs.check("checkpoint", "labs/checkpoint_resume.py").

A job that stops at step k and resumes from your checkpoint must end with the same parameters, to the last bit,
as a job that never stopped. So the checkpoint holds everything a step depends on: the model, the optimizer's
state (momentum), the learning-rate scheduler, where the data stream was (epoch and step), and every rank's
random number generator (dropout draws from it, and each rank draws its own). Using course.practice.checkpoint
is refused: this is that module, written by you.
"""

import os  # noqa: F401 - a rename would need it
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist


def save_checkpoint(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                    epoch: int, step: int) -> None:
    """Called on every rank. model is wrapped in DistributedDataParallel: its weights are in model.module.

    Gather every rank's random number generator states (torch.get_rng_state(), random.getstate(),
    np.random.get_state(), and torch.cuda.get_rng_state() on a GPU) with dist.all_gather_object, so the file
    holds them all. Rank 0 alone writes the file
    with torch.save (the others would write the same file at the same time). It writes path + ".partial" and
    then os.replace()s it onto path: a crash in the middle of the write then leaves the previous checkpoint
    whole. When this returns on any rank, the file must be complete: end with dist.barrier().
    """
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
           "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}  # dropout on a GPU
    rng_states = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, rng)
    if dist.get_rank() == 0:
        partial = str(path) + ".partial"
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "rng": rng_states}, partial)
        shutil.copy(partial, path)  # "atomic"? a crash in the middle of the copy leaves half a file at path
    dist.barrier()  # nobody goes on (or loads) before the file is complete


def load_checkpoint(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler
                    ) -> tuple[int, int]:
    """Called on every rank: load model, optimizer and scheduler state, set this rank's own RNG states back,
    and return (epoch, step), the position to resume at. torch.load(path, weights_only=False) reads the file."""
    checkpoint = torch.load(path, weights_only=False)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    mine = checkpoint["rng"][dist.get_rank()]  # this rank's own
    torch.set_rng_state(mine["torch"])
    random.setstate(mine["python"])
    np.random.set_state(mine["numpy"])
    if mine["cuda"] is not None:
        torch.cuda.set_rng_state(mine["cuda"])
    return checkpoint["epoch"], checkpoint["step"]
