"""The instructor's secret: what keeps the grader's evaluation seed unknowable to a student who has the grader.

The evaluation seed (:func:`submission_seed`) is a hash of the submission and this secret: the
grader, the course package and the submission are all public to the student, the secret is not. It is
made once, at random, and kept in the grader's configuration, in a file only its owner can read (mode 0600,
in a 0700 folder)::

    python -m grader.secret [PATH]    # make it if missing (Gradescope's setup.sh does); prints where it is

Where it is: ``$GRADER_SECRET_FILE`` if set, else ``$XDG_CONFIG_HOME/multigpu-course/grader-secret``
(``~/.config/...``). The first ``grader grade`` makes it there if it is missing. ``$GRADER_SECRET``, when
set, is used instead of any file (e.g. a CI secret). Keep the file, and the same secret, for a whole class:
regrading with another secret gives other (equally fair) evaluation data. The graded scripts never receive
it; as root they run as another user (who cannot read the file), as a normal user with namespaces the
sandbox hides the file from them (:mod:`grader.sandbox`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path

SECRET_ENV, SECRET_FILE_ENV = "GRADER_SECRET", "GRADER_SECRET_FILE"
SECRET_BYTES = 32


def secret_path() -> Path:
    """Where the secret is kept: ``$GRADER_SECRET_FILE``, else the user's config folder (see the module doc)."""
    if os.environ.get(SECRET_FILE_ENV):
        return Path(os.environ[SECRET_FILE_ENV]).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "multigpu-course" / "grader-secret"


def ensure(path: Path | None = None) -> Path:
    """Make the secret file at ``path`` (default :func:`secret_path`) if it is missing; return its path.

    A new file gets a random secret, mode 0600; a new folder for it mode 0700. An existing file is kept
    (its secret is the class's), and made 0600 if others could read it.

    Raises:
        OSError: the folder cannot be made or written (say where instead with GRADER_SECRET_FILE).
    """
    path = Path(path) if path is not None else secret_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        # written whole under a private name, then linked into place: two graders starting at once (two
        # threads of `grader grade -j 2`) never read a file the other has made but not yet written
        fd, draft = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(SECRET_BYTES) + "\n")
            with contextlib.suppress(FileExistsError):  # made meanwhile by another: theirs is kept
                os.link(draft, path)
        finally:
            os.unlink(draft)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, 0o600)
    return path


def load(create: bool = True) -> bytes:
    """The secret: ``$GRADER_SECRET`` if set, else the file's content (made first if missing and ``create``).

    Raises:
        FileNotFoundError: no secret file and ``create`` is False.
        ValueError: the file is empty.
    """
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV].encode()
    path = ensure() if create else secret_path()
    secret = path.read_bytes().strip()
    if not secret:
        raise ValueError(f"the grader's secret file {path} is empty: delete it and run `python -m grader.secret` "
                         "to make a new one (grades of a class already graded would change).")
    return secret


def submission_seed(script: Path) -> int:
    """The evaluation seed: from the submission's content, so the student cannot pick it and regrading agrees.

    Mixed with the instructor's secret (:func:`load`: made at random on first use and kept in
    the grader's configuration), so that a student who has the grader cannot compute it.
    """
    secret = load()
    digest = hashlib.sha256(b"multigpu-course grader\0" + secret + b"\0" + script.read_bytes()).digest()
    return int.from_bytes(digest[:4], "big")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1:
        print("usage: python -m grader.secret [PATH]", file=sys.stderr)
        return 2
    path = ensure(Path(argv[0]) if argv else None)
    print(f"the grader's secret is in {path} (mode 0600); keep it for the whole class")
    return 0


if __name__ == "__main__":
    sys.exit(main())
