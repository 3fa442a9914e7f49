"""course.ddp.internals: DDP's buckets counted, no_sync and batch-norm statistics checked against DDP."""


import pytest
import torch
from groups import single_rank_group
from torch.nn.parallel import DistributedDataParallel

from course.ddp import internals as ddp
from course.models import DigitsCNN
from course.runtime.launch import launch


def _stack(layers: int = 8, width: int = 512) -> torch.nn.Module:
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])  # 1 MiB + 2 KiB per layer


def _inputs(model: torch.nn.Module) -> torch.Tensor:
    return torch.randn(4, 1, 8, 8) if isinstance(model, DigitsCNN) else torch.randn(4, 512)


def _bucket_bytes_per_step(make, bucket_cap_mb, steps: int = 3) -> list[list[int]]:
    """The bytes of every bucket real DDP reduces, step by step (a communication hook that only records)."""
    def record(sizes, bucket):
        sizes.append(bucket.buffer().numel() * bucket.buffer().element_size())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    torch.manual_seed(0)
    with single_rank_group():
        model = make()
        kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        ddp_model = DistributedDataParallel(model, **kwargs)
        found: list[list[int]] = []
        ddp_model.register_comm_hook(found, lambda state, bucket: record(state[-1], bucket))
        inputs = _inputs(model)
        for _ in range(steps):
            found.append([])
            ddp_model(inputs).sum().backward()
    return found


@pytest.mark.parametrize(("make", "bucket_cap_mb"), [
    (DigitsCNN, None), (DigitsCNN, 25.0), (DigitsCNN, 0.1), (DigitsCNN, 0.01),
    (_stack, None), (_stack, 2.5), (_stack, 25.0), (lambda: _stack(40), None),
], ids=["cnn-default", "cnn-25", "cnn-0.1", "cnn-0.01", "stack-default", "stack-2.5", "stack-25", "stack40-default"])
def test_bucket_report_gives_the_buckets_ddp_really_reduces(make, bucket_cap_mb):
    """One bucket in the first step; from the second on, DDP's rebuilt buckets: a 1 MiB first one by default."""
    steps = _bucket_bytes_per_step(make, bucket_cap_mb)
    model = make()
    report = ddp.bucket_report(model, bucket_cap_mb, _inputs(model))
    assert steps[0] == [report["gradient_bytes"]] and report["first_iteration_buckets"] == 1
    assert steps[1] == steps[2] == report["sizes"] and report["buckets"] == len(report["sizes"])
    cap = (25.0 if bucket_cap_mb is None else bucket_cap_mb) * 2**20
    assert report["fill"] == pytest.approx(report["gradient_bytes"] / cap, rel=1e-3)


def test_without_inputs_the_order_is_the_reverse_of_the_parameters_so_a_weight_and_bias_may_swap():
    model = DigitsCNN()
    observed = ddp.bucket_report(model, 0.1, _inputs(model))
    assumed = ddp.bucket_report(model, 0.1)
    assert observed["buckets"] == assumed["buckets"] == 3 and observed["sizes"] != assumed["sizes"]
    assert sum(observed["sizes"]) == sum(assumed["sizes"]) == observed["gradient_bytes"]
    assert all(p.grad is None for p in model.parameters())  # the order is observed on a copy


def test_the_default_first_bucket_is_torchs_one_mib():
    import torch.distributed as dist

    assert ddp.FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    report = ddp.bucket_report(_stack())
    assert report["first_bucket_cap_bytes"] == 2**20 and report["sizes"][0] == 2**20 + 2048  # one layer, closed
    assert ddp.bucket_report(_stack(), 2.5)["first_bucket_cap_bytes"] == int(2.5 * 2**20)  # an explicit cap: all


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
