"""A dedicated uid per sandboxed run, as root: reserved, handed the run's directory, and swept after.

``SANDBOX_UID_BASE + slot`` (no passwd entry needed) for each of up to ``MAX_CONCURRENT`` runs at once, so the
command cannot signal or ptrace the grader, read its 0700 files, or gain privileges; RLIMIT_NPROC then counts
only the sandbox's own tasks, and "every process of that uid" is a complete kill list. The run's directory
belongs to the uid while the run lasts and to its owner again afterwards, less any symlink leading out of it;
what the uid left in /tmp, /var/tmp and /dev/shm is deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

SANDBOX_UID_BASE = 730_000  # uids SANDBOX_UID_BASE .. +MAX_CONCURRENT-1 are reserved for sandboxed runs
MAX_CONCURRENT = 64  # sandboxed runs at once on one machine (one uid each)


def kill_uid(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: every process of that uid, in one pass of the kernel."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["kill", "-KILL", "-1"], user=uid, group=uid, extra_groups=[], timeout=5,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _lock_dir() -> Path:
    """The root-owned folder of the lock files that reserve the sandbox uids (made on first use)."""
    lock_dir = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    lock_dir = lock_dir / "multigpu-course-sandbox"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    if lock_dir.is_symlink() or lock_dir.stat().st_uid != 0:
        raise RuntimeError(f"{lock_dir} must be a directory owned by root; remove it and retry")
    return lock_dir


def _open_lock(lock_dir: Path, slot: int) -> int:
    """A descriptor on the file whose lock reserves ``SANDBOX_UID_BASE + slot``."""
    return os.open(lock_dir / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)


@contextlib.contextmanager
def held(uid: int, timeout_s: float = 60.0) -> Iterator[None]:
    """Hold ``uid``'s reservation, running nothing: while it lasts, every process of ``uid`` is a leftover of a
    run that ended (a run that starts meanwhile takes another uid). Waits for a run using ``uid`` to end.

    Raises:
        ValueError: ``uid`` is not a sandbox uid.
        TimeoutError: a run held ``uid`` for ``timeout_s``.
    """
    slot = uid - SANDBOX_UID_BASE
    if not 0 <= slot < MAX_CONCURRENT:
        last = SANDBOX_UID_BASE + MAX_CONCURRENT - 1
        raise ValueError(f"uid {uid} is not a sandbox uid ({SANDBOX_UID_BASE}..{last})")
    fd = _open_lock(_lock_dir(), slot)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sandbox uid {uid} was still reserved by a run after {timeout_s:g} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def reserve() -> Iterator[int]:
    """Reserve one of the sandbox uids for this run (a lock file per uid), free of leftover processes."""
    lock_dir = _lock_dir()
    for slot in range(MAX_CONCURRENT):
        fd = _open_lock(lock_dir, slot)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uid = SANDBOX_UID_BASE + slot
        try:
            kill_uid(uid)  # left by a grader that was itself killed
            remove_files_of(uid)
            yield uid
        finally:
            remove_files_of(uid)
            os.close(fd)
        return
    raise RuntimeError(f"all {MAX_CONCURRENT} sandbox uids are in use: run fewer submissions in parallel")


def chown_tree(path: Path, uid: int, gid: int, unlink_escapes: bool = False) -> None:
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


def remove_files_of(uid: int) -> None:
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


def tasks_of_user() -> int:
    """Tasks (processes and threads) the current user already has: RLIMIT_NPROC counts them too."""
    me = os.getuid()
    return sum(p.info["num_threads"] or 1 for p in psutil.process_iter(["uids", "num_threads"])
               if p.info["uids"] and p.info["uids"].real == me)
