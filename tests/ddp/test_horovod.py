"""course.ddp.horovod: broadcasts from any root rank, metrics averaged or summed over ranks, and the whole recipe."""

import distributed_optimizer_ranks as ranks
import pytest

from course.ddp import horovod

pytestmark = pytest.mark.unit4


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_broadcasts_metrics_and_the_recipe_on_two_ranks():
    zero, one = ranks.report()
    for key in ("weight", "running_mean", "momentum"):
        assert zero[key] == one[key], key
    assert one["running_mean"] == [1.0, 1.0]  # root_rank=1's values won
    assert zero["lr"] == one["lr"] == pytest.approx(0.2)
    assert zero["avg"] == one["avg"] == 0.5 and zero["sum"] == 1.0
    assert zero["tensor"] == [2.0, 1.0]
    # Notebook 04b's whole recipe: each rank starts from its own model and lr; rank 0's win, then lock-step.
    for rank, result in enumerate((zero, one)):
        assert (result["recipe"]["lr_before"], result["recipe"]["lr_after"]) == (pytest.approx(0.05 * (rank + 1)), 0.05)
        assert result["recipe"]["avg_loss"] == pytest.approx((zero["recipe"]["loss"] + one["recipe"]["loss"]) / 2)
    assert zero["recipe"]["weight_before"] != one["recipe"]["weight_before"]
    assert zero["recipe"]["weight_after"] == one["recipe"]["weight_after"]
    assert zero["recipe"]["weights"] == one["recipe"]["weights"]


def test_without_a_process_group_a_metric_is_its_own_average():
    assert horovod.allreduce_metric(2.5) == 2.5  # a single process is its own average
