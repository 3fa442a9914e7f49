"""course.runtime.nccl_rules: code that gloo lets pass but NCCL forbids fails on CPU, at the learner's line, with
the rule named; the legal version of the same code passes."""

import os

import observed_ranks
import pytest
import torch.distributed as dist

from course.runtime import nccl_rules
from course.runtime.launch import RankFailed, launch

HERE = observed_ranks.__file__


def failure(fn, *args, world_size=2):
    with pytest.raises(RankFailed) as failed:
        launch(fn, world_size, *args, timeout_s=60)
    return str(failed.value)


def test_a_tensor_off_the_ranks_device_is_named_with_the_line():
    text = failure(observed_ranks.off_device)
    assert "NCCL rule 'device'" in text and "expected one on this rank's device, meta" in text
    # the rank's stack shows paths short (relative to the project), as a learner reads them
    assert f"{os.path.basename(HERE)}:" in text and "tensor.to(rank.device)" in text


def test_receives_in_another_order_than_the_sends_fail():
    text = failure(observed_ranks.sends_in_another_order, False)
    assert "NCCL rule 'order'" in text and "receive number 1 of this rank from rank 0" in text
    assert "expected float32[2]" in text and "carries float32[4]" in text


def test_receives_in_the_order_of_the_sends_pass_even_reshaped():
    assert launch(observed_ranks.sends_in_the_same_order, 2, timeout_s=60)[1] == [0.0, 1.0, 2.0, 3.0, 1.0, 1.0]


def test_messages_with_tags_are_matched_per_tag_as_gloo_does():
    assert launch(observed_ranks.sends_in_another_order, 2, True, timeout_s=60) == [None, None]


def test_a_group_used_from_two_threads_fails():
    text = failure(observed_ranks.sends_from_another_thread)
    assert "NCCL rule 'threads'" in text and "thread 'late-sends'" in text and "irecv" in text


@pytest.mark.parametrize("at", [1, 2])  # ranks compare at their 1st, 2nd, 4th, ... collective
def test_collectives_that_differ_between_ranks_fail(at):
    text = failure(observed_ranks.collectives_that_differ, at, world_size=3)
    assert "NCCL rule 'agreement'" in text and f"collective number {at} " in text
    assert "all_reduce float32[3]" in text and "all_reduce float32[4]" in text


@pytest.mark.parametrize("calls", [5, 12])  # the difference at call 5 is caught at the end, or at the check at 8
def test_a_difference_between_two_checks_is_caught_and_named(calls):
    text = failure(observed_ranks.shapes_that_differ, 5, calls)
    assert "NCCL rule 'agreement'" in text and "collective number 5 " in text
    assert "all_reduce float32[2, 2]" in text and "all_reduce float32[4]" in text
    assert ("observed.settle()" in text) == (calls == 5)  # 12 calls: caught at the 8th, before the end


class _RankZeroOfTwo:
    """A group's rank and size: all :class:`nccl_rules.Rules` asks of it to compare."""

    rules: nccl_rules.Rules

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 2


class _StoreGone:
    """A store whose host (a rank of the script's own group) has left: torch raises DistNetworkError."""

    def set(self, key, value):
        raise dist.DistNetworkError("Broken pipe")


@pytest.mark.parametrize("store", [dist.HashStore(), _StoreGone()], ids=["peer never arrives", "store gone"])
def test_settle_waits_for_no_peer_and_passes_when_the_store_is_gone(store):
    group = _RankZeroOfTwo()
    group.rules = nccl_rules.Rules(group, store, enforce=True)
    group.rules._collectives = 5  # rank 0 ends after 5 collectives; rank 1 crashed before it published anything
    nccl_rules.settle([group])  # returns at once: nothing to compare with, and no one is waited for
    assert isinstance(store, _StoreGone) or store.check(["observed-agree/5/0"])
