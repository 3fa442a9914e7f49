"""grader.cli without running a rank: output names never collide, --resume keeps exactly what it should.

Every submission here is a bad one (empty, invalid Python), which the grader answers at once, so these
tests take a fraction of a second. The real 4-rank class run is in test_grader_submissions.py.
"""

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from grader import cli, grading
from grader.checks import CHECKS
from grader.gradebook import output_keys
from grader.results import Results

pytestmark = pytest.mark.unit6
POSSIBLE = sum(c.points for c in CHECKS)


def make_class(folder: Path, names: list[str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name in names:
        if name.endswith("/"):
            (folder / name).mkdir()
            (folder / name / "train_4gpu.py").write_text("")  # empty: a bad submission, graded at once
        else:
            (folder / name).write_text("import torch\ndef main(:\n")  # invalid Python
    return folder


def gradebook(out: Path) -> dict[str, dict[str, str]]:
    rows = list(csv.DictReader(open(out / "gradebook.csv")))
    assert rows[0]["submission"] == "points possible"
    return {r["submission"]: r for r in rows[1:]}


def grade(folder: Path, out: Path, *extra: str) -> int:
    return cli.main(["grade", str(folder), "-o", str(out), "-j", "2", *extra])


def test_a_file_and_a_folder_of_the_same_name_keep_their_own_outputs(tmp_path):
    folder = make_class(tmp_path / "class", ["alice.py", "alice/", "bob.py"])
    out = tmp_path / "out"
    assert grade(folder, out) == 0
    assert set(gradebook(out)) == {"alice.py", "alice", "bob.py"}
    assert Results.load(out / "results" / "alice.py.json").submission == "alice.py"
    assert Results.load(out / "results" / "alice.json").submission == "alice"
    assert Results.load(out / "results" / "bob.json").submission == "bob.py"  # no clash: the short name
    assert "not valid Python" in (out / "feedback" / "alice.py.txt").read_text()
    assert "is empty" in (out / "feedback" / "alice.txt").read_text()
    assert (out / "gradescope" / "alice.py" / "results.json").is_file()
    assert (out / "gradescope" / "alice" / "results.json").is_file()


def test_output_keys_are_short_when_unique_and_full_names_otherwise():
    keys = output_keys([Path("alice.py"), Path("alice"), Path("bob.py"), Path("_carol.py")])
    assert keys == {"alice.py": "alice.py", "alice": "alice", "bob.py": "bob", "_carol.py": "_carol"}
    with pytest.raises(ValueError, match="would write the same output files"):
        output_keys([Path("x.py.py"), Path("x.py"), Path("x")])


def test_resume_keeps_clean_results_regrades_grader_errors_and_drops_removed_submissions(tmp_path, monkeypatch):
    folder = make_class(tmp_path / "class", ["alice.py", "bob.py", "carol.py"])
    out = tmp_path / "out"
    real_grade = grading.grade

    def flaky(path, config):
        if path.name == "bob.py":
            raise RuntimeError("the disk was full")
        return real_grade(path, config)

    monkeypatch.setattr(grading, "grade", flaky)
    assert grade(folder, out) == 0
    first = gradebook(out)
    assert first["bob.py"]["status"] == "grader error" and float(first["bob.py"]["max_score"]) == POSSIBLE
    assert "the disk was full" in first["bob.py"]["detail"]

    (folder / "carol.py").unlink()  # withdrawn
    make_class(folder, ["dave.py"])  # late
    calls = []
    monkeypatch.setattr(grading, "grade", lambda path, config: calls.append(path.name) or real_grade(path, config))
    assert grade(folder, out, "--resume") == 0
    assert sorted(calls) == ["bob.py", "dave.py"]  # alice was graded cleanly: kept
    again = gradebook(out)
    assert set(again) == {"alice.py", "bob.py", "dave.py"}
    assert {r["status"] for r in again.values()} == {"bad submission"}
    assert all(float(r["max_score"]) == POSSIBLE for r in again.values())
    assert (out / "results" / "carol.json").is_file()  # nothing deleted, only left out of the gradebook


def test_resume_after_a_name_became_ambiguous_keeps_both(tmp_path):
    folder = make_class(tmp_path / "class", ["alice.py"])
    out = tmp_path / "out"
    assert grade(folder, out) == 0
    make_class(folder, ["alice/"])
    assert grade(folder, out, "--resume") == 0
    assert set(gradebook(out)) == {"alice.py", "alice"}
    assert Results.load(out / "results" / "alice.py.json").submission == "alice.py"
    assert Results.load(out / "results" / "alice.json").submission == "alice"


def test_the_output_folder_inside_the_submissions_is_not_graded(tmp_path, capsys):
    folder = make_class(tmp_path / "class", ["alice.py", "_bob.py", ".DS_Store", "__MACOSX/"])
    out = folder / "graded"
    assert grade(folder, out) == 0
    assert grade(folder, out) == 0  # twice: the first run's outputs are not submissions either
    assert set(gradebook(out)) == {"alice.py", "_bob.py"}
    err = capsys.readouterr().err
    assert "skipped graded (the output folder)" in err and "skipped .DS_Store" in err


def test_the_output_folder_cannot_be_the_submissions_folder(tmp_path, capsys):
    folder = make_class(tmp_path / "class", ["alice.py"])
    assert grade(folder, folder) == 2
    assert "is the submissions folder" in capsys.readouterr().err


def test_a_missing_folder_is_a_clear_error(tmp_path, capsys):
    assert grade(tmp_path / "nowhere", tmp_path / "out") == 2
    assert "is not a folder of submissions" in capsys.readouterr().err


def test_jobs_default_to_two_on_two_cores_and_are_documented(capsys, monkeypatch):
    assert cli.DEFAULT_JOBS == min(2, __import__("os").cpu_count() or 1)
    with pytest.raises(SystemExit):
        cli.main(["grade", "--help"])
    assert "submissions graded at once" in capsys.readouterr().out


def test_gradescope_results_of_a_bad_submission_say_why_once(tmp_path):
    submission = make_class(tmp_path / "submission", [])
    (submission / "train_4gpu.py").write_text("")
    out = tmp_path / "results.json"
    assert cli.main(["gradescope", "--submission", str(submission), "--results", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "is empty" in data["output"] and data["score"] == 0
    assert sum(t["max_score"] for t in data["tests"]) == POSSIBLE
    assert not any("is empty" in t["output"] for t in data["tests"])


def test_render_rebuilds_the_gradebook_for_the_submissions_it_lists_not_withdrawn_ones(tmp_path, capsys):
    folder = make_class(tmp_path / "class", ["alice.py", "bob.py", "carol.py"])
    out = tmp_path / "out"
    assert grade(folder, out) == 0
    (folder / "carol.py").unlink()  # withdrawn, then the class is graded again
    assert grade(folder, out, "--resume") == 0
    assert (out / "results" / "carol.json").is_file()  # kept on disk
    assert cli.main(["render", str(out)]) == 0
    assert set(gradebook(out)) == {"alice.py", "bob.py"}
    assert "2 result(s)" in capsys.readouterr().out

    (out / "results" / "bob.json").write_text("{ not json")  # damaged
    make_class(folder, ["dave.py"])  # submitted, not graded yet
    assert cli.main(["render", str(out), "--submissions", str(folder)]) == 0
    assert set(gradebook(out)) == {"alice.py"}
    err = capsys.readouterr().err
    assert "bob.json (unreadable" in err and "dave.py: no saved result (grade it)" in err

    (out / "gradebook.csv").unlink()
    assert cli.main(["render", str(out)]) == 0  # nothing says which: every readable result
    assert set(gradebook(out)) == {"alice.py", "carol.py"}
    assert "every saved result is included" in capsys.readouterr().err


def test_render_on_a_folder_without_results_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["render", str(tmp_path)]) == 2
    assert "results does not exist" in capsys.readouterr().err


def test_a_submitted_notebook_is_pointed_to_the_script_notebook_06_has_students_write(tmp_path):
    submission = make_class(tmp_path / "submission", [])
    (submission / "train_4gpu.ipynb").write_text("{}")
    out = tmp_path / "results.json"
    assert cli.main(["gradescope", "--submission", str(submission), "--results", str(out)]) == 0
    output = json.loads(out.read_text())["output"]
    notebook = (Path(__file__).resolve().parents[2] / "notebooks" / "06_assignment.ipynb").read_text()
    assert "is a notebook" in output and "runs/train_4gpu.py" in output and "%%writefile" not in output
    assert 'Path(\\"runs/train_4gpu.py\\")' in notebook  # the file the notebook has the student write


def test_an_integrity_violation_stands_out_in_the_gradebook_and_survives_resume_and_render(tmp_path, monkeypatch):
    folder = make_class(tmp_path / "class", ["alice.py", "mallory.py"])
    out = tmp_path / "out"
    real_grade = grading.grade

    def tampering(path, config):
        results = real_grade(path, config)
        if path.name == "mallory.py":  # as if it had run, passed every scored check and replaced torch.save
            checks = [replace(c, ran=True, passed=not c.voids_score, score=0.0 if c.voids_score else c.max_score,
                              message="the submission replaced torch.save" if c.voids_score else "ok")
                      for c in results.checks]
            results = Results(results.submission, "ok", "all ranks finished", checks)
        return results

    monkeypatch.setattr(grading, "grade", tampering)
    assert grade(folder, out) == 0
    for rebuild in (lambda: grade(folder, out, "--resume"), lambda: cli.main(["render", str(out)])):
        row = gradebook(out)["mallory.py"]
        assert (row["status"], float(row["score"]), float(row["raw_score"])) == ("integrity violation", 0, POSSIBLE)
        assert row["detail"].startswith("INTEGRITY VIOLATION: the submission replaced torch.save")
        assert gradebook(out)["alice.py"]["status"] == "bad submission"
        assert rebuild() == 0
    assert "status: integrity violation" in (out / "feedback" / "mallory.txt").read_text()
