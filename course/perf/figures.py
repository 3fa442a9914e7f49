"""Published training figures of large transformers, each with its source and its setup, split into a fitting set
and a test set by a rule fixed before any constant was chosen.

A :class:`TrainingFigure` is one number a paper or a framework's page reports (tokens per second per GPU, a step
time, TFLOP/s per GPU or MFU), with the run's setup as its source states it: GPU, count, network, model sizes,
tensor x context x pipeline x data (x expert) parallelism, micro-batch, global batch, sequence length, precision,
recomputation and ZeRO/FSDP stage. What the source leaves open is named in ``assumed``; a figure the source gives
loosely says so in ``note``.

**The split rule** (:func:`split_of`): a source goes to the test set when the first byte of the SHA-256 of its
key is odd, to the fitting set otherwise. A source's figures all land on one side, so no constant can be fitted to
one row of a table and scored on its neighbour. A hash, not an order: adding a source later moves no other.
Each record carries its ``split``; ``tests/perf/test_figures.py`` checks that every one equals the rule. The split
was written into this file, and committed, before any constant of :mod:`course.perf.protocol` was fitted.
Edits since, each before the test set was first scored: two assumptions of fitting-set figures (LLaMA 65B's
sharding, torchtitan's 'selective op' checkpointing) and one setup error of a test figure (BLOOM's 70 layers on
12 stages). Later, a setup fact its source code or paper states, tagged on every fitting-set source it applies
to (FP32 gradient reduction: Megatron-LM with bf16, torchtitan, Llama 3; Llama 3's gradients accumulated over
the micro-batches and reduced once per step, its 8K-token runs without recomputation, and its V = 8 chunks per
GPU, derived from its pipeline's layout, section 3.3.2); the test set's sources (BLOOM's
Megatron-DeepSpeed, LLM Foundry, OPT's metaseq) were not re-read for it and keep 16-bit reductions.

Everything here is published, not measured or modelled. :mod:`course.perf.protocol` models each figure and scores
the two sets. Taught in ``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from course.perf.transformer import Transformer

METRICS = ("tokens_per_gpu_s", "step_s", "tflops_hardware", "tflops_model", "mfu")
SPLITS = ("fit", "test")


@dataclass(frozen=True)
class Source:
    """Where figures are published: ``key`` (the unit of the split), the year, and the citation."""

    key: str
    year: int
    citation: str


@dataclass(frozen=True)
class TrainingFigure:
    """One published training figure and the setup of its run (module docstring).

    ``metric`` is one of :data:`METRICS`: ``tflops_hardware`` counts recomputation (Megatron-LM's papers, HFU),
    ``tflops_model`` and ``mfu`` do not (PaLM's MFU). ``context`` and ``expert`` are the context- and
    expert-parallel sizes (1: none). ``network`` is a :mod:`course.perf.catalog` link (with ``transport`` to use
    it through another one, e.g. ``"roce"``), ``nics`` the adapters per node. ``options`` are
    :class:`course.perf.parallel.Plan` switches the source describes (fused attention, overlap).
    """

    source: str
    where: str            # table, figure or page of the source
    model: Transformer
    gpu: str
    gpus: int
    metric: str
    value: float
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    expert: int = 1
    microbatch: int = 1
    global_batch: int = 0  # sequences per step
    precision: str = "bf16"
    recompute: str = "full"
    sharding: str = "ddp"
    interleave: int = 1
    stage_layers: tuple[int, ...] = ()  # layers of each pipeline stage, when uneven
    network: str = "InfiniBand HDR"
    transport: str = ""
    nics: int = 8
    gpus_per_node: int = 8
    options: tuple[tuple[str, bool], ...] = ()
    assumed: str = ""
    note: str = ""
    split: str = ""

    @property
    def data(self) -> int:
        """Data-parallel size: the GPUs over ``tensor x context x pipeline``."""
        return self.gpus // (self.tensor * self.context * self.pipeline)

    @property
    def label(self) -> str:
        split = f"TP{self.tensor} PP{self.pipeline}" + (f" CP{self.context}" if self.context > 1 else "")
        return f"{self.model.name} on {self.gpus} {self.gpu.split()[0]}, {split} {self.sharding} ({self.where})"


SOURCES: tuple[Source, ...] = (
    Source("shoeybi2019", 2019, "Shoeybi et al. 2019, Megatron-LM: Training Multi-Billion Parameter Language Models "
           "Using Model Parallelism, arXiv:1909.08053, section 5.1 and figure 1"),
    Source("narayanan2021", 2021, "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU "
           "Clusters Using Megatron-LM, arXiv:2104.04473, Table 1 (also the Megatron-LM README of 2021-2023)"),
    Source("bloom2022", 2022, "BigScience 2022, BLOOM: A 176B-Parameter Open-Access Multilingual Language Model, "
           "arXiv:2211.05100, section 3.4 (156 TFLOP/s in the fastest configuration)"),
    Source("korthikanti2022", 2022, "Korthikanti et al. 2022, Reducing Activation Recomputation in Large "
           "Transformer Models, arXiv:2205.05198, Tables 3 and 5; MFU also in the Megatron-LM README (2022-2023)"),
    Source("mtnlg2022", 2022, "Smith et al. 2022, Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B, "
           "arXiv:2201.11990, section 2.4 (iteration time on 280, 350, 420 DGX A100)"),
    Source("opt2022", 2022, "Zhang et al. 2022, OPT: Open Pre-trained Transformer Language Models, "
           "arXiv:2205.01068, section 2.4 (147 TFLOP/s per GPU on 992 A100 80GB)"),
    Source("llama1-2023", 2023, "Touvron et al. 2023, LLaMA: Open and Efficient Foundation Language Models, "
           "arXiv:2302.13971, section 2.4 (65B: about 380 tokens/s/GPU on 2048 A100 80GB)"),
    Source("llmfoundry2023", 2023, "MosaicML LLM Foundry, scripts/train/benchmarking/README.md, tables 'H100 80GB "
           "BF16' and 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)' "
           "(https://github.com/mosaicml/llm-foundry)"),
    Source("llama3-2024", 2024, "Llama Team 2024, The Llama 3 Herd of Models, arXiv:2407.21783, Table 4"),
    Source("torchtitan2024", 2024, "PyTorch torchtitan, docs/performance.md: Llama 3 and Llama 2 with FSDP2 on 64 "
           "A100 80GB (https://github.com/pytorch/torchtitan)"),
    Source("megatron-h100-2025", 2025, "NVIDIA Megatron-LM README, 'Performance Benchmarking', strong scaling of "
           "GPT-3 175B on H100 (https://github.com/NVIDIA/Megatron-LM)"),
)


def split_of(source: str) -> str:
    """The set a source's figures belong to: ``"test"`` when the first byte of SHA-256 of its key is odd.

    Raises:
        KeyError: a source not in :data:`SOURCES`.
    """
    keys = [s.key for s in SOURCES]
    if source not in keys:
        raise KeyError(f"no source {source!r}; known: {keys}.")
    return SPLITS[hashlib.sha256(source.encode()).digest()[0] % 2]


# ---- the models, as their papers and configuration files size them ---------------------------------------------

def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> Transformer:
    return Transformer(name, layers, hidden, heads, seq, vocab)


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int, kv_heads: int, seq: int, vocab: int
           ) -> Transformer:
    """A Llama: SwiGLU MLP of width ``ffn``, grouped-query attention, untied embeddings, rotary positions."""
    return Transformer(name, layers, hidden, heads, seq, vocab, ffn, True, kv_heads, False, False)


#: MPT sizes (LLM Foundry's yamls: d_model, n_heads, n_layers; vocabulary 50368, tied, 4h MLP); its benchmark
#: configurations learn position embeddings (the README's NumParams grow by seq x d_model with the sequence).
_MPT = {name: _gpt(f"MPT {name}", layers, hidden, heads, 2048, 50368) for name, layers, hidden, heads in (
    ("125m", 12, 768, 12), ("350m", 24, 1024, 16), ("760m", 24, 1536, 12), ("1b", 24, 2048, 16),
    ("3b", 32, 2560, 20), ("7b", 32, 4096, 32), ("13b", 40, 5120, 40), ("30b", 48, 7168, 56), ("70b", 80, 8192, 64))}

#: Megatron-LM in 2019-2022, as its papers describe it: no fused (flash) attention kernel, no overlap of the
#: data- or tensor-parallel collectives with compute.
_MEGATRON_2021 = (("fused_attention", False), ("dp_overlap", False), ("tp_overlap", False))
#: Megatron-LM with bf16 accumulates and reduces the gradients in FP32 (megatron/training/arguments.py); so do
#: torchtitan (``mixed_precision_reduce = "float32"``, its default) and Llama 3 (section 3.3.2).
_FP32_GRADS = ("fp32_grad_reduce", True)
_SELENE = "DGX A100 80GB on Selene: 8 HDR InfiniBand adapters per node (Narayanan et al. 2021, section 5)"


def _narayanan() -> list[TrainingFigure]:
    rows = (("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137.0), ("3.6B", 30, 3072, 32, 2, 1, 64, 512, 138.0),
            ("7.5B", 36, 4096, 32, 4, 1, 128, 512, 142.0), ("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135.0),
            ("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138.0), ("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140.0),
            ("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148.0), ("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155.0),
            ("529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 163.0), ("1T", 128, 25600, 160, 8, 64, 3072, 3072, 163.0))
    return [TrainingFigure("narayanan2021", "Table 1", _gpt(f"GPT {name}", layers, hidden, heads), "A100 SXM4 80GB",
                           gpus, "tflops_hardware", tflops, tensor=t, pipeline=p, global_batch=batch, precision="fp16",
                           options=_MEGATRON_2021, assumed=f"micro-batch 1, plain 1F1B; {_SELENE}")
            for name, layers, hidden, heads, t, p, gpus, batch, tflops in rows]


def _korthikanti() -> list[TrainingFigure]:
    rows = (("22B", 48, 6144, 64, 1, 8, 4, 4, 0.415), ("175B", 96, 12288, 96, 8, 64, 64, 1, 0.514),
            ("530B", 105, 20480, 128, 35, 280, 280, 1, 0.560), ("1T", 128, 25600, 160, 64, 512, 512, 1, 0.563))
    return [TrainingFigure("korthikanti2022", "Table 5 (MFU), Table 3 (setup)", _gpt(f"GPT {name}", layers, hidden,
                                                                                     heads),
                           "A100 SXM4 80GB", gpus, "mfu", mfu, tensor=8, pipeline=p, microbatch=mb, global_batch=batch,
                           recompute="selective", options=(*_MEGATRON_2021, _FP32_GRADS),
                           assumed=f"sequence parallelism priced as tensor parallelism; {_SELENE}",
                           note="global and micro-batch sizes of Table 3 as remembered, not re-checked")
            for name, layers, hidden, heads, p, gpus, batch, mb, mfu in rows]


def _mtnlg() -> list[TrainingFigure]:
    model = _gpt("MT-NLG 530B", 105, 20480, 128)
    return [TrainingFigure("mtnlg2022", "section 2.4", model, "A100 SXM4 80GB", gpus, "step_s", seconds, tensor=8,
                           pipeline=35, global_batch=1920, sharding="zero1", options=_MEGATRON_2021,
                           assumed=f"micro-batch 1, full recomputation, ZeRO-1 (DeepSpeed); {_SELENE}")
            for gpus, seconds in ((2240, 60.1), (2800, 50.2), (3360, 44.4))]


def _singles() -> list[TrainingFigure]:
    """Sources with one or two figures each."""
    return [
        TrainingFigure("shoeybi2019", "abstract and section 5.1: 15.1 PFLOP/s on 512 V100", _gpt(
            "GPT-2 8.3B", 72, 3072, 32, 1024), "V100 SXM3 (DGX-2H)", 512, "tflops_hardware", 15.1e3 / 512,
            tensor=8, microbatch=8, global_batch=512, precision="fp16", options=_MEGATRON_2021,
            network="InfiniBand EDR", gpus_per_node=16,
            assumed="micro-batch 8 per model-parallel group (global 512); DGX-2H: 16 GPUs, 8 EDR adapters per node",
            note="the paper does not say whether its FLOP count includes recomputation; counted here as Megatron-LM "
                 "later did (with it)"),
        TrainingFigure("bloom2022", "section 3.4", Transformer("BLOOM 176B", 70, 14336, 112, 2048, 250880,
                                                                positions=False),
                       "A100 SXM4 80GB", 384, "tflops_hardware", 156.0, tensor=4, pipeline=12, microbatch=2,
                       global_batch=2048, sharding="zero1", options=_MEGATRON_2021, network="InfiniBand EDR", nics=4,
                       stage_layers=(5, *(6,) * 10, 5),
                       assumed="Jean Zay's 4 Omni-Path 100 Gb/s adapters per node priced as EDR InfiniBand; full "
                               "recomputation; the first and last stages hold 5 layers (they also hold the "
                               "embeddings), the others 6",
                       note="156 TFLOP/s is the fastest configuration the paper reports, not the run's average"),
        TrainingFigure("opt2022", "section 2.4", _gpt("OPT-175B", 96, 12288, 96, 2048, 50272), "A100 SXM4 80GB",
                       992, "tflops_hardware", 147.0, tensor=8, microbatch=8, global_batch=992, precision="fp16",
                       sharding="fsdp", options=(("fused_attention", False),),
                       assumed="8 sequences per replica (the paper: about 2M tokens per step); FSDP x Megatron TP 8; "
                               "Azure NDm A100 v4 nodes with 8 HDR adapters",
                       note="'up to 147 TFLOP/s per GPU'; the FLOP convention is not stated"),
        TrainingFigure("llama1-2023", "section 2.4", _llama("LLaMA 65B", 80, 8192, 64, 22016, 64, 2048, 32000),
                       "A100 SXM4 80GB", 2048, "tokens_per_gpu_s", 380.0, tensor=8, global_batch=2048,
                       recompute="selective", sharding="zero1",
                       assumed="tensor parallelism 8 and the optimizer state sharded over the data-parallel GPUs "
                               "(the paper names all-reduces; 65B / 8 fits that way), micro-batch 1; 8 HDR adapters "
                               "per node (Meta's RSC)",
                       note="'around 380 tokens/sec/GPU'"),
    ]


def _llmfoundry() -> list[TrainingFigure]:
    """Every row of the two tables with sequence length 2048 on 8 or 64 GPUs (the other sources' sequence)."""
    h100 = (("70b", 64, 8, 2048, True, 1039), ("30b", 8, 3, 504, True, 2002), ("13b", 64, 2, 128, False, 4800),
            ("13b", 8, 2, 16, False, 4792), ("7b", 8, 6, 48, False, 10643), ("3b", 64, 6, 1152, False, 22525),
            ("1b", 64, 20, 1280, False, 44402), ("1b", 8, 14, 112, False, 45455), ("760m", 8, 24, 384, False, 63147))
    a100 = (("70b", 64, 8, 2048, True, 410), ("30b", 8, 3, 504, True, 916), ("13b", 8, 2, 48, False, 2262),
            ("7b", 8, 6, 96, False, 4641), ("3b", 8, 10, 160, False, 10811), ("1b", 8, 14, 448, False, 20513),
            ("760m", 8, 24, 384, False, 32434), ("350m", 8, 32, 512, False, 58782),
            ("125m", 8, 40, 640, False, 142830), ("125m", 8, 32, 512, False, 141737))
    figures = []
    for gpu, table, rows, network, transport in (
            ("H100 SXM5", "table 'H100 80GB BF16'", h100, "InfiniBand NDR", ""),
            ("A100 SXM4 80GB", "table 'A100 80GB, 1600 Gbps RoCE'", a100, "200GbE", "roce")):
        for name, gpus, mb, batch, checkpointing, tokens in rows:
            figures.append(TrainingFigure(
                "llmfoundry2023", table, _MPT[name], gpu, gpus, "tokens_per_gpu_s", float(tokens), microbatch=mb,
                global_batch=batch, recompute="full" if checkpointing else "none", sharding="fsdp",
                network=network, transport=transport,
                assumed="SXM parts; FlashAttention; " + ("8 NDR adapters per H100 node" if gpu.startswith("H")
                                                         else "8 x 200 Gb/s RoCE per node (the table's 1600 Gbps)")))
    return figures


def _recent() -> list[TrainingFigure]:
    """Llama 3 (4D parallelism on H100), torchtitan (FSDP2 on A100) and Megatron-LM on H100."""
    l405 = _llama("Llama 3 405B", 126, 16384, 128, 53248, 8, 8192, 128256)
    roce = {"network": "400GbE", "transport": "roce", "sharding": "fsdp",
            "options": (("reshard_after_forward", False), _FP32_GRADS, ("accumulate_grads", True))}
    # section 3.3.2: "we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing"; the
    # 131k-token run's checkpointing is not stated (selective assumed)
    # V is derived, not stated: "the first model chunk on the first stage has only the embedding, and the last
    # model chunk on the last stage has only output projection and loss", with one layer fewer on those two
    # stages: 16·V chunks of L layers, two of them empty, hold 126 layers only for V = 8, L = 1 (V > 1)
    llama3 = "stages of 7 and 8 layers, interleaved with V = 8 one-layer chunks (derived from section 3.3.2)"
    figures = [TrainingFigure("llama3-2024", "Table 4", model, "H100 SXM5", gpus, "tflops_model", tflops, tensor=8,
                              pipeline=16, context=cp, global_batch=gpus // (128 * cp) * per_dp, interleave=8,
                              stage_layers=(7, *(8,) * 14, 7), recompute="none" if cp == 1 else "selective",
                              assumed=f"{llama3}; 400 Gb/s RoCE per GPU" + ("" if cp == 1 else
                                                                           "; selective recomputation"), **roce)
               for model, gpus, cp, per_dp, tflops in (
                   (l405, 8192, 1, 32, 430.0), (l405, 16384, 1, 16, 400.0),
                   (_llama("Llama 3 405B, 131k context", 126, 16384, 128, 53248, 8, 131072, 128256), 16384, 16, 16,
                    380.0))]
    l3_8b, l3_70b = (_llama(f"Llama 3 {n}", layers, h, heads, f, 8, 8192, 128256)
                     for n, layers, h, heads, f in (("8B", 32, 4096, 32, 14336), ("70B", 80, 8192, 64, 28672)))
    l2_13b = _llama("Llama 2 13B", 40, 5120, 40, 13824, 40, 4096, 32000)
    l2_70b = _llama("Llama 2 70B", 80, 8192, 64, 28672, 8, 4096, 32000)
    # torchtitan's 'selective op' policy saves every other matmul's output and recomputes the rest: about half a
    # forward, priced here as a full one (the nearest the plan has)
    for model, local, recompute, tokens in ((l3_8b, 1, "full", 2973), (l3_70b, 1, "full", 331),
                                            (l2_13b, 2, "none", 2162), (l2_13b, 2, "full", 1904),
                                            (l2_70b, 1, "full", 355), (l2_70b, 2, "full", 353)):
        figures.append(TrainingFigure(
            "torchtitan2024", "performance tables", model, "A100 SXM4 80GB", 64, "tokens_per_gpu_s", float(tokens),
            microbatch=local, global_batch=64 * local, recompute=recompute, sharding="fsdp",
            options=(_FP32_GRADS,),
            assumed="8 HDR adapters per node; 'selective op' checkpointing (about half the matmuls recomputed) "
                    "priced as full recomputation"))
    gpt3 = _gpt("GPT-3 175B (vocabulary 131072)", 96, 12288, 96, 4096, 131072)
    for gpus, mfu in ((96, 0.47), (4608, 0.42)):
        figures.append(TrainingFigure(
            "megatron-h100-2025", "Strong scaling results", gpt3, "H100 SXM5", gpus, "mfu", mfu, tensor=4,
            pipeline=8, global_batch=1152, interleave=3, recompute="selective", sharding="zero1",
            network="InfiniBand NDR", options=(("tp_overlap", True), _FP32_GRADS),
            assumed="TP 4 x PP 8 with 3 chunks, selective recomputation (the README's model table is an image); "
                    "DGX H100 with 8 NDR adapters; the overlaps the README names (DP, TP, PP) on"))
    return figures


def _with_split(figures: list[TrainingFigure]) -> tuple[TrainingFigure, ...]:
    from dataclasses import replace
    return tuple(replace(f, split=split_of(f.source)) for f in figures)


#: Every figure, each with its split (:func:`split_of`).
FIGURES: tuple[TrainingFigure, ...] = _with_split(
    [*_narayanan(), *_korthikanti(), *_mtnlg(), *_singles(), *_llmfoundry(), *_recent()])


def of_split(split: str) -> tuple[TrainingFigure, ...]:
    """The figures of ``"fit"`` or ``"test"``.

    Raises:
        ValueError: another name.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    return tuple(f for f in FIGURES if f.split == split)
