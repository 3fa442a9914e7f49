"""The performance model reproduces every published figure of its validation table within 15%."""

import pytest

from course.perf import published

ROWS = published.validation_table()


def test_at_least_eight_published_figures_from_several_sources():
    assert len(ROWS) >= 8
    assert len({row.source.split(",")[0] for row in ROWS}) >= 6


@pytest.mark.parametrize("row", ROWS, ids=[row.claim[:40] for row in ROWS])
def test_each_row_within_15_percent(row):
    assert 0.85 <= row.ratio <= 1.15, published.format_table([row])


def test_every_row_states_its_source_and_assumptions():
    for row in ROWS:
        assert row.source and row.assumed and row.published > 0


def test_table_prints_every_row():
    text = published.format_table(ROWS)
    assert all(row.source in text for row in ROWS)
