"""course.model_parallel.transformer: the tiny GPT is causal, shaped as configured, and its reference loop learns."""

import pytest
import torch

from course.model_parallel import transformer

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's


def test_logits_have_one_row_per_position_and_a_column_per_character():
    config = transformer.Config(num_layers=2)
    inputs, _ = transformer.sample_batch(config, batch_size=3)
    assert transformer.build(config)(inputs).shape == (3, config.seq_len, config.vocab_size)


def test_a_position_never_sees_later_tokens():
    config = transformer.Config(num_layers=2)
    model = transformer.build(config)
    inputs, _ = transformer.sample_batch(config, batch_size=2)
    changed = inputs.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % config.vocab_size
    before, after = model(inputs), model(changed)
    assert torch.allclose(before[:, :20], after[:, :20], atol=1e-6)
    assert not torch.allclose(before[:, 20:], after[:, 20:], atol=1e-3)


def test_the_same_seed_builds_the_same_weights():
    a, b = transformer.build(seed=5), transformer.build(seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_the_reference_loop_learns_the_grammar():
    config = transformer.Config(num_layers=2)
    _, losses = transformer.train(config, transformer.TrainConfig(steps=60, sentences=300))
    assert losses[0] == pytest.approx(torch.log(torch.tensor(25.0)).item(), rel=0.2)  # a uniform guess at first
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0]


def test_bad_shapes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="num_heads"):
        transformer.Config(d_model=64, num_heads=5)
    with pytest.raises(ValueError, match="longer than the model's seq_len=8"):
        transformer.build(transformer.Config(seq_len=8))(torch.zeros(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="vocab_size >= 25"):
        transformer.sample_batch(transformer.Config(vocab_size=10))
