"""Run an untrusted command (a student's ``torchrun`` job) contained, without Docker.

EARLY INTERFACE VERSION: limits beyond the wall clock and output are not enforced yet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use. Defaults fit a 4-rank CPU run of the course CNN."""

    wall_s: float = 120.0  # whole run, every process it started
    memory_bytes: int = 3 * 2**30  # per process address space (RLIMIT_AS)
    max_processes: int = 64  # processes alive at once in the sandbox
    file_size_bytes: int = 64 * 2**20  # largest file a process may write (RLIMIT_FSIZE)
    cpu_s: int = 600  # CPU seconds per process (RLIMIT_CPU)
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr); the rest is counted and dropped
    network: bool = False  # False: loopback only, where the OS allows a private network namespace


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended. ``status`` is one of :data:`STATUSES`."""

    status: str  # "ok" | "error" | "timeout" | "out of memory" | "too many processes" | "output limit" | ...
    returncode: int | None  # exit code of the command; -N if killed by signal N; None if never started
    stdout: str  # truncated to Limits.output_bytes, with a marker saying how much was dropped
    stderr: str
    elapsed_s: float
    detail: str  # human-readable explanation of the status, in course terms


class _Capped:
    """Reads one pipe to EOF on a thread, keeping the first ``limit`` bytes and counting the rest."""

    def __init__(self, pipe, limit: int) -> None:
        self.kept = bytearray()
        self.dropped = 0
        self._pipe, self._limit = pipe, limit
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while chunk := self._pipe.read1(65536):
            room = self._limit - len(self.kept)
            self.kept += chunk[:max(room, 0)]
            self.dropped += max(len(chunk) - max(room, 0), 0)

    def text(self, timeout: float = 5.0) -> str:
        self._thread.join(timeout)
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[sandbox: {self.dropped} more bytes of output were dropped]\n"
        return text


def run(argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits = Limits(),
        pass_fds: tuple[int, ...] = ()) -> SandboxResult:
    """Run ``argv`` in ``cwd`` with ``env`` under ``limits``; always returns a result, never raises for the child."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, pass_fds=pass_fds)
    out, err = _Capped(proc.stdout, limits.output_bytes), _Capped(proc.stderr, limits.output_bytes)
    status, detail = "ok", "the program finished normally"
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        status, detail = "timeout", f"the program did not finish within {limits.wall_s:g} s and was stopped"
    finally:
        _kill_tree(proc.pid)
        proc.wait()
    if status == "ok" and proc.returncode != 0:
        status, detail = "error", f"the program exited with code {proc.returncode}"
    return SandboxResult(status, proc.returncode, out.text(), err.text(), time.monotonic() - start, detail)


def _kill_tree(pid: int) -> None:
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
