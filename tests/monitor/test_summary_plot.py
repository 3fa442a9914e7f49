"""course.monitor.summary_plot: the text summary of a history, and its timeline."""

from __future__ import annotations

import matplotlib
from histories import history_of

from course.monitor import summary_plot

matplotlib.use("Agg")


def test_the_summary_has_a_line_per_device_saying_what_was_measured():
    history = history_of({0: [100, 80, 20, 0], 1: [0, 0, 0, 10]})
    text = summary_plot.format_summary(history, threshold=50)
    assert text.startswith("Emulated GPUs: CPU%")
    assert "device 0: mean 50%, busy (>= 50%) 50% of 4 readings, peak memory 0 MiB" in text
    assert "device 1: mean 2%" in text  # 2.5 rounds half to even


def test_the_summary_says_when_no_device_was_seen():
    text = summary_plot.format_summary(history_of({}))
    assert text.splitlines()[-1].startswith("no device was seen")


def test_the_timeline_has_a_row_per_device():
    import matplotlib.pyplot as plt

    fig = summary_plot.plot_timeline(history_of({0: [100, 0], 1: [0, 0], 2: [5, 5]}))
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel() == "GPU 2"
    plt.close(fig)
