"""course.practice.compiled_ddp: DDPOptimizer splits the compiled model into one graph per DDP bucket, and into
one graph when it is off; the counts follow the bucket size, and describe() follows the counts."""

import pytest

from course.practice import compiled_ddp
from course.runtime.launch import launch

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layers", [3, 6])
def test_ddpoptimizer_gives_one_graph_per_bucket_and_one_graph_when_off(layers):
    counts = launch(compiled_ddp.compile_contrast, 2, layers, timeout_s=240)
    assert counts[0] == counts[1]  # the same on every rank
    split, buckets = counts[0]["DDP(compile(model))"]
    assert split == buckets == layers  # 1 MiB per layer, bucket_cap_mb=1: a layer per bucket
    assert counts[0]["compile(DDP(model))"] == (layers, layers)  # the model under DDP's forward, split the same way
    assert counts[0]["DDP(compile(model)), optimize_ddp off"] == (1, layers)


def test_describe_follows_the_counts():
    split = {"compile(DDP(model))": (6, 6), "DDP(compile(model))": (6, 6),
             "DDP(compile(model)), optimize_ddp off": (1, 6)}
    text = compiled_ddp.describe(split)
    assert "6 graph(s) for 6 buckets: DDPOptimizer split" in text
    assert "compile(DDP(model)): 6 graph(s), split at the same buckets" in text and "graph break" not in text
    none = {**split, "compile(DDP(model))": (0, 6)}
    assert "compile(DDP(model)): no graph. Dynamo stops at DDP's forward by design" in compiled_ddp.describe(none)
    other = {**split, "compile(DDP(model))": (3, 6), "DDP(compile(model))": (1, 6)}
    text = compiled_ddp.describe(other)
    assert "1 graph(s) for 6 buckets." in text and "compile(DDP(model)): 3 graph(s)." in text
