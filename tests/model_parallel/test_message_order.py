"""course.model_parallel.message_order: sends and receives simulated before any rank starts; 1F1B's message order
finishes, a wrong one is reported with who waits for whom, during which op."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.model_parallel import schedules
from course.model_parallel.message_order import Call, blocking, simulate

pytestmark = pytest.mark.unit8


def _stage_calls(p: int, m: int, stage: int, grad_peer: int | None = None) -> list[Call]:
    """What a correct runner posts on ``stage`` for 1F1B (irecv + wait, isend; every send waited at the end);
    ``grad_peer`` sends the gradients to that rank instead of stage - 1."""
    calls: list[Call] = []
    for op in schedules.one_f_one_b(p, m, stage):
        during = f"{op.kind}{op.micro_batch}"
        source, target = (stage - 1, stage + 1) if op.kind == "F" else (stage + 1, stage - 1)
        if op.kind == "B" and grad_peer is not None:
            target = grad_peer
        if 0 <= source < p:
            blocking("recv", source, during, calls)
        if 0 <= target < p:
            calls.append(Call("send", target, during=during))
    return calls + [Call("wait", request=i) for i, call in enumerate(calls) if call.kind == "send"]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(2, 6), st.integers(1, 9))
def test_1f1b_message_order_finishes_on_every_pipeline(p, m):
    assert simulate([_stage_calls(p, m, s) for s in range(p)]) is None


def test_gradients_sent_the_wrong_way_deadlock_and_say_who_waits_for_whom():
    stuck = simulate([_stage_calls(4, 6, s, grad_peer=(s + 1) % 4 if s == 3 else None) for s in range(4)])
    assert stuck is not None
    assert "rank 2 waits to receive from rank 3 (during B0, its receive number 1 from rank 3)" in str(stuck)
    assert "rank 3 sends 2 message(s) to rank 0, which never receives from rank 3" in str(stuck)


def test_a_stage_that_receives_before_its_neighbour_sends_waits_for_ever():
    stuck = simulate([blocking("recv", 1, "F0"), blocking("recv", 0, "F0")])  # both receive first
    assert stuck.waits == ("rank 0 waits to receive from rank 1 (during F0, its receive number 1 from rank 1)",
                           "rank 1 waits to receive from rank 0 (during F0, its receive number 1 from rank 0)")
    assert simulate([blocking("send", 1), blocking("recv", 0)]) is None


def test_a_peer_outside_the_pipeline_is_refused_with_the_ranks_it_has():
    with pytest.raises(ValueError, match="rank 1 sends to rank 2, but the pipeline has ranks 0 to 1"):
        simulate([[], [Call("send", 2)]])
