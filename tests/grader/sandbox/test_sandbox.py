"""grader.sandbox: hostile programs are contained, stopped with the right status, and leave nothing behind.

Each program in tests/sandbox_programs/ attacks one limit. The limits here are small so that a containment
bug cannot take the (shared) machine down: a fork bomb gets 8 processes (16 tasks), a memory bomb 512 MiB.
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from processes import live_children

from grader import sandbox
from grader.sandbox import Limits, SandboxResult, bubblewrap, run
from grader.sandbox import uid as sandbox_uid

pytestmark = pytest.mark.unit6

PROGRAMS = Path(__file__).resolve().parents[2] / "sandbox_programs"
AS_ROOT = sys.platform == "linux" and os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the strong containment (uid, namespaces) needs root")
NO_BWRAP = bubblewrap.unavailable_reason()  # why bubblewrap cannot run here, or None
# Both backends of the strong containment: bubblewrap where it runs, and the in-house namespaces (the fallback).
BACKENDS = [pytest.param("bubblewrap", marks=pytest.mark.skipif(NO_BWRAP is not None, reason=f"{NO_BWRAP}")),
            "namespaces"]
ISOLATIONS = [*BACKENDS, pytest.param("process-tree", marks=needs_root)]


def leftovers(marker: str | list[str]) -> list[psutil.Process]:
    """Live processes whose command line is ``marker`` (a list), or has an argument containing it (a string).

    Forks keep their parent's command line, so both find a run's forks. A string marker must be unique to the
    test (a program's full path): a short word such as "auto" also matches unrelated processes on the machine.
    """
    def matches(cmdline: list[str]) -> bool:
        return cmdline == marker if isinstance(marker, list) else any(marker in a for a in cmdline)

    return [proc for proc in psutil.process_iter(["cmdline", "status"])
            if proc.info["status"] != psutil.STATUS_ZOMBIE and matches(proc.info["cmdline"] or [])]


def visible_folder() -> Path:
    """A fresh folder (0755) a sandboxed command sees: not under /tmp, which bubblewrap replaces by an empty one."""
    folder = Path(tempfile.mkdtemp(dir="/run" if os.access("/run", os.W_OK) else Path.home()))
    folder.chmod(0o755)
    return folder


def sandboxed(argv: list[str], cwd: Path, isolation: str, pass_fds: tuple[int, ...] = (),
              **limits) -> SandboxResult:
    """``run`` with test defaults, then check that nothing the run started is alive."""
    result = run(argv, cwd=cwd, env=dict(os.environ), limits=Limits(**limits), pass_fds=pass_fds,
                 isolation=isolation)
    assert result.status in sandbox.STATUSES
    assert live_children() == []
    assert leftovers(argv) == [], f"{argv} left processes behind"
    for uid in [int(m.split()[1]) for m in result.mechanisms if m.startswith("uid ")]:
        # The uid is free once the run returned: a concurrent run (the other xdist worker's gradings, another
        # session) may take it and start processes under it. Holding it, every process of it is a leftover.
        with sandbox_uid.held(uid):
            alive = [proc for proc in psutil.process_iter(["uids", "status"]) if proc.info["uids"]
                     and proc.info["uids"].real == uid and proc.info["status"] != psutil.STATUS_ZOMBIE]
        assert alive == [], f"{alive} of the sandbox uid {uid} still alive after the run"
    return result


def run_program(name: str, *args: str, cwd: Path, isolation: str, **limits) -> SandboxResult:
    """Run tests/sandbox_programs/<name> sandboxed (a hostile program's own leftovers are checked too)."""
    program = str(PROGRAMS / name)
    result = sandboxed([sys.executable, program, *args], cwd, isolation, **limits)
    assert leftovers(program) == [], f"{name} left processes behind"
    return result


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_well_behaved_program_runs_with_its_output_intact(tmp_path, isolation):
    result = run_program("well_behaved.py", cwd=tmp_path, isolation=isolation)
    assert (result.status, result.returncode) == ("ok", 0), result
    assert result.stdout == "step 0 loss 1.000\nstep 1 loss 0.500\nstep 2 loss 0.333\né ünïcode survives\n"
    assert result.stderr == "a warning on stderr\n"
    assert (tmp_path / "checkpoint.txt").read_text() == "weights"


@pytest.mark.parametrize("isolation", BACKENDS)
def test_a_failing_program_is_an_error_with_its_exit_code(tmp_path, isolation):
    result = sandboxed([sys.executable, "-c", "raise SystemExit(3)"], tmp_path, isolation)
    assert (result.status, result.returncode) == ("error", 3)
    assert "code 3" in result.detail


@pytest.mark.parametrize("isolation", BACKENDS)
def test_a_missing_program_is_an_error_that_says_so(tmp_path, isolation):
    result = sandboxed(["no-such-program-anywhere"], tmp_path, isolation)
    assert result.status == "error"
    assert "cannot run 'no-such-program-anywhere'" in result.stderr


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_infinite_loop_times_out_fast(tmp_path, isolation):
    result = run_program("infinite_loop.py", cwd=tmp_path, isolation=isolation, wall_s=2)
    assert result.status == "timeout"
    assert result.returncode is None
    assert result.elapsed_s >= 2  # stopped at its limit: a loop that was not stopped would end the test by its timeout
    assert "2 s" in result.detail


@pytest.mark.parametrize("isolation", BACKENDS)
def test_a_memory_bomb_runs_out_of_memory_at_the_per_process_limit(tmp_path, isolation):
    result = run_program("memory_bomb.py", cwd=tmp_path, isolation=isolation, memory_bytes=512 * 2**20, wall_s=30)
    assert result.status == "out of memory", result
    assert "MemoryError" in result.stderr
    assert "512 MiB" in result.detail


@pytest.mark.parametrize("isolation", BACKENDS)
def test_the_watchdog_stops_memory_growth_over_the_total_limit(tmp_path, isolation):
    result = run_program("memory_bomb.py", "0.02", cwd=tmp_path, isolation=isolation, memory_bytes=2 * 2**30,
                         memory_total_bytes=256 * 2**20, wall_s=30)
    assert result.status == "out of memory", result
    assert "together" in result.detail


@pytest.mark.parametrize("isolation", BACKENDS)
@needs_root
def test_a_fork_bomb_is_contained_and_every_process_is_gone(tmp_path, isolation):
    # run_program checks that no process of the bomb (they all keep its command line) or of its uid is left.
    result = run_program("fork_bomb.py", cwd=tmp_path, isolation=isolation, max_processes=8, max_threads=16, wall_s=15)
    assert result.status == "too many processes", result


@pytest.mark.parametrize("isolation", BACKENDS)
@needs_root
def test_a_thread_bomb_is_stopped_by_the_task_limit(tmp_path, isolation):
    result = run_program("thread_bomb.py", cwd=tmp_path, isolation=isolation, max_threads=32, wall_s=20)
    assert result.status == "too many processes", result
    assert "threads" in result.detail


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_output_flooding_is_truncated_and_stopped(tmp_path, isolation):
    result = run_program("output_flood.py", cwd=tmp_path, isolation=isolation, output_bytes=4096,
                         max_output_bytes=2**20, wall_s=20)
    assert result.status == "output limit", result
    for stream in (result.stdout, result.stderr):
        assert len(stream.encode()) < 4096 + 200
        assert stream.startswith("flood flood")
        assert "bytes of output dropped here]" in stream


@pytest.mark.parametrize("isolation", BACKENDS)
def test_output_past_the_kept_size_is_dropped_but_the_run_is_ok(tmp_path, isolation):
    code = "print('head'); print('x' * 100000); print('the end')"
    result = sandboxed([sys.executable, "-c", code], tmp_path, isolation, output_bytes=1000)
    assert result.status == "ok"
    assert result.stdout.startswith("head\nxxx")
    assert result.stdout.endswith("xxx\nthe end\n")  # the tail is kept: that is where tracebacks are
    dropped = int(result.stdout.split("[sandbox: ")[1].split()[0])
    assert dropped == len("head\n") + 100001 + len("the end\n") - 1000
    assert f"{dropped} bytes of stdout were dropped" in result.detail


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_setsid_escapee_is_killed(tmp_path, isolation):
    result = run_program("setsid_escapee.py", cwd=tmp_path, isolation=isolation, wall_s=20)
    assert (result.status, result.stdout) == ("ok", "escaped\n"), result


@pytest.mark.parametrize("isolation", BACKENDS)
def test_network_beyond_loopback_is_unreachable_but_loopback_works(tmp_path, isolation):
    result = run_program("network_probe.py", cwd=tmp_path, isolation=isolation, wall_s=20)
    assert result.status == "ok", result
    if not AS_ROOT and "network namespace" not in result.mechanisms:  # no unprivileged user namespaces here
        assert "network not contained" in result.detail
        pytest.skip("this kernel allows no network namespace without root")
    assert "network namespace" in result.mechanisms
    assert result.stdout.splitlines() == ["loopback: connected", "outside: OSError"]


@pytest.mark.parametrize("isolation", BACKENDS)
def test_a_file_size_bomb_is_stopped_at_the_file_size_limit(tmp_path, isolation):
    result = run_program("file_size_bomb.py", cwd=tmp_path, isolation=isolation, file_size_bytes=8 * 2**20, wall_s=20)
    assert result.status == "file too large", result
    assert (tmp_path / "huge.bin").stat().st_size == 8 * 2**20


@pytest.mark.parametrize("isolation", BACKENDS)
def test_cpu_time_is_limited_per_process(tmp_path, isolation):
    result = run_program("infinite_loop.py", cwd=tmp_path, isolation=isolation, cpu_s=1, wall_s=30)
    assert result.status == "cpu limit", result


@pytest.mark.parametrize("isolation", BACKENDS)
@needs_root
def test_the_command_runs_as_an_unprivileged_uid_that_cannot_read_private_files(tmp_path, isolation):
    folder = visible_folder()  # reachable, unlike pytest's tmp_path parents, which are 0700
    try:
        secret = folder / "answers.txt"
        secret.write_text("answers")
        secret.chmod(0o600)
        code = f"import os; print(os.getuid()); open({str(secret)!r}).read()"
        result = sandboxed([sys.executable, "-c", code], tmp_path, isolation)
    finally:
        shutil.rmtree(folder)
    uid = int(result.stdout.split()[0])
    assert uid >= sandbox.SANDBOX_UID_BASE and f"uid {uid}" in result.mechanisms
    assert result.status == "error" and "PermissionError" in result.stderr, result


@pytest.mark.parametrize("isolation", BACKENDS)
def test_the_run_dir_is_reached_by_its_absolute_path_even_with_tmp_on_the_python_path(tmp_path, isolation):
    # tmp_path's parents are 0700 and under /tmp; a needed path that is /tmp itself must not bring them back
    (tmp_path / "train.py").write_text("print('read')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, ["/tmp", os.environ.get("PYTHONPATH")]))}
    code = f"exec(open({str(tmp_path / 'train.py')!r}).read())"
    result = run([sys.executable, "-c", code], cwd=tmp_path, env=env, isolation=isolation)
    assert (result.status, result.stdout) == ("ok", "read\n"), result


@pytest.mark.parametrize("isolation", BACKENDS)
def test_the_result_channel_fd_is_passed_and_the_sandbox_status_fd_is_not(tmp_path, isolation):
    read_end, write_end = os.pipe()
    code = ("import json, os\n"
            "def is_open(fd):\n    try:\n        return bool(os.fstat(fd))\n    except OSError:\n        return False\n"
            f"os.write({write_end}, b'trusted')\n"
            "print(json.dumps([fd for fd in range(1024) if is_open(fd)]))")
    result = sandboxed([sys.executable, "-c", code], tmp_path, isolation, pass_fds=(write_end,))
    os.close(write_end)
    assert os.read(read_end, 100) == b"trusted"
    os.close(read_end)
    assert result.status == "ok", result
    assert json.loads(result.stdout) == [0, 1, 2, write_end]


@pytest.mark.parametrize("isolation", BACKENDS)
def test_keyboard_interrupt_in_the_grader_kills_the_run(tmp_path, monkeypatch, isolation):
    program = str(PROGRAMS / "setsid_escapee.py")
    code = f"import runpy, time\ntry:\n    runpy.run_path({program!r})\nexcept SystemExit:\n    time.sleep(60)"
    real_sleep = time.sleep

    def interrupted_sleep(seconds):
        if len(leftovers(program)) >= 2:  # the run is under way and its escapee out of the process group
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", interrupted_sleep)
    with pytest.raises(KeyboardInterrupt):
        run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), limits=Limits(wall_s=30),
            isolation=isolation)
    monkeypatch.undo()
    assert leftovers(program) == []


@pytest.mark.parametrize("isolation", BACKENDS)
def test_a_stop_request_asks_the_command_to_end_then_says_interrupted(tmp_path, isolation):
    code = ("import signal, sys, time\n"
            "def leave(*_):\n    print('stopping cleanly', flush=True)\n    sys.exit(3)\n"
            "signal.signal(signal.SIGTERM, leave)\nprint('started', flush=True)\nopen('started', 'w').close()\n"
            "time.sleep(60)\n")
    stop = threading.Event()

    def stop_once_started() -> None:  # not at a fixed time: a loaded machine may not have started it yet
        deadline = time.monotonic() + 25
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=stop_once_started, daemon=True).start()
    result = run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), limits=Limits(wall_s=30),
                 stop=stop, isolation=isolation)
    assert result.status == "interrupted" and "the grader was stopped" in result.detail
    assert result.stdout.splitlines() == ["started", "stopping cleanly"]  # SIGTERM first: it could clean up


