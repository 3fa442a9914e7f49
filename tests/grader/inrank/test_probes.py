"""grader.inrank.probes: the split is held fixed, calls from outside the probes are reported, fingerprints agree."""

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, TensorDataset

from course import models
from grader.inrank import probed_data, probes, records

pytestmark = pytest.mark.unit6


class Recorder:
    """Stands in for a channel.Writer: keeps the records."""

    def __init__(self) -> None:
        self.records = []

    def write(self, record):
        self.records.append(record)


@pytest.mark.parametrize("arguments", [{"seed": 1}, {"n_test": 0}, {"n_val": 10}])
def test_another_split_is_refused_with_the_fix(arguments):
    name = next(iter(arguments))
    with pytest.raises(ValueError, match=rf"data.load\({name}=.*held-out samples into training.*without {name}="):
        probed_data.refuse_other_splits("load", arguments)


def test_the_default_split_is_allowed():
    probed_data.refuse_other_splits("load", {"name": "digits", "seed": 0})
    probed_data.refuse_other_splits("load_digits", {})


def test_the_wrapped_loader_refuses_another_seed_and_hides_the_test_split():
    from course import data

    probe = probes.Probes(Recorder(), rank=0, seed=1)
    probe._wrap_data()
    try:
        with pytest.raises(ValueError, match="seed=1"):
            data.load(seed=1)
        with pytest.raises(ValueError, match="n_test=0"):
            data.load_digits(0, 300, 0)
        splits = data.load()
        assert isinstance(splits.train, probed_data.ProbedDataset) and len(splits.test) == 0 and len(splits.val) == 300
    finally:
        for key, original in probe._originals.items():
            setattr(data, key.rsplit(".", 1)[1], original)


def test_emit_from_outside_the_probes_is_written_as_a_forgery():
    writer = Recorder()
    probe = probes.Probes(writer, rank=0, seed=1)
    probe.emit("report", val_accuracy=0.99)
    probe.finish("returned", 0, None)  # the harness's path: emit is called from inside the probes
    forged, end = writer.records
    assert forged["kind"] == "forgery" and forged["forged_kind"] == "report" and "val_accuracy" not in forged
    assert forged["caller"] == __file__
    assert end["kind"] == "end" and end["exit_code"] == 0


def test_the_probes_fingerprint_is_the_module_fingerprint():
    model = models.DigitsCNN()
    params = list(model.parameters())
    probe = probes.Probes(Recorder(), rank=0, seed=7)
    assert probe._fingerprint(params) == probes.fingerprint(params, 7)
    assert probes.fingerprint(params, 7) != probes.fingerprint(params, 8)
    torch.testing.assert_close(probes.fingerprint(params, 7)[-1],
                               float(torch.cat([p.detach().reshape(-1) for p in params]).double().norm()))


