"""The gradebook of a class: which submissions a folder holds, their saved results, and the CSV over them.

    submissions, skipped = scan(Path("submissions"), out=Path("grading_out"))
    save(results, Path("grading_out"), key)           # results/KEY.json, gradescope/KEY/, feedback/KEY.txt
    rebuild(Path("grading_out"))                       # gradebook.csv again, from the saved results

Saved results are the raw :class:`grader.results.Results`; everything else is rendered from them by
:mod:`grader.render`.
"""

from __future__ import annotations

import csv
from pathlib import Path

from grader import render
from grader.results import Results
from grader.runner import GRADER_STOPPED

GRADER_ERROR = "grader error"
# the grader's own failures, or runs it was stopped in, not the student's: --resume grades these again
RETRIED = (GRADER_ERROR, "error", GRADER_STOPPED)
SYSTEM_ENTRIES = ("__pycache__", "__MACOSX")  # left by Python and by macOS's zip, never a student's

def scan(folder: Path, out: Path | None = None) -> tuple[list[Path], list[str]]:
    """The submissions in ``folder`` (a file or a folder per student, sorted by name) and what was skipped, why.

    Skipped: hidden entries (``.name``), ``__pycache__``/``__MACOSX``, and the output folder ``out`` if it
    lies inside ``folder``. Names starting with ``_`` are graded like any other.

    Raises:
        FileNotFoundError: ``folder`` is not a folder.
        ValueError: ``out`` is ``folder`` itself (the outputs would be graded as submissions next time).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of submissions (one file or folder per student).")
    out_resolved = Path(out).resolve() if out is not None else None
    if out_resolved == folder.resolve():
        raise ValueError(f"the output folder {out} is the submissions folder: pass another -o OUT.")
    submissions, skipped = [], []
    for path in sorted(folder.iterdir()):
        if path.resolve() == out_resolved:
            skipped.append(f"{path.name} (the output folder)")
        elif path.name.startswith(".") or path.name in SYSTEM_ENTRIES:
            skipped.append(f"{path.name} (hidden or system entry)")
        else:
            submissions.append(path)
    return submissions, skipped


def submissions_in(folder: Path, out: Path | None = None) -> list[Path]:
    """The submissions :func:`scan` finds in ``folder``."""
    return scan(folder, out)[0]


def output_keys(submissions: list[Path]) -> dict[str, str]:
    """Submission name -> the name of its output files: ``alice.py`` -> ``alice``, unless that is ambiguous.

    When ``alice.py`` and a folder ``alice/`` (or ``alice.py/``...) are both submitted, each keeps its full
    name (``alice.py``, ``alice``), so neither overwrites the other's results, feedback or Gradescope file.

    Raises:
        ValueError: two submissions would still share a name (``x.py.py`` next to ``x.py`` and ``x/``).
    """
    names = [p.name for p in submissions]
    stems = [n.removesuffix(".py") for n in names]
    keys = {n: (s if stems.count(s) == 1 else n) for n, s in zip(names, stems, strict=True)}
    seen: dict[str, str] = {}
    for name, key in keys.items():
        other = seen.setdefault(key, name)
        if other != name:
            raise ValueError(f"submissions {other!r} and {name!r} would write the same output files "
                             f"({key!r}): rename one of them.")
    return keys


def save(results: Results, out: Path, key: str | None = None) -> None:
    """Write one submission's raw results, Gradescope JSON and feedback under ``out``, named ``key``.

    ``key`` defaults to the submission's name without ``.py``; :func:`output_keys` gives unique keys.
    """
    key = key or results.submission.removesuffix(".py")
    for folder in ("results", "feedback", "gradescope"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    results.save(out / "results" / f"{key}.json")
    render.write_gradescope(results, out / "gradescope" / key / "results.json")
    (out / "feedback" / f"{key}.txt").write_text(render.feedback(results))


def saved_results(out: Path, keys: dict[str, str] | None, skipped: list[str] | None = None) -> dict[str, Results]:
    """The saved results in ``out`` of the submissions in ``keys`` (name -> output key, :func:`output_keys`),
    or of every submission if ``keys`` is None.

    A submission with two files (its key changed when another took its short name) keeps the one under its
    current key. Results of other submissions and unreadable files are left out (and on disk); unreadable
    ones are named in ``skipped``.
    """
    kept: dict[str, Results] = {}
    for path in sorted(Path(out, "results").glob("*.json")):
        try:
            results = Results.load(path)
        except (OSError, ValueError, TypeError, KeyError) as error:
            if skipped is not None:
                skipped.append(f"{path} (unreadable: {type(error).__name__})")
            continue
        name = results.submission
        if keys is None:
            kept.setdefault(name, results)  # no current key to prefer: the first file
        elif name in keys and (name not in kept or path.stem == keys[name]):
            kept[name] = results
    return kept


def graded_before(out: Path, keys: dict[str, str]) -> dict[str, Results]:
    """The saved results in ``out`` worth keeping: of a current submission (a name in ``keys``), graded cleanly.

    Results of removed submissions, grader errors and unreadable files are left out (and on disk).
    """
    return {name: r for name, r in saved_results(out, keys).items() if r.status not in RETRIED}


def rebuild(out: Path, folder: Path | None = None) -> tuple[list[Results], list[str]]:
    """Rewrite ``out/gradebook.csv`` from the raw results saved in ``out/results``, for the same submissions.

    Which submissions: those now in ``folder`` if given, else those the gradebook lists now (what the last
    ``grade`` graded), so results of withdrawn submissions, still on disk, stay out; with neither, every
    saved result.

    Returns:
        the results written, and notes for the instructor: unreadable files, submissions with no result.

    Raises:
        FileNotFoundError: ``out`` has no results folder. ValueError: see :func:`output_keys`.
    """
    out = Path(out)
    if not (out / "results").is_dir():
        raise FileNotFoundError(f"{out / 'results'} does not exist: give the folder `grader grade -o` wrote.")
    notes: list[str] = []
    keys: dict[str, str] | None = None
    if folder is not None:
        keys = output_keys(submissions_in(folder, out))
    else:
        try:
            with open(out / "gradebook.csv", newline="") as handle:
                names = [row["submission"] for row in csv.DictReader(handle)][1:]  # after "points possible"
        except (OSError, KeyError, csv.Error):
            names = []
        if names:
            keys = output_keys([Path(name) for name in names])
        else:
            notes.append(f"no readable {out / 'gradebook.csv'}: every saved result is included")
    kept = saved_results(out, keys, notes)
    notes += [f"{name}: no saved result (grade it)" for name in keys or () if name not in kept]
    render.write_gradebook(list(kept.values()), out / "gradebook.csv")
    return list(kept.values()), notes
