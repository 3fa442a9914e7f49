"""A variant per student: a lab's visible parameters drawn from the student's id, the same on every machine.

A lab declares which keys of its first visible run vary and the values each may take (``Lab.variant``, e.g.
``{"world_size": (4, 3), "bucket_cap_bytes": (4224, 2048, 6000)}``; the run's own values are the published
default). :func:`variant_runs` replaces them with values drawn from a stable hash of ``"<lab>:<key>:<id>"``
(sha256, never Python's ``hash()``, which changes from one process to the next), so the self-check and the
grader test the student's own variant and a number that fits someone else's fails. The other visible runs and
the hidden runs stay as published. :func:`whose` picks the id: the one the grader knows the submission is from
(Gradescope's submitter, the class folder's name), else ``STUDENT_ID`` at the top of the student's file, read by
:func:`student_id_of` without running the file (the grader's driver runs no student code); an empty id keeps
the published run. :func:`describe` says a variant in words ("world size 3, bucket cap 2,048 bytes"), which
:func:`grader.labs.core.run_lab` puts in the lab's result, with :func:`whose` 's notes, for the feedback.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grader.labs.core import Lab

#: The name in the student's file that holds their id.
ID_NAME = "STUDENT_ID"
#: Said once when a file has no id: its check runs the published parameters.
NO_ID = (f"INFO: {ID_NAME} is empty in {{path}}, so this checked the published variant: right when you learn on "
         f"your own. In a class, set {ID_NAME} at the top of the file to your student id: the grader checks your own "
         "variant.")
#: The id the grader knows differs from the file's: the grader's wins.
OTHER_ID = (f"INFO: {{path}} sets {ID_NAME} = {{given!r}}, but this submission is from {{known!r}}: it was "
            f"checked on {{known!r}}'s variant. Set {ID_NAME} to your own id, then run the self-check again.")

#: How a varied parameter reads in a message; a key not here reads "key=value".
PHRASES: dict[str, Callable[[Any], str]] = {
    "world_size": lambda n: f"world size {n}",
    "steps": lambda n: f"{n} steps",
    "seed": lambda n: f"seed {n}",
    "cases": lambda cases: "lengths " + _and(sorted({case[0] for case in cases})),  # the ring's [numel, dtype, op]
    "bucket_cap_bytes": lambda n: f"bucket cap {n:,} bytes",
    "d_ff": lambda n: f"d_ff={n}",
    "seq_len": lambda n: f"sequence length {n}",
    "micro_batches": lambda n: f"{n} micro-batches",
    "overflow_at": lambda n: f"an overflow at step {n}",
    "growth_interval": lambda n: f"growth_interval={n}",
    "stop_at": lambda n: f"stopped after step {n}",
    "layers": lambda n: f"{n} layers",
    "hidden": lambda n: f"hidden size {n}",
    "micro_batch": lambda n: f"micro-batch {n}",
    "tensor_parallel": lambda n: f"t={n}",
    "data_parallel": lambda n: f"d={n}",
    "link": str,
    "chunks": lambda n: f"{n} chunks per rank",
    "interleaved_groups": lambda n: f"interleaved on {n}·p micro-batches",
    "capacity_factor": lambda n: f"capacity factor {n}",
}


def _and(values: Any) -> str:
    words = [f"{v:,}" if isinstance(v, int) else str(v) for v in values]
    return ", ".join(words[:-1]) + f" and {words[-1]}" if len(words) > 1 else "".join(words)


def normalised(student_id: str) -> str:
    """The id as the hash sees it: surrounding spaces and case do not change a variant."""
    return student_id.strip().lower()


def pick(lab: str, key: str, student_id: str, choices: tuple) -> Any:
    """One of ``choices`` for ``student_id``, from sha256 of ``"<lab>:<key>:<id>"``: stable across machines."""
    if not choices:
        raise ValueError(f"{lab}'s variant declares no values for {key!r}: give it at least one")
    digest = hashlib.sha256(f"{lab}:{key}:{normalised(student_id)}".encode()).digest()
    return choices[int.from_bytes(digest[:8], "big") % len(choices)]


def draw(lab: str, student_id: str, choices: Mapping[str, tuple]) -> dict[str, Any]:
    """Key -> the value ``student_id`` gets, for every key of ``choices``; ``{}`` for an empty id."""
    if not normalised(student_id):
        return {}
    return {key: pick(lab, key, student_id, values) for key, values in choices.items()}


def variant_runs(lab: Lab, student_id: str) -> tuple[dict, ...]:
    """``lab``'s visible runs for ``student_id``: the first with its declared keys drawn, the others as published.

    An empty id, or a lab that declares no variant, gives the published runs unchanged."""
    drawn = draw(lab.name, student_id, lab.variant)
    if not drawn or not lab.runs:
        return lab.runs
    missing = set(drawn) - set(lab.runs[0])
    if missing:
        raise ValueError(f"{lab.name}'s variant varies {sorted(missing)}, which its first run does not set: "
                         "declare only keys of runs[0]")
    return ({**lab.runs[0], **drawn}, *lab.runs[1:])


def describe(lab: Lab, student_id: str) -> str:
    """The variant ``student_id`` gets, in words: ``"world size 3, bucket cap 2,048 bytes"``; "" if none."""
    runs = variant_runs(lab, student_id)
    if not lab.variant or not runs:
        return ""
    return ", ".join(PHRASES.get(key, lambda v, k=key: f"{k}={v}")(runs[0][key]) for key in lab.variant)


def student_id_of(path: str) -> str:
    """The string assigned to ``STUDENT_ID`` at the top level of the file at ``path``, read without running it.

    "" when the file is missing, does not parse, or sets no string there (the check then says what is wrong)."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ""
    found = ""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == ID_NAME for t in targets):
            value = getattr(node, "value", None)
            found = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else ""
    return found.strip()


def whose(path: str, known_ids: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]]:
    """The id a check of the file at ``path`` draws its variant from, and the notes to print about it.

    ``known_ids``: who the grader knows the submission is from (Gradescope's submitter, the class folder's name),
    every spelling of one student; empty in the self-check. The file's ``STUDENT_ID`` is used when it is one of
    them (or none is known); otherwise the first known id, with a note naming both. No id at all: the published
    parameters, with a note saying how to get one's own variant."""
    given = student_id_of(path)
    known = tuple(i.strip() for i in known_ids if i and i.strip())
    if known and normalised(given) not in {normalised(i) for i in known}:
        notes = (OTHER_ID.format(path=path, given=given, known=known[0]),) if given else ()
        return known[0], notes
    if not given:
        return "", (NO_ID.format(path=path),)
    return given, ()
