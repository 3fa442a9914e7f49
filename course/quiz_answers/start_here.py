"""Notebook 00's questions: which model scales best, and what an all-reduce leaves on every rank."""

from __future__ import annotations

from typing import Any

from course import data, models


def flops_per_byte() -> dict[str, Any]:
    """Which of the three models computes the most forward FLOPs per byte of gradient."""
    splits = data.load()
    built = {name: models.build(name, splits.input_shape, splits.num_classes) for name in ("linear", "mlp", "cnn")}
    ratios = {name: models.flops_per_sample(net, splits.input_shape) / models.gradient_bytes(net)
              for name, net in built.items()}
    best = max(ratios, key=ratios.get)
    return dict(
        prompt=("Of the three models (linear, mlp, cnn), which computes the most forward FLOPs per byte of gradient "
                "it must all-reduce each step, i.e. which should scale best across GPUs?"),
        answer=best, choices=tuple(ratios),
        explanation=(f"{best}: " + ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())
                     + " FLOPs per gradient byte. A convolution reuses each weight at every position of the image, "
                     "so it computes a lot per parameter; a dense layer uses each weight once per sample. The next "
                     "cell prints both numbers."))


def hello_sum(ranks: int = 4) -> dict[str, Any]:
    """What rank 0 holds after every rank all-reduces rank + 1."""
    total = sum(rank + 1 for rank in range(ranks))
    return dict(
        prompt=(f"Each of the {ranks} ranks puts rank + 1 into a tensor and calls all_reduce (a sum). What does "
                "rank 0's tensor hold afterwards?"),
        answer=total, rel_tol=0.0,
        explanation=(f"1 + 2 + ... + {ranks} = {total}, and on every rank, not only rank 0: an all-reduce leaves "
                     "the same sum everywhere. That is what keeps data-parallel replicas identical."))
