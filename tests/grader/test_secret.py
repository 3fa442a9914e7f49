"""grader.secret: made once at random, kept 0600 in the grader's configuration, and what the seed depends on."""

import secrets
import stat
from pathlib import Path

import pytest

from grader import secret
from grader.secret import submission_seed

pytestmark = pytest.mark.unit6


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv(secret.SECRET_ENV, raising=False)
    monkeypatch.delenv(secret.SECRET_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "multigpu-course" / "grader-secret"


def test_the_first_use_makes_a_private_random_secret_and_later_uses_keep_it(config):
    assert not config.exists()
    first = secret.load()
    assert config.is_file() and len(first) == 2 * secret.SECRET_BYTES
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    assert secret.load() == first


def test_two_instructors_get_two_secrets(tmp_path, monkeypatch, config):
    first = secret.load()
    monkeypatch.setenv(secret.SECRET_FILE_ENV, str(tmp_path / "other" / "secret"))
    assert secret.load() != first and (tmp_path / "other" / "secret").is_file()


def test_the_environment_overrides_the_file_and_a_readable_file_is_made_private(config, monkeypatch):
    secret.ensure()
    config.chmod(0o644)
    secret.ensure()
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    monkeypatch.setenv(secret.SECRET_ENV, "from-ci")
    assert secret.load() == b"from-ci"


def test_without_creating_a_missing_secret_is_an_error(config):
    with pytest.raises(FileNotFoundError):
        secret.load(create=False)
    assert not config.exists()


def test_the_command_line_makes_it_where_told_and_prints_no_secret(tmp_path, capsys, config):
    target = tmp_path / "autograder" / "grader-secret"
    assert secret.main([str(target)]) == 0
    out = capsys.readouterr().out
    assert str(target) in out and target.read_text().strip() not in out


def test_the_evaluation_seed_depends_on_the_secret(tmp_path, monkeypatch, config):
    script = tmp_path / "train_4gpu.py"
    script.write_text("import torch\n")
    mine = submission_seed(script)
    assert submission_seed(script) == mine
    monkeypatch.setenv(secret.SECRET_FILE_ENV, str(tmp_path / "another-instructor"))
    assert submission_seed(script) != mine


def test_a_secret_being_made_is_never_read_empty(config, monkeypatch):
    """Two graders start at once (``grader grade -j 2``): the second reads the secret while the first is still
    making it. Here the second's read happens inside the first's draw of the secret."""
    draw, seen = secrets.token_hex, []

    def meanwhile(n):
        if not seen:
            seen.append(None)
            seen[0] = secret.load()  # the other grader, before this one has written anything
        return draw(n)

    monkeypatch.setattr(secrets, "token_hex", meanwhile)
    assert secret.load() == seen[0] != b"" and stat.S_IMODE(config.stat().st_mode) == 0o600