@pytest.mark.parametrize("isolation", BACKENDS)
@pytest.mark.timeout(180)
def test_a_two_rank_torchrun_gloo_job_works_inside(tmp_path, isolation):
    program = str(PROGRAMS / "gloo_allreduce.py")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", program]
    result = sandboxed(argv, tmp_path, isolation, wall_s=150)
    assert result.status == "ok", result
    assert sorted(result.stdout.splitlines()) == ["rank 0 of 2: sum 1", "rank 1 of 2: sum 1"]
    assert leftovers(program) == []


@pytest.mark.parametrize("isolation", BACKENDS)
@needs_root
def test_concurrent_runs_get_different_uids(tmp_path, isolation):
    code = "import os, time; time.sleep(1); print(os.getuid())"
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    with ThreadPoolExecutor(2) as pool:  # sandboxed() would see the other thread's run as a leftover
        results = list(pool.map(lambda folder: run([sys.executable, "-c", code], cwd=folder, env=dict(os.environ),
                                                   isolation=isolation),
                                folders))
    assert live_children() == [] and leftovers(code) == []
    assert [r.status for r in results] == ["ok", "ok"]
    assert len({int(r.stdout) for r in results}) == 2


@needs_root
def test_a_held_uid_is_taken_by_no_run_and_a_reserved_one_cannot_be_held():
    with sandbox_uid.reserve() as first:
        with pytest.raises(TimeoutError, match=f"uid {first} was still reserved"):
            with sandbox_uid.held(first, timeout_s=0.2):
                pass
    with sandbox_uid.held(first), sandbox_uid.reserve() as second:
        assert second != first
    with pytest.raises(ValueError, match="not a sandbox uid"):
        with sandbox_uid.held(os.getuid()):
            pass


