"""Kill a rank mid-epoch, let ``torchrun --max-restarts=1`` restart the job, and resume to the same parameters.

Run as a script by torchrun (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --max-restarts=1
--nproc_per_node=2 course/practice/resume.py --dir runs/a``), or from a notebook with :func:`run`. The training
loop saves a full checkpoint
(:mod:`course.practice.checkpoint`) every few steps and at each epoch's end, and resumes from it when it exists.
With ``--crash-at STEP`` rank 1 ends itself with ``os._exit(1)`` at that global step, once (a marker file
remembers): torchrun sees a worker die, stops the others and starts every rank again (``TORCHELASTIC_RESTART_COUNT``
is then 1). Elastic membership (``--nnodes=1:4``) goes further: the job restarts with however many nodes are
left, so the checkpoint must not depend on the world size (this one refuses another world size).

Why ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: a workaround for one torch version (2.13, installed when this was
written), not how torchrun is meant to behave. By default there the restarted ranks meet in the same key-value
store the first attempt used, whose keys still hold the dead ranks' gloo addresses; the new rank 1 connects to
the old rank 0's port and fails with "Gloo connectFullMesh failed ... Connection refused" (measured here). With the
variable set, every attempt gets a fresh store. Taught in
``notebooks/09_real_gpu_practice.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import data, world
from course.ddp.scripts import torchrun_command, torchrun_environment
from course.practice import checkpoint
from course.runtime import paths, process

CRASH_RANK = 1
#: Without it a restarted gloo job reads the dead attempt's addresses (see the module docstring).
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@dataclass(frozen=True)
class Config:
    """The tiny job: small enough that two torchrun runs fit in a test."""

    epochs: int = 3
    batch_size: int = 16  # per rank
    num_samples: int = 256  # the first samples of the digits training set: 8 steps per epoch on 2 ranks
    checkpoint_every: int = 3  # steps
    lr: float = 0.1
    seed: int = 0


def tiny_model() -> nn.Module:
    """An MLP with dropout, so that resuming also needs the RNG states."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


def _maybe_crash(rank: int, global_step: int, crash_at: int | None, marker: Path) -> None:
    if rank == CRASH_RANK and global_step == crash_at and not marker.exists():
        marker.write_text(f"rank {rank} killed itself at step {global_step}\n")
        print(f"[rank {rank}] os._exit(1) at global step {global_step}", flush=True)
        os._exit(1)  # no cleanup, no exception: what a segfault or an OOM kill looks like to torchrun


def train(directory: Path, config: Config, crash_at: int | None = None, reference: Path | None = None) -> None:
    """What every rank runs: join the group, train in ``directory``, leave; rank 0 writes ``final.pt`` there.

    ``reference``: first train an uninterrupted run there (no crash), in the same processes, unless a previous
    attempt already finished it. One torchrun job then gives both runs, so a notebook pays for one start.
    """
    rank = world.init_from_env(timeout_s=60)
    if reference is not None and not (reference / "final.pt").exists():
        _train_once(reference, config, None, rank, announce=False)
    _train_once(directory, config, crash_at, rank, announce=True)
    world.shutdown()


