"""course.world: GPUs found or emulated, world sizes checked, torchrun's environment read."""

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from course import world

pytestmark = pytest.mark.unit0

EMULATED = world.Hardware(gpu_names=(), cpu_count=2)
TWO_GPUS = world.Hardware(gpu_names=("A100", "A100"), cpu_count=32)


def test_emulated_hardware_uses_gloo_and_cpu():
    assert EMULATED.emulated and EMULATED.backend == "gloo"
    assert world.device_for(3, EMULATED) == torch.device("cpu")
    assert "4 emulated GPUs: 4 CPU processes on the gloo backend" in EMULATED.describe(4)


def test_real_gpus_use_nccl_and_the_local_rank_device():
    assert not TWO_GPUS.emulated and TWO_GPUS.backend == "nccl"
    assert world.device_for(1, TWO_GPUS) == torch.device("cuda", 1)  # outside a launch: one rank per GPU
    assert "2 real GPUs on the nccl backend" in TWO_GPUS.describe(2)


def test_course_emulate_hides_gpus(monkeypatch):
    monkeypatch.setenv(world.EMULATE_ENV, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert world.detect_hardware().emulated


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", None, True])
def test_bad_world_sizes_say_what_was_wrong(bad):
    with pytest.raises(ValueError, match=r"world_size must be a positive integer number of ranks, got"):
        world.check_world_size(bad, EMULATED)


@pytest.mark.parametrize("good", [np.int64(3), np.uint8(3), 3])
def test_numpy_integers_are_world_sizes(good):
    checked = world.check_world_size(good, EMULATED)
    assert checked == 3 and type(checked) is int


@pytest.mark.parametrize("bad", [np.bool_(True), np.float64(3.0), np.int64(0)])
def test_numpy_non_integers_and_zero_are_refused(bad):
    with pytest.raises(ValueError, match=r"world_size must be a positive integer number of ranks, got"):
        world.check_world_size(bad, EMULATED)


ONE_GPU = world.Hardware(gpu_names=("H100",), cpu_count=16)


@pytest.mark.parametrize("hardware", [ONE_GPU, TWO_GPUS], ids=["1 GPU", "2 GPUs"])
def test_more_ranks_than_gpus_run_emulated_and_say_so(hardware):
    assert world.check_world_size(4, hardware) == 4
    assert not hardware.on_gpus(4) and hardware.backend_for(4) == "gloo"
    assert world.device_for(3, hardware, local_world_size=4) == torch.device("cpu")
    said = hardware.describe(4)
    assert "4 emulated GPUs" in said and f"{hardware.gpu_count} GPU(s) are not used" in said
    assert "timings are CPU timings" in said


def test_one_gpu_per_rank_is_nccl_on_the_rank_gpu():
    assert world.check_world_size(2, TWO_GPUS) == 2 and TWO_GPUS.backend_for(2) == "nccl"
    assert world.device_for(1, TWO_GPUS, local_world_size=2) == torch.device("cuda", 1)


def test_too_many_emulated_ranks_are_refused():
    assert world.check_world_size(world.MAX_EMULATED_WORLD_SIZE, EMULATED) == world.MAX_EMULATED_WORLD_SIZE
    with pytest.raises(ValueError, match="use at most"):
        world.check_world_size(world.MAX_EMULATED_WORLD_SIZE + 1, EMULATED)


def test_init_from_env_without_torchrun_explains_how_to_launch(monkeypatch):
    for name in world.TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node=4"):
        world.init_from_env()


def _torchrun_env(monkeypatch, local_rank: int, local_world_size: int) -> None:
    for name, value in dict(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(local_world_size),
                            LOCAL_WORLD_SIZE=str(local_world_size), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)


def test_more_ranks_per_node_than_gpus_run_emulated_without_touching_cuda(monkeypatch):
    # torchrun --nproc_per_node=4 on a 2-GPU node: rank 3 would get CUDA's bare "invalid device ordinal".
    monkeypatch.setattr(world, "detect_hardware", lambda: TWO_GPUS)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail(f"set_device({device}) was called"))
    calls = []
    monkeypatch.setattr(world.dist, "init_process_group", lambda backend, timeout: calls.append(backend))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(("threads", n)))
    _torchrun_env(monkeypatch, local_rank=3, local_world_size=4)
    world.init_from_env()
    assert calls == [("threads", 8), "gloo"]


