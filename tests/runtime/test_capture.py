"""course.runtime.capture: one capped reader for a pipe drained to its end and for a file read as it grows."""

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.runtime.capture import Capped


def test_the_capped_reader_counts_every_byte_and_keeps_the_first_whole_when_it_fits():
    whole = Capped(io.BufferedReader(io.BytesIO(b"abc" * 10)))
    assert whole.text() == "abc" * 10 and whole.total == 30
    capped = Capped(io.BufferedReader(io.BytesIO(bytes(range(100)))), head_bytes=10, tail_bytes=5, marker="|{dropped}|")
    assert capped.text().encode() == bytes(range(10)) + b"|85|" + bytes(range(95, 100))
    assert (capped.total, capped.kept) == (100, 15)


@given(chunks=st.lists(st.binary(max_size=40), max_size=8), head=st.integers(0, 30), tail=st.integers(0, 30))
def test_a_followed_file_is_capped_exactly_as_the_same_bytes_through_a_pipe(tmp_path_factory, chunks, head, tail):
    path = tmp_path_factory.mktemp("follow") / "stderr"
    followed, returned = Capped(path, head, tail), b""
    for chunk in chunks:
        with open(path, "ab") as handle:
            handle.write(chunk)
        returned += followed.read_new()
    piped = Capped(io.BufferedReader(io.BytesIO(b"".join(chunks))), head, tail)
    assert returned == b"".join(chunks)  # the caller sees every byte; the reader keeps a head and a tail
    assert (followed.text(), followed.total, followed.kept) == (piped.text(), piped.total, piped.kept)


def test_a_followed_file_is_read_in_whole_lines_when_asked_and_may_not_exist_yet(tmp_path):
    path = tmp_path / "stderr"
    followed = Capped(path)
    assert followed.read_new() == b"" and followed.text() == ""
    path.write_bytes(b"one\ntw")
    assert followed.read_new(whole_lines=True) == b"one\n"
    assert followed.read_new(whole_lines=True) == b""
    with open(path, "ab") as handle:
        handle.write(b"o\nthr")
    assert followed.read_new(whole_lines=True) == b"two\n"
    assert followed.read_new() == b"thr" and followed.text() == "one\ntwo\nthr"


def test_a_pipe_reader_refuses_read_new_and_says_what_to_call():
    with pytest.raises(TypeError, match="call text"):
        Capped(io.BufferedReader(io.BytesIO(b"x"))).read_new()
