"""The fork server that launch()'s ranks are forked from: torch imported once, restarted when torch must re-read.

:func:`course.runtime.launch.launch` asks :func:`context` for a multiprocessing context before it starts its ranks,
:func:`start_up_file` for where they write as they start, and :func:`note_server` afterwards. A rank that fails
while it starts leaves its error in the server's stderr file (:func:`start_up_file`), emptied at each launch.
Taught with launch in ``notebooks/00_start_here.ipynb``; ``docs/contributing.md`` says why it exists.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from typing import Any

import psutil
import torch.multiprocessing as mp

# Ranks are forked from a server process that has imported torch once (what torch costs each fresh process:
# ~1.5 s of CPU, 4 ranks per launch on 2 cores), started by the first launch. The server imports nothing a learner
# edits, and nothing that touches a GPU, so a rank sees the learner's latest files and may use CUDA. torch reads
# some variables when it is imported (TORCH_DISTRIBUTED_DEBUG, TORCH_CPP_LOG_LEVEL, ...): a launch whose
# environment differs from the server's in any of them replaces the server by one started under its own
# environment (one start, where spawning would cost every later launch a fresh torch in each rank). A server
# started by someone else is left alone: those launches spawn fresh interpreters, as every launch does where
# there is no fork server (Windows). Slower to start, otherwise the same.
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
# torch._dynamo: DDP imports it on first use (about 1 s of CPU per rank)
PRELOADED = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "course.runtime.launch"]
READ_BY_TORCH = ("TORCH", "PYTORCH", "NCCL", "GLOO", "OMP_", "MKL", "KMP_", "CUDA", "NVIDIA", "LD_", "PYTHON")
SERVER: dict[str, Any] = {}  # "pid" of the fork server this module started, the "environment" it read, its "stderr"


def _environment_read_by_torch() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith(READ_BY_TORCH)}


def _server_pid(unknown: object) -> object:
    """The pid of multiprocessing's fork server, ``None`` when it is not running, ``unknown`` if it cannot be read."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", unknown)


def context() -> Any:
    """The fork server's context, its torch imported under this launch's environment; spawn's where it cannot be."""
    if START_METHOD != "forkserver":
        return mp.get_context("spawn")
    pid = _server_pid("unknown")
    if pid is not None and pid == SERVER.get("pid") and _environment_read_by_torch() != SERVER.get("environment"):
        pid = _stop_server(pid)  # ours, but its torch read other variables
    if pid is None:  # not running: this launch starts it, with this environment and a stderr file of its own
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(PRELOADED)
        # a rank re-importing an unguarded script gets here too, and fails to start: no file for it
        importing = getattr(mp.current_process(), "_inheriting", False)  # what multiprocessing itself checks
        SERVER.update(pid=None, environment=_environment_read_by_torch(),
                       stderr=None if importing else _server_stderr())
        return context
    if pid == SERVER.get("pid"):
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def _stop_server(pid: object) -> object:
    """Stop the fork server this module started; return the pid now running (``None``: stopped)."""
    from multiprocessing import forkserver

    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if stop is None:  # a Python without it: the server stays, and launches under other variables spawn
        return pid
    stop()
    SERVER.clear()
    return _server_pid(None)


_STDERR_PREFIX = "course-fork-server-"


def _server_stderr() -> str:
    """A file for the fork server's stderr, removed when this process exits. A rank forked from the server writes
    there until it has sent its stderr to its own file: a rank that fails while it starts leaves its error there.

    Its name holds this process's pid. A process that was killed cannot remove its file, so each new file first
    removes those of processes that are gone."""
    _remove_files_of_dead_processes(tempfile.gettempdir())
    fd, path = tempfile.mkstemp(prefix=f"{_STDERR_PREFIX}{os.getpid()}-", suffix=".stderr")
    os.close(fd)
    atexit.register(_remove, path)
    return path


def _remove_files_of_dead_processes(folder: str) -> None:
    """Remove this user's fork-server stderr files whose launching process no longer runs."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name[len(_STDERR_PREFIX):].split("-", 1)[0]
        if not (name.startswith(_STDERR_PREFIX) and name.endswith(".stderr") and pid.isdigit()):
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == os.getuid() and not psutil.pid_exists(int(pid)):
                os.remove(path)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def start_up_file(context: Any) -> str | None:
    """Where this launch's ranks write as their processes start: the fork server's stderr file, emptied now so
    that it holds only this launch's (the server keeps it open for appending); ``None`` for spawned ranks,
    whose own files hold it."""
    if context.get_start_method() != "forkserver" or not SERVER.get("stderr"):
        return None
    with open(SERVER["stderr"], "wb"):
        pass
    return SERVER["stderr"]


def note_server(context: Any) -> None:
    """Remember the pid of the fork server a launch started (one started by someone else is not used)."""
    if context.get_start_method() == "forkserver" and SERVER.get("pid") is None:
        SERVER["pid"] = _server_pid(None)
