"""course.train: the plain loop learns the digits; evaluate agrees with a hand count."""

import pytest
import torch

from course import data, models, train

pytestmark = pytest.mark.unit0


def test_a_few_epochs_of_the_cnn_beat_chance_by_far():
    train.seed_everything(0)
    splits = data.load()
    model = models.DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = [train.train_epoch(model, data.loader(splits.train, 32, seed=e), optimizer) for e in range(3)]
    _, accuracy = train.evaluate(model, data.loader(splits.val, 100, shuffle=False))
    assert losses[-1] < losses[0] and accuracy > 0.8


def test_evaluate_matches_a_hand_count():
    splits = data.load()
    model = models.LinearModel()
    images, labels = splits.val.tensors
    logits = model(images)
    loss, accuracy = train.evaluate(model, data.loader(splits.val, 64, shuffle=False))
    assert accuracy == pytest.approx((logits.argmax(1) == labels).float().mean().item())
    assert loss == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-5)


def test_evaluate_refuses_an_empty_loader():
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="empty loader"):
        train.evaluate(models.LinearModel(), data.loader(empty, 4, shuffle=False))


def test_seed_everything_repeats_initialisation():
    train.seed_everything(7)
    first = models.DigitsCNN().state_dict()
    train.seed_everything(7)
    again = models.DigitsCNN().state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_an_optimizer_is_built_by_name_and_a_wrong_name_lists_the_names():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert type(train.make_optimizer("sgd", params, 0.1)) is torch.optim.SGD
    momentum = train.make_optimizer("momentum", params, 0.1)
    assert momentum.defaults["momentum"] == 0.9 and momentum.defaults["lr"] == 0.1
    assert type(train.make_optimizer("adam", params)) is torch.optim.Adam
    with pytest.raises(ValueError, match=r"optimizer must be one of \['sgd', 'momentum', 'adam'\], got 'lamb'"):
        train.make_optimizer("lamb", params)
