"""On a GPU: measure what the performance model assumes, kernel by kernel, and write it beside the model.

    .venv/bin/python benchmarks/gpu_kernels.py              # on a machine with CUDA: writes benchmarks/results/
    .venv/bin/python benchmarks/gpu_kernels.py --dry-run    # anywhere: tiny sizes on the CPU, checks the code runs

Measured (median of repeats, after warm-up): GEMM throughput over the shapes transformers and CNNs use (16-bit),
bandwidth-bound kernels (copy, layer norm, softmax, an Adam step), and one training step each of ResNet-50 and of
a small GPT. Modelled: the same from ``course.perf`` for the detected GPU: a GEMM at the microbenchmark fraction
of the peak for its depth (``microbench.gemm_efficiency``), a bandwidth-bound kernel at 80% of the memory
bandwidth, the steps from ``perf.model.step_time`` and ``perf.parallel.step_time``. Each row gets
measured / modelled; the target band is 0.8-1.25. A dry run prints "CPU dry run: not a GPU measurement", models
nothing and writes a results file only where ``--out`` says.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from course.memory.resnet import resnet50  # noqa: E402
from course.model_parallel import transformer as gpt  # noqa: E402
from course.perf import catalog, microbench, parallel, workloads  # noqa: E402
from course.perf import model as pm  # noqa: E402

DRY_RUN = "CPU dry run: not a GPU measurement"
BAND = (0.8, 1.25)  # measured / modelled within this band counts as agreeing


@dataclass(frozen=True)
class Row:
    """One measurement and the model's number for it (None when not modelled)."""

    group: str
    what: str
    measured: float
    modelled: float | None
    unit: str

    @property
    def ratio(self) -> float | None:
        """Measured over modelled, for a rate (TFLOP/s, GB/s) or a time (ms) alike: above 1 means the GPU ran
        faster than modelled for a rate, slower for a time."""
        return None if self.modelled is None else self.measured / self.modelled


def verdict(ratio: float | None) -> str:
    """``"ok"`` inside :data:`BAND`, ``"OUT"`` outside it, ``"-"`` when nothing was modelled."""
    if ratio is None:
        return "-"
    return "ok" if BAND[0] <= ratio <= BAND[1] else "OUT"


