"""The checkpoint lab (grader.labs.checkpoint): the stub fails every check, the solution passes all, each planted
mistake fails its own check (and, where it changes the resumed run, bit_for_bit) with a message naming it."""

import os
import random

import numpy as np
import pytest
import torch

from grader import render
from grader.labs.checkpoint import check as checkpoint
from grader.labs.core import run_lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "checkpoint", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "checkpoint", "reference.py")
ATTEMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attempts")
ALL = [check.name for check in checkpoint.CHECKS]


def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(checkpoint.LAB, STUB)
    assert result.failed() == ALL and result.score == 0
    assert "Not attempted yet: your save_checkpoint still raises NotImplementedError" in render.lab_feedback(result)


@pytest.mark.timeout(300)
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(checkpoint.LAB, SOLUTION, hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("forgets_optimizer", ["training_state", "bit_for_bit"], "the optimizer has no momentum buffers"),
    ("forgets_rng", ["rng_and_position", "bit_for_bit"], "random number generator after loading is not what it"),
    ("every_rank_writes", ["one_writer"], "rank 1 called torch.save too: every rank wrote the same file"),
    ("no_barrier", ["one_writer"], "the file did not exist yet when save_checkpoint returned on rank 1"),
    ("writes_in_place", ["atomic"], "rank 0's torch.save wrote the checkpoint in place"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment):
    result = run_lab(checkpoint.LAB, os.path.join(ATTEMPTS, f"checkpoint_{attempt}.py"))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert first.startswith("world_size=2, ") and fragment in first, first


def _measured(**after):
    saved = {"params": torch.ones(3), "momentum": torch.ones(2), "scheduler": {"last_epoch": 6},
             "rng": torch.get_rng_state(), "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
             "position": (1, 2)}
    return {"saved": saved, "after": {**saved, **after}, "returned": (1, 2), "loaded_position": (1, 2),
            "calls": 1, "exists_on_return": True, "path": "/tmp/c.pt", "targets": ["/tmp/c.pt.partial"]}


def test_the_verdicts_name_what_was_not_restored():
    assert checkpoint.judge_state(_measured(), 0).passed
    assert "parameters after loading are not those saved" in checkpoint.judge_state(
        _measured(params=torch.zeros(3)), 1).message
    assert "scheduler after loading is at step 0, it was at 6" in checkpoint.judge_state(
        _measured(scheduler={"last_epoch": 0}), 0).message
    rank0 = torch.Generator().manual_seed(7).get_state()
    assert "it is rank 0's" in checkpoint.judge_rng(_measured(rng=rank0), 1, rank0).message
    wrong_position = {**_measured(), "returned": (0, 0), "loaded_position": (0, 0)}
    assert "load_checkpoint returned (0, 0), the run stopped at (epoch, step) = (1, 2)" in checkpoint.judge_rng(
        wrong_position, 0, rank0).message
    assert "rank 0 never called torch.save" in checkpoint.judge_writer({**_measured(), "calls": 0}, 0).message
    assert checkpoint.judge_rng(_measured(), 0, rank0).passed
    other_numpy = np.random.RandomState(3).get_state()
    assert "numpy's generator after loading" in checkpoint.judge_rng(_measured(numpy_rng=other_numpy), 0, rank0).message
    assert checkpoint.judge_atomic(_measured(), 0).passed
    in_place = {**_measured(), "targets": ["/tmp/c.pt"]}
    assert "wrote the checkpoint in place" in checkpoint.judge_atomic(in_place, 0).message
