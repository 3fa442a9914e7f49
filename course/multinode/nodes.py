"""Two real "nodes" on one machine: two torchrun invocations that meet through c10d rendezvous.

Each node is a network namespace of its own, joined to the other by a virtual cable that ``tc`` shapes to be
much slower than the link inside a node (``course.multinode.netns``). Every node runs the SAME command::

    torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=10.213.7.1:29500 \\
             --rdzv_id=demo course/multinode/nodes.py ...

with no ``--node_rank``: the rendezvous hands out node ranks in the order nodes arrive. On the 4 ranks this
module's ``main`` checks :func:`course.collectives.hierarchical.hierarchical_allreduce` against ``dist.all_reduce``,
times it against the flat ring (``course.collectives.allreduce.ring_allreduce`` over all 4 ranks) and measures the two
links (shared memory inside a node, the cable between leaders; timed with ``course.collectives.timing_ranks``) so that
``course.collectives.cost_model`` can predict both.

Namespaces need root and iproute2 (``ip``, ``tc``); without them :func:`run_two_nodes` runs the same two
torchrun commands on loopback (no slow link), and says why.
Taught in ``notebooks/05b_nodes.ipynb``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import tempfile
from dataclasses import asdict
from functools import partial
from pathlib import Path

from course.collectives import cost_model
from course.multinode.netns import (
    DEFAULT_LINK,
    RENDEZVOUS_HOST,
    SlowLink,
    namespaces_unavailable,
    shaping,
    two_node_network,
)
from course.runtime import paths
from course.runtime.ports import reserved_port
from course.runtime.process import run_together

RANKS_PER_NODE = 2
NODES = 2


# --- the two torchrun invocations ---------------------------------------------------------------------------


def node_commands(endpoint: str, rdzv_id: str, script_args: tuple[str, ...] = (),
                  namespaces: tuple[str, str] | None = None) -> list[list[str]]:
    """The command each node runs: the same torchrun line (c10d rendezvous, no --node_rank), inside its
    namespace if given (where this machine's name resolves to the node's address), else on loopback (with
    ``--local_addr=127.0.0.1``, so that no rank is reached at another of this machine's addresses)."""
    from course.ddp.scripts import torchrun_command

    commands = []
    for node in range(NODES):
        command = torchrun_command(Path(__file__), RANKS_PER_NODE, script_args, nnodes=NODES, rdzv_endpoint=endpoint,
                                   rdzv_id=rdzv_id, local_addr=None if namespaces else "127.0.0.1")
        commands.append((["ip", "netns", "exec", namespaces[node]] if namespaces else []) + command)
    return commands


def run_two_nodes(link: SlowLink | None = DEFAULT_LINK, nbytes: tuple[int, ...] = (256 << 10, 2 << 20),
                  repeats: int = 3, timeout_s: float = 150.0) -> dict:
    """Start two torchrun "nodes" of 2 ranks each, in shaped namespaces (``link``) or, if namespaces are not
    available here or ``link`` is None, on loopback; return what rank 0 measured, plus the model's predictions.

    Returns:
        ``{"mode", "why", "commands", "shaping", "notes", "nodes", "max_diff", "times": {name: {nbytes: s}},
        "inside": AlphaBeta, "between": AlphaBeta, "predicted": {name: {nbytes: s}}}`` (``why``: the reason
        for loopback, or None).

    Raises:
        RuntimeError: a node failed or did not finish in ``timeout_s`` (both are stopped; namespaces deleted).
    """
    why = "no slow link asked for" if link is None else namespaces_unavailable()
    with tempfile.TemporaryDirectory(prefix="course-nodes-") as scratch:
        out = os.path.join(scratch, "result.json")
        args = ("--out", out, "--repeats", str(repeats), "--sizes", *map(str, nbytes))
        rdzv_id = f"nodes{secrets.token_hex(3)}"
        if why:
            with reserved_port() as port:  # held for the first node's rendezvous store, which binds it too
                commands = node_commands(f"127.0.0.1:{port}", rdzv_id, args)
                shown = _start_and_wait(commands, ("lo", "lo"), timeout_s)
            result = {"mode": "loopback", "why": why, "shaping": [], "notes": []}
        else:
            with two_node_network(link) as network:
                endpoint = f"{RENDEZVOUS_HOST}:29500"  # each namespace has its own ports: this one is free
                commands = node_commands(endpoint, rdzv_id, args, network.namespaces)
                result = {"mode": "namespaces", "why": None, "shaping": shaping(network), "notes": network.notes}
                shown = _start_and_wait(commands, network.interfaces, timeout_s)
        # as typed in the project's folder, writing result.json there: not the scratch folder's /tmp path
        result["commands"] = [paths.shorten(command.replace(scratch + os.sep, "")) for command in shown]
        result.update(json.loads(Path(out).read_text()))
    result["inside"] = cost_model.AlphaBeta(**result["inside"])
    result["between"] = cost_model.AlphaBeta(**result["between"])
    result["times"] = {name: {int(k): v for k, v in by_size.items()} for name, by_size in result["times"].items()}
    result["predicted"] = predictions(result["inside"], result["between"], list(nbytes))
    return result


def predictions(inside: cost_model.AlphaBeta, between: cost_model.AlphaBeta, nbytes: list[int]
                ) -> dict[str, dict[int, float]]:
    """The cost model's seconds for the flat ring and the hierarchical allreduce, 2 nodes x 2 ranks."""
    return {"flat ring": {n: float(cost_model.predict_flat(n, RANKS_PER_NODE, NODES, between)) for n in nbytes},
            "hierarchical": {n: float(cost_model.predict_hierarchical(n, RANKS_PER_NODE, NODES, inside, between))
                             for n in nbytes}}


def _start_and_wait(commands: list[list[str]], interfaces: tuple[str, str], timeout_s: float) -> list[str]:
    """Run every node's command (:func:`course.runtime.process.run_together`: all stopped as soon as one fails);
    the commands as typed."""
    from course.ddp.scripts import torchrun_environment

    envs = []
    for interface in interfaces:
        env = torchrun_environment(RANKS_PER_NODE)
        env.update(GLOO_SOCKET_IFNAME=interface, COURSE_EMULATE="1")
        envs.append(env)
    outcomes = run_together(commands, timeout_s, envs=envs, capture=8000)
    if any(outcome.status == "timeout" for outcome in outcomes):
        raise RuntimeError(f"the nodes did not finish within {timeout_s:g} s; both were stopped.")
    for node, outcome in enumerate(outcomes):
        if outcome.status not in ("ok", "interrupted"):
            raise RuntimeError(f"node {node} failed (exit {outcome.returncode}); the other was stopped. Its "
                               f"output ends:\n{(outcome.stdout + outcome.stderr)[-3000:]}")
    return [" ".join(["torchrun", *command[command.index("torch.distributed.run") + 1:]]) for command in commands]


# --- on every rank, under torchrun ----------------------------------------------------------------------------


def measure(nbytes: list[int], repeats: int) -> dict:
    """Rank function (under torchrun, 2 nodes x 2 ranks): correctness, timings, and both links' alpha-beta.

    Returns (on every rank): ``nodes`` (global ranks per node), ``max_diff`` (hierarchical vs dist.all_reduce),
    ``times`` ({"flat ring", "hierarchical", "dist.all_reduce"}: {nbytes: median s}), ``inside`` (shared
    memory's α, β fitted from shm_allreduce timings on each node) and ``between`` (the cable's α, β fitted
    from one-way times between the two leaders).
    """
    import torch
    import torch.distributed as dist

    from course import world
    from course.collectives import timing_ranks as allreduce_timing
    from course.collectives.allreduce import ring_allreduce
    from course.collectives.hierarchical import hierarchical_allreduce, node_groups
    from course.collectives.shm_allreduce import shm_allreduce

    me = world.current()
    nodes = node_groups()
    mine = torch.randn(100_003, generator=torch.Generator().manual_seed(me.rank), dtype=torch.float64)
    reference = mine.clone()
    dist.all_reduce(reference)
    difference = (hierarchical_allreduce(mine.clone()) - reference).abs().max().item()
    algorithms = {"flat ring": ring_allreduce, "hierarchical": hierarchical_allreduce,
                  allreduce_timing.REFERENCE: dist.all_reduce}
    times = allreduce_timing.time_allreduce(nbytes, algorithms, repeats)
    shm = allreduce_timing.time_allreduce(nbytes, {"shm": partial(shm_allreduce, group=nodes.local)}, repeats)["shm"]
    leaders = [ranks[0] for ranks in nodes.members]
    one_way = allreduce_timing.ping_pong(nbytes, repeats, between=(leaders[0], leaders[1]))
    inside = cost_model.fit_allreduce("shm", len(nodes.members[0]), nbytes, [shm[n] for n in nbytes])
    between = cost_model.fit(nbytes, [one_way[n] for n in nbytes])
    return {"nodes": [list(ranks) for ranks in nodes.members], "max_diff": difference, "times": times,
            "inside": asdict(inside), "between": asdict(between)}


def main() -> None:
    """Entry point under torchrun: measure, and rank 0 writes the result to ``--out`` as JSON."""
    from course import world

    parser = argparse.ArgumentParser(description="one rank of the two-node demo (started by run_two_nodes)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    args = parser.parse_args()
    me = world.init_from_env(timeout_s=120)
    try:
        result = measure(args.sizes, args.repeats)
        if me.rank == 0:
            Path(args.out).write_text(json.dumps(result))
    finally:
        world.shutdown()


def demo() -> None:
    """``python -m course.multinode.nodes``: run the two nodes (in namespaces as root, else on loopback) and print the
    commands, the flat ring and the hierarchical allreduce measured beside the model."""
    parser = argparse.ArgumentParser(description="two torchrun nodes on this machine: flat ring vs hierarchical")
    parser.add_argument("--rate-mbit", type=float, default=SlowLink.rate_mbit, help="the slow link's rate (tbf)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="the slow link's added delay (netem, if any)")
    parser.add_argument("--loopback", action="store_true", help="no namespaces, no slow link")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    link = None if args.loopback else SlowLink(args.rate_mbit, args.delay_ms)
    result = run_two_nodes(link, repeats=args.repeats)
    print(f"mode: {result['mode']}" + (f" ({result['why']})" if result["why"] else ""))
    for line in result["shaping"] + result["notes"]:
        print("   ", line)
    for node, command in enumerate(result["commands"]):
        print(f"node {node}: $ {command}")
    print(f"ranks by node {result['nodes']}; hierarchical vs dist.all_reduce: largest difference "
          f"{result['max_diff']:.1e}")
    print("\n".join(comparison(result)))


def _speeds(inside_beta: float, between_beta: float) -> str:
    """How the fitted per-byte times compare (a noisy fit can put a β at 0: then say so instead)."""
    if inside_beta <= 0 or between_beta <= 0:
        zero = "inside a node" if inside_beta <= 0 else "between the nodes"
        return (f"the fit found no per-byte time {zero} (β = 0: the timings there were dominated by noise or "
                "latency), so the two links' speeds are not compared")
    ratio = between_beta / inside_beta
    how = f"{ratio:,.0f}x slower" if ratio >= 1 else f"{1 / ratio:,.1f}x faster"
    return f"the link between the nodes carries a byte {how} than shared memory inside a node (fitted β)"


def comparison(result: dict) -> list[str]:
    """Lines for :func:`run_two_nodes`'s result: the fitted links, each algorithm measured beside modelled, and
    sentences whose wording follows the numbers (for notebook 05b and ``python -m course.multinode.nodes``)."""
    times, predicted = result["times"], result["predicted"]
    lines = [f"links fitted in this run: inside a node {result['inside']}; between the nodes {result['between']}",
             f"{'size':>8}  {'algorithm':<14}{'measured ms':>12}{'modelled ms':>12}"]
    for size in sorted(times["flat ring"]):
        for name in ("flat ring", "hierarchical"):
            lines.append(f"{size / 2**20:>6.2f}MB  {name:<14}{times[name][size] * 1e3:>12.1f}"
                         f"{predicted[name][size] * 1e3:>12.1f}")
        measured = times["flat ring"][size] / times["hierarchical"][size]
        modelled = predicted["flat ring"][size] / predicted["hierarchical"][size]
        lines.append(f"{'':>10}flat ring time / hierarchical time: measured {measured:.2f}x, modelled {modelled:.2f}x "
                     "(above 1: the hierarchical allreduce is faster)")
    biggest = max(times["flat ring"])
    error = predicted["hierarchical"][biggest] / times["hierarchical"][biggest] - 1  # a share of the measured time
    lines.append(f"at {biggest / 2**20:.0f} MB the model's hierarchical time is {abs(error):.0%} "
                 f"{'below' if error < 0 else 'above'} the measured one")
    lines.append(_speeds(result["inside"].beta_s_per_byte, result["between"].beta_s_per_byte))
    faster = (times["flat ring"][biggest] > times["hierarchical"][biggest],
              predicted["flat ring"][biggest] > predicted["hierarchical"][biggest])
    verdict = {(True, True): "both the measurement and the model favour the hierarchical allreduce",
               (False, False): "neither the measurement nor the model favours the hierarchical allreduce",
               (True, False): "the measurement favours the hierarchical allreduce, the model does not",
               (False, True): "the model favours the hierarchical allreduce, the measurement does not"}[faster]
    return [*lines, f"at {biggest / 2**20:.0f} MB {verdict}"]


if __name__ == "__main__":
    main() if "RANK" in os.environ else demo()
