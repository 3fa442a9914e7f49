"""grader._moved: every old module path still imports, as the very module at its new path, with a warning naming it."""

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import grader
from grader._moved import MOVED

pytestmark = pytest.mark.unit6
GRADER = Path(grader.__file__).parent


def _import_fresh(statement: str, old: str) -> tuple[dict, list[warnings.WarningMessage]]:
    sys.modules.pop(f"grader.{old}", None)
    if old in vars(grader):
        delattr(grader, old)
    scope: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(statement, scope)
    return scope, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_the_warning_names_the_new_path(old):
    new = importlib.import_module(f"grader.{MOVED[old]}")
    for statement in (f"import grader.{old} as module", f"from grader import {old} as module"):
        scope, caught = _import_fresh(statement, old)
        assert scope["module"] is new, statement
        assert len(caught) == 1 and f"grader.{MOVED[old]}" in str(caught[0].message), statement
        assert caught[0].filename == "<string>", "the warning points at the importing code, not at importlib"
    assert new.__spec__.name == f"grader.{MOVED[old]}", "aliasing must not rename the module at its new path"
    assert not (GRADER / f"{old}.py").exists(), f"grader/{old}.py is back beside its new home"


def test_from_an_old_path_import_a_name():
    _import_fresh("", "records")
    with pytest.warns(DeprecationWarning, match=r"grader\.inrank\.records"):
        from grader.records import parse
    from grader.inrank.records import parse as new_parse
    assert parse is new_parse


def test_a_name_that_never_existed_is_still_an_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("grader.no_such_module")
