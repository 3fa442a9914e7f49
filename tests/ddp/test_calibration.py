"""course.ddp.calibration: the model's arithmetic against its closed form, the fit recovering the model it was fitted
on, what is held out, and the measurement on sub-groups of ranks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course import timing
from course.collectives import cost_model
from course.ddp import calibration
from course.models import DigitsCNN
from course.runtime.launch import launch


def _model(fixed=1e-3, per_sample=1e-4, alpha=1e-4, beta=1e-9, nbytes=1_000_000, cores=2, alone_4=5e-3):
    return calibration.Calibration(fixed, per_sample, cost_model.AlphaBeta(alpha, beta), nbytes, cores, {4: alone_4},
                                   (16, 64))


def test_prediction_matches_the_closed_form_by_hand():
    model = _model()
    # (1 ms + 10 x 0.1 ms) x 4/2 + 5 ms timed alone on 4 ranks
    assert model.predict(4, 10) == pytest.approx(9e-3)
    assert model.predict(2, 10) == pytest.approx(2e-3 + 2 * 1e-4 + 1e6 * 1e-9)  # 2 ranks on 2 cores: no sharing
    assert model.predict(1, 10) == pytest.approx(2e-3)  # one rank sends nothing
    # the α-β extrapolation: (2(4-1) x 0.1 ms + 2(4-1)/4 x 1e6 B x 1 ns) x 4/2
    assert model.ring_s(4, 1_000_000) == pytest.approx(4.2e-3)


@given(fixed=st.floats(1e-4, 1e-2), per_sample=st.floats(1e-6, 1e-3), alone_4=st.floats(1e-5, 1e-1),
       cores=st.integers(1, 8), world_size=st.sampled_from([1, 2, 4]), batch=st.integers(1, 512))
def test_prediction_is_shared_compute_plus_the_allreduce_timed_alone(fixed, per_sample, alone_4, cores, world_size,
                                                                      batch):
    model = _model(fixed, per_sample, nbytes=359_720, cores=cores, alone_4=alone_4)
    n = world_size
    allreduce = {1: 0.0, 2: model.ring_s(2, 359_720), 4: alone_4}[n]  # on 2 ranks: the α-β line
    assert model.predict(n, batch) == pytest.approx((fixed + per_sample * batch) * max(1, n / cores) + allreduce)


def test_a_rank_count_whose_allreduce_was_not_timed_is_refused():
    with pytest.raises(ValueError, match="timed on 3 ranks"):
        _model().predict(3, 16)


def _measurements_of(truth: calibration.Calibration, sizes=(45_000, 180_000, 720_000)):
    steps = {(n, b): timing.summarize([truth.predict(n, b)] * 3) for n in (1, 2, 4) for b in (16, 32, 64)}
    allreduce = {(n, s): timing.summarize([truth.ring_s(n, s)] * 3) for n in (2, 4) for s in sizes}
    for n in (2, 4):
        allreduce[n, truth.gradient_bytes] = timing.summarize([truth.allreduce_s(n)] * 3)
    return steps, allreduce


@given(fixed=st.floats(1e-4, 1e-2), per_sample=st.floats(1e-6, 1e-3), alpha=st.floats(1e-6, 1e-3),
       beta=st.floats(1e-11, 1e-8), cores=st.integers(1, 4))
def test_fit_recovers_the_model_it_was_fitted_on(fixed, per_sample, alpha, beta, cores):
    truth = _model(fixed, per_sample, alpha, beta, 359_720, cores)
    steps, allreduce = _measurements_of(truth)
    fitted = calibration.fit(steps, allreduce, 359_720, cores, batch_sizes=(16, 64))
    assert fitted.fixed_s == pytest.approx(fixed, rel=1e-6) and fitted.per_sample_s == pytest.approx(per_sample,
                                                                                                      rel=1e-6)
    assert fitted.link.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fitted.link.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert fitted.fitted_batches == (16, 64) and fitted.cores == pytest.approx(cores, rel=1e-6)
    assert fitted.allreduce_alone_s == pytest.approx(truth.allreduce_alone_s, rel=1e-6)
    assert all(abs(p.error) < 1e-6 for p in calibration.held_out(fitted, steps))


@given(cores_got=st.floats(1.0, 2.0))
def test_fit_reads_the_cores_the_ranks_got_from_the_two_rank_steps(cores_got):
    truth = _model(cores=cores_got)  # on 2 usable cores, other programs left the ranks `cores_got`
    steps, allreduce = _measurements_of(truth)
    fitted = calibration.fit(steps, allreduce, truth.gradient_bytes, 2, batch_sizes=(16, 64))
    assert fitted.cores == pytest.approx(cores_got, rel=1e-6)
    assert fitted.predict(4, 32) == pytest.approx(truth.predict(4, 32), rel=1e-6)


def test_cores_got_stay_between_one_and_the_usable_cores():
    model = _model()
    for scale, expected in ((0.5, 2.0), (10.0, 1.0)):  # 2-rank steps faster than one rank's; far slower
        steps = {(n, b): timing.summarize([model.predict(n, b) * (scale if n == 2 else 1)]) for n in (1, 2)
                 for b in (16, 64)}
        allreduce = {(2, s): timing.summarize([model.ring_s(2, s)]) for s in (1000, model.gradient_bytes)}
        assert calibration.fit(steps, allreduce, model.gradient_bytes, 2).cores == expected
    steps = {k: v for k, v in steps.items() if k[0] == 1}  # no 2-rank steps: all the usable cores
    assert calibration.fit(steps, allreduce, model.gradient_bytes, 2).cores == 2


def test_fit_uses_only_fitted_one_and_two_rank_steps_and_two_rank_allreduces():
    truth = _model()
    steps, allreduce = _measurements_of(truth)
    noisy_steps = {k: (timing.summarize([9.0]) if k[0] > 2 or k[1] == 32 else t) for k, t in steps.items()}
    noisy_allreduce = {k: (timing.summarize([9.0]) if k[0] != 2 and k[1] != truth.gradient_bytes else t)
                       for k, t in allreduce.items()}
    fitted = calibration.fit(noisy_steps, noisy_allreduce, truth.gradient_bytes, 2, batch_sizes=(16, 64))
    assert fitted.predict(4, 32) == pytest.approx(truth.predict(4, 32), rel=1e-6)


def test_held_out_are_every_configuration_but_the_fitted_ones_with_their_errors():
    model = _model()
    steps = {(n, b): timing.summarize([model.predict(n, b) * 1.25]) for n in (1, 2, 4) for b in (16, 32, 64)}
    predictions = calibration.held_out(model, steps)
    assert [(p.world_size, p.batch_size) for p in predictions] == [(1, 32), (2, 32), (4, 16), (4, 32), (4, 64)]
    assert all(p.error == pytest.approx(1 / 1.25 - 1) for p in predictions)  # -20%: predicted 20% too fast
    assert calibration.worst_error(predictions) == pytest.approx(0.2)
    assert "outside the interval" in str(predictions[0])
    one_second = timing.summarize([1.0])
    only_fours = calibration.held_out_allreduce(model, {(2, 8): one_second, (4, 8): one_second})
    assert [(p.world_size, p.batch_size) for p in only_fours] == [(4, 8)]
    assert only_fours[0].predicted_s == pytest.approx((6 * 1e-4 + 1.5 * 8 * 1e-9) * 2)  # the α-β extrapolation


def test_verdict_follows_the_errors():
    model = _model()

    def verdict(scale):
        measured = timing.summarize([model.predict(4, 16) * scale])
        return calibration.verdict(calibration.held_out(model, {(4, 16): measured}))

    assert "within the 20%" in verdict(1.1)
    assert "measured slower than predicted" in verdict(2.0)
    assert "measured faster than predicted" in verdict(0.5)
    spread = timing.summarize([model.predict(4, 16) * s for s in (0.5, 0.7, 0.7, 0.7, 2.0)])  # median 0.7x, wide
    noisy = calibration.verdict(calibration.held_out(model, {(4, 16): spread}))
    assert "outside the 20%" in noisy and "inside that step's own 95% interval" in noisy


def test_fit_refuses_too_little_data():
    one = timing.summarize([1e-3])
    with pytest.raises(ValueError, match="2 batch sizes"):
        calibration.fit({(1, 16): one, (2, 16): one}, {(2, 8): one, (2, 16): one}, 8, 2)
    with pytest.raises(ValueError, match="2-rank allreduces"):
        calibration.fit({(1, 16): one, (1, 64): one}, {(4, 8): one, (4, 16): one}, 8, 2)
    with pytest.raises(ValueError, match="no held-out"):
        calibration.worst_error([])


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_measure_times_steps_and_allreduces_on_subgroups():
    results = launch(calibration.measure, 2, (1, 2), (4, 8), (2,), 2, 1, 2, timeout_s=180)
    measured = results[0]
    assert set(measured.steps) == {(1, 4), (1, 8), (2, 4), (2, 8)}
    assert all(len(times) == 2 and min(times) > 0 for times in measured.steps.values())
    n = measured.gradient_bytes
    assert n == 4 * sum(p.numel() for p in DigitsCNN().parameters())
    assert set(measured.allreduce) == {(2, n // 8 // 4 * 4), (2, n // 2 // 4 * 4), (2, n), (2, 2 * n)}
    assert all(len(times) == 4 and min(times) > 0 for times in measured.allreduce.values())
    assert results[1] is None


def test_the_two_rank_allreduce_is_read_off_the_line_through_every_size_not_one_noisy_size():
    truth = _model(nbytes=359_720)
    steps, allreduce = _measurements_of(truth)
    on_line = truth.allreduce_s(2)
    allreduce[2, truth.gradient_bytes] = timing.summarize([3 * on_line])  # one slow size among four
    fitted = calibration.fit(steps, allreduce, truth.gradient_bytes, 2, batch_sizes=(16, 64))
    assert on_line < fitted.allreduce_s(2) < 3 * on_line
    assert fitted.allreduce_alone_s[4] == truth.allreduce_alone_s[4]  # more ranks: as timed alone
