"""One rank of a graded run: install the trusted probes, then run the student's script as ``__main__``.

Started by :mod:`grader.inrank.launcher` once per rank, with torchrun's environment, as
``python -m grader.inrank.harness SCRIPT``. Before any student code runs it reads the run's key from the
descriptor in ``GRADER_KEY_FD`` and closes it, opens the record pipe from ``GRADER_RECORD_FD``, and
removes both variables; then it runs the script exactly as ``python SCRIPT`` would (``sys.argv`` is
``[SCRIPT]``: no arguments). Whatever the script does (returns, calls ``sys.exit``, raises) an ``end``
record says so; collectives that differ between ranks fail the rank even after the last sampled check
(:func:`run_script`). The seed it gets is :func:`probe_seed` of the grader's, never the grader's own: what the
student's process can see must not reveal the seed of the grader's evaluation.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import sys
import traceback

KEY_FD_ENV, RECORD_FD_ENV, SEED_ENV = "GRADER_KEY_FD", "GRADER_RECORD_FD", "GRADER_SEED"


def probe_seed(seed: int) -> int:
    """The seed handed to the student's processes (for the probes' fingerprints): one-way from ``seed``."""
    return int.from_bytes(hashlib.sha256(f"probes {seed}".encode()).digest()[:4], "big")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m grader.inrank.harness SCRIPT", file=sys.stderr)
        return 2
    from grader.inrank import channel

    key = channel.read_key(int(os.environ.pop(KEY_FD_ENV)))
    record_fd = int(os.environ.pop(RECORD_FD_ENV))
    os.set_inheritable(record_fd, False)  # DataLoader workers and subprocesses do not get the channel
    seed = int(os.environ.pop(SEED_ENV, "0"))
    rank = int(os.environ.get("RANK", "0"))
    writer = channel.Writer(record_fd, key, callers=(os.path.join(os.path.dirname(channel.__file__), "probes.py"),))
    del key

    from grader.inrank.probes import Probes

    probes = Probes(writer, rank, seed, run_dir=os.getcwd())  # the run directory, before the script can chdir
    probes.install()
    exit_code, how, error = run_script(argv[0])
    probes.finish(how, exit_code, error)
    sys.stdout.flush()
    return exit_code


def run_script(path: str) -> tuple[int, str, str | None]:
    """Run the script at ``path`` as ``python SCRIPT`` would; then, if it ended well, check NCCL's agreement rule
    on the process groups it left open (:func:`course.runtime.observed.settle`; a group it destroyed was checked
    then). So collectives that differ between ranks after the last sampled check fail the rank here, as they fail
    a rank of ``course.runtime.launch``.

    Returns:
        ``(exit_code, how, error)``: how it ended (``"returned"``, ``"raised"``, ``"sys.exit(3)"``) and the
        traceback of what it raised (the rule's error after a settle that failed), else None.
    """
    from course.runtime import observed

    script = os.path.abspath(path)
    sys.argv = [script]
    sys.path.insert(0, os.path.dirname(script))
    exit_code, how, error = 0, "returned", None
    try:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            code = stop.code
            exit_code = code if isinstance(code, int) else (0 if code is None else 1)
            how = f"sys.exit({code!r})"
        if exit_code == 0:
            observed.settle()  # collectives that differ after the last sampled agreement check fail here
    except BaseException:  # the student's exception (or the rule's): reported, then the rank fails as python would
        exit_code, how, error = 1, "raised", traceback.format_exc(limit=-8)
        print(error, file=sys.stderr, flush=True)
    return exit_code, how, error


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
