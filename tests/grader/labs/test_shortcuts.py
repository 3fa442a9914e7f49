"""grader.labs.shortcuts: a file using a lab's ready-made answer is found, read or run; any other is not."""

import os

import pytest

from course.model_parallel import schedules
from grader.labs import shortcuts

ONE_F_ONE_B = ("course.model_parallel.schedules:one_f_one_b",)


@pytest.mark.parametrize("source", [
    "from course.model_parallel.schedules import one_f_one_b\n",
    "from course.model_parallel.schedules import one_f_one_b as mine\n",
    "from course.model_parallel import schedules\nf = schedules.one_f_one_b\n",
    "from course.model_parallel import schedules as s\nf = s.one_f_one_b\n",
    "import course.model_parallel.schedules as s\nf = s.one_f_one_b\n",
    "import course.model_parallel.schedules\nf = course.model_parallel.schedules.one_f_one_b\n",
])
def test_every_way_of_naming_the_shortcut_is_found(tmp_path, source):
    path = tmp_path / "attempt.py"
    path.write_text(source)
    assert shortcuts.uses(str(path), ONE_F_ONE_B) == ["course.model_parallel.schedules.one_f_one_b"]


@pytest.mark.parametrize("source", [
    "def one_f_one_b(p, m, stage):\n    return []\n",  # the student's own, of the same name
    "from course.model_parallel import schedules\nop = schedules.Op('F', 0)\n",  # another name of the module
    "def f(:\n",  # a syntax error is the rank's to explain
])
def test_a_file_without_the_shortcut_is_not_refused(tmp_path, source):
    path = tmp_path / "attempt.py"
    path.write_text(source)
    assert shortcuts.uses(str(path), ONE_F_ONE_B) == []


def test_the_guard_refuses_a_call_from_the_student_file_only(tmp_path):
    path = tmp_path / "attempt.py"
    path.write_text("import importlib\n\ndef mine():\n    return importlib.import_module("
                    "'course.model_parallel.schedules').one_f_one_b(2, 2, 0)\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    original = schedules.one_f_one_b
    with shortcuts.guarded(str(path), ONE_F_ONE_B, lambda name: f"refused {name}"):
        assert schedules.one_f_one_b(2, 2, 0) == original(2, 2, 0)  # the checker's own call goes through
        with pytest.raises(shortcuts.Refused, match="refused course.model_parallel.schedules.one_f_one_b"):
            namespace["mine"]()
    assert schedules.one_f_one_b is original and os.path.isfile(path)
