"""A process group of one rank inside the test process, for checks that need torch.distributed but no peers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from course import world


@contextlib.contextmanager
def single_rank_group(timeout_s: float = 60.0) -> Iterator[None]:
    """A gloo group with world_size 1 on an in-memory store.

    No TCP port is involved, so nothing another process holds (a port another job took before the store bound
    it) can make it wait, and a collective that did wait would fail after ``timeout_s``.
    """
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        world.settle()  # gloo's threads let go of finished work before the group is joined (course.ddp.hooks)
        dist.destroy_process_group()
