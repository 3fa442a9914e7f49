"""course.optimization.batch_sweep: training at many global batch sizes (steps to target, scaling efficiency,
generalization gap)."""

import math

import numpy as np
import pytest
import torch

from course import data, models
from course.optimization import batch_sweep as bs


def digits_like(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A separable toy problem shaped like the digits: the label is written into pixel (0, label)."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.randint(10, (n,), generator=generator)
    x = 0.1 * torch.rand(n, 1, 8, 8, generator=generator)
    x[torch.arange(n), 0, y // 8, y % 8] += 1.0
    return x, y


def test_train_run_reaches_the_target_and_reports_epochs():
    train, val = digits_like(256), digits_like(64, seed=1)
    config = bs.SweepConfig(base_lr=0.5, base_batch_size=32, max_steps=100, target_accuracy=0.9)
    result = bs.train_run(train, val, 32, "linear", 0, config)
    assert result.steps_to_target is not None and not result.diverged
    assert result.epochs_to_target == pytest.approx(result.steps_to_target * 32 / 256)
    assert len(result.losses) == result.steps_to_target  # stopped at the target


def test_sweep_covers_the_grid_in_order_and_warmup_tames_a_huge_rate():
    splits = data.load()
    train, val = data.tensors(splits.train, torch.device("cpu")), data.tensors(splits.val, torch.device("cpu"))
    config = bs.SweepConfig(global_batch_sizes=(8, 512), rules=("none", "linear"), warmup_steps=(0, 10), base_lr=0.1,
                            base_batch_size=8, max_steps=20, stop_at_target=False)
    results = bs.sweep(train, val, config)
    assert [(r.global_batch_size, r.rule, r.warmup_steps) for r in results] == [
        (b, rule, w) for b in (8, 512) for rule in ("none", "linear") for w in (0, 10)]
    cold, warm = results[6], results[7]  # batch 512, linear rule: lr 6.4, without and with warmup
    assert cold.lr == warm.lr == pytest.approx(6.4)
    assert max(cold.losses) > 2 * math.log(10) > max(warm.losses)  # the cold start blows up, the warm one never


def test_train_run_rejects_a_batch_larger_than_the_data_or_zero():
    train, val = digits_like(64), digits_like(16)
    expected = "global_batch_size must be an integer number of training samples from 1 to 64, got"
    with pytest.raises(ValueError, match=expected + " 65"):
        bs.train_run(train, val, 65, "linear", 0)
    with pytest.raises(ValueError, match=expected + " 0"):
        bs.train_run(train, val, 0, "linear", 0)


def test_same_epochs_gives_bigger_batches_fewer_steps():
    train, val = digits_like(256), digits_like(64, seed=1)
    small, big = bs.same_epochs(train, val, (16, 128), epochs=2, config=bs.SweepConfig(base_batch_size=16))
    assert (len(small.losses), len(big.losses)) == (32, 4)


def test_scaling_efficiency_is_one_for_perfect_scaling_and_drops_after():
    def run(global_batch_size, steps):
        return bs.RunResult(global_batch_size, "linear", 0, 0.1, steps, None, False, 1.0, 1.0, 0.0, 0.0, [])

    results = [run(8, 100), run(16, 50), run(32, 50), run(64, None), run(128, 10)]
    assert bs.scaling_efficiency(results, "linear", 0) == pytest.approx({8: 1.0, 16: 1.0, 32: 0.5,
                                                                         128: 800 / 1280})
    assert bs.scaling_efficiency(results, "sqrt", 0) == {}


def test_without_warmup_the_largest_linear_rate_diverges_and_with_warmup_it_trains():
    # The warmup demo of notebook 02: global batch 1024, linear rule from 0.1 at batch 8 (lr 12.8).
    splits = data.load()
    train, val = data.tensors(splits.train, torch.device("cpu")), data.tensors(splits.val, torch.device("cpu"))
    config = bs.SweepConfig(base_lr=0.1, base_batch_size=8, max_steps=100, target_accuracy=0.95,
                            diverged_loss=4 * math.log(10))
    cold = bs.train_run(train, val, 1024, "linear", 0, config)
    warm = bs.train_run(train, val, 1024, "linear", 8, config)
    assert cold.lr == warm.lr == pytest.approx(12.8)
    assert cold.diverged and cold.steps_to_target is None
    assert len(cold.losses) < 10 and cold.losses[-1] > config.diverged_loss  # stopped at the first blow-up
    assert not warm.diverged and warm.steps_to_target is not None
    assert max(warm.losses) < config.diverged_loss
    assert warm.steps_to_target > 8  # the notebook's claim: it trains on past its warmup, at the peak rate


def test_describe_rule_follows_the_steps_to_target():
    def run(global_batch_size, steps, rule="none"):
        return bs.RunResult(global_batch_size, rule, 0, 0.1, steps, None, False, 1.0, 1.0, 0.0, 0.0, [])

    flat = [run(8, 792), run(16, 802), run(32, None), run(64, None)]
    text = bs.describe_rule(flat, "none", 0, 1000)
    assert text == ("none rule: batch 8: 792 steps, batch 16: 802 steps; missed the target within 1000 steps at "
                    "batch 32, 64: bigger batches do not cut the steps")
    falling = [run(8, 800, "linear"), run(16, 410, "linear")]
    assert bs.describe_rule(falling, "linear", 0, 1000).endswith("bigger batches cut the steps")
    with pytest.raises(ValueError, match="no runs with rule 'sqrt'"):
        bs.describe_rule(falling, "sqrt", 0, 1000)


def test_same_train_accuracy_stops_each_run_at_the_training_threshold():
    train, val = digits_like(256), digits_like(64, seed=1)
    config = bs.SweepConfig(base_lr=0.5, base_batch_size=32, max_steps=200)
    runs = bs.same_train_accuracy(train, val, (16, 64), train_accuracy=0.9, rule="linear", warmup_steps=0,
                                  config=config)
    for run in runs:
        assert 1 < run.steps_to_target == len(run.losses) and run.train_accuracy >= 0.9
        probe = bs.train_run(train, val, run.global_batch_size, "linear", 0,
                             bs.SweepConfig(base_lr=0.5, base_batch_size=32, max_steps=run.steps_to_target - 1,
                                            stop_at_target=False))
        assert probe.train_accuracy < 0.9  # one step earlier the threshold was not reached yet
    with pytest.raises(ValueError, match="target_split must be 'val' or 'train', got 'test'"):
        bs.SweepConfig(target_split="test")


def test_default_sweep_scales_near_perfectly_for_three_doublings_then_loses_efficiency():
    # What notebook 02's sweep shows for the linear rule with warmup (only that rule is run here, for speed).
    splits = data.load()
    train, val = data.tensors(splits.train, torch.device("cpu")), data.tensors(splits.val, torch.device("cpu"))
    results = bs.sweep(train, val, bs.SweepConfig(rules=("linear",), warmup_steps=(10,)))
    efficiency = bs.scaling_efficiency(results, "linear", 10)
    assert list(efficiency) == [8, 16, 32, 64, 128, 256, 512, 1024]  # every batch size reached the target
    assert min(efficiency[b] for b in (8, 16, 32, 64)) >= 0.9
    assert efficiency[128] < 0.9 and efficiency[1024] < 0.5
    assert efficiency[1024] < efficiency[256] < efficiency[128]  # diminishing returns


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_steps=0), r"max_steps must be a positive integer, got 0"),
    (dict(max_steps=-5), r"max_steps must be a positive integer, got -5"),
    (dict(global_batch_sizes=()), r"global_batch_sizes is empty"),
    (dict(global_batch_sizes=(16, 0)), r"each batch size must be a positive integer number of samples, got 0"),
    (dict(warmup_steps=(-1,)), r"warmup_steps must be an integer >= 0, got -1"),
    (dict(rules=("linear", "cubic")), r"unknown rules \['cubic'\]"),
])
def test_sweep_config_refuses_settings_that_cannot_train(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bs.SweepConfig(**kwargs)


def test_train_run_refuses_data_the_model_cannot_take():
    train, val = digits_like(32), digits_like(16, seed=1)
    with pytest.raises(ValueError, match=r"training samples have shape \(1, 8, 8\) but validation samples \(1, 7, 7\)"):
        bs.train_run(train, (val[0][:, :, :7, :7], val[1]), 8, "linear", 0)
    with pytest.raises(ValueError, match=r"labels must be in 0..9 .* got labels from 3 to 12"):
        bs.train_run((train[0], train[1] + 3), val, 8, "linear", 0)
    with pytest.raises(ValueError, match=r"one sample has shape \(1, 1, 8, 8\)"):
        bs.train_run((train[0].unsqueeze(1), train[1]), (val[0].unsqueeze(1), val[1]), 8, "linear", 0,
                     bs.SweepConfig(model="cnn"))


@pytest.mark.parametrize("epochs", [0, -1])
def test_same_epochs_refuses_a_non_positive_number_of_epochs(epochs):
    with pytest.raises(ValueError, match=f"epochs must be a positive integer, got {epochs}"):
        bs.same_epochs(digits_like(32), digits_like(16), (8,), epochs=epochs)


def test_numpy_integers_are_accepted_as_batch_sizes_and_warmup():
    train, val = digits_like(64), digits_like(16, seed=1)
    config = bs.SweepConfig(base_lr=0.5, base_batch_size=np.int64(16), max_steps=np.int64(3), stop_at_target=False)
    run = bs.train_run(train, val, np.int64(16), "linear", np.int64(2), config)
    assert len(run.losses) == 3 and run.global_batch_size == 16 and type(run.global_batch_size) is int


def test_adam_is_torch_adam_at_the_scaled_rate():
    train, val = digits_like(256), digits_like(64, seed=1)
    config = bs.SweepConfig(optimizer="adam", base_lr=0.01, base_batch_size=32, max_steps=3, stop_at_target=False)
    result = bs.train_run(train, val, 128, "sqrt", 0, config)
    torch.manual_seed(config.seed)  # the same model and batches by hand, with torch.optim.Adam
    model = models.build(config.model, (1, 8, 8))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)  # 0.01 x sqrt(128 / 32)
    losses = []
    for batch in bs._batches(256, 128, 3, torch.Generator().manual_seed(config.seed)):
        loss = torch.nn.functional.cross_entropy(model(train[0][batch]), train[1][batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert result.lr == pytest.approx(0.02) and result.losses == pytest.approx(losses, rel=1e-6)


def test_unknown_optimizer_names_the_choices():
    with pytest.raises(ValueError, match="'sgd', 'lars' or 'adam'"):
        bs.train_run(*[digits_like(64)] * 2, 32, "none", 0, bs.SweepConfig(optimizer="rmsprop"))
