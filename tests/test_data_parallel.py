"""course.data_parallel: by-hand data parallelism equals one process on the whole batch; replicas stay identical."""

import copy

import naive_ranks
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils import parameters_to_vector

from course import data_parallel as dp
from course.data import global_batches, load
from course.models import MLP, DigitsCNN

pytestmark = pytest.mark.unit3


@given(batch=st.integers(1, 70), replicas=st.integers(1, 9), features=st.integers(1, 3))
def test_split_batch_covers_the_batch_in_order_with_near_equal_shards(batch, replicas, features):
    inputs, targets = torch.randn(batch, features), torch.arange(batch)
    if batch < replicas:
        with pytest.raises(ValueError, match=f"cannot feed {replicas} ranks or replicas"):
            dp.split_batch(inputs, targets, replicas)
        return
    shards = dp.split_batch(inputs, targets, replicas)
    sizes = [len(y) for _, y in shards]
    assert len(shards) == replicas and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert torch.equal(torch.cat([x for x, _ in shards]), inputs)
    assert torch.equal(torch.cat([y for _, y in shards]), targets)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_split_batch_rejects_a_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        dp.split_batch(torch.zeros(4, 1), torch.zeros(4), bad)


def test_split_batch_rejects_mismatched_inputs_and_targets():
    with pytest.raises(ValueError, match=r"same batch dimension, got shapes \(4, 1\) and \(3,\)"):
        dp.split_batch(torch.zeros(4, 1), torch.zeros(3), 2)


def batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=generator), torch.randint(10, (n,), generator=generator)


def test_split_batch_equal_gives_equal_shards_in_rank_order():
    x, y = batch(12)
    shards = dp.split_batch(x, y, 4, equal=True)
    assert [len(s[0]) for s in shards] == [3, 3, 3, 3]
    assert torch.equal(torch.cat([s[0] for s in shards]), x) and torch.equal(shards[2][1], y[6:9])


@settings(max_examples=40, deadline=None)
@given(world_size=st.integers(1, 16), per_rank=st.integers(1, 8))
def test_shards_are_equal_ordered_and_cover_the_batch(world_size, per_rank):
    x, y = batch(world_size * per_rank)
    shards = dp.split_batch(x, y, world_size, equal=True)
    assert len(shards) == world_size and all(len(sx) == len(sy) == per_rank for sx, sy in shards)
    assert torch.equal(torch.cat([sx for sx, _ in shards]), x) and torch.equal(torch.cat([sy for _, sy in shards]), y)


@pytest.mark.parametrize("world_size, n, message", [
    (5, 12, "does not split evenly over 5 ranks"),
    (0, 12, "world_size must be a positive integer number of ranks"),
    (2, 0, "a batch of 0 samples cannot feed 2 ranks or replicas"),
])
def test_split_batch_equal_rejects_bad_input(world_size, n, message):
    x, y = batch(n)
    with pytest.raises(ValueError, match=message):
        dp.split_batch(x, y, world_size, equal=True)


def test_numpy_world_size_is_accepted():
    x, y = batch(8)
    assert len(dp.split_batch(x, y, np.int64(4), equal=True)) == 4


def test_split_batch_without_targets_splits_the_inputs_alone():
    x, _ = batch(10)
    shards = dp.split_batch(x, None, 3)
    assert [len(sx) for sx, _ in shards] == [4, 3, 3] and all(sy is None for _, sy in shards)


def test_a_differentiable_replica_sums_its_gradient_into_the_original():
    torch.manual_seed(0)
    model, (x, y) = MLP(hidden=(8,)), batch(6)
    copies = dp.replicate(model, ["cpu"] * 2, differentiable=True)
    assert not list(copies[0].parameters())  # its tensors are autograd copies, not leaves of its own
    loss = sum(torch.nn.functional.cross_entropy(c(sx), sy, reduction="sum") for c, (sx, sy)
               in zip(copies, dp.split_batch(x, y, 2), strict=True))
    loss.backward()
    reference = copy.deepcopy(model)
    reference.zero_grad()
    torch.nn.functional.cross_entropy(reference(x), y, reduction="sum").backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(got.grad, want.grad, atol=1e-6)


