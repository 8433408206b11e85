"""The GPU catalog and GPU name lookup (megatron_estimator/megatron/gpus.py)."""

from __future__ import annotations

import pytest

from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.core.units import GiB, MiB
from megatron_estimator.megatron.gpus import (
    CUDA_REPORTED, GPUS, MEMORY_FIGURES, NVIDIA_SMI, OOM_MESSAGE, find_gpu, gpu_names, lookup_gpu,
)


# --- the catalog -------------------------------------------------------------------------

@pytest.mark.parametrize("name, total_bytes", [
    ("h100-sxm-80gb", 85_020_639_232),     # torch total_memory=81082MB (nvidia-smi: 81559 MiB)
    ("h100-pcie-80gb", 84_943_044_608),    # 81008 MiB
    ("a100-sxm-40gb", 42_505_076_736),     # 40536 MiB
    ("a100-sxm-80gb", 84_981_841_920),     # 81045 MiB, the smallest that prints as 79.15 GiB
    ("h200", 150_109_945_856),             # 143156 MiB
    ("b200", 191_502_483_456),             # 182631 MiB
    ("mi250x", 68_702_699_520),            # KFD size_in_bytes, one GCD
    ("mi300x", 206_141_652_992),           # rocm-smi "VRAM Total Memory (B)"
    ("mi355x", 309_220_868_096),           # hipDeviceProp totalGlobalMem
])
def test_capacities_are_the_device_reported_bytes(name, total_bytes):
    assert lookup_gpu(name).total_memory_bytes == total_bytes


def test_nvidia_smi_totals_as_nvidia_smi_prints_them():
    expected = {
        "a100-sxm-40gb": 40960, "a100-sxm-80gb": 81920, "h100-sxm-80gb": 81559, "h100-pcie-80gb": 81559,
        "h100-nvl-94gb": 95830, "h200": 143771, "h20": 97871, "b200": 183359, "gb200": 189471,
        "b300": 275040, "gb300": 284208, "l40s": 46068, "l4": 23034, "a10": 23028, "rtx-a6000": 49140,
    }
    assert {name: lookup_gpu(name).nvidia_smi_mib for name in expected} == expected
    assert all(spec.nvidia_smi_mib is None for spec in GPUS if spec.vendor == "amd")


def test_every_capacity_says_how_it_is_known_and_agrees_with_its_source():
    for spec in GPUS:
        assert spec.memory_figure in MEMORY_FIGURES, spec.name
        assert spec.total_memory_bytes % MiB == 0, spec.name
        mib = spec.total_memory_bytes // MiB
        if spec.memory_figure == CUDA_REPORTED:
            assert f"total_memory={mib}MB" in spec.source or str(spec.total_memory_bytes) in spec.source, spec.name
        elif spec.memory_figure == OOM_MESSAGE:
            shown = f"{spec.total_memory_bytes / GiB:.2f}"
            assert f"{shown} GiB" in spec.source, spec.name
            # the smallest whole MiB that PyTorch's message would print as that figure
            assert f"{(spec.total_memory_bytes - MiB) / GiB:.2f}" != shown, spec.name
        else:
            assert spec.memory_figure == NVIDIA_SMI
            assert mib == spec.nvidia_smi_mib and f"{mib} MiB" in spec.source, spec.name


def test_cuda_sees_less_than_nvidia_smi_on_data_center_parts():
    for spec in GPUS:
        if spec.nvidia_smi_mib is not None and spec.memory_figure != NVIDIA_SMI:
            shortfall = spec.nvidia_smi_mib * MiB - spec.total_memory_bytes
            assert 0 <= shortfall < 1.1 * GiB, spec.name


def test_which_figures_are_measured_and_which_are_upper_bounds():
    figures = {spec.name: spec.memory_figure for spec in GPUS}
    assert [name for name, figure in figures.items() if figure == NVIDIA_SMI] == ["a100-pcie-80gb", "l4", "a10"]
    assert [name for name, figure in figures.items() if figure == OOM_MESSAGE] == [
        "a100-sxm-80gb", "h100-nvl-94gb", "gb200", "b300", "gb300", "mi325x"]


