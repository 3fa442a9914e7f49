"""What processes a test left behind."""

from __future__ import annotations

import psutil


def live_children() -> list[psutil.Process]:
    """This process's live descendants, less multiprocessing's long-lived resource tracker.

    The tracker is started by the first spawned process of a session (course.runtime.launch does that) and lives as
    long as the session by design, so it is no leak.
    """
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found
