"""Notebook 06's questions: the assignment's peak learning rate, and a forgotten ``set_epoch``.

The assignment's settings live with the grader (``grader.assignment.ASSIGNMENT``), which the course does not
import: the notebook passes them in.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DistributedSampler

from course import data
from course.optimization import lr_scaling


def assignment_lr(base_lr: float, base_batch_size: int, world_size: int, lr_tolerance: float) -> dict[str, Any]:
    """The linear rule's peak rate when every rank keeps the starter's batch."""
    global_batch = base_batch_size * world_size
    sqrt = lr_scaling.scaled_lr(base_lr, base_batch_size, global_batch, "sqrt")
    return dict(
        prompt=(f"The starter trains Adam at lr {base_lr:g} on {base_batch_size} samples per step. Your script keeps "
                f"{base_batch_size} samples per step on each of {world_size} ranks. What peak learning rate does the "
                "linear scaling rule give?"),
        answer=lr_scaling.scaled_lr(base_lr, base_batch_size, global_batch, "linear"), rel_tol=0.01,
        explanation=(f"{base_lr:g} x {global_batch} / {base_batch_size}: one step now averages the gradients of "
                     f"{global_batch} samples. For Adam the sqrt rule is accepted too ({sqrt:.3g}); either within "
                     f"{lr_tolerance:.0%}, reached after a warmup."))


def set_epoch(world_size: int = 4) -> dict[str, Any]:
    """What rank 0 draws over the epochs when the loop never calls ``sampler.set_epoch``."""
    sampler = DistributedSampler(data.load().train, num_replicas=world_size, rank=0, shuffle=True, seed=0)
    outcomes = ("every epoch repeats the first epoch's order", "each epoch gets a new order anyway",
                "the ranks' shards start to overlap")
    return dict(
        prompt="Suppose your loop forgets sampler.set_epoch(epoch). What does rank 0 draw over the epochs?",
        answer=outcomes[0] if list(sampler) == list(sampler) else outcomes[1], choices=outcomes,
        explanation=("The sampler shuffles with seed + epoch, and its epoch stays 0 until you set it: the same "
                     "permutation every epoch, on every rank alike (so the shards stay disjoint, but each rank sees "
                     "the same batches in the same order every epoch). set_epoch(epoch) gives each epoch a new "
                     "shuffle that all ranks still agree on."))
