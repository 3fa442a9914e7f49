"""Run an untrusted command (a student's ``torchrun`` job) contained, without Docker.

``run(argv, cwd=..., env=..., limits=Limits())`` starts ``argv`` and always returns a
:class:`SandboxResult` with a status, whatever the command does: loops forever, allocates without end,
forks without end, floods its output, escapes its process group with ``setsid``, writes huge files or
dials out. Every process it started is gone when ``run`` returns.

Three layers, each in its own module:

* **isolation**, an argv prefix: bubblewrap where the host has it (:mod:`grader.sandbox.bubblewrap`: pid, mount,
  IPC and network namespaces, a read-only file system but for the run directory, the secret hidden), else
  the in-house fallback (:mod:`grader.sandbox.namespaces`: the same namespaces through ctypes where the
  kernel allows them, else a child subreaper and no network containment, which ``detail`` then says);
* **identity and rlimits** (:mod:`grader.sandbox.exec`, both backends): as root a dedicated uid per concurrent
  run (:mod:`grader.sandbox.uid`), no_new_privs, and RLIMIT_DATA (memory), RLIMIT_NPROC (tasks), RLIMIT_FSIZE,
  RLIMIT_CPU, no cores;
* **the watchdog and the kill** (:class:`course.runtime.process.Running`, shared with the course's own runs):
  wall clock, total memory, process count, output volume, capped output; then every process is killed.

Without root (a student's laptop) the command runs as the student, under the same rlimits (RLIMIT_NPROC
counted on top of the student's own processes) and watchdog; bubblewrap and the fallback then use an
unprivileged user namespace where the kernel allows one. ``mechanisms`` in the result lists what was active.
cgroups are not used: they are often owned by the machine's own manager (systemd, the CI runner).

Memory is limited with RLIMIT_DATA, not RLIMIT_AS: CUDA reserves tens of GB of address space at start-up,
so an address-space limit breaks every GPU run, while RLIMIT_DATA counts what allocations actually take
(heap and private writable mappings). The total over all processes is bounded by the watchdog.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from course.runtime.outcome import STATUSES, Limits, Outcome  # noqa: F401 - the sandbox's vocabulary
from course.runtime.process import STOP_GRACE_S, Running  # noqa: F401
from grader.sandbox import bubblewrap
from grader.sandbox import uid as sandbox_uid
from grader.sandbox.namespaces import Supervisor
from grader.sandbox.uid import MAX_CONCURRENT, SANDBOX_UID_BASE  # noqa: F401

ISOLATIONS = ("auto", "bubblewrap", "namespaces", "process-tree")
_DROPPED = "\n[sandbox: {dropped} bytes of output dropped here]\n"


@dataclass(frozen=True)
class SandboxResult(Outcome):
    """How a sandboxed run ended: an :class:`~course.runtime.outcome.Outcome` and the containment it had."""

    mechanisms: tuple[str, ...] = ()  # the containment that was active, e.g. ("uid 730003", "pid namespace")


def run(argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits | None = None,
        pass_fds: tuple[int, ...] = (), isolation: str = "auto", stop: threading.Event | None = None,
        hide: tuple[str, ...] = ()) -> SandboxResult:
    """Run ``argv`` contained and return how it ended; every process it started is gone on return.

    Args:
        argv: the command, e.g. ``[sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", f]``.
        cwd: its working directory, a fresh directory it may write (chowned to the sandbox uid as root).
        env: its complete environment. As root, HOME points at ``cwd`` and USER/LOGNAME say ``sandbox``.
        limits: see :class:`~course.runtime.outcome.Limits` (``None``: its defaults).
        pass_fds: descriptors the command inherits, e.g. the write end of the grader's result pipe.
        isolation: ``"auto"``: bubblewrap where it works here, else ``"namespaces"``, the in-house fallback;
            ``"bubblewrap"`` (an error where it is missing); ``"process-tree"``: the weakest, session +
            subreaper + rlimits, as where namespaces are unavailable (and no sandbox uid).
        stop: once set (the grader is being stopped), the command gets SIGTERM, then ``STOP_GRACE_S`` to
            end (the grader's launcher writes its ranks' records then) before every process is killed; the
            status is ``interrupted``.
        hide: files the command must not read (the grader's secret): each is covered by an empty file in its
            mount namespace. As root the sandbox uid cannot read a 0600 file anyway; without any mount
            namespace they stay readable, and ``detail`` says so.

    Returns:
        A :class:`SandboxResult`; never raises for anything the command does. KeyboardInterrupt stops the
        command (every process) and propagates.

    Raises:
        ValueError: ``argv`` is empty, ``cwd`` is not a directory, or ``isolation`` is unknown.
        RuntimeError: as root, all MAX_CONCURRENT sandbox uids are in use; ``isolation="bubblewrap"`` where
            bubblewrap cannot run.
    """
    limits = limits or Limits()
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be a non-empty list of strings, e.g. [sys.executable, 'train.py'], got {argv!r}")
    cwd = Path(cwd).resolve()
    if not cwd.is_dir():
        raise ValueError(f"cwd must be an existing directory for the sandboxed run, got {cwd}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, got {isolation!r}")
    if isolation == "bubblewrap" and bubblewrap.unavailable_reason():
        raise RuntimeError(f"isolation='bubblewrap' cannot be used: {bubblewrap.unavailable_reason()}; "
                           "or use isolation='auto', which falls back to the in-house namespaces")
    if isolation == "auto":
        isolation = "namespaces" if sys.platform != "linux" or bubblewrap.unavailable_reason() else "bubblewrap"
    privileged = isolation != "process-tree" and sys.platform == "linux" and os.geteuid() == 0
    with sandbox_uid.reserve() if privileged else contextlib.nullcontext() as uid:
        return _run_as(argv, cwd, env, limits, pass_fds, uid, isolation, stop, hide)


def _run_as(argv: list[str], cwd: Path, env: dict[str, str], limits: Limits, pass_fds: tuple[int, ...],
            uid: int | None, isolation: str, stop: threading.Event | None, hide: tuple[str, ...]) -> SandboxResult:
    env = dict(env)
    if uid is not None:
        owner = cwd.stat()
        sandbox_uid.chown_tree(cwd, uid, uid)
        os.chmod(cwd, 0o700)  # runs of other submissions, at the same time, cannot look in
        env.update(HOME=str(cwd), USER="sandbox", LOGNAME="sandbox")
    try:
        return _supervised(argv, cwd, env, limits, pass_fds, uid, isolation, stop, hide)
    finally:
        if uid is not None:  # the grader owns what the run left (its checkpoint), the sandbox uid nothing
            sandbox_uid.chown_tree(cwd, owner.st_uid, owner.st_gid, unlink_escapes=True)
            os.chmod(cwd, owner.st_mode & 0o7777)


def _supervised(argv: list[str], cwd: Path, env: dict[str, str], limits: Limits, pass_fds: tuple[int, ...],
                uid: int | None, isolation: str, stop: threading.Event | None, hide: tuple[str, ...]) -> SandboxResult:
    config = {"argv": list(argv), "cwd": str(cwd), "uid": uid, "limits": asdict(limits),
              "nproc": limits.max_threads + (0 if uid is not None else sandbox_uid.tasks_of_user())}
    hidden = [os.path.realpath(p) for p in hide if os.path.isfile(p)]
    needed = _needed_paths(argv, env, cwd)
    supervisor = None
    if isolation == "bubblewrap":
        command, mechanisms = bubblewrap.command(config, hidden, needed)
        extra_fds: tuple[int, ...] = ()
    else:
        supervisor = Supervisor({**config, "namespaces": isolation == "namespaces", "expose": needed,
                                 "hide": hidden})
        command, extra_fds = supervisor.argv, supervisor.pass_fds
    try:  # the supervisor and init (bwrap's two processes, or ours) are not the command's: own_depth=2
        running = Running(command, cwd=cwd, env=env, pass_fds=(*pass_fds, *extra_fds), capture=limits.output_bytes,
                          marker=_DROPPED, own_depth=2, uid=uid)
    except BaseException:
        if supervisor is not None:
            supervisor.abandon()
        raise
    if supervisor is not None:
        supervisor.started()
        outcome = running.finish(limits.wall_s, limits, stop, exit_code=supervisor.exit_code)
        mechanisms, notes = supervisor.containment()
    else:
        outcome = running.finish(limits.wall_s, limits, stop, exit_code=lambda p: bubblewrap.exit_code(p.returncode))
        notes = []
    detail = outcome.detail
    streams = (("stdout", running.stdout), ("stderr", running.stderr))
    dropped = [f"{c.total - c.kept} bytes of {name}" for name, c in streams if c.kept < c.total]
    if dropped:
        detail += f" ({' and '.join(dropped)} were dropped: print less, on rank 0 only)"
    if notes:
        detail += " [containment: " + "; ".join(notes) + "]"
    return SandboxResult(**{**asdict(outcome), "detail": detail}, mechanisms=tuple(mechanisms))


def _needed_paths(argv: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    """What the command must reach: ``cwd``, the Python installation, what the grader imports, the program."""
    paths = {str(cwd), sys.base_prefix, sys.prefix, *sys.path, *env.get("PYTHONPATH", "").split(os.pathsep)}
    program = argv[0] if os.sep in argv[0] else _which(argv[0], env.get("PATH", os.defpath))
    if program:
        paths.add(os.path.dirname(program))
    return sorted({os.path.realpath(p) for p in paths if p and os.path.isabs(p) and os.path.exists(p)})


def _which(name: str, path: str) -> str | None:
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None

