"""course.runtime.waits: each rank's record of its messages says whom it waits for; a deadlock on messages is
stopped by the progress rule and reported as who waits for whom, naming the messages sent to the wrong rank."""

import pytest
import rank_functions as rf
from processes import live_children

from course.runtime import intercept, waits
from course.runtime.launch import RankTimeout, launch
from course.runtime.waits import Message, Record


class Work:
    """A stand-in for torch's work handle: the recorder only holds it and asks whether it completed."""

    def is_completed(self) -> bool:
        return False


def call(name: str, *args: object, nested: bool = False) -> intercept.Call:
    return intercept.Call(name, args, {}, __file__, nested)


def test_the_recorder_writes_the_messages_posted_and_the_one_waited_for(tmp_path):
    path = str(tmp_path / "rank-0.waits")
    recorder = waits.Recorder(waits.to_file(path))
    assert waits.read(path) == Record()
    first, second = Work(), Work()
    for work in (first, second):  # two irecvs from rank 1, as the learner calls them: irecv, then the group's recv
        returned = recorder._listen(call("irecv"))
        posted = recorder._listen(call("ProcessGroup.recv", None, [], 1, 0, nested=True))
        posted(work)
        returned(work)
    done = recorder._listen(call("Work.wait", second))
    record = waits.read(path)
    assert record.received == {1: 2} and record.sent == {}
    assert record.waiting == (Message("receive", 1, 2, "irecv"),)
    done(None)
    assert waits.read(path).waiting == () and waits.read(path).serial > record.serial
    assert recorder._listen(call("Work.wait", second)) is None  # waited already: not a wait for a message


def test_where_names_the_peer_and_how_many_messages_it_had_sent():
    records = {0: Record(3, {1: 2}, {1: 2}, (Message("receive", 1, 2, "irecv"),)),
               1: Record(5, {0: 1}, {0: 2}, (Message("send", 0, 2, "send"),))}
    assert waits.where(0, records) == ("to receive from rank 1 (its irecv number 2 from rank 1; rank 1 had sent "
                                       "it 1)")
    assert waits.where(1, records) == "to send to rank 0 (its send number 2 to rank 0)"  # rank 0 posted 2 receives
    assert waits.where(2, records) is None


def test_wrong_peers_are_the_messages_sent_to_a_rank_that_never_receives_from_the_sender():
    records = {0: Record(1, {2: 1}, {1: 1}), 1: Record(1, {}, {0: 1}), 2: Record(1, {}, {1: 1})}
    assert waits.wrong_peers(records) == ["rank 0 sent 1 message(s) to rank 2, which never receives from rank 0"]
    assert waits.wrong_peers({0: Record(1, {1: 3}, {}), 1: Record(1, {}, {0: 1})}) == []  # behind, not wrong


def test_a_record_being_written_or_missing_reads_as_none(tmp_path):
    assert waits.read(str(tmp_path / "absent")) is None
    (tmp_path / "torn").write_bytes(b'{"serial": 1, "sen')
    assert waits.read(str(tmp_path / "torn")) is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["recv", "irecv"])
def test_two_ranks_that_receive_from_each_other_are_both_named_with_whom_they_wait_for(short_window, how):
    with pytest.raises(RankTimeout) as caught:
        launch(rf.receive_from_each_other, 2, how, timeout_s=600)
    assert live_children() == []
    assert caught.value.ranks == [0, 1] and caught.value.idle_s == short_window
    assert caught.value.waiting == {
        0: f"to receive from rank 1 (its {how} number 1 from rank 1; rank 1 had sent it 0)",
        1: f"to receive from rank 0 (its {how} number 1 from rank 0; rank 0 had sent it 0)"}
    assert (f"rank 0 was waiting to receive from rank 1 (its {how} number 1 from rank 1; rank 1 had sent it 0); "
            f"rank 1 was waiting to receive from rank 0") in str(caught.value)
    assert "A rank that waits for a message no rank sends it hangs like this" in str(caught.value)


@pytest.mark.slow
def test_a_message_sent_to_the_wrong_rank_is_named(short_window):
    with pytest.raises(RankTimeout) as caught:
        launch(rf.send_to_the_wrong_peer, 3, timeout_s=600)
    assert caught.value.ranks == [0, 1, 2]
    assert "rank 1 was waiting to receive from rank 0 (its recv number 1 from rank 0; rank 0 had sent it 0)" \
        in str(caught.value)
    assert caught.value.wrong_peers == ["rank 0 sent 1 message(s) to rank 2, which never receives from rank 0"]
    assert str(caught.value).endswith("rank 0 sent 1 message(s) to rank 2, which never receives from rank 0. Check "
                                      "the peer ranks of your sends and receives.")
