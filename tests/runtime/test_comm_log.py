"""course.runtime.comm_log records every torch.distributed call with the bytes sent, and puts torch back after."""

import pytest
import torch
import torch.distributed as dist

from course.runtime.comm_log import CommLog, bytes_sent, collectives, sends
from course.runtime.launch import launch

pytestmark = pytest.mark.timeout(300)


def record_on_rank() -> dict:
    """Messages (isend/recv, a batch of isend/irecv) and an all_reduce under a CommLog; what it saw."""
    from torch.distributed import all_reduce as imported_before  # bound before the log opened: recorded too

    rank, world_size = dist.get_rank(), dist.get_world_size()
    with CommLog() as log:
        from torch.distributed import isend  # bound inside: recorded

        request = isend(torch.ones(10), (rank + 1) % world_size)
        dist.recv(torch.empty(10), (rank - 1) % world_size)  # torch's recv calls irecv: recorded once
        request.wait()
        ops = [dist.P2POp(dist.isend, torch.ones(2, dtype=torch.float64), (rank + 1) % world_size),
               dist.P2POp(dist.irecv, torch.empty(2, dtype=torch.float64), (rank - 1) % world_size)]
        for request in dist.batch_isend_irecv(ops):  # recorded as its two messages
            request.wait()
        dist.all_reduce(torch.ones(3))
        log.original("all_reduce")(torch.ones(3))  # the checker's reference: not recorded
        imported_before(torch.ones(3))
        calls = list(log.calls)
    restored = dist.all_reduce is imported_before and dist.isend is torch.distributed.distributed_c10d.isend
    return {"names": [c.name for c in calls], "bytes": bytes_sent(calls), "sends": sends(calls),
            "collectives": collectives(calls), "peers": [c.peer for c in calls], "restored": restored}


def test_calls_bytes_and_peers_are_recorded_and_torch_restored():
    for rank, seen in enumerate(launch(record_on_rank, 2, timeout_s=120)):
        assert seen["names"] == ["isend", "recv", "isend", "irecv", "all_reduce", "all_reduce"]
        assert seen["bytes"] == 40 + 16 and seen["sends"] == 2 and seen["collectives"] == ["all_reduce"]
        assert seen["peers"][:2] == [(rank + 1) % 2, (rank - 1) % 2]
        assert seen["restored"]
