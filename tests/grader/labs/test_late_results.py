"""grader.labs.late_results and grader.labs.fsdp.gathers act on the process group: every route to an asynchronous
all-reduce, all-gather or reduce-scatter (imported by name, old and new names, the list form of all_gather, a
DeviceMesh's group) leaves the student's tensor as it was until ``wait()``, then holds the result; the labs'
recorder gives each route the same record, and the FSDP lab's gather watch sees each gather alike. One 2-rank launch
(single-process routes: tests/runtime/test_recorder.py)."""

import observed_ranks
import pytest

from course.runtime.launch import launch


@pytest.fixture(scope="module")
def held():
    return launch(observed_ranks.held_routes, 2, timeout_s=120)


ROUTES = ["all_reduce by name", "all_reduce on a mesh", "all_gather_single", "all_gather_into_tensor",
          "all_gather_into_tensor by name", "all_gather on a mesh", "all_gather list", "reduce_scatter_single",
          "reduce_scatter_tensor"]
#: what each route's output holds after wait() on 2 ranks whose input is 4 copies of (rank + 1)
RESULT = {"all_reduce": [3.0] * 4, "all_gather": [1.0] * 4 + [2.0] * 4, "reduce_scatter": [3.0] * 4}


def _op(route: str) -> str:
    return "reduce_scatter" if "scatter" in route else "all_gather" if "gather" in route else "all_reduce"


@pytest.mark.parametrize("route", ROUTES)
def test_the_result_lands_in_the_students_tensor_at_wait_and_not_before(held, route):
    op = _op(route)
    for rank, found in enumerate(held):
        before = [float(rank + 1)] * 4 if op == "all_reduce" else [0.0] * len(RESULT[op])
        assert (found[route]["before"], found[route]["after"]) == (before, RESULT[op])


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_gives_the_recorder_the_record_of_its_operation(held, route):
    record = {"all_reduce": ("all_reduce", 16, 16.0), "all_gather": ("all_gather", 16, 16.0),
              "reduce_scatter": ("reduce_scatter", 32, 16.0)}
    op = _op(route)
    for found in held:  # asynchronous, not waited for until wait(), then waited for
        assert found[route]["record"] == (*record[op], True, None, True)


@pytest.mark.parametrize("route", [route for route in ROUTES if "gather" in route])
def test_the_gather_watch_sees_every_all_gather_alike(held, route):
    for found in held:
        assert found[route]["gathers"] == [(True, True)]
        assert found[route]["watched"] == (True, 32, RESULT["all_gather"])
