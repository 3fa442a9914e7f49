"""Rank functions for tests/runtime/test_observed.py and test_nccl_rules.py: each makes one call by one route and
returns the records the observation layer noted (as tuples: what every route must agree on)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import irecv, isend  # imported by name before anything could wrap them

from course.runtime import observed


def _noted(call, group=None) -> list[tuple]:
    records = []
    with observed.listening(records.append):
        call()
    return [(r.op, r.kind, r.api, r.nbytes, r.peer) for r in records]


def _ring_peers() -> tuple[int, int]:
    rank, size = dist.get_rank(), dist.get_world_size()
    return (rank + 1) % size, (rank - 1) % size


def routes() -> dict[str, object]:
    """Each route's records on this rank, plus whether the world is observed and what backend it reports."""
    size = dist.get_world_size()
    right, left = _ring_peers()
    out = torch.empty(4 * size)
    found = {"observed": observed.is_observed(), "backend": str(dist.get_backend())}

    def messages_by_name():
        sent, received = isend(torch.ones(4), right), irecv(torch.empty(4), left)
        sent.wait(), received.wait()

    def batch():
        ops = [dist.P2POp(dist.isend, torch.ones(4), right), dist.P2POp(dist.irecv, torch.empty(4), left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    def protocol():
        from course.collectives.protocol import Comm
        comm = Comm(dist.get_rank(), size, dist.group.WORLD)
        sending, receiving = comm.isend(torch.ones(4), right), comm.irecv(torch.empty(4), left)
        sending.wait(), receiving.wait()

    def functional():
        import torch.distributed._functional_collectives as fc
        fc.all_gather_tensor(torch.ones(4), 0, dist.group.WORLD).wait()

    def mesh():
        from torch.distributed.device_mesh import init_device_mesh
        dist.all_gather_single(out, torch.ones(4), group=init_device_mesh("cpu", (size,)).get_group())

    found.update(
        all_gather_single=_noted(lambda: dist.all_gather_single(out, torch.ones(4))),
        all_gather_into_tensor=_noted(lambda: dist.all_gather_into_tensor(out, torch.ones(4))),
        reduce_scatter_single=_noted(lambda: dist.reduce_scatter_single(torch.empty(1), torch.ones(size))),
        reduce_scatter_tensor=_noted(lambda: dist.reduce_scatter_tensor(torch.empty(1), torch.ones(size))),
        functional=_noted(functional), mesh=_noted(mesh),
        by_name=_noted(messages_by_name), batch=_noted(batch), protocol=_noted(protocol),
        new_group=_noted(lambda: dist.all_reduce(torch.ones(4), group=dist.new_group(list(range(size))))),
        all_reduce=_noted(lambda: dist.all_reduce(torch.ones(4))),
    )
    return found
