"""The environment a graded process starts in: which interpreter, which variables; nothing else leaks in.

The same for the run and for the checkpoint's evaluation. ``torch.compile`` runs without compiling there
(:data:`COMPILE_OFF`): it still returns its wrapper, whose state_dict keys carry ``_orig_mod.``, but the wrapped
model runs as written (torch's ``torch._dynamo.config.disable``, read from ``TORCH_COMPILE_DISABLE`` when torch is
imported). Compiling the course CNN takes minutes per rank on the grader's CPUs (128 s on one core, measured once)
and the run's result does not depend on it; the feedback says so when a run used it (:mod:`grader.runner`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from course import world

ROOT = Path(__file__).resolve().parent.parent  # holds the grader and course packages
COMPILE_OFF = {"TORCH_COMPILE_DISABLE": "1"}


def run_env() -> dict[str, str]:
    """The whole environment of a sandboxed process: the grader's own modules on the path, one thread,
    torch.compile off (:data:`COMPILE_OFF`), and nothing else of the grader's environment but the emulation
    switch and the visible GPUs."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8", **COMPILE_OFF}
    for name in (world.EMULATE_ENV, "CUDA_VISIBLE_DEVICES"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def python_argv() -> list[str]:
    """The interpreter to start a sandboxed Python process with."""
    # -P: the run directory (which the student's code can write) is not searched for grader modules
    return [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]
