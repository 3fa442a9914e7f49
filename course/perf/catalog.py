"""The hardware the performance model runs on: GPUs and the links between them, each number with its source.

Nothing here is measured on this machine. Every figure is a vendor's or a standard's *peak* (datasheet,
architecture whitepaper, specification), copied with the address it comes from in the entry's ``source``.
What a training step actually reaches is a fraction of these peaks; that fraction is an *assumption* of
:mod:`course.perf.model` (its :class:`~course.perf.model.Assumptions`), never a catalog number.

Units: FLOP/s, bytes/s, bytes. Link bandwidths are **per direction, per GPU** (what one GPU can send while it
receives as much), the rate the alpha-beta model's ``1/β`` stands for (:mod:`course.collectives.cost_model`); vendors
often
quote the bidirectional sum, which is twice that. Taught in ``notebooks/05_ddp.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9  # decimal giga: datasheets quote GB/s and GB in powers of ten
BF16_GENERATIONS = ("Ampere", "Hopper")  # BF16 tensor cores arrived with Ampere (Ampere whitepaper, Table 1)

_KEPLER = ("NVIDIA Tesla K40 board specification BD-06902-001: "
           "https://www.nvidia.com/content/PDF/kepler/Tesla-K40-PCIe-Passive-Board-Spec-BD-06902-001_v05.pdf")
_M40 = ("NVIDIA Tesla M40 product brief PB-07859-001; figures restated at "
        "https://www.microway.com/hpc-tech-tips/nvidia-tesla-m40-24gb-gpu-accelerator-maxwell-gm200-close")
_PASCAL = "https://images.nvidia.com/content/pdf/tesla/whitepaper/pascal-architecture-whitepaper.pdf"
_VOLTA = "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"
_AMPERE = ("https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper"
           ".pdf")
_HOPPER = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM column of the specifications table)"
_A100_DATASHEET = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                   "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (SXM and PCIe columns)")
_H100_DATASHEET = ("https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
                   "(H100 SXM, H100 NVL and H100 PCIe columns; dense rates are half the sparse ones quoted)")
_PCIE = "https://pcisig.com/specifications (8, 16, 32 GT/s per lane, 128b/130b encoding, x16)"
_IB = "https://www.infinibandta.org/infiniband-roadmap/ (4x EDR 100, HDR 200, NDR 400 Gb/s)"
_ETHERNET_FAST = "IEEE 802.3bs (200GbE, 400GbE): https://www.ieee802.org/3/bs/"
_ETHERNET = "IEEE 802.3ae (10GbE), 802.3by (25GbE), 802.3cd (50GbE), 802.3ba (100GbE): https://www.ieee802.org/3/"


@dataclass(frozen=True)
class Gpu:
    """One GPU's peak rates, as its datasheet states them.

    Attributes:
        name: model and form factor, e.g. ``"V100 SXM2"``.
        fp32_flops: peak dense FP32 FLOP/s (a fused multiply-add counts 2).
        tf32_flops: peak dense TF32 tensor-core FLOP/s; None where the GPU has no TF32 (before Ampere).
        fp16_flops: peak dense FP16/BF16 FLOP/s (tensor cores from Volta on); None where 16-bit runs no
            faster than FP32 (Kepler, Maxwell).
        memory_bandwidth: peak device-memory bandwidth, bytes/s.
        memory_bytes: device memory, bytes.
        source: where these numbers come from.
    """

    name: str
    fp32_flops: float
    tf32_flops: float | None
    fp16_flops: float | None
    memory_bandwidth: float
    memory_bytes: float
    source: str

    @property
    def generation(self) -> str:
        """The architecture, read from the name: ``"Kepler"``, ``"Maxwell"``, ``"Pascal"``, ``"Volta"``, ...."""
        families = {"K": "Kepler", "M": "Maxwell", "P": "Pascal", "V": "Volta", "A": "Ampere", "H": "Hopper"}
        return families.get(self.name[0], "unknown")

    @property
    def has_bf16(self) -> bool:
        """Whether the GPU has BF16 tensor cores: from Ampere on (Ampere whitepaper). A V100's or P100's 16-bit
        units take FP16 only; BF16 there runs at the FP32 rate at best."""
        return self.generation in BF16_GENERATIONS

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s at ``precision`` (``"fp32"``, ``"tf32"``, ``"fp16"``, ``"bf16"``, ``"amp"``), falling back
        to FP32 where the GPU has no faster unit for it (a K40 runs FP16 at its FP32 rate at best; a V100 runs
        BF16 at its FP32 rate, not its FP16 tensor-core rate).

        Raises:
            ValueError: unknown precision.
        """
        half = self.fp16_flops  # FP16 and BF16 tensor cores run at one rate; "amp" is autocast (16-bit math)
        bf16 = half if self.has_bf16 else None  # before Ampere no unit runs BF16 faster than FP32
        rates = {"fp32": self.fp32_flops, "tf32": self.tf32_flops, "fp16": half, "bf16": bf16, "amp": half}
        if precision not in rates:
            raise ValueError(f"precision must be one of {sorted(rates)}, got {precision!r}.")
        return rates[precision] or self.fp32_flops


