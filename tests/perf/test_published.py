"""course.perf.published: calibration apart from validation, and the prediction rows within their band."""

import dataclasses

import pytest

from course.perf import microbench, parallel, published
from course.perf import model as pm

pytestmark = pytest.mark.unit5

ROWS = published.validation_table()
PREDICTIONS = [row for row in ROWS if row.kind == "prediction"]
#: Published figures the model misses by more than 20%, kept in the table (not dropped) and named here so a change
#: that fixes or breaks one is seen. VGG-16's large convolutions run faster than the one convolution efficiency
#: fitted on ResNet-50 says, so its communication hides too well; the parameter-server figure is "about half";
#: the NVIDIA rows show the one convolution efficiency (fitted on a 2016 M40 figure) missing newer GPUs and
#: software in both directions.
KNOWN_MISSES = {"Horovod, VGG-16 on 512 GPUs over 25 Gbit/s RoCE (scaling efficiency)",
                "TensorFlow parameter servers, ResNet-101 on 128 GPUs (scaling efficiency)",
                "ResNet-50 on 8 A100 (DGX A100), tf32 (images/s)", "ResNet-50 on 1 V100 (DGX-1V), fp32 (images/s)",
                "ResNet-50 on 1 V100 (DGX-1V), amp (images/s)", "ResNet-50 on 8 V100 (DGX-1V), fp32 (images/s)"}


def test_rows_are_labelled_and_sourced():
    assert {row.kind for row in ROWS} == set(published.KINDS)
    for row in ROWS:
        assert row.source and row.assumed and row.published > 0, row.claim


def test_at_least_twelve_predictions_within_20_percent_and_a_small_bias():
    summary = published.summary(ROWS)
    assert summary["predictions"] >= 12 and summary["within"] >= 12
    assert abs(summary["bias"]) <= 0.08, published.format_table(ROWS)
    assert {row.claim for row in PREDICTIONS if abs(row.error) > 0.2} == KNOWN_MISSES


def test_calibration_rows_agree_by_construction_and_the_frozen_constant_is_the_fit():
    for row in (r for r in ROWS if r.kind == "calibration"):
        assert abs(row.error) < 0.01, row.claim
    assert published.conv_efficiency() == pytest.approx(microbench.CONV_EFFICIENCY, abs=0.002)


def test_no_row_can_carry_a_knob():
    # the software's setup is all a row may state: no efficiency, latency or overlap switch exists to set
    fields = {f.name for f in dataclasses.fields(pm.Assumptions)} | {f.name for f in dataclasses.fields(parallel.Plan)}
    assert not {name for name in fields if any(word in name for word in ("efficien", "alpha", "latency", "overlap"))}
    for figure in microbench.FIGURES:
        assert figure.assumed or "http" in figure.source, figure.fits


def test_table_prints_signed_errors_and_the_bias():
    text = published.format_table(ROWS)
    assert "prediction rows:" in text and "bias" in text and "largest error" in text
    assert all(f"{row.error:+.0%}" in text for row in ROWS)
    assert "16,621" in text  # large figures print whole, not as 1.66e+04
