"""grader.moved: a submission importing a course module or name that does not exist is told where it lives now,
on the assignment's path (grader.runner) and the labs' (grader.labs.core), never "missing library: course"."""

import re
import sys
from pathlib import Path

import pytest

from grader import moved, runner
from grader.labs.core import describe_error, run_lab

sys.path.insert(0, str(Path(__file__).resolve().parent / "labs"))
import toy_lab  # noqa: E402 - the lab driver's toy lab, beside its tests
from test_status import exits, status  # noqa: E402

pytestmark = pytest.mark.unit6


def test_the_table_is_derived_from_the_course_files_and_finds_every_module_by_its_last_name():
    found = moved.modules()
    assert "course.ddp.scripts" in found and "course.collectives.allreduce" in found and "course" in found
    for module in found:
        last = module.split(".")[-1]
        if module != "course" and [m.split(".")[-1] for m in found].count(last) == 1:
            assert moved.moved_to(f"course.{last}") == [module]  # a module moved up a folder is found
            assert moved.moved_to(f"course.{'_'.join(module.split('.')[1:])}x") == []


@pytest.mark.parametrize(("error", "said"), [
    ("No module named 'course.ddp_scripts'", "course.ddp_scripts does not exist; it moved to course.ddp.scripts"),
    ("No module named 'course.allreduce'", "course.allreduce does not exist; it moved to "
     "course.collectives.allreduce"),
    ("No module named 'course.labs.stubs'", "the lab stubs moved from course.labs.stubs to files, "
     "grader/labs/<lab>/stub.py"),
    ("No module named 'course.labs.stubs.ring_allreduce'", "course.labs.stubs.ring_allreduce does not exist; the "
     "lab stubs moved"),
    ("No module named 'course.nowhere'", "course.nowhere does not exist, and no course module has that name"),
    ("cannot import name 'ring_allreduce' from 'course.world' (/x/course/world.py)",
     "course.world has no ring_allreduce; it lives in course.collectives.allreduce now"),
    ("cannot import name 'no_such_thing' from 'course.world' (/x)", "course.world has no no_such_thing, and no "
     "course module defines it"),
])
def test_a_missing_course_module_or_name_is_explained(error, said):
    assert said in moved.explain(f"Traceback ...\nImportError: {error}")


def test_other_import_errors_are_not_the_courses():
    assert moved.explain("ModuleNotFoundError: No module named 'lightning.pytorch'") is None
    assert moved.explain("ImportError: cannot import name 'x' from 'torch.distributed'") is None


def test_the_assignment_is_told_the_name_that_moved_not_a_missing_library():
    error = "Traceback (most recent call last):\n  File \"train_4gpu.py\", line 3\nModuleNotFoundError: " \
            "No module named 'course.ddp_scripts'"
    got, detail = status(exits({r: (1, error) for r in range(4)}))
    assert got == runner.MISSING_NAME != runner.MISSING_LIBRARY
    assert detail == ("rank 0 could not import from the course: course.ddp_scripts does not exist; it moved to "
                      "course.ddp.scripts: import it from there.")
    assert "library" not in detail


def test_a_labs_rank_error_names_the_moved_module_and_the_line():
    try:
        exec(compile("from course.ddp_scripts import x\n", "/tmp/mine.py", "exec"), {})
    except ImportError as error:
        said = describe_error(error, "/tmp/mine.py", "double", 2)
    assert said == ("your file could not import from the course on rank 2 (line 1 of /tmp/mine.py): "
                    "course.ddp_scripts does not exist; it moved to course.ddp.scripts: import it from there.")


@pytest.mark.timeout(240)
def test_a_lab_file_that_imports_a_moved_name_is_told_where_it_lives(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text("from course.world import ring_allreduce\n\n\ndef double(tensor):\n    return tensor * 2\n")
    result = run_lab(toy_lab.LAB, str(path))
    assert result.failed() == ["doubles", "cross"]
    message = result.checks[0].message  # whichever rank failed first
    assert re.search(rf"could not import from the course on rank [01] \(line 1 of {re.escape(str(path))}\): "
                     "course.world has no ring_allreduce; it lives in course.collectives.allreduce", message), message
