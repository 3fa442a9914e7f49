"""Planted mistakes: each a small edit of a lab's reference solution, which its tests prove a check catches.

A lab's folder may hold ``mistakes.py`` with ``MISTAKES: dict[str, Mistake]``. A :class:`Mistake` is a few
exact-string replacements of ``reference.py`` and one line saying what is wrong. :func:`apply` makes the
mistaken source, :func:`write` puts it in a file that :func:`grader.labs.core.run_lab` checks. Each edit's
``old`` must occur exactly once, so a change of the reference that breaks a mistake fails loudly, naming it.
``tests/grader/labs/test_<lab>.py`` says which checks each mistake must fail; ``docs/contributing.md``
("Adding a lab") says how to add one. Wrong attempts that are not near the reference stay as files in
``tests/grader/labs/attempts/`` (its README says which and why).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from grader.labs.core import reference_path
from grader.labs.registry import get
from grader.labs.variant import ID_NAME


@dataclass(frozen=True)
class Mistake:
    """A planted mistake: exact-string replacements of the lab's reference solution, applied in order."""

    edits: tuple[tuple[str, str], ...]  # (old, new): old occurs exactly once in the source edited so far
    why: str  # what is wrong, in one line
    #: the STUDENT_ID the mistaken file sets; "" checks the published variant, as a student who set none
    student_id: str = ""


class MistakeError(ValueError):
    """A mistake that no longer applies to its lab's reference (an edit's text is gone, or not unique)."""


def mistakes(lab: str) -> dict[str, Mistake]:
    """The planted mistakes of ``lab`` (its folder's ``mistakes.py``); ``{}`` if it has none.

    Raises:
        ValueError: no lab called ``lab``.
    """
    get(lab)
    try:
        module = importlib.import_module(f"grader.labs.{lab}.mistakes")
    except ModuleNotFoundError as error:
        if error.name != f"grader.labs.{lab}.mistakes":
            raise
        return {}
    return dict(module.MISTAKES)


def apply(lab: str, name: str) -> str:
    """The source of ``lab``'s reference solution with the mistake ``name`` planted in it.

    Raises:
        KeyError: ``lab`` has no mistake ``name``.
        MistakeError: an edit's ``old`` text occurs zero times or more than once.
    """
    known = mistakes(lab)
    if name not in known:
        raise KeyError(f"{lab} has no planted mistake {name!r}; it has: {', '.join(sorted(known)) or 'none'}")
    mistake = known[name]
    source = reference_path(get(lab)).read_text()
    for number, (old, new) in enumerate(mistake.edits, 1):
        found = source.count(old)
        if found != 1:
            raise MistakeError(
                f"{lab}'s mistake {name!r}: edit {number} expects its text exactly once in {lab}/reference.py, "
                f"found it {found} times: {old.strip()[:80]!r}. Fix: update the edit in "
                f"grader/labs/{lab}/mistakes.py to the reference's current text.")
        source = source.replace(old, new)
    return _with_student_id(source, mistake.student_id)


def write(lab: str, name: str, folder: str | Path) -> Path:
    """Write :func:`apply`'s source to ``folder/<lab>_<name>.py`` and return that path."""
    path = Path(folder) / f"{lab}_{name}.py"
    path.write_text(apply(lab, name))
    return path


def _with_student_id(source: str, student_id: str) -> str:
    """``source`` with its top-level ``STUDENT_ID = "..."`` set to ``student_id`` (untouched if it has none)."""
    pattern = re.compile(rf'^({ID_NAME}\s*=\s*)"[^"\n]*"', re.MULTILINE)
    return pattern.sub(lambda match: f'{match.group(1)}"{student_id}"', source, count=1)
