"""grader.render and grader.results: raw JSON round trip, gradebook with points possible, Gradescope format."""

import csv
import json

import pytest

from grader import render
from grader.checks import CHECKS
from grader.results import LABS_ONLY, Check, CheckResult, LabResult, Results

pytestmark = pytest.mark.unit6


def sample(name="alice.py", status="ok", passed=True, tampered=False) -> Results:
    """Every check passed (or failed, ``passed=False``) but integrity, which fails only if ``tampered``."""
    checks = [CheckResult(c.name, c.title, c.points if passed else 0.0, c.points, c.visibility,
                          not tampered if c.voids_score else passed, f"message for {c.name}",
                          voids_score=c.voids_score) for c in CHECKS]
    return Results(name, status, "detail", checks, elapsed_s=12.3, test_accuracy=0.97, output="epoch 0", seed=7)


def test_results_round_trip_through_json(tmp_path):
    results = sample()
    results.save(tmp_path / "r.json")
    again = Results.load(tmp_path / "r.json")
    assert again == results and again.score == 100 and again.max_score == 100


def test_gradebook_has_a_points_possible_row_and_a_status_column(tmp_path):
    render.write_gradebook([sample("bob.py", "hang on rank 3", False), sample()], tmp_path / "g.csv")
    rows = list(csv.DictReader(open(tmp_path / "g.csv")))
    assert rows[0]["submission"] == "points possible" and float(rows[0]["score"]) == 100
    assert [r["submission"] for r in rows[1:]] == ["alice.py", "bob.py"]
    assert rows[2]["status"] == "hang on rank 3" and float(rows[2]["score"]) == 0
    assert {c.name for c in CHECKS} <= set(rows[0])


def test_gradescope_results_follow_the_format(tmp_path):
    render.write_gradescope(sample(passed=False), tmp_path / "out" / "results.json")
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["score"] == 0 and len(data["tests"]) == len(CHECKS)
    test = data["tests"][1]
    assert set(test) >= {"name", "score", "max_score", "visibility", "output", "status"}
    assert test["status"] == "failed" and test["output"] == f"message for {CHECKS[1].name}"


def test_feedback_lists_every_check_and_hides_hidden_ones_on_request():
    text = render.feedback(sample(status="timeout", passed=False))
    assert "status: timeout" in text and text.count("[FAIL]") == len(CHECKS) - 1  # all but integrity
    hidden = [c for c in CHECKS if c.visibility == "hidden"]
    visible_text = render.feedback(sample(), visible_only=True)
    assert all(c.title not in visible_text for c in hidden)


def test_a_detected_tamper_withholds_the_score_and_cannot_be_missed(tmp_path):
    tampered = sample("mallory.py", tampered=True)  # every scored check passed, the integrity check failed
    assert tampered.raw_score == 100 and tampered.score == 0 and tampered.grade_status == "integrity violation"
    assert tampered.status == "ok"  # how the run ended is kept, and --resume does not regrade it
    tampered.save(tmp_path / "r.json")
    again = Results.load(tmp_path / "r.json")
    assert again == tampered and again.score == 0
    assert json.loads((tmp_path / "r.json").read_text())["raw_score"] == 100
    render.write_gradebook([tampered, sample()], tmp_path / "g.csv")
    rows = {r["submission"]: r for r in csv.DictReader(open(tmp_path / "g.csv"))}
    assert rows["mallory.py"]["status"] == "integrity violation" and float(rows["mallory.py"]["score"]) == 0
    assert float(rows["mallory.py"]["raw_score"]) == 100
    assert rows["mallory.py"]["detail"].startswith("INTEGRITY VIOLATION: message for integrity")
    assert rows["alice.py"]["status"] == "ok" and float(rows["alice.py"]["score"]) == 100
    text = render.feedback(tampered)
    assert "0 / 100 points   status: integrity violation" in text and "0 instead of 100 / 100" in text
    gradescope = render.gradescope(tampered)
    assert gradescope["score"] == 0 and "INTEGRITY VIOLATION" in gradescope["output"]


def test_only_a_check_that_voids_the_score_withholds_it():
    assert [c.name for c in CHECKS if c.voids_score] == ["integrity"]
    assert sample(passed=False).violation is None and sample(passed=False).grade_status == "ok"


