"""course.model_parallel.bubble: the modelled timeline has the closed-form bubble; the exercise checker and the plot."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.model_parallel import bubble as pb


@given(p=st.integers(1, 8), m=st.integers(1, 32), tf=st.floats(0.1, 2), tb=st.floats(0.1, 2))
def test_the_modelled_timeline_has_the_closed_form_bubble(p, m, tf, tb):
    events = pb.modelled_timeline(p, m, tf, tb)
    assert len(events) == 2 * p * m
    assert pb.measured_bubble(events) == pytest.approx(pb.bubble_fraction(p, m), abs=1e-9)
    for stage in range(p):  # a stage never does two things at once
        mine = sorted((e.start, e.end) for e in events if e.stage == stage)
        assert all(end <= start + 1e-12 for (_, end), (start, _) in zip(mine, mine[1:], strict=False))


def test_bubble_fraction_closed_form_and_errors():
    assert pb.bubble_fraction(1, 1) == 0.0
    assert pb.bubble_fraction(4, 1) == pytest.approx(0.75)
    assert pb.bubble_fraction(4, 13) == pytest.approx(3 / 16)
    with pytest.raises(ValueError, match=r"num_micro_batches must be a positive integer number of micro-batches \(m\)"):
        pb.bubble_fraction(2, 0)


def test_bubble_exercise_checker_passes_the_answer_and_fails_wrong_ones(capsys):
    assert pb.check_bubble_exercise(pb.bubble_fraction)
    assert "Correct" in capsys.readouterr().out
    assert not pb.check_bubble_exercise(lambda p, m: (p - 1) / (m + p))  # off by one slot
    assert "Not yet: with 2 stages and 1 micro-batches" in capsys.readouterr().out
    assert not pb.check_bubble_exercise(lambda p, m: (p - 1) / m)
    assert "Not yet: with 2 stages and 1 micro-batches" in capsys.readouterr().out


def test_plot_timeline_draws_one_bar_per_event_and_a_row_per_stage():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = pb.modelled_timeline(3, 2, 1.0, 2.0)
    ax = pb.plot_timeline(events)
    assert len(ax.collections) == len(events)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 0", "stage 1", "stage 2"]
    assert ax.get_title() == f"bubble {pb.bubble_fraction(3, 2):.0%}"
    plt.close(ax.figure)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 8), (8, 32), (3, 5)])
def test_the_two_bubble_conventions_measure_one_idle_time(p, m):
    """Issue 33, item 15: idle / step is (p-1)/(m+p-1), idle / work is (p-1)/m, on the same timeline."""
    events = pb.modelled_timeline(p, m, 1.0, 2.0)
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events) / p
    assert (span - busy) / busy == pytest.approx(pb.bubble_ratio(p, m))
    assert (span - busy) / span == pytest.approx(pb.bubble_fraction(p, m))
    ratio = pb.bubble_ratio(p, m)
    assert pb.bubble_fraction(p, m) == pytest.approx(ratio / (1 + ratio))


def test_an_interleaved_timeline_names_each_bars_chunk():
    import functools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course.model_parallel import schedules

    events = schedules.simulate(functools.partial(schedules.interleaved, chunks=2), 2, 4, 1.0, 2.0)
    ax = pb.plot_timeline(events)
    labels = [t.get_text() for t in ax.texts]
    assert labels == [f"{e.kind}{e.micro_batch}/{e.chunk}" for e in events] and {"F0/0", "F0/1"} <= set(labels)
    hatched = [c for c in ax.collections if c.get_hatch()]  # the later chunks' stripes: white, not the bar's colour
    assert len(hatched) == sum(1 for e in events if e.chunk) and all(
        tuple(c.get_hatchcolor()[0]) == (1.0, 1.0, 1.0, 1.0) for c in hatched)
    plain = pb.plot_timeline(pb.modelled_timeline(2, 2, 1.0, 2.0))
    assert "F0" in [t.get_text() for t in plain.texts] and "/" not in plain.get_legend().get_texts()[0].get_text()
    plt.close("all")
