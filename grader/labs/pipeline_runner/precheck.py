"""Before any rank starts: the student's ``run_stage`` played once per stage with its messages recorded, not sent,
then simulated together (:func:`course.model_parallel.message_order.simulate`).

In one rank of its own (:attr:`grader.labs.core.Lab.precheck`), each stage of the run's pipeline runs the
student's ``run_stage`` with ``torch.distributed``'s rank, world size, ``isend``/``irecv``/``send``/``recv``
replaced: a receive returns zeros at once, and every call (and every ``wait()`` on its request) is recorded with
the op the stage was running. A message order that would deadlock is then reported in well under a second,
naming who waits for whom during which op, instead of after the run's time limit. Code that fails when played
this way is left to the real run to explain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from course.model_parallel import message_order, pipeline, schedules, transformer
from grader.labs.core import Finding, load_entry


class _Ops(list):
    """The stage's ops, remembering which one the student's loop is on (for "during F3")."""

    current = ""

    def __iter__(self) -> Iterator:
        for op in super().__iter__():
            self.current = f"{op[0]}{op[1]}"
            yield op


class _Messages:
    """Stand-ins for torch.distributed's point-to-point calls on one stage, recording them."""

    def __init__(self, ops: _Ops) -> None:
        self.calls: list[message_order.Call] = []
        self.ops = ops

    def post(self, kind: str, tensor: torch.Tensor, peer: int) -> Any:
        if kind == "recv":
            tensor.zero_()
        self.calls.append(message_order.Call(kind, int(peer), during=self.ops.current))
        index = len(self.calls) - 1
        return mock.Mock(wait=lambda *a, **k: self._wait(index), is_completed=lambda: True)

    def _wait(self, index: int) -> bool:
        self.calls.append(message_order.Call("wait", request=index, during=self.ops.current))
        return True

    def patches(self, rank: int, world_size: int, student: dict[str, Any]) -> list:
        """The stand-ins, wherever the student's module can reach torch's functions: ``dist.isend``,
        ``distributed_c10d.isend`` and a name imported into ``student`` (the module's globals) before the play.
        A real receive here would wait for a peer that does not exist until the run's time limit."""
        def blocking(kind: str):
            return lambda tensor, peer=None, *a, **k: self.post(kind, tensor, peer).wait()

        replaced = {"get_rank": lambda *a, **k: rank, "get_world_size": lambda *a, **k: world_size,
                    "isend": lambda tensor, dst=None, *a, **k: self.post("send", tensor, dst),
                    "irecv": lambda tensor, src=None, *a, **k: self.post("recv", tensor, src),
                    "send": blocking("send"), "recv": blocking("recv")}
        originals = {id(getattr(distributed_c10d, name)): value for name, value in replaced.items()}
        aliases = {alias: originals[id(bound)] for alias, bound in student.items() if id(bound) in originals}
        patches = [mock.patch.dict(student, aliases)]
        for name, value in replaced.items():
            patches += [mock.patch.object(dist, name, value), mock.patch.object(distributed_c10d, name, value)]
        return patches


def messages(path: str, config: dict, model_config: Callable[[int], transformer.Config]
             ) -> list[list[message_order.Call]] | None:
    """Every stage's recorded calls, in 1F1B order on the run's pipeline (``model_config(p)``, as the run builds
    it); None if the student's code failed."""
    p, m = config["world_size"], config["micro_batches"]
    model_config = model_config(p)
    inputs, targets = transformer.sample_batch(model_config, m, config["seed"])
    stages = pipeline.split(transformer.build(model_config, config["seed"]), p)
    micro_inputs, micro_targets = list(inputs.chunk(m)), list(targets.chunk(m))
    shape = (len(micro_inputs[0]), model_config.seq_len, model_config.d_model)
    run_stage, recorded = load_entry(path, "run_stage"), []
    for rank in range(p):
        ops = _Ops((op.kind, op.micro_batch) for op in schedules.one_f_one_b(p, m, rank))
        stage_messages = _Messages(ops)
        patches = stage_messages.patches(rank, p, run_stage.__globals__)
        for patch in patches:
            patch.start()
        try:
            run_stage(stages[rank], ops, micro_inputs, lambda out, i: transformer.loss(out, micro_targets[i]) / m,
                      shape)
        except Exception:  # noqa: BLE001 - the real run explains the student's error in their terms
            return None
        finally:
            for patch in reversed(patches):
                patch.stop()
        recorded.append(stage_messages.calls)
    return recorded


def precheck(path: str, config: dict, model_config: Callable[[int], transformer.Config]) -> list[Finding]:
    """The run's message order simulated: a deadlock fails every check at once, saying who waits for whom.
    The lab passes it as ``functools.partial(precheck, model_config=...)``, its own pipeline's configuration."""
    recorded = messages(path, config, model_config)
    if recorded is None:
        return []
    try:
        stuck = message_order.simulate(recorded)
    except ValueError as error:
        return [Finding("*", False, f"your run_stage's messages cannot run (simulated before starting any rank): "
                        f"{error}")]
    if stuck is None:
        return []
    return [Finding("*", False, f"your run_stage would deadlock: simulated before starting any rank, {stuck}. "
                    "Activations go from rank - 1 to rank + 1, gradients the other way, once per micro-batch; "
                    "a stage waits for ever on a message its neighbour never posts")]
