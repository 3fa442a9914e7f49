"""The grader's in-rank probes record a training on a device that is not the CPU without failing (a probe that
fails writes a ``probe_error`` record), and the training they watch keeps its tensors on the rank's device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(300)
def test_the_probes_record_every_step_of_a_training_on_the_declared_device(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)])}
    result = subprocess.run([sys.executable, str(HERE / "probed_training.py"), str(tmp_path / "records")],
                            capture_output=True, text=True, timeout=280, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["device_errors"] == [] and seen["stopped"] == [""]
    assert "probe_error" not in seen["kinds"], result.stderr[-3000:]
    assert seen["kinds"][:2] == ["init", "initial"] and seen["kinds"].count("step") == 2
