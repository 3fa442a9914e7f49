"""Run a library function on N ranks from a notebook, the way torchrun runs a script.

``launch(fn, world_size=4)`` starts one process per rank, joins them into a process group (gloo on
emulated GPUs, nccl on real ones), calls ``fn`` on every rank and returns the per-rank results in rank
order. Output printed by a rank appears in the notebook prefixed with ``[rank k]``. If any rank raises,
every other rank is stopped and :class:`RankFailed` names the rank and shows its traceback; if ranks do not
finish in time, :class:`RankTimeout` names them. No process is left behind either way. Taught in
``notebooks/00_start_here.ipynb``.

``fn`` must be importable (defined in a module, not in a notebook cell): each rank is a fresh process.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import psutil
import torch.multiprocessing as mp

from course import world


class RankFailed(RuntimeError):
    """A rank raised an exception or died; ``rank`` says which, ``remote_traceback`` says why."""

    def __init__(self, rank: int, remote_traceback: str) -> None:
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(
            f"rank {rank} failed; the other ranks were stopped.\n--- traceback on rank {rank} ---\n"
            f"{remote_traceback.rstrip()}"
        )


class RankTimeout(TimeoutError):
    """Some ranks did not finish within the time limit; ``ranks`` lists them."""

    def __init__(self, ranks: list[int], timeout_s: float) -> None:
        self.ranks = ranks
        names = ", ".join(str(r) for r in ranks)
        super().__init__(
            f"rank(s) {names} did not finish within {timeout_s:g} s and were stopped. A rank that waits "
            "in a collective (all_reduce, barrier, broadcast) that another rank never calls hangs like this."
        )


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _RankOutput(io.TextIOBase):
    """Stands in for a rank's stdout: sends each completed line to the launcher, prefixed by rank."""

    def __init__(self, rank: int, channel: Any) -> None:
        self._prefix = f"[rank {rank}] "
        self._channel = channel
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._channel.put(("out", self._prefix + line + "\n"))
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._channel.put(("out", self._prefix + self._partial + "\n"))
            self._partial = ""


def _run_rank(fn: Callable[..., Any], rank: int, world_size: int, port: int, timeout_s: float,
              arguments: bytes, channel: Any) -> None:
    """Body of one rank's process: join the group, call ``fn``, report the outcome on ``channel``."""
    args, kwargs = pickle.loads(arguments)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
    )
    sys.stdout = _RankOutput(rank, channel)
    try:
        world.init_from_env(timeout_s=timeout_s)
        # Plain pickle copies tensors by value: the queue's own pickler would share their memory, which
        # vanishes when this process exits before the launcher reads it.
        result = pickle.dumps(fn(*args, **kwargs))
        sys.stdout.flush()
        channel.put(("ok", rank, result))
    except BaseException:  # noqa: B036 - the launcher must hear about every way a rank can end
        sys.stdout.flush()
        channel.put(("error", rank, traceback.format_exc()))
        world.shutdown(barrier=False)
    else:
        world.shutdown()
        channel.put(("left", rank))


def kill_tree(process: subprocess.Popen | psutil.Process, own_group: bool = False, wait_s: float = 10.0) -> None:
    """Stop ``process`` and everything it started, wait until they are gone, and reap it.

    The tree is frozen first (SIGSTOP) so that no process can start a new child between the look and the kill.
    With ``own_group`` (it was started with ``start_new_session=True``) every process of its process group is
    killed too, which finds descendants orphaned by a parent that already exited.
    """
    pid = process.pid
    victims = _tree(pid) + (_group(pid) if own_group else [])
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for victim in victims:
            with contextlib.suppress(psutil.Error):
                victim.send_signal(sig)
        if sig == signal.SIGSTOP:  # children born before the freeze
            victims += [c for v in victims for c in _children(v) if c not in victims]
    deadline = time.monotonic() + wait_s
    while (alive := [v for v in victims if _alive(v)]) and time.monotonic() < deadline:
        for victim in alive:  # SIGKILL takes a moment to empty a big process; a zombie counts as gone
            with contextlib.suppress(psutil.Error):
                victim.kill()
        time.sleep(0.02)
    if isinstance(process, subprocess.Popen):
        process.wait()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _group(pgid: int) -> list[psutil.Process]:
    """Every process of process group ``pgid`` (never this process's own group)."""
    if pgid == os.getpgrp():
        return []
    members = []
    for candidate in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            if os.getpgid(candidate.pid) == pgid:
                members.append(candidate)
    return members


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def _stop(processes: list[Any]) -> None:
    """Kill every rank and everything it started (DataLoader workers included), then reap them."""
    for process in processes:
        if process.pid is None:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            kill_tree(psutil.Process(process.pid))
        process.join(timeout=10)


