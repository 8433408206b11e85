"""Models an RL framework keeps on the actor's GPUs while the actor trains (the reference model,
a critic): their states that stay on the GPU, as a term of the training phase's peak.

Each is the actor's architecture (verl, NeMo-RL and slime build the reference model and, by
default, the critic from the actor's model path) laid out by its own tensor and pipeline
parallel sizes over the same world.  Which pipeline stage of it shares a GPU with which stage
of the actor is the framework's placement, not known here, so its fullest stage is counted on
every stage of the actor.  A critic's value head ([1, h]) is counted as the actor's output
layer ([V/t, h]): an over-estimate by that layer.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model.layout import pipeline_stages
from megatron_estimator.model.parameters import chunk_blocks, chunk_structure
from megatron_estimator.model.states import DTYPE_BYTES, model_states_of_blocks


def _laid_out(config: EstimatorConfig, tp: int, pp: int) -> EstimatorConfig:
    p = config.parallel
    if (tp, pp) == (p.tp, p.pp):
        return replace(config, co_resident=())
    split = replace(config.split, first_stage_layers=None, last_stage_layers=None, layout=None)
    return replace(config, parallel=replace(p, tp=tp, pp=pp, vpp=None), split=split, co_resident=(),
                   distillation=None)


@lru_cache(maxsize=64)
def resident_bytes(config: EstimatorConfig, term) -> int:
    """Bytes one GPU holds of ``term`` (an ``inputs/co_resident.CoResident``) on its fullest stage."""
    if not term.on_gpu:
        return 0
    other = _laid_out(config, term.tp, term.pp)
    most = 0
    for stage in pipeline_stages(other):
        blocks = [chunk_blocks(other, chunk_structure(other, chunk)) for chunk in stage.chunks]
        if not (term.gradients or term.optimizer):
            # Frozen weights (a reference model): not wrapped in DDP (no contiguous, padded
            # buffer), each parameter in the params dtype, as model/distillation.py's teacher.
            params = sum(b.repeats * t.numel * t.count for chunk in blocks for b in chunk for t in b.records)
            most = max(most, params * DTYPE_BYTES[other.precision.params_dtype])
            continue
        states = model_states_of_blocks(other, blocks)
        most = max(most, states.weights * term.weights + states.gradients * term.gradients
                   + states.optimizer_states * term.optimizer)
    return most


def co_resident_bytes(config: EstimatorConfig) -> int:
    """Bytes every GPU holds of the models beside the actor while it trains; 0 without any."""
    return sum(resident_bytes(config, term) for term in config.co_resident)