def test_only_files_under_the_run_directory_fixed_at_start_up_are_writes(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = Recorder()
    probe = probes.Probes(writer, rank=0, seed=1, run_dir=str(run_dir))
    probe._audit("open", (str(run_dir / "log.txt"), "w", 0))
    probe._audit("open", (str(tmp_path / "run2" / "log.txt"), "w", 0))  # a sibling sharing the prefix
    probe._audit("open", (str(run_dir / "data.txt"), "r", 0))
    monkeypatch.chdir("/")  # the script moved: /dev/null is not in the run directory
    probe._audit("open", ("/dev/null", "w", 0))
    assert [r["path"] for r in writer.records] == [str(run_dir / "log.txt")]


def test_a_forked_child_records_nothing(tmp_path):
    import os

    from grader.inrank import channel

    key = channel.new_key()
    read_fd, write_fd = os.pipe()
    writer = channel.Writer(write_fd, key, callers=(probes.HERE,))
    probe = probes.Probes(writer, rank=0, seed=1, run_dir=str(tmp_path))
    probe.silence_in_children()
    child = os.fork()
    if child == 0:  # a grandchild or a DataLoader worker: it would take rank 0's next sequence number
        try:
            probe._audit("open", (str(tmp_path / "worker.log"), "a", 0))
            probe.finish("returned", 0, None)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    probe.finish("returned", 0, None)
    os.close(write_fd)
    reader = channel.Reader(os.fdopen(read_fd, "rb"), key)
    assert [(r["kind"], r["seq"], r["signer"]) for r in reader.result()] == [("end", 0, "launcher")]
    assert reader.rejected == 0


def test_digests_tell_tensors_apart_bit_for_bit_and_by_shape():
    a = torch.arange(6, dtype=torch.float32)
    b = a.clone()
    b[3] = torch.nextafter(b[3], torch.tensor(10.0))
    assert probes.digests([a]) == probes.digests([a.clone()]) != probes.digests([b])
    assert probes.digests([a]) != probes.digests([a.view(2, 3)])
    assert probes.digests([a.double()]) == probes.digests([a])  # compared as float32, as the checkpoint is read


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_0_records_its_parameters_digests_around_every_step_and_at_the_end(rank):
    model = models.DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    writer = Recorder()
    probe = probes.Probes(writer, rank=rank, seed=1)
    before = probes.digests(list(model.parameters()))
    probe._before_step(optimizer, (), {})  # what the global optimizer hooks call around optimizer.step()
    optimizer.step()
    probe._after_step(optimizer, (), {})
    after = probes.digests(list(model.parameters()))
    with torch.no_grad():  # a change outside optimizer.step(), after the last step
        next(model.parameters()).add_(1.0)
    probe.finish("returned", 0, None)
    step = next(r for r in writer.records if r["kind"] == "step")
    end = writer.records[-1]
    if rank == 0:
        assert (step["digests_before"], step["digests"]) == (before, after) and before != after
        assert end["digests"] == probes.digests(list(model.parameters())) != after
    else:  # only rank 0's model is the checkpoint
        assert "digests" not in step and "digests_before" not in step and end["digests"] is None
    typed = [records.parse(r) for r in writer.records]  # what the grader reads: each record fits the format
    assert [type(r) for r in typed] == [records.Initial, records.Step, records.End]
    assert typed[1].fingerprint == tuple(step["fingerprint"]) and typed[2].digests == (
        tuple(end["digests"]) if rank == 0 else None)


def test_each_step_records_the_samples_fetched_since_the_previous_step(monkeypatch):
    monkeypatch.setattr(DataLoader, "__iter__", DataLoader.__iter__)  # restored after the test
    model = models.DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = Recorder()
    probe = probes.Probes(writer, rank=1, seed=1)
    probe._wrap_loader_iter()
    train = probed_data.ProbedDataset(TensorDataset(torch.zeros(10, 1, 8, 8), torch.zeros(10, dtype=torch.long)))
    for _ in range(2):  # two epochs of two steps, one loader
        for _batch in DataLoader(train, batch_size=5, shuffle=False):
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            probe._before_step(optimizer, (), {})
            optimizer.step()
            probe._after_step(optimizer, (), {})
    steps = [records.parse(r) for r in writer.records if r["kind"] == "step"]
    assert [(s.epoch, s.indices) for s in steps] == [(e, tuple(range(b, b + 5))) for e in (0, 1) for b in (0, 5)]


def _train_steps(probe, model, optimizer, loader, peek: bool, autocast: bool = False):
    for images, labels in loader:
        if peek:  # a tutorial's log line: the batch is fetched, never trained on
            len(next(iter(loader))[0])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        probe._before_step(optimizer, (), {})
        optimizer.step()
        probe._after_step(optimizer, (), {})


@pytest.mark.parametrize("peek", [False, True])
def test_a_batch_counts_when_a_forward_trains_on_it_not_when_fetched(monkeypatch, peek):
    monkeypatch.setattr(DataLoader, "__iter__", DataLoader.__iter__)  # restored after the test
    handle = None
    writer = Recorder()
    probe = probes.Probes(writer, rank=1, seed=1)
    probe._wrap_loader_iter()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(probe.batches.forward)
    try:
        model = models.DigitsCNN()
        train = probed_data.ProbedDataset(TensorDataset(torch.rand(12, 1, 8, 8), torch.arange(12) % 10))
        _train_steps(probe, model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(train, batch_size=4),
                     peek)
    finally:
        handle.remove()
    steps = [records.parse(r) for r in writer.records if r["kind"] == "step"]
    assert [s.indices for s in steps] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]  # the peek (0-3) not added


def test_a_forward_under_autocast_records_its_precision(monkeypatch):
    monkeypatch.setattr(DataLoader, "__iter__", DataLoader.__iter__)
    writer = Recorder()
    probe = probes.Probes(writer, rank=1, seed=1)
    probe._wrap_loader_iter()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(probe.batches.forward)
    try:
        model = models.DigitsCNN()
        train = probed_data.ProbedDataset(TensorDataset(torch.rand(8, 1, 8, 8), torch.arange(8) % 10))
        _train_steps(probe, model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(train, batch_size=4),
                     peek=False, autocast=True)
    finally:
        handle.remove()
    assert {r["precision"] for r in writer.records if r["kind"] == "step"} == {"bfloat16"}


class Wrapping(torch.optim.Optimizer):
    """A wrapping optimizer in ZeroRedundancyOptimizer's shape: its step steps an inner optimizer on a shard of
    the parameters, then changes the rest itself (ZeRO broadcasts them from their owners)."""

    def __init__(self, params):
        params = list(params)
        super().__init__(params, {"lr": 0.1})
        self.inner = torch.optim.SGD(params[:1], lr=0.1)

    def step(self, closure=None):
        self.inner.step()
        with torch.no_grad():
            for p in self.param_groups[0]["params"][1:]:
                p.sub_(0.1 * p.grad)


