"""course.cli and course.hello: `course info`, `course hello`, `course lab`."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from course import cli
from course.hello import hello
from course.launch import free_port, launch

pytestmark = pytest.mark.unit0


def test_info_names_the_hardware_backend_and_versions():
    text = "\n".join(cli.info_lines())
    assert "backend" in text and "torch" in text and "CPU core" in text


def test_info_runs_as_a_console_command():
    result = subprocess.run([sys.executable, "-m", "course.cli", "info"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "backend" in result.stdout


@pytest.mark.slow
def test_hello_world_on_four_ranks_all_reduces_correctly(capsys):
    reports = launch(hello, 4, timeout_s=120)
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert all(r["reduced"] == r["expected"] == 10 for r in reports)
    assert sum("[rank " in line for line in capsys.readouterr().out.splitlines()) == 4


def test_hello_with_a_bad_world_size_fails_cleanly(capsys):
    assert cli.main(["hello", "-n", "0"]) == 1
    assert "world_size must be a positive whole number of ranks, got 0" in capsys.readouterr().err


def test_lab_command_roots_jupyterlab_at_the_notebooks():
    command = cli.lab_command(["--no-browser"])
    assert command[1:3] == ["-m", "jupyterlab"] and command[-1] == "--no-browser"
    assert command[3].endswith("notebooks")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_course_lab_serves_the_notebooks(tmp_path):
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    server = subprocess.Popen(
        [sys.executable, "-m", "course.cli", "lab", "--no-browser", f"--port={port}", "--IdentityProvider.token=t"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        listing = None
        for _ in range(120):
            try:
                url = f"http://127.0.0.1:{port}/api/contents?token=t"
                listing = json.load(urllib.request.urlopen(url, timeout=5))
                break
            except OSError:
                time.sleep(1)
        assert listing is not None, "JupyterLab did not answer within two minutes"
        assert "00_start_here.ipynb" in {item["name"] for item in listing["content"]}
    finally:
        server.terminate()
        server.wait(timeout=30)
