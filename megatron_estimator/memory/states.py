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

from ..config import EstimatorConfig
from .parameters import ParamTensor

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelStates:
    weights: int
    gradients: int
    optimizer_states: int
    master_params: int         # part of optimizer_states
    optimizer_moments: int     # part of optimizer_states
    padded_elements: int       # buffer padding added by the distributed optimizer layout


def _buffer_numel(tensors: list[ParamTensor], bucket_size: int | None, dp_shard: int,
                  padded: bool, shared_embedding: bool) -> int:
    """Elements of one contiguous param/grad buffer, padded as the distributed optimizer pads it."""
    if not padded:
        return sum(t.numel for t in tensors)
    divisor = math.lcm(dp_shard, 128)

    def pad_end(index: int) -> int:
        return -(-index // divisor) * divisor

    start = bucket_start = 0
    bucket_has_params = False
    end = 0
    for tensor in reversed(tensors):
        start = -(-start // 64) * 64
        own_bucket = shared_embedding and tensor.name in ("embedding.word_embeddings.weight",
                                                          "output_layer.weight")
        if own_bucket and bucket_has_params:
            bucket_start = pad_end(start)
            start = bucket_start
            bucket_has_params = False
        end = start + tensor.numel
        bucket_has_params = True
        if (bucket_size is not None and end - bucket_start >= bucket_size) or own_bucket:
            bucket_start = pad_end(end)
            start = bucket_start
            bucket_has_params = False
        else:
            start = end
    if bucket_has_params:
        return pad_end(end)
    return bucket_start


def model_states(config: EstimatorConfig, chunks_tensors: list[list[ParamTensor]]) -> ModelStates:
    """Model states of one GPU holding these model chunks (one tensor list per chunk)."""
    prec = config.precision
    p = config.parallel
    param_bytes = DTYPE_BYTES[prec.params_dtype]
    grad_bytes = DTYPE_BYTES[prec.main_grads_dtype]
    distributed = prec.use_distributed_optimizer
    instances = max(prec.num_distributed_optimizer_instances, 1)
    dense_shard = max(p.dp * p.cp // instances, 1)
    expert_shard = max(p.edp // instances, 1)
    bucket_size = None
    if prec.overlap_grad_reduce:
        bucket_size = prec.ddp_bucket_size or max(40_000_000, 1_000_000 * p.dp * p.cp)
    shared_embedding = (not config.model.untie_embeddings_and_output_weights) and p.pp > 1

    weights = gradients = master = moments = padding = 0
    moment_bytes = _moment_bytes(config)
    master_bytes = 0 if prec.params_dtype == "fp32" else DTYPE_BYTES[
        prec.main_params_dtype if prec.use_precision_aware_optimizer else "fp32"]
    for tensors in chunks_tensors:
        for expert in (False, True):
            group = [t for t in tensors if t.expert == expert]
            if not group:
                continue
            numel = sum(t.numel for t in group)
            shard = expert_shard if expert else dense_shard
            buffer = _buffer_numel(group, bucket_size, shard, distributed, shared_embedding and not expert)
            padding += buffer - numel
            gradients += buffer * grad_bytes
            if distributed:
                weights += buffer * param_bytes
                local = numel / shard
            else:
                weights += numel * param_bytes
                local = numel
            master += int(local * master_bytes)
            moments += int(local * moment_bytes)
    offload = prec.optimizer_offload_fraction if prec.optimizer_cpu_offload else 0.0
    master = int(master * (1 - offload))
    moments = int(moments * (1 - offload))
    return ModelStates(weights, gradients, master + moments, master, moments, padding)


def _moment_bytes(config: EstimatorConfig) -> int:
    prec = config.precision
    if prec.optimizer == "sgd":
        return 4
    if prec.use_precision_aware_optimizer:
        return DTYPE_BYTES[prec.exp_avg_dtype] + DTYPE_BYTES[prec.exp_avg_sq_dtype]
    return 8
