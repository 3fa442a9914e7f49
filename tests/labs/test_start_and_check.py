"""course.labs: start writes a lab's stub, never over the learner's edits; check gives an untouched lab one line."""

from pathlib import Path

import pytest

from course import labs
from grader.labs import LABS
from grader.labs.core import stub_path

pytestmark = pytest.mark.unit4

RING = LABS["ring"]


@pytest.fixture
def notebook_dir(tmp_path, monkeypatch):
    """A fresh notebooks/ folder: the labs' files are relative to it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_start_writes_the_stub_and_says_how_to_reset(notebook_dir, capsys):
    assert labs.start("ring") is None  # nothing for the cell to echo
    path = Path(RING.student_file)
    assert (notebook_dir / path).read_bytes() == stub_path(RING).read_bytes()
    shown = capsys.readouterr().out
    assert 'labs.start("ring", reset=True)' in shown and "written from the lab's starting point" in shown
    assert "def ring_allreduce" in shown  # the file itself is shown


def test_a_learners_edits_survive_running_the_start_cell_again(notebook_dir, capsys):
    labs.start("ring")
    path = Path(RING.student_file)
    edited = path.read_text() + "\n# my notes: send right, receive from the left\n"
    path.write_text(edited)
    capsys.readouterr()
    labs.start("ring")
    assert path.read_text() == edited
    assert "your version, kept as you left it" in capsys.readouterr().out
    assert not path.with_name(path.name + labs.BACKUP_SUFFIX).exists()


def test_reset_restores_the_stub_and_keeps_the_edited_file_beside_it(notebook_dir):
    labs.start("ring")
    path = Path(RING.student_file)
    path.write_text("# my attempt\n")
    labs.start("ring", reset=True)
    assert path.read_bytes() == stub_path(RING).read_bytes()
    assert path.with_name(path.name + labs.BACKUP_SUFFIX).read_text() == "# my attempt\n"


def test_an_untouched_stub_is_left_as_it_is(notebook_dir, capsys):
    labs.start("ring")
    path = Path(RING.student_file)
    before = path.stat().st_mtime_ns
    labs.start("ring")
    assert path.stat().st_mtime_ns == before and "still the lab's starting point" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(LABS))
def test_checking_an_untouched_lab_prints_one_line(name, notebook_dir, capsys):
    labs.start(name)
    capsys.readouterr()
    result = labs.check(name, LABS[name].student_file)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [f"Lab {name!r}: not attempted yet ({LABS[name].student_file} is still the stub): write "
                       f"{LABS[name].entry}, then run this check again."]
    assert not result.passed and result.score == 0


def test_checking_a_missing_file_says_to_start_the_lab(notebook_dir, capsys):
    result = labs.check("ring")
    assert capsys.readouterr().out.strip() == (f"Lab 'ring': {RING.student_file} does not exist yet: run "
                                               "labs.start('ring') above, then this check.")
    assert not result.passed


def test_an_attempted_lab_gets_the_full_feedback(notebook_dir, capsys):
    labs.start("ring")
    path = Path(RING.student_file)
    path.write_text(path.read_text() + "\nimport course.collectives.allreduce  # noqa\n")  # a refused shortcut
    capsys.readouterr()
    result = labs.check("ring")
    printed = capsys.readouterr().out
    assert not result.passed and printed.startswith("Lab 'ring'") and "Score: 0/" in printed


def test_an_unknown_lab_is_named():
    with pytest.raises(ValueError, match="no lab called 'rings'"):
        labs.start("rings")
