"""torch.compile with DDP, run both ways: which module to compile, and what DDPOptimizer does to the graph.

DDP overlaps each bucket's allreduce with the rest of backward because autograd hands it the gradients one by one.
A compiled graph's backward is one autograd node: if the whole model were one graph, every gradient would be ready
only when all of backward had run, and no allreduce could overlap it. Dynamo's DDPOptimizer
(``torch._dynamo.config.optimize_ddp``, on by default) therefore splits the graph at DDP's bucket boundaries, one
subgraph per bucket. Both ways of compiling reach it. ``DDP(torch.compile(model))`` compiles the model DDP wraps.
``torch.compile(DDP(model))`` compiles DDP's forward, and Dynamo stops there on purpose: the part of DDP's forward
that marks "inside DDP" is never traced, and Dynamo compiles the wrapped model's forward as a frame of its own, under
DDPOptimizer. (A model whose forward is torch's own code, such as ``nn.Sequential``, gives that frame nothing to
compile: Dynamo skips torch's files unless it reached them from code it traces. So the model here is a class of ours.)

Compiled autograd is the other way: with ``torch._dynamo.config.optimize_ddp = "python_reducer"`` and compiled
autograd on, DDP hands the gradients to a Python reducer that Dynamo traces into the compiled backward, and inductor
buckets and overlaps the allreduces itself (``torch._inductor.config._fuse_ddp_communication``). It is not run here.

:func:`compile_contrast` runs on each rank (under :func:`course.runtime.launch.launch`) and counts the graphs
the compiler received in three set-ups, with a backend that only counts (no code is generated, so it takes
seconds, not the minutes inductor's C++ compiler takes on a CPU). Taught in
``notebooks/09b_profiling_and_pitfalls.ipynb``.
"""

from __future__ import annotations

import torch
import torch._dynamo
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import world
from course.runtime import observed


class Stack(nn.Module):
    """``layers`` linear layers applied in turn: a forward of ours, which Dynamo compiles under DDP (see the module
    doc)."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, width) -> (B, width)
        for layer in self.layers:
            x = layer(x)
        return x


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    return Stack(layers, width).to(world.current().device)


def _graphs_compiled(how: str, layers: int, width: int, bucket_cap_mb: float, steps: int,
                     group: dist.ProcessGroup) -> tuple[int, int]:
    """(graphs the compiler received, buckets DDP reduced) when training ``steps`` steps compiled ``how``."""
    graphs: list[int] = []

    def counting_backend(graph_module: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(len(graph_module.graph.nodes))
        return graph_module.forward  # run the traced graph as it is: nothing is compiled

    torch._dynamo.reset()
    model = _model(layers, width)
    if how == "compile(DDP(model))":
        ddp = DDP(model, bucket_cap_mb=bucket_cap_mb, process_group=group)
        step = torch.compile(ddp, backend=counting_backend)
    else:
        ddp = DDP(torch.compile(model, backend=counting_backend), bucket_cap_mb=bucket_cap_mb, process_group=group)
        step = ddp
    inputs = torch.randn(8, width, device=world.current().device)
    with torch._dynamo.config.patch(optimize_ddp=how != "DDP(compile(model)), optimize_ddp off"):
        for _ in range(steps):
            step(inputs).sum().backward()
    return len(graphs), ddp._get_ddp_logging_data().get("num_buckets_reduced", 0)


HOW = ("compile(DDP(model))", "DDP(compile(model))", "DDP(compile(model)), optimize_ddp off")


def compile_contrast(layers: int = 6, width: int = 512, bucket_cap_mb: float = 1.0, steps: int = 3
                     ) -> dict[str, tuple[int, int]]:
    """Rank function: for each way in :data:`HOW`, (graphs compiled, buckets DDP reduced).

    Each ``width x width`` fp32 layer holds ``width**2 * 4`` bytes of weights (1 MiB at 512), so with
    ``bucket_cap_mb=1`` DDP puts about one layer per bucket (DDPOptimizer needs the first bucket no larger than
    the others, which DDP's 1 MiB first bucket is).
    """
    # torch's own gloo group: dynamo cannot trace DDP over the course's observed group (course.runtime.observed)
    with observed.unobserved():
        group = dist.new_group(backend="gloo") if world.current().device.type == "cpu" else None
    try:
        return {how: _graphs_compiled(how, layers, width, bucket_cap_mb, steps, group) for how in HOW}
    finally:
        if group is not None:
            dist.destroy_process_group(group)


def describe(counts: dict[str, tuple[int, int]]) -> str:
    """What :func:`compile_contrast`'s counts say, one sentence per way, following the numbers measured."""
    (whole, _), (split, buckets), (off, _) = (counts[how] for how in HOW)
    lines = [f"DDP(compile(model)): {split} graph(s) for {buckets} buckets"
             + (": DDPOptimizer split the model at the bucket boundaries." if split == buckets else ".")]
    if off == 1:
        lines.append("With optimize_ddp off: one graph, so every bucket's gradients are ready only when the whole "
                     "compiled backward has run.")
    if whole == 0:
        lines.append("compile(DDP(model)): no graph. Dynamo stops at DDP's forward by design and compiles the model's "
                     "forward on its own, and this model's forward gave it nothing to compile (torch's own code).")
    else:
        lines.append(f"compile(DDP(model)): {whole} graph(s)"
                     + (", split at the same buckets: Dynamo stops at DDP's forward by design, then compiles the "
                        "model under it with DDPOptimizer." if whole == split == buckets else "."))
    return "\n".join(lines)
