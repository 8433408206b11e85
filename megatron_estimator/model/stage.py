"""The per-stage estimate: model states + activations in flight + transients at the peak.

Pure arithmetic over the validated configuration.  For each pipeline rank:
1. the parameter tensors of its model chunks (``parameters``) give the model states
   (``states``);
2. each chunk's activations per microbatch (``activations``), with recomputation applied
   the way megatron/core/transformer/transformer_block.py ``_checkpointed_forward`` groups
   layers, times the microbatches the schedule keeps alive (``layout.microbatches_in_flight``);
3. the peak adds what is transient at the fullest moment: the loss's logits casts on the
   last stage, one recompute group re-materialized during its backward, a layer's backward
   working set, and the framework's workspaces and the current microbatch's batch tensors;
4. the device peak adds what the allocator does not see (``overhead``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple
from dataclasses import replace
from typing import Mapping

from megatron_estimator.config.typed import EstimatorConfig, is_deterministic
from megatron_estimator.model.layout import ModelChunk, StageLayout, microbatches_in_flight, pipeline_stages
from megatron_estimator.model.records import Assumed, DeviceOverhead, MemoryBytes, ModelShape, StageEstimate
from megatron_estimator.model import activations as act
from megatron_estimator.model.checkpoint import load_exchange_bytes, resume_load
from megatron_estimator.model.co_resident import co_resident_bytes, resident_bytes
from megatron_estimator.model.distillation import kd_logits_buffers, kd_loss_transient, teacher_weight_bytes
from megatron_estimator.model.overhead import Overheads, communicators, cublas_workspace_bytes, te_grouped_gemm, te_workspace_for
from megatron_estimator.model.parameters import (ParamTensor, chunk_blocks, chunk_structure, chunk_tensors,
                                                 SHARED_TOPK_DSA, count, layer_kind, layer_runs, layer_template,
                                                 representative_layer, weighted)
from megatron_estimator.model.states import ModelStates, model_states, model_states_of_blocks


def recompute_groups(config: EstimatorConfig, layers: tuple[int, ...]) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """(checkpointed groups, layers kept whole) for one model chunk under full recompute."""
    tr = config.training
    if tr.recompute_granularity != "full" or not layers:
        return [], layers
    n = tr.recompute_num_layers     # validated: >= 1 with uniform, >= 0 with block (config/rules/recompute.py)
    if tr.recompute_method == "uniform":
        return [layers[i:i + n] for i in range(0, len(layers), n)], ()
    # block (megatron/core/recompute.py, transformer_block.py before 0.19): the first n layers of
    # each chunk are checkpointed one by one; n = 0 checkpoints none.
    return [(i,) for i in layers[:n]], layers[n:]


class ChunkActivations(NamedTuple):
    """The activations of one model chunk per microbatch (``chunk_activation_bytes``)."""
    kept: int               # bytes one microbatch keeps alive in the chunk
    recompute_peak: int     # the largest recompute group re-materialized during its backward


@lru_cache(maxsize=4096)
def chunk_activation_bytes(config: EstimatorConfig, chunk: ModelChunk, imbalance: float = 0.0) -> ChunkActivations:
    """What one microbatch keeps alive in this chunk, and the largest recompute re-materialization
    (memoised on the configuration and the chunk, like each layer's activations; computed once
    per run of decoder layer kinds, ``_chunk_activations``)."""
    return _chunk_activations(config, layer_runs(config, chunk.layers), chunk.pre_process, chunk.post_process,
                              chunk.mtp_layers, imbalance)


def _kind_activations(config: EstimatorConfig, kind, imbalance: float = 0.0) -> int:
    """A decoder layer of this ``layer_kind`` (its activations depend on the kind alone: the
    hybrid symbol, MoE or not)."""
    return act.layer_activations(config, representative_layer(config, kind), imbalance).total


@lru_cache(maxsize=4096)
def _chunk_activations(config: EstimatorConfig, runs: tuple, pre_process: bool, post_process: bool,
                       mtp_layers: int, imbalance: float) -> ChunkActivations:
    """``chunk_activation_bytes`` of a chunk with these runs of layer kinds (``layer_runs``):
    the sum of its ``chunk_activation_parts``."""
    parts, recompute_peak = chunk_activation_parts(config, runs, pre_process, post_process, mtp_layers, imbalance)
    return ChunkActivations(sum(n for _, n in parts), recompute_peak)


@lru_cache(maxsize=4096)
def chunk_activation_parts(config: EstimatorConfig, runs: tuple, pre_process: bool, post_process: bool,
                           mtp_layers: int, imbalance: float = 0.0) -> tuple[tuple, int]:
    """(what one microbatch keeps in the chunk by module, the largest recompute group
    re-materialized).  The modules: ``("embedding", None)``, ``("layers", kind)`` per decoder
    layer kind (a recompute group's kept input counts to its first layer's kind), ``("mtp",
    None)`` and ``("output_layer", None)`` (the final norm, output layer and loss)."""
    tr = config.training
    by_kind = {kind: _kind_activations(config, kind, imbalance) for kind, _ in runs}
    layers: dict = {}
    if tr.recompute_granularity != "full" and not tr.cpu_offloading_num_layers:
        for kind, n in runs:
            layers[kind] = layers.get(kind, 0) + n * by_kind[kind]
        groups, kinds = [], ()
    else:
        # Recompute groups and offloaded layers by position in the chunk.
        kinds = tuple(kind for kind, n in runs for _ in range(n))
        layers = {kind: 0 for kind in kinds}
        positions = tuple(range(len(kinds)))
        groups, whole = recompute_groups(config, positions)
        # --cpu-offloading-num-layers N: the first N layers' activations go to the host after
        # their forward (megatron/core/transformer/transformer_block.py
        # get_cpu_offload_context); the layer in transit is a transient.
        offloaded = set(positions[:tr.cpu_offloading_num_layers])
        for i in whole:
            if i not in offloaded:
                layers[kinds[i]] += by_kind[kinds[i]]
        for group in groups:
            layers[kinds[group[0]]] += act.layer_input_bytes(config)
    recompute_peak = 0
    for group in groups:
        rematerialized = sum(by_kind[kinds[i]] for i in group)
        recompute_peak = max(recompute_peak, rematerialized)
    parts = []
    if pre_process:
        parts.append((("embedding", None), act.embedding_activations(config)))
    parts += [(("layers", kind), n) for kind, n in layers.items()]
    if mtp_layers:
        parts.append((("mtp", None), mtp_layers * act.mtp_layer_activations(config)))
    if post_process:
        parts.append((("output_layer", None), act.loss_activations(config)[0]))
    return tuple(parts), recompute_peak


def _layer_backward_working_set(config: EstimatorConfig, layers: tuple[int, ...]) -> int:
    """Gradient buffers alive while one layer runs backward: the widest output gradient
    (fc1's, or the attention probabilities' with unfused attention) and the incoming and
    outgoing [s, b, h] gradients."""
    if not layers:
        return 0
    hy = config.model.hybrid
    return _backward_working_set(config, frozenset(hy.layer_kinds[i] for i in layers) if hy is not None else frozenset())


@lru_cache(maxsize=1024)
def _backward_working_set(config: EstimatorConfig, symbols: frozenset) -> int:
    """``_layer_backward_working_set`` of layers with these hybrid pattern symbols (none for a
    GPT decoder)."""
    m, d = config.model, act.dims(config)
    fc1 = (2 if m.gated_linear_unit else 1) * m.ffn_hidden_size
    widest = d.act * d.tokens * fc1 // d.t
    hy = m.hybrid
    if hy is not None and "M" in symbols:
        # A Mamba layer's in_proj output gradient (zxBCdt).
        widest = max(widest, d.act * d.tokens * act.mamba_zxbcdt_width(config))
    if hy is not None and hy.gdn is not None and "G" in symbols:
        # A gated delta net layer's in_proj output gradient.
        from megatron_estimator.config.hybrid import gdn_in_proj_width
        g = hy.gdn
        width = gdn_in_proj_width(g.variant, g.key_heads * g.key_head_dim, g.value_heads * g.value_head_dim,
                                  g.value_heads) // d.t
        widest = max(widest, d.act * d.tokens * width)
    if (hy is not None and hy.dsa is not None and "D" in symbols
            and (hy.dsa.kernel_backend == "none" or config.kernels.attention_backend == "unfused")):
        # DSA's PyTorch sparse attention: the fp32 gradients of its probabilities and exponentials.
        scores = d.b * (m.num_attention_heads // d.t) * d.s * d.s * config.parallel.cp
        widest = max(widest, 2 * 4 * scores)
    if config.kernels.attention_backend not in ("flash", "fused"):
        widest = max(widest, 2 * d.act * d.b * (m.num_attention_heads // d.t) * d.s * d.s)
    return widest + 2 * d.act * d.tokens * m.hidden_size


def fused_cross_entropy_extra_buffers(compute_capability: float) -> int:
    """fp32 [s, b, V/t] buffers the fused cross entropy adds over the unfused one.

    megatron/core/fusions/fused_cross_entropy.py runs its steps under torch.compile
    (megatron/core/jit.py jit_fuser): the unfused path's in-place subtract / exp / divide on
    the fp32 logits become functional kernels whose results are written back, and how many
    of those intermediates the compiler keeps depends on the GPU and the software stack.
    Megatron-LM's CI measures one on Hopper and Blackwell, and one to three on Ampere across
    its containers; the largest is taken (an estimate that guards against OOM errs high)."""
    return 1 if compute_capability >= 9.0 else 3


def _loss_transient(config: EstimatorConfig, compute_capability: float = 9.0) -> int:
    """Transient bytes at the loss on the last stage, beyond what the microbatch keeps."""
    m, d = config.model, act.dims(config)
    logits = d.tokens * m.padded_vocab_size // d.t
    transient = act.loss_activations(config)[1]
    if config.training.cross_entropy_loss_fusion:
        transient += 4 * logits * fused_cross_entropy_extra_buffers(compute_capability)
    if not config.kernels.gradient_accumulation_fusion:
        # The output layer's weight gradient is materialized in the param dtype before it is
        # added to main_grad (megatron/core/tensor_parallel/layers.py without fusion).
        weight_grad = d.act * m.padded_vocab_size // d.t * m.hidden_size
        transient = max(transient, weight_grad - 2 * logits)
    # Distillation: ModelOpt's KL loss runs after the forward, with the saved activations.
    return max(transient, kd_loss_transient(config))


def _batch_bytes(config: EstimatorConfig) -> int:
    """The microbatch on a first or last stage: tokens, labels, position ids (int64), loss mask
    (fp32) and, with --create-attention-mask-in-dataloader (Megatron's default), a bool
    [b, 1, s, s] causal mask (megatron/core/datasets/gpt_dataset.py)."""
    d = act.dims(config)
    total = (3 * 8 + 4) * d.tokens
    if config.training.create_attention_mask_in_dataloader:
        total += d.tokens * config.training.seq_length
    return total


def deferred_wgrad_bytes(config: EstimatorConfig) -> int:
    """--defer-embedding-wgrad-compute: the output layer keeps each microbatch's input and
    output gradient until the end of the step, up to --wgrad-deferral-limit of them (0: all)
    (megatron/core/tensor_parallel/layers.py, gpt_model.py embedding_activation_buffer /
    grad_output_buffer).  At the last microbatch's loss the previous ones are held."""
    if not config.training.defer_embedding_wgrad_compute:
        return 0
    m, d = config.model, act.dims(config)
    limit = config.training.wgrad_deferral_limit
    held = config.training.num_microbatches - 1
    if limit:
        held = min(held, limit)
    return held * d.act * (d.tokens * m.padded_vocab_size // d.t + d.tokens_r * m.hidden_size)


def _global_buffers(config: EstimatorConfig) -> int:
    """megatron-core's GlobalMemoryBuffer: the local (unfused) DotProductAttention takes its
    [b a/t, s, s] score buffer from it once and keeps it (megatron/core/transformer/
    dot_product_attention.py, megatron/core/utils.py GlobalMemoryBuffer)."""
    if config.kernels.transformer_impl != "local":
        return 0
    d = act.dims(config)
    return d.act * d.b * (config.model.num_attention_heads // d.t) * d.s * d.s


def stage_structure(config: EstimatorConfig, stage: StageLayout) -> tuple:
    """What a stage's model states, activations and transients depend on besides the
    configuration: each chunk's ``chunk_structure`` (runs of layer kinds, not the layers'
    numbers) and whether the embedding runs there.  Stages alike in it share those figures."""
    return tuple((chunk_structure(config, chunk), chunk.pre_process) for chunk in stage.chunks)


def stage_transients(config: EstimatorConfig, stage: StageLayout, per_chunk: tuple[ChunkActivations, ...],
                     compute_capability: float) -> dict[str, int]:
    """What may be alive on top of the stage's saved activations at its fullest moment, by
    moment; the peak takes the largest.  ``per_chunk``: ``chunk_activation_bytes`` of each
    model chunk."""
    return _transients(config, stage_structure(config, stage), per_chunk, compute_capability)


def _transients(config: EstimatorConfig, structure: tuple, per_chunk: tuple[ChunkActivations, ...],
                compute_capability: float) -> dict[str, int]:
    # The stage's decoder layer kinds (what each layer's figures depend on).
    kinds = {kind for chunk, _ in structure for kind, _ in chunk[1]}
    symbols = frozenset(("D" if kind == SHARED_TOPK_DSA else kind) for kind in kinds if isinstance(kind, str))
    transients = {"layer backward": _backward_working_set(config, symbols) if kinds else 0}
    if config.training.cpu_offloading_num_layers and kinds:
        transients["offload in flight"] = transients["layer backward"] + max(
            _kind_activations(config, kind) for kind in kinds)
    if config.offload.fine_grained and kinds:
        # The layer running now has not been offloaded yet (and one is being reloaded).
        transients["offload in flight"] = transients["layer backward"] + max(
            act.offloaded_bytes(config, representative_layer(config, kind)) for kind in kinds)
    if config.training.overlap_moe_expert_parallel_comm and kinds:
        # Combined 1F1B: a layer of the next microbatch's forward runs beside a layer of this
        # one's backward (megatron/core/pipeline_parallel/combined_1f1b.py).
        transients["overlapped forward"] = transients["layer backward"] + max(
            _kind_activations(config, kind) for kind in kinds)
    recompute = max((c.recompute_peak for c in per_chunk), default=0)
    if recompute:
        transients["recompute"] = recompute
    if any(chunk[2] for chunk, _ in structure):
        transients["loss"] = _loss_transient(config, compute_capability)
    return transients


class StageStates(NamedTuple):
    """A stage's model-state terms: from its parameter tensors, the precision, the optimizer
    and the data-parallel sharding; not from the batch, recompute or the schedule."""
    states: ModelStates
    checkpoint_exchange: int    # a resumed run's load buffers alive into the first step

    @property
    def allocated(self) -> int:
        s = self.states
        return s.weights + s.gradients + s.optimizer_states + s.fsdp_transient + self.checkpoint_exchange


def stage_states(config: EstimatorConfig, tensors: list[list[ParamTensor]]) -> StageStates:
    """The model states of a stage with these tensors (one list per model chunk)."""
    # A resumed run with --ckpt-fully-parallel-load: the load's broadcast buffers outlive it
    # into the first step (model/checkpoint.py).
    return StageStates(model_states(config, tensors), load_exchange_bytes(config, tensors))


@lru_cache(maxsize=4096)
def stage_parameters(config: EstimatorConfig, stage: StageLayout) -> tuple[int, StageStates]:
    """(parameters, ``stage_states``) of one stage: a function of the configuration and the
    stage's structure alone (memoised on them, like the activations): its chunks' records as
    runs of layer kinds (model/parameters.py ``chunk_blocks``), so stages whose chunks hold the
    same runs share one answer, and its cost does not grow with the layers."""
    return _structure_parameters(config, tuple(chunk_structure(config, chunk) for chunk in stage.chunks))


class _TrainingNotRead:
    """``EstimatorConfig.training`` in ``states_config``: any attribute read raises, so a model
    state or parameter count that came to depend on the batch, the sequence or recompute would
    fail loudly instead of being shared between configurations that differ there."""

    __slots__ = ()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"config.training.{name} read where only the model states and parameter "
                           "counts are computed (model/stage.py states_config)")

    def __repr__(self) -> str:
        return "<training settings not read>"


TRAINING_NOT_READ = _TrainingNotRead()
_STATES_CONFIGS: dict[EstimatorConfig, EstimatorConfig] = {}     # a configuration -> its states key
_STATES_CONFIGS_MAX = 256


def states_config(config: EstimatorConfig) -> EstimatorConfig:
    """``config`` without its training settings (``TRAINING_NOT_READ`` in their place), one
    object for equal ones: the model states and the parameter counts read the model, the
    parallel layout, precision, optimizer, kernels, offloading, checkpointing and the run, never
    the batch, the sequence or recompute (TrainingConfig), so configurations that differ only
    there (the planner's and a sweep's batch sizes) share those figures."""
    found = _STATES_CONFIGS.get(config)
    if found is None:
        key = replace(config, training=TRAINING_NOT_READ)
        found = _STATES_CONFIGS.get(key, key)
        if len(_STATES_CONFIGS) >= _STATES_CONFIGS_MAX:
            _STATES_CONFIGS.clear()
        _STATES_CONFIGS[key] = _STATES_CONFIGS[config] = found
    return found


def _structure_parameters(config: EstimatorConfig, structure: tuple) -> tuple[int, StageStates]:
    return _structure_states(states_config(config), structure)


@lru_cache(maxsize=4096)
def _structure_states(config: EstimatorConfig, structure: tuple) -> tuple[int, StageStates]:
    blocks = [chunk_blocks(config, s) for s in structure]
    params = sum(b.repeats * t.numel * t.count for chunk in blocks for b in chunk for t in b.records)
    load = resume_load(config)
    exchange = 0
    if load is not None and load.exchanges:
        exchange = load_exchange_bytes(config, [weighted(chunk) for chunk in blocks])
    return params, StageStates(model_states_of_blocks(config, blocks), exchange)


class StageTerms(NamedTuple):
    """A stage's bytes besides its model states before the schedule multiplies them: each
    chunk's activations per microbatch, the largest transient and the workspaces, batch and
    buffers alive with it.  They read the configuration's activation settings (tp, cp, etp,
    the batch, sequence parallelism, recompute, the kernels) and the stage's structure, not
    the pipeline schedule, the optimizer or the expert layout."""
    chunks: tuple[ChunkActivations, ...]
    transient_moment: str
    transient: int
    cublas_workspace: int
    te_workspace: int
    batch_tensors: int
    global_buffers: int
    chunk_weights: tuple[int, ...]  # bytes one microbatch keeps in each chunk (the schedule's weights)
    unscheduled: int                # what the schedule does not multiply: transient, workspaces, batch, buffers


class SharedTerms(NamedTuple):
    """What every stage of a configuration holds alike: the framework's workspaces, the
    microbatch's batch tensors (on the stages that load or score it) and the global buffers.
    They read the configuration and the GPU, not the stage."""
    cublas_workspace: int
    te_workspace: int
    batch_tensors: int          # on a first or last stage; none elsewhere
    global_buffers: int


def shared_terms(config: EstimatorConfig, overheads: Overheads, environ: Mapping[str, str]) -> SharedTerms:
    """The ``SharedTerms`` of this configuration."""
    cublas, _ = cublas_workspace_bytes(environ, overheads.compute_capability,
                                       config.training.deterministic_mode)
    return SharedTerms(cublas, te_workspace_for(config, overheads.compute_capability), _batch_bytes(config),
                       _global_buffers(config))


def stage_terms(config: EstimatorConfig, stage: StageLayout, overheads: Overheads, environ: Mapping[str, str],
                chunks: tuple[ChunkActivations, ...] | None = None, shared: SharedTerms | None = None) -> StageTerms:
    """The ``StageTerms`` of one stage; ``chunks`` (``chunk_activation_bytes`` of each model
    chunk) and ``shared`` (``shared_terms`` of the configuration) when already known."""
    if shared is None:
        shared = shared_terms(config, overheads, environ)
    if chunks is None:
        return _stage_terms(config, stage_structure(config, stage), overheads.compute_capability, shared)
    return _terms_of(config, stage_structure(config, stage), chunks, overheads.compute_capability, shared)


@lru_cache(maxsize=4096)
def _stage_terms(config: EstimatorConfig, structure: tuple, compute_capability: float,
                 shared: SharedTerms) -> StageTerms:
    """``stage_terms`` from the configuration, the stage's ``stage_structure``, the GPU and the
    shared terms alone."""
    chunks = tuple(_chunk_activations(config, chunk[1], pre_process, chunk[2], chunk[3], 0.0)
                   for chunk, pre_process in structure)
    return _terms_of(config, structure, chunks, compute_capability, shared)


def _terms_of(config: EstimatorConfig, structure: tuple, chunks: tuple[ChunkActivations, ...],
              compute_capability: float, shared: SharedTerms) -> StageTerms:
    transients = _transients(config, structure, chunks, compute_capability)
    moment = max(transients, key=transients.get)
    transient = transients[moment]
    batch = shared.batch_tensors if any(pre or chunk[2] for chunk, pre in structure) else 0
    return StageTerms(chunks, moment, transient, shared.cublas_workspace, shared.te_workspace, batch,
                      shared.global_buffers, tuple([c.kept for c in chunks]),
                      transient + shared.cublas_workspace + shared.te_workspace + batch + shared.global_buffers)


def held_activations(chunk_microbatches: tuple[int, ...], weights: tuple[int, ...]) -> int:
    """The activations alive at the schedule's fullest moment: each chunk's microbatches in
    flight times the bytes one of them keeps."""
    return sum(n * kept for n, kept in zip(chunk_microbatches, weights))


def device_overhead(parallel, moe: bool, overheads: Overheads, allocated: int) -> DeviceOverhead:
    """What the device holds outside the allocator for a stage with ``allocated`` bytes: the
    CUDA context, one set of NCCL buffers per communicator of this layout, and the
    allocator's fragmentation of the allocated bytes."""
    return DeviceOverhead(
        cuda_context=overheads.cuda_context_bytes,
        communication_buffers=overheads.nccl_bytes_per_communicator * len(communicators(parallel, moe)),
        fragmentation=int(allocated * overheads.fragmentation),
    )


def fixed_device_bytes(parallel, moe: bool, overheads: Overheads) -> int:
    """The part of ``device_overhead`` that does not grow with the allocated bytes."""
    return device_overhead(parallel, moe, overheads, 0).total


def device_bytes(allocated: int, fixed: int, fragmentation: float) -> int:
    """``StageEstimate.device_peak_bytes`` of a stage with ``allocated`` bytes: those plus
    ``device_overhead`` (``fixed``: ``fixed_device_bytes``; ``fragmentation``: the fraction)."""
    return allocated + fixed + int(allocated * fragmentation)


def estimate_stage(config: EstimatorConfig, stage: StageLayout, overheads: Overheads,
                   environ: Mapping[str, str], budget: int | None,
                   tensors: list[list[ParamTensor]] | None = None,
                   shared: SharedTerms | None = None) -> StageEstimate:
    """One stage's estimate; ``tensors`` (one list per model chunk) when already built, and
    ``shared`` (``shared_terms`` of the configuration, the same for every stage) when known.

    It adds three parts, each a function of its own inputs (the planner memoises each on
    what it reads): the model states (``stage_states``), the activations and transients
    per microbatch (``stage_terms``) and the microbatches the schedule keeps alive
    (``layout.microbatches_in_flight``)."""
    p = config.parallel
    structure = stage_structure(config, stage)
    if tensors is None:
        params, held_states = _structure_parameters(config, tuple(chunk for chunk, _ in structure))
    else:
        params, held_states = sum(count(t).total for t in tensors), stage_states(config, tensors)
    states = held_states.states

    if shared is None:
        shared = shared_terms(config, overheads, environ)
    imbalance = overheads.routing_imbalance if config.model.moe is not None else 0.0
    if imbalance > 0:
        # --routing-imbalance F: this stage is the busiest expert rank's, whose experts receive
        # (1 + F) times the even share of routed tokens (activations.routed_rows, capped by the
        # capacity factor); every activation term that scales with routed tokens (the MoE
        # MLP's saved tensors and dispatch buffers, their recompute and offload) grows with it
        chunks = tuple(_chunk_activations(config, chunk[1], pre_process, chunk[2], chunk[3], imbalance)
                       for chunk, pre_process in structure)
        terms = _terms_of(config, structure, chunks, overheads.compute_capability, shared)
    else:
        terms = _stage_terms(config, structure, overheads.compute_capability, shared)
    weights = terms.chunk_weights
    inflight = microbatches_in_flight(p.pp, stage.pp_rank, p.vpp, config.training.num_microbatches,
                                      config.split.microbatch_group_size, weights,
                                      config.training.overlap_moe_expert_parallel_comm)
    activations = held_activations(inflight.chunk_microbatches, weights)
    deferred = deferred_wgrad_bytes(config) if stage.post_process else 0
    activations += deferred

    exchange = held_states.checkpoint_exchange
    teacher = teacher_weight_bytes(config, stage)
    beside = co_resident_bytes(config)
    other = terms.unscheduled + states.fsdp_transient + exchange + teacher + beside

    memory = MemoryBytes(states.weights, states.gradients, states.optimizer_states, activations, other)
    device = device_overhead(p, config.model.moe is not None, overheads, memory.total)
    details = (
        ("master_params", states.master_params),
        ("optimizer_moments", states.optimizer_moments),
        ("buffer_padding_elements", states.padded_elements),
        ("activations_per_microbatch", sum(weights)),
        ("transient_" + terms.transient_moment.replace(" ", "_"), terms.transient),
        ("cublas_workspace", terms.cublas_workspace),
        ("te_workspace", terms.te_workspace),
        ("batch_tensors", terms.batch_tensors),
        ("global_memory_buffer", terms.global_buffers),
        ("fp8_weight_copies", states.fp8_weight_copies),
        ("fsdp_unsharded_in_flight", states.fsdp_transient),
        ("deferred_embedding_wgrad", deferred),
        ("checkpoint_load_buffers", exchange),
        ("teacher_weights", teacher),
        ("co_resident_models", beside),
    )
    return StageEstimate(
        pipeline_rank=stage.pp_rank,
        layer_indices=stage.layers,
        parameters=params,
        bytes=memory,
        device_overhead=device,
        microbatches_in_flight=inflight.chunk_microbatches,
        peak_moment=f"{inflight.description}; transient: {terms.transient_moment}",
        details=details,
        budget_bytes=budget,
        layer_kinds=_stage_kinds(config, stage),
    )


def _stage_kinds(config: EstimatorConfig, stage: StageLayout) -> str | None:
    """The hybrid layer symbols of the stage's chunks ('|' between virtual stages), then
    '/' and the MTP pattern per MTP depth it runs; None for a GPT decoder."""
    hy = config.model.hybrid
    if hy is None:
        return None
    text = "|".join(hy.kinds_text(chunk.layers) for chunk in stage.chunks)
    return text + "".join("/" + "".join(hy.mtp_kinds) for _ in range(stage.mtp_layers))


def total_parameters(config: EstimatorConfig, stages: tuple[StageLayout, ...],
                     stage_tensors: list[list[list[ParamTensor]]] | None = None) -> int:
    """Parameters of the whole model (one copy: TP shards summed, EP shards summed, the tied
    output-layer copy on the last stage not counted twice)."""
    if stage_tensors is None:
        return _total_parameters(states_config(config), stages)
    return _parameters_of(config, stages, stage_tensors)


@lru_cache(maxsize=256)
def _total_parameters(config: EstimatorConfig, stages: tuple[StageLayout, ...]) -> int:
    # Each decoder layer by its kind's records (their replication does not depend on the
    # layer's name prefix), the rest of each chunk (embeddings, final norm, MTP, output) as
    # its own records: the same sum as over every chunk's records.
    total = 0
    for stage in stages:
        for chunk in stage.chunks:
            total += _rest_parameters(config, chunk.embedding, chunk.pre_process, chunk.post_process,
                                      chunk.mtp_layers, chunk.output_weight)
            total += sum(n * _layer_parameters(config, kind) for kind, n in layer_runs(config, chunk.layers))
    return total


@lru_cache(maxsize=1024)
def _rest_parameters(config: EstimatorConfig, embedding: bool, pre_process: bool, post_process: bool,
                     mtp_layers: int, output_weight: bool) -> int:
    """Parameters of the whole model's copy of a chunk's records besides its decoder layers."""
    rest = ModelChunk(0, 0, (), embedding, pre_process, post_process, output_weight, mtp_layers)
    return _parameters_of(config, (StageLayout(0, (rest,)),), [[chunk_tensors(config, rest)]])


@lru_cache(maxsize=1024)
def _layer_parameters(config: EstimatorConfig, kind: str | bool) -> int:
    """Parameters of the whole model's copy of one decoder layer of this kind."""
    return sum(t.numel * t.count * _replication_factor(config, t.name, t.expert) for t in layer_template(config, kind))


def _parameters_of(config: EstimatorConfig, stages: tuple[StageLayout, ...],
                   stage_tensors: list[list[list[ParamTensor]]]) -> int:
    total = 0
    for stage, chunks_tensors in zip(stages, stage_tensors):
        for chunk, tensors in zip(stage.chunks, chunks_tensors):
            for t in tensors:
                if t.name == "output_layer.weight" and not config.model.untie_embeddings_and_output_weights:
                    continue
                if t.name.startswith("embedding.") and not chunk.pre_process:
                    continue  # the MTP stage's copy of the embedding
                total += t.numel * t.count * _replication_factor(config, t.name, t.expert)
    return total


def _replication_factor(config: EstimatorConfig, name: str, expert: bool) -> int:
    """How many GPUs of one model replica hold distinct shards of this tensor."""
    p = config.parallel
    if expert:
        return p.ep * p.etp
    if _tp_split(config, name):
        return p.tp
    return 1


def _tp_split(config: EstimatorConfig, name: str) -> bool:
    return _tp_split_by_name(name, config.kernels.transformer_impl == "transformer_engine")


@lru_cache(maxsize=1 << 16)
def _tp_split_by_name(name: str, transformer_engine: bool) -> bool:
    leaf = name.rsplit(".", 2)
    module, kind = leaf[-2], leaf[-1]
    if "layernorm" in module or module in ("enorm", "hnorm", "router", "position_embeddings") or name.endswith("gate_weight"):
        return False
    # whole on every TP rank: a G layer's in_proj norm (TELayerNormColumnParallelLinear) and its
    # per-head out_norm (gated_delta_net.py); a D layer's indexer, TELinear duplicated, and its
    # k_norm (experimental_attention_variant/dsa.py DSAIndexer)
    if module in ("layer_norm", "out_norm", "k_norm", "linear_wq_b", "linear_wk", "linear_weights_proj"):
        return False
    if module in ("linear_q_down_proj", "linear_kv_down_proj"):
        return not transformer_engine
    if module in ("linear_proj", "linear_fc2") and kind == "bias":
        return False
    return True


def _ep_dp_load_bytes(config: EstimatorConfig) -> int | None:
    """The most checkpoint-load buffers a stage would keep with the expert data-parallel load
    group (--ckpt-fully-parallel-load-process-group ep_dp); None when that is no other choice
    (a dense model, or the group is ep_dp already)."""
    if config.model.moe is None or config.checkpoint.load_process_group == "ep_dp":
        return None
    ep_dp = replace(config, checkpoint=replace(config.checkpoint, load_process_group="ep_dp"))
    return max(load_exchange_bytes(ep_dp, [chunk_tensors(ep_dp, chunk) for chunk in stage.chunks])
               for stage in pipeline_stages(ep_dp))


def model_shape(config: EstimatorConfig) -> ModelShape:
    """The model and batch of ``config``, for the report's summary."""
    m, tr, prec, opt = config.model, config.training, config.precision, config.optimizer
    experts = None
    if m.moe is not None:
        experts = (m.moe.num_experts, m.moe.router_topk, m.moe.ffn_hidden_size, sum(m.moe.layer_pattern))
    return ModelShape(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
        multi_latent_attention=m.mla is not None, padded_vocab_size=m.padded_vocab_size,
        vocab_source=m.vocab_source, micro_batch_size=tr.micro_batch_size, seq_length=tr.seq_length,
        global_batch_size=tr.global_batch_size, num_microbatches=tr.num_microbatches,
        params_dtype=prec.params_dtype, main_grads_dtype=prec.main_grads_dtype, optimizer=opt.optimizer,
        distributed_optimizer=opt.use_distributed_optimizer, experts=experts)


def assumptions(config: EstimatorConfig, overheads: Overheads, environ: Mapping[str, str],
                stages: tuple[StageEstimate, ...] = ()) -> tuple[Assumed, ...]:
    """What the estimate took as given, as facts (report/assumptions.py says them)."""
    k = config.kernels
    cublas, cublas_source = cublas_workspace_bytes(environ, overheads.compute_capability,
                                                   config.training.deterministic_mode)
    # config.deterministic_fallback: deterministic training disables cuDNN fused attention
    # before sm90, and flash-attn below 2.4.1; the estimate assumes flash-attn >= 2.4.1.
    flash_attn_assumed = (k.transformer_impl == "transformer_engine" and k.attention_backend in ("flash", "fused")
                          and is_deterministic(config.training.deterministic_mode, environ)
                          and overheads.compute_capability < 9.0)
    items = [
        Assumed("attention_backend", k.attention_backend,
                {"source": k.attention_backend_source, "deterministic_flash_attn_assumed": flash_attn_assumed}),
        Assumed("schedule", None, {"interleaved": bool(config.parallel.vpp)}),
        Assumed("cublas_workspace", cublas,
                {"source": cublas_source, "compute_capability": overheads.compute_capability,
                 "grouped_gemm": te_grouped_gemm(config), "tp_comm_overlap": k.tp_comm_overlap}),
        Assumed("cuda_context", overheads.cuda_context_bytes),
        Assumed("nccl_buffers", overheads.nccl_bytes_per_communicator,
                {"communicators": tuple(communicators(config.parallel, config.model.moe is not None))}),
        Assumed("fragmentation", overheads.fragmentation),
    ]
    if config.optimizer.optimizer in ("soap", "adaptive_muon"):
        items.append(Assumed("optimizer", None, {"optimizer": config.optimizer.optimizer}))
    if config.model.moe is not None:
        items.append(Assumed("routing", overheads.routing_imbalance))
    resume = config.run.resume
    if resume.requested != "no" and (resume.load is not None or resume.requested == "yes"):
        load = resume_load(config)
        facts = {"resume": resume, "load": load}
        if load is not None and load.exchanges:
            buffers = [(dict(s.details).get("checkpoint_load_buffers", 0), s.pipeline_rank) for s in stages]
            most, rank = max(buffers, default=(0, 0))
            facts.update(most_bytes=most, stage=rank, ep_dp_bytes=_ep_dp_load_bytes(config) if most else None)
        items.append(Assumed("resume", resume.resumes, facts))
    hybrid = config.model.hybrid
    if hybrid is not None and "M" in hybrid.layer_kinds:
        # model/activations.py: what a Mamba layer holds is what mamba_ssm's training kernels save
        # (MambaSplitConv1dScanCombinedFn, LayerNormFn), outside megatron-core.
        items.append(Assumed("mamba_kernels", None, {"layers": hybrid.layer_kinds.count("M")}))
    if hybrid is not None and "G" in hybrid.layer_kinds + hybrid.mtp_kinds:
        # model/activations.py gdn_bytes: flash-linear-attention's kernels, outside megatron-core.
        items.append(Assumed("gdn_kernels", None, {"layers": hybrid.layer_kinds.count("G"),
                                                   "variant": hybrid.gdn.variant,
                                                   "deterministic": config.training.deterministic_mode}))
    if hybrid is not None and "D" in hybrid.layer_kinds + hybrid.mtp_kinds:
        # model/activations.py dsa_bytes: the PyTorch sparse attention path, or an assumed fused kernel.
        items.append(Assumed("dsa_kernels", None, {"layers": hybrid.layer_kinds.count("D"),
                                                   "backend": hybrid.dsa.kernel_backend,
                                                   "unfused": config.kernels.attention_backend == "unfused"}))
    kd = config.distillation
    if kd is not None:
        teacher = [dict(s.details).get("teacher_weights", 0) for s in stages]
        items.append(Assumed("distillation", kd_logits_buffers(config.parallel.tp), {
            "teacher_source": kd.teacher_source, "teacher_overrides": kd.teacher_overrides,
            "teacher_bytes": max(teacher, default=0), "skip_lm_loss": kd.skip_lm_loss,
            "intermediate_pairs": kd.intermediate_pairs, "kd_cfg_source": kd.kd_cfg_source,
            "tp": config.parallel.tp}))
    for term in config.co_resident:
        items.append(Assumed("co_resident", resident_bytes(config, term), {
            "role": term.role, "tp": term.tp, "pp": term.pp, "weights": term.weights,
            "gradients": term.gradients, "optimizer": term.optimizer, "source": term.source,
            "location": term.location}))
    if k.tp_comm_overlap:
        items.append(Assumed("tp_comm_overlap"))
    for note in config.notes:
        items.append(Assumed("megatron_derived", None, {"note": note}))
    for flag, what in config.not_modelled:
        items.append(Assumed("not_modelled", None, {"flag": flag, "what": what}))
    return tuple(items)
