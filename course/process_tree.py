"""Stopping a process and everything it started, with nothing left behind.

Used to stop ranks (:mod:`course.launch`), a torchrun job (:mod:`course.ddp`) and a watched run
(:mod:`course.monitor`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil


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
