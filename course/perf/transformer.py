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
``ffn``, fewer key/value heads, untied embeddings) are counted from the same parts. Taught in
``notebooks/05c_performance_model.ipynb``.
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

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_width(self) -> float:
        """Width of the keys (and of the values): ``h`` with as many key/value heads as query heads."""
        return self.hidden * (self.kv_heads or self.heads) / self.heads

    def layer_gemms(self, tensor: int = 1) -> tuple[tuple[float, float], ...]:
        """One layer's weight GEMMs on one of ``tensor`` GPUs: ``(weights per token, reduction depth)`` each:
        the QKV projection, the attention's output projection, the MLP's up (and gate) and down projections."""
        h, f, t = self.hidden, self.ffn_width, tensor
        up = (2 if self.gated else 1) * f
        return ((h * (h + 2 * self.kv_width) / t, h), (h * h / t, h / t), (h * up / t, h), (f * h / t, f / t))

    @property
    def layer_params(self) -> float:
        return sum(weights for weights, _ in self.layer_gemms())

    @property
    def params(self) -> float:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2) + (self.seq * self.hidden * self.positions)
        return self.layers * self.layer_params + embeddings

    def forward_flops(self, batch_size: int) -> dict[str, float]:
        """Forward FLOPs of ``batch_size`` sequences by part: ``{"layers", "attention", "logits"}`` (``"layers"``
        holds the weight GEMMs; ``"attention"`` the two attention GEMMs of every layer)."""
        tokens = batch_size * self.seq
        return {"layers": 2.0 * tokens * self.layers * self.layer_params,
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
