"""course.perf.protocol: every figure modelled from its setup, two scores, and a fit that never sees the test set."""

from dataclasses import replace
from pathlib import Path

import pytest

from course.perf import figures, microbench, parallel, protocol

pytestmark = pytest.mark.unit5

FIT, TEST = figures.of_split("fit"), figures.of_split("test")


def test_fit_refuses_a_test_figure_and_an_empty_set():
    with pytest.raises(ValueError, match="fitting set only"):
        protocol.fit([*FIT[:2], TEST[0]], (0.5, 1.0), lambda v: protocol.training_efficiency_set("Ampere", v))
    with pytest.raises(ValueError, match="fitting set only"):
        protocol.fit_training_efficiency("Ampere", fitting=TEST)
    with pytest.raises(ValueError, match="fitting set only"):
        protocol.fit_training_efficiency("Volta")  # no fitting figure on a V100


def test_the_frozen_constants_are_the_fit_on_the_fitting_set():
    for generation in protocol.GENERATIONS:
        assert protocol.fit_training_efficiency(generation) == microbench.training_efficiency(generation)
    assert microbench.training_efficiency("Volta") == 1.0  # none fitted: said so, not guessed


def test_fitting_leaves_the_constants_as_they_were():
    before = dict(microbench.TRAINING_EFFICIENCY)
    protocol.fit_training_efficiency("Hopper")
    assert microbench.TRAINING_EFFICIENCY == before


def test_a_prediction_reports_the_figures_own_metric():
    for figure in figures.FIGURES:
        prediction = protocol.predict(figure)
        step, tokens = prediction.step, figure.global_batch * figure.model.seq
        expected = {"tokens_per_gpu_s": tokens / step.step_s / figure.gpus, "step_s": step.step_s,
                    "tflops_hardware": step.flops_per_gpu / 1e12, "tflops_model": step.model_flops_per_gpu / 1e12,
                    "mfu": step.mfu}[figure.metric]
        assert prediction.modelled == pytest.approx(expected) and prediction.modelled > 0, figure.label
        assert step.hfu >= step.mfu  # recomputation only ever adds hardware FLOPs


def test_score_against_hand_counted_errors():
    made = [protocol.Prediction(FIT[0], FIT[0].value * ratio, protocol.predict(FIT[0]).step)
            for ratio in (1.10, 0.78, 1.16, 1.0)]
    got = protocol.score(made)
    assert got["figures"] == 4 and got["within_15"] == 0.5 and got["within_20"] == 0.75
    assert got["mae"] == pytest.approx((0.10 + 0.22 + 0.16 + 0) / 4)
    assert got["bias"] == pytest.approx((0.10 - 0.22 + 0.16) / 4)
    with pytest.raises(ValueError, match="no predictions"):
        protocol.score([])


def test_a_figures_expert_parallel_size_reaches_the_plan():
    dense = next(f for f in FIT if f.data % 8 == 0)
    assert protocol.plan_of(replace(dense, expert=8)).expert == 8
    with pytest.raises(ValueError, match="expert parallelism 8"):  # a dense model has no experts to split
        protocol.predict(replace(dense, expert=8))


def test_switching_a_term_off_refits_on_the_fitting_set_and_moves_the_score():
    whole, without = protocol.ablation(), protocol.ablation("memory_kernels")
    assert whole.fitted == dict(microbench.TRAINING_EFFICIENCY)
    assert without.fitted["Ampere"] < whole.fitted["Ampere"]  # less modelled time: a lower sustained rate fits
    assert without.test["mae"] != whole.test["mae"]
    with pytest.raises(ValueError, match="term"):
        protocol.ablation("magic")


def test_the_readme_quotes_the_test_score_as_computed_now():
    # the README quotes the TEST score (figures no constant saw), never the fitting set's; a stale quote fails here
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    test = protocol.score(protocol.predict(f) for f in TEST)
    quote = f"On that test set, {test['within_15']:.0%} of its figures fall within 15%, and the median error is " \
            f"{protocol.typical_error():.0%}"
    assert quote in " ".join(readme.split()), quote
    looks = f"The test set has been scored by {protocol.looks()} versions of the model so far"
    assert looks in " ".join(readme.split()), looks


def test_a_module_that_models_more_passes_its_own_step_function():
    seen = []

    def slower(model, plan, cluster, terms):
        seen.append(plan)
        step = parallel.step_time(model, plan, cluster, terms)
        return replace(step, step_s=2 * step.step_s)

    figure = next(f for f in FIT if f.metric == "step_s")
    assert protocol.predict(figure, step_time=slower).modelled == pytest.approx(2 * protocol.predict(figure).modelled)
    assert seen == [protocol.plan_of(figure)]


def test_the_ledger_records_each_changed_model_once(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.md"
    assert protocol.looks(ledger) == 0
    line = protocol.record("first look", ledger)
    test = protocol.score(protocol.predict(f) for f in TEST)
    assert f"| {test['within_15']:.0%} |" in line and f"{test['mae']:.1%}" in line
    assert protocol.recorded(ledger) == [protocol.fingerprint()] and protocol.looks(ledger) == 1
    with pytest.raises(ValueError, match="already scored"):
        protocol.record("the same model again", ledger)
    for bad in ("", "  ", "a | b"):
        with pytest.raises(ValueError, match="what changed"):
            protocol.record(bad, ledger)
    monkeypatch.setitem(microbench.TRAINING_EFFICIENCY, "Ampere", 0.5)  # a changed model: a new fingerprint
    protocol.record("a changed constant", ledger)
    assert protocol.looks(ledger) == 2 and len(set(protocol.recorded(ledger))) == 2


def test_the_model_in_the_tree_has_its_line_in_the_ledger():
    # every changed model that scores the test set leaves a line: the count of looks is on file, not remembered
    mark = protocol.fingerprint()
    assert mark in protocol.recorded(), (
        f"the model {mark} scores the test set (this suite does) but has no line in {protocol.LEDGER}: run "
        "benchmarks/perf_model.py --record 'what changed' and commit the ledger")
