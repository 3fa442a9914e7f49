"""course.practice.evaluation: reduced sums give exactly the single-device accuracy; rank 0 alone sees its shard."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.practice import evaluation
from course.runtime.launch import launch


@given(st.integers(0, 500), st.integers(1, 8))
def test_shards_cover_every_sample_once(num_samples, world_size):
    covered = [i for rank in range(world_size) for i in range(num_samples)[evaluation.shard(num_samples, rank,
                                                                                              world_size)]]
    assert covered == list(range(num_samples))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reduced_sums_equal_the_single_device_accuracy():
    ranks = launch(evaluation.evaluate, 2, timeout_s=300)
    reference = evaluation.single_device_accuracy()
    assert [r.samples for r in ranks] == [150, 149]
    for r in ranks:
        assert r.reduced == pytest.approx(reference, abs=1e-12)  # integer counts: exact
    # the mean of the two ranks' accuracies weights each shard alike: the count-weighted mean is the reference
    weighted = (ranks[0].rank_only * 150 + ranks[1].rank_only * 149) / 299
    assert weighted == pytest.approx(reference, abs=1e-12)
    assert ranks[0].mean_of_ranks == pytest.approx((ranks[0].rank_only + ranks[1].rank_only) / 2, abs=1e-12)
