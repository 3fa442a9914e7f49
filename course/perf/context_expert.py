"""Context and expert parallelism in the performance model: memory per GPU and communication per step, modelled
for real GPUs (never measured here), with the published configurations that use them.

* **Context parallelism (CP)**: activations per GPU from Korthikanti et al. 2022 (arXiv:2205.05198, eq. 2),
  ``s·b·h·(34 + 5·a·s/h)`` bytes per layer in 16-bit, the ``5·a·s/h`` term being the ``S x S`` scores that
  FlashAttention never stores. Tensor parallelism with sequence parallelism divides it by ``t``; CP divides ``s``.
  A ring step hides its transfer when one block pair's attention takes longer than sending one ``k, v`` block:
  :func:`ring_step` compares the two, the GEMM efficiency taken from ``perf.microbench`` (depth = head dimension).
* **Expert parallelism (EP)**: each token's hidden vector goes to ``k`` experts and comes back, forward and
  backward: :func:`ep_bytes_per_token`. Over NVLink this costs less than the experts' own compute; over
  InfiniBand, about as much or more: :func:`ep_layer`. That is why EP groups stay inside a node, or (DeepSeek-V3)
  route each token to few nodes.
:data:`RECORDS` are published configurations, with their sources, for the validation table
(``perf.published``; each ``row`` has that table's fields). Taught in
``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course.perf import catalog, microbench

LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models, arXiv:2407.21783, Tables 3-4 and section 3.3.2"
DEEPSEEK_V3 = ("DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437, Table 1 (2,664K H800 GPU hours of "
               "pre-training on 14.8T tokens), sections 3.1, 3.2.1 (PP 16, EP 64 over 8 nodes, ZeRO-1; cross-node EP "
               "'approximately 1:1'), 3.2.2 (NVLink 160 GB/s, IB 50 GB/s, 3.2 experts per node, at most 4 nodes); "
               "shapes from its config (61 layers, 3 dense, 256 routed experts of 2048, 1 shared, 8 per token); FP8 "
               "dispatch and BF16 combine also in the DeepEP README (https://github.com/deepseek-ai/DeepEP)")
MIXTRAL = ("Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088, Table 1 (shapes); Mistral AI 2023, 'Mixtral of "
           "experts' (https://mistral.ai/news/mixtral-of-experts): 46.7B parameters, 12.9B per token")
KORTHIKANTI = "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, arXiv:2205.05198"


def activation_bytes_per_layer(seq_len: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                               context_parallel: int = 1, flash: bool = True) -> float:
    """Bytes one transformer layer keeps for backward on one GPU, 16-bit activations (Korthikanti eq. 2, with
    sequence parallelism: everything divided by ``t``); ``flash`` drops the ``S x S`` term."""
    s = seq_len / context_parallel
    scores = 0.0 if flash else 5 * heads * seq_len / hidden  # each rank's rows against every key
    return s * batch * hidden * (34 + scores) / tensor_parallel


def ring_bytes_per_layer(seq_len: int, batch: int, kv_heads: int, head_dim: int, context_parallel: int,
                         element_size: int = 2) -> dict[str, float]:
    """Bytes one GPU sends per layer in ring attention: forward ``(n-1)`` ``k, v`` blocks; backward ``(n-1)``
    again (recomputed, not kept) and ``n`` blocks of ``dk, dv``."""
    n = context_parallel
    block = 2 * batch * (seq_len / n) * kv_heads * head_dim * element_size  # k and v of one rank
    return {"forward": (n - 1) * block, "backward": (2 * n - 1) * block}


@dataclass(frozen=True)
class RingStep:
    """One ring step on one GPU, modelled: the attention of one block pair against sending the next block."""

    compute_s: float
    transfer_s: float

    @property
    def hidden(self) -> bool:
        """True when the transfer fits behind the compute (overlap hides it)."""
        return self.transfer_s <= self.compute_s


def ring_step(gpu: catalog.Gpu, link: catalog.Link, seq_len: int, batch: int, heads: int, kv_heads: int,
              head_dim: int, context_parallel: int) -> RingStep:
    """One forward ring step of a full (not causal-skipped) block pair: ``4·b·L²·H·D`` FLOPs at the GPU's BF16
    peak times the fitted GEMM efficiency for depth ``head_dim``; ``2·b·L·Hkv·D`` 16-bit numbers over ``link``
    at its fitted transport efficiency. ``L = seq_len / context_parallel``."""
    length = seq_len / context_parallel
    flops = 4 * batch * length * length * heads * head_dim
    rate = gpu.peak_flops("bf16") * microbench.gemm_efficiency("bf16", gpu.generation, head_dim)
    sent = 2 * batch * length * kv_heads * head_dim * 2
    return RingStep(flops / rate, sent / (link.bandwidth * microbench.constant(f"efficiency.{link.transport}")))


def ep_bytes_per_token(hidden: int, k: int, expert_parallel: int, dispatch_size: float = 2,
                       combine_size: float = 2, copies: float | None = None) -> float:
    """Bytes one token's hidden vector crosses the network per MoE layer and training step: dispatch and combine
    forward, their gradients backward.

    Args:
        copies: how many copies of the token leave the GPU; default ``k·(ep-1)/ep`` (even routing). DeepSeek-V3
            sends a token once per destination node, to at most 4 nodes: ``copies=4`` over InfiniBand.
        dispatch_size: bytes per number sent out (1 for FP8, as DeepSeek-V3 does); combine_size: back.
    """
    leaving = k * (expert_parallel - 1) / expert_parallel if copies is None else copies
    return 2 * leaving * hidden * (dispatch_size + combine_size)


def expert_flops_per_token(hidden: int, expert_hidden: int, k: int, matrices: int = 3) -> float:
    """FLOPs of a token's ``k`` experts, forward and backward (x3): ``2·matrices·h·h_e`` each (SwiGLU: 3)."""
    return 3 * k * 2 * matrices * hidden * expert_hidden


