"""The estimate as data: frozen results, in bytes, with the assumptions behind them.

These objects are what the library returns and what every renderer (text, JSON, markdown)
reads; their field names are the JSON contract's (``schemas/report.schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from megatron_estimator.core.problems import Problem


@dataclass(frozen=True)
class Assumption:
    """Something the estimate took as given; ``value`` is shown when it is a number."""
    key: str
    text: str
    value: int | float | str | None = None

    def to_json(self) -> dict:
        return {"key": self.key, "text": self.text, "value": self.value}


@dataclass(frozen=True)
class MemoryBytes:
    weights: int
    gradients: int
    optimizer_states: int
    activations: int
    other: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.other

    def to_json(self) -> dict:
        return {
            "weights": self.weights, "gradients": self.gradients,
            "optimizer_states": self.optimizer_states, "activations": self.activations,
            "other": self.other,
        }


@dataclass(frozen=True)
class DeviceOverhead:
    """Memory the job uses that ``torch.cuda.max_memory_allocated`` does not see."""
    cuda_context: int
    communication_buffers: int
    fragmentation: int

    @property
    def total(self) -> int:
        return self.cuda_context + self.communication_buffers + self.fragmentation

    def to_json(self) -> dict:
        return {"cuda_context": self.cuda_context, "communication_buffers": self.communication_buffers,
                "fragmentation": self.fragmentation}


@dataclass(frozen=True)
class StageEstimate:
    pipeline_rank: int
    layer_indices: tuple[int, ...]
    parameters: int
    bytes: MemoryBytes
    device_overhead: DeviceOverhead
    microbatches_in_flight: tuple[int, ...]     # per virtual stage (model chunk)
    peak_moment: str
    details: tuple[tuple[str, int], ...] = ()   # named byte counts behind the totals
    budget_bytes: int | None = None
    imbalanced_peak_bytes: int | None = None    # device peak under the configured MoE routing imbalance

    @property
    def layers(self) -> int:
        return len(self.layer_indices)

    @property
    def allocated_peak_bytes(self) -> int:
        return self.bytes.total

    @property
    def device_peak_bytes(self) -> int:
        return self.bytes.total + self.device_overhead.total

    @property
    def fits(self) -> bool | None:
        if self.budget_bytes is None:
            return None
        return self.device_peak_bytes <= self.budget_bytes

    @property
    def headroom_bytes(self) -> int | None:
        if self.budget_bytes is None:
            return None
        return self.budget_bytes - self.device_peak_bytes

    def to_json(self) -> dict:
        return {
            "pipeline_rank": self.pipeline_rank,
            "layers": self.layers,
            "layer_indices": list(self.layer_indices),
            "parameters": self.parameters,
            "bytes": self.bytes.to_json(),
            "device_overhead_bytes": self.device_overhead.to_json(),
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "headroom_bytes": self.headroom_bytes,
            "fits": self.fits,
            "microbatches_in_flight": list(self.microbatches_in_flight),
            "peak_moment": self.peak_moment,
            "imbalanced_device_peak_bytes": self.imbalanced_peak_bytes,
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Estimate:
    world_size: int
    world_size_source: str
    parallelism: Mapping[str, int | None]      # read-only: tp, pp, vpp, cp, dp, ep, etp, edp
    stages: tuple[StageEstimate, ...]
    assumptions: tuple[Assumption, ...]
    budget_bytes: int | None = None
    budget_source: str | None = None
    model_summary: tuple[tuple[str, str], ...] = ()
    total_parameters: int = 0

    @property
    def peak_stage(self) -> StageEstimate:
        return max(self.stages, key=lambda s: (s.device_peak_bytes, -s.pipeline_rank))

    @property
    def fits(self) -> bool | None:
        if self.budget_bytes is None:
            return None
        return all(stage.fits for stage in self.stages)

    @property
    def status(self) -> str:
        return "over_budget" if self.fits is False else "fits"


@dataclass(frozen=True)
class Verdict:
    """What a command says about one input: an estimate, or the problems that stopped it."""
    source: str
    estimate: Estimate | None = None
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # results.suggestion.Suggestions on a refusal, when the caller asked for them (api.evaluate)
    suggestions: Any = field(default=None, compare=False)

    @property
    def status(self) -> str:
        if self.estimate is None:
            return "invalid"
        return self.estimate.status

    @property
    def exit_code(self) -> int:
        return {"fits": 0, "over_budget": 1, "invalid": 2}[self.status]
