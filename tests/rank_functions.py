"""Functions the launcher tests run on several ranks (importable, as launch() requires)."""

from __future__ import annotations

import os
import sys
import time

import psutil
import torch
import torch.distributed as dist

from course import world


def identity(value: object) -> tuple[int, object]:
    return world.current().rank, value


def rendezvous_listener() -> list[int | None]:
    """The pids listening on this rank's MASTER_PORT."""
    port = int(os.environ["MASTER_PORT"])
    return [c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == psutil.CONN_LISTEN]


def crash_on(bad_rank: int) -> int:
    me = world.current()
    if me.rank == bad_rank:
        raise ZeroDivisionError(f"deliberate failure on rank {me.rank}")
    dist.barrier()  # the healthy ranks wait here for the crashed one: the launcher must stop them
    return me.rank


def hang_on(bad_rank: int) -> int:
    me = world.current()
    if me.rank == bad_rank:
        time.sleep(3600)
    return me.rank


def vanish_on(bad_rank: int) -> int:
    me = world.current()
    if me.rank == bad_rank:
        print(f"rank {me.rank} is about to vanish", file=sys.stderr, flush=True)
        os._exit(3)
    dist.barrier()
    return me.rank


def spawn_worker_then_hang(on_rank: int = 0) -> int:
    """On ``on_rank``: start a DataLoader worker process (a grandchild of the launcher), then hang. The other ranks
    return at once, and wait for it."""
    if world.current().rank != on_rank:
        return world.current().rank
    loader = torch.utils.data.DataLoader(range(1000), batch_size=1, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    # with each worker's start time: a pid alone may name another process by the time the test looks (pid reuse)
    print(f"worker pids {[(w.pid, psutil.Process(w.pid).create_time()) for w in iterator._workers]}", flush=True)
    time.sleep(3600)
    return 0


def print_lines() -> int:
    print("first line")
    print("second", end="")
    return world.current().rank


def rank_tensor(numel: int) -> torch.Tensor:
    """A tensor result: it must reach the launcher by value even though this rank exits at once."""
    return torch.full((numel,), float(world.current().rank))


def slow_to_leave(marker_dir: str) -> int:
    """Rank 1 takes a while in ``world.shutdown()``; every rank writes a marker once it has left the group."""
    me = world.current()
    leave = world.shutdown

    def slow_shutdown(barrier: bool = True) -> None:
        if me.rank == 1:
            time.sleep(1.0)
        leave(barrier)
        with open(os.path.join(marker_dir, f"left-{me.rank}"), "w") as marker:
            marker.write("clean")

    world.shutdown = slow_shutdown
    return me.rank


def add_rank_in_place(tensor: torch.Tensor) -> float:
    """Adds rank + 1 to the tensor it was given, in place, once every rank has it; returns what it then holds."""
    dist.barrier()
    tensor.add_(world.current().rank + 1)
    dist.barrier()
    return tensor.sum().item()


def sleep_while_peers_all_reduce(bad_rank: int) -> int:
    """Rank ``bad_rank`` sleeps; every other rank waits for it in an all_reduce that cannot complete."""
    me = world.current()
    if me.rank == bad_rank:
        time.sleep(3600)
    dist.all_reduce(torch.ones(1))
    return me.rank


def busy_while_peers_all_reduce(slow_rank: int, cpu_s: float) -> int:
    """Rank ``slow_rank`` computes for ``cpu_s`` seconds of CPU time first; the others wait for it in an all_reduce."""
    me = world.current()
    if me.rank == slow_rank:
        end = time.process_time() + cpu_s
        while time.process_time() < end:
            pass
    dist.all_reduce(torch.ones(1))
    return me.rank


def noisy_when_a_peer_fails(bad_rank: int) -> int:
    """Rank ``bad_rank`` raises; the others write to stderr when their barrier breaks, as gloo does."""
    me = world.current()
    if me.rank == bad_rank:
        raise RuntimeError(f"rank {me.rank} fails on purpose")
    try:
        dist.barrier()
    except RuntimeError:
        os.write(2, b"echo of the failure: Connection reset by peer\n")
        time.sleep(5)
        raise
    return me.rank


def hook_gradients() -> dict[str, object]:
    """Flat DDP gradients after one backward pass on rank-dependent data, without a hook and with each of
    course.ddp.hooks' hooks (course.ddp.hooks is checked against DDP's own averaging)."""
    from torch.nn.parallel import DistributedDataParallel

    from course.ddp import hooks as ddp_hooks
    from course.models import DigitsCNN

    me = world.current()
    counted: list[int] = []
    hooks = {"default": lambda model: None,
             "counting": lambda model: model.register_comm_hook(None, ddp_hooks.counting(counted.append)),
             "summing": lambda model: model.register_comm_hook(None, ddp_hooks.summing),
             "fp16": ddp_hooks.compress_fp16}
    result: dict[str, object] = {}
    for name, register in hooks.items():
        torch.manual_seed(0)
        model = DistributedDataParallel(DigitsCNN(width=4), bucket_cap_mb=0.001)
        register(model)
        torch.manual_seed(1 + me.rank)  # each rank its own batch: averaging matters
        counted.clear()
        model(torch.randn(8, 1, 8, 8)).sum().backward()
        result[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        if name == "counting":
            result["counted"] = len(counted)
        del model
    return result


def environment_variable(name: str) -> str | None:
    return os.environ.get(name)


def parent_pid() -> int:
    """The pid of the process this rank was started by: the fork server's, or the launching process's if spawned."""
    return os.getppid()


def debug_level() -> str:
    """torch.distributed's debug level, which it read from TORCH_DISTRIBUTED_DEBUG when it was imported."""
    return dist.get_debug_level().name


def stay_until(release_file: str, limit_s: float) -> int:
    """Stay up until ``release_file`` exists (the test has seen this rank), at most ``limit_s``; return the rank."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(release_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    return world.current().rank


def receive_from_each_other(how: str) -> int:
    """Each of 2 ranks first receives from the other (``how``: "recv", or "irecv" then wait): nobody ever sends."""
    me, tensor = world.current(), torch.zeros(3)
    peer = 1 - me.rank
    if how == "recv":
        dist.recv(tensor, peer)
    else:
        dist.irecv(tensor, peer).wait()
    dist.send(tensor, peer)
    return me.rank


def send_to_the_wrong_peer() -> int:
    """3 ranks: rank 0 sends to rank 2, which waits for nothing from it; rank 1 waits to receive from rank 0."""
    me, tensor = world.current(), torch.ones(3)
    if me.rank == 0:
        dist.isend(tensor, 2)  # meant for rank 1
        dist.recv(tensor, 1)
    elif me.rank == 1:
        dist.recv(tensor, 0)
    else:
        dist.recv(tensor, 1)
    return me.rank
