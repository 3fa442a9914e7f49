"""course.perf.gemm_shape: tile and wave quantisation against hand-counted tiles, waves and NVIDIA's example."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.perf import catalog, gemm_shape, parallel
from course.perf.comm import Cluster

A100_SMS = 108  # the guide's example GPU (Ampere whitepaper)


def test_the_guides_example_one_wave_of_256_by_128_tiles_on_an_a100():
    # 1792 x 1792 in 256 x 128 tiles: 7 x 14 = 98 tiles, one wave of 108 SMs, 10 SMs idle
    assert gemm_shape.tile_quantisation(1792, 1792, (256, 128)) == (98, 1.0)
    assert gemm_shape.quantisation(1792, 1792, A100_SMS, (256, 128)) == pytest.approx(98 / 108)


def test_one_tile_more_than_a_wave_takes_a_second_wave():
    full = gemm_shape.quantisation(256 * 108, 128, A100_SMS, (256, 128))  # 108 tiles: one full wave
    over = gemm_shape.quantisation(256 * 109, 128, A100_SMS, (256, 128))  # 109 tiles: two waves
    assert full == 1.0 and over == pytest.approx(109 / 216)


def test_a_dimension_off_the_tile_pads_the_last_tile():
    tiles, useful = gemm_shape.tile_quantisation(257, 128, (256, 128))
    assert tiles == 2 and useful == pytest.approx(257 / 512)


def test_the_best_tile_is_the_largest_among_equals_and_a_smaller_one_when_it_wastes_less():
    assert gemm_shape.best_tile(256 * 108, 128 * 4, A100_SMS) == (256, 128)  # 4 full waves of the largest
    # 2048 x 2304: 144 tiles of 256 x 128 take 2 waves (67% useful), 288 of 128 x 128 take 3 (89%), 1152 of
    # 64 x 64 take 11 (97%)
    assert gemm_shape.quantisation(2048, 2304, A100_SMS, (128, 128)) == pytest.approx(288 / 324)
    assert gemm_shape.best_tile(2048, 2304, A100_SMS) == (64, 64)


@given(st.integers(1, 20000), st.integers(1, 20000), st.sampled_from(sorted(set(gemm_shape.SMS.values()))))
def test_the_useful_share_is_a_fraction_and_the_best_tile_is_the_best(m, n, sms):
    shares = [gemm_shape.quantisation(m, n, sms, tile) for tile in gemm_shape.TILES]
    best = gemm_shape.quantisation(m, n, sms, gemm_shape.best_tile(m, n, sms))
    assert 0 < best <= 1 and best == max(shares)
    if m % 256 == 0 and n % 128 == 0 and (m // 256) * (n // 128) % sms == 0:  # full tiles, full waves
        assert best == 1.0


def test_a_weight_gemm_takes_the_harmonic_mean_of_its_three_shapes():
    tokens, n, k = 2048, 2304, 9216
    shares = [gemm_shape.gemm_quantisation(m, c, "A100 SXM4") for m, c in ((tokens, n), (tokens, k), (k, n))]
    harmonic = 3 / sum(1 / q for q in shares)
    assert gemm_shape.weight_gemm_quantisation(tokens, n, k, "A100 SXM4") == pytest.approx(harmonic)
    assert gemm_shape.gemm_quantisation(2048, 2304, "P100 SXM2") == 1.0  # no SM count on file: no term


def test_bad_shapes_say_what_to_pass():
    with pytest.raises(ValueError, match="positive output shape"):
        gemm_shape.quantisation(0, 128, A100_SMS, (256, 128))
    with pytest.raises(ValueError, match="at least one SM"):
        gemm_shape.quantisation(128, 128, 0, (256, 128))


def test_the_term_slows_exactly_the_weight_gemms_by_their_useful_share():
    model = parallel.Transformer("GPT 1.7B", 24, 2304, 24)
    cluster = Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                      catalog.link("InfiniBand HDR"), 8)
    plan = parallel.Plan(1, 1, 1, 8)
    on = parallel.layer_terms(model, plan, cluster)
    off = parallel.layer_terms(model, plan, cluster, replace(parallel.ALL_TERMS, gemm_quantisation=False))
    assert on.memory_s == off.memory_s and on.attention_s == off.attention_s
    tokens = 2048  # one sequence per micro-batch
    expected = sum(parallel._gemm_s(2 * tokens * weights, depth, plan, cluster)
                   / gemm_shape.weight_gemm_quantisation(tokens, weights / depth, depth, cluster.gpu.name)
                   for weights, depth in model.layer_gemms())
    assert on.gemm_s == pytest.approx(expected) and on.gemm_s > off.gemm_s
