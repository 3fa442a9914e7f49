"""Start the ranks of a graded run the way torchrun does, and watch them.

``python -m grader.inrank.launcher --nproc 4 SCRIPT`` runs inside the sandbox. It gives each rank torchrun's
environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ...)
and runs :func:`grader.inrank.harness.main` on SCRIPT in it, so the script sees exactly what ``torchrun
--nproc_per_node=4 SCRIPT`` would give it. Each rank is a fork of the launcher, which imported torch once for all of
them (:data:`PRELOADED`), made before the launcher reads the run's key. Like torchrun's agent it hosts the
rendezvous store itself. Unlike torchrun it keeps every rank in the sandbox's session, hands each rank its own
record pipe and key (torchrun's workers cannot inherit descriptors), keeps the first bytes of each rank's output and
counts the rest, and names ranks: once none of the ranks still running has made progress for ``--idle-s`` (no CPU
time used by it or its DataLoader workers, no record written, no output: :mod:`course.runtime.progress`), those
are stopped (``crash on rank k`` if one failed, else ``hang on rank k``); a rank that is behind but working is
waited for, up to the sandbox's time limit. On SIGTERM (the grader is
being stopped) it stops every rank at once and still reports. Its own records (exit code, output size, a tail of
stderr per rank) go to the grader through the same signed channel. It holds the run's key, so it makes its memory
unreadable to the ranks (:func:`grader.inrank.channel.hide_memory`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import gc
import importlib
import os
import signal
import subprocess
import sys
import threading
import time

from course.runtime.forked import Forked
from course.runtime.ports import reserved_port
from course.runtime.process import Running, finish_together
from course.runtime.progress import WINDOW_S
from grader.inrank import channel
from grader.inrank.harness import KEY_FD_ENV, RECORD_FD_ENV, SEED_ENV

_STOP = threading.Event()  # set by SIGTERM: the grader is being stopped
OUTPUT_HEAD_BYTES = 16 * 1024  # of each rank's stdout and stderr, relayed to the grader
STDERR_TAIL_BYTES = 4 * 1024


def _relay(stream, writer_fd: int, lock: threading.Lock, counts: list[int], rank: int) -> None:
    """Forward one rank's record lines, whole, to the grader's pipe (the grader checks signatures); count them in
    ``counts[rank]`` (a rank that writes records makes progress)."""
    with stream:
        for line in stream:
            counts[rank] += 1
            if not line.endswith(b"\n"):
                line += b"\n"
            with lock:
                view = memoryview(line)
                while view:
                    view = view[os.write(writer_fd, view):]


PRELOADED = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data.distributed", "torch._dynamo",
             "course.models", "course.train", "course.world", "grader.inrank.harness", "grader.inrank.probes")
"""What every rank imports anyway: imported once by the launcher, whose forks the ranks are (1.5 s of CPU a rank).
torch._dynamo is among them because DDP's constructor imports it: another 2 s of CPU a rank, on the first wrap."""


def rank_main(script: str) -> None:
    """One rank, in a fork of the launcher: :func:`grader.inrank.harness.main` on the script, then leave as Python
    would, minus the teardown.

    Non-daemon threads are joined, atexit handlers run and the streams flushed, as at any exit; only the
    interpreter's final teardown is skipped (freeing every module and torch's C++ state: seconds per rank on
    a loaded machine, and nothing the grader or the script's files can observe). Started by :func:`run_ranks`.
    """
    from grader.inrank import harness

    _die_with_parent()
    _exit_now(harness.main([script]))


