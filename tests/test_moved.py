"""course._moved: every old import path reaches the module at its new path, with a warning that names it."""

import importlib
import importlib.util
import sys
import warnings

import pytest

from course import _moved

pytestmark = pytest.mark.unit0


def forget(*names: str) -> None:
    """Drop old paths from sys.modules and from the package, so that the next import goes through the finder."""
    import course

    for name in names:
        sys.modules.pop(f"course.{name}", None)
        course.__dict__.pop(name, None)


@pytest.mark.parametrize("old, new", sorted(_moved.MOVED.items()))
def test_every_new_path_is_a_module(old, new):
    assert importlib.util.find_spec(f"course.{new}") is not None, f"course.{old} moved to course.{new}: no such module"


def test_import_old_path_warns_from_the_callers_line_and_is_the_new_module():
    forget("allreduce")
    with pytest.warns(DeprecationWarning, match=r"course\.allreduce moved to course\.collectives\.allreduce") as seen:
        import course.allreduce
    assert seen[0].filename == __file__  # blamed on the student's line: shown in a notebook cell
    assert course.allreduce is importlib.import_module("course.collectives.allreduce")
    assert course.allreduce.__name__ == "course.collectives.allreduce"


def test_from_old_path_import_name():
    forget("allreduce")
    with pytest.warns(DeprecationWarning, match="course.collectives.allreduce"):
        from course.allreduce import ring_allreduce
    from course.collectives.allreduce import ring_allreduce as new

    assert ring_allreduce is new


def test_from_course_import_old_name():
    forget("predict", "allreduce_protocol")
    with pytest.warns(DeprecationWarning, match=r"course\.predict moved to course\.quiz") as seen:
        from course import predict
    assert seen[0].filename == __file__
    from course import quiz

    assert predict is quiz and predict.Question is quiz.Question
    with pytest.warns(DeprecationWarning, match="course.collectives.protocol"):
        from course import allreduce_protocol
    assert allreduce_protocol.__name__ == "course.collectives.protocol"


def test_an_old_module_that_is_a_folder_now_forwards_what_it_defined():
    from course import ddp, monitor
    from course.ddp import internals
    from course.monitor import watch

    with pytest.warns(DeprecationWarning, match=r"course\.ddp\.bucket_report moved to course\.ddp\.internals"):
        assert ddp.bucket_report is internals.bucket_report
    with pytest.warns(DeprecationWarning, match="course.monitor.watch.run_and_watch"):
        assert monitor.run_and_watch is watch.run_and_watch


def test_new_paths_and_unknown_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from course.ddp import buckets  # a submodule of the folder, not a forwarded name
        from course.runtime.launch import launch  # never moved

        assert buckets.__name__ == "course.ddp.buckets" and callable(launch)
        import course

        with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
            course.no_such_module  # noqa: B018
        with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
            course.ddp.no_such_name  # noqa: B018


def test_a_renamed_function_warns_and_forwards():
    from course.monitor import summary_plot

    with pytest.warns(DeprecationWarning, match=r"summary_plot\.report moved to course\.monitor\.summary_plot\.show") \
            as seen:
        assert summary_plot.report is summary_plot.show
    assert seen[0].filename == __file__
