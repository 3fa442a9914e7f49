"""course.practice.resume: torchrun --max-restarts=1 with rank 1 killed mid-epoch ends with the same parameters as an
uninterrupted run, bit for bit (CPU, gloo, 2 ranks); the restart begins where resume_point says."""

import pytest
import torch

from course.practice import resume

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_killed_and_restarted_run_ends_bit_for_bit_equal(tmp_path):
    whole = resume.run(tmp_path / "whole", timeout_s=400)
    killed = resume.run(tmp_path / "killed", crash_at=13, timeout_s=400, reference=tmp_path / "reference")
    assert not whole.crashed and killed.crashed
    epoch, step = resume.resume_point(resume.Config(), 13)
    assert "restart 1: starting at epoch 1, step 3" in killed.output and (epoch, step) == (1, 3)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters, killed.parameters, strict=True))
    # the reference trained in the killed job's processes is the separate uninterrupted run
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters, killed.reference, strict=True))


@pytest.mark.parametrize(("crash_at", "expected"), [(13, (1, 3)), (11, (1, 3)), (8, (1, 0)), (7, (0, 6)),
                                                   (2, (0, 0))])
def test_resume_point_is_the_last_checkpoint_before_the_crash(crash_at, expected):
    """8 steps per epoch, a checkpoint every 3 steps and at each epoch's end; steps count from 0 (issue 33, item 6)."""
    assert resume.resume_point(resume.Config(), crash_at) == expected


def test_an_existing_checkpoint_is_not_overwritten(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        resume.run(tmp_path)
