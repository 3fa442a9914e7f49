"""GEMM efficiency by shape: tile and wave quantisation. Every number is **modelled**.

A GPU computes ``C = A·B`` (``C`` of ``m x n``, reduction depth ``k``) by cutting ``C`` into tiles, one thread block
each, and running the tiles on its streaming multiprocessors (SMs), one wave of ``SMs`` tiles at a time. NVIDIA's
*Matrix Multiplication Background User's Guide* (DU-09799-001, 2023, :data:`GUIDE`) names the two losses:

* **tile quantisation** (its section 3.1): a dimension that is not a multiple of the tile is padded up to one; the
  padded part of the last tile is computed and thrown away;
* **wave quantisation** (its section 3.2): ``tiles`` tiles take ``ceil(tiles / SMs)`` waves; the last wave leaves
  SMs idle (its example: an A100's 108 SMs run 108 tiles of 256 x 128 at once).

The useful share of the work the SMs do is ``q = m·n / (waves · SMs · tile_m · tile_n)`` (:func:`quantisation`).
The tiles are the guide's list of cuBLAS's tensor-core tiles (its section 2.3, :data:`TILES`: 256 x 128 and
128 x 256 the most efficient, down to 64 x 64), and cuBLAS picks a tile per shape by a heuristic. The model takes
the tile whose padded work is least (:func:`best_tile`). That is optimistic: a smaller tile also reuses each loaded
operand less, which this term does not price. The SM counts are the whitepapers'
(:data:`course.perf.beyond_layers.SMS`).

A weight GEMM runs three times per step with three output shapes (:func:`weight_gemm_quantisation`): forward
``tokens x n``, the input's gradient ``tokens x k`` and the weight's gradient ``k x n`` (its depth is the tokens).
The three take equal FLOPs, so their harmonic mean ``3 / Σ 1/q`` prices forward and backward together exactly.
A switch of :class:`course.perf.sharding.Terms` (``gemm_quantisation``), in the model that
``notebooks/05c_performance_model.ipynb`` scores on its test set.
"""

from __future__ import annotations

import math

from course.perf.beyond_layers import SMS, streaming_multiprocessors

GUIDE = ("NVIDIA, Matrix Multiplication Background User's Guide, DU-09799-001_v001 (2023), sections 2.3 (typical "
         "tile dimensions in cuBLAS), 3.1 (tile quantization) and 3.2 (wave quantization): "
         "https://docs.nvidia.com/deeplearning/performance/pdf/Matrix-Multiplication-Background-User-Guide.pdf")

#: cuBLAS's tensor-core thread-block tiles ``(rows, columns)`` of ``C``, most efficient first (:data:`GUIDE`, 2.3).
TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64),
                                      (64, 128), (64, 64))


def tile_quantisation(m: float, n: float, tile: tuple[int, int]) -> tuple[int, float]:
    """``(tiles, useful share)`` of an ``m x n`` output cut into ``tile``: each dimension padded up to the tile.

    Raises:
        ValueError: a dimension or a tile side that is not positive.
    """
    if m <= 0 or n <= 0 or min(tile) <= 0:
        raise ValueError(f"expected a positive output shape and tile, got {m} x {n} in tiles of {tile}. "
                         "Fix: pass the GEMM's output rows and columns.")
    rows, columns = math.ceil(m / tile[0]), math.ceil(n / tile[1])
    return rows * columns, m * n / (rows * columns * tile[0] * tile[1])


def quantisation(m: float, n: float, sms: int, tile: tuple[int, int]) -> float:
    """The useful share of an ``m x n`` output's work in ``tile`` tiles on ``sms`` SMs: ``m·n / (waves · sms ·
    tile area)``, ``waves = ceil(tiles / sms)`` (module docstring). 1.0 when every tile is full and every wave too.

    Raises:
        ValueError: see :func:`tile_quantisation`; ``sms`` below 1.
    """
    if sms < 1:
        raise ValueError(f"expected at least one SM, got {sms}. Fix: take it from the GPU's whitepaper.")
    tiles, _ = tile_quantisation(m, n, tile)
    waves = math.ceil(tiles / sms)
    return m * n / (waves * sms * tile[0] * tile[1])


def best_tile(m: float, n: float, sms: int, tiles: tuple[tuple[int, int], ...] = TILES) -> tuple[int, int]:
    """The tile of ``tiles`` with the least padded work for an ``m x n`` output on ``sms`` SMs; at a tie the one
    listed first (the larger, more efficient tile)."""
    return max(tiles, key=lambda tile: quantisation(m, n, sms, tile))


def gemm_quantisation(m: float, n: float, gpu_name: str) -> float:
    """:func:`quantisation` of an ``m x n`` output at the :func:`best_tile` on ``gpu_name``'s SMs; 1.0 for a GPU
    with no SM count on file (:data:`course.perf.beyond_layers.SMS`: the tensor-core generations)."""
    if not any(gpu_name.startswith(prefix) for prefix in SMS):
        return 1.0
    sms = streaming_multiprocessors(gpu_name)
    return quantisation(m, n, sms, best_tile(m, n, sms))


def weight_gemm_quantisation(tokens: float, n: float, k: float, gpu_name: str) -> float:
    """The share of a weight GEMM's forward and backward work that is useful: the harmonic mean of forward
    (``tokens x n``), the input's gradient (``tokens x k``) and the weight's gradient (``k x n``)."""
    shapes = ((tokens, n), (tokens, k), (k, n))
    return 3 / sum(1 / gemm_quantisation(m, columns, gpu_name) for m, columns in shapes)
