"""course.ddp.scripts: the step scripts and their diffs, each step's concept, and torchrun running them."""

import importlib.util
import subprocess
import sys
import threading
from types import SimpleNamespace

import psutil
import pytest
import torch
from processes import live_children
from torch.utils.data import DataLoader, TensorDataset

from course import world
from course.ddp import scripts as ddp_scripts
from course.models import DigitsCNN


def test_step_scripts_are_numbered_in_order_and_each_step_changes_something():
    scripts = ddp_scripts.step_scripts()
    assert [int(p.name[4]) for p in scripts] == list(range(len(scripts)))
    assert scripts[0].name == "step0_single_device.py" and len(scripts) == 8
    for before, after in zip(scripts, scripts[1:], strict=False):
        diff = ddp_scripts.step_diff(before, after)
        assert diff.startswith(f"--- {before.name}\n+++ {after.name}\n")
        assert any(line.startswith("+") and not line.startswith("+++") for line in diff.splitlines())


@pytest.mark.parametrize("fragment, step", [
    ("world.init_from_env()", 1), ("sampler.set_epoch(epoch)", 2), ("DistributedDataParallel(model", 3),
    ("global_batch_size / args.base_batch_size", 4), ("if rank.is_main:", 5), ("dist.all_reduce(totals)", 6),
    ("world.shutdown()", 7),
])
def test_each_step_introduces_its_concept(fragment, step):
    scripts = ddp_scripts.step_scripts()
    assert fragment not in scripts[step - 1].read_text()
    assert fragment in scripts[step].read_text()
    diff = ddp_scripts.step_diff(scripts[step - 1], scripts[step])
    added = [line for line in diff.splitlines() if line.startswith("+")]
    assert any(fragment in line for line in added)


def test_step_scripts_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="no step<N>_<name>.py scripts"):
        ddp_scripts.step_scripts(tmp_path)


def test_torchrun_commands_for_one_and_several_nodes():
    single = ddp_scripts.torchrun_command("train.py", 4, ("--epochs", "2"))
    assert single == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                      "train.py", "--epochs", "2"]
    multi = ddp_scripts.torchrun_command("train.py", 8, nnodes=2, rdzv_endpoint="10.0.0.1:29500")
    assert "--nnodes=2" in multi and "--rdzv_backend=c10d" in multi and "--rdzv_endpoint=10.0.0.1:29500" in multi
    assert not any(part.startswith("--node_rank") for part in multi)  # c10d rendezvous assigns node ranks
    pinned = ddp_scripts.torchrun_command("train.py", 8, nnodes=2, node_rank=1, local_addr="10.0.0.2")
    assert "--node_rank=1" in pinned and "--local_addr=10.0.0.2" in pinned
    assert "--rdzv_backend=c10d" in multi and "--standalone" not in multi


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_final_step_trains_and_checkpoints_once_under_torchrun(tmp_path):
    done = ddp_scripts.run_torchrun(ddp_scripts.step_scripts()[-1], 2, ("--out-dir", str(tmp_path), "--epochs", "4"),
                            timeout_s=220)
    lines = done.stdout.splitlines()
    assert lines[0] == "2 rank(s), global batch 64, lr 0.1"
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 4  # rank 0 alone logs
    accuracy = float(epochs[-1].rsplit(" ", 1)[1])
    assert accuracy > 0.5
    assert sum("saved checkpoint" in line for line in lines) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    model = DigitsCNN()
    model.load_state_dict(torch.load(tmp_path / "checkpoint.pt"))  # no "module." prefix: saved unwrapped


class _ValLoaderBuilt(Exception):
    pass


