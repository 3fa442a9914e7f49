"""The performance model against published figures: each row labelled calibration, arithmetic or prediction.

* **calibration**: the row a constant was fitted to (:mod:`course.perf.microbench`); it agrees by construction.
* **arithmetic**: a back-of-envelope figure (bytes over a link at its full rate); it checks the formulas only.
* **prediction**: a published end-to-end result the model was never fitted to, computed with the defaults
  only. No row may pass an efficiency, a latency or any other knob: a row states the *setup* its source
  describes (GPUs, links, batch, precision, scheme), and ``assumed`` says which parts of that setup the source
  leaves open.

:func:`summary` reports the prediction rows' mean signed error (the bias) beside their mean absolute error and the
largest, so neither an error of one sign nor errors of both signs that cancel can hide.
``benchmarks/perf_model.py`` prints the table, ``tests/perf/test_published.py`` keeps it.
Taught in ``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course.collectives import cost_model
from course.perf import catalog, context_expert, microbench, parallel, workloads
from course.perf import model as pm

KINDS = ("calibration", "arithmetic", "prediction")
IMAGENET = 1_281_167  # ImageNet-1k training images (Russakovsky et al. 2015)
DAY, HOUR = 86_400.0, 3_600.0
GOYAL = "Goyal et al. 2017, Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour, arXiv:1706.02677"
HOROVOD = "Sergeev & Del Balso 2018, Horovod: fast and easy distributed deep learning in TensorFlow, arXiv:1802.05799"
HOROVOD_README = ("Horovod README and docs/benchmarks: 128 servers x 4 Pascal GPUs, RoCE-capable 25 Gbit/s "
                  "(https://github.com/horovod/horovod)")
NARAYANAN = ("Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using "
             "Megatron-LM, arXiv:2104.04473, Table 1")
MEGATRON_V1 = "NVIDIA ADLR, MegatronLM's Supercharged V1.0 (2019), https://nv-adlr.github.io/MegatronLMV1, Table 1"
D2L = "Zhang et al., Dive into Deep Learning, section 13.7 Parameter Servers (https://d2l.ai)"
NVIDIA_R50 = ("NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, training performance tables "
              "(https://github.com/NVIDIA/DeepLearningExamples)")
SEED_000 = "Rescale blog, Deep Learning with Multiple GPUs on Rescale: Torch (DataParallelTable, 10 epochs)"
SEED_001 = "You, Zhang, Demmel, Keutzer & Hsieh 2017, ImageNet Training in Minutes, arXiv:1709.05011"
SEED_002 = "Caffe2 documentation, Synchronous SGD with data_parallel_model (caffe2.ai)"
SEED_003 = "Tim Dettmers, blog post on GPU communication: 4 MB of gradients over 40 Gbit/s"


@dataclass(frozen=True)
class Row:
    """One published figure and what the model says for the same setup."""

    kind: str       # one of KINDS
    claim: str      # what was measured or computed, in a few words
    source: str     # where the figure is published (author, title, year or address)
    published: float
    modelled: float
    unit: str
    assumed: str    # the parts of the setup the source leaves open, which the row assumes

    @property
    def error(self) -> float:
        """Signed relative error: +0.10 means the model says 10% more than published."""
        return self.modelled / self.published - 1


def _days_on_imagenet(step: pm.StepTime, global_batch: int, epochs: int = 90) -> float:
    return epochs * IMAGENET / global_batch * step.step_s / DAY


def _clusters() -> dict[str, pm.Cluster]:
    pcie3, link = catalog.link("PCIe 3.0 x16"), catalog.link
    return {
        "M40": pm.Cluster(catalog.gpu("M40"), pcie3, 8),
        "K40": pm.Cluster(catalog.gpu("K40"), pcie3, 4),
        "DGX-1": pm.Cluster(catalog.gpu("P100 SXM2"), link("NVLink 1 (P100, 4 links)"), 8, link("50GbE"), 1),
        "Uber TCP": pm.Cluster(catalog.gpu("P100 PCIe"), pcie3, 4, link("25GbE"), 1),
        "Uber RoCE": pm.Cluster(catalog.gpu("P100 PCIe"), pcie3, 4, link("25GbE").over("roce"), 1),
        "HGX A100": pm.Cluster(catalog.gpu("A100 SXM4"), link("NVSwitch (A100, NVLink 3)"), 8),
        "DGX A100": pm.Cluster(catalog.gpu("A100 SXM4 80GB"), link("NVSwitch (A100, NVLink 3)"), 8),
        "DGX-1V": pm.Cluster(catalog.gpu("V100 SXM2"), link("NVLink 2 (V100, 6 links)"), 8),
        "Selene": pm.Cluster(catalog.gpu("A100 SXM4 80GB"), link("NVSwitch (A100, NVLink 3)"), 8,
                             link("InfiniBand HDR"), 8),
        "DGX-2H": pm.Cluster(catalog.gpu("V100 SXM3 (DGX-2H)"), link("NVSwitch (V100 DGX-2, NVLink 2)"), 16,
                             link("InfiniBand EDR"), 8),
    }


def conv_efficiency() -> float:
    """The FP32 convolution efficiency under which ResNet-50 takes 14 days for 90 epochs on one M40 (the
    calibration row), solved by bisection; :data:`course.perf.microbench.CONV_EFFICIENCY` holds it rounded."""
    m40, r50 = _clusters()["M40"], workloads.resnet()
    low, high, saved = 0.05, 1.0, microbench.CONV_EFFICIENCY
    try:
        for _ in range(40):
            microbench.CONV_EFFICIENCY = (low + high) / 2
            days = _days_on_imagenet(pm.step_time(r50, 32, 1, m40), 32)
            low, high = (microbench.CONV_EFFICIENCY, high) if days > 14.0 else (low, microbench.CONV_EFFICIENCY)
        return (low + high) / 2
    finally:
        microbench.CONV_EFFICIENCY = saved


def calibration_rows() -> list[Row]:
    """The figures constants were fitted to, computed back through the model."""
    c, nbytes = _clusters(), 8 * 2**30
    r50 = workloads.resnet()
    busbw = cost_model.busbw(nbytes, pm.allreduce_seconds(nbytes, 8, c["HGX A100"], "ring"), 8) / 1e9
    return [
        Row("calibration", "ResNet-50, 90 epochs of ImageNet on one M40 (fits FP32 convolution efficiency)",
            SEED_001, 14.0, _days_on_imagenet(pm.step_time(r50, 32, 1, c["M40"]), 32), "days",
            "32 images per step, FP32, SGD; the input pipeline never waits"),
        Row("calibration", "nccl-tests allreduce busbw, 8 A100 on NVSwitch, 8 GiB (fits NVLink efficiency)",
            microbench.NCCL_TESTS_149, 230.0, float(busbw), "GB/s", "none: the source's own setup"),
    ]


def arithmetic_rows() -> list[Row]:
    """Back-of-envelope figures: their own idealisation (the full link rate, no latency)."""
    full_pcie = cost_model.AlphaBeta(0.0, 1 / catalog.link("PCIe 3.0 x16").bandwidth)
    return [
        Row("arithmetic", "4 MB of gradients over a 40 Gbit/s link", SEED_003, 0.75,
            1e3 * pm.message_seconds(4e6, cost_model.AlphaBeta(0.0, 8 / 40e9)), "ms", "the full link rate"),
        Row("arithmetic", "parameter server: 3 GPUs push 160 MB to a 4th and pull it back", D2L, 60.0,
            1e3 * pm.server_seconds(160e6, 3, full_pcie), "ms", "PCIe 3.0 x16 at its full rate"),
        Row("arithmetic", "the same 160 MB allreduced by a ring of 4", D2L, 15.0,
            1e3 * float(cost_model.predict("ring", 160e6, 4, full_pcie)), "ms", "PCIe 3.0 x16 at its full rate"),
    ]


def cnn_rows() -> list[Row]:
    """Data-parallel CNN training on NVLink, PCIe, TCP and RoCE, 4 to 512 GPUs, and a parameter server."""
    c, a = _clusters(), pm.Assumptions()
    r50, r101, vgg = workloads.resnet(), workloads.resnet((3, 4, 23, 3), "ResNet-101"), workloads.vgg16()
    fused = replace(a, bucket_bytes=64 * 2**20)  # Horovod's tensor-fusion buffer
    goyal8 = pm.step_time(r50, 32, 8, c["DGX-1"], "hierarchical", a)
    goyal256 = pm.step_time(r50, 32, 256, c["DGX-1"], "hierarchical", a)

    def efficiency(workload: workloads.Workload, n: int, cluster: str, scheme: str = "ring",
                   assumptions: pm.Assumptions = fused) -> float:
        return pm.scaling_curve(workload, 64, (1, n), c[cluster], scheme, assumptions)[n]["efficiency"]

    return [
        Row("prediction", "WRN-28-10 on CIFAR-10, 4 GPUs vs 1, DataParallelTable (speedup)", SEED_000, 3.33,
            pm.scaling_curve(workloads.wide_resnet(), None, (1, 4), c["K40"], "naive", a,
                             global_batch_size=128)[4]["speedup"], "x",
            "global batch 128 (the repository's default); Kepler K40-class GPUs on PCIe 3.0 (unnamed)"),
        Row("prediction", "ResNet-50, 8 M40 vs 1, Caffe2 data_parallel_model (speedup)", SEED_002, 7.0,
            pm.scaling_curve(r50, 32, (1, 8), c["M40"], "ring", a)[8]["speedup"], "x",
            "32 images per GPU (the page's example); a ring over PCIe 3.0 overlapping backward"),
        Row("prediction", "ResNet-50, 90 epochs on 8 P100, one DGX-1 (Goyal's baseline)", GOYAL, 29.0,
            _days_on_imagenet(goyal8, 256) * 24, "hours", "FP32; NVLink 1 as a ring; data never waits"),
        Row("prediction", "ResNet-50, 90 epochs on 256 P100 (32 DGX-1 servers)", GOYAL, 1.0,
            _days_on_imagenet(goyal256, 8192) * 24, "hours",
            "one 50 Gbit/s Ethernet adapter per server, carrying TCP; hierarchical allreduce overlapping backward"),
        Row("prediction", "Horovod, ResNet-101 on 128 GPUs over 25 Gbit/s TCP (scaling efficiency)", HOROVOD,
            0.88, efficiency(r101, 128, "Uber TCP"), "",
            "P100 PCIe (the paper: Pascal), 64 images per GPU, 64 MiB fusion buffer, flat NCCL ring"),
        Row("prediction", "Horovod, ResNet-101 on 512 GPUs over 25 Gbit/s RoCE (scaling efficiency)",
            HOROVOD_README, 0.90, efficiency(r101, 512, "Uber RoCE"), "", "as the row above, RDMA"),
        Row("prediction", "Horovod, VGG-16 on 512 GPUs over 25 Gbit/s RoCE (scaling efficiency)", HOROVOD_README,
            0.68, efficiency(vgg, 512, "Uber RoCE"), "", "as the row above"),
        Row("prediction", "Horovod, VGG-16 on 128 GPUs: RDMA over TCP (throughput ratio)", HOROVOD, 1.30,
            efficiency(vgg, 128, "Uber RoCE") / efficiency(vgg, 128, "Uber TCP"), "x",
            "the paper's '30% faster with RDMA' read at its 128 GPUs; setup as above"),
        Row("prediction", "TensorFlow parameter servers, ResNet-101 on 128 GPUs (scaling efficiency)", HOROVOD,
            0.50, efficiency(r101, 128, "Uber TCP", "parameter_server", replace(fused, server_shards=32)), "",
            "the paper's 'about half of the GPUs' resources lost'; one server shard per node (32), TCP"),
    ]

#: NVIDIA's ResNet-50 v1.5 training throughput (images/s): (system, precision, GPUs, published). All eight kept.
NVIDIA_TABLE = (("DGX A100", "tf32", 1, 938.0), ("DGX A100", "amp", 1, 2470.0), ("DGX A100", "tf32", 8, 7248.0),
                ("DGX A100", "amp", 8, 16621.0), ("DGX-1V", "fp32", 1, 367.0), ("DGX-1V", "amp", 1, 1200.0),
                ("DGX-1V", "fp32", 8, 2855.0), ("DGX-1V", "amp", 8, 8322.0))


def nvidia_cnn_rows() -> list[Row]:
    """ResNet-50 on one and eight A100s and V100s, TF32/FP32 and mixed precision, DDP over NVLink."""
    c, r50, rows = _clusters(), workloads.resnet(), []
    for system, precision, gpus, published in NVIDIA_TABLE:
        step = pm.step_time(r50, 256, gpus, c[system], "ring", pm.Assumptions(precision=precision))
        rows.append(Row("prediction", f"ResNet-50 on {gpus} {c[system].gpu.name.split()[0]} ({system}), "
                        f"{precision} (images/s)", NVIDIA_R50, published, gpus * 256 / step.step_s, "img/s",
                        "256 images per GPU; DDP ring over NVLink; data never waits (the README uses DALI)"))
    return rows


#: Narayanan et al. 2021, Table 1: (params, layers, hidden, heads, tensor, pipeline, GPUs, batch, TFLOP/s per GPU).
#: The rows kept: the first, the first with 8-way tensor parallelism, the first with a pipeline, the middle
#: pipeline size and the largest (the other five lie between them).
MEGATRON_TABLE = (("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137.0), ("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135.0),
                  ("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138.0), ("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148.0),
                  ("1T", 128, 25600, 160, 8, 64, 3072, 3072, 163.0))


#: What Megatron-LM did in 2019-2021, as its papers describe it (a setup, not a knob): no fused attention kernel
#: (FlashAttention is from 2022), no data-parallel overlap (Narayanan et al. 2021 reduce the gradients after the
#: pipeline flush), no tensor-parallel overlap.
MEGATRON_2021 = {"fused_attention": False, "dp_overlap": False, "tp_overlap": False}


def transformer_rows() -> list[Row]:
    """GPT models trained with tensor x pipeline x data parallelism, and one large model on one GPU."""
    c = _clusters()
    rows = []
    for name, layers, hidden, heads, t, p, gpus, batch, published in MEGATRON_TABLE:
        model = parallel.Transformer(f"GPT {name}", layers, hidden, heads)
        step = parallel.step_time(model, parallel.Plan(t, p, gpus // (t * p), batch, **MEGATRON_2021), c["Selene"])
        rows.append(Row("prediction", f"GPT {name}: TP {t} x PP {p} x DP {gpus // (t * p)} on {gpus} A100 "
                        "(TFLOP/s per GPU, recomputation counted)", NARAYANAN, published, step.flops_per_gpu / 1e12,
                        "TFLOP/s",
                        "microbatch 1, plain 1F1B, full recomputation, FP16 gradients; 8 HDR adapters per node"))
    gpt2 = parallel.Transformer("GPT-2 1.2B", 40, 1536, 16, seq=1024, vocab=50257)
    single = parallel.step_time(gpt2, parallel.Plan(global_batch=8, microbatch=8, **MEGATRON_2021), c["DGX-2H"])
    rows.append(Row("prediction", "GPT-2 1.2B on one V100 (DGX-2H), batch 8: one iteration", MEGATRON_V1, 1.288,
                    single.step_s, "s", "sequence 1024, FP16 with Adam, activation recomputation (the repository's "
                    "GPT-2 scripts)"))
    return rows


def validation_table() -> list[Row]:
    """Every row, computed now with the model's defaults."""
    return [*calibration_rows(), *arithmetic_rows(), *cnn_rows(), *nvidia_cnn_rows(), *transformer_rows(),
            *context_expert_rows()]