def _train_once(directory: Path, config: Config, crash_at: int | None, rank: world.Rank, announce: bool) -> None:
    """One training run from ``directory``'s checkpoint (or from scratch); rank 0 saves ``final.pt``."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    model = tiny_model().to(rank.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
    torch.manual_seed(config.seed + 1 + rank.rank)  # each rank its own dropout masks
    path = directory / "checkpoint.pt"
    first_epoch, start_step = checkpoint.load(path, model, optimizer, scheduler) if path.exists() else (0, 0)
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if announce:
        world.print0(f"restart {restarts}: starting at epoch {first_epoch}, step {start_step}", flush=True)
    model = DDP(model)
    inputs, targets = data.load("digits").train.tensors
    steps_per_epoch = config.num_samples // (config.batch_size * rank.world_size)
    for epoch in range(first_epoch, config.epochs):
        begin = start_step if epoch == first_epoch else 0
        for step, batch in enumerate(checkpoint.epoch_batches(config.num_samples, config.batch_size, epoch, begin,
                                                              config.seed), start=begin):
            _maybe_crash(rank.rank, epoch * steps_per_epoch + step, crash_at, directory / "crashed.marker")
            optimizer.zero_grad()
            F.cross_entropy(model(inputs[batch].to(rank.device)), targets[batch].to(rank.device)).backward()
            optimizer.step()
            scheduler.step()
            if (step + 1) % config.checkpoint_every == 0 and step + 1 < steps_per_epoch:
                checkpoint.save(path, model, optimizer, scheduler, epoch, step + 1)
        checkpoint.save(path, model, optimizer, scheduler, epoch + 1, 0)
    if rank.is_main:
        torch.save([p.detach().cpu() for p in model.module.parameters()], directory / "final.pt")
    world.settle()


def resume_point(config: Config, crash_at: int, world_size: int = 2) -> tuple[int, int]:
    """``(epoch, step)`` where the restarted job starts when a rank dies before global step ``crash_at``.

    Steps count from 0, in the epoch and globally. A checkpoint after step ``s`` (0-based) records ``s + 1``, the
    next step to run; one is saved every ``checkpoint_every`` steps and at each epoch's end.
    """
    steps_per_epoch = config.num_samples // (config.batch_size * world_size)
    epoch, step = divmod(crash_at, steps_per_epoch)
    return epoch, step - step % config.checkpoint_every


@dataclass(frozen=True)
class ResumedRun:
    """A finished :func:`run`: the final parameters and what torchrun and the ranks printed."""

    parameters: list[torch.Tensor]
    output: str
    crashed: bool  # the marker file exists: rank 1 was killed and the job restarted
    reference: list[torch.Tensor] | None = None  # the uninterrupted run's final parameters, when asked for


def run(directory: str | Path, crash_at: int | None = None, nproc_per_node: int = 2,
        timeout_s: float = 180.0, reference: str | Path | None = None) -> ResumedRun:
    """Run this script under ``torchrun --max-restarts=1`` in ``directory`` (must be new or empty).

    ``reference``: a second new folder; the same job first trains an uninterrupted run there (see :func:`train`),
    returned as ``Outcome.reference``.

    Raises:
        ValueError: ``directory`` already holds a checkpoint (the run would resume, not start).
        RuntimeError: torchrun failed or timed out; the message shows its output.
    """
    directory = Path(directory)
    if (directory / "checkpoint.pt").exists():
        raise ValueError(f"{directory} already holds a checkpoint; pass a new directory to start from scratch")
    directory.mkdir(parents=True, exist_ok=True)
    args = ["--dir", str(directory)] + ([] if crash_at is None else ["--crash-at", str(crash_at)])
    if reference is not None:
        reference = Path(reference)
        if (reference / "final.pt").exists():
            raise ValueError(f"{reference} already holds a finished run; pass a new folder for the reference")
        args += ["--reference", str(reference)]
    command = torchrun_command(Path(__file__), nproc_per_node, tuple(args))
    command.insert(command.index("--standalone") + 1, "--max-restarts=1")
    env = torchrun_environment(nproc_per_node) | {FRESH_STORE_ENV: "1"}
    outcome = process.run(command, timeout_s, env=env)
    output = paths.shorten(outcome.stdout + outcome.stderr)  # no machine's paths in what a notebook prints
    if outcome.status == "timeout" or outcome.returncode != 0:
        raise RuntimeError(f"torchrun resume.py {'timed out' if outcome.status == 'timeout' else 'failed'}; "
                           f"its output:\n{output[-3000:]}")
    return ResumedRun(torch.load(directory / "final.pt"), output, (directory / "crashed.marker").exists(),
                      None if reference is None else torch.load(reference / "final.pt"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True, type=Path, help="where the checkpoint and final.pt go")
    parser.add_argument("--crash-at", type=int, default=None, help="global step at which rank 1 dies, once")
    parser.add_argument("--reference", type=Path, default=None, help="first train an uninterrupted run here")
    args = parser.parse_args(argv)
    train(args.dir, Config(), args.crash_at, args.reference)


if __name__ == "__main__":
    main()
