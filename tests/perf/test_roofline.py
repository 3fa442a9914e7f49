"""course.perf.roofline: intensity, ridge point and the attainable rate, against closed forms."""

import pytest

from course.perf import catalog, roofline, workloads

pytestmark = pytest.mark.unit5


def test_ridge_point_is_peak_over_bandwidth():
    a100 = catalog.gpu("A100 SXM4")
    assert roofline.ridge_point(a100, "bf16") == pytest.approx(312e12 / 1555e9)
    assert roofline.ridge_point(a100, "fp32") == pytest.approx(19.5e12 / 1555e9)


def test_a_layer_below_the_ridge_is_memory_bound_at_intensity_times_bandwidth():
    layer = workloads.Layer("gemm", flops=2e4, params=1000, activations=1000, kind="matmul")
    # 32 samples: 6.4e5 FLOPs over (1000 + 32 000) elements x 2 bytes
    assert roofline.intensity(layer, 32, "bf16") == pytest.approx(6.4e5 / 66_000)
    gpu = catalog.gpu("H100 SXM5")
    point = roofline.points(workloads.Workload("one", (layer,), 0), gpu, "bf16", 32)[0]
    assert point.bound == "memory" and point.attainable == pytest.approx(6.4e5 / 66_000 * gpu.memory_bandwidth)
    dense = workloads.Layer("big", flops=1e12, params=1, activations=1, kind="matmul")
    top = roofline.points(workloads.Workload("two", (dense,), 0), gpu, "bf16", 32)[0]
    assert top.bound == "compute" and top.attainable == gpu.peak_flops("bf16")
