"""course.arguments: a model/data mismatch becomes one ValueError that says expected vs got and the fix."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from course import models
from course.arguments import check_batch, check_choice, check_count, check_lr, check_model_fits_data

pytestmark = pytest.mark.unit1


def digits(n=4, labels=10):
    return torch.rand(n, 1, 8, 8), torch.arange(n) % labels


def test_a_model_that_fits_passes_and_keeps_its_mode_and_buffers():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.BatchNorm1d(10))
    before = model.state_dict()["2.running_mean"].clone()
    check_model_fits_data(model, F.cross_entropy, *digits())
    assert model.training and torch.equal(model.state_dict()["2.running_mean"], before)
    check_model_fits_data(model.eval(), F.cross_entropy, *digits())
    assert not model.training


def test_wrong_sample_shape_says_what_it_got_and_how_to_fix_it():
    with pytest.raises(ValueError, match=r"one sample has shape \(1, 7, 7\).*build it for input_shape=\(1, 7, 7\)"):
        check_model_fits_data(models.LinearModel((1, 8, 8)), F.cross_entropy, torch.rand(3, 1, 7, 7),
                              torch.zeros(3, dtype=torch.long))


def test_labels_beyond_the_outputs_are_refused_before_the_loss_sees_them():
    with pytest.raises(ValueError, match=r"labels must be in 0..9 .* got labels from 0 to 11.*num_classes=12"):
        check_model_fits_data(models.LinearModel(), F.cross_entropy, *digits(12, labels=12))


def test_a_loss_that_refuses_the_output_is_reported():
    with pytest.raises(ValueError, match=r"the loss refuses the model's output \(1, 10\)"):
        check_model_fits_data(models.LinearModel(), F.mse_loss, torch.rand(2, 1, 8, 8), torch.rand(2, 3))


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3)])
def test_count_accepts_any_integer_type(value):
    assert check_count("epochs", value) == 3 and type(check_count("epochs", value)) is int


@pytest.mark.parametrize("value, minimum, match", [
    (0, 1, r"epochs must be a positive integer, got 0 \(int\)"),
    (-2, 0, r"epochs must be an integer >= 0, got -2"),
    (True, 1, r"got True \(bool\)"),
    (2.0, 1, r"got 2.0 \(float\)"),
])
def test_count_refuses_the_rest(value, minimum, match):
    with pytest.raises(ValueError, match=match):
        check_count("epochs", value, minimum)


def test_check_count_with_a_maximum_names_the_range():
    assert check_count("batch_size", 8, maximum=8) == 8
    with pytest.raises(ValueError, match=r"batch_size must be an integer number of samples from 1 to 8, got 9 \(int\)"):
        check_count("batch_size", 9, unit="number of samples", maximum=8)


def test_check_choice_returns_an_allowed_value_and_lists_them_otherwise():
    assert check_choice("op", "avg", ("avg", "sum")) == "avg"
    with pytest.raises(ValueError, match=r"op must be one of \['avg', 'sum'\], got 'max'"):
        check_choice("op", "max", ("avg", "sum"))


def test_check_batch_returns_the_batch_size_and_names_a_mismatch():
    assert check_batch(torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)) == 5
    with pytest.raises(ValueError, match="inputs hold 5 samples but targets hold 4"):
        check_batch(torch.zeros(5, 3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size 0"):
        check_batch(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), True, "0.1"])
def test_check_lr_accepts_finite_non_negative_numbers_only(bad):
    assert check_lr(0) == 0.0 and check_lr(3) == 3.0
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        check_lr(bad)