@pytest.mark.parametrize("isolation", BACKENDS)
@needs_root
def test_the_grader_gets_the_working_dir_back_without_links_out_and_nothing_is_left_in_tmp(tmp_path, isolation):
    marker = f"left-by-sandbox-test-{os.getpid()}"
    code = (f"import os; open('checkpoint.pt', 'w').write('w'); open('/tmp/{marker}', 'w').write('for the next');"
            f"os.mkdir('/dev/shm/{marker}'); print(os.stat('.').st_uid, oct(os.stat('.').st_mode & 0o777));"
            "os.symlink('/etc/shadow', 'final.pt'); os.symlink('checkpoint.pt', 'best.pt')")
    tmp_path.chmod(0o751)
    result = sandboxed([sys.executable, "-c", code], tmp_path, isolation)
    assert result.status == "ok", result
    uid, mode = result.stdout.split()
    assert int(uid) >= sandbox.SANDBOX_UID_BASE and mode == "0o700"  # private while the run lasts
    assert tmp_path.stat().st_mode & 0o777 == 0o751
    assert tmp_path.stat().st_uid == os.getuid() and (tmp_path / "checkpoint.pt").stat().st_uid == os.getuid()
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
    assert not (tmp_path / "final.pt").is_symlink()  # it led out of the run's directory
    assert (tmp_path / "best.pt").read_text() == "w"


