"""tests/conftest.py's watchdog: a test that hangs holding the GIL still ends the run, with every stack printed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.mark.timeout(300)
def test_a_hang_that_holds_the_gil_ends_the_run_and_prints_where(tmp_path):
    # the hanging test runs in its own pytest, rooted in a copy of this folder's conftest (same watchdog)
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(TESTS / "watchdog_programs" / "test_holds_the_gil.py", tmp_path / "test_holds_the_gil.py")
    env = {**os.environ, "COURSE_WATCHDOG_GRACE_S": "3"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir",
                          str(tmp_path), str(tmp_path / "test_holds_the_gil.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    # ended (the test sleeps 600 s: only the watchdog, 5 s after its 2 s timeout, can end it before 240 s) ...
    assert run.returncode != 0
    printed = run.stdout + run.stderr
    # ... and said where: every thread's stack, the hung test's included
    assert "Timeout" in printed and "test_sleeps_holding_the_gil" in printed
