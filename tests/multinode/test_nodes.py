"""course.multinode.nodes: two torchrun "nodes" meeting through c10d rendezvous, in shaped network namespaces (as root)
or on loopback (the namespaces themselves: tests/multinode/test_netns.py)."""

import pytest

from course.multinode import nodes

UNAVAILABLE = nodes.namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}")


@needs_namespaces
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_nodes_meet_without_node_rank_and_the_hierarchical_allreduce_matches_dist():
    result = nodes.run_two_nodes(nodes.SlowLink(rate_mbit=400), nbytes=(64 << 10, 256 << 10), repeats=1)
    assert result["mode"] == "namespaces"
    assert result["nodes"] == [[0, 1], [2, 3]]
    assert result["max_diff"] < 1e-12
    first, second = result["commands"]
    assert first == second and "--node_rank" not in first and "--rdzv_backend=c10d" in first
    assert "--out result.json" in first  # as a learner types it, not the scratch folder's /tmp path
    assert set(result["times"]) == {"flat ring", "hierarchical", "dist.all_reduce"}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_without_a_slow_link_two_nodes_meet_on_loopback_and_say_why():
    result = nodes.run_two_nodes(None, nbytes=(64 << 10, 256 << 10), repeats=1)
    assert result["mode"] == "loopback" and result["why"]
    assert result["nodes"] == [[0, 1], [2, 3]]
    assert result["max_diff"] < 1e-12


@pytest.mark.timeout(60)
def test_a_node_that_fails_stops_the_other_and_shows_its_output(tmp_path):
    """Node 1 exits at once; node 0 would wait for it in the rendezvous: both end, node 1's output is shown."""
    commands = [["sleep", "50"], ["sh", "-c", "echo the reason; exit 3"]]
    with pytest.raises(RuntimeError, match=r"node 1 failed \(exit 3\)(.|\n)*the reason"):
        nodes._start_and_wait(commands, ("lo", "lo"), timeout_s=40)


def test_predictions_are_the_cost_models():
    inside, between = nodes.cost_model.AlphaBeta(1e-3, 1e-10), nodes.cost_model.AlphaBeta(1e-4, 4e-8)
    predicted = nodes.predictions(inside, between, [1 << 20])
    assert predicted["flat ring"][1 << 20] == pytest.approx(6e-4 + 1.5 * (1 << 20) * 4e-8)
    assert predicted["hierarchical"][1 << 20] == pytest.approx(4e-3 + 5 * (1 << 20) * 1e-10 + 2e-4
                                                               + (1 << 20) * 4e-8)


@pytest.mark.parametrize(("hierarchical_s", "verdict"), [
    (0.05, "both the measurement and the model favour the hierarchical allreduce"),
    (0.50, "the model favours the hierarchical allreduce, the measurement does not"),
])
def test_the_comparison_says_what_the_numbers_say(hierarchical_s, verdict):
    inside, between = nodes.cost_model.AlphaBeta(1e-4, 1e-10), nodes.cost_model.AlphaBeta(1e-4, 4e-8)
    size = 2 << 20
    result = {"inside": inside, "between": between, "predicted": nodes.predictions(inside, between, [size]),
              "times": {"flat ring": {size: 0.2}, "hierarchical": {size: hierarchical_s}}}
    lines = nodes.comparison(result)
    assert lines[-1] == f"at 2 MB {verdict}"
    assert "400x slower than shared memory" in "\n".join(lines)
    assert f"measured {0.2 / hierarchical_s:.2f}x" in "\n".join(lines)
    error = result["predicted"]["hierarchical"][size] / hierarchical_s - 1  # the model's miss, of the measured time
    assert f"hierarchical time is {abs(error):.0%} {'below' if error < 0 else 'above'} the measured one" in lines[-3]


def test_a_fit_without_a_per_byte_time_is_said_not_divided_by():
    lines = nodes.comparison({"inside": nodes.cost_model.AlphaBeta(1e-3, 0.0),
                              "between": nodes.cost_model.AlphaBeta(1e-4, 4e-8),
                              "predicted": {"flat ring": {1: 1.0}, "hierarchical": {1: 1.0}},
                              "times": {"flat ring": {1: 1.0}, "hierarchical": {1: 2.0}}})
    assert "no per-byte time inside a node" in "\n".join(lines)
