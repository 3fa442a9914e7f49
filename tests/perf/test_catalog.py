"""The hardware catalog: every number has a source, and the derived link rates match the specifications."""

import pytest

from course.perf import catalog as hardware


def test_every_entry_cites_a_source():
    for entry in (*hardware.GPUS.values(), *hardware.LINKS.values()):
        assert "http" in entry.source, entry.name


def test_required_gpus_and_links_are_present():
    for name in ("K40", "M40", "P100 SXM2", "V100 SXM2", "A100 SXM4", "H100 SXM5"):
        assert hardware.gpu(name).memory_bandwidth > 0
    for name in ("PCIe 3.0 x16", "PCIe 4.0 x16", "PCIe 5.0 x16", "InfiniBand EDR", "InfiniBand HDR",
                 "InfiniBand NDR", "10GbE", "25GbE", "100GbE"):
        assert hardware.link(name).bandwidth > 0


def test_link_rates_match_the_published_totals():
    # PCIe 3.0 x16: 8 GT/s x 16 lanes, 128b/130b: 15.75 GB/s per direction
    assert hardware.link("PCIe 3.0 x16").bandwidth == pytest.approx(15.75e9, rel=1e-3)
    # NVLink: the whitepapers' bidirectional totals per GPU are twice the per-direction rate
    totals = {"NVLink 1 (P100, 4 links)": 160e9, "NVLink 2 (V100, 6 links)": 300e9,
              "NVLink 3 (A100, 12 links)": 600e9, "NVLink 4 (H100, 18 links)": 900e9}
    for name, total in totals.items():
        assert 2 * hardware.link(name).bandwidth == pytest.approx(total)


def test_peak_flops_falls_back_to_fp32_where_there_is_no_faster_unit():
    assert hardware.gpu("K40").peak_flops("fp16") == hardware.gpu("K40").fp32_flops
    assert hardware.gpu("A100 SXM4").peak_flops("fp16") == 312e12
    assert hardware.gpu("V100 SXM2").peak_flops("tf32") == 15.7e12
    with pytest.raises(ValueError, match="precision"):
        hardware.gpu("A100 SXM4").peak_flops("int8")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError, match="A100 SXM4"):
        hardware.gpu("A100")
    with pytest.raises(KeyError, match="PCIe 4.0 x16"):
        hardware.link("PCIe 4")
