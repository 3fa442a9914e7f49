"""A process tree shaped like a torchrun job, for tests/monitor/test_watch.py.

``python monitor_tree.py SECONDS ROLE [ROLE ...]`` starts one child per ROLE with ``LOCAL_RANK`` = its position
in its environment (as torchrun's workers have) and waits for them. Roles:

* ``busy``: spins on the CPU for SECONDS.
* ``sleep``: sleeps for SECONDS.
* ``loader``: sleeps itself but starts a busy grandchild (a DataLoader worker: it inherits ``LOCAL_RANK``).

Every process writes its pid, one line each, to the file named by ``$MONITOR_TREE_PIDS`` if set.
A negative SECONDS means forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def _note_pid() -> None:
    path = os.environ.get("MONITOR_TREE_PIDS")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


def _act(role: str, seconds: float) -> None:
    end = time.monotonic() + seconds if seconds >= 0 else float("inf")
    if role == "loader":
        worker = subprocess.Popen([sys.executable, __file__, "--act", "busy", str(seconds)])
        time.sleep(max(0.0, min(end - time.monotonic(), 1e6)))
        worker.wait()
    elif role == "busy":
        while time.monotonic() < end:
            pass
    else:
        time.sleep(max(0.0, min(end - time.monotonic(), 1e6)))


def main(argv: list[str]) -> None:
    _note_pid()
    if argv[0] == "--act":
        _act(argv[1], float(argv[2]))
        return
    seconds, roles = argv[0], argv[1:]
    children = [subprocess.Popen([sys.executable, __file__, "--act", role, seconds],
                                 env={**os.environ, "LOCAL_RANK": str(local_rank)})
                for local_rank, role in enumerate(roles)]
    for child in children:
        child.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
