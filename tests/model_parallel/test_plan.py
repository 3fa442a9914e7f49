"""course.model_parallel.plan: every split of the GPUs is tried, each priced by the performance model; the choice
is the fastest that fits, and the memory follows the budget's closed form."""

import pytest

from course.memory import budget
from course.model_parallel import plan
from course.perf import catalog, parallel
from course.perf.comm import Cluster

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

CLUSTER = Cluster(catalog.gpu("H100 SXM5"), catalog.link("NVSwitch (H100, NVLink 4)"), 8,
                  catalog.link("InfiniBand NDR"), nics_per_node=8)
SMALL, MEDIUM, LARGE = plan.GPT


def test_the_gpt_shapes_are_those_of_the_gpt3_papers_table():
    """Brown et al. 2020, Table 2.1: (n_layers, d_model, n_heads) of GPT-3 XL, 13B and 175B."""
    assert [(m.layers, m.hidden, m.heads) for m in plan.GPT] == [(24, 2048, 24), (40, 5120, 40), (96, 12288, 96)]
    assert [round(m.params / 1e9, 1) for m in plan.GPT] == [1.3, 12.9, 174.6]


def test_every_split_uses_every_gpu_and_is_priced_by_the_performance_model():
    found = plan.splits(MEDIUM, 64, CLUSTER)
    names = {split.name for split in found}
    assert {"1 x 1 x 64", "8 x 8 x 1", "2 x 4 x 8"} <= names and "3 x 1 x 21" not in names
    for split in found:
        assert split.plan.gpus == 64 and split.plan.tensor <= CLUSTER.gpus_per_node
        assert split.step == parallel.step_time(MEDIUM, split.plan, CLUSTER)


def test_model_states_are_the_budgets_for_one_gpus_share_of_the_parameters():
    split = plan.evaluate(LARGE, 8, 8, 1, CLUSTER)
    states = budget.model_states(LARGE.params / 64, budget.Setup("adam", "bf16")).model_states
    assert states < split.memory_bytes < states + 20e9  # activations with recomputation: a few GB on top


def test_splitting_the_weights_shrinks_the_memory_per_gpu():
    memory = [plan.evaluate(LARGE, t, 8, 8 // t, CLUSTER).memory_bytes for t in (1, 2, 4, 8)]
    assert memory == sorted(memory, reverse=True)


def test_the_choice_is_the_fastest_split_that_fits():
    rows = {row["model"]: row for row in plan.table(plan.GPT, 64, CLUSTER)}
    assert rows["GPT 175B"]["zero1_gb"] > CLUSTER.gpu.memory_bytes / 1e9
    for model in plan.GPT:
        best = plan.choose(model, 64, CLUSTER)
        assert best is not None and best.fits
        assert all(best.step.step_s <= other.step.step_s for other in plan.splits(model, 64, CLUSTER) if other.fits)
    assert plan.choose(LARGE, 8, CLUSTER) is None  # 175B parameters do not fit in one node


def test_the_data_parallel_pick_for_13b_fits_only_because_zero1_shards_adams_state():
    """Issue 33, item 1: the 13B row's data parallelism is DP + ZeRO-1, not plain DDP."""
    row = {row["model"]: row for row in plan.table(plan.GPT, 64, CLUSTER)}["GPT 13B"]
    gpu_gb = CLUSTER.gpu.memory_bytes / 1e9
    assert row["pick"] == "1 x 1 x 64"
    assert row["zero1_gb"] <= gpu_gb < row["ddp_gb"]
    replicated = budget.model_states(MEDIUM.params, budget.Setup("adam", "bf16")).model_states / 1e9
    assert row["ddp_gb"] >= round(replicated, 1)  # every model state on every GPU, activations on top


def test_past_the_critical_batch_a_model_that_fits_one_gpu_still_gets_tensor_parallelism():
    """Issue 33, item 2: at a fixed global batch, data parallelism runs out of samples before GPUs run out."""
    row = plan.table([SMALL], 1024, CLUSTER, global_batch=512)[0]
    assert row["ddp_gb"] < CLUSTER.gpu.memory_bytes / 1e9  # the whole training state fits on one GPU
    assert "1 x 1 x 1024" not in {split.name for split in plan.splits(SMALL, 1024, CLUSTER, 512)}
    best = plan.choose(SMALL, 1024, CLUSTER, 512)
    assert best.plan.data <= 512 and best.plan.tensor * best.plan.pipeline > 1


def test_the_formatted_table_names_its_columns_in_words_and_has_a_line_per_model():
    text = plan.format_table(plan.table(plan.GPT, 64, CLUSTER))
    assert "plain DDP" in text and "ZeRO-1" in text and "zero1_gb" not in text
    assert sum(line.startswith("GPT") for line in text.splitlines()) == len(plan.GPT)


def test_tensor_parallelism_does_not_cross_a_node_where_that_does_not_pay():
    # issue 33 item 17: splits with t = 16 or 32 span nodes and are priced on InfiniBand; none is picked
    found = plan.splits(LARGE, 64, CLUSTER)
    across = [split for split in found if split.plan.tensor > CLUSTER.gpus_per_node]
    assert {split.plan.tensor for split in across} == {16, 32}
    best = plan.choose(LARGE, 64, CLUSTER)
    assert best.plan.tensor <= CLUSTER.gpus_per_node
    assert all(split.step.step_s > best.step.step_s for split in across)


def test_the_plan_interleaves_the_pipeline_where_that_pays():
    best = plan.choose(LARGE, 64, CLUSTER)
    plain = parallel.step_time(LARGE, parallel.Plan(best.plan.tensor, best.plan.pipeline, best.plan.data, 512, 1,
                                                    best.plan.sharding), CLUSTER)
    assert best.plan.interleave > 1 and best.step.step_s < plain.step_s


def test_offered_context_and_expert_parallelism_the_planner_takes_them_where_they_pay():
    long = parallel.Transformer("Llama 3 8B at 128K", 32, 4096, 32, 131072, 128256, 14336, True, 8, False, False)
    without = plan.choose(long, 64, CLUSTER, 64)
    offered = plan.choose(long, 64, CLUSTER, 64, contexts=(1, 2, 4, 8, 16))
    assert offered.plan.context > 1 and "CP" in offered.name
    assert offered.step.step_s < without.step.step_s and offered.fits
    mixtral = parallel.Transformer("Mixtral 8x7B", 32, 4096, 32, 4096, 32000, 0, True, 8, False, False, experts=8,
                                   top_k=2, expert_ffn=14336)
    found = plan.splits(mixtral, 64, CLUSTER, 256, experts=(1, 2, 4, 8))
    assert {s.plan.expert for s in found} == {1, 2, 4, 8}
    assert all(s.plan.tensor * s.plan.context * s.plan.expert <= 64 for s in found)
    best = plan.choose(mixtral, 64, CLUSTER, 256, experts=(1, 2, 4, 8))
    assert best.plan.expert > 1 and best.plan.tensor * best.plan.expert <= CLUSTER.gpus_per_node  # inside a node
    assert plan.choose(mixtral, 64, CLUSTER, 256).plan.expert == 1  # not offered, not taken
