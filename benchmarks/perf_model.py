"""Print the performance model against published figures: the calibration set; the older validation table
(CNNs and Megatron-LM, each row labelled calibration, arithmetic or prediction); then the protocol of issue 44:
every published training figure of ``course.perf.figures`` modelled from its setup, the FITTING set and the TEST
set scored apart (within 15%, within 20%, mean absolute error, bias), each term of the model switched off in turn
(the constant refitted on the fitting set each time), and GPT-3 175B on 512 H100s beside the published MFUs,
with where its modelled step goes.

    .venv/bin/python benchmarks/perf_model.py
    .venv/bin/python benchmarks/perf_model.py --record "what changed since the last look"
    .venv/bin/python benchmarks/perf_model.py --fit-only       # nothing of the test set: to work from

Each test figure's own error is printed only with ``--test-figures``: the rule of issue 44 is to choose what to
build from the fitting set's residuals and from sources, never from a test figure's.

``--record`` appends the test score of the model as it stands to the ledger,
``benchmarks/results/perf_test_ledger.md`` (``course.perf.protocol.record``): run it once per changed model, so
the number of looks the test set has had is on file.

Everything printed is modelled (course.perf) or published (each row's source); nothing is timed here.
Exit status 1 if fewer than 12 rows of the older table fall within ±20% or their bias leaves ±8%, the bounds
``tests/perf/test_published.py`` asserts. The issue's target (80% of the test set within 15%) is printed with its
verdict; it does not set the exit status.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from course.perf import catalog, figures, microbench, parallel, protocol, published
from course.perf.comm import Cluster

TOLERANCE, BIAS, ENOUGH = 0.20, 0.08, 12
TARGET = 0.80  # issue 44: at least 80% of the test set within 15%
H100_CLUSTER = Cluster(catalog.gpu("H100 SXM5"), catalog.link("NVSwitch (H100, NVLink 4)"), 8,
                       catalog.link("InfiniBand NDR"), 8)


def score_line(name: str, s: dict[str, float]) -> str:
    return (f"{name:<8} {s['figures']:>3} figures: {s['within_15']:.0%} within 15%, {s['within_20']:.0%} within 20%, "
            f"mean absolute error {s['mae']:.1%}, bias {s['bias']:+.1%}")


def figures_table(split: str) -> str:
    """Every figure of ``split``: published, modelled, signed error, then its source's score."""
    lines = [f"{'figure':<88} {'metric':<16} {'published':>10} {'modelled':>10} {'error':>6}"]
    predictions = [protocol.predict(f) for f in figures.of_split(split)]
    for p in predictions:
        lines.append(f"{p.figure.label[:88]:<88} {p.figure.metric:<16} {p.figure.value:>10.4g} {p.modelled:>10.4g} "
                     f"{p.error:>+6.0%}")
    lines.append("")
    for source in dict.fromkeys(p.figure.source for p in predictions):
        lines.append(score_line(source[:8], protocol.score(p for p in predictions if p.figure.source == source))
                     + f"  ({source})")
    return "\n".join(lines)


def terms_table() -> str:
    """The protocol with each term off in turn, the constant refitted on the fitting set each time."""
    lines = [f"{'term switched off':<24} {'Ampere':>7} {'Hopper':>7} {'fit w/in 15%':>13} {'test w/in 15%':>14} "
             f"{'test MAE':>9} {'test bias':>10}"]
    for term in (None, *parallel.Terms.__dataclass_fields__):
        a = protocol.ablation(term)
        lines.append(f"{a.term:<24} {a.fitted['Ampere']:>7.2f} {a.fitted['Hopper']:>7.2f} {a.fit['within_15']:>13.0%} "
                     f"{a.test['within_15']:>14.0%} {a.test['mae']:>9.1%} {a.test['bias']:>+10.1%}")
    return "\n".join(lines)