def context_expert_rows() -> list[Row]:
    """Context and expert parallelism's published configurations (Llama 3 at 128K with CP 16, DeepSeek-V3's
    cross-node EP), as :func:`course.perf.context_expert.rows` models them (issue 45)."""
    return [Row(**row) for row in context_expert.rows()]


def summary(rows: list[Row], tolerance: float = 0.2) -> dict[str, float]:
    """The prediction rows' count, how many fall within ``tolerance``, their bias (mean signed error), their mean
    absolute error and the largest error by size (with its sign): a small bias alone can hide large errors of
    both signs that cancel."""
    errors = [row.error for row in rows if row.kind == "prediction"]
    if not errors:
        raise ValueError("no prediction rows to summarise: pass validation_table()'s rows.")
    return {"predictions": len(errors), "within": sum(abs(e) <= tolerance for e in errors),
            "bias": sum(errors) / len(errors), "mae": sum(abs(e) for e in errors) / len(errors),
            "largest": max(errors, key=abs)}


def _number(value: float) -> str:
    return f"{value:>9,.0f}" if abs(value) >= 100 else f"{value:>9.3g}"


def format_table(rows: list[Row]) -> str:
    """The table as aligned text (kind, claim, published, modelled, signed error), each row's source and
    assumptions, then the prediction rows' bias beside their largest error."""
    lines = [f"{'#':>2}  {'kind':<11} {'claim':<76} {'published':>9} {'modelled':>9} {'error':>6}"]
    for i, row in enumerate(rows, 1):
        lines.append(f"{i:>2}  {row.kind:<11} {row.claim[:76]:<76} {_number(row.published)} {_number(row.modelled)} "
                     f"{row.error:>+6.0%}  {row.unit}")
    lines.append("")
    for i, row in enumerate(rows, 1):
        lines.append(f"{i:>2}  source: {row.source}\n    assumed: {row.assumed}")
    s = summary(rows)
    lines.append(f"\nprediction rows: {s['predictions']}, {s['within']} within ±20%; bias (mean signed error) "
                 f"{s['bias']:+.1%}; mean absolute error {s['mae']:.1%}; largest error {s['largest']:+.0%}")
    return "\n".join(lines)