def seconds(work: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``work()`` after warm-up calls (two on a GPU, one on the CPU), the device synchronised
    around each call."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    warm, times = (2 if device.type == "cuda" else 1), []
    for i in range(repeats + warm):
        sync()
        start = time.perf_counter()
        work()
        sync()
        if i >= warm:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def modelled_gemm(gpu: catalog.Gpu, k: int) -> float:
    """TFLOP/s of a BF16 GEMM of depth ``k``: the peak times the microbenchmark fraction for that depth."""
    return gpu.peak_flops("bf16") / 1e12 * microbench.gemm_efficiency("bf16", gpu.generation, k)


def modelled_bandwidth(gpu: catalog.Gpu) -> float:
    """GB/s of a bandwidth-bound kernel: the memory bandwidth times the model's element-wise fraction."""
    return gpu.memory_bandwidth * microbench.constant("memory") / 1e9


def gpt_config(dry: bool) -> gpt.Config:
    """The small GPT of the step: 12 layers of h 1024 (GPT-2 medium's width), sequences of 1024; dry: 2 of h 64."""
    if dry:
        return gpt.Config(vocab_size=512, seq_len=64, d_model=64, num_heads=4, num_layers=2, d_ff=256)
    return gpt.Config(vocab_size=50304, seq_len=1024, d_model=1024, num_heads=16, num_layers=12, d_ff=4096)


def modelled_steps(gpu: catalog.Gpu, batch: int, config: gpt.Config, sequences: int) -> tuple[float, float]:
    """Seconds of one step on one ``gpu``: ResNet-50 at ``batch`` under autocast with Adam
    (``perf.model.step_time``), and the GPT of ``config`` on ``sequences`` sequences in BF16 without
    recomputation (``perf.parallel.step_time``)."""
    one = pm.Cluster(gpu, catalog.link("PCIe 4.0 x16"), 1)
    cnn = pm.step_time(workloads.resnet(), batch, 1, one, "ring", pm.Assumptions(precision="amp", optimizer="adam"))
    sizes = parallel.Transformer("GPT", config.num_layers, config.d_model, config.num_heads, config.seq_len,
                                 config.vocab_size, tied=False)
    plan = parallel.Plan(1, 1, 1, sequences, sequences, recompute="none", precision="bf16")
    return cnn.step_s, parallel.step_time(sizes, plan, one).step_s


def gemm_shapes(dry: bool) -> list[tuple[str, int, int, int]]:
    """``(name, m, n, k)``: a GPT layer's GEMMs (8192 tokens), an attention score block (k = 128) and ResNet-50's
    convolutions as implicit GEMMs (batch 32); the dry run divides every size by 32."""
    tokens, shapes = 8192, []
    for h in (1024, 4096, 8192):
        shapes += [(f"QKV, h={h}", tokens, 3 * h, h), (f"MLP down, h={h}", tokens, h, 4 * h)]
    shapes += [("attention scores, k=128", 4096, 4096, 128)]
    for stage, (size, width) in enumerate(((56, 64), (28, 128), (14, 256), (7, 512))):
        shapes.append((f"ResNet-50 stage {stage + 1} 3x3 conv", 32 * size * size, width, 9 * width))
    return [(name, max(m // 32, 8), max(n // 32, 8), max(k // 32, 8)) if dry else (name, m, n, k)
            for name, m, n, k in shapes]


def matmul_rows(device: torch.device, gpu: catalog.Gpu | None, dry: bool, repeats: int) -> list[Row]:
    dtype = torch.float32 if dry else torch.bfloat16
    rows = []
    for name, m, n, k in gemm_shapes(dry):
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        rate = 2 * m * n * k / seconds(lambda a=a, b=b: a @ b, device, repeats) / 1e12
        modelled = None if gpu is None else modelled_gemm(gpu, k)
        rows.append(Row("GEMM", f"{name}: {m}x{n}x{k}", rate, modelled, "TFLOP/s"))
    return rows


def bandwidth_rows(device: torch.device, gpu: catalog.Gpu | None, dry: bool, repeats: int) -> list[Row]:
    """Copy, layer norm and softmax on 16-bit activations (read once, written once), an Adam step on FP32 weights
    (28 bytes per parameter, as the model counts it)."""
    tokens, width = (64, 256) if dry else (16384, 8192)
    dtype = torch.float32 if dry else torch.bfloat16
    x = torch.randn(tokens, width, device=device, dtype=dtype)
    norm = nn.LayerNorm(width, device=device, dtype=dtype)
    moved = 2 * x.numel() * x.element_size()
    kernels = {"copy": lambda: x.clone(), "layer norm": lambda: norm(x), "softmax": lambda: x.softmax(-1)}
    rows = [(name, moved / seconds(work, device, repeats)) for name, work in kernels.items()]
    params = [nn.Parameter(torch.randn(width * (64 if dry else 8192 // 4), device=device))]
    params[0].grad = torch.randn_like(params[0])
    adam = torch.optim.Adam(params, lr=1e-4, fused=device.type == "cuda")
    rows.append(("Adam step", 28 * params[0].numel() / seconds(adam.step, device, repeats)))
    modelled = None if gpu is None else modelled_bandwidth(gpu)
    return [Row("bandwidth", name, rate / 1e9, modelled, "GB/s") for name, rate in rows]


def _train_step(model: nn.Module, inputs: torch.Tensor, loss: Callable, device: torch.device) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            value = loss(model(inputs))
        value.backward()
        optimizer.step()
    return step


def step_rows(device: torch.device, gpu: catalog.Gpu | None, dry: bool, repeats: int) -> list[Row]:
    """One training step of ResNet-50 (batch 32 of 224x224 images; dry: a one-block-per-stage ResNet, 2 images of
    32x32) and of a 12-layer GPT (:func:`gpt_config`, 8 sequences; dry: 2), autocast to BF16 on a GPU, Adam."""
    batch, size = (2, 32) if dry else (32, 224)
    images, labels = torch.randn(batch, 3, size, size, device=device), torch.randint(0, 1000, (batch,), device=device)
    cnn = (resnet50(blocks=(1, 1, 1, 1)) if dry else resnet50()).to(device)
    cnn_s = seconds(_train_step(cnn, images, lambda out: nn.functional.cross_entropy(out, labels), device), device,
                    repeats)
    config, sequences = gpt_config(dry), 2 if dry else 8
    tokens = torch.randint(0, config.vocab_size, (sequences, config.seq_len), device=device)
    model = gpt.build(config, device=device)
    gpt_s = seconds(_train_step(model, tokens, lambda out: gpt.loss(out, tokens), device), device, repeats)
    modelled = (None, None) if gpu is None else modelled_steps(gpu, batch, config, sequences)
    return [Row("step", f"ResNet-50, batch {batch}, {size}x{size}", cnn_s * 1e3,
                modelled[0] and modelled[0] * 1e3, "ms"),
            Row("step", f"GPT {config.num_layers} layers, h {config.d_model}, {sequences} x {config.seq_len} tokens",
                gpt_s * 1e3, modelled[1] and modelled[1] * 1e3, "ms")]


def markdown(device_name: str, rows: list[Row], dry: bool) -> str:
    """The results file: what ran where, then one table of measured, modelled and their ratio."""
    title = f"# GPU kernels on {device_name} ({datetime.date.today().isoformat()})"
    lines = [title, "", DRY_RUN if dry else "Measured on a GPU; modelled by course.perf for the catalog entry.",
             "", f"Target band for measured / modelled: {BAND[0]}-{BAND[1]}. For a time a ratio above 1 means "
             "slower than modelled; for a rate, faster.", "",
             "| group | what | measured | modelled | measured / modelled | |", "|---|---|---|---|---|---|"]
    for r in rows:
        modelled = "not modelled" if r.modelled is None else f"{r.modelled:.3g} {r.unit}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(f"| {r.group} | {r.what} | {r.measured:.3g} {r.unit} | {modelled} | {ratio} | "
                     f"{verdict(r.ratio)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: checks the code, times nothing")
    parser.add_argument("--out", type=Path, default=None, help="folder for the results file")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    dry = args.dry_run or not torch.cuda.is_available()
    device = torch.device("cpu" if dry else "cuda")
    name = "CPU (dry run)" if dry else torch.cuda.get_device_name(0)
    gpu = None if dry else catalog.match_gpu(name)
    if dry:
        print(DRY_RUN)
    repeats = 1 if dry else args.repeats
    rows = [*matmul_rows(device, gpu, dry, repeats), *bandwidth_rows(device, gpu, dry, repeats),
            *step_rows(device, gpu, dry, repeats)]
    text = markdown(name, rows, dry)
    print(text)
    folder = args.out or (None if dry else ROOT / "benchmarks" / "results")
    if folder is not None:
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
        path = folder / f"gpu-kernels-{slug}-{datetime.date.today().isoformat()}.md"
        path.write_text(text)
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
