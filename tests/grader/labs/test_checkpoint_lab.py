"""The checkpoint lab (grader.labs.checkpoint): the stub fails every check, the solution passes all, each planted
mistake fails its own check (and, where it changes the resumed run, bit_for_bit) with a message naming it."""

import os
import random
import shutil

import numpy as np
import pytest
import torch

from grader import render
from grader.labs.checkpoint import check as checkpoint
from grader.labs.checkpoint.disk import DiskWatch, Tear, watched
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
    ("every_rank_writes", ["one_writer"], "rank 1 wrote to disk too (checkpoint.pt.partial1): every rank wrote"),
    ("no_barrier", ["one_writer"], "the file did not exist yet when save_checkpoint returned on rank 1"),
    ("writes_in_place", ["atomic"], "rank 0's torch.save wrote the checkpoint in place"),
    ("copies_over_target", ["atomic"], "the new file was copied over path, and a copy writes path piece by piece"),
    # right: torch.save into an open file from tempfile.mkstemp, flushed, fsync'ed, then os.replace'd
    ("atomic_through_open_file", [], ""),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment):
    result = run_lab(checkpoint.LAB, os.path.join(ATTEMPTS, f"checkpoint_{attempt}.py"))
    assert result.failed() == failed, render.lab_feedback(result)
    if failed:
        first = next(r.message for r in result.checks if not r.passed)
        assert first.startswith("world_size=2, ") and fragment in first, first


def _measured(**after):
    saved = {"params": torch.ones(3), "momentum": torch.ones(2), "scheduler": {"last_epoch": 6},
             "rng": torch.get_rng_state(), "python_rng": random.getstate(), "numpy_rng": np.random.get_state(),
             "position": (1, 2)}
    return {"saved": saved, "after": {**saved, **after}, "returned": (1, 2), "loaded_position": (1, 2),
            "written": {"/tmp/c.pt.partial": 100}, "exists_on_return": True, "path": "/tmp/c.pt",
            "previous": True, "tear": None}


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
    assert "rank 0 wrote nothing to disk" in checkpoint.judge_writer({**_measured(), "written": {}}, 0).message
    assert checkpoint.judge_rng(_measured(), 0, rank0).passed
    other_numpy = np.random.RandomState(3).get_state()
    assert "numpy's generator after loading" in checkpoint.judge_rng(_measured(numpy_rng=other_numpy), 0, rank0).message
    assert checkpoint.judge_atomic(_measured(), 0).passed
    in_place = {**_measured(), "tear": Tear(4096, "torch.save", "/tmp/c.pt", 4096)}
    assert "would leave 4,096 bytes at path that torch.load cannot read" in checkpoint.judge_atomic(in_place, 0).message
    assert "wrote the checkpoint in place" in checkpoint.judge_atomic(in_place, 0).message
    removed = {**_measured(), "tear": Tear(0, "a removal", "/tmp/c.pt", -1)}
    assert "would leave no file at path" in checkpoint.judge_atomic(removed, 0).message


def _save_twice(tmp_path, second) -> DiskWatch:
    """A checkpoint at tmp_path/c.pt, then ``second(path)`` under the crash drill; returns the watch."""
    path = str(tmp_path / "c.pt")
    torch.save({"weights": torch.arange(3000.0)}, path)
    watch = DiskWatch()
    with watched(watch):
        watch.watching = True
        with watch.drill(path):
            second(path)
    return watch


def test_the_crash_drill_tears_a_write_in_place_and_a_copy_but_not_a_rename(tmp_path):
    state = {"weights": torch.arange(3000.0) + 1}
    in_place = _save_twice(tmp_path, lambda path: torch.save(state, path))
    assert in_place.tear is not None and in_place.tear.how == "torch.save" and in_place.tear.left == 4096

    def copied(path):
        torch.save(state, path + ".partial")
        shutil.copy(path + ".partial", path)
    copy = _save_twice(tmp_path, copied)
    assert copy.tear is not None and copy.tear.how == "a file copy", copy.tear

    def renamed(path):
        with open(path + ".partial", "wb") as handle:
            torch.save(state, handle)
        os.replace(path + ".partial", path)
    rename = _save_twice(tmp_path, renamed)
    assert rename.tear is None and sum(rename.written.values()) > 4096
    assert torch.equal(torch.load(str(tmp_path / "c.pt"))["weights"], state["weights"])
