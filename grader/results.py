"""The results of one graded submission: what grading returns, saves raw, and :mod:`grader.render` renders.

One vocabulary for the assignment and the labs: a :class:`Check` is one line of a rubric (the assignment's
:data:`grader.checks.CHECKS`, or a lab's checks), a :class:`CheckResult` the verdict on one check, a
:class:`LabResult` a lab's verdicts, and :class:`Results` everything about one submission: its ``status`` (how
its run ended), the assignment's check results and each lab's. Plain dataclasses that round-trip through JSON
(``to_dict`` / ``from_dict``), so a class's results can be saved as they complete and rendered later (CSV,
Gradescope, feedback) without re-running anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INTEGRITY_VIOLATION = "integrity violation"  # the gradebook status of a run whose records cannot be trusted
BAD = "bad submission"  # the status of a script refused before it ran (grader.submission says why)
FINISHED = "all ranks finished"  # the detail of a run that ended normally (the feedback does not repeat it)
LABS_ONLY = "labs only"  # the status of a submission that holds lab files and no assignment script
DERIVED = ("score", "max_score", "raw_score", "grade_status")  # saved for readers of the JSON, recomputed on load
VISIBILITIES = ("visible", "after_published", "hidden")  # Gradescope's terms; the self-check runs "visible" only


@dataclass(frozen=True)
class Check:
    """One line of a rubric: what is verified, worth ``points``.

    Attributes:
        name: stable identifier (CSV column, Gradescope test, a lab's findings), e.g. ``"disjoint_shards"``.
        title: what is checked, in one phrase, in the learner's words.
        points: score when passed (0 when failed).
        visibility: Gradescope's ``visible``, ``after_published`` or ``hidden``; the self-check runs ``visible``.
        test: the assignment's checks: ``(evidence, assignment) -> (passed, message)``; a lab's checks are
            decided on its ranks instead (``None``).
        voids_score: when failed, the submission's score is withheld (0, the raw score kept for the
            instructor's review): the records every other check rests on cannot be trusted.
        shows_measure: its message (a measure, e.g. a modelled step time) is kept even when it passes; with 0
            points it is information (``[INFO]`` in the feedback).
    """

    name: str
    title: str
    points: float
    visibility: str = "visible"
    test: Callable[..., Any] | None = field(default=None, compare=False)
    voids_score: bool = False
    shows_measure: bool = False

    def __post_init__(self) -> None:
        if self.visibility not in VISIBILITIES:
            raise ValueError(f"Check {self.name!r}: visibility must be one of {VISIBILITIES}, got "
                             f"{self.visibility!r}")

    @property
    def hidden(self) -> bool:
        """True for a check only the grader runs (not the self-check)."""
        return self.visibility != "visible"


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one check (the assignment's or a lab's) for one submission."""

    name: str
    title: str
    score: float
    max_score: float
    visibility: str  # visible / after_published / hidden (Gradescope's terms)
    passed: bool
    message: str  # what to tell the student, in the course's terms
    ran: bool = True  # False when the submission was not run (bad submission, grader error): no verdict
    voids_score: bool = False  # failed, it withholds the whole score (see Results.violation)
    assessed: bool = True  # False: the run finished but could not show this check's evidence (score 0, and its
    # points are left out of the total: the other checks' scores are scaled to max_score, see Results.score)

    @classmethod
    def of(cls, check: Check, passed: bool, message: str, **flags: bool) -> CheckResult:
        """The verdict on ``check``: its points if ``passed``, else 0."""
        return cls(check.name, check.title, check.points if passed else 0.0, check.points, check.visibility,
                   bool(passed), message, voids_score=check.voids_score, **flags)


@dataclass(frozen=True)
class LabResult:
    """The verdict on one lab file: one :class:`CheckResult` per check, in the lab's order.

    ``status`` says how the check of the file ended: ``ok``, or how the sandboxed run ended when it broke
    (then every check failed with that reason). ``runs``: the lab's runs done (the rest are skipped once the stub
    is found in place, or a run hangs). ``hidden``: the hidden runs and checks were included (``grader grade``).
    """

    lab: str  # the lab's name, e.g. "ring"
    title: str
    path: str  # the student's file
    checks: tuple[CheckResult, ...]
    elapsed_s: float = 0.0
    runs: int = 0
    hidden: bool = False
    status: str = "ok"
    variant: str = ""  # the student's variant in words ("world size 3, bucket cap 2,048 bytes"); "" if none
    notes: tuple[str, ...] = ()  # INFO lines about the check (no STUDENT_ID, an id other than the submitter's)

    @property
    def score(self) -> float:
        return sum(result.score for result in self.checks)

    @property
    def max_score(self) -> float:
        return sum(result.max_score for result in self.checks)

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.checks)

    def failed(self) -> list[str]:
        """Names of the checks that failed."""
        return [result.name for result in self.checks if not result.passed]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "score": self.score, "max_score": self.max_score}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LabResult:
        raw = {k: v for k, v in raw.items() if k not in ("score", "max_score")}
        return cls(**{**raw, "checks": tuple(CheckResult(**c) for c in raw.get("checks", ())),
                      "notes": tuple(raw.get("notes", ()))})