def test_train_step_reports_the_shard_and_global_gradient_norms():
    torch.manual_seed(0)
    model, (x, y) = MLP(hidden=(8,)), batch(12)
    replicas = dp.replicate(model, ["cpu"] * 3)
    stats = dp.train_step(replicas, [torch.optim.SGD(r.parameters(), lr=0.0) for r in replicas], x, y)

    def norm_sq(inputs, targets):
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(model(inputs), targets), list(model.parameters()))
        return float(sum(g.double().pow(2).sum() for g in grads))

    assert stats.local_grad_norm_sq == pytest.approx(sum(norm_sq(sx, sy) for sx, sy in dp.split_batch(x, y, 3)) / 3)
    assert stats.global_grad_norm_sq == pytest.approx(norm_sq(x, y), rel=1e-5)
    with torch.no_grad():
        assert stats.loss == pytest.approx(float(torch.nn.functional.cross_entropy(model(x), y)), rel=1e-6)


@pytest.mark.parametrize("world_size, global_batch_size", [(4, 32), (3, 31)])  # 31: shards of 11, 10, 10
def test_train_step_equals_one_process_on_the_whole_batch(world_size, global_batch_size):
    torch.manual_seed(0)
    model = DigitsCNN(width=4)
    reference = copy.deepcopy(model)
    replicas = dp.replicate(model, ["cpu"] * world_size)
    optimizers = [torch.optim.SGD(r.parameters(), lr=0.3, momentum=0.9) for r in replicas]
    single = torch.optim.SGD(reference.parameters(), lr=0.3, momentum=0.9)
    batches = global_batches(load("digits").train, global_batch_size, steps=5)
    for x, y in batches:
        loss = dp.train_step(replicas, optimizers, x, y).loss
        expected = dp.train_step([reference], [single], x, y).loss
        assert loss == pytest.approx(expected, rel=1e-5)
    assert dp.max_replica_difference(replicas) == 0.0
    moved = (parameters_to_vector(reference.parameters()) - parameters_to_vector(model.parameters())).abs().max()
    assert moved > 1e-3  # training happened, so equality below is not trivial
    assert torch.allclose(parameters_to_vector(replicas[0].parameters()),
                          parameters_to_vector(reference.parameters()), atol=1e-5)


def test_average_gradients_is_the_weighted_sum_on_every_replica():
    replicas = dp.replicate(torch.nn.Linear(3, 1), ["cpu"] * 3)
    for k, replica in enumerate(replicas):
        for p in replica.parameters():
            p.grad = torch.full_like(p, float(k + 1))
    dp.average_gradients(replicas, [0.5, 0.25, 0.25])
    for replica in replicas:
        assert all(torch.equal(p.grad, torch.full_like(p, 1.75)) for p in replica.parameters())


def test_average_gradients_names_what_is_missing():
    replicas = dp.replicate(MLP(), ["cpu"] * 2)
    with pytest.raises(ValueError, match="call backward on every replica first"):
        dp.average_gradients(replicas)
    with pytest.raises(ValueError, match=r"one weight per replica \(2\), got 3"):
        dp.average_gradients(replicas, [1, 1, 1])


def test_replicate_and_train_step_reject_bad_arguments():
    with pytest.raises(ValueError, match="at least one device"):
        dp.replicate(MLP(), [])
    with pytest.raises(ValueError, match=r"one optimizer per replica \(2\), got 1"):
        replicas = dp.replicate(MLP(), ["cpu"] * 2)
        dp.train_step(replicas, [torch.optim.SGD(replicas[0].parameters(), lr=0.1)], torch.zeros(4, 1, 8, 8),
                      torch.zeros(4, dtype=torch.int64))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_allreduce_on_ranks_equals_one_process_and_ranks_stay_identical():
    report = naive_ranks.report()
    losses, expected = naive_ranks.one_process("sgd")
    for rank in report:
        assert torch.allclose(rank["ps"]["allreduce_params"], expected, atol=1e-6)
        assert rank["ps"]["allreduce"] == pytest.approx(losses, rel=1e-5)
    assert "does not split evenly over 4 ranks" in report[0]["errors"]["indivisible"]


def test_replica_devices_cycle_through_the_gpus_or_use_the_cpu():
    from course import world

    gpus = world.detect_hardware().gpu_count
    devices = dp.replica_devices(5)
    assert len(devices) == 5
    expected = [torch.device("cuda", i % gpus) for i in range(5)] if gpus else [torch.device("cpu")] * 5
    assert devices == expected