def unassessable(names=("equal_parameters", "matches_single_process")) -> Results:
    """``sample()`` with ``names`` not assessed (0 points, left out of the total) and disjoint shards failed."""
    results = sample()
    for i, c in enumerate(results.checks):
        if c.name in names:
            results.checks[i] = CheckResult(c.name, c.title, 0.0, c.max_score, c.visibility, False,
                                            "cannot be assessed: needs each rank to see its own shard", assessed=False)
        elif c.name == "disjoint_shards":
            results.checks[i] = CheckResult(c.name, c.title, 0.0, c.max_score, c.visibility, False, "use a sampler")
    return results


def test_a_check_that_cannot_be_assessed_is_left_out_of_the_total_and_said_so(tmp_path):
    results = unassessable()  # 55 of the 70 assessable points: 55 x 100 / 70
    assert (results.raw_score, results.assessed_max_score, results.max_score) == (55, 70, 100)
    assert results.score == pytest.approx(78.57) and Results.from_dict(results.to_dict()) == results
    text = render.feedback(results)
    assert "[NOT ASSESSED] equal parameters at start and after every step (its 15 points left out of the total)" \
        in text and "55 of the 70 points that could be assessed, scaled to 100" in text
    assert "[PASS]" not in "".join(line for line in text.splitlines() if "cannot be assessed" in line)
    render.write_gradebook([results], tmp_path / "g.csv")
    row = list(csv.DictReader(open(tmp_path / "g.csv")))[1]
    assert row["equal_parameters"] == "not assessed" and float(row["score"]) == pytest.approx(78.57)
    assert render.gradescope(results)["score"] == pytest.approx(78.57)


def test_a_violation_withholds_the_scaled_score_too():
    results = unassessable()
    results.checks[-1] = CheckResult("integrity", "grader's probes untouched", 0.0, 0.0, "hidden", False,
                                     "the checkpoint holds parameters ...", voids_score=True)
    assert results.score == 0 and results.raw_score == 55


def lab(name="ring", passed=(True, False)) -> LabResult:
    checks = tuple(CheckResult.of(Check(f"c{i}", f"check {i}", 2), ok, "" if ok else f"wrong {i}")
                   for i, ok in enumerate(passed))
    return LabResult(name, f"the {name} lab", f"labs/{name}.py", checks, elapsed_s=1.0, runs=2)


def test_a_lab_only_submission_renders_its_labs_alone(tmp_path):
    results = Results("zoe", LABS_ONLY, "graded the lab(s) submitted: ring (no assignment script)",
                      labs={"ring": lab()})
    text = render.feedback(results)
    assert "/ 100" not in text and "NOT RUN" not in text and "status:" not in text
    assert "Lab 'ring'" in text and "[FAIL] check 1 (0/2): wrong 1" in text and "Score: 2/4" in text
    data = render.gradescope(results)
    assert [t["name"] for t in data["tests"]] == ["lab ring: check 0", "lab ring: check 1"] and data["score"] == 2
    render.write_gradebook([results, sample()], tmp_path / "g.csv")
    rows = {row["submission"]: row for row in csv.DictReader(open(tmp_path / "g.csv"))}
    assert rows["points possible"]["lab ring"] == "4" and rows["zoe"]["lab ring"] == "2"
    assert rows["zoe"]["score"] == "" and rows["zoe"]["status"] == "labs only" and rows["alice.py"]["lab ring"] == ""


def test_the_assignment_and_its_labs_render_through_the_same_check_lines(tmp_path):
    results = sample()
    results.labs = {"ring": lab(passed=(True, True))}
    text = render.feedback(results)
    assert text.startswith("alice.py: 100 / 100 points") and "[PASS] check 0 (2/2)" in text
    assert render.gradescope(results)["score"] == 104 and len(render.gradescope(results)["tests"]) == len(CHECKS) + 2
    results.save(tmp_path / "r.json")
    assert Results.load(tmp_path / "r.json") == results and Results.load(tmp_path / "r.json").labs["ring"].passed


def test_a_check_names_its_visibility_from_gradescopes_terms():
    assert Check("x", "x", 1, "after_published").hidden and not Check("x", "x", 1).hidden
    with pytest.raises(ValueError, match="visibility must be one of"):
        Check("x", "x", 1, "secret")
