"""Memory besides model states and activations.

Two kinds, kept apart because they count differently:
- allocator-visible workspaces (they are in ``torch.cuda.max_memory_allocated``): the cuBLAS
  workspace PyTorch allocates through its caching allocator, sized by
  ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs; PyTorch's default is
  ``:4096:2:16:8`` before Hopper and ``:4096:8`` from Hopper on), and Transformer Engine's
  own cuBLAS workspace (transformer_engine/pytorch/module/base.py: 32 MiB from compute
  capability 9.0 on, 4 MiB before);
- device-level overhead the allocator does not see: the CUDA context, NCCL's buffers (one
  set per communicator the job uses), and fragmentation of the caching allocator.  Each is a
  stated assumption the user can override.
"""

from __future__ import annotations

import re
from functools import lru_cache

from dataclasses import dataclass
from typing import Mapping

from megatron_estimator.core.units import MiB


@dataclass(frozen=True)
class Overheads:
    cuda_context_bytes: int = 512 * MiB
    nccl_bytes_per_communicator: int = 512 * MiB
    fragmentation: float = 0.05
    routing_imbalance: float = 0.0
    compute_capability: float = 9.0          # Hopper unless the GPU is known
    gpu_known: bool = False                  # the user named the GPU (--gpu): GPU-specific checks run
    flash_attn: str | None = None            # the job's flash-attn: a version, "none", or None (>= 2.4.1)
    resume: str = "auto"                     # the run resumes from a checkpoint: auto (--load has one), yes, no
    transformer_engine: str | None = None    # the job's Transformer Engine version (run: its metadata), None: unknown


# cuBLAS handles (and so workspaces) are per thread: the forward runs on the main thread and
# autograd runs backward on its own device thread, so two workspaces are allocated.
CUBLAS_HANDLES = 2


_SIZE_COUNT = re.compile(r":(\d+):(\d+)")     # each :SIZE:COUNT of a CUBLAS_WORKSPACE_CONFIG


def cublas_workspace_bytes(environ: Mapping[str, str], compute_capability: float,
                           deterministic: bool = False) -> tuple[int, str]:
    """PyTorch's cuBLAS workspaces (c10/cuda CublasHandlePool: one per handle and stream)."""
    config = environ.get("CUBLAS_WORKSPACE_CONFIG")
    source = "CUBLAS_WORKSPACE_CONFIG=" + config if config else "PyTorch's default"
    if not config and deterministic:
        # megatron/training/determinism.py sets it for --deterministic-mode when unset.
        config, source = ":4096:8", "CUBLAS_WORKSPACE_CONFIG=:4096:8 from --deterministic-mode"
    if not config:
        config = ":4096:8" if compute_capability >= 9.0 else ":4096:2:16:8"
    pairs = _SIZE_COUNT.findall(config)
    per_handle = sum(int(size) * 1024 * int(count) for size, count in pairs)
    return CUBLAS_HANDLES * per_handle, f"{source}, {CUBLAS_HANDLES} handles (forward and autograd threads)"


# Transformer Engine's grouped GEMM (the experts' GroupedLinear under --moe-grouped-gemm) runs
# on its own compute streams, each with its own cuBLAS workspace, allocated once and kept:
# transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace(grouped_gemm=True),
# one per transformer_engine/common/util/multi_stream.cpp get_num_compute_streams() (4).
TE_GROUPED_GEMM_STREAMS = 4
# The GEMMs that overlap tensor-parallel communication (--tp-comm-overlap, TE userbuffers)
# share one workspace of _NUM_MAX_UB_STREAMS (3) workspaces' size, allocated with torch.empty
# (the same gemm.py get_cublas_workspace(ub=True)); the userbuffers themselves are allocated
# outside PyTorch's allocator and are not counted.
TE_UB_STREAMS = 3


def te_workspace_bytes(compute_capability: float, transformer_impl: str, grouped_gemm: bool = False,
                       userbuffers: bool = False) -> int:
    """Transformer Engine's cuBLAS workspaces: one for its GEMMs, one per grouped-GEMM stream
    more with grouped GEMM experts, and three more with TP communication overlap."""
    if transformer_impl != "transformer_engine":
        return 0
    one = 32 * MiB + 1024 if compute_capability >= 9.0 else 4 * MiB
    return one * (1 + (TE_GROUPED_GEMM_STREAMS if grouped_gemm else 0) + (TE_UB_STREAMS if userbuffers else 0))


def te_grouped_gemm(config) -> bool:
    """Whether the experts run Transformer Engine's grouped GEMM (TEGroupedMLP)."""
    moe = config.model.moe
    return moe is not None and moe.grouped_gemm and config.kernels.transformer_impl == "transformer_engine"


def te_workspace_for(config, compute_capability: float) -> int:
    """Transformer Engine's workspaces for this configuration (``te_workspace_bytes``)."""
    return te_workspace_bytes(compute_capability, config.kernels.transformer_impl, te_grouped_gemm(config),
                              config.kernels.tp_comm_overlap)


def communicators(parallel, moe: bool = False) -> tuple[str, ...]:
    """The NCCL communicators a rank of this layout creates that move data."""
    return _communicators(parallel.tp, parallel.pp, parallel.cp, parallel.dp, parallel.ep, parallel.edp, moe)


@lru_cache(maxsize=1024)
def _communicators(tp: int, pp: int, cp: int, dp: int, ep: int, edp: int, moe: bool) -> tuple[str, ...]:
    groups = []
    if tp > 1:
        groups.append("tensor parallel")
    if pp > 1:
        groups.append("pipeline parallel")
    if cp > 1:
        groups.append("context parallel")
    if dp * cp > 1:
        groups.append("data parallel")
    if moe and ep > 1:
        groups.append("expert parallel")
    if moe and edp > 1 and edp != dp * cp:
        groups.append("expert data parallel")
    return tuple(groups)
