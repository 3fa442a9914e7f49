"""The workloads: published models rebuilt from their architecture tables match the published counts."""

import pytest

from course import models
from course.perf import workloads

pytestmark = pytest.mark.unit5


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
    assert workload.gradient_bytes() == models.gradient_bytes(cnn)
    assert workload.gradient_bytes(2) == models.gradient_bytes(cnn) / 2  # a 16-bit model's gradients


def test_vgg16_matches_torchvision_counts():
    # torchvision's vgg16 page: 138,357,544 parameters, 15.47 GFLOPS (multiply-adds)
    vgg = workloads.vgg16()
    assert vgg.params == 138_357_544
    assert vgg.flops / 2 == pytest.approx(15.47e9, rel=0.005)
    assert sum(layer.params for layer in vgg.layers if layer.kind == "matmul") / vgg.params > 0.85


def test_only_3x3_stride_1_convolutions_are_winograd():
    layers = {layer.name: layer for layer in workloads.resnet().layers}
    assert layers["layer1.0.conv2"].winograd and not layers["layer2.0.conv2"].winograd  # stride 2
    assert not layers["layer1.0.conv1"].winograd and not layers["fc"].winograd