def test_a_local_rank_with_a_gpu_gets_that_gpu_and_nccl(monkeypatch):
    monkeypatch.setattr(world, "detect_hardware", lambda: TWO_GPUS)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(world.dist, "init_process_group", lambda backend, timeout: calls.append(("init", backend)))
    _torchrun_env(monkeypatch, local_rank=1, local_world_size=2)
    world.init_from_env()
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl")]


@contextlib.contextmanager
def one_rank_group(monkeypatch):
    """torchrun's environment for a world of one, the group joined inside, left (and torch's threads restored)
    after."""
    from course.runtime.ports import reserved_port

    monkeypatch.setenv(world.EMULATE_ENV, "1")
    threads = torch.get_num_threads()
    with reserved_port() as port:
        for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(port)).items():
            monkeypatch.setenv(name, value)
        try:
            yield world.init_from_env(timeout_s=30)
        finally:
            world.shutdown()
            torch.set_num_threads(threads)


def test_init_from_env_joins_a_one_rank_group(monkeypatch):
    with one_rank_group(monkeypatch) as me:
        assert (me.rank, me.world_size, me.backend, me.device, me.is_main) == (0, 1, "gloo", torch.device("cpu"), True)
        assert world.current() == me
    assert world.current().world_size == 1  # outside a group: rank 0 of 1


def test_versions_are_those_the_libraries_report_themselves():
    import platform

    import ipywidgets
    import jupyterlab
    import numpy
    import psutil
    import sklearn

    found = world.versions()
    modules = {"torch": torch, "numpy": numpy, "scikit-learn": sklearn, "jupyterlab": jupyterlab,
               "ipywidgets": ipywidgets, "psutil": psutil}
    assert {name: found[name] for name in modules} == {name: m.__version__ for name, m in modules.items()}
    assert found["python"] == platform.python_version()
    assert found["nvidia-ml-py"][0].isdigit()  # the pynvml module carries no version of its own
    assert found["gloo"] == str(torch.distributed.is_gloo_available())


