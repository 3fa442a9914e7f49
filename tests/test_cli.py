"""course.cli: `course info`, `course hello`, `course lab`."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from course import cli, world
from course.runtime.ports import reserved_port

pytestmark = pytest.mark.unit0


def test_info_reports_the_detected_hardware_what_will_run_and_the_versions():
    hardware = world.detect_hardware()
    lines = cli.info_lines(4)
    assert lines[0].endswith(f"; {hardware.cpu_count} CPU core(s)")
    assert lines[1] == f"backend     : {hardware.backend_for(4)}"
    assert lines[2] == f"with 4 ranks: {cli.plan(4, hardware)}"
    assert lines[3:] == [f"{name:<12}: {version}" for name, version in world.versions().items()]


def test_info_on_emulated_hardware_says_cpu_processes_on_gloo(monkeypatch):
    monkeypatch.setenv(world.EMULATE_ENV, "1")
    lines = cli.info_lines(4, world.Hardware(gpu_names=(), cpu_count=2))
    assert lines[:3] == ["hardware    : GPUs hidden by COURSE_EMULATE=1; 2 CPU core(s)", "backend     : gloo",
                         "with 4 ranks: 4 emulated GPUs: 4 CPU processes on the gloo backend, sharing 2 CPU core(s). "
                         "Timings here are CPU timings, not GPU timings."]


def test_info_with_fewer_gpus_than_ranks_says_they_run_emulated():
    from monitor.test_interconnect import FakeTopology

    two_gpus = world.Hardware(gpu_names=("A100", "A100"), cpu_count=32)
    lines = cli.info_lines(4, two_gpus, nvml=FakeTopology.nvlinked(2))
    assert lines[:3] == [
        "hardware    : 2 GPU(s): A100, A100; 32 CPU core(s)", "backend     : gloo",
        "with 4 ranks: 4 emulated GPUs: 4 CPU processes on the gloo backend, sharing 32 CPU core(s). This machine's 2 "
        "GPU(s) are not used: nccl needs one GPU per rank, so 4 ranks run emulated. Results are the same; timings "
        "are CPU timings, not GPU timings. Use world_size <= 2 to run on the GPU(s)."]
    assert lines[3] == "interconnect: GPU 0 <-> GPU 1: NVLink x4"
    assert cli.info_lines(2, two_gpus, nvml=FakeTopology.nvlinked(2))[1:3] == [
        "backend     : nccl", "with 2 ranks: 2 real GPUs on the nccl backend (A100, A100)."]


def test_info_runs_as_a_console_command():
    result = subprocess.run([sys.executable, "-m", "course.cli", "info"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert result.stdout.splitlines() == cli.info_lines()


@pytest.mark.slow
def test_hello_runs_on_the_ranks_asked_for(capsys):
    assert cli.main(["hello", "-n", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "all 2 ranks agree: all_reduce(rank + 1) = 3"
    assert sorted(line.split(" of ")[0] for line in out[:-1]) == ["[rank 0] hello from rank 0",
                                                                   "[rank 1] hello from rank 1"]


def test_hello_with_a_bad_world_size_fails_cleanly(capsys):
    assert cli.main(["hello", "-n", "0"]) == 1
    assert "world_size must be a positive integer number of ranks, got 0" in capsys.readouterr().err


def test_lab_command_roots_jupyterlab_at_the_notebooks():
    command = cli.lab_command(["--no-browser"])
    assert command[1:3] == ["-m", "jupyterlab"] and command[-1] == "--no-browser"
    assert command[3] == f"--ServerApp.root_dir={cli.notebooks_dir()}"


def test_lab_environment_puts_the_course_first_on_path_and_adds_its_lab_settings():
    env = cli.lab_environment({"PATH": f"/usr/bin{os.pathsep}{os.path.dirname(sys.executable)}",
                               "JUPYTER_CONFIG_PATH": "/etc/mine"})
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]
    assert env["JUPYTER_CONFIG_PATH"] == f"{cli.LAB_CONFIG}{os.pathsep}/etc/mine"
    overrides = json.loads((cli.LAB_CONFIG / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def _terminal_output(port: int, token: str, command: str, until: str, timeout_s: float = 60) -> str:
    """Open a Lab terminal as the browser does (REST, then its websocket), type ``command``, read up to ``until``."""
    from tornado.ioloop import IOLoop
    from tornado.websocket import websocket_connect

    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/terminals?token={token}", data=b"{}",
                                     headers={"Content-Type": "application/json"}, method="POST")
    name = json.load(urllib.request.urlopen(request, timeout=10))["name"]

    async def talk() -> str:
        socket = await websocket_connect(f"ws://127.0.0.1:{port}/terminals/websocket/{name}?token={token}")
        socket.write_message(json.dumps(["stdin", command + "\n"]))
        seen = ""
        deadline = time.monotonic() + timeout_s
        while until not in seen and time.monotonic() < deadline:
            message = await socket.read_message()
            if message is None:
                break
            kind, *payload = json.loads(message)
            seen += payload[0] if kind == "stdout" else ""
        socket.close()
        return seen

    return IOLoop.current().run_sync(talk, timeout=timeout_s + 10)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_course_lab_serves_the_notebooks_with_terminals_that_run_the_course(tmp_path):
    with reserved_port() as port:  # held for the server, which binds it too
        # a PATH without the course's bin and a login-shell-like environment, as `make lab` leaves it
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != os.path.dirname(sys.executable))
        env = {**os.environ, "PATH": path, "JUPYTER_RUNTIME_DIR": str(tmp_path),
               "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings")}
        server = subprocess.Popen(
            [sys.executable, "-m", "course.cli", "lab", "--no-browser", f"--port={port}", "--IdentityProvider.token=t"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
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
            url = f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification?token=t"
            defaults = json.load(urllib.request.urlopen(url, timeout=10))["schema"]["properties"]
            assert defaults["fetchNews"]["default"] == "false"  # the course's override: no news pop-up
            out = _terminal_output(port, "t", "pwd; for c in torchrun grader course python; do command -v $c; done; "
                                   "echo END-$((6*7))", until="END-42")
            bin_dir = os.path.dirname(sys.executable)
            assert str(cli.notebooks_dir()) in out, out
            for name in ("torchrun", "grader", "course", "python"):
                assert os.path.join(bin_dir, name) in out, out
        finally:
            server.terminate()
            server.wait(timeout=30)
