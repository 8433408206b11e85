"""Megatron's derived values, computed the way ``validate_args`` computes them.

Input: a namespace (every Megatron dest -> value, defaults filled in) plus the world size.
Output: a new namespace with the values Megatron derives before it builds the model, and a
list of notes saying what was changed behind the user's back (sequence parallel dropped at
tp 1, ...).  Sources: megatron/training/arguments.py ``validate_args``,
megatron/training/argument_utils.py ``core_transformer_config_from_args``,
megatron/core/transformer/transformer_config.py ``__post_init__``.

Derivation never fails: where an input is invalid, the value is derived with a safe
fallback and ``validation.rules`` reports the problem.
"""

from __future__ import annotations

from typing import Any, Mapping

from megatron_estimator.config.hybrid import derived_vpp
from megatron_estimator.config.layout_syntax import count_layout_stages
from megatron_estimator.megatron.releases import ChosenRelease


def _int(value: Any, fallback: int = 1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else fallback


def optimizer_sharding(optimizer: str, use_distributed_optimizer: bool) -> tuple[bool, bool]:
    """(--use-distributed-optimizer, the layer-wise distributed optimizer) as validate_args
    sets them for ``optimizer``: emerging optimizers (neither adam nor sgd: Muon, ...) asked
    for the distributed optimizer run Megatron's LayerWiseDistributedOptimizer instead
    (megatron/training/arguments.py)."""
    if optimizer in ("sgd", "adam") or not use_distributed_optimizer:
        return use_distributed_optimizer, False
    return False, True


def shards_optimizer_states(ns: Mapping[str, Any]) -> bool:
    """Whether a derived namespace shards optimizer states over data parallelism: the
    distributed optimizer, or the layer-wise one emerging optimizers (Muon) run instead."""
    return bool(ns.get("use_distributed_optimizer") or ns.get("use_layer_wise_distributed_optimizer"))


def derive_namespace(ns: Mapping[str, Any], world_size: int, release: ChosenRelease) -> tuple[dict, list[str]]:
    """What Megatron's validate_args derives from ``ns`` on ``world_size`` GPUs, as release
    ``release`` derives it, and notes of what was derived."""
    d = dict(ns)
    notes: list[str] = []
    d["world_size"] = world_size

    tp = _int(d.get("tensor_model_parallel_size"))
    pp = _int(d.get("pipeline_model_parallel_size"))
    cp = _int(d.get("context_parallel_size"))
    d["data_parallel_size"] = max(world_size // (tp * pp * cp), 1)

    if d.get("expert_tensor_parallel_size") is None:
        d["expert_tensor_parallel_size"] = tp

    if d.get("recompute_activations"):
        d["recompute_granularity"] = "selective"

    # Batch: global batch defaults to micro batch x data parallel.
    mbs = _int(d.get("micro_batch_size"))
    if d.get("global_batch_size") is None:
        d["global_batch_size"] = mbs * d["data_parallel_size"]
    d["num_microbatches"] = max(_int(d.get("global_batch_size")) // (mbs * d["data_parallel_size"]), 1)

    # Hybrid / legacy spellings.
    if d.get("use_rotary_position_embeddings"):
        d["position_embedding_type"] = "rope"
    if d.get("num_layers") is None and d.get("encoder_num_layers") is not None:
        d["num_layers"] = d["encoder_num_layers"]
    if d.get("seq_length") is None and d.get("encoder_seq_length") is not None:
        d["seq_length"] = d["encoder_seq_length"]

    # Virtual pipeline size.
    num_layers = _int(d.get("num_layers"))
    vpp = None
    if d.get("pipeline_model_parallel_layout") is not None:
        stages = count_layout_stages(d["pipeline_model_parallel_layout"])
        if stages and stages % pp == 0:
            vpp = stages // pp
    elif d.get("num_virtual_stages_per_pipeline_rank") is not None:
        vpp = d["num_virtual_stages_per_pipeline_rank"]
    elif d.get("num_layers_per_virtual_pipeline_stage") is not None:
        counted = num_layers + bool(d.get("account_for_embedding_in_pipeline_split")) + bool(
            d.get("account_for_loss_in_pipeline_split"))
        per_stage = counted // pp
        per_virtual = _int(d["num_layers_per_virtual_pipeline_stage"])
        vpp = per_stage // per_virtual if per_stage % per_virtual == 0 else None
    decided, hybrid_vpp = derived_vpp(d, pp)
    if decided:
        vpp = hybrid_vpp        # from the hybrid pattern's '|' segments (arguments.py)
    if vpp == 1:
        vpp = None
    d["virtual_pipeline_model_parallel_size"] = vpp
    if vpp is None:
        d["overlap_p2p_comm"] = False
    if d.get("microbatch_group_size_per_vp_stage") is None:
        d["microbatch_group_size_per_vp_stage"] = pp

    # Precision.
    if d.get("fp16"):
        d["params_dtype"] = "fp16"
    elif d.get("bf16"):
        d["params_dtype"] = "bf16"
    else:
        d["params_dtype"] = "fp32"
    if d.get("bf16"):
        if d.get("grad_reduce_in_bf16"):
            d["accumulate_allreduce_grads_in_fp32"] = False
        elif d.get("main_grads_dtype", "fp32") == "fp32":
            d["accumulate_allreduce_grads_in_fp32"] = True
    if d.get("use_megatron_fsdp") and d.get("megatron_fsdp_version", 1) != 2 and _fsdp_forces_dist_opt(release):
        # arguments.py validate_args from ab43d43f0b (0.18.0); before, the flag stayed as given
        # (the states are sharded by Megatron-FSDP either way: model/states.py)
        if not d.get("use_distributed_optimizer"):
            notes.append("Megatron-FSDP v1 turns on the distributed optimizer")
        d["use_distributed_optimizer"] = True
    d["use_layer_wise_distributed_optimizer"] = False
    if d.get("optimizer") == "dist_muon":
        d["optimizer"] = "muon"
        d["use_layer_wise_distributed_optimizer"] = True
    if d.get("optimizer") is not None:
        distributed, layer_wise = optimizer_sharding(d["optimizer"], bool(d.get("use_distributed_optimizer")))
        if layer_wise:
            d["use_layer_wise_distributed_optimizer"] = True
        if d.get("use_distributed_optimizer"):
            d["use_distributed_optimizer"] = distributed

    # Model shape.
    hidden = _int(d.get("hidden_size"))
    heads = _int(d.get("num_attention_heads"))
    if d.get("ffn_hidden_size") is None:
        if d.get("swiglu"):
            d["ffn_hidden_size"] = int((4 * hidden * 2 / 3) / 64) * 64
        else:
            d["ffn_hidden_size"] = 4 * hidden
    if d.get("kv_channels") is None:
        d["kv_channels"] = hidden // heads
    d["num_query_groups"] = d.get("num_query_groups") if d.get("group_query_attention") else heads

    if tp == 1:
        if d.get("sequence_parallel"):
            notes.append("sequence parallel is off: Megatron disables it when tensor parallel size is 1")
        d["sequence_parallel"] = False

    if not d.get("add_bias_linear", True):
        d["bias_gelu_fusion"] = False
    if d.get("add_bias_linear", True):
        d["add_qkv_bias"] = True
    if d.get("position_embedding_type") != "rope":
        d["apply_rope_fusion"] = False

    if d.get("num_experts") == 0:
        d["num_experts"] = None
    if d.get("num_experts") is not None and d.get("moe_ffn_hidden_size") is None:
        d["moe_ffn_hidden_size"] = d["ffn_hidden_size"]

    if d.get("apply_query_key_layer_scaling"):
        d["attention_softmax_in_fp32"] = True
    if d.get("recompute_modules") is None:
        d["recompute_modules"] = ["core_attn"]
    if (d.get("cpu_offloading_num_layers") or 0) > 0:
        d["cpu_offloading"] = True
    if d.get("tokenizer_type") is None:
        # pretrain_gpt.py passes args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}.
        d["tokenizer_type"] = "GPT2BPETokenizer"
    return d, notes


def _fsdp_forces_dist_opt(release: ChosenRelease) -> bool:
    """Whether the release's Megatron-FSDP turns on the distributed optimizer
    (data/megatron_behaviour.tsv fsdp_optimizer_checked)."""
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour("fsdp_optimizer_checked", release) == "1"
