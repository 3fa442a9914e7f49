"""On a machine with CUDA: measure a DDP step of the course models and an allreduce bus-bandwidth sweep on the
GPUs present, each printed beside what ``course.perf`` predicts for the detected GPU. Without CUDA: say so, exit 0.

    .venv/bin/python benchmarks/gpu_check.py [--link "NVSwitch (A100, NVLink 3)"] [--emulate]

1 GPU: the compute step only (no allreduce). The ranks run through ``course.runtime.launch`` and
``course.world``, which pick nccl and ``cuda:<local_rank>`` when GPUs exist: the course's own code paths.
The intra-node link is not detected: it is assumed from the GPU's form factor (printed; ``--link`` overrides).
``--emulate`` runs the same code on CPU processes (gloo) to check it works; those times are not GPU
measurements and get no prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_ranks import allreduce_seconds, ddp_step_seconds  # noqa: E402

from course.collectives import cost_model  # noqa: E402
from course.perf import catalog, workloads  # noqa: E402
from course.perf import model as pm  # noqa: E402
from course.runtime.launch import launch  # noqa: E402

MB = 1 << 20
DEFAULT_LINK = {"A100": "NVSwitch (A100, NVLink 3)", "H100": "NVSwitch (H100, NVLink 4)",
                "H200": "NVSwitch (H100, NVLink 4)",  # the H200 has the H100's NVLink 4 (H200 datasheet)
                "V100": "NVLink 2 (V100, 6 links)", "P100": "NVLink 1 (P100, 4 links)"}
MODELS = {"DigitsCNN": (workloads.digits_cnn, 256, False), "ResNet-50": (workloads.resnet, 32, True)}


def cluster_for(gpus: int, link_name: str | None) -> pm.Cluster | None:
    """The model's cluster for the GPUs present, or None when the GPU is not in the catalog."""
    gpu = catalog.match_gpu(torch.cuda.get_device_name(0))
    if gpu is None:
        print(f"{torch.cuda.get_device_name(0)} is not in course.perf.catalog: measurements only, no prediction.")
        return None
    form = "SXM" if "SXM" in gpu.name else "PCIe"
    name = link_name or (DEFAULT_LINK.get(gpu.name.split()[0]) if form == "SXM" else None) or "PCIe 4.0 x16"
    print(f"GPU: {torch.cuda.get_device_name(0)} -> catalog {gpu.name}; intra-node link ASSUMED: {name}")
    return pm.Cluster(gpu, catalog.link(name), max(gpus, 1))


def check_steps(gpus: int, cluster: pm.Cluster | None, emulated: bool) -> list[dict]:
    """Measure (and model) a DDP step of each course model; print a line each and return them as rows:
    ``{"what", "measured", "modelled" (None without a catalog GPU), "unit"}``."""
    rows = []
    for name, (workload, batch, autocast) in MODELS.items():
        if emulated and name == "ResNet-50":
            continue  # minutes on two CPU cores
        measured = launch(ddp_step_seconds, gpus, name, batch, 5, autocast, timeout_s=600)[0]
        row = {"what": f"DDP step, {name}, {batch} per rank on {gpus} rank(s)", "measured": measured * 1e3,
               "modelled": None, "unit": "ms"}
        if cluster is not None:
            a = pm.Assumptions(precision="amp" if autocast else "fp32")
            row["modelled"] = pm.step_time(workload(), batch, gpus, cluster, "ring", a).step_s * 1e3
        rows.append(row)
        print(_line(row))
    return rows


def check_bus_bandwidth(gpus: int, cluster: pm.Cluster | None, sizes: tuple[int, ...] = (MB, 8 * MB, 64 * MB, 256 * MB)
                        ) -> list[dict]:
    """Measure (and model) the allreduce bus bandwidth at each size; print and return rows as :func:`check_steps`."""
    rows = []
    measured = launch(allreduce_seconds, gpus, list(sizes), 10, timeout_s=600)[0]
    for nbytes, seconds in measured.items():
        row = {"what": f"allreduce busbw, {nbytes / MB:g} MB on {gpus}", "unit": "GB/s",
               "measured": cost_model.busbw(nbytes, seconds, gpus) / 1e9, "modelled": None}
        if cluster is not None:
            row["modelled"] = cost_model.busbw(nbytes, pm.allreduce_seconds(nbytes, gpus, cluster, "ring"), gpus) / 1e9
        rows.append(row)
        print(_line(row))
    return rows


def _line(row: dict) -> str:
    line = f"{row['what']}: measured {row['measured']:9.3f} {row['unit']}"
    if row["modelled"] is not None:
        line += f", modelled {row['modelled']:9.3f} {row['unit']} (measured / modelled {ratio(row):.2f})"
    return line


def ratio(row: dict) -> float | None:
    """measured / modelled of a row, or None when it has no model."""
    return row["measured"] / row["modelled"] if row["modelled"] else None


def run(link: str | None = None, emulate: bool = False, sizes: tuple[int, ...] | None = None) -> list[dict]:
    """Every measurement of this script (see the module doc) as rows; ``[]`` without CUDA unless ``emulate``."""
    if not torch.cuda.is_available() and not emulate:
        print("No CUDA device here: nothing to measure. Run this on a machine with NVIDIA GPUs to compare the "
              "performance model (course.perf) with measurements; --emulate checks the code paths on CPU.")
        return []
    emulated = not torch.cuda.is_available()
    gpus = 2 if emulated else torch.cuda.device_count()
    cluster = None if emulated else cluster_for(gpus, link)
    if emulated:
        print("EMULATED ranks on CPU (gloo): these times are not GPU measurements and get no prediction.")
    rows = check_steps(gpus, cluster, emulated)
    if gpus > 1:
        rows += check_bus_bandwidth(gpus, cluster, *([sizes] if sizes else []))
    else:
        print("1 GPU: no allreduce to measure.")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", help="intra-node link, a course.perf.catalog name (default: from the GPU)")
    parser.add_argument("--emulate", action="store_true", help="run the code paths on 2 CPU ranks (no GPU)")
    args = parser.parse_args()
    run(args.link, args.emulate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
