"""Where a process is started, watched and stopped: ``run(argv, timeout_s, limits, capture) -> Outcome``.

    outcome = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", "train.py"], 180)
    outcome.status, outcome.returncode, outcome.stdout, outcome.stderr

The command gets its own session; its output goes through :class:`~course.runtime.capture.Capped` readers; a
watchdog here stops it at the time limit, or when it breaks one of ``limits`` (total memory, processes, output
volume), or when ``stop`` is set; then :func:`~course.runtime.process_tree.kill_tree` stops it and everything it
started, and :mod:`~course.runtime.outcome` says how it ended. Every process it started is gone when ``run``
returns, whatever the command did. :class:`Running` is the same in two halves, for a caller that needs the
process while it runs (:func:`course.monitor.watch.run_and_watch` samples it). :func:`run_together` runs commands
that need each other (two nodes of one job) and stops them all as soon as one fails; :func:`finish_together`
watches started commands that end together (the ranks of a graded run) and stops them once none of them makes
progress (:mod:`course.runtime.progress`). Notebooks 05, 05b and 06.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from course.runtime import process_tree, progress
from course.runtime.capture import DROPPED, Capped
from course.runtime.outcome import Limits, Outcome, breach, classify

STOP_GRACE_S = 5.0  # after asking the command to end (SIGTERM), before every process is killed
_LOOK_S = 0.5  # finish_together's progress sampling period
_POLL_S = (0.02, 0.25)  # watchdog sampling period: fast at the start (bombs), then cheap (~5 ms a sample)


class Running:
    """A started command: :meth:`finish` watches it to its end and stops everything it started.

    Args:
        argv: the command.
        cwd, env, pass_fds: as for ``subprocess.Popen``.
        capture: bytes kept per stream (head and tail, :meth:`Capped.split`), or ``(head_bytes, tail_bytes)``;
            ``None`` for everything.
        marker: put where output was dropped (see :data:`course.runtime.capture.DROPPED`).
        own_depth: the levels of the tree below ``argv``'s process that belong to the runner, not to the
            command (a sandbox's supervisor and init: 2): they are not counted, nor asked to end.
        uid: the command runs as this dedicated uid: every process of it is killed at the end.
        new_session: start it in its own session (its process group is then killed with it); ``False`` for
            processes that must stay in their starter's session (the ranks of a graded run, in the sandbox's).

    Raises:
        ValueError: ``argv`` is empty or not strings. OSError: it cannot be started.
    """

    def __init__(self, argv: Sequence[str], *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = (), capture: int | tuple[int, int] | None = None, marker: str = DROPPED,
                 own_depth: int = 0, uid: int | None = None, new_session: bool = True) -> None:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"argv must be a non-empty list of strings, e.g. [sys.executable, 'train.py'], got "
                             f"{argv!r}")
        self._watch_output(subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            start_new_session=new_session, pass_fds=pass_fds), capture, marker)
        self._own_depth, self._uid, self._new_session = own_depth, uid, new_session

    @classmethod
    def of(cls, process: subprocess.Popen, *, capture: int | tuple[int, int] | None = None, marker: str = DROPPED,
           new_session: bool = True) -> Running:
        """Watch a process started elsewhere with ``stdout`` and ``stderr`` pipes (a
        :class:`~course.runtime.forked.Forked` rank); the arguments are ``__init__``'s."""
        running = cls.__new__(cls)
        running._watch_output(process, capture, marker)
        running._own_depth, running._uid, running._new_session = 0, None, new_session
        return running

    def _watch_output(self, process: subprocess.Popen, capture: int | tuple[int, int] | None, marker: str) -> None:
        self.start = time.monotonic()
        self.process = process
        if capture is None:
            self.stdout, self.stderr = Capped(self.process.stdout), Capped(self.process.stderr)
        elif isinstance(capture, tuple):
            self.stdout = Capped(self.process.stdout, *capture, marker)
            self.stderr = Capped(self.process.stderr, *capture, marker)
        else:
            self.stdout = Capped.split(self.process.stdout, capture, marker)
            self.stderr = Capped.split(self.process.stderr, capture, marker)

    def finish(self, timeout_s: float, limits: Limits | None = None, stop: threading.Event | None = None,
               exit_code: Callable[[subprocess.Popen], int | None] | None = None) -> Outcome:
        """Watch the command until it ends or breaks a limit, stop everything it started, say how it ended.

        Args:
            timeout_s: wall-clock limit, from the start.
            limits: also watched: ``memory_total_bytes``, ``max_processes``, ``max_output_bytes``; and the
                words of :func:`~course.runtime.outcome.classify`. ``None``: the time limit only.
            stop: once set, the command gets SIGTERM, then ``STOP_GRACE_S`` to end; status ``interrupted``.
            exit_code: the command's exit code once ``argv``'s process has ended (default: its returncode);
                a sandbox whose own process is not the command reads it elsewhere.

        A KeyboardInterrupt stops everything, then propagates.
        """
        watched = limits is not None
        limits = replace(limits or Limits(max_output_bytes=2**62), wall_s=timeout_s)
        broken = None
        try:
            broken = self._watch(limits, stop, watched)
            if broken == "stop":
                self._ask_to_end()
        finally:
            self.kill()
        returncode = None if broken else (exit_code or (lambda p: p.returncode))(self.process)
        stderr = self.stderr.text()
        status, detail = breach(broken, limits) if broken else classify(returncode, stderr, limits)
        return Outcome(status, returncode, self.stdout.text(), stderr, time.monotonic() - self.start, detail)

    def kill(self) -> None:
        """Stop the command and everything it started; a second Ctrl-C meanwhile does not cut it short."""
        interrupted = False
        while True:
            try:
                process_tree.kill_tree(self.process, own_group=self._new_session, uid=self._uid)
                break
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt

    def _watch(self, limits: Limits, stop: threading.Event | None, watched: bool) -> str | None:
        """Sample the tree until the command ends; return the first limit it breaks (see outcome.breach)."""
        while self.process.poll() is None:
            elapsed = time.monotonic() - self.start
            if stop is not None and stop.is_set():
                return "stop"
            if elapsed > limits.wall_s:
                return "wall"
            if max(self.stdout.total, self.stderr.total) > limits.max_output_bytes:
                return "output"
            if watched:
                procs = process_tree.below(self.process.pid, self._own_depth, process_tree.process_table())
                if len(procs) > limits.max_processes:
                    return "processes"
                if sum(process_tree.private_rss(p) for p in procs) > limits.memory_total_bytes and \
                        sum(process_tree.shared_fairly(p) for p in procs) > limits.memory_total_bytes:
                    return "memory"  # pages shared by forks counted once in all, not once per fork
            with contextlib.suppress(subprocess.TimeoutExpired):  # returns as soon as the command ends
                self.process.wait(min(_POLL_S[0] + elapsed / 10, _POLL_S[1], max(limits.wall_s - elapsed, 0.001)))
        return None

    def _ask_to_end(self) -> None:
        """SIGTERM to the command's top processes, then wait up to ``STOP_GRACE_S`` for the run to end."""
        table = process_tree.process_table()
        for pid in process_tree.below(self.process.pid, self._own_depth, table, only=True):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)


