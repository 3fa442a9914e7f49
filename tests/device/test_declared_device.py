"""The device check itself: a tensor left on the CPU is caught, one on the rank's device is not."""

import pytest
import rank_programs as programs
from declared_device import device_errors, run_ranks


@pytest.mark.parametrize(("program", "said"), [
    (programs.reduce_on_the_cpu, "passed all_reduce a (3,) tensor on cpu, but its device is meta"),
    (programs.mix_devices, "not on the expected device"),
    (programs.ddp_on_the_cpu, "wrapped a model with parameters on cpu in DDP"),
])
def test_a_tensor_on_the_cpu_is_caught_on_every_rank(program, said):
    errors = device_errors(run_ranks(program, 2))
    assert len(errors) == 2 and all(said in error for error in errors), errors


@pytest.mark.parametrize("program", [programs.reduce_on_the_device, programs.ddp_on_the_device])
def test_tensors_on_the_rank_device_pass_and_run_to_the_end(program):
    outcomes = run_ranks(program, 2)
    assert device_errors(outcomes) == [] and [o.stopped for o in outcomes] == ["", ""]
    assert [o.result for o in outcomes] == [outcomes[0].result] * 2  # values read on meta are ones
