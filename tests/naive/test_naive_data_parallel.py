"""course.naive.naive_data_parallel: scatter, replicate, parallel_apply, gather, checked against one device and
torch.nn.DataParallel."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course.models import DigitsCNN
from course.naive import naive_data_parallel as ndp

CPU = torch.device("cpu")


@given(batch=st.integers(1, 40), num_devices=st.integers(1, 6))
def test_scatter_splits_the_batch_in_order_into_near_equal_chunks(batch, num_devices):
    inputs = torch.arange(batch * 3.0).reshape(batch, 3)
    if batch < num_devices:
        with pytest.raises(ValueError, match=f"cannot feed {num_devices} ranks or replicas"):
            ndp.scatter(inputs, [CPU] * num_devices)
        return
    chunks = ndp.scatter(inputs, [CPU] * num_devices)
    assert torch.equal(torch.cat(chunks), inputs)
    sizes = [len(c) for c in chunks]
    assert len(sizes) == num_devices and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def _batch(n: int = 24, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator)


@pytest.mark.parametrize("num_devices", [1, 2, 3, 4])
def test_forward_equals_one_device_on_the_whole_batch(num_devices):
    torch.manual_seed(0)
    model = DigitsCNN()
    images, _ = _batch()
    assert torch.allclose(ndp.forward(model, images, [CPU] * num_devices), model(images), atol=1e-6)


@settings(deadline=None, max_examples=10)
@given(num_devices=st.integers(1, 4), batch=st.integers(4, 33), lr=st.floats(0.01, 0.5))
def test_training_equals_one_device_and_torch_data_parallel(num_devices, batch, lr):
    torch.manual_seed(0)
    ours, single = DigitsCNN(), DigitsCNN()
    single.load_state_dict(ours.state_dict())
    reference = nn.DataParallel(single)  # without GPUs it runs the module on the whole batch: one device
    ours_opt = torch.optim.SGD(ours.parameters(), lr=lr, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9)
    for step in range(3):
        images, labels = _batch(batch, seed=step)
        loss = ndp.train_step(ours, ours_opt, images, labels, [CPU] * num_devices)
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = nn.functional.cross_entropy(reference(images), labels)
        ref_loss.backward()
        ref_opt.step()
        assert loss == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-6)
    for mine, theirs in zip(ours.parameters(), single.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5), (mine - theirs).abs().max()


def test_every_replicas_gradient_is_summed_into_the_modules_own_parameters():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    inputs = torch.randn(6, 3)
    ndp.forward(model, inputs, [CPU] * 3).sum().backward()
    assert torch.allclose(model.weight.grad, torch.ones(2, 1) * inputs.sum(0))  # d(sum Wx+b)/dW, whole batch
    assert torch.allclose(model.bias.grad, torch.full((2,), 6.0))


def test_a_failing_replica_is_named():
    with pytest.raises(RuntimeError, match="the replica on device 0 failed"):
        ndp.forward(DigitsCNN(), torch.randn(4, 3, 8, 8), [CPU] * 2)  # 3 channels into a 1-channel model


def test_device0_traffic_is_the_closed_form_and_grows_with_the_devices():
    model = DigitsCNN()
    images, _ = _batch(32)
    state = sum(t.numel() * 4 for t in model.state_dict().values())
    grads = sum(p.numel() * 4 for p in model.parameters())
    for n in (1, 2, 4, 8):
        traffic = ndp.device0_traffic(model, images, n, num_outputs=10)
        kept = -(-32 // n)
        assert traffic == ndp.Traffic(n, (32 - kept) * 64 * 4, (n - 1) * state, (32 - kept) * 10 * 4, (n - 1) * grads)
    assert ndp.device0_traffic(model, images, 1, 10).total == 0


def test_every_system_is_mapped_onto_all_five_steps_and_cites_a_source():
    names = [s.name for s in ndp.SYSTEMS]
    assert {"Torch / cunn DataParallelTable", "Caffe2 data_parallel_model", "torch.nn.DataParallel",
            "TF MirroredStrategy", "Horovod", "PyTorch DDP"} == set(names)
    for system in ndp.SYSTEMS:
        assert all(getattr(system, step).strip() for step in ndp.STEPS), system.name
        assert system.source and "seeds/" not in system.source, system.name  # a published work, named for students