@dataclass
class Results:
    """Everything the grader concluded about one submission.

    Attributes:
        submission: the submission's name (file or folder name).
        status: ``ok``, ``timeout``, ``crash on rank k``, ``hang on rank k``, ``out of memory``,
            ``too many processes``, ``output limit``, ``bad submission``, ...: how the run ended
            (:attr:`grade_status` puts ``integrity violation`` over it).
        detail: why, in the course's terms.
        checks: one entry per check that was run.
        elapsed_s: wall time of the whole grading of this submission.
        test_accuracy: the grader's own evaluation of the checkpoint, or None.
        output: the head of rank 0's output and the tail of a failing rank's errors, for the feedback.
        seed: the grader's evaluation seed (derived from the submission's content, so regrading agrees).
        labs: the labs found in the submission, graded (:mod:`grader.labs.grade`); not part of :attr:`score`
            (see :attr:`total`).
    """

    submission: str
    status: str
    detail: str
    checks: list[CheckResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    test_accuracy: float | None = None
    output: str = ""
    seed: int = 0
    labs: dict[str, LabResult] = field(default_factory=dict)  # lab name -> its result

    @property
    def assignment(self) -> bool:
        """False for a submission of lab files only: no assignment script, no assignment check."""
        return self.status != LABS_ONLY

    @property
    def raw_score(self) -> float:
        """The sum of the checks' scores, as if every record were trusted."""
        return sum(c.score for c in self.checks)

    @property
    def violation(self) -> str | None:
        """Why the records cannot be trusted (a failed check that voids the score, e.g. integrity), or None."""
        return next((c.message for c in self.checks if c.voids_score and c.ran and not c.passed), None)

    @property
    def assessed_max_score(self) -> float:
        """The points of the checks the run could be assessed on (see :attr:`CheckResult.assessed`)."""
        return sum(c.max_score for c in self.checks if c.assessed)

    @property
    def not_assessed(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.assessed]

    @property
    def score(self) -> float:
        """The grade: :attr:`raw_score` scaled from the points that could be assessed to :attr:`max_score` (a check
        that could not be assessed neither awards nor takes points), or 0 after a :attr:`violation` (withheld for
        the instructor's review)."""
        if self.violation:
            return 0.0
        assessed = self.assessed_max_score
        return round(self.raw_score * self.max_score / assessed, 2) if 0 < assessed < self.max_score else self.raw_score

    @property
    def grade_status(self) -> str:
        """What the gradebook's status column says: ``integrity violation`` over the run's own :attr:`status`."""
        return INTEGRITY_VIOLATION if self.violation else self.status

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.checks)

    @property
    def total(self) -> float:
        """The assignment's :attr:`score` and every lab's together (Gradescope's one score)."""
        return self.score + sum(lab.score for lab in self.labs.values())

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "labs": {name: lab.to_dict() for name, lab in self.labs.items()},
                "score": self.score, "max_score": self.max_score, "raw_score": self.raw_score,
                "grade_status": self.grade_status}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Results:
        raw = {k: v for k, v in raw.items() if k not in DERIVED}
        raw["checks"] = [CheckResult(**c) for c in raw.get("checks", [])]
        raw["labs"] = {name: LabResult.from_dict(lab) for name, lab in raw.get("labs", {}).items()}
        return cls(**raw)

    def save(self, path: Path) -> None:
        """Write the raw results as JSON (atomically: a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Results:
        return cls.from_dict(json.loads(Path(path).read_text()))
