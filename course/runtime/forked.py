"""A process that is a fork of this one running a function, watched like any command: ``Forked(target, ...)``.

    rank = Forked(lambda: harness.main([script]), env=rank_env, stdout=PIPE, stderr=PIPE, pass_fds=(key_fd,))
    rank.wait()  # a subprocess.Popen in every other respect: poll, kill, pid, returncode, its pipes

A fresh ``python`` spends a second and a half of CPU importing torch before it does anything. A process that
has already imported torch can fork its children instead (``multiprocessing``'s fork server does the same for
:mod:`course.runtime.launch`); this one keeps ``subprocess.Popen``'s whole interface, pipes and waiting included,
so that :class:`~course.runtime.process.Running` and :func:`~course.runtime.process.finish_together` watch it like
any command. The child starts as a fresh program would: standard streams on the given pipes, no other descriptor
but ``pass_fds``, exactly ``env`` as its environment, default signal handlers, no exit handlers of its parent's.

Fork only from a process with no other Python thread: a lock another thread held at the fork stays held in the
child. Start the threads that watch the children after the forks.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable


class Forked(subprocess.Popen):
    """``subprocess.Popen`` whose child runs ``target()`` in a fork of this process; its return value (an int)
    is the exit code, an exception exits 1 after printing its traceback to the child's stderr.

    Args:
        target: what the child runs.
        env: the child's complete environment (default: this process's).
        stdin, stdout, stderr, pass_fds, start_new_session: as for ``subprocess.Popen``.

    Raises:
        RuntimeError: this platform cannot fork.
    """

    def __init__(self, target: Callable[[], int | None], *, env: dict[str, str] | None = None,
                 stdin=subprocess.DEVNULL, stdout=None, stderr=None, pass_fds: tuple[int, ...] = (),
                 start_new_session: bool = False) -> None:
        if not hasattr(os, "fork"):
            raise RuntimeError("Forked needs os.fork (Linux or macOS); start a new program with subprocess instead.")
        self._target = target
        for stream in (sys.stdout, sys.stderr):  # what this process buffered must not be written twice
            stream.flush()
        super().__init__([sys.executable, "<forked>"], env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                         pass_fds=pass_fds, start_new_session=start_new_session)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       restore_signals, gid, gids, uid, umask, start_new_session, *process_group) -> None:
        """Popen's hook for starting the child (the same parameters in Python 3.10 to 3.13): fork, not exec."""
        environment = dict(os.environ if env is None else env)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _become_fresh(p2cread, c2pwrite, errwrite, pass_fds, environment, start_new_session)
                result = self._target()
                code = result if isinstance(result, int) else 0
            except SystemExit as end:
                code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError, AttributeError):
                        pass
                os._exit(code)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


def _become_fresh(stdin: int, stdout: int, stderr: int, pass_fds: tuple[int, ...], env: dict[str, str],
                  new_session: bool) -> None:
    """In the child: the standard streams, descriptors, environment and signals a freshly started program has."""
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        if fd != -1 and fd != target:
            os.dup2(fd, target)
    keep = {0, 1, 2, *pass_fds}
    for fd in _open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd in pass_fds:
        os.set_inheritable(fd, True)  # as Popen leaves them
    _standard_streams_on_fds()
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the parent's exit handlers are its own


def _standard_streams_on_fds() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` on descriptors 0, 1 and 2, as in a fresh interpreter (the
    parent's may be other objects: pytest's capture, a notebook's)."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        stream = getattr(sys, name)
        try:
            if stream.fileno() == fd:
                continue
        except (AttributeError, OSError, ValueError):
            pass
        setattr(sys, name, open(fd, mode, buffering=1 if name == "stderr" else -1, encoding="utf-8",
                                errors="backslashreplace" if name == "stderr" else "strict", closefd=False))


def _open_fds() -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir("/proc/self/fd"))  # includes listdir's own, closed by then
    except OSError:  # no /proc (macOS): every descriptor up to the limit
        return list(range(3, os.sysconf("SC_OPEN_MAX")))
