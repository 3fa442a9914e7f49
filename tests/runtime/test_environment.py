"""course.runtime.environment: variables set for a block, and every one restored after it."""

import os

import pytest

from course.runtime.environment import variables


def test_variables_are_set_in_the_block_and_restored_after_even_if_it_raises(monkeypatch):
    monkeypatch.setenv("COURSE_TEST_KEPT", "before")
    monkeypatch.setenv("COURSE_TEST_UNSET", "before")
    monkeypatch.delenv("COURSE_TEST_NEW", raising=False)
    with pytest.raises(ZeroDivisionError), variables({"COURSE_TEST_KEPT": "inside", "COURSE_TEST_NEW": "inside",
                                                      "COURSE_TEST_UNSET": None}):
        assert (os.environ["COURSE_TEST_KEPT"], os.environ["COURSE_TEST_NEW"]) == ("inside", "inside")
        assert "COURSE_TEST_UNSET" not in os.environ
        raise ZeroDivisionError
    assert (os.environ["COURSE_TEST_KEPT"], os.environ["COURSE_TEST_UNSET"]) == ("before", "before")
    assert "COURSE_TEST_NEW" not in os.environ
