"""course.runtime.intercept: one wrapper per torch.distributed function, shared by every listener, and torch's own
functions back once the last listener leaves."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course.runtime import intercept

pytestmark = pytest.mark.timeout(120)


class Heard:
    """A listener that keeps each call and the result it was told of."""

    def __init__(self) -> None:
        self.calls, self.results = [], []

    def __call__(self, call: intercept.Call):
        self.calls.append(call)
        return self.after

    def after(self, result):
        self.results.append(result)
        return result


def test_listeners_share_one_wrapper_and_torch_comes_back_after_the_last():
    original = dist.all_reduce
    first, second = Heard(), Heard()
    with intercept.listening(first, ("all_reduce",)):
        wrapper = dist.all_reduce
        assert wrapper is not original and c10d.all_reduce is wrapper
        with intercept.listening(second, ("all_reduce", "no_such_function")):
            assert dist.all_reduce is wrapper  # wrapped once, whoever listens
            assert intercept.original("all_reduce") is original
        assert dist.all_reduce is wrapper  # the first listener still listens
    assert dist.all_reduce is original and c10d.all_reduce is original


def test_every_listener_hears_each_call_with_its_caller_and_nesting_and_the_result():
    heard = Heard()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with intercept.listening(heard, ("all_reduce", "broadcast", "broadcast_object_list")):
            tensor = torch.ones(3)
            dist.all_reduce(tensor)
            dist.broadcast_object_list([1], src=0)  # torch's broadcast_object_list broadcasts sizes, then bytes
            intercept.original("all_reduce")(tensor)  # a checker's reference call: heard by no one
    finally:
        dist.destroy_process_group()
    assert [(c.name, c.nested) for c in heard.calls] == [("all_reduce", False), ("broadcast_object_list", False),
                                                          ("broadcast", True), ("broadcast", True)]
    assert heard.calls[0].caller == __file__ and heard.calls[0].args[0] is tensor
    assert heard.calls[2].caller.endswith("distributed_c10d.py")
    assert len(heard.results) == 4


def test_a_function_replaced_behind_the_interceptors_back_is_named():
    heard = Heard()
    with intercept.listening(heard, ("all_reduce",)):
        wrapper = dist.all_reduce
        assert intercept.INTERCEPTOR.replaced() == []
        dist.all_reduce = lambda *args, **kwargs: None  # a script's no-op all_reduce
        try:
            assert intercept.INTERCEPTOR.replaced() == ["torch.distributed.all_reduce"]
        finally:
            dist.all_reduce = wrapper
    assert dist.all_reduce is c10d.all_reduce


def test_process_group_messages_are_heard_as_methods():
    heard = Heard()
    send = dist.ProcessGroup.send
    with intercept.listening(heard, intercept.METHODS):
        assert dist.ProcessGroup.send is not send
    assert dist.ProcessGroup.send is send
