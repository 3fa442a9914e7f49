"""Notebook 05's questions: a rank's shard of the digits, and the optimizer steps of a DDP epoch."""

from __future__ import annotations

import math
from typing import Any

from course import data


def shard_size(ranks: int = 4) -> dict[str, Any]:
    """Samples each rank draws per epoch from DistributedSampler."""
    digits = len(data.load().train)
    per_rank = math.ceil(digits / ranks)
    return dict(
        prompt=(f"DistributedSampler splits the {digits} training digits over {ranks} ranks, padding with repeats "
                "so that every rank gets as many. How many samples does each rank draw per epoch?"),
        answer=per_rank, rel_tol=0.0, unit="samples",
        explanation=(f"ceil({digits} / {ranks}) = {per_rank}, with {per_rank * ranks - digits} sample(s) drawn "
                     "twice to even the shards out. Together the ranks cover every digit at least once per epoch, "
                     f"each doing 1/{ranks} of the work."))


def steps_per_epoch(ranks: int = 4, per_rank_batch: int = 32) -> dict[str, Any]:
    """Optimizer steps of one epoch on each rank, against the single device's."""
    digits = len(data.load().train)
    per_rank = math.ceil(digits / ranks)
    single, ddp = math.ceil(digits / per_rank_batch), math.ceil(per_rank / per_rank_batch)
    return dict(
        prompt=(f"step0 takes batches of {per_rank_batch} from all {digits} digits. Each of {ranks} ranks now takes "
                f"batches of {per_rank_batch} from its own shard. How many optimizer steps does one epoch make?"),
        answer=ddp, rel_tol=0.0, unit="steps",
        explanation=(f"ceil({per_rank} / {per_rank_batch}) = {ddp}, against {single} on one device: every step now "
                     f"averages {ranks} x {per_rank_batch} = {ranks * per_rank_batch} samples, so the same epochs "
                     f"make about {ranks}x fewer, larger steps. Step 4 scales the learning rate for that "
                     "(notebook 02)."))
