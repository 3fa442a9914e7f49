"""The labs' side of :mod:`course.numerics.divergence`: a failing check's message opens with the first tensor that
diverged, then says what the check found, in the learner's terms.

A rank records its named tensors (:class:`course.numerics.divergence.Recorder`), the lab records the
one-process reference's under the same names, and :func:`named` puts the first divergence in front of every
failing finding of that rank. :func:`earliest` picks, among the ranks' divergences, the one computed first
(then the lowest rank), for a lab's ``cross_check``. Used by tp_mlp, sequence_parallel and ddp.
"""

from __future__ import annotations

from collections.abc import Sequence

from course.numerics.divergence import Divergence
from grader.labs.core import Finding


def named(findings: Sequence[Finding], divergence: Divergence | None) -> list[Finding]:
    """``findings``, each failing one's message prefixed with ``divergence`` (when there is one)."""
    if divergence is None:
        return list(findings)
    return [f if f.passed else Finding(f.check, False, f"{divergence}. Then: {f.message}") for f in findings]


def earliest(divergences: Sequence[Divergence | None]) -> Divergence | None:
    """Of the ranks' divergences, the one made first in its rank's records (ties: the lowest rank)."""
    found = [d for d in divergences if d is not None]
    return min(found, key=lambda d: (d.position, d.record.rank)) if found else None
