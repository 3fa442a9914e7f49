"""grader.submission.submitter_ids: who a submission is from, as Gradescope's metadata or a class folder says."""

import json

from grader.submission import submitter_ids


def test_a_class_folders_submission_is_from_its_name(tmp_path):
    (tmp_path / "alice").mkdir()
    (tmp_path / "bob.py").write_text("print('hi')\n")
    assert submitter_ids(tmp_path / "alice") == ("alice",)
    assert submitter_ids(tmp_path / "bob.py") == ("bob",)


def test_gradescopes_metadata_gives_every_submitters_id_email_and_login(tmp_path):
    metadata = tmp_path / "submission_metadata.json"
    metadata.write_text(json.dumps({"users": [
        {"email": "ada@uni.edu", "id": 1, "name": "Ada", "sid": "12345"},
        {"email": "bo@uni.edu", "id": 2, "name": "Bo", "sid": ""},
    ]}))
    assert submitter_ids(tmp_path / "submission", metadata) == ("12345", "ada@uni.edu", "ada", "bo@uni.edu", "bo")


def test_missing_or_broken_metadata_knows_nobody(tmp_path):
    assert submitter_ids(tmp_path / "submission", tmp_path / "absent.json") == ()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert submitter_ids(tmp_path / "submission", broken) == ()
    broken.write_text('["a list"]')
    assert submitter_ids(tmp_path / "submission", broken) == ()
