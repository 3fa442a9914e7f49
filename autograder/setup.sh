#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder's image. The zip (see the README,
# "Grading the assignment") is unpacked in /autograder/source: this script, run_autograder, pyproject.toml,
# course/, grader/ and notebooks/assignment/ (the starter and skeleton the grader recognises).
set -euo pipefail

SOURCE="${AUTOGRADER_ROOT:-/autograder}/source"
VENV="${AUTOGRADER_ROOT:-/autograder}/venv"

if ! command -v python3 >/dev/null || ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null \
        || ! python3 -m venv --help >/dev/null 2>&1; then
    apt-get update
    apt-get install -y --no-install-recommends python3 python3-venv python3-pip
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
# Gradescope's machines have no GPU: the CPU build of torch (a tenth of the download); the grader emulates 4 GPUs.
"$VENV/bin/pip" install torch --index-url https://download.pytorch.org/whl/cpu
# Editable, so the grader finds notebooks/assignment/ next to its package, as in the course's repository.
"$VENV/bin/pip" install -e "$SOURCE"
"$VENV/bin/python" -c 'import grader.cli'  # fail the image build now, not every submission later
# The instructor's secret (grader/secret.py): every submission's evaluation data is drawn from it. Made here once,
# at random, readable by root only; the graded scripts run as other users and never receive it.
"$VENV/bin/python" -m grader.secret "${GRADER_SECRET_FILE:-${AUTOGRADER_ROOT:-/autograder}/grader-secret}"
