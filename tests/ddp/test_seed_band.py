"""course.ddp.seed_band: step 0's training in process, seed 0 bit for bit the script's; the band and its words."""

import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.ddp import conversion_accuracy, seed_band

STEP0 = Path(__file__).resolve().parents[2] / "notebooks" / "ddp_steps" / "step0_single_device.py"


def test_seed_0_is_the_step0_scripts_run(tmp_path):
    done = conversion_accuracy.run_single_device(STEP0, ("--out-dir", str(tmp_path), "--epochs", "2"))
    script = conversion_accuracy.read_run("step 0", done.stdout, tmp_path / "checkpoint.pt")
    mine = seed_band.single_device_run(0, epochs=2, at_steps=(5, 38))
    printed = tuple(float(a) for a in re.findall(r"val accuracy (\S+)", done.stdout))
    assert mine.val_accuracies == pytest.approx(printed, abs=5e-4)  # printed with 3 decimals
    assert mine.test_accuracy == pytest.approx(script.test_accuracy, abs=1e-9)
    assert mine.val_at[38] == pytest.approx(mine.val_accuracies[0], abs=1e-9)  # step 38 ends epoch 0
    assert set(mine.val_at) == {5, 38}


def test_another_seed_trains_differently():
    assert seed_band.single_device_run(1, epochs=1).val_accuracies != seed_band.single_device_run(
        0, epochs=1).val_accuracies


def test_band_is_the_t_prediction_interval():
    band = seed_band.band([0.2, 0.3, 0.4])
    half = 4.302653 * 0.1 * math.sqrt(1 + 1 / 3)  # t(0.975, 2 degrees of freedom) = 4.3027
    assert band.mean == pytest.approx(0.3) and band.n == 3
    assert band.low == pytest.approx(max(0.0, 0.3 - half)) and band.high == pytest.approx(min(1.0, 0.3 + half))


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=8))
def test_band_holds_its_mean_and_stays_within_0_and_1(values):
    band = seed_band.band(values)
    assert 0.0 <= band.low <= band.mean + 1e-12 and band.mean - 1e-12 <= band.high <= 1.0
    assert band.holds(band.mean)


def test_one_seed_is_refused():
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_band.band([0.9])


@pytest.mark.parametrize(("value", "word"), [(0.9, "inside it"), (0.99, "above it"), (0.5, "below it")])
def test_compare_says_where_the_value_lies(value, word):
    sentence = seed_band.compare("4 ranks", value, seed_band.Band(0.9, 0.85, 0.95, 5), "validation")
    assert word in sentence and f"{value:.3f}" in sentence and "0.850-0.950" in sentence


def test_step_for_step_says_behind_only_below_the_band():
    band = seed_band.Band(0.3, 0.1, 0.5, 5)
    assert "did less than a small one" in seed_band.step_for_step(30, 0.05, band, 114)
    assert "trails only because it stopped at 30 steps" in seed_band.step_for_step(30, 0.3, band, 114)


def test_a_seed_run_tabulates_as_the_single_device():
    run = seed_band.as_run(seed_band.SeedRun(0, {}, (0.5, 0.8), 0.75), "1 device")
    assert (run.world_size, run.global_batch_size, run.steps_per_epoch, run.steps) == (1, 32, 38, 76)
