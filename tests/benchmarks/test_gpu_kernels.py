"""benchmarks/gpu_kernels.py: its CPU dry run end to end, the results file, and the model's side of each row."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_kernels as kernels  # noqa: E402 - benchmarks/ is not a package

from course.perf import catalog, microbench  # noqa: E402

H100 = catalog.gpu("H100 SXM5")


def test_the_dry_run_says_it_is_no_gpu_measurement_and_writes_every_group(tmp_path, capsys):
    assert kernels.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert kernels.DRY_RUN in capsys.readouterr().out
    [written] = tmp_path.glob("gpu-kernels-cpu--dry-run-*.md")
    text = written.read_text()
    assert kernels.DRY_RUN in text and "not modelled" in text
    for group, count in (("GEMM", len(kernels.gemm_shapes(True))), ("bandwidth", 4), ("step", 2)):
        assert text.count(f"| {group} |") == count, group


def test_ratios_are_judged_against_the_band():
    assert [kernels.verdict(r) for r in (0.8, 1.0, 1.25, 0.79, 2.22, None)] == ["ok", "ok", "ok", "OUT", "OUT", "-"]
    row = kernels.Row("step", "ResNet-50", 24.9, 11.2, "ms")
    assert row.ratio == pytest.approx(24.9 / 11.2)
    text = kernels.markdown("NVIDIA H100 80GB HBM3", [row], dry=False)
    assert "| step | ResNet-50 | 24.9 ms | 11.2 ms | 2.22 | OUT |" in text and kernels.DRY_RUN not in text


def test_the_modelled_side_is_the_model_of_course_perf():
    k_half = microbench.depth_half()
    best = 989 * microbench.matmul_efficiency("bf16", "Hopper")
    assert kernels.modelled_gemm(H100, 4096) == pytest.approx(best * 4096 / (4096 + k_half))
    assert kernels.modelled_gemm(H100, 128) < kernels.modelled_gemm(H100, 8192) < best
    assert kernels.modelled_bandwidth(H100) == pytest.approx(3350 * microbench.constant("memory"))
    cnn, gpt = kernels.modelled_steps(H100, 32, kernels.gpt_config(False), 8)
    slower_gpu = kernels.modelled_steps(catalog.gpu("A100 SXM4 80GB"), 32, kernels.gpt_config(False), 8)
    assert 0 < cnn < slower_gpu[0] and 0 < gpt < slower_gpu[1]
