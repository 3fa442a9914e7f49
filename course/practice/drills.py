"""Debugging drills: training steps with a planted bug each, run on 2 ranks, and what the tools say about them.

* :func:`skipped_collective`: rank 1 skips the loss all-reduce everyone else does (an ``if`` that should not be
  there) and goes on to load its next batch. Rank 0 waits in ``all_reduce`` for ever; the course's hang report
  (:class:`course.runtime.launch.RankTimeout`) names rank 1 and says rank 0 waited for it there.
* :func:`mismatched_shapes`: each rank all-reduces a tensor of another length (a last batch of another size).
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks every collective's fingerprint (operation, shapes, dtypes) across the
  ranks before running it and names both sides; without it, the backend says what it can.
* :func:`stuck_loading`: rank 1's DataLoader sleeps fetching one sample (a slow disk, a dead network mount); rank
  0 waits in the gradient all-reduce. The hang report names rank 1; each rank's own ``faulthandler`` dump (no
  py-spy needed) shows rank 1 inside ``__getitem__`` and rank 0 inside ``all_reduce``; torch's flight recorder
  shows rank 0 one collective ahead of rank 1.
* :func:`unused_branch`: a model whose second branch only runs on even steps, under DDP with
  ``find_unused_parameters=False``: the next step raises DDP's "Expected to have finished reduction" error; with
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` it names the parameters that got no gradient.

:func:`run_drill` runs one and returns what the tools printed, so a notebook can show it; :func:`hang_report`
runs a hang drill with a short limit, and once more with a longer one if the load kept a rank from its wait.
Run one from a terminal too:
``TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node=2 course/practice/drills.py shapes``.
Taught in ``notebooks/09_real_gpu_practice.ipynb`` (skip, shapes) and ``09b_profiling_and_pitfalls.ipynb``
(loading, with the flight recorder, and unused).
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import world
from course.runtime import environment

DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"
DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")
#: The rank that skips the collective in :func:`skipped_collective`.
SKIPPING_RANK = 1


def skipped_collective(load_s: float = 60.0, record_dir: str | None = None) -> float:
    """Rank 1 skips the all-reduce of the loss and moves on to load its next batch (``load_s`` seconds).

    ``record_dir``: each rank dumps torch's flight record to ``<record_dir>/rank<r>.json`` 1 s in (run the drill
    inside :func:`course.practice.flight_recorder.recording`).
    """
    rank = world.current()
    if record_dir is not None:
        from course.practice import flight_recorder

        flight_recorder.dump_after(1.0, Path(record_dir) / f"rank{rank.rank}.json")
    loss = torch.tensor([float(rank.rank + 1)], device=rank.device)
    if rank.rank != SKIPPING_RANK:  # the planted bug: a condition meant for logging guards a collective
        dist.all_reduce(loss)
    time.sleep(load_s)  # the next batch's data loading
    return loss.item()


def mismatched_shapes() -> float:
    """Rank 0 all-reduces 4 numbers, rank 1 all-reduces 5 (say, an uneven last batch's per-sample losses)."""
    rank = world.current()
    losses = torch.ones(4 + rank.rank, device=rank.device)
    dist.all_reduce(losses)
    return losses.sum().item()


class SlowSamples(torch.utils.data.Dataset):
    """16 random samples; fetching sample ``slow_index`` sleeps ``sleep_s`` (a stuck read) on ``slow_rank``."""

    def __init__(self, rank: int, slow_rank: int, slow_index: int = 8, sleep_s: float = 60.0) -> None:
        self.rank, self.slow_rank, self.slow_index, self.sleep_s = rank, slow_rank, slow_index, sleep_s
        self.samples = torch.randn(16, 4, generator=torch.Generator().manual_seed(rank))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == self.slow_rank and index == self.slow_index:
            time.sleep(self.sleep_s)  # the planted bug: a read that never comes back
        return self.samples[index]


def stuck_loading(stacks_after_s: float = 3.0, record_dir: str | None = None) -> float:
    """Train a linear model, all-reducing gradients each step; rank 1's loader gets stuck on its third batch.

    Each rank also arms ``faulthandler.dump_traceback_later``: after ``stacks_after_s`` it prints every thread's
    Python stack to stderr (the launcher relays it, prefixed ``[rank r]``), showing where each one is. With
    ``record_dir``, each rank first dumps torch's flight record to ``<record_dir>/rank<r>.json``, at half that time
    (run it inside :func:`course.practice.flight_recorder.recording`): the dumping thread is gone before
    faulthandler walks the threads, which crashed a rank (SIGSEGV) when the two ran at the same moment.
    """
    rank = world.current()
    faulthandler.dump_traceback_later(stacks_after_s, exit=False)
    if record_dir is not None:
        from course.practice import flight_recorder

        flight_recorder.dump_after(stacks_after_s / 2, Path(record_dir) / f"rank{rank.rank}.json")
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(rank.device)
    loader = torch.utils.data.DataLoader(SlowSamples(rank.rank, SKIPPING_RANK), batch_size=4)
    for batch in loader:
        model(batch.to(rank.device)).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
    faulthandler.cancel_dump_traceback_later()
    return model.weight.grad.sum().item()


class TwoBranches(nn.Module):
    """``trunk`` always; ``branch`` only when ``use_branch`` (say, an auxiliary loss on some steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.branch = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_branch: bool) -> torch.Tensor:
        x = self.trunk(x)
        return x + self.branch(x) if use_branch else x


def unused_branch(steps: int = 3, find_unused_parameters: bool = False) -> float:
    """DDP over :class:`TwoBranches`, the branch used on even steps only; returns the last loss."""
    rank = world.current()
    torch.manual_seed(0)
    model = DDP(TwoBranches().to(rank.device), find_unused_parameters=find_unused_parameters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.ones(2, 4, device=rank.device), use_branch=step % 2 == 0).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss.item()


DRILLS: dict[str, Callable[..., float]] = {"skip": skipped_collective, "shapes": mismatched_shapes,
                                           "loading": stuck_loading, "unused": unused_branch}


@contextlib.contextmanager
def debug_level(level: str | None) -> Iterator[None]:
    """Set ``TORCH_DISTRIBUTED_DEBUG`` for ranks started inside the block (``None``: leave it unset)."""
    if level is not None and level not in DEBUG_LEVELS:
        raise ValueError(f"TORCH_DISTRIBUTED_DEBUG should be one of {DEBUG_LEVELS}, got {level!r}")
    with environment.variables({DEBUG_ENV: level}):
        yield


def run_drill(name: str, debug: str | None = None, world_size: int = 2, timeout_s: float = 15.0,
              **kwargs: object) -> str:
    """Run drill ``name`` (a key of :data:`DRILLS`) on ``world_size`` ranks; return what the launcher reported.

    ``kwargs`` go to the drill's function (e.g. ``record_dir`` for "skip", ``find_unused_parameters`` for
    "unused").

    Returns:
        The error message the launch ended with (a hang report or a rank's traceback), or a sentence saying it
        finished, with the ranks' results.

    Raises:
        ValueError: an unknown drill or debug level.
    """
    from course.runtime.launch import launch

    if name not in DRILLS:
        raise ValueError(f"drill should be one of {list(DRILLS)}, got {name!r}")
    with debug_level(debug):
        try:
            results = launch(DRILLS[name], world_size, timeout_s=timeout_s, **kwargs)
        except (TimeoutError, RuntimeError) as error:
            return f"{type(error).__name__}: {error}"
    return f"finished without an error: results {results}"


#: What a hang report says when the healthy rank had reached its wait (see :func:`hang_report`).
WAITING_MARK = "was waiting for it"


def hang_report(name: str, first_limit_s: float = 8.0, world_size: int = 2, **kwargs: object) -> str:
    """Run hang drill ``name`` ("skip" or "loading") with a short time limit; return the hang report.

    A hang costs its whole time limit, so the first try is short. Under heavy load the ranks may start so late
    that the limit ends before the drill has shown what it teaches: the healthy rank has not reached its
    collective (the report cannot say who it waited for), or, with ``record_dir``, a rank has not dumped its
    flight record yet. Then the drill runs once more with four times the limit (the pattern of the course's own
    hang tests). ``kwargs`` go to :func:`run_drill` (``record_dir``, ``debug``).

    Raises:
        ValueError: ``name`` is not a hang drill.
    """
    if name not in ("skip", "loading"):
        raise ValueError(f"hang_report runs the hang drills 'skip' and 'loading', got {name!r}")
    record_dir = kwargs.get("record_dir")
    report = ""
    for limit_s in (first_limit_s, 4 * first_limit_s):
        if record_dir is not None:
            for old in Path(str(record_dir)).glob("rank*.json"):
                old.unlink()
        report = run_drill(name, world_size=world_size, timeout_s=limit_s, **kwargs)
        recorded = record_dir is None or all((Path(str(record_dir)) / f"rank{rank}.json").exists()
                                             for rank in range(world_size))
        if WAITING_MARK in report and recorded:
            break
    return report


def main() -> None:
    """``torchrun ... drills.py skip|shapes``: run one drill as a script."""
    if len(sys.argv) != 2 or sys.argv[1] not in DRILLS:
        sys.exit(f"usage: torchrun --standalone --nproc_per_node=2 drills.py {{{'|'.join(DRILLS)}}}")
    world.init_from_env(timeout_s=20)
    try:
        print(f"[rank {world.current().rank}] result {DRILLS[sys.argv[1]]()}")
    finally:
        world.shutdown(barrier=False)


if __name__ == "__main__":
    main()