#: How software moves bytes over a link; each has its own sustained efficiency and latency
#: (:mod:`course.perf.microbench` fits them). Ethernet carries either TCP (sockets) or RoCE (RDMA).
TRANSPORTS = ("nvlink", "pcie", "infiniband", "roce", "tcp")


@dataclass(frozen=True)
class Link:
    """A link, at its peak rate per direction.

    Attributes:
        name: e.g. ``"PCIe 3.0 x16"`` or ``"NVLink 3 (A100, 12 links)"``.
        bandwidth: peak bytes/s one GPU (or one node's adapter) sends per direction.
        source: where the number comes from.
        transport: one of :data:`TRANSPORTS`: how an allreduce's bytes cross it.
    """

    name: str
    bandwidth: float
    source: str
    transport: str = "pcie"

    def over(self, transport: str) -> Link:
        """The same wire used through another transport, e.g. 25GbE with RoCE instead of TCP.

        Raises:
            ValueError: unknown transport, or one the wire cannot carry (RoCE/TCP need Ethernet).
        """
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}.")
        if (transport in ("roce", "tcp")) != (self.transport in ("roce", "tcp")):
            raise ValueError(f"{self.name} carries {self.transport}; only an Ethernet link switches between "
                             f"'tcp' and 'roce' (got {transport!r}).")
        return replace(self, name=f"{self.name.split(' (')[0]} ({transport})", transport=transport)


GPUS: dict[str, Gpu] = {gpu.name: gpu for gpu in (
    # Kepler: 4.29 TFLOP/s FP32 at boost clock, 288 GB/s GDDR5, 12 GB (board specification).
    Gpu("K40", 4.29e12, None, None, 288 * GB, 12 * GB, _KEPLER),
    # Maxwell: 7 TFLOP/s FP32, 288 GB/s, 12 GB (a later card has 24 GB, same rates).
    Gpu("M40", 7.0e12, None, None, 288 * GB, 12 * GB, _M40),
    # Pascal SXM2: 10.6 TFLOP/s FP32, 21.2 FP16, 732 GB/s HBM2, 16 GB (whitepaper, Table 1).
    Gpu("P100 SXM2", 10.6e12, None, 21.2e12, 732 * GB, 16 * GB, _PASCAL),
    # Pascal PCIe: 9.3 TFLOP/s FP32, 18.7 FP16, 732 GB/s (16 GB card) (whitepaper, Table 1).
    Gpu("P100 PCIe", 9.3e12, None, 18.7e12, 732 * GB, 16 * GB, _PASCAL),
    # Volta SXM2: 15.7 TFLOP/s FP32, 125 tensor (FP16), 900 GB/s HBM2, 16 or 32 GB (whitepaper, Table 1).
    Gpu("V100 SXM2", 15.7e12, None, 125e12, 900 * GB, 16 * GB, _VOLTA),
    # Ampere SXM4 40 GB: 19.5 FP32, 156 TF32, 312 BF16/FP16 dense, 1555 GB/s HBM2 (whitepaper, Table 1).
    Gpu("A100 SXM4", 19.5e12, 156e12, 312e12, 1555 * GB, 40 * GB, _AMPERE),
    # Volta SXM3 in a DGX-2H (450 W, higher clocks): 130 TFLOP/s FP16 tensor, the peak Megatron-LM's authors
    # measure their 48% against (62.4 TFLOP/s, https://nv-adlr.github.io/MegatronLMV1); 32 GB.
    Gpu("V100 SXM3 (DGX-2H)", 16.4e12, None, 130e12, 900 * GB, 32 * GB,
        _VOLTA + "; https://nv-adlr.github.io/MegatronLMV1"),
    # Ampere SXM4 80 GB: the same peaks, 2039 GB/s HBM2e (A100 datasheet).
    Gpu("A100 SXM4 80GB", 19.5e12, 156e12, 312e12, 2039 * GB, 80 * GB, _AMPERE),
    # Hopper SXM5: 67 FP32, 495 TF32 and 989 BF16 dense (half the 990 and 1979 sparse), 3.35 TB/s HBM3, 80 GB.
    Gpu("H100 SXM5", 67e12, 495e12, 989e12, 3350 * GB, 80 * GB, _HOPPER),
    # Ampere PCIe (250-300 W): the SXM part's peaks at the datasheet's level; 1555 GB/s (40 GB), 1935 GB/s (80 GB).
    Gpu("A100 PCIe", 19.5e12, 156e12, 312e12, 1555 * GB, 40 * GB, _A100_DATASHEET),
    Gpu("A100 PCIe 80GB", 19.5e12, 156e12, 312e12, 1935 * GB, 80 * GB, _A100_DATASHEET),
    # Hopper PCIe (350 W, HBM2e): 51 FP32, 378 TF32, 756 BF16 dense, 2.0 TB/s, 80 GB.
    Gpu("H100 PCIe", 51e12, 378e12, 756e12, 2000 * GB, 80 * GB, _H100_DATASHEET),
    # Hopper NVL (400 W, per GPU of the pair): 60 FP32, 417.5 TF32, 835.5 BF16 dense, 3.9 TB/s HBM3, 94 GB.
    Gpu("H100 NVL", 60e12, 417.5e12, 835.5e12, 3900 * GB, 94 * GB, _H100_DATASHEET),
    # Hopper H200 SXM: the H100's compute peaks, with 141 GB of HBM3e at 4.8 TB/s (H200 datasheet).
    Gpu("H200 SXM", 67e12, 495e12, 989e12, 4800 * GB, 141 * GB, _H200),
)}

