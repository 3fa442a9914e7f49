"""grader.inrank.channel: only records signed with the run's key get through; JSON only."""

import io
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader.inrank import channel

pytestmark = pytest.mark.unit6

records = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.floats(allow_nan=False), st.text(),
                                                         st.lists(st.integers(), max_size=5)), max_size=5)


@given(records)
def test_a_sealed_record_comes_back_unchanged(record):
    key = channel.new_key()
    assert channel.unseal(key, channel.seal(key, record)) == record


def test_wrong_key_tampered_body_and_junk_are_rejected():
    key, other = channel.new_key(), channel.new_key()
    line = channel.seal(key, {"kind": "step", "rank": 0, "lr": 0.008})
    assert channel.unseal(other, line) is None
    assert channel.unseal(key, line.replace(b"0.008", b"0.080")) is None
    for junk in (b"", b"not json\n", b'{"body": "{}"}\n', b'{"body": 1, "mac": "00"}\n', b"[1, 2]\n"):
        assert channel.unseal(key, junk) is None


def written(key, records, callers=()):
    """The lines a Writer signing with ``key`` writes for ``records``."""
    read_fd, write_fd = os.pipe()
    writer = channel.Writer(write_fd, key, callers)
    for record in records:
        writer.write(record)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as handle:
        return handle.readlines()


def test_reader_keeps_signed_records_and_counts_forgeries():
    key = channel.new_key()
    launcher = written(key, [{"kind": "rank_exit", "rank": 0}, {"kind": "rank_exit", "rank": 1}])
    rank1 = written(channel.rank_key(key, 1), [{"kind": "step", "rank": 1}, {"kind": "end", "rank": 1}])
    stream = io.BytesIO(launcher[0] + rank1[0] + b'{"body": "{\\"a\\": 2}", "mac": "f00"}\n'
                        + channel.seal(channel.new_key(), {"a": 3}) + launcher[1] + rank1[1])
    reader = channel.Reader(stream, key)
    assert [(r["kind"], r["signer"]) for r in reader.result()] == [
        ("rank_exit", "launcher"), ("step", 1), ("rank_exit", "launcher"), ("end", 1)]
    assert (reader.rejected, reader.out_of_sequence) == (2, 0)


def test_a_rank_cannot_sign_as_another_rank_or_replay_its_own_records():
    key = channel.new_key()
    as_rank_2 = written(channel.rank_key(key, 1), [{"kind": "step", "rank": 2}])
    mine = written(channel.rank_key(key, 1), [{"kind": "step", "rank": 1}, {"kind": "end", "rank": 1}])
    reader = channel.Reader(io.BytesIO(as_rank_2[0] + mine[0] + mine[0] + mine[1]), key)
    assert [r["kind"] for r in reader.result()] == ["step", "end"]
    assert (reader.rejected, reader.out_of_sequence) == (2, 1)


def test_the_writer_keeps_no_copy_of_the_key():
    key = channel.new_key()
    writer = channel.Writer(-1, key)
    assert all(value != key for value in vars(writer).values())
    assert not hasattr(writer._hmac, "__dict__")  # a keyed hash state (C object), with no key attribute


def test_a_write_from_outside_the_trusted_modules_is_reported_not_written():
    key = channel.new_key()
    lines = written(key, [{"kind": "report", "rank": 0, "val_accuracy": 0.99}], callers=("/grader/inrank/probes.py",))
    record = channel.unseal(key, lines[0])
    assert record["kind"] == "forgery" and record["forged_kind"] == "report" and record["caller"] == __file__
    assert "val_accuracy" not in record


def test_the_key_travels_through_a_pipe_and_the_descriptor_is_closed():
    key = channel.new_key()
    fd = channel.key_pipe(key)
    assert channel.read_key(fd) == key
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_short_key_is_refused():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"short")
    os.close(write_fd)
    with pytest.raises(RuntimeError, match="expected 32"):
        channel.read_key(read_fd)


def test_writer_writes_whole_signed_numbered_lines():
    key = channel.new_key()
    lines = written(key, [{"kind": "end", "rank": 2}, {"kind": "end", "rank": 2}])
    assert [channel.unseal(key, line) for line in lines] == [{"kind": "end", "rank": 2, "seq": 0},
                                                            {"kind": "end", "rank": 2, "seq": 1}]


def test_a_forked_child_writes_nothing_so_the_parents_records_stay_in_sequence():
    key = channel.new_key()
    read_fd, write_fd = os.pipe()
    writer = channel.Writer(write_fd, channel.rank_key(key, 0))
    child = os.fork()
    if child == 0:  # a DataLoader worker or a grandchild inheriting the writer and its sequence counter
        writer.write({"kind": "write", "rank": 0, "path": "/dev/null"})
        os._exit(0)
    os.waitpid(child, 0)
    writer.write({"kind": "init", "rank": 0})
    os.close(write_fd)
    reader = channel.Reader(os.fdopen(read_fd, "rb"), key)
    assert [r["kind"] for r in reader.result()] == ["init"] and reader.rejected == 0


def _as_other_user_in_child(action) -> int:
    """Fork; in the child become an unprivileged user (when root), run ``action()``, exit 0 if it returned True."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            if os.geteuid() == 0:
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            code = 0 if action() else 1
        finally:
            os._exit(code)
    return child


@pytest.mark.parametrize("hidden", [False, True])
def test_a_process_of_the_same_user_cannot_read_the_key_holders_memory(hidden):
    import ctypes
    import time

    ready_r, ready_w = os.pipe()

    def hold_a_key():
        if hidden:
            channel.hide_memory()
        else:  # a change of uid alone makes a process undumpable: restore what exec would give the launcher
            ctypes.CDLL(None).prctl(channel.PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.write(ready_w, b"r")
        time.sleep(30)
        return True

    holder = _as_other_user_in_child(hold_a_key)
    try:
        assert os.read(ready_r, 1) == b"r"

        def read_its_memory():
            try:
                open(f"/proc/{holder}/mem", "rb").close()
            except PermissionError:
                return False
            return True

        reader = _as_other_user_in_child(read_its_memory)
        readable = os.waitstatus_to_exitcode(os.waitpid(reader, 0)[1]) == 0
    finally:
        os.kill(holder, 9)
        os.waitpid(holder, 0)
        os.close(ready_r)
        os.close(ready_w)
    assert readable is not hidden
