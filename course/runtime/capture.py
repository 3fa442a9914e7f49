"""The one capped output reader: drain a pipe on a thread, keep its head and a tail, count every byte.

A run that floods its output must neither block on a full pipe nor fill the reader's memory, and what is kept
must hold both how it started and how it ended (a traceback is at the end). Used by
:func:`course.runtime.process.run` (so by :func:`course.ddp.run_torchrun`, :func:`course.monitor.run_and_watch`
and :mod:`grader.sandbox`) and by :mod:`grader.launcher` for each rank's streams.
"""

from __future__ import annotations

import contextlib
import threading
from typing import IO

#: How the dropped middle is marked; ``{dropped}`` is its size in bytes.
DROPPED = "\n[{dropped} bytes of output dropped here]\n"


class Capped:
    """Reads ``pipe`` (a binary stream) to its end on a daemon thread.

    Args:
        pipe: e.g. ``Popen.stdout`` opened in binary mode; closed when read to its end.
        head_bytes: the first bytes kept; ``None`` keeps everything (no tail needed then).
        tail_bytes: the last bytes kept of what came after the head.
        marker: put between head and tail when bytes were dropped (see :data:`DROPPED`).

    ``total`` counts every byte read so far (a watchdog may read it while the pipe is drained).
    """

    def __init__(self, pipe: IO[bytes], head_bytes: int | None = None, tail_bytes: int = 0,
                 marker: str = DROPPED) -> None:
        if head_bytes is not None and (head_bytes < 0 or tail_bytes < 0):
            raise ValueError(f"head_bytes and tail_bytes must be >= 0, got {head_bytes} and {tail_bytes}")
        self.total = 0
        self._head, self._tail = bytearray(), bytearray()
        self._head_limit, self._tail_limit = head_bytes, tail_bytes
        self._marker = marker
        self._pipe = pipe
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    @classmethod
    def split(cls, pipe: IO[bytes], limit: int, marker: str = DROPPED) -> Capped:
        """Keep ``limit`` bytes in all: a tail of a quarter of it (at most 8 KiB), the rest from the head."""
        tail = min(limit // 4, 8192)
        return cls(pipe, limit - tail, tail, marker)

    def _drain(self) -> None:
        with contextlib.suppress(ValueError, OSError), self._pipe:  # ValueError, OSError: closed under us
            while chunk := self._pipe.read1(65536):
                self._keep(chunk)

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

        Waits up to ``wait_s`` for the end of the pipe: a process that escaped a kill may still hold it open.
        """
        self._thread.join(timeout=wait_s)
        dropped = self.total - self.kept
        middle = self._marker.format(dropped=dropped) if dropped > 0 else ""
        return bytes(self._head).decode("utf-8", "replace") + middle + bytes(self._tail).decode("utf-8", "replace")
