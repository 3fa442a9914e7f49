"""grader.labs.pipeline_runner.bounds (the pipeline_runner and one_f_one_b labs' gradients), in one process: the
lab's model run on micro-batches whose backwards run in a shuffled order (their gradients accumulating as a
pipeline's do) stays within the derived bound of the unsplit model's gradients, on every stage of 2-6; arithmetic
mistakes go beyond it, and the first gradient beyond is named; and the bound is never more than 10x the largest
error correct code shows (measured here, per kind of parameter)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.model_parallel import pipeline, transformer
from course.numerics import bounds as numerics
from grader.labs.pipeline_runner import bounds

pytestmark = pytest.mark.unit8


def _config(stages: int) -> transformer.Config:
    return transformer.Config(d_model=16, num_heads=2, d_ff=32, seq_len=8, num_layers=stages)


def _runs(stages: int, micro_batches: int, seed: int, mistake: str = "") -> tuple:
    """(the pipelined model, the unsplit model, the bounds): the labs' model, batch and micro-batches."""
    config = _config(stages)
    inputs, targets = transformer.sample_batch(config, micro_batches, seed)
    full = transformer.build(config, seed)
    limits = bounds.gradient_bounds(full, inputs, targets, micro_batches)
    piped, order = transformer.build(config, seed), list(range(micro_batches))
    random.Random(seed).shuffle(order)
    xs, ys = inputs.chunk(micro_batches), targets.chunk(micro_batches)
    for i in order:
        if mistake == "skips_one" and i == order[-1]:
            continue
        source = order[0] if mistake == "uses_another" and i == order[-1] else i
        scale = 1 if mistake == "no_division" else micro_batches
        (transformer.loss(piped(xs[source]), ys[i]) / scale).backward()
    return piped, full, limits


def _divergences(stages: int, micro_batches: int, seed: int, mistake: str = "") -> list:
    piped, full, limits = _runs(stages, micro_batches, seed, mistake)
    reference = dict(full.named_parameters())
    return [bounds.first_beyond(stage, reference, limits, rank)
            for rank, stage in enumerate(pipeline.split(piped, stages))]


@settings(max_examples=8, deadline=None, derandomize=True)
@given(st.integers(2, 6), st.integers(0, 8), st.integers(0, 10**6))
def test_correct_micro_batches_in_any_order_stay_within_the_bound_on_every_stage(stages, extra, seed):
    found = _divergences(stages, stages + extra, seed)
    assert found == [None] * stages, [str(d) for d in found if d is not None]


@pytest.mark.parametrize("mistake", ["skips_one", "uses_another", "no_division"])
def test_an_arithmetic_mistake_goes_beyond_the_bound_and_the_last_stage_names_its_head(mistake):
    found = _divergences(4, 6, 0, mistake)
    last = found[-1]
    assert last is not None and not last.verdict.within, last
    assert str(last).startswith("the first tensor that diverges is head.bias's gradient (backward, step 0, rank 3): "
                                "beyond rounding: a bug (bound "), str(last)


def test_a_batch_that_does_not_cut_into_the_micro_batches_is_refused():
    config = _config(2)
    inputs, targets = transformer.sample_batch(config, 5, 0)
    with pytest.raises(ValueError, match="cuts into 3 equal micro-batches, got 5 sequences"):
        bounds.gradient_bounds(transformer.build(config, 0), inputs, targets, 3)


def _kind(name: str) -> str:
    return ".".join(name.split(".")[-2:])


def test_the_bound_is_never_more_than_10x_the_largest_error_correct_code_shows():
    closest: dict[str, float] = {}
    for stages in range(2, 7):
        for micro_batches in (max(stages - 1, 2), stages, 2 * stages - 1):
            piped, full, limits = _runs(stages, micro_batches, 10 * stages + micro_batches)
            reference = dict(full.named_parameters())
            for name, param in piped.named_parameters():
                ratio = numerics.verdict(param.grad, reference[name].grad, limits[name]).ratio
                closest[_kind(name)] = max(closest.get(_kind(name), 0.0), ratio)
    assert all(0.1 <= ratio <= 1 for ratio in closest.values()), closest