def test_compute_capability_and_megatrons_pre_blackwell_check():
    # megatron/training/arguments.py: CUDA_DEVICE_MAX_CONNECTIONS=1 only while arch < 10
    h100, b200, gb300, mi300x, v100 = (lookup_gpu(n) for n in ("h100", "b200", "gb300", "mi300x", "v100-16gb"))
    assert (h100.compute_capability, h100.arch_version, h100.needs_cuda_device_max_connections_1) == ((9, 0), 9, True)
    assert (b200.compute_capability, b200.arch_version, b200.needs_cuda_device_max_connections_1) == ((10, 0), 10, False)
    assert (gb300.compute_capability_value, gb300.needs_cuda_device_max_connections_1) == (10.3, False)
    # ROCm PyTorch reports gfx942 as 9.4, so Megatron's check applies on MI300X too
    assert (mi300x.compute_capability, mi300x.needs_cuda_device_max_connections_1) == ((9, 4), True)
    assert v100.compute_capability_value == 7.0
    assert [s.name for s in GPUS if not s.needs_cuda_device_max_connections_1] == ["b200", "gb200", "b300", "gb300"]


def test_names_are_unique_and_every_spelling_finds_one_gpu():
    names = gpu_names()
    assert len(names) == len(set(names)) == len(GPUS) == 24
    seen: dict[str, str] = {}
    for spec in GPUS:
        for spelling in (spec.name, *spec.aliases, *spec.device_names):
            key = "".join(ch for ch in spelling.lower() if ch.isalnum())
            assert seen.setdefault(key, spec.name) == spec.name, f"{spelling!r} is claimed twice"
            assert lookup_gpu(spelling) is spec


# --- lookup ------------------------------------------------------------------------------

@pytest.mark.parametrize("typed, name", [
    ("h100", "h100-sxm-80gb"), ("h100-80gb", "h100-sxm-80gb"), ("h100-sxm", "h100-sxm-80gb"),
    ("H100_SXM", "h100-sxm-80gb"), ("H100 80GB HBM3", "h100-sxm-80gb"), ("nvidia-h200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb"), ("NVIDIA B300 SXM6 AC", "b300"), ("NVIDIA GB200", "gb200"),
    ("AMD Instinct MI300X", "mi300x"), ("Tesla V100-SXM2-16GB", "v100-16gb"), ("a6000", "rtx-a6000"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("MI355X", "mi355x"), ("a10", "a10"), ("a100-80gb", "a100-sxm-80gb"),
])
def test_lookup_by_alias_and_device_name(typed, name):
    assert lookup_gpu(typed).name == name
    assert find_gpu(typed).name == name


def test_unknown_gpu_suggests_the_nearest_name():
    with pytest.raises(InvalidInput) as raised:
        lookup_gpu("h1000", location="MEGATRON_ESTIMATOR_GPU")
    (problem,) = raised.value.problems
    assert (problem.code, problem.location) == ("unknown-gpu", "MEGATRON_ESTIMATOR_GPU")
    assert "unknown GPU 'h1000'; did you mean h100 (h100-sxm-80gb)?" in problem.message
    assert "known GPUs: a100-sxm-40gb, " in problem.message and "mi355x)" in problem.message
    assert find_gpu("h1000") is None


def test_unknown_gpu_without_a_near_name():
    with pytest.raises(InvalidInput) as raised:
        lookup_gpu("tpu-v5p")
    (problem,) = raised.value.problems
    assert (problem.code, problem.location) == ("unknown-gpu", "--gpu")
    assert "did you mean" not in problem.message


@pytest.mark.parametrize("typed, choices", [
    ("a100", "a100-sxm-40gb, a100-sxm-80gb, a100-pcie-40gb, a100-pcie-80gb"),
    ("A100-PCIe", "a100-pcie-40gb, a100-pcie-80gb"),
    ("v100", "v100-16gb, v100-32gb"),
])
def test_names_of_gpus_with_different_memory_sizes_are_ambiguous(typed, choices):
    with pytest.raises(InvalidInput) as raised:
        lookup_gpu(typed)
    (problem,) = raised.value.problems
    assert problem.code == "ambiguous-gpu"
    assert problem.message.endswith(f"say which: {choices}")
    assert find_gpu(typed) is None


def test_the_catalog_matches_this_machines_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the device-side cross-check runs only on a GPU machine")
    spec = find_gpu(torch.cuda.get_device_name(0))
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in the catalog")
    properties = torch.cuda.get_device_properties(0)
    assert (properties.major, properties.minor) == spec.compute_capability
    if spec.memory_figure == NVIDIA_SMI:
        assert properties.total_memory <= spec.total_memory_bytes
    else:   # the catalog keeps the smallest figure seen; drivers differ by a few MiB
        assert 0 <= properties.total_memory - spec.total_memory_bytes < 64 * MiB
