"""A decoder-only transformer as the performance model counts it: its parameters, its GEMMs and its FLOPs.

Two FLOP counts, as the PaLM paper (Chowdhery et al. 2022, appendix B) defines them:

* **model FLOPs** (what MFU divides by the peak): one forward and one backward of the model, ``3 x`` the forward,
  whatever the software recomputes;
* **hardware FLOPs** (what HFU divides by the peak): the FLOPs the GPUs actually run, recomputation included: a
  whole extra forward of every layer with ``"full"`` recomputation, the attention core's with ``"selective"``
  (Korthikanti et al. 2022).

The forward of one sequence of ``s`` tokens: every layer's weight GEMMs (``2·s`` FLOPs per weight), the
attention's two batched GEMMs (``4·s²·h``, causal masking not subtracted, as Megatron-LM counts it) and the logits
(``2·s·h·V``). For a GPT with a ``4h`` MLP this is Megatron-LM's count: hardware FLOPs with full recomputation are
``96·B·s·l·h²·(1 + s/6h + V/16lh)`` (Narayanan et al. 2021, equation 3). Llama-style models (a gated MLP of width
``ffn``, fewer key/value heads, untied embeddings) are counted from the same parts. A mixture of experts
(``experts > 0``) replaces each layer's MLP by ``experts`` MLPs of width ``expert_ffn`` and a router: a token
runs through ``top_k`` of them (plus ``shared_experts`` every token uses), so its FLOPs count the active experts
and its parameters count them all (Fedus et al. 2021, Switch Transformer, section 2). Taught in
``notebooks/05c_performance_model.ipynb``; experts in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.arguments import check_choice

RECOMPUTE = ("full", "selective", "none")


@dataclass(frozen=True)
class Transformer:
    """A decoder: the sizes its FLOPs, parameters and activations follow from.

    Attributes:
        name: e.g. ``"GPT-3 175B"``.
        layers, hidden, heads: ``l``, ``h`` and the attention heads ``a``.
        seq: tokens per sequence ``s``.
        vocab: vocabulary ``V``.
        ffn: the MLP's inner width; 0 for GPT's ``4·h``.
        gated: a gated MLP (SwiGLU: three weight matrices instead of two).
        kv_heads: key/value heads (grouped-query attention); 0 for as many as ``heads``.
        tied: the output layer shares the input embedding's weights.
        positions: learned position embeddings (``s·h`` parameters); False for rotary or ALiBi.
        experts: routed experts per layer (a mixture of experts); 0 for a dense MLP.
        top_k: routed experts each token runs through.
        expert_ffn: each expert's MLP width (gated like the dense one when ``gated``).
        shared_experts: experts of width ``expert_ffn`` every token runs through (DeepSeek-V3: 1).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200
    ffn: int = 0
    gated: bool = False
    kv_heads: int = 0
    tied: bool = True
    positions: bool = True
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_width(self) -> float:
        """Width of the keys (and of the values): ``h`` with as many key/value heads as query heads."""
        return self.hidden * (self.kv_heads or self.heads) / self.heads

    @property
    def moe(self) -> bool:
        """True for a mixture of experts (``experts > 0``)."""
        return self.experts > 0

    @property
    def active_ffn(self) -> int:
        """The MLP width one token runs through: ``ffn_width``, or ``(top_k + shared)·expert_ffn`` with experts."""
        return (self.top_k + self.shared_experts) * self.expert_ffn if self.moe else self.ffn_width

    def _mlp_weights(self, width: float) -> float:
        """Weights of one MLP of ``width``: up (and gate) and down projections."""
        return self.hidden * width * (3 if self.gated else 2)

    def layer_gemms(self, tensor: int = 1) -> tuple[tuple[float, ...], ...]:
        """One layer's weight GEMMs on one of ``tensor`` GPUs, as one token sees them: ``(weights per token,
        reduction depth)`` each: the QKV projection, the attention's output projection, the MLP's up (and gate)
        and down projections (with experts: the ``top_k + shared`` active ones, and the router)."""
        h, t = self.hidden, tensor
        f = self.expert_ffn if self.moe else self.ffn_width
        active = self.active_ffn
        up = (2 if self.gated else 1) * active
        gemms = ((h * (h + 2 * self.kv_width) / t, h), (h * h / t, h / t), (h * up / t, h), (active * h / t, f / t))
        return gemms + (((h * self.experts, h),) if self.moe else ())

    @property
    def layer_params(self) -> float:
        """One layer's parameters: every expert counts (not only the active ones)."""
        if not self.moe:
            return sum(weights for weights, _ in self.layer_gemms())
        attention = sum(weights for weights, _ in self.layer_gemms()[:2])
        experts = (self.experts + self.shared_experts) * self._mlp_weights(self.expert_ffn)
        return attention + experts + self.hidden * self.experts

    @property
    def active_layer_params(self) -> float:
        """One layer's parameters one token uses (what its FLOPs count): all of them for a dense layer."""
        return sum(weights for weights, _ in self.layer_gemms())

    @property
    def expert_params(self) -> float:
        """Parameters of the routed experts, all layers: what expert parallelism splits (0 for a dense model)."""
        return self.layers * self.experts * self._mlp_weights(self.expert_ffn)

    @property
    def params(self) -> float:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2) + (self.seq * self.hidden * self.positions)
        return self.layers * self.layer_params + embeddings

    def forward_flops(self, batch_size: int) -> dict[str, float]:
        """Forward FLOPs of ``batch_size`` sequences by part: ``{"layers", "attention", "logits"}`` (``"layers"``
        holds the weight GEMMs; ``"attention"`` the two attention GEMMs of every layer)."""
        tokens = batch_size * self.seq
        return {"layers": 2.0 * tokens * self.layers * self.active_layer_params,
                "attention": 4.0 * tokens * self.seq * self.hidden * self.layers,
                "logits": 2.0 * tokens * self.hidden * self.vocab}

    def model_flops(self, batch_size: int) -> float:
        """FLOPs of one step that MFU counts: forward and backward, ``3 x`` the forward, no recomputation."""
        return 3 * sum(self.forward_flops(batch_size).values())

    def hardware_flops(self, batch_size: int, recompute: str = "full") -> float:
        """FLOPs one step runs, recomputation included (HFU's count): a full recomputation adds every layer's
        forward again, a selective one the attention core's; the logits are never recomputed."""
        check_choice("recompute", recompute, RECOMPUTE)
        parts = self.forward_flops(batch_size)
        again = {"full": parts["layers"] + parts["attention"], "selective": parts["attention"], "none": 0.0}
        return self.model_flops(batch_size) + again[recompute]

    def megatron_flops(self, batch_size: int, recompute: str = "full") -> float:
        """Hardware FLOPs as Megatron-LM's papers report TFLOP/s (:meth:`hardware_flops`; kept under its old
        name for the notebooks)."""
        return self.hardware_flops(batch_size, recompute)
