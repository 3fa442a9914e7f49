"""grader.labs.mistakes: every planted mistake still applies to its lab's current reference, and each is tested.

A reference edit that removes or duplicates the text a mistake edits fails here, naming the mistake."""

import ast
from pathlib import Path

import pytest

from grader.labs import mistakes
from grader.labs.registry import LABS

HERE = Path(__file__).resolve().parent
PLANTED = [(lab, name) for lab in LABS for name in mistakes.mistakes(lab)]


def test_most_labs_plant_their_mistakes_as_edits_of_the_reference():
    assert len(PLANTED) >= 50 and len({lab for lab, _ in PLANTED}) >= 10


@pytest.mark.parametrize(("lab", "name"), PLANTED)
def test_every_mistake_applies_to_the_current_reference_and_changes_its_code(lab, name):
    source = mistakes.apply(lab, name)  # raises MistakeError if an edit's text is gone or not unique
    reference = mistakes.reference_path(LABS[lab]).read_text()
    assert ast.dump(ast.parse(source)) != ast.dump(ast.parse(reference)), f"{lab}'s {name!r} changes no code"
    assert mistakes.mistakes(lab)[name].why.strip()


@pytest.mark.parametrize(("lab", "name"), PLANTED)
def test_every_mistake_is_named_in_its_labs_tests(lab, name):
    tests = "".join(path.read_text() for path in HERE.glob("test_*.py"))
    assert f'"{name}"' in tests, f"{lab}'s planted mistake {name!r} is never checked in tests/grader/labs/"


def test_a_kept_attempt_file_is_no_planted_mistake_and_the_readme_says_why_it_is_kept():
    readme = (HERE / "attempts" / "README.md").read_text()
    for path in sorted((HERE / "attempts").glob("*.py")):
        lab = max((lab for lab in LABS if path.stem.startswith(f"{lab}_")), key=len)
        assert path.stem[len(lab) + 1:] not in mistakes.mistakes(lab), f"{path.name} is also a planted mistake"
        assert path.name in readme, f"attempts/README.md does not say why {path.name} is kept as a file"


def test_an_edit_whose_text_left_the_reference_fails_loudly_naming_the_mistake(tmp_path, monkeypatch):
    lab, name = PLANTED[0]
    old = mistakes.mistakes(lab)[name].edits[0][0]
    changed = tmp_path / "reference.py"
    changed.write_text(mistakes.reference_path(LABS[lab]).read_text().replace(old, ""))
    monkeypatch.setattr(mistakes, "reference_path", lambda _lab: changed)
    with pytest.raises(mistakes.MistakeError, match=rf"{lab}'s mistake '{name}': edit 1 .* found it 0 times"):
        mistakes.apply(lab, name)
    changed.write_text(old + old)
    with pytest.raises(mistakes.MistakeError, match="found it 2 times"):
        mistakes.apply(lab, name)


def test_an_unknown_mistake_names_the_ones_there_are(tmp_path):
    with pytest.raises(KeyError, match="ring has no planted mistake 'nope'; it has: "):
        mistakes.write("ring", "nope", tmp_path)
    path = mistakes.write("ring", "forgets_average", tmp_path)
    assert path == tmp_path / "ring_forgets_average.py" and 'STUDENT_ID = ""' in path.read_text()