@dataclass(frozen=True)
class ExpertLayer:
    """Per token and MoE layer on one GPU, modelled: the experts' compute against the all-to-all traffic."""

    compute_s: float
    communicate_s: float

    @property
    def ratio(self) -> float:
        """Computation over communication: below 1, the all-to-all cannot hide behind the experts."""
        return self.compute_s / self.communicate_s


def ep_layer(gpu: catalog.Gpu, bandwidth: float, hidden: int, expert_hidden: int, k: int, expert_parallel: int,
             dispatch_size: float = 2, combine_size: float = 2, copies: float | None = None) -> ExpertLayer:
    """Per token: experts at the GPU's BF16 peak times the fitted large-GEMM efficiency, against
    :func:`ep_bytes_per_token` at ``bandwidth`` bytes/s (a link's rate, or a published measured one)."""
    rate = gpu.peak_flops("bf16") * microbench.matmul_efficiency("bf16", gpu.generation)
    sent = ep_bytes_per_token(hidden, k, expert_parallel, dispatch_size, combine_size, copies)
    return ExpertLayer(expert_flops_per_token(hidden, expert_hidden, k) / rate, sent / bandwidth)


def expert_parameter_bytes(layers: int, experts: int, hidden: int, expert_hidden: int, expert_parallel: int,
                           bytes_per_parameter: float = 2, matrices: int = 3) -> float:
    """Bytes of expert weights one GPU holds: ``E / ep`` experts of every MoE layer."""
    return layers * experts / expert_parallel * matrices * hidden * expert_hidden * bytes_per_parameter


@dataclass(frozen=True)
class Record:
    """A published training configuration that uses CP or EP, as its source states it."""

    name: str
    source: str
    setup: dict                      # what the source states (GPUs, parallel sizes, shapes)
    figures: dict = field(default_factory=dict)  # published results, with units in the key
    unpublished: str = ""            # what the source leaves open


