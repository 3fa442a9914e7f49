"""Notebook 05c's questions: whose step waits longer for unhidden communication, the roofline, and the planner.

Every answer is modelled by ``course.perf`` on the setups the notebook builds; nothing here is measured.
"""

from __future__ import annotations

from typing import Any

from course.perf import catalog, roofline, workloads
from course.perf import model as pm
from course.perf import planner as plans
from course.perf.parallel import Transformer


def exposed_share(gpus: int = 128, per_gpu_batch: int = 64) -> dict[str, Any]:
    """Which of ResNet-101 and VGG-16 spends the larger share of its step on exposed communication, over TCP."""
    tcp = pm.Cluster(catalog.gpu("P100 PCIe"), catalog.link("PCIe 3.0 x16"), 4, catalog.link("25GbE"), 1)
    fusion = pm.Assumptions(bucket_bytes=64 * 2**20)  # Horovod's fusion buffer
    networks = (("ResNet-101", workloads.resnet((3, 4, 23, 3), "ResNet-101")), ("VGG-16", workloads.vgg16()))
    overlap = {name: pm.step_time(w, per_gpu_batch, gpus, tcp, "ring", fusion) for name, w in networks}
    exposed = {name: s.exposed_comm_s / s.step_s for name, s in overlap.items()}
    return dict(
        prompt=(f"MODELLED: ResNet-101 and VGG-16, {per_gpu_batch} images per GPU on {gpus} P100s, 4 per server, one "
                "25 Gbit/s Ethernet adapter per server carrying TCP. For which network does a larger share of the "
                "step wait for communication that backward did not hide?"),
        answer=max(exposed, key=exposed.get), choices=tuple(overlap),
        explanation=", ".join(f"{n}: {s.comm_s * 1e3:.0f} ms of allreduce, {s.exposed_comm_s * 1e3:.0f} ms exposed "
                              f"({exposed[n]:.0%} of its {s.step_s * 1e3:.0f} ms step)" for n, s in overlap.items())
        + ": gradient bytes per FLOP decide it, and VGG-16 has far more of them.")


def roofline_count(batch: int = 32, gpu_name: str = "H100 SXM5", precision: str = "bf16") -> dict[str, Any]:
    """How many of DigitsCNN's layers with weights are compute-bound on ``gpu_name``."""
    cnn = workloads.digits_cnn()
    compute_bound = sum(p.bound == "compute" for p in roofline.points(cnn, catalog.gpu(gpu_name), precision, batch))
    short = gpu_name.split(" ")[0]
    return dict(
        prompt=(f"The course's DigitsCNN has {len(cnn.layers)} layers with weights. In {precision} at a batch of "
                f"{batch} on an {short}, how many of them are compute-bound (intensity above the ridge point)?"),
        answer=float(compute_bound), rel_tol=0.0, unit="layers",
        explanation=(f"{compute_bound}: an 8x8 image gives each filter too few pixels to reuse its weights; the "
                     f"layers move more bytes per FLOP than the {short}'s ridge point allows."))


def planner(gpus: int = 8, batch: int = 256) -> dict[str, Any]:
    """The fastest strategy that fits a 30B GPT on one node of 8 A100s (80 GB)."""
    selene = pm.Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                        catalog.link("InfiniBand HDR"), 8)
    gpt30 = Transformer("GPT 30B", 48, 7168, 56)
    found = plans.options(gpt30, selene, gpus, batch)
    fastest = plans.best(found)
    return dict(
        prompt=(f"MODELLED: a {gpt30.params / 1e9:.0f}B-parameter GPT, mixed-precision Adam, a batch of {batch} "
                f"sequences of {gpt30.seq} tokens, on one node of {gpus} {selene.gpu.name} "
                f"({selene.gpu.memory_bytes / 1e9:.0f} GB each). Which strategy is the fastest one that fits?"),
        answer=fastest.strategy, choices=plans.STRATEGIES,
        explanation=f"{fastest.strategy}: " + "; ".join(
            f"{o.strategy} needs {o.memory_bytes / 1e9:.0f} GB per GPU ({'fits' if o.fits else 'does not fit'}), "
            f"step {o.step_s:.0f} s" for o in found))
