"""Gradescope's entry point: ``python -m grader.run_autograder`` (the ``run_autograder`` script calls it).

Reads ``/autograder/submission`` and writes ``/autograder/results/results.json``; ``--submission`` and
``--results`` override the paths. Same as ``grader gradescope``.
"""

import sys

from grader.cli import main

if __name__ == "__main__":
    sys.exit(main(["gradescope", *sys.argv[1:]]))
