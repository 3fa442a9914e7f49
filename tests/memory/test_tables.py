"""course.memory.tables: the notebook's tables show the numbers they were given, and the rows are real runs."""

import pytest
import torch

from course.memory import tables as memory_report
from course.models import MLP


def test_model_states_rows_compare_every_optimizer_and_precision():
    rows = memory_report.model_states_rows(MLP, torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,)))
    assert {(r["optimizer"], r["precision"]) for r in rows} == {(o, p) for o in ("sgd", "momentum", "adam")
                                                                for p in ("fp32", "bf16")}
    assert all(r["estimate"] == r["measured"] for r in rows)
    assert "16.00" in memory_report.format_model_states(rows)  # Adam: 16 bytes per parameter in both precisions


def test_zero_paper_rows_are_within_ten_percent():
    for _, estimate, published in memory_report.zero_paper_rows():
        assert estimate == pytest.approx(published, rel=0.10)


def test_format_sharding_shows_each_rank():
    rank = {"optimizer_state": 123, "owned_optimizer_state": 123, "ideal_optimizer_state": 100, "max_diff": 0.0,
            "parameters": 456, "chunk_parameters": 456, "ideal_parameters": 450}
    text = memory_report.format_sharding([{"zero1": rank, "fsdp": rank}] * 2)
    assert len(text.splitlines()) == 3 and "123" in text and "456" in text


def test_format_zero2_shows_each_rank():
    rank = {"parameters_after_forward": 4000, "ideal_parameters": 4000, "gradients": 1001, "ideal_gradients": 1000,
            "optimizer_state": 2002, "ideal_optimizer_state": 2000, "max_diff": 0.0}
    text = memory_report.format_zero2([{"zero2": rank, "fsdp": {**rank, "parameters_after_forward": 1002}}] * 2)
    assert len(text.splitlines()) == 3 and "4,000" in text and "1,001" in text and "1,002" in text
