"""course.memory.fit: the catalog tables are the budget's own inverses (largest fits, one more does not)."""

import pytest

from course.memory import budget as mb
from course.memory import fit as mf
from course.memory.activations import LayerActivation


def test_batch_table_rows_fit_and_one_more_does_not():
    for fit in mf.batch_table(25.6e6, 86e6, 0.5):
        setup = mb.Setup("momentum", "fp32" if fit.label == "fp32" else "bf16",
                         checkpointing="checkpointing" in fit.label)
        memory = mf.GPU_MEMORY[fit.gpu]
        assert mb.budget(25.6e6, 86e6, int(fit.largest), setup, 0.5).total <= memory
        assert mb.budget(25.6e6, 86e6, int(fit.largest) + 1, setup, 0.5).total > memory


def test_zero3_on_64_gpus_fits_64_times_ddps_model():
    fits = {(f.gpu, f.label): f.largest for f in mf.model_table((64,))}
    assert fits["A100 SXM4 80GB", "ZeRO-3 on 64 GPUs"] == pytest.approx(64 * fits["A100 SXM4 80GB", "DDP on 64 GPUs"])
    assert fits["A100 SXM4 80GB", "DDP on 64 GPUs"] == pytest.approx(80e9 / 16)  # 16 bytes per parameter


def test_segments_group_leaves_by_top_level_child():
    layers = [LayerActivation("0", "Conv2d", (1,), 10, 3), LayerActivation("1.body.0", "Conv2d", (1,), 5, 7),
              LayerActivation("1.body.1", "ReLU", (1,), 2, 9)]
    assert mf.segment_activations(layers) == ([10.0, 7.0], [3.0, 7.0])


def test_format_names_every_gpu_and_label():
    text = mf.format_fits(mf.model_table((8,)), "params")
    assert "ZeRO-3 on 8 GPUs" in text and "A100 SXM4 80GB" in text
