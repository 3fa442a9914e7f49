"""What a rank writes to disk while the student's ``save_checkpoint`` runs, and what a crash would leave there.

The checkpoint lab (:mod:`grader.labs.checkpoint.check`, notebook 09) judges the effect, not the call: which
rank put bytes on disk (through ``torch.save`` to a path or to an open file, ``open(...).write``, ``os.write``,
``shutil.copy``), and whether a crash in the middle of the save would have lost the previous checkpoint.

A crash stops a process between two of its writes, and the disk keeps what was written so far. So the crash
drill needs no real crash: :class:`DiskWatch` splits every write into pieces (at most :data:`PIECE` bytes,
flushed one by one) and, after each piece and each file removal, reads the checkpoint's path as a restarted job
would. A crash at that point leaves the checkpoint intact when the path holds the previous checkpoint's bytes,
or a complete new checkpoint (``torch.load`` reads it). The first point where it holds neither is recorded as a
:class:`Tear`. The save itself then goes on unharmed, so no rank is left waiting for a crashed peer.
"""

from __future__ import annotations

import builtins
import io
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

#: Largest piece written at once while watching: a crash may come between any two pieces.
PIECE = 4096
_WRITING = ("w", "a", "x", "+")


@dataclass(frozen=True)
class Tear:
    """The first point of a save where a crash would have left no complete checkpoint at the path."""

    written: int  # bytes this rank had written in the save before that point
    how: str  # the write that left the path so: "torch.save", "a file copy", "a write", "a removal"
    into: str  # the file written (or removed) at that point
    left: int  # bytes at the checkpoint's path then (-1: no file)


def _fd_path(fd: int) -> str:
    """The regular file an open descriptor writes to (Linux), or "" for anything else (a pipe, a terminal,
    the rank's redirected output on descriptors 0-2)."""
    try:
        if fd <= 2 or not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.readlink(f"/proc/self/fd/{fd}")
    except (OSError, TypeError, ValueError):
        return ""


def _complete(data: bytes) -> bool:
    """True if ``data`` is a whole checkpoint: ``torch.load`` reads it."""
    try:
        torch.load(io.BytesIO(data), weights_only=False)
    except Exception:  # noqa: BLE001 - any failure to read means a torn file
        return False
    return True


class DiskWatch:
    """Counts what this rank writes to disk while ``watching``; with :meth:`drill`, looks for a :class:`Tear`."""

    def __init__(self, before_first_write: Callable[[], None] = lambda: None) -> None:
        self.watching = False
        self.written: dict[str, int] = {}  # file -> bytes written to it while watching
        self.before_first_write = before_first_write
        self.target, self.previous, self.tear = "", b"", None
        self._drilling = False

    @contextmanager
    def drill(self, target: str) -> Iterator[None]:
        """While the block runs, look after each piece written for a crash point that tears ``target``."""
        self.target, self.tear = os.path.abspath(target), None
        self.previous = _read(self.target) or b""
        self._drilling = True
        try:
            yield
        finally:
            self._drilling = False
        self.crash_point("the end of save_checkpoint", self.target)

    def crash_point(self, how: str, into: str) -> None:
        """Would a crash now leave a complete checkpoint at the target? Records the first point where not."""
        if not self._drilling or self.tear is not None:
            return
        now = _read(self.target)
        if now is not None and (now == self.previous or _complete(now)):
            return
        self.tear = Tear(sum(self.written.values()), how, into, -1 if now is None else len(now))

    def wrote(self, path: str, nbytes: int, how: str) -> None:
        """``nbytes`` reached ``path`` on disk (``how``): counted, then a crash point."""
        self.written[path] = self.written.get(path, 0) + nbytes
        self.crash_point(how, path)

    def before_write(self) -> None:
        """Called before this rank's first bytes reach the disk (rank 0 waits there for rank 1, see check.py)."""
        if not self.written:
            self.before_first_write()

    def reset(self) -> None:
        self.written = {}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:  # the real open: reading is not watched
            return handle.read()
    except OSError:
        return None


