"""course.report: the assignment's progress line, and what it refuses."""

import contextlib
import io
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.report import report

pytestmark = pytest.mark.unit6


def test_one_line_in_the_course_format(capsys):
    report(3, 0.123456, 0.9)
    assert capsys.readouterr().out == "epoch   3  train_loss 0.1235  val_accuracy 0.9000\n"


@given(epoch=st.integers(0, 999), loss=st.floats(0, 100), accuracy=st.floats(0, 1))
def test_the_printed_numbers_are_the_reported_ones(epoch, loss, accuracy):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report(epoch, loss, accuracy)
    words = out.getvalue().split()
    assert words[0::2] == ["epoch", "train_loss", "val_accuracy"]
    assert int(words[1]) == epoch
    assert math.isclose(float(words[3]), loss, abs_tol=5e-5)
    assert math.isclose(float(words[5]), accuracy, abs_tol=5e-5)


@pytest.mark.parametrize("epoch, loss, accuracy, message", [
    (0, 0.5, 1.5, r"val_accuracy is a fraction in \[0, 1\], got 1.5"),
    (0, 0.5, -0.1, "val_accuracy is a fraction"),
    (0, 0.5, float("nan"), "val_accuracy is a fraction"),
    (0, "0.5", 0.9, "train_loss must be a number .*got str"),
    (True, 0.5, 0.9, "epoch must be a number .*got bool"),
])
def test_bad_values_are_refused_with_the_fix(epoch, loss, accuracy, message):
    with pytest.raises(ValueError, match=message):
        report(epoch, loss, accuracy)


def test_a_tensor_is_refused_with_the_fix():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"use tensor.item\(\)"):
        report(0, torch.tensor(0.5), 0.9)
