"""What processes a test left behind."""

from __future__ import annotations

import psutil


def live_children() -> list[psutil.Process]:
    """This process's live descendants, less multiprocessing's long-lived resource tracker and fork server.

    Both are started by the first launch of a session (course.runtime.launch) and live as long as the session by
    design, so they are no leak; the ranks forked from the server are its children, so they are still counted.
    """
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not _long_lived(" ".join(child.cmdline())):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def _long_lived(cmdline: str) -> bool:
    return "resource_tracker" in cmdline or "multiprocessing.forkserver" in cmdline
