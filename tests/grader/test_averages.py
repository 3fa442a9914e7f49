"""grader.averages: a checkpoint that averages the recorded weights (torch's own AveragedModel: an EMA, SWA) is
recognised from the fingerprints alone and said in words; a model the training did not produce is not."""

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from course import models
from grader import averages
from grader.inrank.fingerprints import FINGERPRINT_DIMS, fingerprint

pytestmark = pytest.mark.unit6
SEED, STEPS, PER_EPOCH = 7, 12, 4


def projections(model: torch.nn.Module) -> torch.Tensor:
    return torch.tensor(fingerprint(list(model.parameters()), SEED)[:FINGERPRINT_DIMS], dtype=torch.float64)


def train(averaged: AveragedModel | None = None, every_epoch: bool = False) -> averages.Trajectory:
    """A DigitsCNN trained STEPS SGD steps on random digits, as rank 0's fingerprints record it; ``averaged``
    is updated after every step (or every epoch's last step)."""
    torch.manual_seed(0)
    model = models.DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    initial, after = projections(model), []
    for step in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.rand(16, 1, 8, 8)), torch.randint(0, 10, (16,))).backward()
        optimizer.step()
        after.append(projections(model))
        if averaged is not None and (not every_epoch or (step + 1) % PER_EPOCH == 0):
            averaged.update_parameters(model)
    return averages.Trajectory(initial, torch.stack(after), tuple(s // PER_EPOCH for s in range(STEPS)))


def test_torchs_ema_is_recognised_with_its_decay():
    torch.manual_seed(0)
    ema = AveragedModel(models.DigitsCNN(), multi_avg_fn=get_ema_multi_avg_fn(0.8))
    trajectory = train(ema)
    words = averages.explain(trajectory, projections(ema.module))
    assert words is not None and "exponential moving average (EMA, decay 0.8)" in words, words
    assert "started from the first step's" in words  # AveragedModel's first update copies the weights


def test_an_swa_mean_over_epoch_ends_is_recognised():
    torch.manual_seed(0)
    swa = AveragedModel(models.DigitsCNN())  # the running mean of its updates
    trajectory = train(swa, every_epoch=True)
    assert averages.explain(trajectory, projections(swa.module)) == \
        "the mean of rank 0's weights at the ends of epochs 0-2 (SWA)"


def test_a_model_the_training_did_not_produce_is_no_average():
    trajectory = train()
    torch.manual_seed(1)
    assert averages.explain(trajectory, projections(models.DigitsCNN())) is None
    nudged = trajectory.after[-1] + 1e-3 * trajectory.after[-1].norm() * torch.tensor([1.0, -1.0, 0.5, 0.0],
                                                                                      dtype=torch.float64)
    assert averages.explain(trajectory, nudged) is None  # near the last step, but not an average of the steps
