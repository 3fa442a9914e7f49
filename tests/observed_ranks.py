"""Rank functions for tests/runtime/test_observed.py and test_nccl_rules.py: each makes one call by one route and
returns the records the observation layer noted (as tuples: what every route must agree on)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import all_gather_into_tensor, irecv, isend  # imported by name before anything could wrap them

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


# ------------------------------------------------------------------------------ NCCL's rules, each broken once
def off_device() -> None:
    """Every rank declares a GPU-like device and sends a CPU tensor (the forgotten ``.to(rank.device)``)."""
    from course.runtime import nccl_rules
    nccl_rules.declare_device("meta")
    dist.all_reduce(torch.ones(2))


def sends_in_another_order(tags: bool) -> None:
    """Rank 0 sends a 4-vector then a 2-vector (tags 1, 2); rank 1 receives them the other way round. Gloo matches by
    tag, NCCL in order: with ``tags`` gloo would pass, without it gloo fails obscurely."""
    if dist.get_rank() == 0:
        first, second = isend(torch.ones(4), 1, tag=1 if tags else 0), isend(torch.ones(2), 1, tag=2 if tags else 0)
        first.wait(), second.wait()
    else:
        second = irecv(torch.empty(2), 0, tag=2 if tags else 0)
        first = irecv(torch.empty(4), 0, tag=1 if tags else 0)
        second.wait(), first.wait()


def sends_in_the_same_order() -> list[float]:
    """The legal version: the receives in the order of the sends, one a reshaped view (NCCL matches sizes)."""
    if dist.get_rank() == 0:
        for work in (isend(torch.arange(4.0), 1, tag=1), isend(torch.ones(2), 1, tag=2)):
            work.wait()
        return []
    first, second = torch.empty(2, 2), torch.empty(2)
    for work in (irecv(first, 0, tag=1), irecv(second, 0, tag=2)):
        work.wait()
    return first.flatten().tolist() + second.tolist()


def sends_from_another_thread() -> None:
    """The late-send design: a second thread issues the isends while this thread's irecv is in flight."""
    import threading
    import time
    right, left = _ring_peers()
    received = irecv(torch.empty(4), left)
    def late():
        time.sleep(0.05)
        isend(torch.ones(4), right).wait()
    thread = threading.Thread(target=late, name="late-sends")
    thread.start()
    thread.join()
    received.wait()


def collectives_that_differ(at: int) -> None:
    """Collective number ``at`` differs: rank 1 all-reduces 3 numbers where the others all-reduce 4."""
    for _ in range(at - 1):
        dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(3 if dist.get_rank() == 1 else 4))



# ------------------------------------------------------------------ the labs' watchers, by every route (2 ranks)
def _held_routes(out_of: int) -> dict[str, object]:
    """Each route to an asynchronous all-reduce, all-gather or reduce-scatter: ``name -> (output, start)``, a function
    starting the call on a tensor it returns (the student's) and the call's work handle."""
    from torch.distributed import all_reduce  # imported by name before anything could wrap it
    from torch.distributed.device_mesh import init_device_mesh
    size, mine = dist.get_world_size(), torch.full((4,), float(out_of))
    mesh = init_device_mesh("cpu", (size,)).get_group()

    def gathered(call):
        def start():
            out = torch.zeros(4 * size)
            return out, call(out)
        return start

    def listed():
        outs = [torch.zeros(4) for _ in range(size)]
        return outs, dist.all_gather(outs, mine, async_op=True)

    def scattered(name):
        def start():
            out = torch.zeros(4)
            return out, getattr(dist, name)(out, mine.repeat(size), async_op=True)
        return start

    def reduced(call):
        def start():
            t = mine.clone()
            return t, call(t)
        return start

    return {
        "all_reduce by name": reduced(lambda t: all_reduce(t, async_op=True)),
        "all_reduce on a mesh": reduced(lambda t: dist.all_reduce(t, group=mesh, async_op=True)),
        "all_gather_single": gathered(lambda out: dist.all_gather_single(out, mine, async_op=True)),
        "all_gather_into_tensor": gathered(lambda out: dist.all_gather_into_tensor(out, mine, async_op=True)),
        "all_gather_into_tensor by name": gathered(lambda out: all_gather_into_tensor(out, mine, async_op=True)),
        "all_gather on a mesh": gathered(lambda out: dist.all_gather_single(out, mine, group=mesh, async_op=True)),
        "all_gather list": listed,
        "reduce_scatter_single": scattered("reduce_scatter_single"),
        "reduce_scatter_tensor": scattered("reduce_scatter_tensor"),
    }