def test_a_missing_library_is_reported_not_raised(monkeypatch):
    real = world.importlib.metadata.version

    def version(name):
        if name == "ipywidgets":
            raise world.importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(world.importlib.metadata, "version", version)
    assert world.versions()["ipywidgets"] == "not installed"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_torchrun_script_joins_the_group_and_prints_once(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("torchrun_hello.py")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", str(script)],
        capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines().count("world_size=3 backend=gloo sum=3") == 1


def test_shutdown_frees_the_groups_a_module_cached(monkeypatch):
    """A group a cache keeps past shutdown would keep gloo's threads alive into interpreter exit (world.shutdown)."""
    from course.collectives import shm_allreduce, shm_group

    with one_rank_group(monkeypatch):
        assert shm_allreduce.shm_allreduce(torch.ones(5)).tolist() == [1.0] * 5
        assert shm_group._groups, "the shared-memory allreduce keeps its group's mapping between calls"
    assert not shm_group._groups


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("gpus", [1, 2])
def test_four_ranks_on_fewer_gpus_launch_emulated_and_say_so(monkeypatch, capsys, gpus):
    from course.hello import hello
    from course.runtime.launch import launch

    simulated = world.Hardware(gpu_names=("Simulated H100",) * gpus, cpu_count=2)
    monkeypatch.setattr(world, "detect_hardware", lambda: simulated)
    reports = launch(hello, 4, timeout_s=180)
    assert [(r["rank"], r["backend"], r["device"]) for r in reports] == [(rank, "gloo", "cpu") for rank in range(4)]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("launch: 4 emulated GPUs") and f"This machine's {gpus} GPU(s) are not used" in first


def _machine(gpus: int) -> world.Hardware:
    return world.Hardware(gpu_names=("Tesla T4",) * gpus, cpu_count=4)


# GPUs here -> (world size, backend) that a 4-rank lesson runs at, for the sizes it allows
PLANS = {
    None: {0: (4, "gloo"), 1: (4, "gloo"), 2: (2, "nccl"), 3: (3, "nccl"), 4: (4, "nccl"), 8: (4, "nccl")},
    (2, 4): {0: (4, "gloo"), 1: (4, "gloo"), 2: (2, "nccl"), 3: (2, "nccl"), 4: (4, "nccl"), 8: (4, "nccl")},
    (4,): {0: (4, "gloo"), 1: (4, "gloo"), 2: (4, "gloo"), 3: (4, "gloo"), 4: (4, "nccl"), 8: (4, "nccl")},
}


@pytest.mark.parametrize("sizes", list(PLANS), ids=["any size", "2 or 4", "4 only"])
@pytest.mark.parametrize("gpus", [0, 1, 2, 3, 4, 8])
def test_plan_runs_a_four_rank_lesson_on_as_many_gpus_as_it_allows(gpus, sizes):
    chosen = world.plan(4, sizes, _machine(gpus))
    assert (chosen.world_size, chosen.backend) == PLANS[sizes][gpus]
    cuda = [f"cuda:{rank}" for rank in range(chosen.world_size)]
    assert list(chosen.devices) == (cuda if chosen.on_gpus else ["cpu"] * 4)
    assert chosen.label == f"{chosen.world_size} {'GPUs' if chosen.on_gpus else 'emulated GPUs'}"
    # the ranks that launch() starts take the same devices and backend (course.world.init_from_env reads these)
    machine = _machine(gpus)
    assert machine.backend_for(chosen.world_size) == chosen.backend
    assert [str(world.device_for(r, machine, chosen.world_size)) for r in range(chosen.world_size)] == \
        list(chosen.devices)


@pytest.mark.parametrize(("gpus", "said"), [
    (0, "4 emulated GPUs: 4 CPU processes on the gloo backend, sharing 4 CPU core(s). Timings here are CPU timings"),
    (1, "This machine's 1 GPU(s) are not used: nccl needs one GPU per rank, so 4 ranks run emulated."),
    (2, "4 ranks asked, 2 GPUs here: running 2 ranks on NCCL, one GPU each (Tesla T4, Tesla T4)."),
    (3, "4 ranks asked, 3 GPUs here: running 3 ranks on NCCL, one GPU each (Tesla T4, Tesla T4, Tesla T4)."),
    (4, "4 real GPUs on the nccl backend (Tesla T4, Tesla T4, Tesla T4, Tesla T4)."),
    (8, "4 real GPUs on the nccl backend (Tesla T4, Tesla T4, Tesla T4, Tesla T4)."),
])
def test_plan_says_what_it_chose(gpus, said):
    assert said in world.plan(4, hardware=_machine(gpus)).sentence


def test_a_lesson_that_needs_four_ranks_says_why_two_gpus_are_not_used():
    said = world.plan(4, (4,), _machine(2)).sentence
    assert "This machine's 2 GPU(s) are not used" in said and "This lesson runs at 4 ranks." in said


@given(asked=st.integers(1, 16), gpus=st.integers(0, 16),
       sizes=st.none() | st.lists(st.integers(1, 16), min_size=1, max_size=4).map(tuple))
def test_a_plan_is_one_gpu_per_rank_on_nccl_or_the_asked_ranks_on_gloo(asked, gpus, sizes):
    chosen = world.plan(asked, sizes, _machine(gpus))
    if chosen.on_gpus:
        assert chosen.world_size <= min(asked, gpus) and len(set(chosen.devices)) == chosen.world_size
        assert chosen.world_size == asked or (chosen.world_size >= 2 and (sizes is None or chosen.world_size in sizes))
    else:
        assert chosen.world_size == asked and set(chosen.devices) == {"cpu"} and chosen.backend == "gloo"
        assert gpus < asked  # asked GPUs or more always run on them


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4"])
def test_plan_refuses_a_bad_rank_count(bad):
    with pytest.raises(ValueError, match="asked must be a positive integer number of ranks, got"):
        world.plan(bad, hardware=_machine(2))
