"""The course-provided progress report of the final assignment. Do not change it.

The single-device starter and your 4-GPU script both call :func:`report` once per epoch. The grader watches
these calls (it never believes printed numbers) and checks that the validation accuracy you report is the
accuracy of the whole validation set, averaged across ranks, and that only rank 0 reports. Taught in
``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

import math


def report(epoch: int, train_loss: float, val_accuracy: float) -> None:
    """Print one line of training progress in the course's format.

    Args:
        epoch: epoch number, counting from 0.
        train_loss: mean training loss per sample over the epoch (all ranks' samples, in a 4-GPU script).
        val_accuracy: fraction in [0, 1] of the whole validation set classified correctly.

    Raises:
        ValueError: a value is not a number, or the accuracy is outside [0, 1].
    """
    for name, value in (("epoch", epoch), ("train_loss", train_loss), ("val_accuracy", val_accuracy)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"report(): {name} must be a number (use tensor.item()), got {type(value).__name__}.")
    if not 0.0 <= val_accuracy <= 1.0 or math.isnan(val_accuracy):
        raise ValueError(f"report(): val_accuracy is a fraction in [0, 1], got {val_accuracy!r}.")
    print(f"epoch {epoch:3d}  train_loss {train_loss:.4f}  val_accuracy {val_accuracy:.4f}", flush=True)
