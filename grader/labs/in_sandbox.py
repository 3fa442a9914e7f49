"""Inside the sandbox: check one lab file and write the verdict to a pipe only the grader reads.

    python -m grader.labs.in_sandbox ring ring_allreduce.py --result-fd 5 [--hidden] [--student-id ID ...]

Runs :func:`grader.labs.run_lab` (which starts the ranks and cross-checks their outputs here, in this process,
where no student code runs) and writes its :meth:`~grader.results.LabResult.to_dict` as one JSON document
to ``--result-fd``. The ranks are started with spawn, which passes them no inherited descriptor
but their own: they cannot write to that pipe. Started by :mod:`grader.labs.grade`.
"""

from __future__ import annotations

import argparse
import json
import os

from grader.labs import get, run_lab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.labs.in_sandbox")
    parser.add_argument("lab")
    parser.add_argument("file")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--hidden", action="store_true")
    parser.add_argument("--student-id", action="append", default=[], help="who the submission is from (repeatable)")
    args = parser.parse_args(argv)
    with os.fdopen(args.result_fd, "w") as out:
        os.set_inheritable(args.result_fd, False)  # never passed on to a process this one starts
        result = run_lab(get(args.lab), args.file, hidden=args.hidden, student_ids=tuple(args.student_id))
        json.dump(result.to_dict(), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
