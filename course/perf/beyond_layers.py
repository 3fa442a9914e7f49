"""What a transformer's step costs beyond its repeated layers: the pipeline's end stages, gradient clipping, and
the price of hiding tensor-parallel collectives behind GEMMs. Every number is **modelled**.

Three mechanisms, each a switch of :class:`course.perf.sharding.Terms` (issue 44, second round), each from a
source, none fitted:

* **the pipeline's ends** (``pipeline_ends``). The last stage computes the loss: a softmax cross-entropy over the
  vocabulary, memory-bound. Megatron-Core's vocab-parallel cross-entropy
  (``megatron/core/tensor_parallel/cross_entropy.py``) casts the logits to FP32, takes the max, subtracts it,
  exponentiates, sums and divides in forward, and subtracts the one-hot target, scales and casts back in
  backward: about 60 bytes moved per logit (:data:`LOSS_BYTES_PER_LOGIT`). The first stage looks up the embedding
  and scatters its gradient back. With tied embeddings on a pipeline, the first and last stages each hold the
  word embedding, and its gradients are all-reduced between them after the pipeline drains, before the optimizer
  (``_allreduce_word_embedding_grads`` in ``megatron/core/distributed/finalize_model_grads.py``): exposed.
* **gradient clipping** (``grad_clipping``): GPT-3, Llama and the frameworks clip the gradients' global norm to
  1.0. Megatron-Core's ``clip_grad_norm_fp32`` (``megatron/core/optimizer/clip_grads.py``) reads every gradient
  of this GPU's shard for the norm, all-reduces one number, and scales every gradient (a read and a write): 12
  bytes per FP32 gradient beside Adam's 28.
* **tensor-parallel overlap is partial** (``tp_overlap_partial``). Megatron's ``--tp-comm-overlap`` runs
  Transformer Engine's userbuffers (``transformer_engine/pytorch/module/base.py``, ``initialize_ub``): the
  reduce-scatter after each block's output projection is overlapped by the ``pipeline`` method, the GEMM cut into
  ``num_splits=4`` chunks, so the last chunk's reduce-scatter waits with nothing to hide it; that method and the
  ``bulk`` method of backward run their collectives on ``num_sm=16`` streaming multiprocessors, which the
  overlapped GEMM loses while they run. The all-gathers (``ring_exchange``, on copy engines) cost no SMs.

Taught in ``notebooks/05c_performance_model.ipynb``; :func:`course.perf.parallel.step_time` adds each term.
"""

from __future__ import annotations

from course.perf import microbench
from course.perf.comm import Cluster, alpha_beta, message_seconds
from course.perf.transformer import Transformer

#: Bytes moved per logit by the loss, forward and backward (module docstring): cast 6, max 4, subtract 8, exp 8,
#: sum 4, divide 8; backward: one-hot 8, scale 8, cast back 6.
LOSS_BYTES_PER_LOGIT = 60.0
#: Bytes per gradient of gradient clipping: read for the norm (4), read and write to scale (8), FP32 gradients.
CLIP_BYTES_PER_PARAM = 12.0
#: Transformer Engine's userbuffers defaults: chunks of the ``pipeline`` method, SMs of its collectives.
UB_SPLITS, UB_SMS = 4, 16
#: Streaming multiprocessors per GPU (the architecture whitepapers: V100 80, A100 108, H100 SXM5 132, PCIe 114).
SMS = {"V100": 80, "A100": 108, "H100 SXM5": 132, "H100 PCIe": 114, "H100 NVL": 132, "H200": 132}


def streaming_multiprocessors(gpu_name: str) -> int:
    """The SM count of a catalog GPU (:data:`SMS`, matched on the name's start).

    Raises:
        KeyError: a GPU with no SM count here, naming the known ones.
    """
    for prefix, count in SMS.items():
        if gpu_name.startswith(prefix):
            return count
    raise KeyError(f"no SM count for {gpu_name!r}; known: {sorted(SMS)}. Fix: add it to SMS from its whitepaper.")


def _bandwidth(cluster: Cluster) -> float:
    return cluster.gpu.memory_bandwidth * microbench.constant("memory")


def loss_seconds(model: Transformer, tokens: float, tensor: int, cluster: Cluster) -> float:
    """The last stage's loss, forward and backward, for ``tokens`` tokens: memory-bound over ``tokens·V/t``
    logits."""
    return tokens * model.vocab / tensor * LOSS_BYTES_PER_LOGIT / _bandwidth(cluster)


def embedding_seconds(model: Transformer, tokens: float, cluster: Cluster) -> float:
    """The first stage's embedding lookup (write ``tokens·h`` 16-bit values) and its gradient's scatter-add (read
    them, read and write the FP32 rows): memory-bound."""
    return tokens * model.hidden * (2 + 2 + 8) / _bandwidth(cluster)


def tied_embedding_seconds(model: Transformer, tensor: int, pipeline: int, precision: str, cluster: Cluster
                           ) -> float:
    """The all-reduce of the word embedding's gradient between the first and the last stage (two GPUs, on the
    network when a pipeline spans nodes): ``V·h/t`` gradients, FP32 with bf16 (Megatron accumulates them in FP32),
    16-bit with fp16. Zero without a pipeline or with untied embeddings."""
    if pipeline == 1 or not model.tied:
        return 0.0
    nbytes = model.vocab * model.hidden / tensor * (4 if precision == "bf16" else 2)
    spans_nodes = tensor * pipeline > cluster.gpus_per_node
    link = cluster.network_per_gpu() if spans_nodes else alpha_beta(cluster.intra)
    return message_seconds(nbytes, link)  # a ring of two: each sends N/2 twice


def clipping_seconds(params: float, cluster: Cluster) -> float:
    """Gradient clipping of ``params`` gradients on this GPU: memory-bound (the one-number all-reduce's latency is
    inside the per-step overhead)."""
    return params * CLIP_BYTES_PER_PARAM / _bandwidth(cluster)


def tp_overlap_cost(tensor_s: float, gpu_name: str) -> dict[str, float]:
    """What hiding one pass's TP collectives (``tensor_s``: two allreduces' worth, half of it reduce-scatter) costs
    with Transformer Engine's userbuffers: ``{"forward", "backward"}`` seconds added to one layer's pass.

    Forward: the last of ``UB_SPLITS`` chunks of the reduce-scatter is exposed, and the GEMM loses
    ``UB_SMS/SMs`` of its rate while the rest runs. Backward: the ``bulk`` collectives (as many bytes as
    ``tensor_s``) take the same share of the SMs from the GEMMs they overlap."""
    share = UB_SMS / streaming_multiprocessors(gpu_name)
    reduce_scatter = tensor_s / 2
    forward = reduce_scatter / UB_SPLITS + share * reduce_scatter * (1 - 1 / UB_SPLITS)
    return {"forward": forward, "backward": share * tensor_s}
