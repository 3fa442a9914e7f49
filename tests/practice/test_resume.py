"""course.practice.resume: torchrun --max-restarts=1 with rank 1 killed mid-epoch ends with the same parameters as an
uninterrupted run, bit for bit (CPU, gloo, 2 ranks)."""

import pytest
import torch

from course.practice import resume

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_killed_and_restarted_run_ends_bit_for_bit_equal(tmp_path):
    whole = resume.run(tmp_path / "whole", timeout_s=400)
    killed = resume.run(tmp_path / "killed", crash_at=13, timeout_s=400)  # epoch 1, step 5: after the step-3 save
    assert not whole.crashed and killed.crashed
    assert "restart 1: starting at epoch 1, step 3" in killed.output
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters, killed.parameters, strict=True))


def test_an_existing_checkpoint_is_not_overwritten(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        resume.run(tmp_path)
