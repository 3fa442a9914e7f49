"""grader.labs.variant: each lab's visible run drawn from the student id, stable, within the declared values and
different across ids; the id read from the file without running it, the grader's own id preferred and the
difference said; and a file written for the published numbers fails another student's variant, naming it."""

import dataclasses
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader import render
from grader.labs import LABS, variant
from grader.labs.core import run_lab
from grader.labs.tp_mlp import check as tp_mlp
from grader.results import CheckResult, LabResult

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
VARIED = sorted(name for name, lab in LABS.items() if lab.variant)
IDS = st.text(min_size=1, max_size=16).filter(lambda text: text.strip())


def test_every_lab_declares_its_variant():
    assert set(VARIED) == set(LABS) and len(LABS) == 12


@pytest.mark.parametrize("name", VARIED)
def test_every_varied_key_reads_as_words(name):
    assert all(key in variant.PHRASES for key in LABS[name].variant)


@pytest.mark.parametrize("name", VARIED)
@given(student_id=IDS)
def test_a_variant_is_stable_and_within_the_declared_values(name, student_id):
    lab = LABS[name]
    runs = variant.variant_runs(lab, student_id)
    assert runs == variant.variant_runs(lab, f"  {student_id} ")  # surrounding spaces do not matter
    assert all(runs[0][key] in values for key, values in lab.variant.items())
    assert {k: v for k, v in runs[0].items() if k not in lab.variant} == \
        {k: v for k, v in lab.runs[0].items() if k not in lab.variant}  # only the declared keys vary
    assert runs[1:] == lab.runs[1:] and variant.describe(lab, student_id)


@pytest.mark.parametrize("name", VARIED)
def test_ids_get_different_variants_and_an_empty_id_the_published_run(name):
    lab = LABS[name]
    assert len({variant.describe(lab, f"student{i}") for i in range(40)}) >= 2
    assert variant.variant_runs(lab, "") == variant.variant_runs(lab, "   ") == lab.runs


def test_the_draw_is_sha256_of_lab_key_and_id_not_pythons_hash():
    import hashlib

    digest = hashlib.sha256(b"ddp:bucket_cap_bytes:ada").digest()
    caps = LABS["ddp"].variant["bucket_cap_bytes"]
    assert variant.pick("ddp", "bucket_cap_bytes", "Ada", caps) == caps[int.from_bytes(digest[:8], "big") % len(caps)]


def test_a_key_the_first_run_does_not_set_is_refused():
    lab = dataclasses.replace(LABS["zero"], variant={"bucket_cap_bytes": (1, 2)})
    with pytest.raises(ValueError, match=r"zero's variant varies \['bucket_cap_bytes'\], which its first run"):
        variant.variant_runs(lab, "ada")


@pytest.mark.parametrize(("source", "found"), [
    ('STUDENT_ID = "ada"\n', "ada"),
    ('STUDENT_ID: str = " ada "  # mine\n', "ada"),
    ('STUDENT_ID = ""\n', ""),
    ("STUDENT_ID = 42\n", ""),
    ('def f():\n    STUDENT_ID = "inside"\n', ""),  # only the top level counts
    ('STUDENT_ID = "ada"\nSTUDENT_ID = "bob"\n', "bob"),  # the last assignment, as Python would see it
    ("STUDENT_ID = (\n", ""),  # does not parse
])
def test_the_id_is_read_from_the_file_without_running_it(tmp_path, source, found):
    path = tmp_path / "lab.py"
    path.write_text('raise SystemExit("never run")\n' + source)
    assert variant.student_id_of(str(path)) == found


def test_whose_prefers_the_graders_id_and_says_when_the_file_names_another(tmp_path):
    path = tmp_path / "lab.py"
    path.write_text('STUDENT_ID = "bob"\n')
    assert variant.whose(str(path)) == ("bob", ())  # the self-check: the file's id
    assert variant.whose(str(path), ("1234", "Bob@uni.edu", "BOB")) == ("bob", ())  # one of the submitter's ids
    student_id, notes = variant.whose(str(path), ("alice",))
    assert student_id == "alice"
    assert notes == (f"INFO: {path} sets STUDENT_ID = 'bob', but this submission is from 'alice': it was checked "
                     "on 'alice''s variant. Set STUDENT_ID to your own id, then run the self-check again.",)
    path.write_text('STUDENT_ID = ""\n')
    assert variant.whose(str(path), ("alice",)) == ("alice", ())  # the grader knows: nothing to say
    student_id, notes = variant.whose(str(path))
    assert student_id == "" and notes[0].startswith(f"INFO: STUDENT_ID is empty in {path}, so this checked the "
                                                    "published parameters.")


def test_the_feedback_names_the_variant_and_the_notes():
    check = CheckResult.of(tp_mlp.CHECKS[0], True, "")
    result = LabResult("tp_mlp", "t", "labs/tp_mlp.py", (check,), variant="your variant: world size 2, d_ff=64",
                       notes=("INFO: something to know",))
    assert "  Checked on your variant: world size 2, d_ff=64.\n  INFO: something to know\n" in \
        render.lab_feedback(result)
    assert LabResult.from_dict(result.to_dict()) == result


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_file_written_for_the_published_numbers_fails_another_students_variant_and_says_which():
    hard_coded = os.path.join(HERE, "attempts", "tp_mlp_hard_coded_shard.py")  # k = 16: d_ff=64 over 4 ranks
    assert variant.describe(tp_mlp.LAB, "alice") == "world size 2, d_ff=64"  # k = 32 on each of 2 ranks
    published = run_lab(tp_mlp.LAB, hard_coded)
    assert published.passed, render.lab_feedback(published)
    assert published.variant == "the published variant: world size 4, d_ff=64"
    alices = run_lab(tp_mlp.LAB, hard_coded, student_ids=("alice",))  # as the grader, who knows the submitter
    feedback = render.lab_feedback(alices)
    assert "outputs" in alices.failed() and "Checked on your variant: world size 2, d_ff=64." in feedback
    assert next(c.message for c in alices.checks if not c.passed).startswith("world_size=2, d_ff=64: "), feedback
    solution = run_lab(tp_mlp.LAB, os.path.join(ROOT, "grader", "labs", "tp_mlp", "reference.py"),
                       student_ids=("alice",))
    assert solution.passed, render.lab_feedback(solution)  # the same variant is passed by code that reads it
