"""A pipeline stage by module: per model chunk, the embedding, each decoder layer kind (with the
chunk's layers of that kind), the final norm, the MTP layers and the output layer, with the
parameters one GPU holds for each (after TP / EP sharding) and their model states and
activations.  The same records and functions as the stage's totals (model/stage.py):

- parameters and model states: each module's records from ``parameters.chunk_blocks`` through
  ``states.model_states_of_blocks`` without the distributed optimizer's buffer padding; the
  padding, and what integer rounding of sharded figures leaves, is one ``padding`` row, so
  the rows add up to the stage's weights, gradients and optimizer states exactly;
- activations: ``stage.chunk_activation_parts`` (what one microbatch keeps per module) times
  the chunk's microbatches in flight, and the output layer's deferred weight-gradient inputs
  (--defer-embedding-wgrad-compute) on the last stage: they add up to the stage's activations.
"""

from __future__ import annotations

from functools import lru_cache

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model.layout import StageLayout
from megatron_estimator.model.parameters import RecordBlock, chunk_blocks
from megatron_estimator.model.records import ModuleBytes, StageEstimate
from megatron_estimator.model.stage import chunk_activation_parts, deferred_wgrad_bytes, stage_structure, states_config
from megatron_estimator.model.states import ModelStates, model_states_of_blocks

_TAIL = (("decoder.final_layernorm", "final_norm"), ("mtp.", "mtp"), ("output_layer.", "output_layer"))


def kind_name(kind) -> str:
    """A ``parameters.layer_kind`` as the breakdown names it: ``dense`` / ``moe`` for a GPT
    decoder layer, the pattern symbol for a hybrid one."""
    if kind is True:
        return "moe"
    if kind is False:
        return "dense"
    return kind


def _modules_of(config: EstimatorConfig, structure: tuple) -> list[tuple[tuple, int, tuple[RecordBlock, ...]]]:
    """A chunk's modules (``chunk_structure``): ((module, kind), count, blocks), in module
    order; a layer kind's runs are one module."""
    embedding, runs, _, mtp_layers, _ = structure
    blocks = list(chunk_blocks(config, structure))
    out: list = []
    if embedding:
        out.append((("embedding", None), 1, (blocks.pop(0),)))
    layers: dict = {}
    for kind, n in runs:
        block = blocks.pop(0)
        count, found = layers.get(kind, (0, ()))
        layers[kind] = (count + n, found + (block,))
    out += [(("layers", kind), n, found) for kind, (n, found) in layers.items()]
    rest = blocks[0].records if blocks else ()
    for prefix, module in _TAIL:
        records = tuple(t for t in rest if t.name.startswith(prefix))
        if records:
            out.append(((module, None), mtp_layers if module == "mtp" else 1, (RecordBlock(records),)))
    return out


@lru_cache(maxsize=1024)
def _chunk_module_states(config: EstimatorConfig, structure: tuple) -> tuple[tuple[tuple, int, int, ModelStates], ...]:
    """((module, kind), count, parameters, unpadded model states) of each module of a chunk
    (``config``: ``stage.states_config``)."""
    return tuple((key, n, sum(b.repeats * t.numel * t.count for b in blocks for t in b.records),
                  model_states_of_blocks(config, [blocks], padded=False))
                 for key, n, blocks in _modules_of(config, structure))


def stage_modules(config: EstimatorConfig, stage: StageLayout, estimate: StageEstimate) -> tuple[ModuleBytes, ...]:
    """The modules of a stage whose totals are ``estimate`` (``stage.estimate_stage``)."""
    sc = states_config(config)
    rows: list[ModuleBytes] = []
    deferred = deferred_wgrad_bytes(config) if stage.post_process else 0
    for index, ((cs, pre_process), microbatches) in enumerate(zip(stage_structure(config, stage),
                                                                   estimate.microbatches_in_flight)):
        embedding, runs, post_process, mtp_layers, _ = cs
        parts = dict(chunk_activation_parts(config, runs, pre_process, post_process, mtp_layers)[0])
        held = {key: microbatches * n for key, n in parts.items()}
        if post_process:
            held[("output_layer", None)] += deferred
        found = _chunk_module_states(sc, cs)
        keys = [key for key, *_ in found]
        keys += [key for key in held if key not in keys]      # activations without parameters (tied output)
        by_key = {key: (n, params, states) for key, n, params, states in found}
        for key in keys:
            n, params, states = by_key.get(key, (1, 0, None))
            module, kind = key
            rows.append(ModuleBytes(
                chunk=index, module=module, kind=None if module != "layers" else kind_name(kind), count=n,
                parameters=params, weights=states.weights if states else 0,
                gradients=states.gradients if states else 0,
                optimizer_states=states.optimizer_states if states else 0, activations=held.get(key, 0)))
    b = estimate.bytes
    rest = (b.weights - sum(r.weights for r in rows), b.gradients - sum(r.gradients for r in rows),
            b.optimizer_states - sum(r.optimizer_states for r in rows))
    if any(rest):
        rows.append(ModuleBytes(None, "padding", None, 0, 0, *rest, 0))
    return tuple(rows)