def launch(fn: Callable[..., Any], world_size: int = 4, *args: Any, timeout_s: float = 120.0,
           **kwargs: Any) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results in rank order.

    Args:
        fn: an importable function; inside it, ``course.world.current()`` says which rank it runs on.
        world_size: number of ranks (GPUs, or CPU processes emulating them).
        timeout_s: wall-clock limit for the whole job, in seconds.

    Returns:
        ``[result_of_rank_0, result_of_rank_1, ...]``; results must be picklable.

    Every rank gets its own copy of ``args`` and ``kwargs`` (a model passed in and trained by the ranks is left
    as it was in the caller); results come back by value.

    Raises:
        ValueError: bad ``world_size`` (see :func:`course.world.check_world_size`).
        TypeError: arguments that cannot be pickled.
        RankFailed: a rank raised or died; the others were stopped.
        RankTimeout: ranks still running after ``timeout_s``; all were stopped.
    """
    world.check_world_size(world_size)
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(fn, "__qualname__", ""):
        raise ValueError(
            f"launch() needs an importable function, but {getattr(fn, '__qualname__', fn)!r} is defined in a "
            "notebook cell or inside another function. Put it in a .py module and import it."
        )
    # Plain pickle: every rank gets its own copy of the arguments. The spawn context's pickler would put their
    # tensors in shared memory, so a rank training a model it was passed would train everyone's (and yours).
    try:
        arguments = pickle.dumps((args, kwargs))
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same thing here
        raise TypeError(f"launch() sends fn's arguments to every rank by pickling them, and they cannot be "
                        f"pickled: {error}. Pass data (tensors, numbers, models, lists), not open files, locks or "
                        "lambdas.") from None
    context = mp.get_context("spawn")
    channel = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_run_rank, args=(fn, rank, world_size, port, timeout_s, arguments, channel),
                        name=f"course-rank-{rank}")
        for rank in range(world_size)
    ]
    results: dict[int, Any] = {}
    left: set[int] = set()  # ranks that have left the process group after reporting
    silent_since: dict[int, float] = {}
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout_s
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RankTimeout(sorted(set(range(world_size)) - set(results)), timeout_s)
            try:
                message = channel.get(timeout=min(0.2, remaining))
            except queue.Empty:
                _check_silent_deaths(processes, results, silent_since)
                continue
            if message[0] == "out":
                sys.stdout.write(message[1])
            elif message[0] == "ok":
                results[message[1]] = pickle.loads(message[2])
            elif message[0] == "left":  # a quick rank can leave before the others' results are read
                left.add(message[1])
            else:
                raise _root_cause(message[1], message[2], processes)
        _let_exit(processes, channel, deadline, left)
        return [results[rank] for rank in range(world_size)]
    finally:
        sys.stdout.flush()
        _stop(processes)


def _let_exit(processes: list[Any], channel: Any, deadline: float, left: set[int], grace_s: float = 30.0) -> None:
    """Give ranks that have all reported the time to leave the process group together before any is killed.

    Killing a rank while a peer is still in ``world.shutdown()``'s barrier makes that peer print a
    "Connection reset by peer" traceback. Once every rank has said it left, the rest of its exit (the
    interpreter's teardown) is not waited for. Output still in the channel is relayed meanwhile.
    """
    until = min(deadline, time.monotonic() + grace_s)
    while len(left) < len(processes) and any(p.is_alive() for p in processes) and time.monotonic() < until:
        try:
            message = channel.get(timeout=0.05)
        except queue.Empty:
            continue
        if message[0] == "out":
            sys.stdout.write(message[1])
        elif message[0] == "left":
            left.add(message[1])


def _root_cause(rank: int, remote_traceback: str, processes: list[Any], wait_s: float = 1.0) -> RankFailed:
    """The failure to report: a rank that died silently first makes its peers fail in collectives, so blame it."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for other, process in enumerate(processes):
            if other != rank and process.exitcode not in (None, 0):
                last_line = remote_traceback.strip().splitlines()[-1]
                return RankFailed(other, f"process exited with code {process.exitcode} without reporting a result; "
                                         f"rank {rank} then failed with: {last_line}")
        time.sleep(0.05)
    return RankFailed(rank, remote_traceback)


def _check_silent_deaths(processes: list[Any], results: dict[int, Any], silent_since: dict[int, float],
                         grace_s: float = 2.0) -> None:
    """Raise for a rank whose process ended without reporting (killed, segfault, ``os._exit``).

    A rank that exits normally has already queued its report; the grace period lets it arrive.
    """
    now = time.monotonic()
    for rank, process in enumerate(processes):
        if rank in results or process.exitcode is None:
            continue
        if now - silent_since.setdefault(rank, now) > grace_s:
            raise RankFailed(rank, f"process exited with code {process.exitcode} without reporting a result.")
