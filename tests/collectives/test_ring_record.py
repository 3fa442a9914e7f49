"""course.collectives.ring_record: a synthetic ring's messages (no ranks) are judged step by step: a right ring in
either direction is all right, a planted wrong chunk is named with its step, rank and chunk, and drawn."""

import matplotlib
import pytest
import torch

from course.collectives import ring_record as rr

matplotlib.use("Agg")
pytestmark = pytest.mark.unit4


def ring(inputs, op="sum", way=1, wrong=None, divide_early=False):
    """The sends of a ring on ``inputs`` (n, numel), played in one process; ``wrong=(step, rank)`` adds 1 to that
    message (0-based step)."""
    n = inputs.shape[0]
    chunks = [torch.tensor_split(inputs[r].float().clone(), n) for r in range(n)]
    sends = []
    for step in range(2 * (n - 1)):
        if step == n - 1 and divide_early:
            for r in range(n):
                chunks[r][(r + way) % n].div_(n)
        moving = []
        for r in range(n):
            payload = chunks[r][(r - way * step) % n].clone()
            if wrong == (step, r):
                payload += 1
            sends.append(rr.Sent(r, step, (r + way) % n, payload))
            moving.append(((r + way) % n, (r - way * step) % n, payload))
        for dest, c, payload in moving:
            chunks[dest][c].add_(payload) if step < n - 1 else chunks[dest][c].copy_(payload)
    return sends


INPUTS = torch.randint(-8, 9, (4, 10), generator=torch.Generator().manual_seed(0)).double()


@pytest.mark.parametrize("way", [1, -1])
def test_a_right_ring_either_way_round_is_right_at_every_step(way):
    judged = rr.judge(ring(INPUTS, way=way), INPUTS)
    assert len(judged) == 4 * 6 and all(j.right for j in judged) and rr.first_wrong(judged) is None
    assert [(j.step, j.rank, j.chunk) for j in judged[:2]] == [(1, 0, 0), (1, 1, 1)]


def test_dividing_before_the_all_gather_is_right_for_an_average():
    assert all(j.right for j in rr.judge(ring(INPUTS, divide_early=True), INPUTS, op="avg"))
    assert not all(j.right for j in rr.judge(ring(INPUTS, divide_early=True), INPUTS, op="sum"))


def test_the_first_wrong_chunk_is_named_by_step_rank_and_chunk():
    judged = rr.judge(ring(INPUTS, wrong=(1, 2)), INPUTS)
    first = rr.first_wrong(judged)
    assert first.where() == "step 2 (reduce-scatter): rank 2 sent chunk 1 to rank 3"
    assert [(j.step, j.rank) for j in judged if not j.right][:2] == [(2, 2), (3, 3)]  # passed on, one hop a step


def test_a_bfloat16_ring_within_rounding_is_right_and_one_off_by_a_unit_is_not():
    inputs = torch.randn(3, 7, generator=torch.Generator().manual_seed(1)).double()
    sends = [rr.Sent(s.rank, s.number, s.peer, s.payload.to(torch.bfloat16)) for s in ring(inputs)]
    assert all(j.right for j in rr.judge(sends, inputs))
    assert not rr.judge(ring(inputs, wrong=(0, 0)), inputs)[0].right


def test_the_drawing_outlines_the_first_wrong_message_and_names_it():
    figure = rr.plot(rr.judge(ring(INPUTS, wrong=(1, 2)), INPUTS), 4, title="yours")
    ax = figure.axes[0]
    assert ax.get_title() == "yours\nfirst wrong: step 2 (reduce-scatter): rank 2 sent chunk 1 to rank 3"
    outlined = [p for p in ax.patches if not p.get_fill()]
    assert len(outlined) == 1 and outlined[0].get_xy() == pytest.approx((2 - 1.45, 2 - 0.4))
    texts = {t.get_text() for t in ax.texts}
    assert "c1 → 3" in texts and len(ax.texts) == 24
    assert rr.plot(rr.judge(ring(INPUTS), INPUTS), 4).axes[0].get_title() == "every message right"
