"""Run an untrusted command (a student's ``torchrun`` job) contained, without Docker.

``run(argv, cwd=..., env=..., limits=Limits())`` starts ``argv`` and always returns a
:class:`SandboxResult` with a status, whatever the command does: loops forever, allocates without end,
forks without end, floods its output, escapes its process group with ``setsid``, writes huge files or
dials out. Every process it started is gone when ``run`` returns. Used by the grader (notebook 06).

How, as root (the grading server, Gradescope, CI):

* a dedicated uid/gid per concurrent run (``SANDBOX_UID_BASE + slot``, no passwd entry needed), so the
  command cannot signal or ptrace the grader, read its 0700 files, or gain privileges (no_new_privs);
  RLIMIT_NPROC then counts only the sandbox's own tasks, and "every process of that uid" is a complete
  kill list even for processes that double-forked out of the session;
* new pid, mount, IPC and network namespaces: the pid namespace's init is ours, and when it ends the kernel
  kills every process inside, escapees included; the network namespace has only ``lo`` (up), so gloo and
  torchrun rendezvous on 127.0.0.1 work and nothing else is reachable; the mount namespace mounts a
  private ``/proc`` and exposes the Python installation if it lives under a private directory (``/root``);
* ``cwd`` belongs to the sandbox uid (mode 0700) during the run and to its owner again afterwards, less any symlink
  leading out of it (a "checkpoint" linked to /etc/shadow is deleted); what the uid left in
  /tmp, /var/tmp and /dev/shm is deleted, so one submission cannot leave anything for the next;
* rlimits on every process: RLIMIT_DATA (memory), RLIMIT_NPROC (tasks), RLIMIT_FSIZE, RLIMIT_CPU, no cores;
* a watchdog here that samples the process tree: wall clock, total memory, process count, output volume.

Without root (a student's laptop) the command runs as the student, under the same rlimits (RLIMIT_NPROC
counted on top of the student's own processes) and watchdog. Where the kernel allows unprivileged user
namespaces (most Linux distributions), a user namespace mapping the student to themself grants the same
pid, mount, IPC and network namespaces as root gets. Where it does not (or with
``isolation="process-tree"``), init is a child subreaper instead, which keeps double-forked escapees in the
tree the watchdog kills, and the network is not contained: ``detail`` says so. ``mechanisms`` in the
result lists what was active. cgroups are not used: they are often owned by the machine's own manager
(systemd, the CI runner), and need not be writable.

Memory is limited with RLIMIT_DATA, not RLIMIT_AS: CUDA reserves tens of GB of address space at start-up,
so an address-space limit breaks every GPU run, while RLIMIT_DATA counts what allocations actually take
(heap and private writable mappings). The total over all processes is bounded by the watchdog.

The module is longer than the course's usual ~300 lines because containment is all-or-nothing: the
parent side (watchdog, capped readers, kill) and the child side (namespaces, limits, exec) live together.
The child side runs as ``python -I sandbox.py CONFIG`` (no grader import), never in a ``preexec_fn``,
which is unsafe when the grader runs threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

STATUSES = ("ok", "error", "timeout", "out of memory", "too many processes", "output limit",
            "file too large", "cpu limit", "interrupted")
INTERRUPTED = ("the grader was stopped before the run ended (its process got a signal to stop): this says nothing "
               "about the submission, whose output so far is kept; grade it again.")
STOP_GRACE_S = 5.0  # after asking the command to end (SIGTERM), before every process is killed
SANDBOX_UID_BASE = 730_000  # uids SANDBOX_UID_BASE .. +MAX_CONCURRENT-1 are reserved for sandboxed runs
MAX_CONCURRENT = 64  # sandboxed runs at once on one machine (one uid each)
_POLL_S = (0.02, 0.25)  # watchdog sampling period: fast at the start (bombs), then cheap (~5 ms a sample)
# CUDA's host side (driver, context, pinned buffers) takes GBs of private memory per GPU process: not measured
# here (no GPU), so GPU machines get generous limits: 16 GiB per process, 60% of the machine in all.
_GPU = os.path.exists("/dev/nvidiactl")
_MEMORY_PER_PROCESS = 16 * 2**30 if _GPU else 3 * 2**30
_RAM_60 = int(0.6 * psutil.virtual_memory().total)
_MEMORY_TOTAL = _RAM_60 if _GPU else min(12 * 2**30, _RAM_60)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use. Defaults fit a 4-rank CPU or GPU run of the course CNN."""

    wall_s: float = 120.0  # whole run, every process it started
    memory_bytes: int = _MEMORY_PER_PROCESS  # per process heap + private writable memory (RLIMIT_DATA, see
    # the module doc): 3 GiB, or 16 GiB on machines with NVIDIA GPUs
    memory_total_bytes: int = _MEMORY_TOTAL  # resident memory of all processes together (watchdog): 60% of
    # this machine's memory, at most 12 GiB without GPUs
    max_processes: int = 64  # processes alive at once in the sandbox (watchdog; RLIMIT_NPROC backs it)
    max_threads: int = 1024  # tasks (processes + threads) at once: RLIMIT_NPROC, which the kernel counts so
    file_size_bytes: int = 64 * 2**20  # largest file a process may write (RLIMIT_FSIZE)
    cpu_s: int = 600  # CPU seconds per process (RLIMIT_CPU)
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr): the head and a tail; the rest is dropped
    max_output_bytes: int = 64 * 2**20  # written per stream before the run is stopped ("output limit")
    network: bool = False  # False: loopback only, where the OS allows a private network namespace

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name != "network" and not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")
        if self.output_bytes > self.max_output_bytes:
            raise ValueError(f"Limits.output_bytes ({self.output_bytes}) must not exceed max_output_bytes "
                             f"({self.max_output_bytes}): output is kept up to the first and counted up to the second")


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended."""

    status: str  # one of STATUSES
    returncode: int | None  # exit code of the command; -N if signal N ended it; None if the sandbox stopped it
    stdout: str  # at most Limits.output_bytes, with a marker saying how much was dropped
    stderr: str
    elapsed_s: float
    detail: str  # human-readable explanation of the status, in course terms
    mechanisms: tuple[str, ...] = ()  # the containment that was active, e.g. ("uid 730003", "pid namespace")


def run(argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits = Limits(),
        pass_fds: tuple[int, ...] = (), isolation: str = "auto", stop: threading.Event | None = None,
        hide: tuple[str, ...] = ()) -> SandboxResult:
    """Run ``argv`` contained and return how it ended; every process it started is gone on return.

    Args:
        argv: the command, e.g. ``[sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", f]``.
        cwd: its working directory, a fresh directory it may write (chowned to the sandbox uid as root).
        env: its complete environment. As root, HOME points at ``cwd`` and USER/LOGNAME say ``sandbox``.
        limits: see :class:`Limits`.
        pass_fds: descriptors the command inherits, e.g. the write end of the grader's result pipe.
        isolation: ``"auto"``: the strongest containment available (see the module doc), or
            ``"process-tree"``: the weakest, session + subreaper + rlimits, as where namespaces are unavailable.
        stop: once set (the grader is being stopped), the command gets SIGTERM, then ``STOP_GRACE_S`` to
            end (the grader's launcher writes its ranks' records then) before every process is killed; the
            status is ``interrupted``.
        hide: files the command must not read (the grader's secret): in its mount namespace each is covered
            by an empty file. As root the command's own uid cannot read a 0600 file anyway; without any mount
            namespace they stay readable, and ``detail`` says so.

    Returns:
        A :class:`SandboxResult`; never raises for anything the command does. KeyboardInterrupt stops the
        command (every process) and propagates.

    Raises:
        ValueError: ``argv`` is empty, ``cwd`` is not a directory, or ``isolation`` is unknown.
        RuntimeError: as root, all MAX_CONCURRENT sandbox uids are in use.
    """
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be a non-empty list of strings, e.g. [sys.executable, 'train.py'], got {argv!r}")
    cwd = Path(cwd).resolve()
    if not cwd.is_dir():
        raise ValueError(f"cwd must be an existing directory for the sandboxed run, got {cwd}")
    if isolation not in ("auto", "process-tree"):
        raise ValueError(f"isolation must be 'auto' or 'process-tree', got {isolation!r}")
    privileged = isolation == "auto" and sys.platform == "linux" and os.geteuid() == 0
    with _sandbox_uid() if privileged else contextlib.nullcontext() as uid:
        return _run_as(argv, cwd, env, limits, pass_fds, uid, isolation, stop, hide)


def _run_as(argv: list[str], cwd: Path, env: dict[str, str], limits: Limits, pass_fds: tuple[int, ...],
            uid: int | None, isolation: str, stop: threading.Event | None,
            hide: tuple[str, ...] = ()) -> SandboxResult:
    start = time.monotonic()
    env = dict(env)
    if uid is not None:
        owner = cwd.stat()
        _chown_tree(cwd, uid, uid)
        os.chmod(cwd, 0o700)  # runs of other submissions, at the same time, cannot look in
        env.update(HOME=str(cwd), USER="sandbox", LOGNAME="sandbox")
    try:
        return _supervised(argv, cwd, env, limits, pass_fds, uid, isolation, start, stop, hide)
    finally:
        if uid is not None:  # the grader owns what the run left (its checkpoint), the sandbox uid nothing
            _chown_tree(cwd, owner.st_uid, owner.st_gid, unlink_escapes=True)
            os.chmod(cwd, owner.st_mode & 0o7777)


def _supervised(argv: list[str], cwd: Path, env: dict[str, str], limits: Limits, pass_fds: tuple[int, ...],
                uid: int | None, isolation: str, start: float, stop: threading.Event | None,
                hide: tuple[str, ...] = ()) -> SandboxResult:
    status_r, status_w = os.pipe()
    config = {"argv": list(argv), "cwd": str(cwd), "uid": uid, "status_fd": status_w, "limits": asdict(limits),
              "grader_pid": os.getpid(),
              "namespaces": isolation == "auto",
              "nproc": limits.max_threads + (0 if uid is not None else _tasks_of_user()),
              "expose": _needed_paths(argv, env, cwd),
              "hide": [os.path.realpath(p) for p in hide if os.path.isfile(p)]}
    try:
        proc = subprocess.Popen([sys.executable, "-I", __file__, json.dumps(config)], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, pass_fds=(*pass_fds, status_w))
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    status_lines = _Lines(os.fdopen(status_r, "rb"))
    out = _Capped(proc.stdout, limits.output_bytes)
    err = _Capped(proc.stderr, limits.output_bytes)
    breach = None
    try:
        breach = _watch(proc, limits, out, err, start, stop)
        if breach and breach[0] == "interrupted":
            _ask_to_end(proc)
    finally:
        _kill_everything(proc, uid)
    reports = status_lines.result()
    setup = reports[0] if reports else {}
    returncode = reports[-1].get("returncode") if len(reports) > 1 and not breach else None
    stdout, stderr = out.text(), err.text()
    status, detail = breach or _classify(returncode, stderr, setup, limits)
    streams = (("stdout", out), ("stderr", err))
    dropped = [f"{c.total - c.kept} bytes of {name}" for name, c in streams if c.kept < c.total]
    if dropped:
        detail += f" ({' and '.join(dropped)} were dropped: print less, on rank 0 only)"
    notes = setup.get("notes", [])
    if notes:
        detail += " [containment: " + "; ".join(notes) + "]"
    return SandboxResult(status, returncode, stdout, stderr, time.monotonic() - start, detail,
                         tuple(setup.get("mechanisms", ())))


# ---------------------------------------------------------------------------------------------- parent side
class _Capped:
    """Drains one pipe on a thread, keeping the head and a tail of ``limit`` bytes and counting the rest."""

    def __init__(self, pipe, limit: int) -> None:
        self.total = 0
        self._head, self._tail = bytearray(), bytearray()
        self._tail_limit = min(limit // 4, 8192)
        self._head_limit = limit - self._tail_limit
        self._pipe = pipe
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._pipe:
            self._read_all()

    def _read_all(self) -> None:
        while chunk := self._pipe.read1(65536):
            self.total += len(chunk)
            room = self._head_limit - len(self._head)
            if room > 0:
                self._head += chunk[:room]
                chunk = chunk[room:]
            if chunk and self._tail_limit:
                self._tail = (self._tail + chunk)[-self._tail_limit:]

    @property
    def kept(self) -> int:
        return len(self._head) + len(self._tail)

    def text(self) -> str:
        self._thread.join(timeout=5.0)
        dropped = self.total - len(self._head) - len(self._tail)
        middle = f"\n[sandbox: {dropped} bytes of output dropped here]\n" if dropped > 0 else ""
        return (bytes(self._head).decode("utf-8", "replace") + middle
                + bytes(self._tail).decode("utf-8", "replace"))


class _Lines:
    """Collects the JSON lines the sandbox's own (trusted) side reports on its status pipe."""

    def __init__(self, pipe) -> None:
        self._pipe, self._lines = pipe, []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._pipe:
            for line in self._pipe:
                with contextlib.suppress(ValueError):
                    self._lines.append(json.loads(line))

    def result(self) -> list[dict]:
        self._thread.join(timeout=5.0)
        return self._lines


def _watch(proc: subprocess.Popen, limits: Limits, out: _Capped, err: _Capped,
           start: float, stop: threading.Event | None = None) -> tuple[str, str] | None:
    """Sample the tree until the command ends; return (status, detail) of the first limit it breaks."""
    while proc.poll() is None:
        if stop is not None and stop.is_set():
            return "interrupted", INTERRUPTED
        if time.monotonic() - start > limits.wall_s:
            return "timeout", (f"the run did not finish within {limits.wall_s:g} s and every rank and "
                               "DataLoader worker was stopped. A rank waiting in a collective that another "
                               "rank never calls, or an endless loop, looks like this.")
        if max(out.total, err.total) > limits.max_output_bytes:
            return "output limit", (f"the run wrote more than {_size(limits.max_output_bytes)} to one output "
                                    "stream and was stopped: print on rank 0 only, and not every step.")
        procs = _command_pids(proc.pid, _process_table())
        if len(procs) > limits.max_processes:
            return "too many processes", (f"the run had more than {limits.max_processes} processes at once "
                                          "and was stopped: 4 ranks and a few DataLoader workers each are "
                                          "plenty; do not start processes in a loop.")
        if sum(_private_rss(p) for p in procs) > limits.memory_total_bytes:
            return "out of memory", (f"the run's processes used more than {_size(limits.memory_total_bytes)} "
                                     "of memory together and were stopped: keep per-rank batches and "
                                     "DataLoader workers small, and do not keep tensors of every step.")
        with contextlib.suppress(subprocess.TimeoutExpired):  # returns as soon as the command ends
            proc.wait(min(_POLL_S[0] + (time.monotonic() - start) / 10, _POLL_S[1]))
    return None


def _ask_to_end(proc: subprocess.Popen) -> None:
    """SIGTERM to the command (the child of our init), then wait up to ``STOP_GRACE_S`` for the run to end."""
    table = _process_table()
    inits = {pid for pid, (parent, _) in table.items() if parent == proc.pid}
    for pid, (parent, state) in table.items():
        if parent in inits and state != "Z":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_GRACE_S)


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) of every process, from one pass over /proc (psutil where there is no /proc).

    psutil's ``children(recursive=True)`` costs ~10 ms a call here; this is the watchdog's hot path.
    """
    if not os.path.exists("/proc/self/stat"):
        return {p.pid: (p.info["ppid"], "Z" if p.info["status"] == psutil.STATUS_ZOMBIE else "R")
                for p in psutil.process_iter(["ppid", "status"])}
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (entry := _stat(int(name))):
            table[int(name)] = entry
    return table


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of ``pid`` from /proc/<pid>/stat, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and ")"
        return int(fields[1]), fields[0].decode()
    except (OSError, ValueError, IndexError):
        return None


def _descendants(pid: int, table: dict[int, tuple[int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _command_pids(supervisor: int, table: dict[int, tuple[int, str]]) -> list[int]:
    """The command's live processes: the supervisor's tree less the supervisor and its init (ours)."""
    return [pid for pid in _descendants(supervisor, table) if table[pid][0] != supervisor and table[pid][1] != "Z"]


def _private_rss(pid: int) -> int:
    """Resident memory of ``pid`` that is not shared with files (its heap, tensors, ...), in bytes."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            _, resident, shared = f.read().split()[:3]
        return (int(resident) - int(shared)) * _PAGE
    except (OSError, ValueError):
        try:
            mem = psutil.Process(pid).memory_info()
            return mem.rss - getattr(mem, "shared", 0)
        except psutil.Error:
            return 0


