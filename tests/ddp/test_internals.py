"""course.ddp.internals: DDP's buckets counted, no_sync and batch-norm statistics checked against DDP."""


import pytest
import torch
from groups import single_rank_group
from torch.nn.parallel import DistributedDataParallel

from course.ddp import hooks as ddp_hooks
from course.ddp import internals as ddp
from course.models import DigitsCNN
from course.runtime.launch import launch


@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.1, 0.01])
def test_bucket_report_counts_the_allreduces_ddp_really_issues(bucket_cap_mb):
    with single_rank_group():
        model = DistributedDataParallel(DigitsCNN(), bucket_cap_mb=bucket_cap_mb)
        calls = []
        model.register_comm_hook(None, ddp_hooks.counting(calls.append))
        for _ in range(2):  # DDP rebuilds its buckets after the first iteration
            calls.clear()
            model(torch.randn(4, 1, 8, 8)).sum().backward()
    report = ddp.bucket_report(DigitsCNN(), bucket_cap_mb)
    assert report["buckets"] == len(calls)
    assert report["fill"] == pytest.approx(report["gradient_bytes"] / (bucket_cap_mb * 2**20), rel=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_no_sync_accumulation_and_synchronised_batchnorm_statistics():
    for result in launch(ddp.internals, 2, timeout_s=180):
        accumulated, batchnorm = result["no_sync"], result["batchnorm"]
        assert accumulated["max_grad_diff"] < 1e-6 and accumulated["max_grad_diff_every_pass"] < 1e-6
        assert accumulated["allreduces_whole"] == accumulated["allreduces_no_sync"] == 1
        assert accumulated["allreduces_every_pass"] == 4  # same gradient, 4x the communication
        assert batchnorm["local_error"] > 1e-4  # each rank's own batch is not the global batch ...
        assert batchnorm["synced_error"] < 1e-6  # ... but the all-reduced statistics are


def test_no_sync_needs_whole_micro_batches():
    with pytest.raises(ValueError, match="multiple of accumulation_steps"):
        ddp.no_sync_check(accumulation_steps=3, batch_size=32)
