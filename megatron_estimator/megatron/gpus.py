"""GPUs people train on, with the memory each one lets a process use.

The capacity recorded for a GPU is what the device reports to the framework, not the
marketing figure: ``torch.cuda.get_device_properties(0).total_memory`` (cudaDeviceProp
``totalGlobalMem``; on ROCm the HIP equivalent, equal to rocm-smi's "VRAM Total Memory").
On NVIDIA data-center parts from Ampere on, that is 0.5-0.9 GiB *less* than the total
``nvidia-smi`` prints, because the driver keeps memory the CUDA runtime never sees (an H100
SXM shows 81559 MiB in nvidia-smi and reports 81082 MiB to PyTorch).  Both are kept: the
CUDA-visible figure is the budget, nvidia-smi's is there to recognise a machine by.

How each capacity is known is data (``memory_figure``), one of:

``cuda-reported``  ``total_memory`` as PyTorch printed it (whole MiB, rounded down).  Where
                   drivers differ by a few MiB, the smallest value seen is kept.
``oom-message``    derived from PyTorch's out-of-memory message "GPU 0 has a total capacity
                   of X GiB" (two decimals): the smallest whole MiB that prints as X.
``nvidia-smi``     no CUDA-visible figure is recorded; this is nvidia-smi's total, an upper
                   bound that likely overstates the usable memory by up to ~0.9 GiB.

Megatron asks one more thing of the GPU: ``get_device_arch_version()``
(megatron/training/utils/common_utils.py) is the compute capability's major number, and
``validate_args`` (megatron/training/arguments.py) demands ``CUDA_DEVICE_MAX_CONNECTIONS=1``
with tensor or context parallelism only while it is below 10 (before Blackwell).  ROCm
PyTorch reports gfx90a as 9.0, gfx942 as 9.4 and gfx950 as 9.5, so the check applies there.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_estimator.core.problems import InvalidInput, Problem
from megatron_estimator.core.units import MiB

CUDA_REPORTED = "cuda-reported"
OOM_MESSAGE = "oom-message"
NVIDIA_SMI = "nvidia-smi"
MEMORY_FIGURES = (CUDA_REPORTED, OOM_MESSAGE, NVIDIA_SMI)


@dataclass(frozen=True)
class GpuSpec:
    name: str                               # canonical catalog name, e.g. "h100-sxm-80gb"
    aliases: tuple[str, ...]                # other names people type ("h100", "h100-sxm", ...)
    device_names: tuple[str, ...]           # as the device names itself (torch.cuda.get_device_name)
    vendor: str                             # "nvidia" | "amd"
    architecture: str                       # "Hopper", "CDNA 3 (gfx942)", ...
    compute_capability: tuple[int, int]     # torch.cuda.get_device_capability(); ROCm's mapping for AMD
    total_memory_bytes: int                 # the memory a process can use: the budget
    memory_figure: str                      # how total_memory_bytes is known (see MEMORY_FIGURES)
    nvidia_smi_mib: int | None              # nvidia-smi's memory.total; None for AMD
    nominal: str                            # the datasheet's figure, for people
    source: str                             # where the figure comes from

    @property
    def total_memory_mib(self) -> float:
        return self.total_memory_bytes / MiB

    @property
    def compute_capability_value(self) -> float:
        """``9.0``, ``10.3``: the form memory/overhead.py compares against."""
        major, minor = self.compute_capability
        return major + minor / 10

    @property
    def arch_version(self) -> int:
        """Megatron's ``get_device_arch_version()``: the compute capability's major number."""
        return self.compute_capability[0]

    @property
    def needs_cuda_device_max_connections_1(self) -> bool:
        """Whether Megatron requires ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with TP or CP > 1 here."""
        return self.arch_version < 10


def _mib(n: int) -> int:
    return n * MiB


_AMPERE, _HOPPER, _BLACKWELL = "Ampere", "Hopper", "Blackwell"

GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(
        "a100-sxm-40gb", ("a100-40gb", "a100-sxm4-40gb", "a100-40gb-sxm"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        "nvidia", _AMPERE, (8, 0), _mib(40536), CUDA_REPORTED, 40960, "40 GB HBM2",
        "cudaDeviceProp total_memory=40536MB; PyTorch OOM messages read '39.59 GiB total capacity'",
    ),
    GpuSpec(
        "a100-pcie-40gb", ("a100-40gb-pcie",), ("NVIDIA A100-PCIE-40GB",),
        "nvidia", _AMPERE, (8, 0), _mib(40326), CUDA_REPORTED, 40960, "40 GB HBM2",
        "torch.cuda.get_device_properties total_memory=40326MB (torch 1.9, CUDA 11.1)",
    ),
    GpuSpec(
        "a100-sxm-80gb", ("a100-80gb", "a100-sxm4-80gb", "a100-80gb-sxm"), ("NVIDIA A100-SXM4-80GB",),
        "nvidia", _AMPERE, (8, 0), _mib(81045), OOM_MESSAGE, 81920, "80 GB HBM2e",
        "PyTorch OOM messages on A100 80GB: 'GPU 0 has a total capacity of 79.15 GiB'",
    ),
    GpuSpec(
        "a100-pcie-80gb", ("a100-80gb-pcie",), ("NVIDIA A100 80GB PCIe",),
        "nvidia", _AMPERE, (8, 0), _mib(81920), NVIDIA_SMI, 81920, "80 GB HBM2e",
        "nvidia-smi memory.total 81920 MiB; CUDA sees less (the SXM part reports about 79.15 GiB)",
    ),
    GpuSpec(
        "h100-sxm-80gb", ("h100", "h100-80gb", "h100-sxm", "h100-sxm5", "h100-hbm3", "h100-80gb-hbm3"),
        ("NVIDIA H100 80GB HBM3",),
        "nvidia", _HOPPER, (9, 0), _mib(81082), CUDA_REPORTED, 81559, "80 GB HBM3",
        "torch.cuda.get_device_properties total_memory=81082MB (81082-81090 MiB across drivers); "
        "nvidia-smi 81559 MiB",
    ),
    GpuSpec(
        "h100-pcie-80gb", ("h100-pcie", "h100-80gb-pcie"), ("NVIDIA H100 PCIe",),
        "nvidia", _HOPPER, (9, 0), _mib(81008), CUDA_REPORTED, 81559, "80 GB HBM2e",
        "torch.cuda.get_device_properties total_memory=81008MB; nvidia-smi 81559 MiB",
    ),
    GpuSpec(
        "h100-nvl-94gb", ("h100-nvl", "h100-94gb"), ("NVIDIA H100 NVL",),
        "nvidia", _HOPPER, (9, 0), _mib(95320), OOM_MESSAGE, 95830, "94 GB HBM3",
        "PyTorch OOM messages on H100 NVL: 'total capacity of 93.09 GiB'; nvidia-smi 95830 MiB",
    ),
    GpuSpec(
        "h200", ("h200-141gb", "h200-sxm", "h200-sxm-141gb"), ("NVIDIA H200",),
        "nvidia", _HOPPER, (9, 0), _mib(143156), CUDA_REPORTED, 143771, "141 GB HBM3e",
        "torch.cuda.get_device_properties total_memory=143156MB (OOM messages: 139.80 GiB); "
        "nvidia-smi 143771 MiB",
    ),
    GpuSpec(
        "h20", ("h20-96gb",), ("NVIDIA H20",),
        "nvidia", _HOPPER, (9, 0), _mib(97285), CUDA_REPORTED, 97871, "96 GB HBM3",
        "torch.cuda.get_device_properties total_memory=97285MB; nvidia-smi 97871 MiB",
    ),
    GpuSpec(
        "b200", ("b200-180gb", "b200-sxm", "hgx-b200"), ("NVIDIA B200",),
        "nvidia", _BLACKWELL, (10, 0), _mib(182631), CUDA_REPORTED, 183359, "180 GB HBM3e",
        "torch.cuda.get_device_properties total_memory=182631MB (182631-182642 MiB across drivers; "
        "OOM messages: 178.35 GiB); nvidia-smi 183359 MiB",
    ),
    GpuSpec(
        "gb200", ("gb200-nvl72", "gb200-186gb"), ("NVIDIA GB200",),
        "nvidia", _BLACKWELL, (10, 0), _mib(188729), OOM_MESSAGE, 189471, "186 GB HBM3e",
        "PyTorch OOM messages on GB200: 'total capacity of 184.31 GiB'; nvidia-smi 189471 MiB",
    ),
    GpuSpec(
        "b300", ("b300-sxm", "b300-sxm6", "b300-288gb", "hgx-b300"), ("NVIDIA B300 SXM6 AC", "NVIDIA B300"),
        "nvidia", "Blackwell Ultra", (10, 3), _mib(274110), OOM_MESSAGE, 275040, "288 GB HBM3e",
        "PyTorch OOM messages on B300: 'total capacity of 267.69 GiB'; nvidia-smi 275040 MiB",
    ),
    GpuSpec(
        "gb300", ("gb300-nvl72", "gb300-288gb"), ("NVIDIA GB300",),
        "nvidia", "Blackwell Ultra", (10, 3), _mib(283131), OOM_MESSAGE, 284208, "288 GB HBM3e",
        "PyTorch OOM messages on GB300 (NVL72 tray): 'total capacity of 276.50 GiB'; nvidia-smi "
        "284208 MiB (the DGX Station GB300 has less memory: 256703 MiB in nvidia-smi)",
    ),
    GpuSpec(
        "l40s", ("l40s-48gb",), ("NVIDIA L40S",),
        "nvidia", "Ada Lovelace", (8, 9), _mib(45589), CUDA_REPORTED, 46068, "48 GB GDDR6",
        "torch.cuda.get_device_properties total_memory=45589MB; nvidia-smi 46068 MiB",
    ),
    GpuSpec(
        "l4", ("l4-24gb",), ("NVIDIA L4",),
        "nvidia", "Ada Lovelace", (8, 9), _mib(23034), NVIDIA_SMI, 23034, "24 GB GDDR6",
        "nvidia-smi memory.total 23034 MiB",
    ),
    GpuSpec(
        "a10", ("a10-24gb",), ("NVIDIA A10",),
        "nvidia", _AMPERE, (8, 6), _mib(23028), NVIDIA_SMI, 23028, "24 GB GDDR6",
        "nvidia-smi memory.total 23028 MiB",
    ),
    GpuSpec(
        "v100-16gb", ("v100-sxm2-16gb", "v100-pcie-16gb", "v100-sxm-16gb"),
        ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"),
        "nvidia", "Volta", (7, 0), _mib(16130), CUDA_REPORTED, 16160, "16 GB HBM2",
        "torch.cuda.get_device_properties total_memory=16130MB (16160MB with other drivers)",
    ),
    GpuSpec(
        "v100-32gb", ("v100-sxm2-32gb", "v100-pcie-32gb", "v100-sxm-32gb"),
        ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"),
        "nvidia", "Volta", (7, 0), _mib(32494), CUDA_REPORTED, 32510, "32 GB HBM2",
        "torch.cuda.get_device_properties total_memory=32494MB (V100-SXM2-32GB, torch 2.6); 32510MB "
        "on V100-PCIE-32GB",
    ),
    GpuSpec(
        "rtx-a6000", ("a6000", "rtxa6000"), ("NVIDIA RTX A6000",),
        "nvidia", _AMPERE, (8, 6), _mib(48676), CUDA_REPORTED, 49140, "48 GB GDDR6",
        "torch.cuda.get_device_properties total_memory=48676MB; nvidia-smi 49140 MiB",
    ),
    GpuSpec(
        "rtx-4090", ("4090", "geforce-rtx-4090"), ("NVIDIA GeForce RTX 4090",),
        "nvidia", "Ada Lovelace", (8, 9), _mib(24563), CUDA_REPORTED, 24564, "24 GB GDDR6X",
        "torch.cuda.get_device_properties total_memory=24563MB; nvidia-smi 24564 MiB",
    ),
    GpuSpec(
        "mi250x", ("mi250x-gcd", "mi250"), ("AMD Instinct MI250X", "AMD Instinct MI250X/MI250"),
        "amd", "CDNA 2 (gfx90a)", (9, 0), _mib(65520), CUDA_REPORTED, None,
        "64 GB HBM2e per GCD (128 GB per module of two GCDs, each its own device)",
        "torch.cuda.get_device_properties total_memory=65520MB per GCD; KFD size_in_bytes 68702699520",
    ),
    GpuSpec(
        "mi300x", ("mi300x-192gb",), ("AMD Instinct MI300X",),
        "amd", "CDNA 3 (gfx942)", (9, 4), _mib(196592), CUDA_REPORTED, None, "192 GB HBM3",
        "torch.cuda.get_device_properties total_memory=196592MB; rocm-smi VRAM Total Memory "
        "206141652992 B (SPX/NPS1)",
    ),
    GpuSpec(
        "mi325x", ("mi325x-256gb", "mi325"), ("AMD Instinct MI325X",),
        "amd", "CDNA 3 (gfx942)", (9, 4), _mib(262119), OOM_MESSAGE, None, "256 GB HBM3E",
        "HIP OOM messages on MI325X: 'total capacity of 255.98 GiB' (likely exactly 262128 MiB, "
        "256 GiB less 16 MiB, as MI300X and MI355X report)",
    ),
    GpuSpec(
        "mi355x", ("mi355x-288gb", "mi355"), ("AMD Instinct MI355X",),
        "amd", "CDNA 4 (gfx950)", (9, 5), _mib(294896), CUDA_REPORTED, None, "288 GB HBM3E",
        "hipDeviceProp totalGlobalMem and rocm-smi VRAM Total Memory 309220868096 B "
        "(OOM messages: 287.98 GiB)",
    ),
)

# Names that fit more than one GPU of different capacity: an answer would be a guess.
_AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "a100": ("a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb"),
    "a100-sxm": ("a100-sxm-40gb", "a100-sxm-80gb"),
    "a100-sxm4": ("a100-sxm-40gb", "a100-sxm-80gb"),
    "a100-pcie": ("a100-pcie-40gb", "a100-pcie-80gb"),
    "v100": ("v100-16gb", "v100-32gb"),
    "v100-sxm2": ("v100-16gb", "v100-32gb"),
    "v100-pcie": ("v100-16gb", "v100-32gb"),
}

_VENDOR_PREFIXES = ("nvidiageforce", "nvidia", "amdinstinct", "amd", "instinct", "tesla", "geforce")


def _key(name: str) -> str:
    return "".join(filter(str.isalnum, name.lower()))


def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in GPUS:
        for spelling in (spec.name, *spec.aliases, *spec.device_names):
            index.setdefault(_key(spelling), spec)
    return index


_BY_KEY = _index()
_AMBIGUOUS_BY_KEY = {_key(name): choices for name, choices in _AMBIGUOUS.items()}


def gpu_names() -> tuple[str, ...]:
    """Every canonical catalog name, in catalog order (by vendor and generation)."""
    return tuple(spec.name for spec in GPUS)


def _find(name: str) -> GpuSpec | tuple[str, ...] | None:
    key = _key(name)
    candidates = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            candidates.append(key[len(prefix):])
    for candidate in candidates:
        if candidate in _BY_KEY:
            return _BY_KEY[candidate]
        if candidate in _AMBIGUOUS_BY_KEY:
            return _AMBIGUOUS_BY_KEY[candidate]
    return None


def find_gpu(name: str) -> GpuSpec | None:
    """The GPU a name (catalog name, alias, or the device's own name) means, or None."""
    found = _find(name)
    return found if isinstance(found, GpuSpec) else None


def lookup_gpu(name: str, location: str = "--gpu") -> GpuSpec:
    """The GPU ``name`` means; raises InvalidInput (``unknown-gpu`` / ``ambiguous-gpu``) naming ``location``."""
    found = _find(name)
    if isinstance(found, GpuSpec):
        return found
    if found is not None:
        raise InvalidInput([Problem(
            "ambiguous-gpu", location,
            f"{name!r} names GPUs of different memory sizes; say which: {', '.join(found)}",
        )])
    from megatron_estimator.core.hints import closest

    spellings: dict[str, str] = {}
    for spec in GPUS:
        for spelling in (spec.name, *spec.aliases):
            spellings.setdefault(spelling, spec.name)
    for ambiguous in _AMBIGUOUS:
        spellings.setdefault(ambiguous, ambiguous)
    near = closest(name.strip().lower().replace(" ", "-").replace("_", "-"), spellings)
    hint = ""
    if near is not None:
        canonical = spellings[near]
        hint = f"; did you mean {near}?" if near == canonical else f"; did you mean {near} ({canonical})?"
    raise InvalidInput([Problem(
        "unknown-gpu", location,
        f"unknown GPU {name!r}{hint} (known GPUs: {', '.join(gpu_names())})",
    )])
