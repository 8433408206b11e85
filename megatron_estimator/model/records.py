"""The memory model's records: bytes per stage, the overhead outside the allocator, and the
facts an estimate assumed.  Frozen, integer bytes; ``results/estimate.py`` gathers them into an
``Estimate`` and ``report/`` renders them (field names are the JSON contract's,
``schemas/report.schema.json``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Assumed:
    """Something the estimate took as given, as facts: ``code`` names what it is, ``value``
    is its figure (in bytes, a fraction, a name), ``facts`` the names and numbers behind it.
    The memory model writes these; report/assumptions.py says each as a sentence."""
    code: str
    value: int | float | str | bool | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)


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
class ModuleBytes:
    """One module of a pipeline stage's model chunk (model/breakdown.py): what one GPU holds
    for it.  ``module``: embedding | layers | final_norm | mtp | output_layer, or padding (the
    distributed optimizer's buffer padding and the integer rounding of sharded figures, so
    that a stage's modules add up to its totals); ``kind``: a decoder layer kind (``dense``,
    ``moe``, a hybrid pattern symbol, ``D:shared-top-k``), None otherwise; ``count``: the
    chunk's layers of that kind (MTP depths for ``mtp``); bytes as ``MemoryBytes`` (the
    activations: held at the stage's peak, every microbatch in flight); ``chunk`` the virtual
    stage (None for the padding row, which is the stage's)."""
    chunk: int | None
    module: str
    kind: str | None
    count: int
    parameters: int
    weights: int
    gradients: int
    optimizer_states: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_states + self.activations

    def to_json(self) -> dict:
        return {"chunk": self.chunk, "module": self.module, "kind": self.kind, "count": self.count,
                "parameters": self.parameters, "weights": self.weights, "gradients": self.gradients,
                "optimizer_states": self.optimizer_states, "activations": self.activations}


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
    # A hybrid stage's layer symbols per model chunk ("M*M-", "M-|*E" with virtual stages) and
    # its MTP layers' ("/MM" per depth); None for a GPT decoder.
    layer_kinds: str | None = None
    # The stage's modules per model chunk (model/breakdown.py stage_modules): they add up to
    # ``parameters`` and to ``bytes`` but its ``other``.
    modules: tuple[ModuleBytes, ...] = ()

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
            "details": dict(self.details),
            **({"layer_kinds": self.layer_kinds} if self.layer_kinds is not None else {}),
            **({"modules": [m.to_json() for m in self.modules]} if self.modules else {}),
        }


@dataclass(frozen=True)
class ModelShape:
    """The model and the batch an estimate is of, as the report summarises them: counts and
    names, no sentences (report/text.py writes the summary lines)."""
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    multi_latent_attention: bool
    padded_vocab_size: int
    vocab_source: str
    micro_batch_size: int
    seq_length: int
    global_batch_size: int
    num_microbatches: int
    params_dtype: str
    main_grads_dtype: str
    optimizer: str
    distributed_optimizer: bool
    # MoE: (experts, router top-k, expert ffn hidden size, MoE layers); None for a dense model.
    experts: tuple[int, int, int, int] | None = None
