"""benchmarks/gpu_course_check.py: the results file it writes, and its CPU dry run (``--emulate``) end to end."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_course_check as check  # noqa: E402 - benchmarks/ is not a package


def _report(passed: bool) -> check.Report:
    report = check.Report({"GPUs": "1 x NVIDIA H100 80GB HBM3", "driver": "550.54", "torch": "2.11.0",
                           "course info": "hardware    : 1 GPU(s)\nbackend     : gloo"})
    report.steps = [check.Step("lab ring: reference solution", True, 12.3, "10/10"),
                    check.Step("notebooks", None, 0.0, "nbval is not installed"),
                    check.Step("grader: tests/submissions/unscaled_lr.py", passed, 40.0, "failed ['lr_scaled']")]
    report.ratios = [{"what": "DDP step, DigitsCNN", "measured": 3.0, "modelled": 2.0, "unit": "ms"},
                     {"what": "allreduce busbw, 1 MB on 1", "measured": 5.0, "modelled": None, "unit": "GB/s"}]
    return report


def test_the_results_file_names_the_gpu_the_steps_and_each_ratio():
    text = check.markdown(_report(True), emulate=False)
    assert text.startswith("# Course check on 1 x NVIDIA H100 80GB HBM3")
    assert "| driver | 550.54 |" in text and "| torch | 2.11.0 |" in text
    assert "## Steps: all passed" in text and "| notebooks | skipped | 0 | nbval is not installed |" in text
    assert "| DDP step, DigitsCNN | 3.000 ms | 2.000 ms | 1.50 |" in text
    assert "| allreduce busbw, 1 MB on 1 | 5.000 GB/s | not modelled | - |" in text
    assert "CPU dry run" not in text


def test_a_failed_step_fails_the_report_and_says_so():
    report = _report(False)
    assert not report.passed
    assert "SOME FAILED" in check.markdown(report, emulate=True) and "| **FAIL** |" in check.markdown(report, True)


def test_a_step_that_raises_is_a_failed_step_not_the_end():
    def broken():
        raise RuntimeError("first line\nthe last line says why")

    step = check.timed("broken", broken)
    assert step.passed is False and step.detail == "RuntimeError: the last line says why"


def test_a_run_cut_short_keeps_the_steps_it_finished(monkeypatch, tmp_path):
    """The results file is rewritten after each step: a time limit that stops the run keeps what it did."""
    monkeypatch.setattr(check, "check_lab", lambda name: (True, "10/10"))
    monkeypatch.setattr(check, "grade_submission", lambda name: (False, "failed ['lr_scaled']"))

    def killed(*_):
        raise KeyboardInterrupt  # not an Exception: like the signal of a time limit, it ends the run

    monkeypatch.setattr(check, "measure", killed)
    out = tmp_path / "results.md"
    with pytest.raises(KeyboardInterrupt):
        check.check(False, None, [], ["ring"], ["unscaled_lr"], out)
    text = out.read_text()
    assert "| lab ring: reference solution | pass |" in text and "SOME FAILED" in text
    assert "| grader: tests/submissions/unscaled_lr.py | **FAIL** |" in text



def test_a_failed_notebooks_output_is_kept_in_the_failure_log(monkeypatch, tmp_path):
    failed = subprocess.CompletedProcess([], 1, "Cell 3: RuntimeError: Expected all tensors on the same device\n"
                                                "1 failed, 23 passed", "")
    monkeypatch.setattr(check.subprocess, "run", lambda *args, **kwargs: failed)
    log = tmp_path / "results.md.failures.log"
    assert check.run_notebook(Path("03_naive_multi_gpu.ipynb"), log) == (False, "1 failed, 23 passed")
    assert log.read_text().startswith("===== 03_naive_multi_gpu.ipynb: 1 failed, 23 passed\nCell 3: RuntimeError")

@pytest.mark.parametrize(("emulate", "gpus"), [(True, 0), (False, 0), (False, 1), (True, 8)])
def test_the_two_gpu_path_is_skipped_and_says_so_without_two_gpus(monkeypatch, emulate, gpus):
    monkeypatch.setattr(check.torch.cuda, "device_count", lambda: gpus)
    steps = []
    check.two_gpu_steps(emulate, steps.append)
    assert [(s.name, s.passed) for s in steps] == [("2-GPU path", None)] and "NOT run" in steps[0].detail


def test_on_two_gpus_or_more_the_plan_and_two_notebooks_run_with_two_gpus_visible(monkeypatch):
    monkeypatch.setattr(check.torch.cuda, "device_count", lambda: 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    seen = []

    def fake_run(command, **kwargs):
        seen.append(kwargs["env"]["CUDA_VISIBLE_DEVICES"])
        return subprocess.CompletedProcess(command, 0, "2 nccl cuda:0,cuda:1\n4 ranks asked, 2 GPUs here: ...", "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    monkeypatch.setattr(check, "run_notebook", lambda path, log, env: (env == {"CUDA_VISIBLE_DEVICES": "3,5"}, "ok"))
    steps = []
    check.two_gpu_steps(False, lambda step: steps.append(step) or step)
    assert seen == ["3,5"] and [s.passed for s in steps] == [True, True, True]
    assert [s.name for s in steps[1:]] == [f"notebook {n} on 2 GPUs" for n in check.TWO_GPU_NOTEBOOKS]


def test_the_plan_probe_fails_where_the_plan_is_not_two_ranks_on_nccl():
    passed, said = check.planned_on_two_gpus()  # this machine has no GPU: 4 emulated ranks on gloo
    assert passed is False and said.startswith("4 emulated GPUs")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_cpu_dry_run_passes_and_writes_one_results_file(tmp_path):
    out = tmp_path / "results.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_course_check.py"), "--emulate",
                             "--skip", "grading", "--out", str(out)],  # the suite grades unscaled_lr already
                            capture_output=True, text=True, timeout=840, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = out.read_text()
    assert "CPU dry run" in text and "## Steps: all passed" in text
    for step in ("notebook 05c_performance_model.ipynb", "lab tp_mlp: reference solution",
                 "benchmarks/gpu_check.py: measured vs modelled"):
        assert f"| {step} | pass |" in text, text
    assert "| grader: " not in text  # --skip grading
    assert "| DDP step, DigitsCNN, 256 per rank on 2 rank(s) |" in text and "not modelled" in text


@pytest.mark.parametrize(("name", "failed", "passes"), [
    ("unscaled_lr", {"lr_scaled"}, True),
    ("unscaled_lr", {"lr_scaled", "target_accuracy"}, True),  # near the target: either side, by the seed
    ("unscaled_lr", {"target_accuracy"}, False),  # the bug itself not caught
    ("unscaled_lr", {"lr_scaled", "disjoint_shards"}, False),
    ("reference", {"target_accuracy"}, False),  # the reference must reach the target
])
def test_a_graded_bug_must_fail_its_own_check_and_no_other_but_a_near_target_accuracy(monkeypatch, name, failed,
                                                                                      passes):
    from types import SimpleNamespace

    import grader.runner

    checks = [SimpleNamespace(name=n, passed=n not in failed, assessed=True)
              for n in ("lr_scaled", "target_accuracy", "disjoint_shards")]
    monkeypatch.setattr(grader.runner, "grade", lambda *_: SimpleNamespace(status="ok", score=80, max_score=100,
                                                                           checks=checks))
    assert check.grade_submission(name)[0] is passes
