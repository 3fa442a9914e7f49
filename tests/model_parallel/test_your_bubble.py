"""course.model_parallel.your_bubble: the lab file's 1F1B simulated beside the closed form; the stub draws the
course's schedule and says so; a deadlocking schedule is named, not drawn."""

import os

import matplotlib
import pytest

from course.model_parallel import your_bubble
from grader.labs import mistakes

matplotlib.use("Agg")
pytestmark = pytest.mark.unit8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(ROOT, "grader", "labs", "one_f_one_b")


def test_the_solution_bubble_equals_the_closed_form_and_is_drawn_beside_it():
    found = your_bubble.simulate_yours(os.path.join(LAB, "reference.py"), 4, 8)
    assert found.whose == "your one_f_one_b" and found.bubble == pytest.approx(found.closed_form) == 3 / 11
    assert len(your_bubble.plot_yours(found).axes) == 2


def test_the_stub_draws_the_course_schedule_and_a_deadlock_is_named(tmp_path):
    assert "yours is not written yet" in your_bubble.simulate_yours(os.path.join(LAB, "stub.py"), 4, 8).whose
    stuck = your_bubble.simulate_yours(str(mistakes.write("one_f_one_b", "reversed_warmup", tmp_path)), 4, 8)
    assert stuck.bubble is None and "waits" in stuck.deadlock
    your_bubble.plot_yours(stuck)
