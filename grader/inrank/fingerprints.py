"""What the probes and the grader compute of a model's parameters, the same way on both sides.

A *fingerprint* (seeded random projections of the flattened parameters, and their norm) compares ranks'
parameters up to float rounding; *digests* (one SHA-256 per tensor) compare a checkpoint with rank 0's
parameters bit for bit; :func:`encode` / :func:`decode` carry the first steps' full parameters and
gradients as JSON-safe text (no pickle) for the grader's replay.
"""

from __future__ import annotations

import base64
import hashlib

import torch

FINGERPRINT_DIMS = 4  # random projections of the flattened parameters compared across ranks


def full_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` as whole tensors: a sharded ``DTensor`` (FSDP2's ``fully_shard``, even or uneven shards) is
    gathered with ``full_tensor()`` (a collective: every rank must call this at the same point), others are
    returned as they are."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed: no DTensor either
        return list(tensors)
    return [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors]


def has_shards(tensors: list[torch.Tensor]) -> bool:
    """Some of ``tensors`` are ``DTensor``s (gathering them is a collective)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(t, DTensor) for t in tensors)


def encode(tensors: list[torch.Tensor]) -> str:
    """Tensors flattened and concatenated as float32, base64 (JSON-safe, no pickle)."""
    flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors]) if tensors else None
    return base64.b64encode(flat.numpy().tobytes() if flat is not None else b"").decode()


def projection(numel: int, seed: int) -> torch.Tensor:
    """The (FINGERPRINT_DIMS, numel) float64 random projection of :func:`fingerprint`, drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(FINGERPRINT_DIMS, numel, generator=generator, dtype=torch.float64)


def fingerprint(params: list[torch.Tensor], seed: int, projected: torch.Tensor | None = None) -> list[float]:
    """Seeded random projections of the flattened parameters, then their norm (``projected``: a cached
    :func:`projection` for ``seed``)."""
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in params])
    projected = projection(flat.numel(), seed) if projected is None else projected
    return (projected @ flat).tolist() + [float(flat.norm())]


def digests(params: list[torch.Tensor]) -> list[str]:
    """One SHA-256 (hex) per tensor, of its shape and float32 values: equal digests, equal tensors, bit for bit.

    The grader compares the checkpoint's with rank 0's after each optimizer step
    (:func:`grader.evidence.bind_checkpoint`).
    """
    out = []
    for p in params:
        values = p.detach().to("cpu", torch.float32).contiguous()
        out.append(hashlib.sha256(repr(tuple(values.shape)).encode() + values.numpy().tobytes()).hexdigest())
    return out


def decode(text: str) -> torch.Tensor:
    """The flat float32 tensor :func:`encode` wrote."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.float32)


