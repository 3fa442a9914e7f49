"""course.model_parallel.sequence_parallel: on 2 ranks the sequence-parallel transformer equals the unsplit model,
swaps each all-reduce for a reduce-scatter and an all-gather, and keeps 1/t of a block's saved activations."""

from collections import Counter

import pytest

from course.model_parallel import sequence_parallel as sp
from course.model_parallel import transformer
from course.runtime.launch import launch

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

CONFIG = transformer.Config(num_layers=2)
WORLD_SIZE = 2


@pytest.fixture(scope="module")
def results():
    return launch(sp.step_on_rank, WORLD_SIZE, CONFIG, 4, timeout_s=180)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_outputs_and_gradients_equal_the_unsplit_model(results):
    for result in results:
        assert result["logits_error"] < 1e-5
        assert max(result["grad_error"].values()) < 1e-5, result["grad_error"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_allreduce_becomes_a_reduce_scatter_and_an_all_gather(results):
    layers = CONFIG.num_layers
    for result in results:
        forward = Counter(c.name for c in result["calls"]["forward"])
        assert forward == {"all_gather_single": 2 * layers + 1, "reduce_scatter_single": 2 * layers}  # +1: the head
        # backward: each reduce-scatter's all-gather, each column-parallel input gathered again, the embedding's
        backward = Counter(c.name for c in result["calls"]["backward"])
        assert backward == {"all_gather_single": 4 * layers + 1, "reduce_scatter_single": 2 * layers}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_block_keeps_one_t_th_of_the_unsplit_activations(results):
    for result in results:
        saved = result["saved_bytes"]
        assert saved["sequence parallel"] * WORLD_SIZE == saved["unsplit"]
        assert saved["sequence parallel"] < saved["tensor parallel"] < saved["unsplit"]