@pytest.mark.parametrize("step", [6, 7])
def test_metric_steps_count_every_validation_sample_exactly_once(step, monkeypatch):
    # Run the script's own run() up to its validation DataLoader on each of 8 ranks (300 samples: 8 does not
    # divide 300, so DistributedSampler would pad with 4 repeats), and collect the samples each rank evaluates.
    path = ddp_scripts.step_scripts()[step]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    val = TensorDataset(torch.arange(300))
    monkeypatch.setattr(script.data, "load", lambda: SimpleNamespace(train=TensorDataset(torch.arange(1000)), val=val))
    seen = []

    def loader(dataset, batch_size=1, sampler=None, **kwargs):
        if dataset is val or getattr(dataset, "dataset", None) is val:  # the validation loader: record, stop
            for (batch,) in DataLoader(dataset, batch_size=batch_size, sampler=sampler):
                seen.extend(batch.tolist())
            raise _ValLoaderBuilt
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)

    monkeypatch.setattr(script, "DataLoader", loader)
    args = SimpleNamespace(epochs=1, batch_size=32, lr=0.05, base_batch_size=32, warmup_steps=10, out_dir=None)
    for rank in range(8):
        with pytest.raises(_ValLoaderBuilt):
            script.run(args, world.Rank(rank, rank, 8, torch.device("cpu"), "gloo"))
    assert sorted(seen) == list(range(300))


def test_a_failing_script_reports_its_output(tmp_path):
    script = tmp_path / "step0_broken.py"
    script.write_text("raise SystemExit('deliberately broken')\n")
    with pytest.raises(RuntimeError, match="(?s)exit code 1.*deliberately broken"):
        ddp_scripts.run_torchrun(script, 1, timeout_s=120)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_rank_that_raises_in_the_final_step_ends_the_run_promptly_with_its_error(tmp_path):
    # Rank 1 fails before DDP's first collective; the other rank waits there. Without a barrier on the failure
    # path rank 1 leaves at once, torchrun stops rank 0 and reports rank 1's error (a barrier would hang).
    script = tmp_path / "step7_rank1_fails.py"
    script.write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('step7', {str(ddp_scripts.step_scripts()[-1])!r})\n"
        "step7 = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(step7)\n"
        "def run(args, rank):\n"
        "    if rank.rank == 1:\n"
        "        raise RuntimeError('rank 1 fails on purpose')\n"
        "    real_run(args, rank)\n"
        "step7.run, real_run = run, step7.run\n"
        "sys.argv[1:] = ['--out-dir', sys.argv[1], '--epochs', '1']\n"
        "step7.main()\n"
    )
    with pytest.raises(RuntimeError, match="(?s)exit code 1: rank 1 failed first.*rank 1 fails on purpose"):
        ddp_scripts.run_torchrun(script, 2, (str(tmp_path),), timeout_s=300)  # a timeout would say so instead
    assert live_children() == []


@pytest.mark.timeout(120)
def test_a_timeout_stops_every_rank_not_just_torchrun(tmp_path):
    script = tmp_path / "hangs.py"
    started = tmp_path / "started"
    started.mkdir()
    script.write_text("import os, pathlib, sys, time\n"
                      "pathlib.Path(sys.argv[1], os.environ['RANK']).touch()\n"
                      "time.sleep(3600)\n")
    with pytest.raises(RuntimeError, match="did not finish in 12 s"):
        ddp_scripts.run_torchrun(script, 2, (str(started),), timeout_s=12)
    assert live_children() == []
    ranks_that_ran = len(list(started.iterdir()))
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(script) in (p.info["cmdline"] or [])], \
        f"{ranks_that_ran} rank(s) started and some outlived the timeout"


def test_a_run_in_the_background_hands_back_its_result_or_its_error(monkeypatch):
    started = threading.Event()

    def fake(script, nproc_per_node, script_args, timeout_s):
        started.wait(5)
        if script == "broken.py":
            raise RuntimeError("torchrun broken.py failed")
        return subprocess.CompletedProcess([script, nproc_per_node, *script_args, timeout_s], 0, "ok", "")

    monkeypatch.setattr(ddp_scripts, "run_torchrun", fake)
    good = ddp_scripts.torchrun_in_background("step7.py", 4, ("--epochs", "4"), timeout_s=60)
    bad = ddp_scripts.torchrun_in_background("broken.py", 2)
    assert not good.done()  # the caller went on before the run ended
    started.set()
    assert good.result(timeout=10).args == ["step7.py", 4, "--epochs", "4", 60]
    with pytest.raises(RuntimeError, match="broken.py failed"):
        bad.result(timeout=10)
