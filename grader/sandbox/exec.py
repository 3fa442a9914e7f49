"""The last step into a sandboxed command: its rlimits, its identity, then exec. Standard library only.

Both isolation backends of :mod:`grader.sandbox` end here: bubblewrap runs ``python -I exec.py CONFIG``
as its command, and the in-house fallback (:mod:`grader.sandbox.namespaces`) calls :func:`exec_command` in
the process it forked for the command. Never a ``preexec_fn``, which is unsafe when the grader runs threads.
A setup error is printed on stderr and the process exits 127 (the sandbox's classifier reads it).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

PR_SET_NO_NEW_PRIVS = 38


def exec_command(config: dict) -> None:
    """In the command's process: limits, identity, then exec ``config["argv"]``; returns only on failure.

    ``config``: ``argv``, ``cwd``, ``uid`` (a sandbox uid to become, or None), ``nproc`` (RLIMIT_NPROC) and
    ``limits`` (:class:`course.runtime.outcome.Limits` as a dict).
    """
    limits = config["limits"]
    try:
        os.chdir(config["cwd"])
        lower_limit("RLIMIT_DATA", limits["memory_bytes"], limits["memory_bytes"])
        lower_limit("RLIMIT_NPROC", config["nproc"], config["nproc"])
        lower_limit("RLIMIT_FSIZE", limits["file_size_bytes"], limits["file_size_bytes"])
        lower_limit("RLIMIT_CPU", limits["cpu_s"], limits["cpu_s"] + 5)  # SIGXCPU first, SIGKILL 5 s later
        lower_limit("RLIMIT_CORE", 0, 0)
        if sys.platform == "linux" and ctypes.CDLL(None).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")  # setuid programs (su, ping) must gain nothing
        if config["uid"] is not None:
            os.setgroups([])
            os.setresgid(config["uid"], config["uid"], config["uid"])
            os.setresuid(config["uid"], config["uid"], config["uid"])
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores these; the command gets the defaults
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    except Exception as e:
        print(f"sandbox: could not prepare the program's process: {e!r}", file=sys.stderr, flush=True)
        return
    try:
        os.execvp(config["argv"][0], config["argv"])
    except OSError as e:
        print(f"sandbox: cannot run {config['argv'][0]!r}: {e}", file=sys.stderr, flush=True)


def lower_limit(name: str, soft: int, hard: int) -> None:
    """setrlimit, never above the hard limit already in force (without root, hard limits only go down)."""
    if not hasattr(resource, name):
        return
    which = getattr(resource, name)
    current = resource.getrlimit(which)[1]
    if current != resource.RLIM_INFINITY:
        hard = min(hard, current)
    resource.setrlimit(which, (min(soft, hard), hard))


if __name__ == "__main__":
    exec_command(json.loads(sys.argv[1]))
    sys.exit(127)
