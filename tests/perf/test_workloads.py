"""The workloads: published models rebuilt from their architecture tables match the published counts."""

import pytest

from course import models
from course.perf import workloads


def test_resnets_match_torchvision_counts():
    # torchvision's model pages: 25,557,032 / 44,549,160 parameters, 4.09 / 7.80 GFLOPS (multiply-adds)
    assert workloads.resnet().params == 25_557_032
    assert workloads.resnet((3, 4, 23, 3)).params == 44_549_160
    assert workloads.resnet().flops / 2 == pytest.approx(4.09e9, rel=0.005)
    assert workloads.resnet((3, 4, 23, 3)).flops / 2 == pytest.approx(7.80e9, rel=0.005)


def test_wide_resnet_matches_the_paper():
    assert workloads.wide_resnet(28, 10).params == pytest.approx(36.5e6, rel=0.005)  # Zagoruyko & Komodakis, Table


def test_digits_cnn_matches_course_models():
    cnn = models.DigitsCNN()
    workload = workloads.digits_cnn((1, 8, 8))
    assert workload.flops == models.flops_per_sample(cnn, (1, 8, 8))
    assert workload.params == models.parameter_count(cnn)
    assert workload.gradient_bytes == models.gradient_bytes(cnn)
