"""Notebook 01's questions: how many updates an epoch makes at a given batch size."""

from __future__ import annotations

import math
from typing import Any

from course import data


def neuron_updates(samples: int, epochs: int = 30, batch_size: int = 16) -> dict[str, Any]:
    """Updates SGD makes on the linear neuron's ``samples`` points in ``epochs`` epochs."""
    per_epoch = math.ceil(samples / batch_size)
    return dict(
        prompt=(f"The next cell runs SGD for {epochs} epochs on these {samples} points. With batch_size "
                f"{batch_size}, how many updates (optimizer steps) does it take?"),
        answer=epochs * per_epoch, rel_tol=0.0, unit="updates",
        explanation=(f"One update per batch: {samples} / {batch_size} = {per_epoch} batches per epoch, times "
                     f"{epochs} epochs. Full batch takes {epochs} (one per epoch), batch 1 takes "
                     f"{epochs * samples}: the same gradients computed, very different numbers of steps."))


def cnn_updates(epochs: int = 5, batch_size: int = 64) -> dict[str, Any]:
    """Updates the CNN makes on the training digits."""
    digits = len(data.load().train)
    return dict(
        prompt=(f"Next: the CNN on the {digits} training digits for {epochs} epochs. At batch {batch_size} (the "
                "last batch of an epoch may be smaller), how many updates does it make?"),
        answer=epochs * math.ceil(digits / batch_size), rel_tol=0.0, unit="updates",
        explanation=(f"ceil({digits} / {batch_size}) = {math.ceil(digits / batch_size)} updates per epoch, times "
                     f"{epochs}. Full batch makes only {epochs} in the same epochs, batch 16 makes "
                     f"{epochs * math.ceil(digits / 16)}: compare their curves against epochs and against updates."))
