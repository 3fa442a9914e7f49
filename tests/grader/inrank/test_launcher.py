"""grader.inrank.launcher, graded for real: a rank can read neither the launcher's memory (the run's key), nor a
descriptor it inherited from the launcher (a rank is a fork of it), nor the instructor's secret."""

import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from grader import sandbox, secret
from grader.assignment import ASSIGNMENT
from grader.runner import GradingConfig, grade

pytestmark = [pytest.mark.unit6, pytest.mark.slow, pytest.mark.timeout(180)]

SNOOP = '''"""Hostile: reads its launcher's memory, where the run's key is, and the grader's secret file."""
import os

import torch  # noqa: F401  (the grader wants a training script)

launcher = os.getppid()
for name in ("mem", "environ"):
    try:
        with open(f"/proc/{launcher}/{name}", "rb"):
            print(f"launcher {name}: opened")
    except OSError as error:
        print(f"launcher {name}: refused ({error.strerror})")
for fd in range(3, 1024):
    try:
        os.read(fd, 64)
        print(f"descriptor {fd}: readable")
    except OSError:  # not open (EBADF), or a write end (EBADF too)
        pass
try:
    print(f"secret: read {len(open(SECRET).read())} characters")
except OSError as error:
    print(f"secret: refused ({error.strerror})")
'''


def mount_namespace(cwd: Path) -> bool:
    """The sandbox here has a mount namespace (root, or unprivileged user namespaces), so it can hide files."""
    result = sandbox.run([sys.executable, "-c", "pass"], cwd=cwd, env=dict(os.environ))
    return "mount namespace" in result.mechanisms


def test_a_rank_reads_neither_the_launchers_memory_nor_the_secret(tmp_path, monkeypatch):
    folder = Path(tempfile.mkdtemp())  # reachable by the sandbox's uid (0755), unlike pytest's tmp_path
    try:
        folder.chmod(0o755)
        path = folder / "grader-secret"
        monkeypatch.setenv(secret.SECRET_FILE_ENV, str(path))
        monkeypatch.delenv(secret.SECRET_ENV, raising=False)
        secret.ensure()
        path.chmod(0o644)  # readable by every user: only the sandbox can keep it from the ranks
        script = tmp_path / "train_4gpu.py"
        script.write_text(SNOOP.replace("SECRET", repr(str(path))))
        results = grade(script, GradingConfig(assignment=replace(ASSIGNMENT, world_size=1)))
    finally:
        shutil.rmtree(folder)
    output = results.output
    assert "launcher mem: refused" in output and "launcher environ: refused" in output, output
    assert "readable" not in output, output
    if mount_namespace(tmp_path):
        assert "secret: read 0 characters" in output, output


SLOW_RANK = '''"""Rank 0 computes for 6 s of CPU after the others have ended: behind, but working."""
import os, time
import torch  # noqa: F401  (the grader wants a training script)

if os.environ["RANK"] == "0":
    end = time.process_time() + 6.0
    while time.process_time() < end:
        pass
print("rank", os.environ["RANK"], "done", flush=True)
'''
STUCK_RANK = '''"""Rank 0 sleeps while the others wait for it in a barrier: no rank makes progress."""
import os, time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    time.sleep(600)
dist.barrier()
'''


def test_a_rank_that_is_behind_but_working_is_waited_for_not_called_hung(tmp_path):
    # the no-progress window is 2 s; rank 0 ends 6 s of CPU (however long that takes here) after the others
    script = tmp_path / "train_4gpu.py"
    script.write_text(SLOW_RANK)
    results = grade(script, GradingConfig(idle_s=2.0))
    assert results.status == "ok", results.detail
    assert "rank 0 done" in results.output


def test_ranks_blocked_with_no_progress_are_called_hung_naming_the_one_the_others_wait_for(tmp_path):
    script = tmp_path / "train_4gpu.py"
    script.write_text(STUCK_RANK)
    results = grade(script, GradingConfig(idle_s=2.0))
    assert results.status == "hang on rank 0", results.detail
    assert results.detail.startswith("no rank made progress for 2 s")
    assert "rank 1 waits in barrier()" in results.detail


WRONG_PEER = '''"""Each rank sends to rank + 2 (meant for rank + 1), then waits to receive from rank - 1."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
dist.isend(torch.ones(2), (rank + 2) % size)
dist.irecv(torch.zeros(2), (rank - 1) % size).wait()
'''


def test_ranks_waiting_for_messages_sent_elsewhere_are_called_hung_naming_whom_each_waits_for(tmp_path):
    script = tmp_path / "train_4gpu.py"
    script.write_text(WRONG_PEER)
    results = grade(script, GradingConfig(idle_s=2.0))
    assert results.status == "hang on rank 0, 1, 2, 3", results.detail
    assert "rank 1 waits to receive from rank 0 (its irecv number 1 from rank 0; rank 0 had sent it 0)" \
        in results.detail
    assert "rank 0 sent 1 message(s) to rank 2, which never receives from rank 0" in results.detail
