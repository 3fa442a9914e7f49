"""The in-house isolation, the fallback where bubblewrap is missing: namespaces, mounts and loopback via ctypes.

:mod:`grader.sandbox` uses bubblewrap where the host has it (``apt-get install bubblewrap``); this module is
what it does without, and what ``isolation="namespaces"`` or ``"process-tree"`` asks for. The command runs under
``python -I namespaces.py CONFIG`` (standard library and psutil only, no grader import), three levels:

* the *supervisor* (this script): as root, or in a user namespace mapping the user to themself where the
  kernel allows unprivileged ones, it enters new mount, pid, IPC and network namespaces (the network has only
  ``lo``, brought up here, so gloo and torchrun rendezvous on 127.0.0.1 work and nothing else is reachable);
* *init*, process 1 of the pid namespace: it mounts a private ``/proc``, covers the grader's secret files with
  ``/dev/null``, exposes the Python installation where it lives under a private directory (``/root``), starts
  the command, reaps, and reports the command's exit code on the trusted status pipe; when init ends, the kernel
  kills every process of the namespace, escapees included. Without a pid namespace init is a child subreaper
  instead, which keeps double-forked escapees in the tree the watchdog kills, and the network is not
  contained: the reported notes say so;
* the *command*: :func:`grader.sandbox.exec.exec_command` (rlimits, uid, exec).

Its tests are tests/grader/sandbox/test_sandbox.py, run over both backends where bubblewrap is installed.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

if __name__ == "__main__":  # run as a script with -I: its sibling is not importable as grader.sandbox.exec
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from exec import exec_command
else:
    from grader.sandbox.exec import exec_command


# ---------------------------------------------------------------------------------------------- parent side
class Supervisor:
    """How :mod:`grader.sandbox` starts a command under this module, and learns how the command ended.

    ``argv`` is the command line to start (with ``pass_fds``); call :meth:`started` once it is, then
    :meth:`exit_code` and :meth:`containment` after it ended.
    """

    def __init__(self, config: dict) -> None:
        self._status_r, status_w = os.pipe()
        config = {**config, "status_fd": status_w, "grader_pid": os.getpid()}
        self.argv = [sys.executable, "-I", os.path.abspath(__file__), json.dumps(config)]
        self.pass_fds = (status_w,)
        self._lines: _Lines | None = None

    def started(self) -> None:
        """Close our copy of the status pipe's write end (the supervisor has its own) and read the reports."""
        os.close(self.pass_fds[0])
        self._lines = _Lines(os.fdopen(self._status_r, "rb"))

    def abandon(self) -> None:
        """The command could not be started: close both ends."""
        for fd in (self._status_r, self.pass_fds[0]):
            with contextlib.suppress(OSError):
                os.close(fd)

    def exit_code(self, _process=None) -> int | None:
        reports = self._lines.result() if self._lines else []
        return reports[-1].get("returncode") if len(reports) > 1 else None

    def containment(self) -> tuple[tuple[str, ...], list[str]]:
        """(mechanisms, notes) the supervisor reported: the containment that was active, and what was not."""
        reports = self._lines.result() if self._lines else []
        setup = reports[0] if reports else {}
        return tuple(setup.get("mechanisms", ())), list(setup.get("notes", []))


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



# ----------------------------------------------------------------------------------------------- child side
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
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
            exec_command(config)
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
        children = [p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.01)


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
