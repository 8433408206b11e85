"""`run` with no budget from any source takes the GPU of the machine from the NVIDIA driver
(a fake ``nvidia-smi`` on PATH, a fake ``/proc/driver/nvidia/gpus``)."""

from __future__ import annotations

import os
import stat
import sys

from conftest import TINY_GPT, flags
from test_cli import run

from megatron_estimator import api

MiB = 1024 * 1024


def fake_nvidia_smi(folder, output: str, rc: int = 0):
    """An ``nvidia-smi`` that prints ``output`` for the query the estimator makes."""
    folder.mkdir(exist_ok=True)
    program = folder / "nvidia-smi"
    program.write_text("#!/bin/sh\n"
                       "[ \"$1 $2\" = \"--query-gpu=name,memory.total --format=csv,noheader,nounits\" ] || exit 9\n"
                       f"printf '%s' '{output}'\nexit {rc}\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}{os.pathsep}/usr/bin{os.pathsep}/bin"}


def test_a_catalog_gpu_from_nvidia_smi_gives_its_capacity(tmp_path):
    env = fake_nvidia_smi(tmp_path / "bin", "NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\n")
    budget, gpu, source = api.driver_gpu_budget(env, proc_root=str(tmp_path / "none"))
    # The H100 SXM shows 81559 MiB in nvidia-smi and reports 81082 MiB to PyTorch (the catalog's budget).
    assert budget == 81082 * MiB and gpu.name == "h100-sxm-80gb"
    assert source == ("h100-sxm-80gb capacity (cuda-reported; gpu from nvidia-smi on this machine: "
                      "NVIDIA H100 80GB HBM3, 81559 MiB (2 GPUs))")


def test_a_gpu_not_in_the_catalog_gives_nvidia_smis_memory(tmp_path):
    env = fake_nvidia_smi(tmp_path / "bin", "NVIDIA Future GPU, 12345\n")
    budget, gpu, source = api.driver_gpu_budget(env, proc_root=str(tmp_path / "none"))
    assert (budget, gpu) == (12345 * MiB, None)
    assert source == "memory.total from nvidia-smi on this machine: NVIDIA Future GPU, 12345 MiB (1 GPU) (not a GPU of the catalog)"


def test_the_driver_proc_files_name_the_gpu_when_there_is_no_nvidia_smi(tmp_path):
    info = tmp_path / "gpus" / "0000:18:00.0"
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 150\n")
    budget, gpu, source = api.driver_gpu_budget({"PATH": str(tmp_path / "empty")}, proc_root=str(tmp_path / "gpus"))
    assert gpu.name.startswith("a100") and "80" in gpu.name and budget == gpu.total_memory_bytes
    assert f"{tmp_path}/gpus/0000:18:00.0/information: NVIDIA A100-SXM4-80GB" in source


def test_no_driver_and_a_failing_nvidia_smi_give_nothing(tmp_path):
    assert api.driver_gpu_budget({"PATH": str(tmp_path / "empty")}, proc_root=str(tmp_path / "none")) is None
    env = fake_nvidia_smi(tmp_path / "bin", "NVIDIA-SMI has failed", rc=9)
    assert api.driver_gpu_budget(env, proc_root=str(tmp_path / "none")) is None


def test_run_without_a_budget_checks_against_the_machines_gpu(tmp_path):
    env = fake_nvidia_smi(tmp_path / "bin", "NVIDIA Future GPU, 1\n")
    out = tmp_path / "launched"
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(f"open({str(out)!r}, 'w')\n")
    command = [sys.executable, str(script)] + flags(TINY_GPT)
    result = run(["run", "--"] + command, env=env)
    assert result.returncode == 1 and not out.exists()
    assert ("budget: 0.00 GiB per GPU (memory.total from nvidia-smi on this machine: NVIDIA Future GPU, 1 MiB (1 GPU) "
            "(not a GPU of the catalog))") in result.stderr
    # A budget given in any way wins over the driver: nothing is asked of nvidia-smi.
    result = run(["run", "--budget", "80GiB", "--"] + command, env=env)
    assert result.returncode == 0 and out.exists()