@needs_root
@pytest.mark.timeout(120)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_without_root_bombs_and_escapees_are_contained_too(tmp_path, isolation):
    # As on a student's laptop: the grader itself runs as an unprivileged sandbox uid, inside the sandbox.
    # Both backends then use an unprivileged user namespace (where the kernel allows it), "process-tree" cannot.
    # The outer run uses the in-house namespaces: bubblewrap cannot start inside bubblewrap (the /proc it mounts
    # carries read-only overmounts, so a nested unprivileged /proc mount is refused).
    result = run_program("unprivileged_grader.py", isolation, cwd=tmp_path, isolation="namespaces", max_processes=40,
                         max_threads=120, wall_s=90)
    assert result.status == "ok", result
    reports = {r["program"]: r for r in map(json.loads, result.stdout.splitlines())}
    for report in reports.values():
        assert report["uid"] >= sandbox.SANDBOX_UID_BASE and report["left"] == [], report
        assert not any(m.startswith("uid") for m in report["mechanisms"])
        namespaced = "user namespace" in report["mechanisms"]
        assert ("child subreaper" in report["mechanisms"]) != namespaced
    assert reports["fork_bomb.py"]["status"] == "too many processes"
    assert (reports["setsid_escapee.py"]["status"], reports["setsid_escapee.py"]["stdout"]) == ("ok", "escaped\n")
    assert reports["infinite_loop.py"]["status"] == "timeout"
    if namespaced:
        assert reports["network_probe.py"]["stdout"] == "loopback: connected\noutside: OSError\n"
    else:
        assert "network not contained" in reports["network_probe.py"]["detail"]


