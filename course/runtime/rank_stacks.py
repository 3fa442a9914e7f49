"""Where is a rank stuck? Its Python stack, asked for by signal, tells a hung rank from the peers waiting for it.

A rank blocked in a collective (``all_reduce``, ``barrier``) is waiting for a peer that never came; the rank
elsewhere (sleeping, computing, in an endless loop) is the one at fault. :func:`answer_requests` is called in each
rank at start; on a timeout the launcher calls :func:`where_blocked`. Taught in ``notebooks/00_start_here.ipynb``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import threading
import time
from typing import Any

#: The launcher sends this to a rank to learn where it is stuck (see answer_requests).
STACK_SIGNAL = signal.SIGUSR1
_THREAD = re.compile(r"(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'\s+File "(.*)", line \d+ in (\S+)')
#: The one interceptor's wrappers (course.runtime.intercept) stand between torch's functions and what they call
#: (``work.wait()`` inside ``all_reduce``): a frame of theirs is passed over, as if torch called torch directly.
_INTERCEPTOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intercept.py")


def answer_requests(path: str) -> None:
    """On :data:`STACK_SIGNAL`, write every thread's Python stack to ``path``.

    faulthandler writes from the C signal handler, so this works while the rank is blocked inside a collective
    (a Python-level handler would wait for the collective to return). The first line names the main thread.
    """
    stacks = open(path, "w")  # noqa: SIM115 - faulthandler holds it open for the life of the rank
    stacks.write(f"main thread {threading.main_thread().ident:#x}\n")
    stacks.flush()
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)


def collective_in(stacks: str) -> str | None:
    """The ``torch.distributed`` function the main thread of a faulthandler dump is blocked in, else None."""
    lines = stacks.splitlines()
    if not lines or not lines[0].startswith("main thread "):
        return None
    main, thread = int(lines[0].split()[-1], 16), None
    for line in lines[1:]:
        if header := _THREAD.match(line):
            thread = int(header[1], 16)
        elif thread == main and (frame := _FRAME.match(line)) and frame[1] != _INTERCEPTOR:  # innermost first
            return frame[2] if "/torch/distributed/" in frame[1].replace(os.sep, "/") else None
    return None


def where_blocked(processes: list[Any], ranks: list[int], run_dir: str, wait_s: float = 5.0
                  ) -> dict[int, str]:
    """Ask each of ``ranks`` for its stack; return the collective each one that is in a collective waits in."""
    paths = {rank: os.path.join(run_dir, f"rank-{rank}.stacks") for rank in ranks}
    asked = []
    for rank in ranks:
        with contextlib.suppress(OSError, TypeError):  # TypeError: never started (pid None)
            os.kill(processes[rank].pid, STACK_SIGNAL)
            asked.append(rank)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not all("most recent call first" in read_text(paths[r]) for r in asked):
        time.sleep(0.05)
    time.sleep(0.1)  # let a dump that has begun finish
    found = {rank: collective_in(read_text(paths[rank])) for rank in asked}
    return {rank: where for rank, where in found.items() if where is not None}


def read_text(path: str) -> str:
    """The text of ``path``, or ``""`` if it cannot be read (not written yet, or gone)."""
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""
