"""A grading run stopped from outside: a true status, the output so far, and --resume grades it again.

Real runs, killed while their ranks sleep: `grader grade` gets SIGTERM (as from `kill`, systemd or a CI job
being cancelled), and the launcher that holds the ranks' output gets SIGKILL from one of its ranks.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grader import gradebook
from grader.checks import CHECKS
from grader.results import Results
from grader.runner import GRADER_STOPPED, GradingConfig, grade
from grader.sandbox import Limits

pytestmark = [pytest.mark.unit6, pytest.mark.slow, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
SLEEPER = """import os, time
import torch

rank = int(os.environ["RANK"])
print(f"rank {rank} is training", flush=True)
open(f"started-{rank}", "w").close()
for _ in range(1200):  # working (it prints), so the grader waits for it: only the stop request ends it
    time.sleep(0.5)
    print(".", end="", flush=True)
"""
PARRICIDE = """import os, signal, time
import torch

rank = int(os.environ["RANK"])
print(f"rank {rank} is training", flush=True)
time.sleep(3)
if rank == 0:
    os.kill(os.getppid(), signal.SIGKILL)  # the launcher, which holds every rank's output
time.sleep(600)
"""


def wait_for_ranks(parent: psutil.Process, timeout_s: float = 120.0) -> list[psutil.Process]:
    """The processes under ``parent`` once every rank has written its started-<rank> file (in its cwd)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tree = parent.children(recursive=True)
        for process in tree:
            try:
                if all(Path(process.cwd(), f"started-{r}").exists() for r in range(4)):
                    return tree
            except (psutil.Error, OSError):
                continue
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start within {timeout_s:g} s")


def test_sigterm_to_grader_grade_keeps_the_output_and_says_interrupted(tmp_path):
    folder, out = tmp_path / "class", tmp_path / "out"
    folder.mkdir()
    (folder / "slow.py").write_text(SLEEPER)
    grader = subprocess.Popen([sys.executable, "-c", "import sys; from grader.cli import main; sys.exit(main())",
                               "grade", str(folder), "-o", str(out), "-j", "1"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tree = wait_for_ranks(psutil.Process(grader.pid))
        grader.send_signal(signal.SIGTERM)
        _, stderr = grader.communicate(timeout=60)
    finally:
        grader.kill()
    assert grader.returncode == 128 + signal.SIGTERM, stderr
    assert "--resume" in stderr
    results = Results.load(out / "results" / "slow.json")
    assert results.status == GRADER_STOPPED and "the grader was stopped" in results.detail
    assert "memory" not in results.detail
    assert "rank 0 is training" in results.output  # what the ranks printed before the stop is kept
    assert len(results.checks) == len(CHECKS) and not any(c.ran for c in results.checks)
    assert "interrupted" in (out / "gradebook.csv").read_text()
    assert gradebook.graded_before(out, {"slow.py": "slow"}) == {}  # --resume grades it again
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # nothing left behind


def test_a_killed_launcher_is_named_and_no_rank_outlives_it(tmp_path):
    script = tmp_path / "train_4gpu.py"
    script.write_text(PARRICIDE)
    start = time.monotonic()
    results = grade(script, GradingConfig(limits=Limits(wall_s=900.0)))
    assert results.status == "error" and "launcher" in results.detail and "SIGKILL" in results.detail
    assert "memory ran out" not in results.detail
    assert time.monotonic() - start < 450  # the ranks died with their launcher: they sleep 600 s, the limit is 900 s