def _kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """SIGKILL every process the run started, until none is left, and reap the supervisor.

    As root, init is killed with the rest: its death makes the kernel kill the whole pid namespace, and
    every process of the sandbox uid is killed besides. Without root, the supervisor and init go last: while
    they live they adopt orphans (child subreaper), so the tree the sweep walks stays complete.
    """
    interrupted = False  # a second Ctrl-C must not cut the cleanup short
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            if not _kill_round(proc, uid):
                break
            time.sleep(0.02)
        except KeyboardInterrupt:
            interrupted = True
    for pid in [proc.pid, *_descendants(proc.pid, _process_table())]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if interrupted:
        raise KeyboardInterrupt


def _kill_round(proc: subprocess.Popen, uid: int | None) -> bool:
    """SIGKILL what is alive now; False if nothing was."""
    table = _process_table()
    victims = _command_pids(proc.pid, table)
    if uid is not None:
        victims += [pid for pid, (parent, state) in table.items() if parent == proc.pid and state != "Z"]  # init
        victims += [p.pid for p in psutil.process_iter(["uids", "status"])
                    if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if victims and uid is not None:
        _kill_uid(uid)
    return bool(victims)


def _kill_uid(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: every process of that uid, in one pass of the kernel."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["kill", "-KILL", "-1"], user=uid, group=uid, extra_groups=[], timeout=5,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def _sandbox_uid() -> Iterator[int]:
    """Reserve one of the sandbox uids for this run (a lock file per uid), free of leftover processes."""
    lock_dir = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    lock_dir = lock_dir / "multigpu-course-sandbox"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    if lock_dir.is_symlink() or lock_dir.stat().st_uid != 0:
        raise RuntimeError(f"{lock_dir} must be a directory owned by root; remove it and retry")
    for slot in range(MAX_CONCURRENT):
        fd = os.open(lock_dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uid = SANDBOX_UID_BASE + slot
        try:
            _kill_uid(uid)  # left by a grader that was itself killed
            _remove_files_of(uid)
            yield uid
        finally:
            _remove_files_of(uid)
            os.close(fd)
        return
    raise RuntimeError(f"all {MAX_CONCURRENT} sandbox uids are in use: run fewer submissions in parallel")


def _chown_tree(path: Path, uid: int, gid: int, unlink_escapes: bool = False) -> None:
    """chown ``path`` and everything in it, never following symlinks nor touching hard-linked files.

    With ``unlink_escapes``, symlinks that lead out of ``path`` are deleted, so the grader never reads
    ``/etc/shadow`` as a "checkpoint". chown clears setuid bits, so no file left becomes a setuid program.
    """
    os.chown(path, uid, gid)
    inside = os.path.realpath(path) + os.sep
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            entry = os.path.join(root, name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.islink(entry) and unlink_escapes and not os.path.realpath(entry).startswith(inside):
                    os.unlink(entry)
                elif os.path.isdir(entry) or os.lstat(entry).st_nlink == 1:
                    os.lchown(entry, uid, gid)


def _remove_files_of(uid: int) -> None:
    """Delete what ``uid`` left in the world-writable directories, so the next run with it starts clean."""
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        with contextlib.suppress(OSError):
            for entry in os.scandir(shared):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


def _tasks_of_user() -> int:
    """Tasks (processes and threads) the current user already has: RLIMIT_NPROC counts them too."""
    me = os.getuid()
    return sum(p.info["num_threads"] or 1 for p in psutil.process_iter(["uids", "num_threads"])
               if p.info["uids"] and p.info["uids"].real == me)


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


def _classify(returncode: int | None, stderr: str, setup: dict, limits: Limits) -> tuple[str, str]:
    """Status and course-terms detail for a run that ended by itself (the evidence is its exit and stderr)."""
    if returncode == 0:
        return "ok", "the program finished normally"
    if returncode is None:
        return "error", "the sandbox could not start the program or report its exit: its error output says why"
    if any(s in stderr for s in ("MemoryError", "can't allocate memory", "std::bad_alloc",
                                 "Cannot allocate memory")):
        return "out of memory", (f"a process ran out of memory (limit {_size(limits.memory_bytes)} per "
                                 "process): use smaller per-rank batches, and do not keep every step's tensors.")
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "file too large", (f"the program wrote a file larger than {_size(limits.file_size_bytes)}: "
                                  "save only the model's state_dict, on rank 0 only.")
    if returncode == -signal.SIGXCPU or "SIGXCPU" in stderr:
        return "cpu limit", f"a process used more than {limits.cpu_s} s of CPU time and was stopped."
    if "Resource temporarily unavailable" in stderr and "fork" in stderr.lower():
        return "too many processes", (f"the program could not start more processes (limit "
                                      f"{limits.max_processes}): do not start processes in a loop.")
    if "can't start new thread" in stderr:
        return "too many processes", (f"the program could not start more threads (limit {limits.max_threads} "
                                      "processes and threads together): do not start threads in a loop.")
    if returncode == -signal.SIGKILL:
        return "error", "the program was killed (SIGKILL), possibly by the kernel because memory ran out"
    if returncode < 0:
        return "error", f"the program was killed by signal {signal.Signals(-returncode).name}"
    return "error", f"the program exited with code {returncode}; its error output says why"


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


# ----------------------------------------------------------------------------------------------- child side
# This runs as ``python -I sandbox.py CONFIG`` in the run's new session, as root when the grader is root.
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    """A libc call that raises OSError on failure, e.g. ``_call("unshare", CLONE_NEWNET)``."""
    if getattr(_libc(), name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _supervise(config: dict) -> int:
    """Enter the namespaces, start init, wait for it; return the exit code to leave with."""
    status = os.fdopen(config["status_fd"], "w", buffering=1)
    os.set_inheritable(status.fileno(), False)  # the command never sees the trusted status channel
    if sys.platform == "linux":  # the grader was killed (SIGKILL): go too, and init with us (its own deathsig)
        _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != config["grader_pid"]:  # it died before the line above
            return 1
    mechanisms, notes = ["own session"], []
    namespaces: set[str] = set()
    if sys.platform == "linux" and config["uid"] is not None:
        mechanisms.append(f"uid {config['uid']}")
        namespaces = _unshare(config["limits"]["network"], mechanisms, notes)
    elif sys.platform == "linux" and config["namespaces"] and _enter_user_namespace(notes):  # where allowed
        mechanisms.append("user namespace")
        namespaces = _unshare(config["limits"]["network"], mechanisms, notes)
    if "pid" not in namespaces:
        mechanisms.append("child subreaper")  # set by init: double-forked escapees stay in the tree we kill
    if not config["limits"]["network"] and "network" not in namespaces:
        notes.append("network not contained: this needs root or unprivileged user namespaces")
    if config["hide"] and config["uid"] is None and "mount" not in namespaces:
        notes.append("the grader's secret file is not hidden: this needs root or unprivileged user namespaces")
    mechanisms.append("rlimits")
    status.write(json.dumps({"mechanisms": mechanisms, "notes": notes}) + "\n")
    supervisor = os.getpid()
    init = os.fork()
    if init == 0:
        try:
            os._exit(_init(config, namespaces, status, supervisor))
        except BaseException as e:  # after fork, never unwind into the supervisor's code
            print(f"sandbox: could not start the program: {e}", file=sys.stderr, flush=True)
            os._exit(126)
    status.close()
    return os.waitstatus_to_exitcode(os.waitpid(init, 0)[1]) % 256


def _unshare(network: bool, mechanisms: list[str], notes: list[str]) -> set[str]:
    """Enter new mount, pid, IPC and (unless ``network``) network namespaces; return those entered."""
    wanted = [("mount", CLONE_NEWNS), ("pid", CLONE_NEWPID), ("ipc", CLONE_NEWIPC)]
    if not network:
        wanted.append(("network", CLONE_NEWNET))
    entered = set()
    for name, flag in wanted:
        try:
            _call("unshare", flag)
            entered.add(name)
            mechanisms.append(f"{name} namespace")
        except OSError as e:
            notes.append(f"no {name} namespace ({e.strerror})")
    if "network" in entered:
        try:
            _loopback_up()
        except OSError as e:
            notes.append(f"loopback not up in the network namespace ({e.strerror})")
    return entered


def _enter_user_namespace(notes: list[str]) -> bool:
    """Without root: a user namespace mapping us to ourselves grants the rights to make the other namespaces."""
    uid, gid = os.getuid(), os.getgid()
    try:
        _call("unshare", CLONE_NEWUSER)
    except OSError as e:
        notes.append(f"no user namespace ({e.strerror})")
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:  # an error here is fatal: the supervisor exits, run says why
            f.write(text)
    return True


def _init(config: dict, namespaces: set[str], status, supervisor: int) -> int:
    """Process 1 of the pid namespace (or a subreaper without one): start the command, reap, report."""
    if sys.platform == "linux":
        _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the grader killed the supervisor
        if os.getppid() not in (supervisor, 0):  # 0: our parent is outside our new pid namespace
            return 1
        _call("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if "mount" in namespaces:
        _call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # nothing below leaks to the host
        if "pid" in namespaces:
            with contextlib.suppress(OSError):  # some containers forbid it; the host's /proc then stays
                _call("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        if config["uid"] is not None:
            with contextlib.suppress(OSError):  # the command then fails to start and says why
                _expose(config["expose"], config["uid"])
        for path in config["hide"]:
            if os.path.lexists(path):  # else already out of sight (under a private directory covered above)
                _call("mount", b"/dev/null", path.encode(), None, MS_BIND, None)  # fails: init exits, run says why
    command = os.fork()
    if command == 0:
        try:
            _exec_command(config)
        finally:
            os._exit(127)
    returncode = None
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == command:
            returncode = os.waitstatus_to_exitcode(wait_status)
            break
    status.write(json.dumps({"returncode": returncode}) + "\n")
    status.close()
    if "pid" not in namespaces:  # with one, the kernel kills what is left when this init exits
        _kill_children_until_none()
    return 0


def _kill_children_until_none() -> None:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        children = [pid for pid, (parent, _) in _process_table().items() if parent == os.getpid()]
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.01)


def _exec_command(config: dict) -> None:
    """In the command's process: limits, identity, then exec. Setup errors go to stderr (exit 127)."""
    limits = config["limits"]
    try:
        os.chdir(config["cwd"])
        _lower_limit("RLIMIT_DATA", limits["memory_bytes"], limits["memory_bytes"])
        _lower_limit("RLIMIT_NPROC", config["nproc"], config["nproc"])
        _lower_limit("RLIMIT_FSIZE", limits["file_size_bytes"], limits["file_size_bytes"])
        _lower_limit("RLIMIT_CPU", limits["cpu_s"], limits["cpu_s"] + 5)  # SIGXCPU first, SIGKILL 5 s later
        _lower_limit("RLIMIT_CORE", 0, 0)
        if sys.platform == "linux":
            _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid programs (su, ping) gain nothing
        if config["uid"] is not None:
            os.setgroups([])
            os.setresgid(config["uid"], config["uid"], config["uid"])
            os.setresuid(config["uid"], config["uid"], config["uid"])
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores these; the command gets the defaults
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    except Exception as e:
        print(f"sandbox: could not prepare the program's process: {e!r}", file=sys.stderr, flush=True)
        return
    try:
        os.execvp(config["argv"][0], config["argv"])
    except OSError as e:
        print(f"sandbox: cannot run {config['argv'][0]!r}: {e}", file=sys.stderr, flush=True)


def _lower_limit(name: str, soft: int, hard: int) -> None:
    """setrlimit, never above the hard limit already in force (without root, hard limits only go down)."""
    if not hasattr(resource, name):
        return
    which = getattr(resource, name)
    current = resource.getrlimit(which)[1]
    if current != resource.RLIM_INFINITY:
        hard = min(hard, current)
    resource.setrlimit(which, (min(soft, hard), hard))


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _expose(paths: list[str], uid: int) -> None:
    """Make ``paths`` reachable for ``uid`` where a directory above them is private (``/root`` is 0700).

    In our private mount namespace only: each private directory is covered by an empty tmpfs, and the entries
    on the way to ``paths`` are bind-mounted back into it; the rest of the private directory stays hidden.
    """
    for _ in range(32):  # one private directory uncovered per round
        private = _first_private_dir(paths, uid)
        if private is None:
            return
        staged = []
        for name in sorted({Path(p).relative_to(private).parts[0] for p in paths if Path(p).is_relative_to(private)}):
            entry = private / name
            if entry.is_dir():
                staging = tempfile.mkdtemp(prefix="sandbox-expose-", dir="/tmp")
            else:
                fd, staging = tempfile.mkstemp(prefix="sandbox-expose-", dir="/tmp")
                os.close(fd)
            _call("mount", str(entry).encode(), staging.encode(), None, MS_BIND | MS_REC, None)
            staged.append((entry, staging))
        _call("mount", b"tmpfs", str(private).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k")
        for entry, staging in staged:
            entry.mkdir() if os.path.isdir(staging) else entry.touch()
            _call("mount", staging.encode(), str(entry).encode(), None, MS_MOVE, None)
            (os.rmdir if os.path.isdir(staging) else os.unlink)(staging)


def _first_private_dir(paths: list[str], uid: int) -> Path | None:
    """The first directory strictly above one of ``paths`` that ``uid`` may not traverse."""
    for path in paths:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            folder = Path(*parts[:depth])
            st = folder.stat()
            if not st.st_mode & 0o001 and st.st_uid != uid:
                return folder
    return None


if __name__ == "__main__":
    sys.exit(_supervise(json.loads(sys.argv[1])))
