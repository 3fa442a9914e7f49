"""course.perf.context_expert against closed forms: CP divides activations by its size, the ring's bytes, when a
ring step hides its transfer, EP's bytes per token, and the records' rows."""

import pytest

from course.perf import catalog
from course.perf import context_expert as ce

pytestmark = pytest.mark.unit8b  # notebook 08b, though the folder is notebook 05's

H100 = catalog.gpu("H100 SXM5")
NVSWITCH, NDR = catalog.link("NVSwitch (H100, NVLink 4)"), catalog.link("InfiniBand NDR")


def test_activations_follow_korthikanti_and_cp_divides_them():
    s, b, h, a = 4096, 1, 4096, 32
    assert ce.activation_bytes_per_layer(s, b, h, a, flash=False) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert ce.activation_bytes_per_layer(s, b, h, a) == pytest.approx(34 * s * b * h)
    for cp in (2, 4, 16):
        assert ce.activation_bytes_per_layer(s, b, h, a, 8, cp) == pytest.approx(34 * s * b * h / 8 / cp)


def test_ring_bytes_are_n_minus_one_blocks_forward():
    sent = ce.ring_bytes_per_layer(1024, 2, 8, 64, 4, element_size=2)
    block = 2 * 2 * 256 * 8 * 64 * 2
    assert sent == {"forward": 3 * block, "backward": 7 * block}


def test_a_ring_step_hides_long_blocks_and_not_short_ones_over_infiniband():
    long = ce.ring_step(H100, NDR, 131_072, 1, 128, 8, 128, 16)
    short = ce.ring_step(H100, NDR, 16_384, 1, 8, 8, 128, 16)
    assert long.hidden and not short.hidden
    # compute grows with L², transfer with L: doubling the block quadruples one and doubles the other
    twice = ce.ring_step(H100, NDR, 32_768, 1, 8, 8, 128, 16)
    assert twice.compute_s == pytest.approx(4 * short.compute_s) and twice.transfer_s == pytest.approx(
        2 * short.transfer_s)


def test_ep_bytes_per_token_and_the_node_boundary():
    assert ce.ep_bytes_per_token(1, 1, 2) == pytest.approx(4.0)  # half of one copy leaves, 2+2 bytes, x2 (backward)
    assert ce.ep_bytes_per_token(7168, 8, 64, 1, 2, copies=4) == pytest.approx(2 * 4 * 7168 * 3)
    # fine-grained experts (DeepSeek-V3's shape): hidden behind compute over NVLink, not over InfiniBand
    inside = ce.ep_layer(H100, NVSWITCH.bandwidth, 7168, 2048, 8, 64)
    across = ce.ep_layer(H100, NDR.bandwidth, 7168, 2048, 8, 64)
    assert inside.ratio / across.ratio == pytest.approx(NVSWITCH.bandwidth / NDR.bandwidth)
    assert inside.ratio > 1 > across.ratio
    # wide experts (Mixtral's shape) do more compute per byte moved
    assert ce.ep_layer(H100, NDR.bandwidth, 4096, 14_336, 2, 8).ratio > across.ratio


def test_records_cite_their_sources_and_rows_have_the_table_fields():
    for entry in ce.RECORDS:
        assert "arXiv:" in entry.source and entry.setup
    fields = {"kind", "claim", "source", "published", "modelled", "unit", "assumed"}
    for row in ce.rows():
        assert set(row) == fields
        if row["kind"] == "arithmetic":
            assert row["modelled"] == pytest.approx(row["published"])
        else:
            assert row["assumed"] and abs(row["modelled"] / row["published"] - 1) < 0.3
    with pytest.raises(ValueError, match="no record named"):
        ce.record("GPT-5")