def _die_with_parent() -> None:
    """SIGKILL this process when the launcher dies (killed from outside): no rank outlives the launcher."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _exit_now(code: int) -> None:
    shutdown = getattr(threading, "_shutdown", None)  # what Python does first at exit: join non-daemon threads
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced by the script
            pass
    os._exit(code)


def _rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default",
               WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_WORLD_SIZE="1",
               ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID="grader",
               TORCHELASTIC_USE_AGENT_STORE="True", TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does for more than one process per node
    # init_process_group returns on every rank only once every rank has connected to every other. Without it a
    # rank that leaves right after init (ranks exit quickly here) can close its sockets while a slower peer is
    # still connecting, and the peer crashes: "crash on rank k" one time, "ok" the next, for the same script.
    env["TORCH_DIST_INIT_BARRIER"] = "1"
    return env


def run_ranks(script: str, nproc: int, record_fd: int, seed: int, idle_s: float) -> int:
    """Run ``nproc`` ranks of ``script``; return 0 if every rank exited 0, else 1.

    The ranks are forks of this process, made before it reads the run's key (``KEY_FD_ENV``), so that none
    holds it: each waits on its own key pipe, written once this process has hidden its memory and derived
    the rank's key. The threads that watch the ranks start after the forks.
    """
    for module in PRELOADED:
        importlib.import_module(module)
    gc.freeze()  # what the ranks inherit is never garbage: their collections skip it (a sixth of a rank's CPU)
    reservation = contextlib.ExitStack()  # the store's port, held until the store listens on it
    port, forks, key_writers, record_readers = reservation.enter_context(reserved_port()), [], [], []
    start = time.monotonic()
    for rank in range(nproc):
        read_fd, write_fd = os.pipe()
        key_r, key_w = os.pipe()
        env = _rank_env(rank, nproc, port)
        env.update({KEY_FD_ENV: str(key_r), RECORD_FD_ENV: str(write_fd), SEED_ENV: str(seed)})
        forks.append(Forked(functools.partial(rank_main, script), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(key_r, write_fd)))
        for fd in (key_r, write_fd):
            os.close(fd)
        key_writers.append(key_w)
        record_readers.append(read_fd)
    exit_s = _exit_times(forks, start)
    channel.hide_memory()  # before the key is read: the ranks run as this user and must not read it from here
    key = channel.read_key(int(os.environ.pop(KEY_FD_ENV)))
    for rank, key_w in enumerate(key_writers):  # a rank can sign only as itself
        with contextlib.suppress(BrokenPipeError):  # the rank died already: its exit record says so
            os.write(key_w, channel.rank_key(key, rank))  # 32 bytes: one write
        os.close(key_w)
    writer, lock = channel.Writer(record_fd, key), threading.Lock()
    ranks = [Running.of(fork, capture=(OUTPUT_HEAD_BYTES, STDERR_TAIL_BYTES), new_session=False) for fork in forks]
    counts = [0] * nproc  # record lines relayed per rank
    relays = [threading.Thread(target=_relay, args=(os.fdopen(fd, "rb"), record_fd, lock, counts, rank), daemon=True)
              for rank, fd in enumerate(record_readers)]
    for relay in relays:
        relay.start()
    store = _host_store(port, nproc)  # noqa: F841  (kept alive until every rank has exited)
    reservation.close()
    stopped = finish_together(ranks, idle_s, _STOP, events=lambda: dict(enumerate(counts)))
    for relay in relays:
        relay.join(timeout=5.0)
    order = sorted(range(nproc), key=lambda r: exit_s.get(r, float("inf")))
    for rank, run in enumerate(ranks):
        writer.write({"kind": "rank_exit", "rank": rank, "returncode": run.process.returncode,
                      "stopped": stopped.get(rank), "order": order.index(rank), "exit_s": exit_s.get(rank),
                      "stdout_bytes": run.stdout.total, "stderr_bytes": run.stderr.total,
                      "stdout": run.stdout.text(wait_s=2.0), "stderr": run.stderr.text(wait_s=2.0)})
    return 0 if all(p.returncode == 0 for p in forks) else 1


def _exit_times(procs: list[subprocess.Popen], start: float) -> dict[int, float]:
    """Rank -> seconds from ``start`` to its exit, filled by one waiting thread per rank as each exits.

    Exact to the scheduler's latency, not to a polling period: when rank 2 raises and rank 0 fails a
    millisecond later on the closed connection, the grader must still see that rank 2 ended first.
    """
    times: dict[int, float] = {}

    def wait(rank: int, proc: subprocess.Popen) -> None:
        proc.wait()
        times[rank] = round(time.monotonic() - start, 4)

    for rank, proc in enumerate(procs):
        threading.Thread(target=wait, args=(rank, proc), daemon=True).start()
    return times


def _host_store(port: int, nproc: int):
    """Host the ranks' rendezvous store here, as torchrun's agent does, so ranks may exit in any order.

    (When rank 0 hosts it, rank 0 leaving first can abort the others' exit.) Started after the ranks, which
    retry until it is up: a store's thread must not be running when this process forks.
    """
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, nproc, is_master=True, wait_for_workers=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.inrank.launcher")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=WINDOW_S,
                        help="seconds with no progress by any rank still running before they are stopped")
    parser.add_argument("script")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: _STOP.set())  # stop the ranks, then still write their records
    record_fd = int(os.environ.pop(RECORD_FD_ENV))
    os.set_inheritable(record_fd, False)
    seed = int(os.environ.pop(SEED_ENV, "0"))
    return run_ranks(args.script, args.nproc, record_fd, seed, args.idle_s)


if __name__ == "__main__":
    _exit_now(main())  # every record is written: the launcher's torch (the store) need not be torn down