def gpt3_plan(gpus: int = 512) -> parallel.Plan:
    """The Megatron-LM README's strong-scaling setup of GPT-3 175B on ``gpus`` H100s: 1152 sequences per step,
    TP 4 x PP 8 with 3 chunks, selective recomputation, the overlaps on, FP32 gradient reduction (bf16)."""
    return parallel.Plan(4, 8, gpus // 32, 1152, 1, "zero1", interleave=3, recompute="selective", precision="bf16",
                         tp_overlap=True, fp32_grad_reduce=True)


GPT3 = parallel.Transformer("GPT-3 175B", 96, 12288, 96, 4096, 131072)  # the README's vocabulary of 131072


def gpt3_on_512_h100(terms: parallel.Terms = parallel.ALL_TERMS) -> parallel.TransformerStep:
    """GPT-3 175B on 512 H100s with the setup of the Megatron-LM README's strong scaling (:func:`gpt3_plan`)."""
    return parallel.step_time(GPT3, gpt3_plan(512), H100_CLUSTER, terms)


def gpt3_mechanisms() -> str:
    """Where the modelled GPT-3 step on 512 H100s goes, mechanism by mechanism, and its MFU with each term off
    (constants as fitted): which parts could make the model faster than the published runs."""
    step, plan = gpt3_on_512_h100(), gpt3_plan(512)
    one = parallel.layer_terms(GPT3, plan, H100_CLUSTER)
    m, n = plan.microbatches, GPT3.layers // plan.pipeline
    passes = 3 + (1 if plan.recompute == "full" else 0)
    compute = {"weight GEMMs": n * m * passes * one.gemm_s, "attention": n * m * (passes + 1) * one.attention_s,
               "memory-bound kernels": n * m * passes * one.memory_s}
    parts = {**compute, "pipeline bubble": step.bubble_s, "TP exposed (with overlap)": step.tensor_comm_s,
             "pipeline sends": step.p2p_s, "DP exposed": step.data_comm_s, "optimizer + overhead": step.update_s}
    lines = [f"{plan.microbatches} micro-batches per pipeline, {plan.interleave} chunks per GPU: step "
             f"{step.step_s:.2f} s (MODELLED)"]
    lines += [f"  {name:<28} {seconds:>6.2f} s  {seconds / step.step_s:>5.1%}" for name, seconds in parts.items()]
    lines.append("  each term off (constants as fitted): " + ", ".join(
        f"{term} {gpt3_on_512_h100(replace(parallel.ALL_TERMS, **{term: False})).mfu:.0%}"
        for term in parallel.Terms.__dataclass_fields__))
    return "\n".join(lines)


def todays_training() -> str:
    """GPT-3 175B (sequence 2048) on 64 DGX H100 nodes, one term of today's training switched on at a time: the
    step, its exposed parts, and throughput counted both ways (MFU without recomputation, HFU with it)."""
    gpt3 = parallel.Transformer("GPT-3 175B", 96, 12288, 96)
    base = parallel.Plan(8, 8, 8, 1024, 1, "zero1", precision="bf16", **published.MEGATRON_2021)
    on = {"fused_attention": True, "dp_overlap": True}
    variants = [("Megatron 2021 (no fused attention, no overlap)", base),
                ("+ fused attention", replace(base, fused_attention=True)),
                ("+ data-parallel overlap", replace(base, **on)),
                ("+ tensor-parallel overlap", replace(base, **on, tp_overlap=True)),
                ("+ interleaved, 3 chunks", replace(base, **on, tp_overlap=True, interleave=3)),
                ("+ selective recomputation", replace(base, **on, tp_overlap=True, interleave=3,
                                                      recompute="selective"))]
    lines = [f"{gpt3.name}, TP 8 x PP 8 x DP 8 on 512 {H100_CLUSTER.gpu.name}, batch 1024 (MODELLED)",
             f"{'setup':<48} {'step s':>7} {'bubble':>7} {'TP exp':>7} {'DP exp':>7} {'p2p':>6} {'MFU':>5} {'HFU':>5}"]
    for name, plan in variants:
        step = parallel.step_time(gpt3, plan, H100_CLUSTER)
        lines.append(f"{name:<48} {step.step_s:>7.2f} {step.bubble_s:>7.2f} {step.tensor_comm_s:>7.2f} "
                     f"{step.data_comm_s:>7.2f} {step.p2p_s:>6.2f} {step.mfu:>5.0%} {step.hfu:>5.0%}")
    return "\n".join(lines)


