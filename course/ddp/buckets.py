"""Gradient bucketing (fusion): many small gradients travel in a few big allreduces.

Each allreduce pays a fixed latency alpha (the alpha-beta model of ``course.collectives.cost_model``) however small
the message.
So gradients are packed, in the order backward produces them, into buckets of at most ``bucket_bytes``
(:func:`assign_buckets`); each bucket is copied into one contiguous buffer (:func:`flatten`), reduced by one call,
and copied back (:func:`unflatten`). :class:`course.ddp.distributed_optimizer.DistributedOptimizer` composes them.
Taught in ``notebooks/04b_distributed_optimizer.ipynb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from course import exercise
from course.arguments import check_count

#: PyTorch DDP's default bucket_cap_mb is 25 MB; the same default here makes the two comparable.
DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one allreduce.

    Attributes:
        index: position in the fixed order every rank allreduces buckets in.
        names, params: the parameters, in the order their gradients are expected.
    """

    index: int
    names: list[str]
    params: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def assign_buckets(grad_bytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensors, in the given order, into consecutive buckets of at most ``bucket_bytes`` each.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own. Taught (as an exercise) in notebook 04b.

    Args:
        grad_bytes: size in bytes of each gradient, in the order backward produces them.
        bucket_bytes: capacity of one bucket, > 0.

    Returns:
        Lists of indices into ``grad_bytes``; concatenated they are ``0, 1, ..., len(grad_bytes) - 1``.
    """
    bucket_bytes = check_count("bucket_bytes", bucket_bytes, unit="number of bytes")
    buckets: list[list[int]] = []
    filled = 0
    for index, size in enumerate(grad_bytes):
        if not buckets or filled + size > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += size
    return buckets


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Copy ``tensors`` (same dtype and device) into one new 1-D buffer, so one allreduce moves them all."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``flat`` back into ``tensors``, in place (inverse of :func:`flatten`)."""
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


# -- for notebook 04b -------------------------------------------------------------------------------------------
@exercise.checker
def check_assign_buckets(candidate: Callable[[list[int], int], list[list[int]]]) -> None:
    """Exercise checker: does ``candidate(grad_bytes, bucket_bytes)`` bucket like :func:`assign_buckets`?

    Prints ``correct`` or raises ``AssertionError`` naming the first case that differs.
    """
    cases = [([4, 4, 4], 8), ([10, 1, 1], 4), ([1, 2, 3, 4, 5], 6), ([7], 1), ([0, 0, 3], 3), ([], 5)]
    for sizes, cap in cases:
        expected, got = assign_buckets(sizes, cap), candidate(list(sizes), cap)
        if got != expected:
            raise AssertionError(f"for grad_bytes={sizes}, bucket_bytes={cap}: expected {expected}, got {got}.")
    print(f"correct: all {len(cases)} cases bucket like course.ddp.buckets.assign_buckets")
