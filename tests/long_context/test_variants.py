"""course.long_context.variants on 2 and 4 ranks: ring, all-gather and Ulysses equal full attention, each sends the
bytes of its closed form, Ulysses' gradients equal full attention's, and Ulysses refuses a head count the ranks do
not divide."""

import pytest

from course.long_context import variants
from course.long_context.ring_attention import Problem
from course.runtime.launch import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_scheme_equals_full_attention_and_sends_its_closed_form(world_size):
    problem = Problem(seq_len=32, heads=4)
    local_bytes = problem.batch * problem.heads * (problem.seq_len // world_size) * problem.head_dim * 4
    for found in launch(variants.compare_on_rank, world_size, problem, timeout_s=180):
        for scheme in variants.SCHEMES:
            assert found[scheme]["error"] < 1e-5, scheme
            assert found[scheme]["sent"] == variants.sent_bytes(scheme, world_size, local_bytes), scheme


def test_ulysses_gradients_equal_full_attention_and_backward_sends_what_forward_did():
    problem = Problem(seq_len=32, heads=8, seed=3)  # zigzag positions: the exchange must keep their order
    local_bytes = problem.batch * problem.heads * (problem.seq_len // 4) * problem.head_dim * 4
    for found in launch(variants.ulysses_gradients_on_rank, 4, problem, timeout_s=180):
        assert found["out_error"] < 1e-5
        for name, error in found["grad_error"].items():
            assert error < 1e-5, name
        assert found["sent"]["forward"] == found["sent"]["backward"] == variants.sent_bytes("ulysses", 4, local_bytes)


def test_ulysses_sends_less_than_the_ring_beyond_two_ranks():
    for n in (4, 8, 16):
        assert variants.sent_bytes("ulysses", n, 1000) < variants.sent_bytes("ring", n, 1000)
    assert variants.sent_bytes("ulysses", 2, 1000) == variants.sent_bytes("ring", 2, 1000)


def test_ulysses_refuses_heads_the_ranks_do_not_divide():
    with pytest.raises(Exception, match="do not divide by"):  # the rank's ValueError, re-raised by launch
        launch(variants.compare_on_rank, 4, Problem(seq_len=32, heads=6), timeout_s=120)


def test_an_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="scheme must be one of"):
        variants.sent_bytes("tree", 4, 1)
