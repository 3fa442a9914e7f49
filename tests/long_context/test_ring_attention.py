"""course.long_context.ring_attention on 2 and 4 gloo ranks: outputs and gradients equal full attention on one
process; forward sends one block of K and V per step to the next rank; backward returns dK, dV home."""

import pytest

from course.long_context import ring_attention as ra
from course.runtime.launch import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=[(2, "contiguous"), (4, "zigzag")], ids=["2-contiguous", "4-zigzag"])
def runs(request):
    world_size, layout = request.param
    problem = ra.Problem(seq_len=32, layout=layout, seed=world_size)
    return world_size, problem, launch(ra.step_on_rank, world_size, problem, timeout_s=180)


def test_outputs_and_gradients_equal_full_attention(runs):
    _, _, results = runs
    for result in results:
        assert result["out_error"] < 1e-5
        assert max(result["grad_error"].values()) < 1e-5, result["grad_error"]


def test_forward_sends_one_kv_block_per_step_to_the_next_rank(runs):
    world_size, problem, results = runs
    block_bytes = 2 * problem.batch * problem.heads * (problem.seq_len // world_size) * problem.head_dim * 4
    for rank, result in enumerate(results):
        assert result["sends"]["forward"] == [((rank + 1) % world_size, block_bytes)] * (world_size - 1)


def test_backward_sends_dkv_once_more_than_kv(runs):
    world_size, _, results = runs
    for rank, result in enumerate(results):
        backward = result["sends"]["backward"]
        assert len(backward) == 2 * world_size - 1  # n - 1 blocks of K, V and n of dK, dV (the last: home)
        assert {peer for peer, _ in backward} == {(rank + 1) % world_size}


def test_work_is_balanced_only_under_the_zigzag(runs):
    _, problem, results = runs
    work = [r["work"] for r in results]
    assert (len(set(work)) == 1) == (problem.layout == "zigzag")