def test_bad_arguments_are_rejected_clearly(tmp_path):
    with pytest.raises(ValueError, match="existing directory"):
        run(["true"], cwd=tmp_path / "missing", env={})
    with pytest.raises(ValueError, match="isolation"):
        run(["true"], cwd=tmp_path, env={}, isolation="docker")
    with pytest.raises(ValueError, match="non-empty list"):
        run([], cwd=tmp_path, env={})
    with pytest.raises(ValueError, match="wall_s must be positive, got 0"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="must not exceed max_output_bytes"):
        Limits(output_bytes=2**30)


@pytest.mark.parametrize("isolation", BACKENDS)
def test_hidden_files_read_empty_inside_and_stay_intact_outside(tmp_path, isolation):
    folder = visible_folder()  # and the file readable by all: only hiding protects it
    try:
        secret = folder / "grader-secret"
        secret.write_text("the instructor's secret\n")
        secret.chmod(0o644)
        code = f"print(repr(open({str(secret)!r}).read()))"
        shown = run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), limits=Limits(),
                    isolation=isolation)
        hidden = run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), limits=Limits(),
                     hide=(str(secret),), isolation=isolation)
        assert secret.read_text() == "the instructor's secret\n"
    finally:
        shutil.rmtree(folder)
    assert shown.stdout == "\"the instructor's secret\\n\"\n", shown
    if "mount namespace" in hidden.mechanisms:
        assert (hidden.status, hidden.stdout) == ("ok", "''\n"), hidden
    else:
        assert "secret file is not hidden" in hidden.detail
