"""course.ddp.conversion_accuracy: steps per epoch against torch's loaders, the runs read from the scripts' real
output, and the words chosen by the numbers (never a verdict on whether an accuracy clears a threshold)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from course import data, models, train
from course.ddp import conversion_accuracy as ca
from course.ddp import scripts as ddp_scripts
from course.optimization import lr_scaling


def make_run(label="run", world_size=1, global_batch_size=32, lr=0.05, steps_per_epoch=38,
             val_accuracies=(0.9, 0.95), test_accuracy=0.94):
    return ca.Run(label, world_size, global_batch_size, lr, steps_per_epoch, tuple(val_accuracies), test_accuracy)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), per_rank=st.integers(1, 64), world_size=st.integers(1, 8))
def test_steps_per_epoch_is_what_the_scripts_loaders_give(n, per_rank, world_size):
    # the loaders of the step scripts: DistributedSampler (pads) and DataLoader (keeps the partial last batch)
    lengths = {len(DataLoader(range(n), batch_size=per_rank,
                              sampler=DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True)))
               for rank in range(world_size)}
    assert lengths == {ca.steps_per_epoch(n, per_rank * world_size, world_size)}


def test_steps_per_epoch_of_the_notebooks_runs_in_closed_form():
    n = len(data.load().train)
    assert ca.steps_per_epoch(n, 32) == len(DataLoader(range(n), batch_size=32)) == math.ceil(n / 32)
    assert ca.steps_per_epoch(n, 128, 4) == math.ceil(math.ceil(n / 4) / 32)


@pytest.mark.parametrize(("args", "message"), [((100, 10, 4), "does not split over world_size=4"),
                                               ((0, 32, 1), "n_samples must be"), ((100, 32, True), "world_size")])
def test_steps_per_epoch_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        ca.steps_per_epoch(*args)


def test_tolerance_is_two_binomial_standard_errors():
    assert ca.tolerance(0.5, 100) == pytest.approx(0.1)
    assert ca.tolerance(0.9, 400) == pytest.approx(2 * math.sqrt(0.9 * 0.1 / 400))
    assert ca.tolerance(1.0, 300) == 0.0
    with pytest.raises(ValueError, match="accuracy in"):
        ca.tolerance(1.5, 300)


def test_margin_is_sampling_noise_and_a_swinging_run_is_no_match():
    steady, swinging = make_run(val_accuracies=(0.95, 0.95)), make_run("b", val_accuracies=(0.90, 0.97))
    assert ca.margin(steady, steady, 0.95, 300) == pytest.approx(ca.tolerance(0.95, 300))
    assert ca.margin(steady, swinging, 0.95, 300) == pytest.approx(ca.tolerance(0.95, 300))  # a swing never widens it
    assert ca.last_swing(make_run(val_accuracies=(0.5,))) == 0.0
    assert ca.unsettled([steady, swinging], 0.05) == (
        " (but 'b' moved by 0.070 in its last epoch, more than the gap: more epochs could change this)")
    assert ca.unsettled([steady, swinging], 0.08) == ""
    # issue 33: 0.897 against 0.990, with the converted run still swinging by 0.1 a epoch, is a gap, not a match
    single = make_run("single", val_accuracies=(0.98, 0.99), test_accuracy=0.99)
    moving = make_run("ddp", 4, 128, 0.2, 10, (0.797, 0.897), 0.89)
    text = ca.explain_gap(single, moving, 300)
    assert "trails the single device by 0.093" in text and "moved by 0.100" in text and "matches" not in text


@pytest.mark.parametrize(("before", "after", "verdict"), [
    (0.80, 0.89, "closes"), (0.80, 0.95, "closes"), (0.80, 0.85, "narrows"), (0.80, 0.80, "does not close here"),
    (0.80, 0.70, "does not close here")])
def test_gap_verdict(before, after, verdict):
    assert ca.gap_verdict(0.9, before, after, margin=0.02) == verdict


def test_the_words_follow_the_numbers():
    single = make_run("single", val_accuracies=(0.60, 0.97, 0.98), test_accuracy=0.97)
    behind = make_run("ddp", 4, 128, 0.2, 10, (0.3, 0.85, 0.86), 0.84)
    level = make_run("ddp", 4, 128, 0.2, 10, (0.3, 0.97, 0.975), 0.97)
    text = ca.explain_gap(single, behind, 300)
    assert "trails the single device by 0.120" in text and "10 optimizer steps instead of 38" in text
    assert "30 steps in all against 114 (3.8x fewer)" in text and "rate of 0.2 instead of 0.05" in text
    assert "matches the single device" in ca.explain_gap(single, level, 300)
    # 30 large steps vs the single device after 38 steps (0.60): more per step; but not 114 steps' worth
    assert "did more than" in ca.per_step(single, behind, 300) and "they did not" in ca.per_step(single, behind, 300)
    assert "they did." in ca.per_step(single, level, 300)
    assert "did not clearly do more than" in ca.per_step(make_run(val_accuracies=(0.9, 0.95, 0.96)), behind, 300)
    # the single device's first epoch with at least the 30 large steps is its first (38 steps), not its second
    assert "after 38 steps, 0.600" in ca.per_step(single, behind, 300)
    fixed = make_run("fixed", 4, 32, 0.05, 38, (0.96, 0.975), 0.965)
    text = ca.conclusion(single, behind, fixed, 300, 300)
    assert text.startswith("With 76 steps of a global batch of 32: on validation the gap closes")
    assert "on test the gap closes" in text
    partly = make_run("fixed", 4, 32, 0.05, 38, (0.90, 0.90), 0.90)
    assert "on validation the gap narrows" in ca.conclusion(single, behind, partly, 300, 300)


def test_a_table_row_per_run():
    table = ca.format_table([make_run("1 device"), make_run("4 ranks", 4, 128, 0.2, 10)]).splitlines()
    assert len(table) == 3 and table[2].split()[:7] == ["4", "ranks", "4", "128", "10", "20", "0.2"]


def test_read_run_rejects_output_that_is_not_a_step_scripts(tmp_path):
    with pytest.raises(ValueError, match="expected a step script's output"):
        ca.read_run("x", "hello\n", tmp_path / "checkpoint.pt")


def _independent_test_accuracy(checkpoint):
    model = models.DigitsCNN()
    model.load_state_dict(torch.load(checkpoint))
    return train.evaluate(model, DataLoader(data.load().test, batch_size=50))[1]


@pytest.mark.timeout(120)
def test_a_single_device_run_is_read_from_its_real_output(tmp_path):
    done = ca.run_single_device(ddp_scripts.step_scripts()[0], ("--out-dir", str(tmp_path), "--epochs", "1",
                                                         "--batch-size", "64", "--lr", "0.03"), timeout_s=100)
    run = ca.read_run("1 device", done.stdout, tmp_path / "checkpoint.pt")
    printed = [float(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert (run.world_size, run.global_batch_size, run.lr) == (1, 64, 0.03)
    assert run.steps_per_epoch == len(DataLoader(data.load().train, batch_size=64)) and run.steps == run.steps_per_epoch
    assert run.val_accuracies == tuple(printed) and len(printed) == 1
    assert run.test_accuracy == pytest.approx(_independent_test_accuracy(tmp_path / "checkpoint.pt"))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_ddp_run_is_read_from_its_real_output_with_the_linear_rule_applied(tmp_path):
    done = ddp_scripts.run_torchrun(ddp_scripts.step_scripts()[-1], 2, ("--out-dir", str(tmp_path), "--epochs", "2"),
                                    timeout_s=220)
    run = ca.read_run("2 ranks", done.stdout, tmp_path / "checkpoint.pt")
    printed = [float(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert (run.world_size, run.global_batch_size) == (2, 64)  # the script's default 32 per rank
    assert run.lr == pytest.approx(lr_scaling.scaled_lr(0.05, 32, 64, "linear"))  # its defaults: 0.05 for 32
    n = len(data.load().train)
    assert run.steps_per_epoch == len(DataLoader(range(n), batch_size=32, sampler=DistributedSampler(
        range(n), num_replicas=2, rank=0)))
    assert run.val_accuracies == tuple(printed) and len(printed) == 2
    assert run.test_accuracy == pytest.approx(_independent_test_accuracy(tmp_path / "checkpoint.pt"))
