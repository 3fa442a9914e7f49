"""Stopping a process and everything it started, with nothing left behind; and the ``/proc`` reader for it.

:func:`kill_tree` is the one tree kill: :func:`course.runtime.process.run` (a torchrun job, a watched run, a
graded run in :mod:`grader.sandbox`) and :func:`course.runtime.launch.launch` (ranks) use it.
:func:`process_table` reads every process's parent in one pass over ``/proc``; the kill and the watchdog of
:func:`course.runtime.process.run` share it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HAS_PROC = os.path.exists("/proc/self/stat")  # Linux; psutil elsewhere


def kill_tree(process: subprocess.Popen | psutil.Process | int, own_group: bool = False, wait_s: float = 10.0,
              uid: int | None = None) -> None:
    """Stop ``process`` and everything it started, wait until they are gone, and reap it.

    Each round freezes what it finds (SIGSTOP), so that no process can start a new child between the look and the
    kill, looks again for children born before the freeze, and kills them all; rounds go on until a look finds
    nothing alive (or ``wait_s`` passed).

    Args:
        process: a ``Popen``, a ``psutil.Process`` or a pid.
        own_group: it was started with ``start_new_session=True``: every process of its process group is killed
            too, which finds descendants orphaned by a parent that already exited.
        uid: every process of this (dedicated) uid is killed too: a complete list even for processes that left
            both the tree and the group.
    """
    pid = process if isinstance(process, int) else process.pid
    deadline = time.monotonic() + wait_s
    killed: dict[int, float | None] = {}  # pid -> its start time: waited for even once it has left the tree
    while time.monotonic() < deadline:
        victims = _victims(pid, own_group, uid) | _still_alive(killed)
        if not victims:
            break
        _signal(victims, signal.SIGSTOP)
        victims |= {child for victim in victims for child in descendants(victim, process_table())}
        killed.update({victim: _alive_since(victim) for victim in victims if victim not in killed})
        _signal(victims, signal.SIGKILL)
        time.sleep(0.02)  # SIGKILL takes a moment to empty a big process; a zombie counts as gone
    if isinstance(process, subprocess.Popen):
        process.wait()


def _victims(pid: int, own_group: bool, uid: int | None) -> set[int]:
    table = process_table()
    found = {p for p in [pid, *descendants(pid, table)] if p in table and table[p][1] != "Z"}
    if own_group and pid != os.getpgrp():
        found |= {p for p, (_, state) in table.items() if state != "Z" and _group_of(p) == pid}
    if uid is not None:
        found |= {p.pid for p in psutil.process_iter(["uids", "status"])
                  if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE}
    found.discard(os.getpid())
    return found


def _still_alive(killed: dict[int, float | None]) -> set[int]:
    """Those of ``killed`` not yet gone. A child whose parent died first is no longer below it in the tree (it was
    handed to init) while it dies: on a loaded machine that takes a while. The start time tells a new process
    that took a dead one's pid, which is not a victim."""
    return {pid for pid, start in killed.items() if start is not None and _alive_since(pid) == start}


def _alive_since(pid: int) -> float | None:
    """When ``pid`` started (the kernel's clock ticks since boot; psutil's time where there is no /proc), or None
    if it is gone or a zombie."""
    if not HAS_PROC:
        try:
            process = psutil.Process(pid)
            return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
        except psutil.Error:
            return None
    fields = stat_fields(pid)
    return None if fields is None or fields[0] == b"Z" else float(fields[19])


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) of every process, from one pass over /proc (psutil where there is no /proc).

    psutil's ``children(recursive=True)`` costs ~10 ms a call; this is a watchdog's hot path. ``state`` is
    ``/proc``'s letter: ``"Z"`` for a zombie, ``"R"`` for running or waiting for a processor.
    """
    if not HAS_PROC:
        states = {psutil.STATUS_ZOMBIE: "Z", psutil.STATUS_RUNNING: "R"}
        return {p.pid: (p.info["ppid"], states.get(p.info["status"], "S"))
                for p in psutil.process_iter(["ppid", "status"])}
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (entry := _stat(int(name))):
            table[int(name)] = entry
    return table


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of ``pid`` from /proc/<pid>/stat, None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[1]), fields[0].decode())


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name, from its state on (``[0]`` is field 3 of proc(5)),
    or None if the process is gone. The command name may hold spaces and ")": the split is at the last one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def descendants(pid: int, table: dict[int, tuple[int, str]]) -> list[int]:
    """Every process below ``pid`` in ``table`` (see :func:`process_table`), parents before their children."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def below(pid: int, depth: int, table: dict[int, tuple[int, str]], only: bool = False) -> list[int]:
    """The live processes of ``pid``'s tree at ``depth`` or deeper (0: ``pid`` itself, 1: its children, ...);
    with ``only``, at ``depth`` exactly."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    level, found = [pid], []
    for current in range(depth + 1 if only else 1 << 16):
        if not level:
            break
        if current >= depth:
            found += [p for p in level if p in table and table[p][1] != "Z"]
        level = [child for parent in level for child in children.get(parent, ())]
    return found


def private_rss(pid: int) -> int:
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


def shared_fairly(pid: int) -> int:
    """``pid``'s anonymous memory with each page it shares with forks counted 1/N (Pss_Anon), in bytes.

    :func:`private_rss` counts a page that N forks share (copy-on-write, never written) N times: a parent with
    torch imported and 60 idle forks of it reads as 60 copies. The proportional count adds up to what the
    machine really holds. Reading it walks the process's pages, so the watchdog asks for it only when the quick
    :func:`private_rss` sum is over the limit. Falls back to :func:`private_rss` without ``smaps_rollup``.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss_Anon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return private_rss(pid)