def _values(output) -> list[float]:
    return torch.cat([t.flatten() for t in output]).tolist() if isinstance(output, list) else output.tolist()


def held_routes() -> dict[str, dict[str, object]]:
    """For each route, under the recorder and ``results_at_wait``: the student's tensor before and after ``wait()``
    and the recorder's record (op, bytes, bytes sent, asynchronous, waited before and after ``wait()``); under the
    FSDP lab's gather watch, the gathers it saw and the values after ``wait()``."""
    from course.runtime import recorder
    from grader.labs.fsdp import gathers
    from grader.labs.late_results import results_at_wait
    found = {}
    for name, start in _held_routes(dist.get_rank() + 1).items():
        with recorder.recording(dist.get_world_size()) as seen, results_at_wait():
            output, work = start()
            before, waited_before = _values(output), seen.calls[-1].waited
            work.wait()
        (record,) = seen.calls
        found[name] = {"before": before, "after": _values(output), "record": (
            record.op, record.nbytes, record.sent_bytes, record.async_op, waited_before, record.waited is not None)}
    for name, start in _held_routes(dist.get_rank() + 1).items():
        if "gather" not in name:
            continue
        with gathers.watching_gathers() as watch:
            output, work = start()
            work.wait()
        found[name]["gathers"] = [(g.async_op, g.waited >= g.launched) for g in watch.gathers]
        found[name]["watched"] = (watch.prefetched, watch.peak, _values(output))
    return found


def shapes_that_differ(at: int, calls: int) -> None:
    """``calls`` all-reduces of 4 numbers; at number ``at`` rank 1's is shaped (2, 2). Gloo sees 4 numbers on every
    rank and lets it pass; NCCL's rule on shapes does not."""
    for number in range(1, calls + 1):
        dist.all_reduce(torch.ones(2, 2) if number == at and dist.get_rank() == 1 else torch.ones(4))


# ------------------------------------------------ collectives that differ after the last check, at a group's end
SCRIPT = '''import torch
import torch.distributed as dist

group = dist.new_group()  # a group of the script's own: its collectives are numbered from 1
for number in range(1, 6):  # the ranks compare at their 1st, 2nd and 4th collective, not at the 5th
    dist.all_reduce(torch.ones(2, 2) if number == {at} and dist.get_rank() == 1 else torch.ones(4), group=group)
{end}
'''
#: name -> (the collective at which rank 1's shape differs, 0 for none; how the script ends), run in this order
SCRIPTS = {"correct": (0, ""), "correct, destroys its group": (0, "dist.destroy_process_group(group)"),
           "returns": (5, ""), "destroys its group": (5, "dist.destroy_process_group(group)"),
           "destroys the world": (5, "dist.destroy_process_group()")}  # the world last: it ends the run's group


def scripts_run_by_the_grader(folder: str) -> dict[str, tuple[int, str, str | None]]:
    """Each of :data:`SCRIPTS`, run as the grader's harness runs a submission: ``name -> (exit_code, how, error)``.
    (Under ``launch`` the world is joined already: the scripts use it and make their own group.)"""
    import os

    from grader.inrank.harness import run_script
    found = {}
    for name, (at, end) in SCRIPTS.items():
        path = os.path.join(folder, f"{name.replace(' ', '_').replace(',', '')}.py")
        if dist.get_rank() == 0:
            with open(path, "w") as script:
                script.write(SCRIPT.format(at=at, end=end))
        dist.barrier()
        found[name] = run_script(path)
    if dist.is_initialized():  # the rank that named the difference raised in the middle of destroying the world
        dist.destroy_process_group()
    return found
