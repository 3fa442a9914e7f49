"""course.perf.figures: at least 40 published figures, each sourced, with a setup that splits, and a split that
follows the rule (by source, hashed), never a choice."""

import hashlib

import pytest

from course.perf import catalog, figures

pytestmark = pytest.mark.unit5


def test_at_least_forty_figures_from_sources_on_both_sides():
    assert len(figures.FIGURES) >= 40
    by_split = {split: {f.source for f in figures.of_split(split)} for split in figures.SPLITS}
    assert all(by_split.values()) and not by_split["fit"] & by_split["test"]
    assert len(figures.of_split("fit")) + len(figures.of_split("test")) == len(figures.FIGURES)


def test_every_figure_carries_the_split_its_source_hashes_to():
    for figure in figures.FIGURES:
        odd = hashlib.sha256(figure.source.encode()).digest()[0] % 2
        assert figure.split == ("test" if odd else "fit") == figures.split_of(figure.source), figure.label


def test_every_figure_is_sourced_and_its_setup_splits():
    sources = {s.key: s for s in figures.SOURCES}
    for f in figures.FIGURES:
        assert f.source in sources and sources[f.source].citation and f.where, f.label
        assert f.metric in figures.METRICS and f.value > 0, f.label
        catalog.gpu(f.gpu), catalog.link(f.network)
        assert f.gpus == f.tensor * f.context * f.pipeline * f.data, f.label
        assert f.global_batch % (f.data * f.microbatch) == 0, f.label
        assert f.model.seq % f.context == 0 and (not f.stage_layers or sum(f.stage_layers) == f.model.layers)
    assert any(f.context > 1 for f in figures.FIGURES)  # the record type takes context (and expert) parallelism


def test_a_source_not_listed_is_refused_by_name():
    with pytest.raises(KeyError, match="narayanan2021"):
        figures.split_of("my-favourite-blog")
    with pytest.raises(ValueError, match="split"):
        figures.of_split("validation")
