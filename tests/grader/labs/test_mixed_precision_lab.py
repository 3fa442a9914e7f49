"""The mixed-precision lab (grader.labs.mixed_precision): the stub fails every check, the solution passes all,
each planted mistake fails its own check with a message naming it; the verdicts are tested alone too."""

import os

import pytest
import torch

from grader import render
from grader.labs.core import run_lab
from grader.labs.mixed_precision import check as mixed_precision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "mixed_precision", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "mixed_precision", "reference.py")
ATTEMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attempts")
ALL = [check.name for check in mixed_precision.CHECKS]
CONFIG = mixed_precision.LAB.runs[0]


def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(mixed_precision.LAB, STUB)
    assert result.failed() == ALL and result.score == 0
    assert "Not attempted yet: your train_step still raises NotImplementedError" in render.lab_feedback(result)


@pytest.mark.timeout(300)
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(mixed_precision.LAB, SOLUTION, hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("clips_before_unscale", ["unscale_then_clip"], "they match clipping the SCALED gradients"),
    ("never_skips", ["skips_overflow"], "at step 4 a gradient was inf (an overflow), and your parameters now hold"),
    ("no_update", ["updates_scale"], "after step 2 your scale is 65536, GradScaler's 131072: it did not grow"),
    ("uses_grad_scaler", ALL, "your file uses torch.amp.GradScaler, a ready-made version"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment):
    result = run_lab(mixed_precision.LAB, os.path.join(ATTEMPTS, f"mixed_precision_{attempt}.py"))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert fragment in first, first


def test_the_reference_skips_the_overflow_step_and_its_scale_follows_grad_scaler():
    trajectory, scales = mixed_precision.reference(CONFIG)
    step = CONFIG["overflow_at"]
    assert torch.equal(trajectory[step], trajectory[step - 1]) and not torch.equal(trajectory[1], trajectory[0])
    assert scales == [2.0**16, 2.0**16, 2.0**17, 2.0**17, 2.0**16, 2.0**16, 2.0**17]


def test_the_verdicts_name_the_mistake():
    trajectory, scales = mixed_precision.reference(CONFIG)
    assert mixed_precision.judge_clip(trajectory, CONFIG).passed
    clipped_late = mixed_precision.reference(CONFIG, "clip_then_unscale")[0]
    assert "clipping the SCALED gradients" in mixed_precision.judge_clip(clipped_late, CONFIG).message
    unclipped = mixed_precision.reference(CONFIG, "no_clip")[0]
    assert "no clipping at all" in mixed_precision.judge_clip(unclipped, CONFIG).message
    step = CONFIG["overflow_at"]
    stepped = trajectory[:step] + [trajectory[step] * float("nan")] + trajectory[step + 1:]
    assert "now hold inf or nan" in mixed_precision.judge_skip(stepped, CONFIG).message
    kept = scales[:step] + [scales[step - 1]] + scales[step + 1:]
    assert "did not change: update() multiplies it by backoff_factor" in mixed_precision.judge_scale(
        kept, CONFIG, trajectory).message
    assert mixed_precision.judge_scale(scales, CONFIG, trajectory).passed