#: Checked against the sources on 2026-11-29 (each number in their text; the search notes are in the commit).
RECORDS = (
    Record("Llama 3 405B, 128K-token pre-training stage", LLAMA3,
           {"gpus": 16_384, "gpu": "H100 SXM5", "tensor_parallel": 8, "context_parallel": 16, "pipeline_parallel": 16,
            "data_parallel": 8, "seq_len": 131_072, "sequences_per_dp_rank": 16, "layers": 126, "hidden": 16_384,
            "heads": 128, "kv_heads": 8, "head_dim": 128,
            "cp_scheme": "all-gather of k, v; 2·CP chunks, rank i holding chunks i and 2·CP-1-i"},
           {"tokens_per_batch": 16_777_216, "tflops_per_gpu": 380, "mfu": 0.38,
            "mfu_at_8k_on_16384_gpus_cp1": 0.41},
           "Table 4 prints DP 4 for this row (arXiv text); its 16,384 GPUs (8 x 16 x 16 x 8) and 16M tokens per "
           "batch (8 x 16 x 131,072) both give DP 8, used here. '16M' tokens: taken as 2^24"),
    Record("DeepSeek-V3 (671B, 37B active)", DEEPSEEK_V3,
           {"gpus": 2048, "gpu": "H800", "pipeline_parallel": 16, "expert_parallel": 64, "ep_nodes": 8,
            "tensor_parallel": 1, "data_parallel": "ZeRO-1", "layers": 61, "dense_layers": 3, "hidden": 7168,
            "routed_experts": 256, "shared_experts": 1, "k": 8, "expert_hidden": 2048, "max_nodes_per_token": 4,
            "dispatch": "FP8", "combine": "BF16", "nvlink_gb_s": 160, "infiniband_gb_s": 50},
           {"compute_to_communication_cross_node": 1.0, "experts_per_node_free": 3.2,
            "h800_gpu_hours_per_trillion_tokens": 180_000, "pretraining_h800_gpu_hours": 2_664_000,
            "pretraining_tokens": 14.8e12},
           "the micro-batch and sequences per GPU are not stated per stage; attention is MLA (not modelled here); "
           "the 1:1 ratio is stated for the whole cross-node EP step, not per token"),
    Record("Mixtral 8x7B", MIXTRAL,
           {"experts": 8, "k": 2, "layers": 32, "hidden": 4096, "expert_hidden": 14_336, "heads": 32, "kv_heads": 8,
            "context": 32_768},
           {"parameters_total": 46.7e9, "parameters_active": 12.9e9},
           "training hardware and parallel layout are not published"),
)


def record(name: str) -> Record:
    """The record whose name starts with ``name``; raises ValueError listing them."""
    for entry in RECORDS:
        if entry.name.startswith(name):
            return entry
    raise ValueError(f"no record named {name!r}; records: {[r.name for r in RECORDS]}")


def rows() -> list[dict]:
    """The records as rows of the validation table (``perf.published.Row`` fields), modelled with defaults only."""
    llama, deepseek = record("Llama 3").setup, record("DeepSeek-V3").setup
    dp = llama["gpus"] // (llama["tensor_parallel"] * llama["context_parallel"] * llama["pipeline_parallel"])
    tokens = dp * llama["sequences_per_dp_rank"] * llama["seq_len"]
    v3 = ep_layer(catalog.gpu("H100 SXM5"), deepseek["infiniband_gb_s"] * 1e9, deepseek["hidden"],
                  deepseek["expert_hidden"], deepseek["k"], deepseek["expert_parallel"], 1, 2,
                  deepseek["max_nodes_per_token"])
    return [
        {"kind": "arithmetic", "claim": "Llama 3 405B at 128K, CP=16: tokens per batch (DP x sequences x S)",
         "source": LLAMA3, "published": 16_777_216.0, "modelled": float(tokens), "unit": "tokens",
         "assumed": "DP = 16,384 GPUs / (TP 8 x CP 16 x PP 16) = 8 (Table 4 prints 4); '16M' read as 2^24"},
        {"kind": "arithmetic", "claim": "DeepSeek-V3: experts per node a token can reach at no extra IB cost",
         "source": DEEPSEEK_V3, "published": 3.2,
         "modelled": deepseek["nvlink_gb_s"] / deepseek["infiniband_gb_s"], "unit": "experts",
         "assumed": "the source's own per-GPU rates, 160 GB/s NVLink over 50 GB/s InfiniBand"},
        {"kind": "prediction", "claim": "DeepSeek-V3: computation to communication of cross-node EP",
         "source": DEEPSEEK_V3, "published": 1.0, "modelled": v3.ratio, "unit": "ratio",
         "assumed": "H800 compute taken as the catalog's H100 SXM5 in BF16 (the paper runs experts in FP8); "
                    "the experts' compute only (no attention); each token to 4 other nodes over one 50 GB/s IB "
                    "adapter per GPU"},
    ]
