#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder's image. The zip (see docs/instructors.md,
# "Grading the assignment") is unpacked in /autograder/source: this script, run_autograder, pyproject.toml,
# course/, grader/ and notebooks/assignment/ (the starter and skeleton the grader recognises).
#
# The container (Gradescope's autograder settings): at least 1 CPU and 1.5 GB of memory. One submission takes about
# 1.0 GiB at its peak, all processes together, and 16-19 s of CPU (benchmarks/autograder_footprint.py): 4 ranks of
# about 150 MiB each, their launcher, the grader and the checkpoint's evaluation. Gradescope's default container
# (half a CPU, 768 MB) is too small in memory; on half a CPU a grading is slower, and the grader lengthens its own
# time limits to match (at most 4 times), so keep the per-submission timeout at 10 minutes or more.
#
# Settings (environment variables; each has a default that fits Gradescope):
#   TORCH_INDEX_URL       where pip finds torch. Default: the first line of the file torch-index-url next to this
#                         script if there is one, else https://download.pytorch.org/whl/cpu (the CPU builds)
#   AUTOGRADER_ROOT       the autograder's folder (default /autograder): source/ in it, the venv made in venv/
#   AUTOGRADER_PIP_OPTIONS  extra options for every pip install, e.g. "--no-index --find-links /wheels" offline
# An existing AUTOGRADER_ROOT/venv is kept (a pre-made environment); pip then installs only what it lacks.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"
# The course's tested range, the same as pyproject.toml's (tests/test_autograder_setup.py checks they agree and
# that torch 2.13.0, the build the course's CI installs, satisfies it): never an untested newer major version.
TORCH_REQUIREMENT="torch>=2.13,<3"
DEFAULT_INDEX="https://download.pytorch.org/whl/cpu"
if [ -z "${TORCH_INDEX_URL:-}" ] && [ -f "$HERE/torch-index-url" ]; then
    TORCH_INDEX_URL="$(grep -v '^[[:space:]]*\(#\|$\)' "$HERE/torch-index-url" | head -n 1 | tr -d '[:space:]')"
fi
TORCH_INDEX_URL="${TORCH_INDEX_URL:-$DEFAULT_INDEX}"
# a few quick retries, not pip's default of minutes, where the index cannot be reached
read -r -a PIP_OPTIONS <<< "--retries 2 --timeout 30 ${AUTOGRADER_PIP_OPTIONS:-}"

# bubblewrap: the grader's sandbox uses it for its namespaces and read-only file system where it is installed (it
# falls back to its own namespaces without it, so a failed install costs no grading).
if ! command -v bwrap >/dev/null; then
    { apt-get update && apt-get install -y --no-install-recommends bubblewrap; } ||
        echo "setup.sh: bubblewrap could not be installed; the grader uses its own namespaces instead"
fi
if [ ! -x "$VENV/bin/python" ]; then
    if ! command -v python3 >/dev/null || ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null \
            || ! python3 -m venv --help >/dev/null 2>&1; then
        apt-get update
        apt-get install -y --no-install-recommends python3 python3-venv python3-pip
    fi
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install "${PIP_OPTIONS[@]}" --upgrade pip
fi
echo "setup.sh: $TORCH_REQUIREMENT from $TORCH_INDEX_URL"
# Gradescope's machines have no GPU: the CPU build of torch (a tenth of the download); the grader emulates 4 GPUs.
# --index-url, not --extra-index-url: pip must not pick a newer CUDA build from PyPI instead.
"$VENV/bin/python" -m pip install "${PIP_OPTIONS[@]}" --index-url "$TORCH_INDEX_URL" "$TORCH_REQUIREMENT"
# Editable, so the grader finds notebooks/assignment/ next to its package, as in the course's repository.
"$VENV/bin/python" -m pip install "${PIP_OPTIONS[@]}" -e "$SOURCE"
"$VENV/bin/python" -c 'import grader.cli'  # fail the image build now, not every submission later
# The instructor's secret (grader/secret.py): every submission's evaluation data is drawn from it. Made here once,
# at random, readable by root only; the graded scripts run as other users and never receive it.
"$VENV/bin/python" -m grader.secret "${GRADER_SECRET_FILE:-${AUTOGRADER_ROOT:-/autograder}/grader-secret}"