def test_a_wrapping_optimizers_step_is_recorded_once_on_every_parameter():
    model = models.DigitsCNN()
    optimizer = Wrapping(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    writer = Recorder()
    probe = probes.Probes(writer, rank=0, seed=1)
    hooks = [register_optimizer_step_pre_hook(probe._before_step),
             register_optimizer_step_post_hook(probe._after_step)]
    try:
        optimizer.step()
    finally:
        for hook in hooks:
            hook.remove()
    steps = [r for r in writer.records if r["kind"] == "step"]
    assert len(steps) == 1 and steps[0]["optimizer"] == "SGD"  # the update rule, inside the wrapper
    assert steps[0]["digests"] == probes.digests(list(model.parameters()))  # every parameter, after the wrapper


def test_torch_save_into_memory_writes_no_file(tmp_path):
    import io

    writer = Recorder()
    probe = probes.Probes(writer, rank=1, seed=1, run_dir=str(tmp_path))
    save = probe._save(torch.save)
    save({"x": torch.ones(2)}, io.BytesIO())  # ZeroRedundancyOptimizer.consolidate_state_dict does this
    with open(tmp_path / "a.pt", "wb") as handle:
        save({"x": torch.ones(2)}, handle)
    save({"x": torch.ones(2)}, tmp_path / "b.pt")
    assert [r["path"] for r in writer.records] == [str(tmp_path / "a.pt"), str(tmp_path / "b.pt")]


def test_a_probe_that_fails_is_the_graders_error_and_the_script_goes_on(capsys):
    writer = Recorder()
    probe = probes.Probes(writer, rank=3, seed=1)

    def broken(*args):
        raise RuntimeError("Cannot flatten unevenly sharded tensor")

    guarded = probe._guard("optimizer step", broken)
    assert guarded(None, (), {}) is None and guarded(None, (), {}) is None  # no exception reaches the script
    errors = [records.parse(r) for r in writer.records]
    assert errors == [records.ProbeError(rank=3, where="optimizer step",
                                         error="RuntimeError: Cannot flatten unevenly sharded tensor")]
    assert "grader error, not the submission's" in capsys.readouterr().err


def join_by(route: str) -> list[dict]:
    """On a launched rank: leave launch's process group, join a new one by ``route`` with the probes listening, send
    one message round a ring (through dist.isend and through the group itself) and report; the records written."""
    import contextlib
    import datetime
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from course.runtime import intercept, observed
    from course.runtime.ports import reserved_port

    rank, world_size = dist.get_rank(), dist.get_world_size()
    held = contextlib.ExitStack()  # rank 0 holds the new group's port until its store binds it
    port = [held.enter_context(reserved_port()) if rank == 0 else None]
    dist.broadcast_object_list(port, src=0)
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port[0])
    writer = Recorder()
    probe = probes.Probes(writer, rank=rank, seed=1)
    listen = probe._guard("torch.distributed", probe._listen)
    intercept.INTERCEPTOR.add(listen, ("init_process_group", "destroy_process_group"))
    observing = observed.listening(probe._guard("communication", probe._observe))
    observing.__enter__()
    try:
        if route == "init_device_mesh":
            init_device_mesh("cpu", (world_size,))
        elif route == "init_method":
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port[0]}", rank=rank,
                                    world_size=world_size)
        else:  # a store of the script's own
            store = dist.TCPStore("127.0.0.1", port[0], world_size, rank == 0, datetime.timedelta(seconds=60))
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        request = dist.isend(torch.ones(2), right)
        dist.recv(torch.empty(2), left)
        request.wait()
        group = dist.new_group(list(range(world_size)))
        work = group.send([torch.ones(1)], dist.get_group_rank(group, right), 0)  # the course's Comm does this
        group.recv([torch.empty(1)], dist.get_group_rank(group, left), 0).wait()
        work.wait()
        probe._flush_messages()
        dist.destroy_process_group()
    finally:
        intercept.INTERCEPTOR.remove(listen)
        observing.__exit__(None, None, None)
        held.close()
    return writer.records


@pytest.mark.parametrize("route", ["init_device_mesh", "init_method", "store"])
def test_every_route_to_a_process_group_is_recorded_and_so_is_every_message(route):
    from course.runtime.launch import launch

    for rank, written in enumerate(launch(join_by, 3, route, timeout_s=120)):
        typed = [records.parse(r) for r in written]  # each record fits the format
        inits = [r for r in typed if isinstance(r, records.Init)]
        assert [(i.world_size, i.backend, i.group_rank) for i in inits] == [(3, "gloo", rank)], route
        messages = [r for r in typed if isinstance(r, records.Messages)]
        assert [(m.sent_to, m.received_from) for m in messages] == [(((rank + 1) % 3,), ((rank - 1) % 3,))]
        assert isinstance(typed[-1], records.Shutdown)
