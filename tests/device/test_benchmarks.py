"""The benchmarks' rank functions keep their tensors on the rank's device (``declared_device``)."""

import sys
from pathlib import Path

import pytest
from declared_device import device_errors, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_check_ranks  # noqa: E402 - benchmarks/ is not a package

CASES = {
    "DDP step": (gpu_check_ranks.ddp_step_seconds, 2, ("DigitsCNN", 4, 1, False)),
    "allreduce": (gpu_check_ranks.allreduce_seconds, 2, ([4096], 2)),
}


@pytest.mark.parametrize("case", CASES)
def test_gpu_check_rank_functions_stay_on_the_rank_device(case):
    fn, world_size, args = CASES[case]
    outcomes = run_ranks(fn, world_size, *args)
    assert not device_errors(outcomes), "\n".join(device_errors(outcomes))  # (autocast on meta stops the DDP step)
