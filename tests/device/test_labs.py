"""Every lab's checker, run on its reference solution, keeps its tensors on the rank's device (``declared_device``),
and hands the cross-check evidence back on the CPU."""

import pytest
import torch
from declared_device import device_errors, run_ranks

from grader.labs import registry
from grader.labs.core import reference_path


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


@pytest.mark.parametrize("name", sorted(registry.LABS))
def test_a_lab_checker_on_its_solution_stays_on_the_rank_device(name):
    lab = registry.LABS[name]
    config = lab.runs[0]
    outcomes = run_ranks(lab.rank_check, config["world_size"], str(reference_path(lab)), config)
    assert not device_errors(outcomes), "\n".join(device_errors(outcomes))
    assert [o.stopped for o in outcomes] == [""] * config["world_size"]
    evidence = [t for o in outcomes for t in _tensors(getattr(o.result, "evidence", {}))]
    assert all(t.device.type == "cpu" for t in evidence), "evidence for the cross-check must come back on the CPU"
