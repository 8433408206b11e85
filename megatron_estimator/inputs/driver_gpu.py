"""The GPU of the machine ``run`` launches on, read from the NVIDIA driver when no budget is
given: ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`` (one line per
GPU: the product name and its memory in MiB), else the driver's
``/proc/driver/nvidia/gpus/*/information`` (its ``Model:`` line; no memory size there).

Nothing is imported beyond ``os`` unless ``nvidia-smi`` is on PATH (then ``subprocess``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

PROC_GPUS = "/proc/driver/nvidia/gpus"
QUERY = ("--query-gpu=name,memory.total", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class DriverGpu:
    name: str                  # the driver's product name: "NVIDIA H100 80GB HBM3"
    memory_mib: int | None     # memory.total as nvidia-smi reports it (MiB); None from /proc
    source: str                # how it was read, for the report


def _on_path(program: str, environ: Mapping[str, str]) -> str | None:
    for folder in environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _from_nvidia_smi(environ: Mapping[str, str]) -> DriverGpu | None:
    program = _on_path("nvidia-smi", environ)
    if program is None:
        return None
    import subprocess

    try:
        done = subprocess.run([program, *QUERY], capture_output=True, text=True, timeout=10, env=dict(environ))
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    if not lines:
        return None
    name, _, memory = lines[0].rpartition(",")
    name, memory = name.strip(), memory.strip()
    if not name:
        return None
    count = f"{len(lines)} GPU{'s' if len(lines) > 1 else ''}"
    return DriverGpu(name, int(memory) if memory.isdigit() else None,
                     f"nvidia-smi on this machine: {name}, {memory} MiB ({count})")


def _from_proc(root: str) -> DriverGpu | None:
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "information"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "Model" and value.strip():
                        return DriverGpu(value.strip(), None, f"{root}/{entry}/information: {value.strip()}")
        except OSError:
            continue
    return None


def detect_driver_gpu(environ: Mapping[str, str], proc_root: str = PROC_GPUS) -> DriverGpu | None:
    """This machine's first GPU as the NVIDIA driver names it, or None when there is no driver."""
    return _from_nvidia_smi(environ) or _from_proc(proc_root)
