"""grader.channel: only records signed with the run's key get through; JSON only."""

import io
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader import channel

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


def test_reader_keeps_signed_records_and_counts_forgeries():
    key = channel.new_key()
    stream = io.BytesIO(channel.seal(key, {"a": 1}) + b'{"body": "{\\"a\\": 2}", "mac": "f00"}\n'
                        + channel.seal(channel.new_key(), {"a": 3}) + channel.seal(key, {"a": 4}))
    reader = channel.Reader(stream, key)
    assert reader.result() == [{"a": 1}, {"a": 4}]
    assert reader.rejected == 2


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


def test_writer_writes_whole_signed_lines():
    key = channel.new_key()
    read_fd, write_fd = os.pipe()
    channel.Writer(write_fd, key).write({"kind": "end", "rank": 2})
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as handle:
        assert channel.unseal(key, handle.readline()) == {"kind": "end", "rank": 2}