LINKS: dict[str, Link] = {link.name: link for link in (
    # PCIe x16 per direction: lanes x GT/s x 128/130 / 8 bits.
    Link("PCIe 3.0 x16", 16 * 8e9 * 128 / 130 / 8, _PCIE, "pcie"),
    Link("PCIe 4.0 x16", 16 * 16e9 * 128 / 130 / 8, _PCIE, "pcie"),
    Link("PCIe 5.0 x16", 16 * 32e9 * 128 / 130 / 8, _PCIE),
    # NVLink per GPU per direction: links x per-link rate (the whitepapers quote twice this, bidirectional).
    Link("NVLink 1 (P100, 4 links)", 4 * 20 * GB, _PASCAL, "nvlink"),
    Link("NVLink 2 (V100, 6 links)", 6 * 25 * GB, _VOLTA, "nvlink"),
    Link("NVLink 3 (A100, 12 links)", 12 * 25 * GB, _AMPERE, "nvlink"),
    Link("NVLink 4 (H100, 18 links)", 18 * 25 * GB, _HOPPER, "nvlink"),
    # NVSwitch connects every GPU of a DGX/HGX to every other at its full NVLink rate (Ampere whitepaper).
    Link("NVSwitch (A100, NVLink 3)", 12 * 25 * GB, _AMPERE, "nvlink"),
    Link("NVSwitch (V100 DGX-2, NVLink 2)", 6 * 25 * GB, _VOLTA, "nvlink"),
    Link("NVSwitch (H100, NVLink 4)", 18 * 25 * GB, _HOPPER, "nvlink"),
    # Networks: signalling rate in bits/s over 8, per adapter (a cluster says how many per node). Ethernet is
    # listed as TCP; `.over("roce")` gives the same wire with RDMA.
    Link("InfiniBand EDR", 100e9 / 8, _IB, "infiniband"),
    Link("InfiniBand HDR", 200e9 / 8, _IB, "infiniband"),
    Link("InfiniBand NDR", 400e9 / 8, _IB, "infiniband"),
    Link("10GbE", 10e9 / 8, _ETHERNET, "tcp"),
    Link("25GbE", 25e9 / 8, _ETHERNET, "tcp"),
    Link("50GbE", 50e9 / 8, _ETHERNET, "tcp"),
    Link("100GbE", 100e9 / 8, _ETHERNET, "tcp"),
    Link("200GbE", 200e9 / 8, _ETHERNET_FAST, "tcp"),
    Link("400GbE", 400e9 / 8, _ETHERNET_FAST, "tcp"),
)}


def gpu(name: str) -> Gpu:
    """The catalog entry for ``name``.

    Raises:
        KeyError: unknown name, listing the known ones.
    """
    if name not in GPUS:
        raise KeyError(f"no GPU {name!r} in the catalog; known: {sorted(GPUS)}.")
    return GPUS[name]


def link(name: str) -> Link:
    """The catalog entry for ``name``.

    Raises:
        KeyError: unknown name, listing the known ones.
    """
    if name not in LINKS:
        raise KeyError(f"no link {name!r} in the catalog; known: {sorted(LINKS)}.")
    return LINKS[name]


def match_gpu(device_name: str) -> Gpu | None:
    """The catalog entry for a name as CUDA reports it (``torch.cuda.get_device_name()``, e.g.
    ``"NVIDIA A100-SXM4-80GB"``), or None when the catalog has no such GPU."""
    name = device_name.upper().replace("-", " ")
    for family in ("H200", "H100", "A100", "V100", "P100", "M40", "K40"):
        if family in name:
            candidates = [gpu for gpu in GPUS.values() if gpu.name.upper().startswith(family)]
            for gpu in candidates:
                form = gpu.name.upper().split()[1] if " " in gpu.name else ""
                if form and form in name and ("80GB" in gpu.name.upper()) == ("80GB" in name.replace(" ", "")):
                    return gpu
            return candidates[0]
    return None
