"""The labs' wrong attempts for their tests: a planted mistake (grader/labs/<lab>/mistakes.py) written into
tmp_path, or one of the few attempts kept as files in attempts/ (its README says which and why)."""

from collections.abc import Callable
from pathlib import Path

import pytest

from grader.labs import mistakes

ATTEMPTS = Path(__file__).resolve().parent / "attempts"


@pytest.fixture
def planted(tmp_path: Path) -> Callable[[str, str], str]:
    """``planted(lab, name)``: the path of ``lab``'s wrong attempt ``name``, as a file a check can run."""

    def path(lab: str, name: str) -> str:
        if name in mistakes.mistakes(lab):
            return str(mistakes.write(lab, name, tmp_path))
        kept = ATTEMPTS / f"{lab}_{name}.py"
        if not kept.is_file():
            raise FileNotFoundError(f"{lab} has no planted mistake {name!r} and no file {kept}")
        return str(kept)

    return path
