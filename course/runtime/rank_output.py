"""How a launched rank's output reaches the notebook, while it runs, each line prefixed ``[rank k]``.

A rank's stdout is :class:`RankOutput`, which sends each completed line to the launcher over the launch's
channel. Its stderr (fd 2, so also what C++ code and the processes it starts write) goes to a file
(:func:`stderr_to` while the rank starts), which :class:`StderrRelay` follows through
:class:`~course.runtime.capture.Capped` readers and copies to the notebook as it grows: a file, not a pipe, so that
a DataLoader worker the rank started can keep writing after the rank is gone without blocking on a pipe nobody
drains. Taught in ``notebooks/00_start_here.ipynb``.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

from course.runtime import paths
from course.runtime.capture import Capped

#: Bytes of each rank's stderr kept for the error that blames it (a head and a tail); the notebook sees it all.
STDERR_KEPT_BYTES = 64 * 1024


class RankOutput(io.TextIOBase):
    """Stands in for a rank's stdout: sends each completed line to the launcher, as ``("out", "[rank k] line\\n")``."""

    def __init__(self, rank: int, channel: Any) -> None:
        self._prefix = f"[rank {rank}] "
        self._channel = channel
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._channel.put(("out", self._prefix + line + "\n"))
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._channel.put(("out", self._prefix + self._partial + "\n"))
            self._partial = ""


@contextlib.contextmanager
def stderr_to(path: str) -> Iterator[None]:
    """Point this process's fd 2 at ``path`` while a rank starts: the rank, and all it starts, write there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as target:
        os.dup2(target.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class StderrRelay:
    """Copies each rank's stderr file to ``sys.stderr`` (so it reaches a notebook), each line prefixed by rank.

    Args:
        paths: rank ``k``'s stderr file is ``paths[k]``; it need not exist yet.
        start_up: the file where ranks write before they know their rank (the fork server's stderr): a rank
            that fails while its process starts, such as on an import error, writes its traceback there.
    """

    def __init__(self, paths: list[str], start_up: str | None = None) -> None:
        self.paths = paths
        self._readers = [Capped.split(path, STDERR_KEPT_BYTES) for path in paths]
        self._start_up = Capped.split(start_up, STDERR_KEPT_BYTES) if start_up else None

    def relay(self, final: bool = False, failed: int | None = None) -> None:
        """Write what the ranks added since the last call; whole lines only, unless ``final``.

        After rank ``failed`` failed, the other ranks' new lines are the echo of its failure (gloo's
        "Connection reset by peer" as its peers were stopped): they are counted, not shown.
        """
        for rank in range(len(self.paths)):
            self._relay(rank, final, failed)
        self._relay_start_up(final)

    def _relay(self, rank: int, final: bool, failed: int | None) -> None:
        lines = self._readers[rank].read_new(whole_lines=not final).decode(errors="replace").splitlines()
        if failed is not None and rank != failed and lines:
            sys.stderr.write(f"[rank {rank}] ({len(lines)} line(s) of stderr written as it was stopped "
                             f"after rank {failed} failed: not shown)\n")
            return
        for line in lines:
            sys.stderr.write(f"[rank {rank}] {paths.shorten(line)}\n")

    def _relay_start_up(self, final: bool) -> None:
        if self._start_up is not None:
            for line in self._start_up.read_new(whole_lines=not final).decode(errors="replace").splitlines():
                sys.stderr.write(f"[rank start-up] {paths.shorten(line)}\n")

    def tail(self, rank: int, lines: int = 40) -> str:
        """The end of a rank's stderr (which is relayed first), from its last traceback if it printed one."""
        self._relay(rank, final=True, failed=None)
        return _last_traceback(self._readers[rank].text(), lines)

    def start_up_tail(self, lines: int = 40) -> str:
        """The end of what ranks wrote while their processes started (relayed first), from its last traceback."""
        if self._start_up is None:
            return ""
        self._relay_start_up(final=True)  # only this stream: the ranks' last lines wait for relay(failed=...)
        return _last_traceback(self._start_up.text(), lines)


def _last_traceback(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``, from its last traceback if it holds one."""
    text = paths.shorten(text.rstrip())
    return "\n".join(text[max(0, text.rfind("Traceback (most recent call last)")):].splitlines()[-lines:])
