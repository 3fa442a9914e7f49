"""The performance model against published figures: one row per figure, model vs published, and their ratio.

Each row names its source (a paper, a vendor page, a GitHub thread, or an article of the course's source
material, by its title) and says which inputs the source leaves open and the row therefore *assumes* (which GPU, batch
size, whether communication overlaps backward). All rows share one :class:`~course.perf.model.Assumptions`
(software efficiency), except that the back-of-envelope rows use their source's own idealisation (full link
rate, no latency). ``tests/perf/test_published.py`` requires every ratio within 15%; ``benchmarks/perf_model.py``
prints the table and ``notebooks/05_ddp.ipynb`` shows it.

Two rows (14 days on one M40, 29 hours on 8 P100) measure little more than the assumed ``compute_efficiency``
of 1/3: they check that one value fits two GPU generations, not a prediction from first principles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course.collectives import cost_model
from course.perf import catalog as hardware
from course.perf import model as pm
from course.perf import workloads

IMAGENET = 1_281_167  # ImageNet-1k training images (Russakovsky et al. 2015)
DAY, HOUR = 86_400.0, 3_600.0

# the course's source material, by the title students can look up
RESCALE = "Rescale blog, \"Deep Learning with Multiple GPUs on Rescale: Torch\""
CAFFE2 = "Caffe2 documentation, data_parallel_model"
MULTI_GPUS_POST = "\"Deep learning with Multi-GPUs\" (blog post)"
MULTI_GPU_TRAINING = "\"Multi GPU Training\" (blog post, 2020)"
GOYAL = "Goyal et al. 2017, https://arxiv.org/abs/1706.02677"
HOROVOD = "Sergeev & Del Balso 2018, https://arxiv.org/abs/1802.05799 (Fig. 6)"
D2L = "Dive into Deep Learning, Parameter Servers: https://d2l.ai/chapter_computational-performance/parameterserver.html"


@dataclass(frozen=True)
class Row:
    """One published figure and what the model says for the same setting."""

    claim: str      # what was measured or computed, in a few words
    source: str     # where the figure is published
    published: float
    modelled: float
    unit: str
    assumed: str    # inputs the source leaves open, which the row assumes

    @property
    def ratio(self) -> float:
        return self.modelled / self.published


def _imagenet_hours(step: pm.StepTime, global_batch: int, epochs: int = 90) -> float:
    return epochs * IMAGENET / global_batch * step.step_s / HOUR


def validation_table(a: pm.Assumptions | None = None) -> list[Row]:
    """Every validation row, computed now by :mod:`course.perf.model` with the shared assumptions ``a``
    (default: :class:`~course.perf.model.Assumptions`)."""
    a = a or pm.Assumptions()
    r50, r101 = workloads.resnet(), workloads.resnet((3, 4, 23, 3), "ResNet-101")
    wrn = workloads.wide_resnet(28, 10)
    pcie3 = hardware.link("PCIe 3.0 x16")
    m40 = pm.Cluster(hardware.gpu("M40"), pcie3, 8)
    k40 = pm.Cluster(hardware.gpu("K40"), pcie3, 4)
    dgx1 = pm.Cluster(hardware.gpu("P100 SXM2"), hardware.link("NVLink 1 (P100, 4 links)"), 8, hardware.link("50GbE"))
    uber = pm.Cluster(hardware.gpu("P100 PCIe"), pcie3, 4, hardware.link("25GbE"))
    hgx = pm.Cluster(hardware.gpu("A100 SXM4"), hardware.link("NVSwitch (A100, NVLink 3)"), 8)
    ideal = replace(a, link_efficiency=1.0, alpha_s=0.0)  # the back-of-envelope rows' own idealisation
    after_backward = replace(a, overlap=False)
    goyal8 = pm.step_time(r50, 32, 8, dgx1, "hierarchical", a)
    goyal256 = pm.step_time(r50, 32, 256, dgx1, "hierarchical", a)
    nbytes = 2**30
    return [
        Row("WRN on CIFAR-10, 4 GPUs vs 1, Torch DataParallelTable (speedup)", RESCALE, 3.33,
            pm.scaling_curve(wrn, None, (1, 4), k40, "naive", a, global_batch_size=128)[4]["speedup"], "x",
            "WRN-28-10, global batch 128 (the repository's default), Kepler K40-class GPUs on PCIe 3 (unnamed)"),
        Row("ResNet-50, 8 M40 vs 1, Caffe2 data_parallel_model (speedup)", CAFFE2, 7.0,
            pm.scaling_curve(r50, 32, (1, 8), m40, "ring", after_backward)[8]["speedup"], "x",
            "32 images per GPU (the same page's example), ring over PCIe 3, allreduce after backward"),
        Row("ResNet-50, 90 epochs of ImageNet on one M40", f"{MULTI_GPUS_POST}, citing You et al. 2017", 14.0,
            _imagenet_hours(pm.step_time(r50, 32, 1, m40, "ring", a), 32) / 24, "days",
            "batch 32, FP32; data loading never the bottleneck"),
        Row("4 MB of gradients over a 40 Gbit/s link", f"{MULTI_GPU_TRAINING}, citing Tim Dettmers", 0.75,
            1e3 * pm.message_seconds(4e6, pm.alpha_beta(hardware.Link("40 Gbit/s", 40e9 / 8, MULTI_GPU_TRAINING),
                                                        ideal)),
            "ms", "one message at the full link rate"),
        Row("ResNet-50, 90 epochs on 8 P100 (Goyal's baseline)", f"{GOYAL}; https://developer.nvidia.com/"
            "facebook-trains-imagenet-1-hour", 29.0, _imagenet_hours(goyal8, 256), "hours",
            "32 images per GPU, FP32, DGX-1 (NVLink 1)"),
        Row("ResNet-50, 90 epochs on 256 P100", GOYAL, 1.0, _imagenet_hours(goyal256, 8192), "hours",
            "32 DGX-1 on 50 Gbit Ethernet, hierarchical allreduce overlapping backward (as the paper describes)"),
        Row("scaling efficiency from 8 to 256 GPUs", GOYAL, 0.90, goyal8.step_s / goyal256.step_s, "",
            "as the two rows above"),
        Row("Horovod, ResNet-101 on 128 GPUs over 25 Gbit TCP (scaling efficiency)", HOROVOD, 0.88,
            pm.scaling_curve(r101, 64, (1, 128), uber, "ring", a)[128]["efficiency"], "",
            "4 P100 PCIe per server, 64 images per GPU, ring over all 128 overlapping backward"),
        Row("nccl-tests all_reduce busbw, 8 A100 on NVSwitch, 1 GiB", "https://github.com/NVIDIA/nccl-tests/issues/"
            "149 (8 A100-SXM4-80GB on NVLink, HPE Apollo 6500: ~200 GB/s)", 200.0,
            float(cost_model.busbw(nbytes, pm.allreduce_seconds(nbytes, 8, hgx, "ring", a), 8)) / 1e9, "GB/s",
            "NVLink 3 at 300 GB/s per direction per GPU through NVSwitch"),
        Row("parameter server: 3 GPUs push 160 MB to a 4th and pull it back", D2L, 60.0,
            1e3 * pm.server_seconds(160e6, 3, pm.alpha_beta(pcie3, ideal)), "ms",
            "PCIe 3.0 x16 at its full rate (the source rounds it to 16 GB/s)"),
        Row("the same 160 MB split over 4 GPUs (a ring: reduce-scatter + all-gather)", D2L, 15.0,
            1e3 * float(cost_model.predict("ring", 160e6, 4, pm.alpha_beta(pcie3, ideal))), "ms",
            "as the row above"),
    ]


def format_table(rows: list[Row]) -> str:
    """The table as aligned text: claim, published, modelled, ratio; then each row's source and assumptions."""
    lines = [f"{'#':>2}  {'claim':<70} {'published':>10} {'modelled':>10} {'ratio':>6}"]
    for i, row in enumerate(rows, 1):
        lines.append(f"{i:>2}  {row.claim[:70]:<70} {row.published:>10.3g} {row.modelled:>10.3g} {row.ratio:>6.2f}"
                     f"  {row.unit}")
    lines.append("")
    for i, row in enumerate(rows, 1):
        lines.append(f"{i:>2}  source: {row.source}\n    assumed: {row.assumed}")
    return "\n".join(lines)
