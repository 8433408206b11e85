"""The plan as data: the bounds of a layout search, the layouts that fit, best first.

These are what ``api.plan`` returns and what ``report/plan.py`` renders; the planner
(``planner/``) builds them.  ``Candidate.to_json`` and the renderer's ``plan_to_json`` are the
JSON contract of ``megatron-estimator plan --format json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.results.estimate import Estimate


@dataclass(frozen=True)
class SearchSpace:
    """The bounds of the search (planner/space.py enumerates the layouts within them)."""
    gpus_per_node: int = 8
    max_tensor_parallel: int | None = None          # None: gpus_per_node
    max_context_parallel: int = 8
    max_virtual_stages: int = 8
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    block_recompute_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    distributed_optimizer: tuple[bool, ...] = (False, True)

    @property
    def tensor_parallel_limit(self) -> int:
        return self.max_tensor_parallel or self.gpus_per_node

    def to_json(self) -> dict:
        return {
            "gpus_per_node": self.gpus_per_node, "max_tensor_parallel": self.tensor_parallel_limit,
            "max_context_parallel": self.max_context_parallel, "max_virtual_stages": self.max_virtual_stages,
            "micro_batch_sizes": list(self.micro_batch_sizes),
            "block_recompute_fractions": list(self.block_recompute_fractions),
            "distributed_optimizer": list(self.distributed_optimizer),
        }


@dataclass(frozen=True)
class ProxyAssumptions:
    """The constants of the throughput proxy (planner/cost.py)."""
    achieved_flops: float = 400e12              # dense bf16 FLOP/s one GPU sustains (about 40% of an H100's peak)
    intra_node_bandwidth: float = 300e9         # bytes/s per GPU inside a node (NVLink)
    inter_node_bandwidth: float = 40e9          # bytes/s per GPU across nodes (a 400 Gb/s NIC per GPU)

    def to_json(self) -> dict:
        return {"achieved_flops": self.achieved_flops, "intra_node_bandwidth": self.intra_node_bandwidth,
                "inter_node_bandwidth": self.inter_node_bandwidth}


PROXY_FORMULA = "step = (1 + R + (T_tp + T_cp + T_ep) / C) x (1 + (p - 1) / (v M)) + T_dp / C"


@dataclass(frozen=True)
class PipelineChoice:
    """How the decoder layers are split over pp ranks and v virtual stages."""
    pp: int
    vpp: int | None
    settings: tuple[tuple[str, Any], ...]       # the split dests this choice sets
    label: str


@dataclass(frozen=True)
class Recompute:
    """An activation recompute choice, as Megatron's --recompute-* flags set it."""
    granularity: str | None                     # None | "selective" | "full"
    method: str | None = None                   # full: "uniform" | "block"
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None      # selective: the modules recomputed

    @property
    def label(self) -> str:
        if self.granularity is None:
            return "none"
        if self.granularity == "selective":
            return "selective " + ",".join(self.modules or ())
        return f"full {self.method} {self.num_layers}"

    def settings(self) -> dict[str, Any]:
        return {"recompute_granularity": self.granularity, "recompute_method": self.method,
                "recompute_num_layers": self.num_layers,
                "recompute_modules": list(self.modules) if self.modules else None}

    def to_json(self) -> dict:
        return {"granularity": self.granularity, "method": self.method, "num_layers": self.num_layers,
                "modules": list(self.modules) if self.modules else None, "label": self.label}


NO_RECOMPUTE = Recompute(None)
SELECTIVE_CORE_ATTN = Recompute("selective", modules=("core_attn",))


@dataclass(frozen=True)
class ProxyBreakdown:
    """The throughput proxy of one layout; the terms are fractions of the step's compute."""
    step: float                  # the relative step time the ranking uses (lower is better)
    bubble: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    dp_comm: float
    compute_seconds: float       # C: model compute per GPU and step at the assumed FLOP/s
    tp_bytes: int                # bytes each GPU sends per step
    cp_bytes: int
    ep_bytes: int
    dp_bytes: int

    @property
    def relative_throughput(self) -> float:
        return 1.0 / self.step

    def to_json(self) -> dict:
        return {
            "step": round(self.step, 6), "relative_throughput": round(self.relative_throughput, 6),
            "bubble": round(self.bubble, 6), "recompute": round(self.recompute, 6),
            "tp_comm": round(self.tp_comm, 6), "cp_comm": round(self.cp_comm, 6),
            "ep_comm": round(self.ep_comm, 6), "dp_comm": round(self.dp_comm, 6),
            "compute_seconds": round(self.compute_seconds, 6),
            "bytes_per_gpu_per_step": {"tp": self.tp_bytes, "cp": self.cp_bytes, "ep": self.ep_bytes,
                                       "dp": self.dp_bytes},
        }


@dataclass(frozen=True)
class Candidate:
    """One layout that fits, with the flags that select it."""
    parallel: ParallelDims
    pipeline: PipelineChoice
    micro_batch_size: int
    num_microbatches: int
    sequence_parallel: bool
    recompute: Recompute
    distributed_optimizer: bool
    peak_stage: int
    device_peak_bytes: int
    allocated_peak_bytes: int
    headroom_bytes: int
    proxy: ProxyBreakdown
    settings: tuple[tuple[str, Any], ...]   # every planned dest -> the value this layout uses
    flags: tuple[str, ...]                  # Megatron flags to add to (or change on) the input
    remove_flags: tuple[str, ...]           # flags of the input to delete (no flag turns them off)
    estimate: Estimate | None = field(default=None, compare=False, repr=False)   # the normal path's, once verified

    def to_json(self) -> dict:
        return {
            "flags": list(self.flags),
            "remove_flags": list(self.remove_flags),
            "parallelism": self.parallel.as_dict(),
            "pipeline_split": self.pipeline.label,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute.to_json(),
            "distributed_optimizer": self.distributed_optimizer,
            "peak_stage": self.peak_stage,
            "device_peak_bytes": self.device_peak_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "headroom_bytes": self.headroom_bytes,
            "throughput_proxy": self.proxy.to_json(),
        }


@dataclass(frozen=True)
class SearchProgress:
    """Where a running search stands, as ``planner.search`` reports it to a progress callback:
    layouts searched so far, how many of them fit, layout families (tp, cp, pp, split) started
    of all, seconds since the plan started."""
    searched: int
    fitting: int
    families_started: int
    families: int
    seconds: float


@dataclass(frozen=True)
class Plan:
    source: str
    world_size: int
    global_batch_size: int
    budget_bytes: int
    budget_source: str
    candidates: tuple[Candidate, ...]       # best first, at most ``top``
    searched: int                           # layouts enumerated
    valid: int                              # layouts Megatron accepts
    fitting: int                            # accepted layouts whose peak stage fits the budget
    seconds: float
    space: SearchSpace
    proxy: ProxyAssumptions
    # problem code -> layouts it rejected, most first (a layout failing several checks counts once,
    # under the first the search meets)
    rejections: tuple[tuple[str, int], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.fitting > 0
