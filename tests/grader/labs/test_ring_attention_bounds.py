"""grader.labs.ring_attention.bounds, in one process: the reference's ring on 2-6 simulated ranks, each rank merging
its blocks and each block's dk, dv adding up in shuffled orders, passes the check's cross_check (its bounds derived,
not set by hand); arithmetic mistakes go beyond them; and each bound is never more than 10x the largest error the
correct ring shows (measured here)."""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.long_context import balance, blockwise
from course.numerics import bounds
from grader.labs.ring_attention import check as ring_attention
from grader.labs.ring_attention import reference as ring
from grader.labs.ring_attention.bounds import backward_bounds, forward_bounds

pytestmark = pytest.mark.unit8b


def _config(world_size: int, seed: int) -> dict:
    return {"world_size": world_size, "seq_len": 2 * world_size * 4, "seed": seed, "batch": 1, "heads": 2,
            "head_dim": 4}


def _forward(q, k, v, layout, shuffle: random.Random, merge=ring.merge) -> tuple[list, list]:
    """Every rank's (out, lse): its own block first, then the others in a shuffled order."""
    outs, lses = [], []
    for rank, mine in enumerate(layout):
        others = [source for source in range(len(layout)) if source != rank]
        shuffle.shuffle(others)
        out, lse = torch.zeros_like(q[..., mine, :]), torch.full(q[..., mine, 0].shape, -math.inf)
        for source in [rank, *others]:
            keys = layout[source]
            out, lse = merge(out, lse, *ring.block_attention(q[..., mine, :], k[..., keys, :], v[..., keys, :], mine,
                                                             keys))
        outs.append(out)
        lses.append(lse)
    return outs, lses


def _backward(dout, q, k, v, out, lse, layout, shuffle: random.Random, skip: int | None = None) -> list:
    """Every rank's (dq, dk, dv): dq summed over the blocks, each block's dk, dv over the ranks, in shuffled orders
    (``skip``: a block whose contribution every rank forgets, a planted mistake)."""
    n = len(layout)
    part = {(rank, source): ring.block_backward(*(t[..., layout[rank], :] for t in (dout, q)),
                                                k[..., layout[source], :], v[..., layout[source], :],
                                                out[..., layout[rank], :], lse[..., layout[rank]], layout[rank],
                                                layout[source]) for rank in range(n) for source in range(n)}
    found = []
    for rank in range(n):
        sources, adders = shuffle.sample(range(n), n), shuffle.sample(range(n), n)
        dq = sum((part[(rank, s)][0] for s in sources if s != skip), torch.zeros_like(q[..., layout[rank], :]))
        dk = sum((part[(r, rank)][1] for r in adders), torch.zeros_like(k[..., layout[rank], :]))
        dv = sum((part[(r, rank)][2] for r in adders), torch.zeros_like(v[..., layout[rank], :]))
        found.append([dq, dk, dv])
    return found


def _evidence(config: dict, mistake: str = "") -> list[dict]:
    """What the ranks of a run return to the check, computed in one process."""
    n, seq_len, shuffle = config["world_size"], config["seq_len"], random.Random(config["seed"])
    layout = balance.layout("zigzag", n, seq_len)
    keys = torch.randn(1, 1, seq_len, seq_len, generator=torch.Generator().manual_seed(config["seed"] + 1))
    probe, _ = _forward(torch.zeros(1, 1, seq_len, seq_len), keys, torch.eye(seq_len)[None, None], layout, shuffle)
    merge = _no_rescale if mistake == "no_rescale" else ring.merge
    outs, lses = _forward(*ring_attention.problem(config, ring_attention.SCORE_SCALE)[:3], layout, shuffle, merge)
    q, k, v, dout = ring_attention.problem(config)
    out, lse = blockwise.attention(q, k, v)
    grads = _backward(dout, q, k, v, out, lse, layout, shuffle, skip=n - 1 if mistake == "dq_misses_a_block" else None)
    return [{"layout": [p.tolist() for p in layout], "probe": probe[rank][0, 0], "forward": [outs[rank], lses[rank]],
             "grads": grads[rank]} for rank in range(n)]


def _no_rescale(out_a, lse_a, out_b, lse_b):
    """A merge that weighs both partial outputs equally: right only when both blocks saw the same mass."""
    total = torch.logaddexp(lse_a, lse_b)
    return torch.where(torch.isinf(lse_a)[..., None], out_b, (out_a + out_b) / 2), total


@settings(max_examples=10, deadline=None, derandomize=True)
@given(st.integers(2, 6), st.integers(0, 10**6))
def test_the_correct_ring_in_any_order_passes_the_checks_derived_bounds(world_size, seed):
    config = _config(world_size, seed)
    found = ring_attention.cross_check(config, _evidence(config))
    assert all(f.passed for f in found), [f.message for f in found if not f.passed]


@pytest.mark.parametrize(("mistake", "check", "fragment"), [
    ("no_rescale", "online_softmax", "beyond rounding: a bug (bound "),
    ("dq_misses_a_block", "q_gradient", "rank 0's dq differs from full attention's at position "),
])
def test_an_arithmetic_mistake_goes_beyond_the_bound(mistake, check, fragment):
    found = {f.check: f for f in ring_attention.cross_check(_config(4, 0), _evidence(_config(4, 0), mistake))}
    assert not found[check].passed and fragment in found[check].message, found[check].message
    assert "beyond rounding: a bug (bound " in found[check].message


def _ratios(world_size: int, seed: int) -> dict[str, float]:
    """seen / bound of each tensor the check compares, over the whole sequence."""
    config = _config(world_size, seed)
    evidence, layout = _evidence(config), balance.layout("zigzag", world_size, config["seq_len"])
    mask = torch.ones(config["seq_len"], config["seq_len"], dtype=torch.bool).tril()

    def whole(index: int, part: str) -> torch.Tensor:
        pieces = [e[part][index] for e in evidence]
        got = torch.empty(pieces[0].shape[:2] + (config["seq_len"],) + pieces[0].shape[3:], dtype=pieces[0].dtype)
        for rank, piece in enumerate(pieces):
            got[:, :, layout[rank]] = piece
        return got

    q, k, v, _ = ring_attention.problem(config, ring_attention.SCORE_SCALE)
    expected = blockwise.attention(q, k, v, mask)
    limits = forward_bounds(q, k, v, mask, world_size)
    found = {name: bounds.verdict(whole(i, "forward"), expected[i], limits[i]).ratio
             for i, name in enumerate(("out", "lse"))}
    q, k, v, dout = ring_attention.problem(config)
    out, lse = blockwise.attention(q, k, v)
    expected = blockwise.block_backward(dout, q, k, v, out, lse, mask)
    limits = backward_bounds(dout, q, k, v, out, lse, mask, world_size)
    found |= {name: bounds.verdict(whole(i, "grads"), expected[i], limits[i]).ratio
              for i, name in enumerate(("dq", "dk", "dv"))}
    return found


def test_each_bound_is_never_more_than_10x_the_largest_error_the_correct_ring_shows():
    closest = {}
    for world_size in range(2, 7):
        for seed in range(2):
            for name, ratio in _ratios(world_size, seed).items():
                closest[name] = max(closest.get(name, 0.0), ratio)
    assert all(0.1 <= ratio <= 1 for ratio in closest.values()), closest
