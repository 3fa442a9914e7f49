"""course.practice.pitfalls: each contrast's wrong way shows its consequence and its right way fixes it, checked
against closed forms and against the unsharded model."""

import pytest
import torch

from course.practice import drills, pitfalls
from course.runtime.launch import launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def contrasts():
    with drills.debug_level("INFO"):
        return launch(pitfalls.all_contrasts, 2, timeout_s=240)


@pytest.mark.timeout(400)
def test_unused_parameters_error_names_the_branch_and_the_flag_fixes_it(contrasts):
    for r in contrasts:
        assert "Expected to have finished reduction" in r["unused error"]
        assert "branch.bias, branch.weight" in r["unused error"]
        assert r["unused fixed"].startswith("trained")
        assert set(r["unused cost"]) == {"find_unused_parameters=False", "find_unused_parameters=True"}


@pytest.mark.timeout(400)
def test_same_seed_duplicates_every_crop_and_rank_seeds_do_not(contrasts):
    assert contrasts[0]["seeds"]["same seed"] == 1.0
    assert contrasts[0]["seeds"]["seed + rank"] < 0.5


@pytest.mark.timeout(400)
def test_clipping_norms_against_the_unsharded_model(contrasts):
    full = contrasts[0]["clipping"]["ddp norm"]  # DDP holds the whole averaged gradient: the unsharded model's
    shards = [r["clipping"]["shard norm"] for r in contrasts]
    for r in contrasts:
        assert r["clipping"]["ddp norm"] == pytest.approx(full, rel=1e-6)  # the same on every rank
        assert r["clipping"]["fsdp norm"] == pytest.approx(full, rel=1e-5)  # FSDP's clip: the total norm
    assert sum(s**2 for s in shards) == pytest.approx(full**2, rel=1e-5)  # the shards partition the squares
    assert all(s < full * 0.999 for s in shards)


@pytest.mark.timeout(400)
def test_join_ends_with_the_same_params_and_no_join_times_out(contrasts):
    assert contrasts[0]["join"]["error"] is None and contrasts[1]["join"]["error"] is None
    assert torch.equal(contrasts[0]["join"]["params"], contrasts[1]["join"]["params"])
    assert contrasts[0]["no join"]["error"] is None  # rank 0 has the fewer batches: it finishes
    assert "Timed out" in contrasts[1]["no join"]["error"]
    assert "/__w/" not in contrasts[1]["no join"]["error"]  # gloo's C++ file, not the folder torch was built in


def test_crops_stay_inside_the_image():
    crops = pitfalls._crops(torch.Generator().manual_seed(0), 200, size=32, crop=24)
    assert all(0 <= x <= 8 and 0 <= y <= 8 for x, y in crops)
    assert len(set(crops)) > 40  # 81 corners, 200 draws
