"""course.model_parallel.mesh: the grid's rows and columns cover every rank once; on 4 ranks, TP x DP with groups
built by dist.new_group gives one device's gradients on the whole batch."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.model_parallel import mesh, transformer
from course.runtime.launch import launch

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

CONFIG = transformer.Config(num_layers=2)


@given(st.integers(1, 4), st.integers(1, 4))
def test_every_rank_is_in_one_row_and_one_column(tp_size, dp_size):
    rows, columns = mesh.grid(tp_size * dp_size, tp_size)
    assert sorted(r for row in rows for r in row) == sorted(r for col in columns for r in col) == list(
        range(tp_size * dp_size))
    assert all(len(row) == tp_size for row in rows) and all(len(col) == dp_size for col in columns)
    assert all(len(set(row) & set(col)) == 1 for row in rows for col in columns)


def test_a_tensor_parallel_size_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match=r"tp_size=3 must divide world_size=4.*\[1, 2, 4\]"):
        mesh.grid(4, 3)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp_times_dp_gives_one_devices_gradients():
    results = launch(mesh.step_on_rank, 4, CONFIG, 2, 8, timeout_s=180)
    assert [r["tp_ranks"] for r in results] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [r["dp_ranks"] for r in results] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    parameters = len(list(transformer.build(CONFIG).parameters()))
    for result in results:
        assert max(result["grad_error"].values()) < 1e-5
        assert result["allreduces"] == {"tensor parallel": 4 * CONFIG.num_layers, "data parallel": parameters}
