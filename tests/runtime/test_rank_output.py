"""course.runtime.rank_output: a rank's lines reach the notebook prefixed by rank; its stderr is followed, capped."""

import os
import queue
from pathlib import Path

from course.runtime import rank_output
from course.runtime.rank_output import RankOutput, StderrRelay, stderr_to


def test_stdout_is_sent_line_by_line_with_the_rank_and_a_partial_line_on_flush():
    channel = queue.Queue()
    out = RankOutput(2, channel)
    out.write("a\nb")
    out.write("c\n")
    out.write("tail")
    out.flush()
    assert [channel.get_nowait() for _ in range(3)] == [("out", "[rank 2] a\n"), ("out", "[rank 2] bc\n"),
                                                        ("out", "[rank 2] tail\n")]
    assert channel.empty()


def test_stderr_to_sends_fd_2_to_the_file_and_restores_it(tmp_path, capfd):
    path = str(tmp_path / "rank-0.stderr")
    with stderr_to(path):
        os.write(2, b"inside\n")
    os.write(2, b"outside\n")
    assert Path(path).read_bytes() == b"inside\n"
    assert capfd.readouterr().err == "outside\n"


def test_relay_shows_whole_lines_as_they_come_and_the_rest_at_the_end(tmp_path, capsys):
    paths = [str(tmp_path / f"rank-{rank}.stderr") for rank in range(2)]
    relay = StderrRelay(paths)
    Path(paths[1]).write_text("warning: x\npart")
    relay.relay()
    assert capsys.readouterr().err == "[rank 1] warning: x\n"
    relay.relay(final=True)
    assert capsys.readouterr().err == "[rank 1] part\n"


def test_after_a_failure_the_other_ranks_lines_are_counted_not_shown(tmp_path, capsys):
    paths = [str(tmp_path / f"rank-{rank}.stderr") for rank in range(3)]
    relay = StderrRelay(paths)
    Path(paths[0]).write_text("Connection reset by peer\nagain\n")
    Path(paths[1]).write_text("ValueError: mine\n")
    relay.relay(final=True, failed=1)
    assert capsys.readouterr().err == ("[rank 0] (2 line(s) of stderr written as it was stopped after rank 1 "
                                       "failed: not shown)\n[rank 1] ValueError: mine\n")


def test_the_tail_starts_at_the_last_traceback_survives_a_flood_and_relays_first(tmp_path, capsys):
    path = tmp_path / "rank-0.stderr"
    relay = StderrRelay([str(path)])
    flood = "noise\n" * (rank_output.STDERR_KEPT_BYTES // 3)
    path.write_text("Traceback (most recent call last):\nOldError\n" + flood
                    + "Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'k'\n")
    assert relay.tail(0) == "Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'k'"
    assert capsys.readouterr().err.count("[rank 0] noise") == rank_output.STDERR_KEPT_BYTES // 3  # shown in full
    assert relay.tail(0, lines=1) == "KeyError: 'k'"


def test_what_ranks_write_as_they_start_is_relayed_and_quoted_for_a_rank_with_nothing_of_its_own(tmp_path, capsys):
    # a rank forked from the fork server writes there until it has its own file: an import error at start-up
    paths, start_up = [str(tmp_path / f"rank-{rank}.stderr") for rank in range(2)], tmp_path / "server.stderr"
    relay = StderrRelay(paths, str(start_up))
    assert relay.start_up_tail() == "" and StderrRelay(paths).start_up_tail() == ""
    start_up.write_text("Traceback (most recent call last):\n  File \"train.py\"\nImportError: no module x\n")
    relay.relay()
    assert capsys.readouterr().err == ("[rank start-up] Traceback (most recent call last):\n"
                                       "[rank start-up]   File \"train.py\"\n"
                                       "[rank start-up] ImportError: no module x\n")
    assert relay.tail(1) == ""
    Path(paths[0]).write_text("Connection reset by peer")  # a peer's echo, shown or counted by relay(failed=...)
    assert relay.start_up_tail() == "Traceback (most recent call last):\n  File \"train.py\"\nImportError: no module x"
    assert "[rank 0]" not in capsys.readouterr().err
