#!/usr/bin/env bash
# Build the zip for Gradescope's "Configure Autograder" page: setup.sh and run_autograder at its root, next to
# what they install (pyproject.toml, README.md, course/, grader/, notebooks/assignment/).
#   autograder/make_zip.sh [OUT.zip]          (default: ./autograder.zip)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
out="$(realpath -m "${1:-autograder.zip}")"
rm -f "$out"
extra=()
[ -f "$here/torch-index-url" ] && extra+=(torch-index-url)  # setup.sh's torch index, if the instructor set one
(cd "$here" && zip -q "$out" setup.sh run_autograder "${extra[@]}")
(cd "$repo" && zip -q -r "$out" pyproject.toml README.md course grader notebooks/assignment \
    -x '*__pycache__*' '*.pyc')
echo "$out"