def protocol_section(test_figures: bool, fit_only: bool) -> dict[str, dict[str, float]]:
    """Print the protocol: the fitting set figure by figure (the test set's too with ``test_figures``), both scores
    and the ablation; with ``fit_only``, nothing of the test set. Returns the scores printed."""
    print("\nThe protocol (course.perf.figures, course.perf.protocol): split by source before any fit; the sustained "
          f"fraction per generation fitted on the FITTING set only: {microbench.TRAINING_EFFICIENCY}\n")
    splits = ("fit",) if fit_only else figures.SPLITS
    for split in splits if test_figures else ("fit",):
        print(f"--- {split.upper()} set ---\n{figures_table(split)}\n")
    scores = {split: protocol.score(protocol.predict(f) for f in figures.of_split(split)) for split in splits}
    for split in splits:
        print(score_line(split.upper(), scores[split]))
    if not fit_only:
        print("\nEach term switched off, the constant refitted on the fitting set (test scored with it)\n")
        print(terms_table())
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--test-figures", action="store_true",
                        help="also print each TEST figure's error (read them only to report, never to choose a term)")
    parser.add_argument("--fit-only", action="store_true",
                        help="score nothing of the test set: the fitting set's figures only, to work from")
    parser.add_argument("--record", metavar="CHANGE", default="",
                        help="append this model's test score to the ledger, saying what changed since the last look")
    args = parser.parse_args(argv)
    print("Calibration set (course.perf.microbench): each constant from a microbenchmark, fitted on the fitting set "
          "of figures, or marked ASSUMED\n")
    print(microbench.format_figures())
    print("\nOlder validation table (course.perf.published): defaults only, no per-row knob\n")
    rows = published.validation_table()
    print(published.format_table(rows))
    scores = protocol_section(args.test_figures, args.fit_only)
    step = gpt3_on_512_h100()
    print(f"\nGPT-3 175B on 512 H100 (the README's strong-scaling setup), MODELLED: MFU {step.mfu:.0%} (model FLOPs), "
          f"HFU {step.hfu:.0%} (with the selective recomputation), {step.flops_per_gpu / 1e12:.0f} TFLOP/s per GPU "
          "counting the recomputation (hardware FLOPs).\nPublished: Megatron-LM README, the same model and batch "
          "(1152 sequences), MFU 47% on 96 H100s down to 42% on 4,608; Llama 3 405B (Table 4): 38-43%.")
    print(gpt3_mechanisms())
    print("\nToday's training, one term at a time (course.perf.parallel)\n")
    print(todays_training())
    summary = published.summary(rows, TOLERANCE)
    ok = summary["within"] >= ENOUGH and abs(summary["bias"]) <= BIAS
    print(f"\n{'PASS' if ok else 'FAIL'}: older table, need >= {ENOUGH} predictions within ±{TOLERANCE:.0%} "
          f"(got {summary['within']} of {summary['predictions']}) and a bias within ±{BIAS:.0%} "
          f"(got {summary['bias']:+.1%}).")
    if "test" in scores:
        test = scores["test"]
        print(f"{'MET' if test['within_15'] >= TARGET else 'NOT MET'}: issue 44's target, {TARGET:.0%} of the test "
              f"set within 15% (got {test['within_15']:.0%} of {test['figures']}).")
    if args.record:
        print(f"\nrecorded in {protocol.LEDGER.name}:\n{protocol.record(args.record)}")
    mark = protocol.fingerprint()
    seen = "in" if mark in protocol.recorded() else "NOT in (run with --record \"what changed\")"
    print(f"the ledger counts {protocol.looks()} models that scored the test set; this one, {mark}, is {seen} it.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
