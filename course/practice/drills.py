"""Debugging drills: training steps with a planted bug each, run on 2 ranks, and what the tools say about them.

* :func:`skipped_collective`: rank 1 skips the loss all-reduce everyone else does (an ``if`` that should not be
  there) and goes on to load its next batch. Rank 0 waits in ``all_reduce`` for ever; the course's hang report
  (:class:`course.runtime.launch.RankTimeout`) names rank 1 and says rank 0 waited for it there.
* :func:`mismatched_shapes`: each rank all-reduces a tensor of another length (a last batch of another size).
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks every collective's fingerprint (operation, shapes, dtypes) across the
  ranks before running it and names both sides; without it, the backend says what it can.

:func:`run_drill` runs one and returns what the tools printed, so a notebook can show it. Run one from a terminal
too: ``TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node=2 course/practice/drills.py shapes``.
Taught in ``notebooks/09_real_gpu_practice.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script by torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist

from course import world

DEBUG_ENV = "TORCH_DISTRIBUTED_DEBUG"
DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")
#: The rank that skips the collective in :func:`skipped_collective`.
SKIPPING_RANK = 1


def skipped_collective(load_s: float = 60.0) -> float:
    """Rank 1 skips the all-reduce of the loss and moves on to load its next batch (``load_s`` seconds)."""
    rank = world.current()
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


DRILLS: dict[str, Callable[[], float]] = {"skip": skipped_collective, "shapes": mismatched_shapes}


@contextlib.contextmanager
def debug_level(level: str | None) -> Iterator[None]:
    """Set ``TORCH_DISTRIBUTED_DEBUG`` for ranks started inside the block (``None``: leave it unset)."""
    if level is not None and level not in DEBUG_LEVELS:
        raise ValueError(f"TORCH_DISTRIBUTED_DEBUG should be one of {DEBUG_LEVELS}, got {level!r}")
    saved = os.environ.pop(DEBUG_ENV, None)
    if level is not None:
        os.environ[DEBUG_ENV] = level
    try:
        yield
    finally:
        os.environ.pop(DEBUG_ENV, None)
        if saved is not None:
            os.environ[DEBUG_ENV] = saved


def run_drill(name: str, debug: str | None = None, world_size: int = 2, timeout_s: float = 15.0) -> str:
    """Run drill ``name`` ("skip" or "shapes") on ``world_size`` ranks; return what the launcher reported.

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
            results = launch(DRILLS[name], world_size, timeout_s=timeout_s)
        except (TimeoutError, RuntimeError) as error:
            return f"{type(error).__name__}: {error}"
    return f"finished without an error: results {results}"


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