class WatchedFile:
    """A file opened for writing while watched: each write reaches the disk in flushed pieces, each counted."""

    def __init__(self, inner: Any, path: str, watch: DiskWatch) -> None:
        self._inner, self._path, self._watch = inner, path, watch

    def write(self, data: Any) -> int:
        if isinstance(data, str):
            self._watch.before_write()
            count = self._inner.write(data)
            self._inner.flush()
            self._watch.wrote(self._path, len(data.encode()), "a write")
            return count
        view = memoryview(data).cast("B")
        self._watch.before_write()
        for start in range(0, max(len(view), 1), PIECE):
            self._inner.write(view[start:start + PIECE])
            self._inner.flush()
            self._watch.wrote(self._path, len(view[start:start + PIECE]), "a write")
        return len(view)

    def __enter__(self) -> WatchedFile:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._inner.__exit__(*exc)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextmanager
def watched(watch: DiskWatch) -> Iterator[None]:
    """While the block runs, route this process's file writes through ``watch`` (when it is ``watching``):
    ``open``/``io.open``/``os.fdopen`` in a writing mode, ``os.write``, ``os.sendfile`` (``shutil.copy`` on
    Linux), ``os.remove``/``os.unlink``, and ``torch.save`` (installed before the student's file is loaded,
    so ``from torch import save`` is watched too)."""
    originals = {"open": builtins.open, "io_open": io.open, "write": os.write, "sendfile": os.sendfile,
                 "remove": os.remove, "unlink": os.unlink, "save": torch.save}

    def watched_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = originals["open"](file, mode, *args, **kwargs)
        if not watch.watching or not any(flag in mode for flag in _WRITING):
            return handle
        path = _fd_path(file) if isinstance(file, int) else os.fsdecode(os.path.abspath(os.fspath(file)))
        return WatchedFile(handle, path, watch) if path else handle

    def watched_write(fd: int, data: Any) -> int:
        path = _fd_path(fd) if watch.watching else ""
        if not path:
            return originals["write"](fd, data)
        watch.before_write()
        count = originals["write"](fd, memoryview(data).cast("B")[:PIECE])
        watch.wrote(path, count, "a write")
        return count  # a short write, as os.write may return: the caller writes the rest

    def watched_sendfile(out_fd: int, in_fd: int, offset: Any, count: int, *args: Any) -> int:
        path = _fd_path(out_fd) if watch.watching else ""
        if not path:
            return originals["sendfile"](out_fd, in_fd, offset, count, *args)
        watch.before_write()
        sent = originals["sendfile"](out_fd, in_fd, offset, min(count, PIECE), *args)
        watch.wrote(path, sent, "a file copy")
        return sent  # shutil's copy loop sends the rest

    def watched_remove(path: Any, *args: Any, **kwargs: Any) -> None:
        originals["remove"](path, *args, **kwargs)
        if watch.watching:
            watch.crash_point("a removal", os.path.abspath(os.fsdecode(path)))

    def watched_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if not watch.watching or not _on_disk(f):
            return originals["save"](obj, f, *args, **kwargs)  # all_gather_object saves to memory: not counted
        buffer = io.BytesIO()
        originals["save"](obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        if isinstance(f, (str, os.PathLike)):
            with watched_open(f, "wb") as handle:
                _save_pieces(handle, data)
        else:
            _save_pieces(f if isinstance(f, WatchedFile) else WatchedFile(f, _fd_path(f.fileno()), watch), data)
        return None

    builtins.open = io.open = watched_open
    os.write, os.sendfile, torch.save = watched_write, watched_sendfile, watched_save
    os.remove = os.unlink = watched_remove
    try:
        yield
    finally:
        builtins.open, io.open, os.write = originals["open"], originals["io_open"], originals["write"]
        os.sendfile, torch.save = originals["sendfile"], originals["save"]
        os.remove, os.unlink = originals["remove"], originals["unlink"]


def _on_disk(f: Any) -> bool:
    """True if ``f`` names a file or is an open file on disk (not an in-memory buffer)."""
    if isinstance(f, (str, os.PathLike, WatchedFile)):
        return True
    try:
        return bool(_fd_path(f.fileno()))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _save_pieces(handle: WatchedFile, data: bytes) -> None:
    """torch.save's bytes written through ``handle``, named as torch.save's at each crash point."""
    handle._watch.before_write()
    view = memoryview(data)
    for start in range(0, max(len(view), 1), PIECE):
        handle._inner.write(view[start:start + PIECE])
        handle._inner.flush()
        handle._watch.wrote(handle._path, len(view[start:start + PIECE]), "torch.save")


__all__ = ["PIECE", "DiskWatch", "Tear", "WatchedFile", "watched"]
