"""The assignment's fixed facts: what the starter script does and what the grader expects of the 4-GPU one.

``notebooks/assignment/train_1gpu.py`` defines the same values (a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assignment:
    """What the grader expects."""

    world_size: int = 4  # ranks the grader starts, as torchrun --nproc_per_node=4
    base_lr: float = 2e-3  # the starter's learning rate ...
    base_batch_size: int = 32  # ... for this many samples per step
    epochs: int = 6  # the epoch budget
    target_accuracy: float = 0.92  # on the test split, which the student's script never receives
    checkpoint: str = "checkpoint.pt"  # the model's state_dict, saved by rank 0
    script_name: str = "train_4gpu.py"  # what the submission is called in the grader's run directory
    lr_tolerance: float = 0.1  # relative: the peak learning rate may be this far from linear scaling
    gradient_tolerance: float = 1e-3  # relative error allowed against the single-process gradient (float32)
    # ... when the step's forwards ran in bfloat16 / float16 (autocast): the replay recomputes in float32, so
    # rounding alone moves the gradient by about this much (bfloat16 keeps 8 significant bits, float16 11)
    low_precision_tolerance: tuple[tuple[str, float], ...] = (("bfloat16", 0.1), ("float16", 0.02))
    metric_tolerance: float = 1e-3  # reported vs true validation accuracy (one sample is 1/300)


ASSIGNMENT = Assignment()
