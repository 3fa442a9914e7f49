"""The one capped output reader: keep the head and a tail of a stream of output, count every byte.

A run that floods its output must neither block on a full pipe nor fill the reader's memory, and what is kept
must hold both how it started and how it ended (a traceback is at the end). The stream is either a pipe, drained
on a thread to its end, or a file that a process writes and that is read as it grows (:meth:`Capped.read_new`):
a file survives its writers and never blocks them, so the ranks of :func:`course.runtime.launch.launch` write
their stderr to one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import IO

#: How the dropped middle is marked; ``{dropped}`` is its size in bytes.
DROPPED = "\n[{dropped} bytes of output dropped here]\n"


class Capped:
    """Keeps the head and a tail of ``source``: a pipe read to its end on a daemon thread, or a growing file.

    Args:
        source: a binary stream such as ``Popen.stdout`` (closed when read to its end), or the path of a file
            that is read only when :meth:`read_new` is called (it need not exist yet).
        head_bytes: the first bytes kept; ``None`` keeps everything (no tail needed then).
        tail_bytes: the last bytes kept of what came after the head.
        marker: put between head and tail when bytes were dropped (see :data:`DROPPED`).

    ``total`` counts every byte read so far (a watchdog may read it while the pipe is drained).
    """

    def __init__(self, source: IO[bytes] | str | os.PathLike, head_bytes: int | None = None, tail_bytes: int = 0,
                 marker: str = DROPPED) -> None:
        if head_bytes is not None and (head_bytes < 0 or tail_bytes < 0):
            raise ValueError(f"head_bytes and tail_bytes must be >= 0, got {head_bytes} and {tail_bytes}")
        self.total = 0
        self._head, self._tail = bytearray(), bytearray()
        self._head_limit, self._tail_limit = head_bytes, tail_bytes
        self._marker = marker
        self._thread: threading.Thread | None = None
        if isinstance(source, (str, os.PathLike)):
            self._path: str | os.PathLike | None = source
        else:
            self._path = None
            self._thread = threading.Thread(target=self._drain, args=(source,), daemon=True)
            self._thread.start()

    @classmethod
    def split(cls, source: IO[bytes] | str | os.PathLike, limit: int, marker: str = DROPPED) -> Capped:
        """Keep ``limit`` bytes in all: a tail of a quarter of it (at most 8 KiB), the rest from the head."""
        tail = min(limit // 4, 8192)
        return cls(source, limit - tail, tail, marker)

    def _drain(self, pipe: IO[bytes]) -> None:
        with contextlib.suppress(ValueError, OSError), pipe:  # ValueError, OSError: closed under us
            while chunk := pipe.read1(65536):
                self._keep(chunk)

    def read_new(self, whole_lines: bool = False) -> bytes:
        """Read what the followed file gained since the last call, keep it (capped), and return all of it.

        Args:
            whole_lines: stop after the last newline; a partial line is left for the next call.

        Returns ``b""`` while the file does not exist (or cannot be read).

        Raises:
            TypeError: this reader drains a pipe, which its thread reads by itself.
        """
        if self._path is None:
            raise TypeError("read_new() reads a followed file, but this Capped drains a pipe on its own thread; "
                            "call text() for what it kept.")
        try:
            with open(self._path, "rb") as handle:
                handle.seek(self.total)
                new = handle.read()
        except OSError:
            return b""
        if whole_lines:
            new = new[:new.rfind(b"\n") + 1]
        self._keep(new)
        return new

    def _keep(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self._head_limit is None:
            self._head += chunk
            return
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_limit:
            self._tail = (self._tail + chunk)[-self._tail_limit:]

    @property
    def kept(self) -> int:
        """Bytes kept (head and tail): ``total - kept`` were dropped."""
        return len(self._head) + len(self._tail)

    def text(self, wait_s: float = 5.0) -> str:
        """What was kept, decoded (UTF-8, bad bytes replaced), the marker where bytes were dropped.

        For a pipe, waits up to ``wait_s`` for its end: a process that escaped a kill may still hold it open.
        For a followed file, what :meth:`read_new` has read so far.
        """
        if self._thread is not None:
            self._thread.join(timeout=wait_s)
        dropped = self.total - self.kept
        middle = self._marker.format(dropped=dropped) if dropped > 0 else ""
        return bytes(self._head).decode("utf-8", "replace") + middle + bytes(self._tail).decode("utf-8", "replace")
