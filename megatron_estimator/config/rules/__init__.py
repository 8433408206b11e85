"""Megatron's cross-field rules, grouped by topic; this module is their one registry.

Every rule takes the derived namespace (``derive.derive_namespace``), the raw input (for
locations), the job's environment and what the run knows beyond its flags (``RunContext``: the
GPU, the launch line, the release) and yields problems.  Each mirrors a check Megatron makes
before it trains (validate_args, the config classes' ``__post_init__``, the model build, the
DDP / FSDP wrap, the first step) and cites the file, line and releases.  Messages state the
arithmetic, so the user sees why.  Release-dependent rules read ``data/megatron_behaviour.tsv``
(``_common.release_behaviour``).

Where a rule goes: ``layout`` (parallel sizes), ``pipeline``, ``moe``, ``attention`` (and the
layer's other modules), ``recompute`` (and offloading), ``precision``, ``cuda_graphs``, ``fsdp``,
``environment`` (variables and the stack), ``training`` (batch sizes, schedule, data).  Add it to
``RULES`` below: the order is the order problems are reported in.
"""

from __future__ import annotations

from typing import Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules import (
    attention, cuda_graphs, environment, fsdp, layout, moe, pipeline, precision, recompute, training,
)
from megatron_estimator.config.rules._common import Namespace, Rule
from megatron_estimator.config.rules.environment import device_connections  # noqa: F401 (tests)


RULES: list[Rule] = [
    layout.parallel_product,
    layout.tp_pp_dp_mapping_expert_dp,
    attention.attention_heads,
    layout.sequence_length,
    training.batch_sizes,
    moe.experts,
    pipeline.pipeline_split,
    pipeline.hybrid_layer_pattern,
    pipeline.virtual_pipeline,
    recompute.recompute,
    precision.optimizer_and_precision,
    layout.distributed_optimizer_instances,
    layout.tp_comm_overlap_needs_sp,
    attention.mla_sizes,
    attention.mla_with_gqa,
    attention.mtp_position_embedding,
    attention.attention_backend_local,
    recompute.cpu_offloading,
    layout.hybrid_cp_with_pp,
    attention.no_position_embedding,
    training.deprecated,
    training.training_schedule,
    environment.environment,
    moe.moe_features,
    recompute.activation_offloading,
    environment.device_connections,
    environment.fsdp_device_connections,
    attention.mla_qk_norm,
    training.step_batch_size_schedule,
    environment.deterministic_mode,
    environment.te_version,
    training.rampup_with_train_iters,
    moe.moe_bias_expert_tensor_parallel,
    cuda_graphs.cuda_graph_full_recompute,
    cuda_graphs.cuda_graph_nccl_graph_register,
    recompute.fp8_delayed_recompute_modules,
    cuda_graphs.offloading_with_local_cuda_graphs,
    layout.weight_shards_vs_tp,
    pipeline.defer_embedding_wgrad,
    pipeline.p2p_warmup_flush,
    precision.low_precision_recipes,
    moe.moe_routing,
    moe.moe_dispatch_and_overlap,
    attention.activation_fusions,
    attention.attention_variants,
    cuda_graphs.cuda_graph_settings,
    recompute.offloading_and_stash,
    moe.grouped_expert_weights,
    attention.hyper_connections,
    cuda_graphs.cuda_graphs_with_offloading,
    moe.ep_overlap_graphs_and_offloads,
    precision.batch_invariant_mode,
    attention.local_norm_sequence_parallel,
    attention.local_attention_context_parallel,
    fsdp.torch_fsdp2,
    fsdp.megatron_fsdp_pipeline,
    fsdp.fsdp_manual_registration,
    fsdp.checkpoint_format,
    cuda_graphs.full_iteration_graph_nan_check,
    layout.cp_a2a_p2p_hierarchy,
    layout.ffn_hidden_size_vs_tp,
    recompute.mtp_uniform_recompute,
]


def check_rules(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext = RunContext()) -> list[Problem]:
    problems: list[Problem] = []
    for check in RULES:
        problems.extend(check(ns, raw, env, run))
    return problems
