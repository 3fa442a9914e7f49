"""Notebook 04b's questions: how many buckets DigitsCNN's gradients fill, and float16's rounding error."""

from __future__ import annotations

from typing import Any

import torch

from course import models
from course.ddp import buckets


def bucket_count(bucket_bytes: int = 16 * 1024) -> dict[str, Any]:
    """Allreduces per step for DigitsCNN's gradients packed into buckets of ``bucket_bytes``."""
    sizes = [p.numel() * p.element_size() for p in models.DigitsCNN().parameters()][::-1]  # backward order
    plan = buckets.assign_buckets(sizes, bucket_bytes)
    cap = f"{bucket_bytes / 1024:g} KiB"
    return dict(
        prompt=("DigitsCNN's gradients, in reverse order of model.parameters(), are "
                + ", ".join(f"{size / 1024:.3g}" for size in sizes) + f" KiB. Packed in that order into buckets of "
                f"at most {cap} (a tensor bigger than a bucket gets one of its own), how many allreduces does one "
                "step make?"),
        answer=len(plan), rel_tol=0.0, unit="allreduces",
        explanation=(f"{len(plan)}: the buckets hold tensors " + " | ".join(",".join(str(i) for i in b) for b in plan)
                     + f" (indices in that order). Every tensor over {cap} gets a bucket of its own, and the small "
                     "tensors between two big ones share one."))


def fp16_error() -> dict[str, Any]:
    """The largest relative error of rounding a float32 to float16 (normal numbers)."""
    half = torch.finfo(torch.float16)
    unit_roundoff = half.eps / 2
    return dict(
        prompt=("float16 keeps 10 bits of mantissa (11 with the implicit leading one). A float32 gradient rounded to "
                "float16 and back: at most what relative error (type a number such as 1e-3)?"),
        answer=unit_roundoff, rel_tol=0.1,
        explanation=(f"2^-11 = {unit_roundoff:.2e}: rounding to nearest is off by at most half of the last place, "
                     "and the last place is 2^-10 of the leading bit. That holds for normal numbers: below "
                     f"{half.tiny:.1e} precision drops, and above {half.max:g} a value overflows to inf. Dividing by "
                     "the world size before the cast keeps the ranks' sum in range when each rank's gradient is, but "
                     "makes small values smaller still: loss scaling is the fix for those."))
