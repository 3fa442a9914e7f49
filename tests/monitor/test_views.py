"""course.monitor.views: the live panel and the text view, built and updated without a frontend."""

from __future__ import annotations

import os
import re

from histories import history_of

from course.monitor import views as monitor_views
from course.monitor.sampling import History, Reading


def test_sparkline():
    assert monitor_views.sparkline([0, 50, 100, 150]) == " ▄██"
    assert monitor_views.sparkline(range(100), width=5) == "███████"[:5]
    assert len(monitor_views.sparkline([10] * 100, width=40)) == 40


def _blocks(html: str) -> str:
    """The sparkline characters of a view's HTML, tags removed."""
    return re.sub(r"<[^>]+>", "", html)


def test_the_widget_is_built_and_updated_without_a_frontend(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    view = monitor_views.LiveView("process")
    view.update(history_of({0: [100, 250], 1: [30]}))
    assert sorted(view.rows) == [0, 1]
    bar, numbers, spark = view.rows[0]
    assert (bar.value, bar.max) == (100.0, 100.0)  # 2 processes on 2 cores: a core each; 250% fills the bar
    assert "250%" in numbers.value and "MiB" in numbers.value
    assert _blocks(spark.value) == "██"
    assert "Not a GPU measurement" in view.header.value
    assert "NVML" in monitor_views.LiveView("nvml").header.value
    assert len(view.panel.children) == 3  # the header and one row per device


def test_emulated_gpus_are_drawn_against_their_share_of_the_cores_busy_green_idle_grey(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    history = history_of({0: [50, 50], 1: [2, 2], 2: [48, 5], 3: [50, 50]})  # 4 ranks on 2 cores: 50% each at most
    view = monitor_views.LiveView("process")
    view.update(history)
    bar, _, spark = view.rows[0]
    assert (bar.value, bar.max, bar.bar_style) == (50.0, 50.0, "success")
    assert view.rows[1][0].bar_style == ""
    assert _blocks(spark.value) == "██" and _blocks(view.rows[1][2].value) == "  "
    assert spark.value.count("#2a8c3c") == 2 and view.rows[2][2].value.count("#9a9a9a") == 1


def test_a_finished_run_leaves_a_static_summary_that_survives_saving(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    history = history_of({0: [100] * 200, 1: [0] * 100 + [100] * 100})  # 2 ranks on 2 cores: a core each
    html = monitor_views.static_html(history, 12.34)
    assert html.startswith("<div><b>finished after 12.3 s.</b>") and "scaled to 100%" in html
    rows = html.split("<tr>")[1:]
    assert "busy 100% of the time" in rows[0] and "busy 50% of the time" in rows[1]
    assert _blocks(rows[1].split("<code>")[1]) == " " * 30 + "█" * 30  # the whole run in 60 characters
    view = monitor_views.LiveView("process")
    view.show()
    view.finish(history, 12.34, stopped=True)
    assert "stopped after 12.3 s" in view.header.value


def test_the_text_view_says_when_the_run_ended(capsys):
    monitor_views.TextView("process").finish(History(kind="process"), 3.0)
    assert capsys.readouterr().out.splitlines()[-1] == "finished after 3.0 s"


def test_the_text_view_prints_a_line_every_few_seconds(capsys):
    view = monitor_views.TextView("process", every_s=1.0)
    history = History(kind="process")
    for t_s in (0.0, 0.5, 1.0, 1.5):
        history.readings.append(Reading(t_s, 0, 99.0, 2**20))
        view.update(history)
    out = capsys.readouterr().out.splitlines()
    assert "Not a GPU measurement" in out[0]
    assert out[1:] == ["   0.0 s | GPU 0   99%     1 MiB", "   1.0 s | GPU 0   99%     1 MiB"]
