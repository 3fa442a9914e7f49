"""The results object of one graded submission: what the runner returns, saves raw, and :mod:`grader.render` renders.

Plain dataclasses that round-trip through JSON (``to_dict`` / ``from_dict``), so a class's results can be
saved as they complete and rendered later (CSV, Gradescope, feedback) without re-running anything.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INTEGRITY_VIOLATION = "integrity violation"  # the gradebook status of a run whose records cannot be trusted
FINISHED = "all ranks finished"  # the detail of a run that ended normally (the feedback does not repeat it)
DERIVED = ("score", "max_score", "raw_score", "grade_status")  # saved for readers of the JSON, recomputed on load


@dataclass(frozen=True)
class CheckResult:
    """One rubric line for one submission."""

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
        labs: the labs found in the submission, graded (:mod:`grader.labs.grade`); not part of :attr:`score`.
    """

    submission: str
    status: str
    detail: str
    checks: list[CheckResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    test_accuracy: float | None = None
    output: str = ""
    seed: int = 0
    labs: dict[str, dict[str, Any]] = field(default_factory=dict)  # lab name -> grader.labs.grade.grade_lab's verdict

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

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "score": self.score, "max_score": self.max_score, "raw_score": self.raw_score,
                "grade_status": self.grade_status}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Results:
        raw = {k: v for k, v in raw.items() if k not in DERIVED}
        raw["checks"] = [CheckResult(**c) for c in raw.get("checks", [])]
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
