"""Model states: weights, gradients and optimizer states on one GPU of a pipeline stage.

Sources (Megatron-LM):
- megatron/core/distributed/distributed_data_parallel.py: one set of contiguous buffers per
  model chunk, split into dense and expert-parallel buffers; bucket size
  ``max(40M, 1M x dp)`` elements with --overlap-grad-reduce, one bucket otherwise.
- megatron/core/optimizer/distrib_optimizer.py ``_compute_per_buffer_param_layout`` and
  megatron/core/optimizer/param_layout.py: with the distributed optimizer, parameters are
  laid out in reverse order, each starting on a 64-element boundary; every bucket ends on a
  multiple of ``lcm(dp_shard, 128)``; a shared (tied) embedding gets a bucket of its own.
- megatron/core/distributed/param_and_grad_buffer.py: the grad buffer holds every local
  parameter in the main-grads dtype (fp32 unless --grad-reduce-in-bf16); with the
  distributed optimizer the parameters live in a param buffer of the same layout.
- megatron/core/optimizer/optimizer.py ``Float16OptimizerWithFloat16Params`` and
  distrib_optimizer.py: an fp32 master copy of each (shard of a) 16-bit parameter; Adam keeps
  exp_avg and exp_avg_sq in fp32 (precision-aware optimizer: in --exp-avg-dtype /
  --exp-avg-sq-dtype); SGD keeps one momentum buffer.
The distributed optimizer shards master params and optimizer states over the data-parallel
x context-parallel group (divided by --num-distributed-optimizer-instances) for dense
parameters and over the expert data-parallel group for expert parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model.parameters import ParamTensor, RecordBlock, expanded

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelStates:
    weights: int
    gradients: int
    optimizer_states: int
    master_params: int         # part of optimizer_states
    optimizer_moments: int     # part of optimizer_states
    padded_elements: int       # buffer padding added by the distributed optimizer layout
    fp8_weight_copies: int = 0 # part of weights: Transformer Engine's fp8 weight copies
    fsdp_transient: int = 0    # Megatron-FSDP: FSDP-unit parameters all-gathered at the backward


def _buffer_numel(tensors: list[ParamTensor], bucket_size: int | None, dp_shard: int,
                  padded: bool, shared_embedding: bool) -> int:
    """Elements of one contiguous param/grad buffer, padded as the distributed optimizer pads it.

    Walked in reverse module order: each tensor starts on a 64-element boundary; a bucket
    closes after the tensor that brings it to ``bucket_size`` elements and ends on a multiple
    of ``lcm(dp_shard, 128)``.  A block of grouped records (``ParamTensor.count`` repeats of
    ``span`` records: the local experts) is walked as that many repeats without writing them
    out (``_repeat_block``): the same integers as one record per tensor."""
    return _blocks_numel(((tensors, 1),), bucket_size, dp_shard, padded, shared_embedding)


def _walk_items(records) -> list:
    """A run of records in walk (reverse) order as ``_repeat_block`` items: a tensor's size, or
    (items, count) for a block of grouped records."""
    items: list = []
    i = len(records)
    while i > 0:
        t = records[i - 1]
        if t.span > 1 or t.count > 1:
            items.append(([b.numel for b in reversed(records[i - t.span:i])], t.count))
            i -= t.span
        else:
            items.append(t.numel)
            i -= 1
    return items


def _blocks_numel(blocks, bucket_size: int | None, dp_shard: int, padded: bool,
                  shared_embedding: bool) -> int:
    """``_buffer_numel`` of the records of these (records, repeats) runs in module order, each
    run's records walked ``repeats`` times over (model/parameters.py ``RecordBlock``)."""
    if not padded:
        return sum(repeats * t.numel * t.count for records, repeats in blocks for t in records)
    divisor = math.lcm(dp_shard, 128)
    # The walk's state, relative to the open bucket: ``base`` where it starts (a multiple of
    # ``divisor``, so of 64), ``off`` where the last tensor ended, ``has`` whether it holds one.
    base = off = 0
    has = False
    for tensors, repeats in reversed(blocks):
        if repeats != 1:
            # A run of identical decoder layers (no tied embedding among them): ``repeats``
            # repeats of one layer's walk, nested expert blocks included.
            base, off, has = _repeat_block(_walk_items(tensors), repeats, base, off, has, bucket_size, divisor)
            continue
        i = len(tensors)
        while i > 0:
            tensor = tensors[i - 1]
            if tensor.span > 1 or tensor.count > 1:
                block = tensors[i - tensor.span:i]
                i -= tensor.span
                base, off, has = _repeat_block([t.numel for t in reversed(block)], tensor.count,
                                               base, off, has, bucket_size, divisor)
                continue
            i -= 1
            off = -(-off // 64) * 64
            own_bucket = shared_embedding and tensor.name in ("embedding.word_embeddings.weight",
                                                              "output_layer.weight")
            if own_bucket and has:
                base += -(-off // divisor) * divisor
                off = 0
            end = off + tensor.numel
            if (bucket_size is not None and end >= bucket_size) or own_bucket:
                base += -(-end // divisor) * divisor
                off, has = 0, False
            else:
                off, has = end, True
    if has:
        return base + -(-off // divisor) * divisor
    return base


def _stride_reach(sizes: list) -> tuple[int, int]:
    """(stride, reach) of one repeat of these items started at a 64-aligned offset: how far it
    advances the next start (each size rounded up to 64, a nested block ``count`` times its
    own stride) and where its last tensor ends past that start."""
    stride = 0
    for n in sizes:
        if isinstance(n, tuple):
            stride += n[1] * _stride_reach(n[0])[0]
        else:
            stride += -(-n // 64) * 64
    last = sizes[-1]
    while isinstance(last, tuple):
        last = last[0][-1]
    return stride, stride - (-(-last // 64) * 64 - last)


def _repeat_block(sizes: list, count: int, base: int, off: int, has: bool,
                  bucket_size: int | None, divisor: int) -> tuple[int, int, bool]:
    """The layout walk's state after ``count`` repeats of tensors of these ``sizes`` (in walk
    order; an item may itself be a block, (sizes, count), walked the same way: a decoder
    layer's local experts inside a run of layers), as if each were walked one by one.  A
    repeat that starts at a 64-aligned offset advances it by ``stride`` (each size rounded up
    to 64) and its last tensor ends ``reach`` past that start; repeats that close no bucket
    are skipped at once, and once the state at a repeat's start recurs, whole cycles of
    repeats are skipped: exact integers throughout."""
    sizes = [n for n in sizes if not isinstance(n, tuple) or (n[1] > 0 and n[0])]
    if count <= 0 or not sizes:
        return base, off, has
    stride, reach = _stride_reach(sizes)
    if bucket_size is None:
        return base, -(-off // 64) * 64 + (count - 1) * stride + reach, True
    seen: dict[tuple[int, bool], tuple[int, int]] | None = {} if stride else None
    done = 0
    while done < count:
        if seen is not None:
            key = (off, has)
            if key in seen:
                first, first_base = seen[key]
                period = done - first
                cycles = (count - done) // period
                base += cycles * (base - first_base)
                done += cycles * period
                seen = None             # fewer than one period left: walk them
                continue
            seen[key] = (done, base)
        aligned = -(-off // 64) * 64
        if stride and aligned + reach < bucket_size:
            # Repeats that close no bucket: their last tensor ends below bucket_size.
            skip = min(count - done, -(-(bucket_size - aligned - reach) // stride))
            off, has = aligned + (skip - 1) * stride + reach, True
            done += skip
            continue
        for n in sizes:
            if isinstance(n, tuple):
                base, off, has = _repeat_block(n[0], n[1], base, off, has, bucket_size, divisor)
                continue
            end = -(-off // 64) * 64 + n
            if end >= bucket_size:
                base += -(-end // divisor) * divisor
                off, has = 0, False
            else:
                off, has = end, True
        done += 1
    return base, off, has


def model_states(config: EstimatorConfig, chunks_tensors: list[list[ParamTensor]]) -> ModelStates:
    """Model states of one GPU holding these model chunks (one tensor list per chunk)."""
    return model_states_of_blocks(config, [(RecordBlock(tuple(tensors)),) for tensors in chunks_tensors])


def model_states_of_blocks(config: EstimatorConfig, chunks_blocks, padded: bool = True) -> ModelStates:
    """``model_states`` of chunks given as ``RecordBlock`` runs (model/parameters.py
    ``chunk_blocks``): sums weigh each record by its block's repeats, the buffer layout walks
    each run as that many repeats (``_blocks_numel``): the same integers as the records
    written out one per tensor, per layer.  ``padded`` False: the buffers without the
    distributed optimizer's padding (a part of a stage's records: model/breakdown.py)."""
    prec, opt = config.precision, config.optimizer
    p = config.parallel
    param_bytes = DTYPE_BYTES[prec.params_dtype]
    grad_bytes = DTYPE_BYTES[prec.main_grads_dtype]
    # Emerging optimizers (Muon) with --use-distributed-optimizer run Megatron's
    # LayerWiseDistributedOptimizer instead (megatron/training/arguments.py validate_args).
    # With its param layout (the default), megatron/training/training.py
    # wrap_model_chunks_with_ddp turns DDP's distributed-optimizer buffers back on and every
    # parameter's states live on one data-parallel rank (whole-parameter shards, modelled as
    # an even split); with --no-use-layer-wise-param-layout DDP keeps full buffers and whole
    # parameters are dealt out ping-pong (``_layer_wise_ping_pong_bytes``).
    layer_wise = opt.use_layer_wise_distributed_optimizer
    ping_pong = layer_wise and not opt.use_layer_wise_param_layout
    distributed = (opt.use_distributed_optimizer or opt.use_megatron_fsdp
                   or (layer_wise and not ping_pong))
    instances = max(opt.num_distributed_optimizer_instances, 1)
    dense_shard = max(p.dp * p.cp // instances, 1)
    expert_shard = max(p.edp // instances, 1)
    bucket_size = None
    if opt.overlap_grad_reduce:
        bucket_size = opt.ddp_bucket_size or max(40_000_000, 1_000_000 * p.dp * p.cp)
    shared_embedding = (not config.model.untie_embeddings_and_output_weights) and p.pp > 1
    fsdp = opt.data_parallel_sharding_strategy if opt.use_megatron_fsdp else None

    weights = gradients = master = moments = padding = fp8_copies = 0
    unit_param_bytes = 0        # Megatron-FSDP: FSDP-unit (transformer layer) parameters, unsharded
    master_bytes = master_param_bytes(config)
    for blocks in chunks_blocks:
        # Each block's records split into dense and expert ones (an expert block stays whole).
        groups: tuple[list, list] = ([], [])
        for b in blocks:
            dense = [t for t in b.records if not t.expert]
            expert_records = [t for t in b.records if t.expert] if len(dense) < len(b.records) else []
            if dense:
                groups[False].append((dense, b.repeats, b.layers))
            if expert_records:
                groups[True].append((expert_records, b.repeats, b.layers))
        for expert in (False, True):
            group = groups[expert]
            if not group:
                continue
            # Elements by tensor kind (moment_bytes depends on a tensor's kind only: one call
            # per kind, exact ints), each record weighed by the tensors it stands for.
            by_kind: dict[str, int] = {}
            linear_tensors = 0
            for records, repeats, _ in group:
                for t in records:
                    by_kind[t.kind] = by_kind.get(t.kind, 0) + t.numel * t.count * repeats
                    if t.kind == "linear":
                        linear_tensors += t.count * repeats
            numel = sum(by_kind.values())
            shard = expert_shard if expert else dense_shard
            buffer = _blocks_numel([(records, repeats) for records, repeats, _ in group], bucket_size, shard,
                                   distributed and padded, shared_embedding and not expert)
            padding += buffer - numel
            fp8_numel = by_kind.get("linear", 0) if prec.fp8 else 0
            group_param_bytes = buffer * param_bytes
            if prec.fp8 and prec.fp8_param_gather:
                # --fp8-param-gather: the linear weights themselves are fp8 (1 B) in the buffer.
                group_param_bytes -= fp8_numel * (param_bytes - 1)
            group_grad_bytes = buffer * grad_bytes
            if fsdp in ("optim_grads", "optim_grads_params"):
                group_grad_bytes //= shard
            if fsdp == "optim_grads_params":
                group_param_bytes //= shard
                # Parameters outside the FSDP units are never resharded: their all-gathered
                # (unsharded) compute-dtype copy stays allocated beside the shard.
                for records, repeats, layers in group:
                    outside = [] if layers else [t for t in records if not _fsdp_unit(t)]
                    inside = records if layers else [t for t in records if _fsdp_unit(t)]
                    group_param_bytes += repeats * _param_bytes(config, outside)
                    unit_param_bytes += repeats * _param_bytes(config, inside)
            if not distributed:
                group_param_bytes = numel * param_bytes
            weights += group_param_bytes
            gradients += group_grad_bytes
            fp8_copies += _fp8_copy_bytes(config, fp8_numel)
            fp8_copies += fp8_scaling_state_bytes(config, linear_tensors) if prec.fp8 else 0
            local = numel / shard if distributed else numel
            master += int(local * master_bytes)
            kind_moments = sum(n * moment_bytes(config, ParamTensor("", 0, expert, kind)) for kind, n in by_kind.items())
            moments += int(kind_moments / (shard if distributed else 1))
    if ping_pong:
        # Whole parameters dealt out in sorted order: every tensor written out, layer by layer.
        master, moments = _layer_wise_ping_pong_bytes(
            config, [t for blocks in chunks_blocks for b in blocks for _ in range(b.repeats)
                     for t in expanded(list(b.records))], master_bytes, dense_shard, expert_shard)
    offload = opt.optimizer_offload_fraction if opt.optimizer_cpu_offload else 0.0
    master = int(master * (1 - offload))
    moments = int(moments * (1 - offload))
    transient = 0
    if fsdp == "optim_grads_params":
        # Megatron-FSDP (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py
        # _init_fsdp_param_and_grad_buffer): without --suggested-communication-unit-size the
        # communication unit is max(1e9, 2 x mean unit size) elements, so all-gathers prefetch
        # up to 5e8 elements ahead (param_and_grad_buffer.py AllGatherPipeline.all_gather_params).
        # The forward releases each unit after use, but the first unit's pre-backward hook
        # all-gathers every remaining unit of the chunk while the saved activations are still
        # alive: the stage's unit parameters, unsharded in the compute dtype (fp8 weights 1 B).
        prefetch = int(5e8) * param_bytes
        transient = min(unit_param_bytes, prefetch + unit_param_bytes // max(_unit_count(chunks_blocks), 1))
    return ModelStates(weights + fp8_copies, gradients, master + moments, master, moments, padding,
                       fp8_copies, transient)


def _fsdp_unit(tensor: ParamTensor) -> bool:
    """Whether Megatron-FSDP shards this parameter as part of an FSDP unit: the adapter makes
    TransformerLayer / MoETransformerLayer the unit modules (megatron/core/distributed/fsdp/
    mcore_fsdp_adapter.py, with MambaLayer: a hybrid model's layers, its MTP layers' nested
    ones too); embeddings, the output layer, final norms and the MTP glue (enorm, hnorm,
    eh_proj) are outside every unit."""
    return (tensor.name.startswith("decoder.layers.") or ".transformer_layer." in tensor.name
            or ".mtp_model_layer.layers." in tensor.name)


def _unit_count(chunks_blocks) -> int:
    """FSDP units of these chunks (``RecordBlock`` runs): one per decoder layer of a run, and
    the other records' units by name (an MTP depth's transformer layer or nested layers)."""
    units = set()
    layers = 0
    for blocks in chunks_blocks:
        for b in blocks:
            if b.layers:
                layers += b.repeats
                continue
            for t in b.records:
                if _fsdp_unit(t):
                    if ".transformer_layer." in t.name:
                        units.add(t.name.split(".transformer_layer.")[0])
                    elif ".mtp_model_layer.layers." in t.name:     # a hybrid MTP depth's nested layer
                        units.add(".".join(t.name.split(".")[:6]))
                    else:
                        units.add(".".join(t.name.split(".")[:3]))
    return len(units) + layers


def _param_bytes(config: EstimatorConfig, tensors: list[ParamTensor]) -> int:
    """Compute-dtype bytes of these parameters unsharded; with --fp8-param-gather the linear
    weights are fp8 (1 B) in Megatron-FSDP's model-weight buffer."""
    prec = config.precision
    total = 0
    for t in tensors:
        fp8 = prec.fp8 and prec.fp8_param_gather and t.kind == "linear"
        total += t.numel * t.count * (1 if fp8 else DTYPE_BYTES[prec.params_dtype])
    return total


def _fp8_copy_bytes(config: EstimatorConfig, fp8_numel: int) -> int:
    """Transformer Engine's fp8 copies of the GEMM weights, cached across microbatches
    (transformer_engine/pytorch/module/base.py weight workspaces): a row-wise copy and a
    column-wise (transposed) one, 1 byte each; MXFP8 adds one 1-byte scale per 32 elements
    per copy.  With --fp8-param-gather the weight is already fp8 and only the transpose is
    extra."""
    prec = config.precision
    if not prec.fp8 or not fp8_numel:
        return 0
    per_copy = fp8_numel + (fp8_numel // 32 if prec.fp8_recipe == "mxfp8" else 0)
    copies = 1 if prec.fp8_param_gather else 2
    return copies * per_copy


def fp8_scaling_state_bytes(config: EstimatorConfig, fp8_gemms: int) -> int:
    """Delayed scaling keeps, per fp8 GEMM, an amax history of --fp8-amax-history-len and a
    scale for its input, weight and gradient, in fp32 (transformer_engine/pytorch/fp8.py)."""
    prec = config.precision
    if not prec.fp8 or prec.fp8_recipe != "delayed":
        return 0
    return fp8_gemms * 3 * (prec.fp8_amax_history_len + 2) * 4


def _layer_wise_ping_pong_bytes(config: EstimatorConfig, tensors: list[ParamTensor], master_bytes: float,
                                dense_shard: int, expert_shard: int) -> tuple[int, int]:
    """(master, moment) bytes of the fullest data-parallel rank under the legacy layer-wise
    distributed optimizer (--no-use-layer-wise-param-layout).

    megatron/core/optimizer/layer_wise_optimizer.py ``_shard_params_ping_pong``: every
    parameter of the stage (Muon's matrices and the Adam-managed embeddings, norms and biases
    alike) is sorted by numel and dealt whole to the ranks of the dp x cp group (expert
    parameters: the expert data-parallel group) in the order 0..n-1, n-1..0; each rank keeps
    fp32 master copies (Float16OptimizerWithFloat16Params wraps the optimizers after
    sharding) and optimizer states for its own parameters only.  One rank therefore holds a
    whole embedding's states.  The largest rank is returned (the stage's device peak; the
    last data-parallel rank is not always it)."""
    per_rank_master: dict[tuple[bool, int], float] = {}
    per_rank_moments: dict[tuple[bool, int], float] = {}
    for expert, size in ((False, dense_shard), (True, expert_shard)):
        loop = list(range(size)) + list(range(size))[::-1]
        group = sorted((t for t in tensors if t.expert == expert), key=lambda t: t.numel)
        for index, tensor in enumerate(group):
            rank = loop[index % len(loop)]
            per_rank_master[expert, rank] = per_rank_master.get((expert, rank), 0) + tensor.numel * master_bytes
            per_rank_moments[expert, rank] = (per_rank_moments.get((expert, rank), 0)
                                              + tensor.numel * moment_bytes(config, tensor))
    master = moments = 0
    for expert, size in ((False, dense_shard), (True, expert_shard)):
        ranks = range(size)
        fullest = max(ranks, key=lambda r: per_rank_master.get((expert, r), 0) + per_rank_moments.get((expert, r), 0))
        master += int(per_rank_master.get((expert, fullest), 0))
        moments += int(per_rank_moments.get((expert, fullest), 0))
    return master, moments


def master_param_bytes(config: EstimatorConfig) -> float:
    """fp32 master copy per (sharded) parameter of a 16-bit model; none for fp32 training.
    The precision-aware optimizer keeps --main-params-dtype, and for bf16 params with fp32
    main params only the 16-bit remainder (optimizer_config.py store_param_remainders, on by
    default)."""
    params_dtype, opt = config.precision.params_dtype, config.optimizer
    if params_dtype == "fp32":
        return 0
    if opt.use_precision_aware_optimizer:
        if params_dtype == "bf16" and opt.main_params_dtype == "fp32":
            return 2
        return DTYPE_BYTES[opt.main_params_dtype]
    return 4


def moment_bytes(config: EstimatorConfig, tensor: ParamTensor) -> int:
    """Optimizer state bytes per parameter (megatron/core/optimizer/__init__.py):
    Adam exp_avg + exp_avg_sq; SGD one momentum buffer (none with --sgd-momentum 0); Lion one
    exp_avg; Muon one momentum buffer for 2-D hidden weights and Adam for the rest
    (embeddings, output layer, norms, biases).  Muon takes every 2-D parameter that is not
    an embedding or output weight (megatron/core/optimizer/emerging_optimizers.py
    ``_is_nonlinear_or_embedding``), the MoE router's [E, h] weight included."""
    opt = config.optimizer
    adam = (DTYPE_BYTES[opt.exp_avg_dtype] + DTYPE_BYTES[opt.exp_avg_sq_dtype]
            if opt.use_precision_aware_optimizer else 8)
    if opt.optimizer == "sgd":
        return 4 if opt.sgd_momentum > 0 else 0
    if opt.optimizer == "lion":
        return 4
    if opt.optimizer in ("muon", "dist_muon", "adaptive_muon"):
        return 4 if tensor.kind in ("linear", "router") else adam
    return adam