def run(argv: Sequence[str], timeout_s: float, limits: Limits | None = None, capture: int | None = None, *,
        cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
        stop: threading.Event | None = None) -> Outcome:
    """Run ``argv`` to its end, or stop it at ``timeout_s``; every process it started is gone on return.

    Args:
        argv: the command, e.g. a torchrun command line.
        timeout_s: wall-clock limit in seconds, for everything it starts.
        limits: what else the watchdog enforces (:class:`~course.runtime.outcome.Limits`), or ``None``.
        capture: bytes kept per output stream (a head and a tail), ``None`` for all of it.
        cwd, env: its working directory and complete environment (default: this process's).
        stop: set it to ask the command to end (SIGTERM, then a grace period); status ``interrupted``.

    Returns:
        an :class:`~course.runtime.outcome.Outcome`; never raises for anything the command does.

    Raises:
        ValueError: ``argv`` is empty or ``timeout_s`` not positive. OSError: the program cannot be started.
        KeyboardInterrupt: after stopping every process of the run.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    return Running(argv, cwd=cwd, env=env, capture=capture).finish(timeout_s, limits, stop)


def finish_together(runs: Sequence[Running], window_s: float = progress.WINDOW_S,
                    stop: threading.Event | None = None, events: Callable[[], Mapping[int, int]] | None = None
                    ) -> dict[int, str]:
    """Watch commands that end together (the ranks of one job) to their end; stop them once they are stuck.

    Those still running are stopped (:meth:`Running.kill`) once none of them has made progress for ``window_s``
    (:func:`course.runtime.progress.judge`): no CPU time used by it or what it started, no output written, no
    ``events`` counted. A rank that is behind but working is waited for, however long: the caller's time limit
    caps the job. After a rank has failed its peers usually fail at their next collective within a second; those
    left blocked are stopped by the same rule. Once ``stop`` is set, every one still running is stopped at once.

    Args:
        runs: the started commands, in rank order.
        window_s: seconds of no progress by every command still running after which they are stuck.
        stop: set it to stop them all now (the grader is being stopped).
        events: returns index in ``runs`` -> work counted so far (the records a rank wrote), if there is any.

    Returns:
        index in ``runs`` -> why it was stopped, for those that were: ``"interrupted"`` (``stop``),
        ``"stopped after rank k failed"`` (the first of ``runs`` that had exited non-zero), else ``"hang"``.
    """
    watch, next_look = progress.Watch(window_s), 0.0
    stopped: dict[int, str] = {}
    while None in (codes := [run.process.poll() for run in runs]):
        interrupted = stop is not None and stop.is_set()
        stuck = False
        if not interrupted and time.monotonic() >= next_look:
            next_look = time.monotonic() + _LOOK_S
            counted = events() if events is not None else {}
            live = {i: runs[i].process.pid for i, code in enumerate(codes) if code is None}
            work = {i: runs[i].stdout.total + runs[i].stderr.total + counted.get(i, 0) for i in live}
            stuck = watch.look(live, work).stuck
        if interrupted or stuck:
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            reason = ("interrupted" if interrupted else
                      f"stopped after rank {failed[0]} failed" if failed else "hang")
            stopped = {i: reason for i, run in enumerate(runs) if run.process.poll() is None}
            for i in stopped:  # freeze them all first: one that sees a peer die would end by itself, failing
                with contextlib.suppress(ProcessLookupError):
                    os.kill(runs[i].process.pid, signal.SIGSTOP)
            for i in stopped:
                runs[i].kill()
            break
        time.sleep(0.05)
    for run in runs:
        run.process.wait()
    return stopped


def run_together(argvs: Sequence[Sequence[str]], timeout_s: float, *, envs: Sequence[dict[str, str] | None] = (),
                 capture: int | None = None) -> list[Outcome]:
    """Run commands that need each other (two nodes of one job): start all, watch each as :func:`run` does, and
    stop the others as soon as one fails (status ``interrupted``), so that none waits for a dead peer.

    Args:
        argvs: the commands. timeout_s: wall-clock limit for each, from the start.
        envs: each command's complete environment (default: this process's). capture: as for :func:`run`.

    Returns:
        one :class:`~course.runtime.outcome.Outcome` per command, in order; every process is gone on return.

    Raises:
        ValueError: no commands, or ``timeout_s`` not positive. OSError: a program cannot be started (those
        already started are stopped).
    """
    if not argvs:
        raise ValueError("argvs must hold at least one command.")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    envs = list(envs) or [None] * len(argvs)
    started: list[Running] = []
    try:
        for argv, env in zip(argvs, envs, strict=True):
            started.append(Running(argv, env=env, capture=capture))
    except BaseException:
        for running in started:
            running.kill()
        raise
    stop = threading.Event()
    outcomes: list[Outcome | None] = [None] * len(started)

    def watch(index: int) -> None:
        outcomes[index] = started[index].finish(timeout_s, None, stop)
        if outcomes[index].status != "ok":
            stop.set()

    threads = [threading.Thread(target=watch, args=(index,), daemon=True) for index in range(len(started))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join()
        raise
    return [outcome for outcome in outcomes if outcome is not None]
