"""The hardware catalog: every number has a source, and the derived link rates match the specifications."""

import pytest

from course.perf import catalog as hardware

pytestmark = pytest.mark.unit5


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
    # issue 33 item 5: BF16 has tensor cores from Ampere on; a V100 or P100 runs it at its FP32 rate
    for gpu in (hardware.gpu("V100 SXM2"), hardware.gpu("P100 SXM2")):
        assert gpu.peak_flops("bf16") == gpu.fp32_flops < gpu.peak_flops("fp16")
    assert hardware.gpu("A100 SXM4").peak_flops("bf16") == hardware.gpu("A100 SXM4").peak_flops("fp16") == 312e12
    with pytest.raises(ValueError, match="precision"):
        hardware.gpu("A100 SXM4").peak_flops("int8")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(KeyError, match="A100 SXM4"):
        hardware.gpu("A100")
    with pytest.raises(KeyError, match="PCIe 4.0 x16"):
        hardware.link("PCIe 4")


def test_every_link_names_a_known_transport_and_ethernet_switches_between_tcp_and_roce():
    for entry in hardware.LINKS.values():
        assert entry.transport in hardware.TRANSPORTS, entry.name
    roce = hardware.link("25GbE").over("roce")
    assert roce.transport == "roce" and roce.bandwidth == hardware.link("25GbE").bandwidth
    with pytest.raises(ValueError, match="Ethernet"):
        hardware.link("InfiniBand HDR").over("tcp")
    with pytest.raises(ValueError, match="transport"):
        hardware.link("25GbE").over("carrier pigeon")


def test_generation_is_read_from_the_name():
    assert hardware.gpu("A100 SXM4").generation == "Ampere"
    assert hardware.gpu("V100 SXM3 (DGX-2H)").generation == "Volta"
    assert hardware.gpu("P100 PCIe").generation == "Pascal"


def test_cuda_device_names_match_catalog_entries():
    assert hardware.match_gpu("NVIDIA A100-SXM4-80GB").name == "A100 SXM4 80GB"
    assert hardware.match_gpu("NVIDIA A100-SXM4-40GB").name == "A100 SXM4"
    assert hardware.match_gpu("Tesla V100-SXM2-16GB").name == "V100 SXM2"
    assert hardware.match_gpu("Tesla P100-PCIE-16GB").name == "P100 PCIe"
    assert hardware.match_gpu("NVIDIA H200").name == "H200 SXM"  # as torch named it on a lent H200
    assert hardware.match_gpu("NVIDIA H100 80GB HBM3").name == "H100 SXM5"
    assert hardware.match_gpu("NVIDIA GeForce RTX 4090") is None


def test_every_form_factor_has_its_own_peaks():
    # issue 44: an H100 PCIe or NVL is not an SXM5; the PCIe parts have their datasheets' lower rates
    sxm, pcie, nvl = (hardware.gpu(f"H100 {form}") for form in ("SXM5", "PCIe", "NVL"))
    assert pcie.peak_flops("bf16") == 756e12 < nvl.peak_flops("bf16") < sxm.peak_flops("bf16") == 989e12
    assert pcie.memory_bandwidth < sxm.memory_bandwidth < nvl.memory_bandwidth
    assert hardware.gpu("A100 PCIe 80GB").memory_bandwidth == 1935e9 < hardware.gpu("A100 SXM4 80GB").memory_bandwidth
    assert hardware.match_gpu("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert hardware.match_gpu("NVIDIA H100 NVL").name == "H100 NVL"
    assert hardware.match_gpu("NVIDIA A100-PCIE-40GB").name == "A100 PCIe"
    assert hardware.match_gpu("NVIDIA A100 80GB PCIe").name == "A100 PCIe 80GB"
