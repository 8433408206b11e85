"""GPUs people train on, with the memory each one lets a process use.

The catalog is data: ``data/gpus.tsv``, one row per GPU with named columns and each row's
source; ``load_gpus`` reads it into ``GPUS`` (to add a GPU, add a row).

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
from megatron_estimator.core.resources import read_data_text
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


GPU_FILE = "gpus.tsv"


def load_gpus() -> tuple[GpuSpec, ...]:
    """The catalog, data/gpus.tsv: one GpuSpec per row, in the file's order; the header
    comment says what each column holds and every row states its source."""
    lines = [line for line in read_data_text(GPU_FILE).splitlines() if line and not line.startswith("#")]
    header = lines[0].split("\t")
    specs = []
    for line in lines[1:]:
        row = dict(zip(header, line.split("\t")))
        major, minor = row["compute_capability"].split(".")
        if row["memory_figure"] not in MEMORY_FIGURES:
            raise ValueError(f"{GPU_FILE}: {row['name']}: memory_figure {row['memory_figure']!r} is not one of {MEMORY_FIGURES}")
        specs.append(GpuSpec(
            row["name"], tuple(filter(None, row["aliases"].split("|"))), tuple(filter(None, row["device_names"].split("|"))),
            row["vendor"], row["architecture"], (int(major), int(minor)), int(row["cuda_visible_mib"]) * MiB,
            row["memory_figure"], int(row["nvidia_smi_mib"]) if row["nvidia_smi_mib"] else None,
            row["nominal"], row["source"],
        ))
    return tuple(specs)


GPUS: tuple[GpuSpec, ...] = load_gpus()

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
