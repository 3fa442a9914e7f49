"""Print the performance model against published figures: the calibration set, then every row labelled
calibration, arithmetic or prediction, with its signed error, and the prediction rows' bias beside their mean
absolute error and the largest; then one large model with today's terms (fused attention, overlap, interleaving,
selective recomputation) switched on one at a time.

    .venv/bin/python benchmarks/perf_model.py

Everything printed is modelled (course.perf) or published (each row's source); nothing is timed here.
Exit status 1 if fewer than 12 prediction rows fall within ±20% or their bias leaves ±8%, the bounds
``tests/perf/test_published.py`` asserts.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from course.perf import catalog, microbench, parallel, published
from course.perf.comm import Cluster

TOLERANCE, BIAS, ENOUGH = 0.20, 0.08, 12


def todays_training() -> str:
    """GPT-3 175B on 64 DGX H100 nodes (512 GPUs), one term of today's training switched on at a time: the step
    and its exposed parts, so each new term's effect is read off one column."""
    cluster = Cluster(catalog.gpu("H100 SXM5"), catalog.link("NVSwitch (H100, NVLink 4)"), 8,
                      catalog.link("InfiniBand NDR"), 8)
    gpt3 = parallel.Transformer("GPT-3 175B", 96, 12288, 96)
    base = parallel.Plan(8, 8, 8, 1024, 1, "zero1", precision="bf16", **published.MEGATRON_2021)
    variants = [("Megatron 2021 (no fused attention, no overlap)", base),
                ("+ fused attention", replace(base, fused_attention=True)),
                ("+ data-parallel overlap", replace(base, fused_attention=True, dp_overlap=True)),
                ("+ tensor-parallel overlap", replace(base, fused_attention=True, dp_overlap=True, tp_overlap=True)),
                ("+ interleaved, 3 chunks", replace(base, fused_attention=True, dp_overlap=True, tp_overlap=True,
                                                     interleave=3)),
                ("+ selective recomputation", replace(base, fused_attention=True, dp_overlap=True, tp_overlap=True,
                                                       interleave=3, recompute="selective"))]
    lines = [f"{gpt3.name}, TP 8 x PP 8 x DP 8 on 512 {cluster.gpu.name}, batch 1024 (MODELLED)",
             f"{'setup':<48} {'step s':>7} {'bubble':>7} {'TP exp':>7} {'DP exp':>7} {'p2p':>6} {'TFLOP/s':>8}"]
    for name, plan in variants:
        step = parallel.step_time(gpt3, plan, cluster)
        lines.append(f"{name:<48} {step.step_s:>7.2f} {step.bubble_s:>7.2f} {step.tensor_comm_s:>7.2f} "
                     f"{step.data_comm_s:>7.2f} {step.p2p_s:>6.2f} {step.flops_per_gpu / 1e12:>8.0f}")
    return "\n".join(lines)


def main() -> int:
    print("Calibration set (course.perf.microbench): each constant fitted once, or marked ASSUMED\n")
    print(microbench.format_figures())
    print("\nValidation (course.perf.published): defaults only, no per-row knob\n")
    rows = published.validation_table()
    print(published.format_table(rows))
    print("\nToday's training, one term at a time (course.perf.parallel)\n")
    print(todays_training())
    summary = published.summary(rows, TOLERANCE)
    ok = summary["within"] >= ENOUGH and abs(summary["bias"]) <= BIAS
    print(f"\n{'PASS' if ok else 'FAIL'}: need >= {ENOUGH} predictions within ±{TOLERANCE:.0%} "
          f"(got {summary['within']} of {summary['predictions']}) and a bias within ±{BIAS:.0%} "
          f"(got {summary['bias']:+.1%}); mean absolute error {summary['mae']:.1%}, largest {summary['largest']:+.0%}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
