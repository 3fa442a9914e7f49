"""grader.inrank.probed_data: the training samples a model consumes are named by content, however the batch was
made (indexed by hand, normalized, another dtype), and nothing else is taken for one."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course import data
from grader.inrank.probed_data import Catalogue, TrainedBatches, _standardized

pytestmark = pytest.mark.unit6


@pytest.fixture(scope="module")
def splits():
    return data.load()


def test_a_batch_indexed_by_hand_and_normalized_is_named_sample_by_sample(splits):
    images = splits.train.tensors[0]
    catalogue = Catalogue(images)
    index = torch.randperm(len(images), generator=torch.Generator().manual_seed(3))[:64]
    assert catalogue.lookup(images[index]) == index.tolist()
    assert catalogue.lookup(((images[index] - 0.5) / 0.25).to(torch.float64)) == index.tolist()


def test_what_is_not_training_samples_is_not_named(splits):
    catalogue = Catalogue(splits.train.tensors[0])
    assert catalogue.lookup(splits.val.tensors[0][:32]) is None  # held-out samples
    assert catalogue.lookup(torch.rand(32, 1, 8, 8)) is None  # activations of the same size
    assert catalogue.lookup(torch.rand(32, 16, 4, 4)) is None  # of another size
    noisy = splits.train.tensors[0][:32] + 0.05 * torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    assert catalogue.lookup(noisy) is None  # augmented: the DataLoader's batches count instead


def test_without_a_dataloader_the_step_takes_what_the_model_consumed_once(splits):
    batches = TrainedBatches()
    batches.catalogue = Catalogue(splits.train.tensors[0])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    batch = splits.train.tensors[0][[5, 9, 2]]
    batches.forward(model, (batch,))
    batches.forward(model[0], (batch.clone(),))  # the model's first layer sees the same batch: counted once
    assert batches.take() == ([5, 9, 2], None)
    assert batches.take() == ([], None)  # afresh after a step


def _one_by_one(catalogue: Catalogue, batch: torch.Tensor) -> list[int] | None:
    """The lookup written row by row, as the definition reads: the first training sample, in key order, whose
    standardized contents are within MATCH of the row's."""
    rows = _standardized(batch)
    found = []
    for row in rows:
        close = [int(i) for i in catalogue.order
                 if float((catalogue.rows[i] - row).abs().max()) <= catalogue.MATCH]
        if not close:
            return None
        found.append(close[0])
    return found


@functools.cache
def _with_duplicates() -> tuple[torch.Tensor, Catalogue]:
    images = data.load().train.tensors[0][:200].clone()
    images[150:] = images[100:150]  # duplicates: the first in key order is named, as row by row
    return images, Catalogue(images)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 199), min_size=1, max_size=40), st.integers(0, 3), st.integers(0, 2**16))
def test_the_lookup_names_the_same_samples_as_one_row_at_a_time(picks, strangers, seed):
    images, catalogue = _with_duplicates()
    batch = images[picks]
    if strangers:
        noise = torch.rand(strangers, *images.shape[1:], generator=torch.Generator().manual_seed(seed))
        batch = torch.cat([batch, noise])[torch.randperm(len(picks) + strangers,
                                                         generator=torch.Generator().manual_seed(seed))]
    assert catalogue.lookup(batch) == _one_by_one(catalogue, batch)


def test_a_batch_changed_in_place_is_looked_up_again(splits):
    batches = TrainedBatches()
    batches.catalogue = Catalogue(splits.train.tensors[0])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    batch = splits.train.tensors[0][[1, 2]].clone()
    batches.forward(model, (batch,))
    batch.copy_(splits.train.tensors[0][[3, 4]])  # the same tensor, refilled for the next micro-batch
    batches.forward(model, (batch,))
    assert batches.take() == ([1, 2, 3, 4], None)
