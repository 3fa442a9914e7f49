"""course.model_parallel.tensor_parallel: on 2 and 4 ranks the split transformer gives the unsplit model's logits
and gradients, with exactly two all-reduces per block forward and two backward, of B·S·d floats each."""

from collections import Counter

import pytest
import torch

from course.model_parallel import tensor_parallel as tp
from course.model_parallel import transformer
from course.runtime.launch import launch

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

CONFIG = transformer.Config(num_layers=2)
BATCH_SIZE = 4


@pytest.fixture(scope="module", params=[2, 4])
def ranks(request):
    return request.param, launch(tp.step_on_rank, request.param, CONFIG, BATCH_SIZE, timeout_s=180)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_outputs_and_gradients_equal_the_unsplit_model(ranks):
    _, results = ranks
    for result in results:
        assert result["logits_error"] < 1e-5
        assert len(result["grad_error"]) == len(list(transformer.build(CONFIG).parameters()))
        assert max(result["grad_error"].values()) < 1e-5, result["grad_error"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_allreduces_per_layer_each_way_of_one_activation_each(ranks):
    world_size, results = ranks
    activation = BATCH_SIZE * CONFIG.seq_len * CONFIG.d_model * 4
    for result in results:
        for direction in ("forward", "backward"):
            calls = result["calls"][direction]
            expected = tp.ALLREDUCES_PER_LAYER[direction] * CONFIG.num_layers
            assert Counter(call.name for call in calls) == {"all_reduce": expected}
            assert {call.nbytes for call in calls} == {activation}
        total = sum(call.nbytes for d in ("forward", "backward") for call in result["calls"][d])
        assert total == CONFIG.num_layers * tp.allreduce_bytes_per_layer(BATCH_SIZE, CONFIG.seq_len, CONFIG.d_model)


def test_shards_must_split_evenly():
    with pytest.raises(ValueError, match="do not split evenly over 3 ranks"):
        tp._shard_index(64, 0, 3)
    index = torch.cat([tp._shard_index(12, r, 2, blocks=3) for r in range(2)])
    assert sorted(index.tolist()) == list(range(12))  # the ranks' q, k and v rows cover every row once
    assert tp._shard_index(12, 1, 2, blocks=3).tolist() == [2, 3, 6, 7, 10, 11]
