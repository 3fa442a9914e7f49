"""course.model_parallel.parity (with loss_bound and parity_ranks): every correct strategy's loss stays inside its
derived bound at every step, a planted bug (gradients summed, not averaged) lands outside, and the one-process
bound holds against float64 arithmetic. One launch of 4 ranks runs every strategy."""

import pytest
import torch

from course.model_parallel import loss_bound, parity, transformer
from course.numerics import bounds

pytestmark = pytest.mark.unit8

TWO_STEPS = loss_bound.Training(steps=2)  # the bug shows from step 2: step 1 starts from the same weights


@pytest.fixture(scope="module")
def rows():
    return {row.strategy: row for row in parity.table(tuple(parity.LAYOUTS), TWO_STEPS, timeout_s=300)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_correct_strategies_are_inside_their_bound_and_the_bug_is_not(rows):
    reference = rows["data parallel"].reference
    assert reference == pytest.approx(transformer_losses(2))
    for name in parity.CORRECT:
        row = rows[name]
        assert row.inside and row.first_outside is None, f"{name}: {row.losses} vs {reference}, {row.judged}"
        assert all(0 < b < 1e-4 for b in row.bound), f"{name}'s bound {row.bound} is no longer a rounding bound"
    bug = rows["summed gradients (a bug)"]
    assert not bug.inside and bug.first_outside == 1
    assert "OUTSIDE from step 2: a bug" in parity.format_table([bug])


def transformer_losses(steps: int) -> list[float]:
    """The one-process SGD losses, written out here without the hooks of loss_bound.reference."""
    model = transformer.build(parity.CONFIG, TWO_STEPS.seed)
    optimizer = TWO_STEPS.optimizer(model.parameters())
    losses = []
    for inputs, targets in TWO_STEPS.batches(parity.CONFIG)[:steps]:
        optimizer.zero_grad()
        loss = transformer.loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_the_forward_bound_holds_against_float64_split_or_not():
    config = transformer.Config(num_layers=2)
    model = transformer.build(config, 0)
    inputs, targets = loss_bound.Training(batch_size=4).batches(config)[0]
    loss, seen, logits = loss_bound._step(model, inputs, targets)
    exact = transformer.loss(transformer.build(config, 0).double()(inputs), targets).item()
    whole = loss_bound.forward(model, seen, logits, targets, tensor_parallel=1)
    split = loss_bound.forward(model, seen, logits, targets, tensor_parallel=4)
    assert abs(loss - exact) <= min(whole, split)
    assert split != whole and max(whole, split) < 100 * max(abs(loss - exact), 2.0**-24 * loss)


def test_carried_takes_the_smaller_of_the_worst_case_and_the_random_walk():
    adjoint, local = torch.ones(100), torch.full((100,), 1e-3)
    assert loss_bound.carried(adjoint, local) == pytest.approx(1e-3 * 10)  # sqrt(100) terms, not 100
    assert loss_bound.carried(torch.tensor([2.0]), torch.tensor([1e-3])) == pytest.approx(2e-3)


def test_gradient_bound_scales_the_token_sums_by_the_pieces_rounding():
    sums = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    one, four = loss_bound.gradient_bound(sums, 256, 1)["w"], loss_bound.gradient_bound(sums, 256, 4)["w"]
    f32 = torch.float32
    assert torch.allclose(one, bounds.gamma_probable(256, f32) * sums["w"])  # one sum of 256 terms
    inner_and_outer = bounds.gamma_probable(64, f32) + bounds.unit_roundoff(f32) + bounds.gamma(3, f32)
    assert torch.allclose(four, inner_and_outer * sums["w"])  # 4 sums of 64, then 4 partial sums added


def test_an_unknown_strategy_is_named_with_the_known_ones(capsys):
    with pytest.raises(ValueError, match=r"expected strategies among 'data parallel'.*got \['DDP'\]"):
        parity.check_names(["DDP"])
    with pytest.raises(SystemExit):
        parity.main(["--strategies", "DDP"])
    assert "spell them as listed" in capsys.readouterr().err
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        loss_bound.Training(steps=0)


def test_the_table_reads_inside_and_outside_from_synthetic_rows():
    good = parity.Row("data parallel", "4 data", [3.0, 2.9], [3.0, 2.9 + 1e-7], [1e-5, 1e-5])
    bad = parity.Row("summed gradients (a bug)", "4 data", [3.0, 2.5], [3.0, 2.9], [1e-5, 1e-5])
    text = parity.format_table([good, bad]).splitlines()
    assert text[0].startswith("strategy") and "loss, step 2" in text[0]
    assert text[1].endswith("inside") and text[2].endswith("OUTSIDE from step 2: a bug")
    assert good.inside and not bad.inside and bad.first_outside == 1
