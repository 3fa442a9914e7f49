"""course.runtime.root_cause: the first failing rank's own traceback, out of torchrun's interleaved stderr."""

import subprocess
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.ddp import scripts as ddp_scripts
from course.runtime.root_cause import explain, root_cause

pytestmark = pytest.mark.unit6

ECHO = "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:17588"


def rank_traceback(rank: int, error: str) -> list[str]:
    body = ["Traceback (most recent call last):", '  File "train_4gpu.py", line 8, in <module>',
            "    main()", error]
    return [f"[rank{rank}]: {line}" for line in body]


def summary(rank: int) -> list[str]:
    return ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
            "Root Cause (first observed failure):", "[0]:", "  host      : localhost",
            f"  rank      : {rank} (local_rank: {rank})", "  exitcode  : 1 (pid: 1)", "=" * 60]


@given(world_size=st.integers(2, 8), data=st.data())
def test_the_rank_that_raised_is_found_among_the_echoes_in_any_order(world_size, data):
    culprit = data.draw(st.integers(0, world_size - 1))
    order = data.draw(st.permutations(range(world_size)))
    named = data.draw(st.sampled_from([None, culprit, *(r for r in range(world_size) if r != culprit)]))
    lines = ["W1124 torch/distributed/run.py: Setting OMP_NUM_THREADS"]
    for rank in order:
        lines += rank_traceback(rank, "AttributeError: 'DigitsCNN' object has no attribute 'module'"
                                if rank == culprit else ECHO)
    lines += [] if named is None else summary(named)
    cause = root_cause("\n".join(lines))
    assert cause.rank == culprit
    assert cause.error == "AttributeError: 'DigitsCNN' object has no attribute 'module'"
    assert "[rank" not in cause.traceback and cause.traceback.startswith("Traceback (most recent call last):")


def test_when_every_rank_only_echoes_the_one_torchrun_names_is_shown():
    lines = rank_traceback(1, ECHO) + rank_traceback(3, ECHO) + summary(3)
    assert root_cause("\n".join(lines)).rank == 3


def test_output_without_rank_prefixes_gives_its_last_traceback_not_torchruns():
    stderr = "\n".join(["Traceback (most recent call last):", '  File "x.py", line 1', "ValueError: bad shape",
                        "Traceback (most recent call last):", '  File "run.py", line 9',
                        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "])
    cause = root_cause(stderr)
    assert (cause.rank, cause.error) == (None, "ValueError: bad shape")


def test_a_long_traceback_keeps_its_header_and_its_end():
    lines = rank_traceback(0, "KeyError: 'x'")
    lines[2:2] = [f"[rank0]:   frame {i}" for i in range(100)]
    cause = root_cause("\n".join(lines), max_lines=10)
    assert len(cause.traceback.splitlines()) == 11 and "lines not shown" in cause.traceback
    assert cause.error == "KeyError: 'x'"


def test_explain_shows_the_output_and_then_the_cause_even_when_the_script_printed_first():
    stderr = "\n".join(rank_traceback(0, ECHO) + rank_traceback(2, "NameError: name 'modle' is not defined"))
    text = explain(1, "epoch 0: loss 2.1\n", stderr)
    assert text.startswith("epoch 0: loss 2.1\nexit code 1: rank 2 failed first.")
    assert text.endswith("NameError: name 'modle' is not defined")
    assert explain(0, "done\n", stderr) == "done"
    assert explain(-9, "", "").endswith("exit code -9, and nothing on stderr.")
    assert root_cause("just a warning\n") is None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_torchrun_failure_is_traced_to_the_rank_that_raised(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import torch.distributed as dist
        from course import world
        rank = world.init_from_env()
        print(f"rank {rank.rank} started", flush=True)
        if rank.rank == 2:
            raise AttributeError("'DigitsCNN' object has no attribute 'module'")
        dist.barrier()
        world.shutdown()
    """))
    done = subprocess.run(ddp_scripts.torchrun_command(script, 4), capture_output=True, text=True, timeout=100,
                          env=ddp_scripts.torchrun_environment(4))
    assert done.returncode != 0 and "started" in done.stdout
    cause = root_cause(done.stderr)
    assert (cause.rank, cause.error) == (2, "AttributeError: 'DigitsCNN' object has no attribute 'module'"), \
        done.stderr


def test_a_message_without_traceback_is_shown_without_torchruns_report():
    stderr = "\n".join(["deliberately broken", "E1124 06:18:54 api.py:1002] failed (exitcode: 1) local_rank: 0",
                        "Traceback (most recent call last):", '  File "run.py", line 9, in <module>',
                        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
                        "Root Cause (first observed failure):", "  rank      : 0 (local_rank: 0)"])
    assert explain(1, "", stderr) == "exit code 1, and no Python traceback; the end of its stderr:\ndeliberately broken"
