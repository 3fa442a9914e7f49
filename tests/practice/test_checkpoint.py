"""course.practice.checkpoint on one process: what a checkpoint holds comes back exactly; the resume position."""

import random

import numpy as np
import pytest
import torch

from course.practice import checkpoint


def _job():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler):
    optimizer.zero_grad()
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    scheduler.step()


def test_resuming_gives_the_same_parameters_and_random_numbers(tmp_path):
    torch.manual_seed(0)
    job = _job()
    _step(*job)
    checkpoint.save(tmp_path / "c.pt", *job, epoch=2, step=7)
    _step(*job)
    expected = [p.clone() for p in job[0].parameters()], random.random(), np.random.rand()
    torch.manual_seed(123)  # another model, other random states
    other = _job()
    assert checkpoint.load(tmp_path / "c.pt", *other) == (2, 7)
    _step(*other)
    assert all(torch.equal(a, b) for a, b in zip(expected[0], other[0].parameters(), strict=True))
    assert (random.random(), np.random.rand()) == expected[1:]
    assert other[2].get_last_lr() == job[2].get_last_lr()


def test_a_checkpoint_of_another_world_size_is_refused(tmp_path):
    job = _job()
    checkpoint.save(tmp_path / "c.pt", *job, epoch=0, step=0)
    saved = torch.load(tmp_path / "c.pt", weights_only=False)
    torch.save(saved | {"world_size": 4}, tmp_path / "c.pt")
    with pytest.raises(ValueError, match="saved by 4 ranks.*nproc_per_node=4"):
        checkpoint.load(tmp_path / "c.pt", *job)


def test_resume_position_skips_the_batches_already_trained():
    full = checkpoint.epoch_batches(100, 8, epoch=3)
    assert checkpoint.epoch_batches(100, 8, epoch=3, start_step=5) == full[5:]
    assert sorted(i for batch in full for i in batch) == sorted(set(i for batch in full for i in batch))
    assert full != checkpoint.epoch_batches(100, 8, epoch=4)  # each epoch its own order
