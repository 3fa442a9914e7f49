"""course.naive.staleness: staleness 0 is plain SGD (the data-parallel step on one replica); more changes the path."""

import copy

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from course import data_parallel as dp
from course.data import global_batches, load
from course.models import DigitsCNN
from course.naive import staleness as st


@pytest.fixture(scope="module")
def stale_setup():
    torch.manual_seed(0)
    data = load("digits")
    batches = global_batches(data.train, 32, steps=12)
    return DigitsCNN(width=4), batches, data.val.tensors


def test_staleness_zero_is_plain_sgd(stale_setup):
    model, batches, val = stale_setup
    stale, plain = copy.deepcopy(model), copy.deepcopy(model)
    curve = st.train_with_staleness(stale, batches, 0.2, 0, val, eval_every=4)
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.2)
    for x, y in batches:
        dp.train_step([plain], [optimizer], x, y)
    assert [step for step, _ in curve] == [0, 4, 8, 12]
    assert torch.allclose(parameters_to_vector(stale.parameters()), parameters_to_vector(plain.parameters()),
                          atol=1e-6)


def test_staleness_changes_the_trajectory_and_is_validated(stale_setup):
    model, batches, val = stale_setup
    fresh, stale = copy.deepcopy(model), copy.deepcopy(model)
    st.train_with_staleness(fresh, batches, 0.2, 0, val)
    st.train_with_staleness(stale, batches, 0.2, 3, val)
    assert not torch.allclose(parameters_to_vector(fresh.parameters()), parameters_to_vector(stale.parameters()))
    with pytest.raises(ValueError, match="staleness must be an integer >= 0 number of updates"):
        st.train_with_staleness(copy.deepcopy(model), batches, 0.2, -1, val)


def test_plot_curves_draws_one_line_per_label():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = st.plot_curves({"a": [(0, 2.0), (10, 1.0)], "b": [(0, 2.0), (10, 1.5)]})
    assert [line.get_label() for line in ax.lines] == ["a", "b"]
    assert list(ax.lines[1].get_ydata()) == [2.0, 1.5]
    plt.close(ax.figure)
