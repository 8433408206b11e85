"""Qwen3-Next (``model_type`` ``qwen3_next``): Qwen3-Next-80B-A3B, gated DeltaNet linear attention
on three of every four layers and gated softmax attention on the fourth, each followed by a MoE.

Megatron-Bridge's Qwen3NextBridge (src/megatron/bridge/models/qwen/qwen3_next_bridge.py) builds a
GPTModel with ``experimental_attention_variant`` gated_delta_net and ``linear_attention_freq``
(full_attention_interval); the estimator models gated delta nets as the 'G' layers of a hybrid
pattern, which Megatron-LM main builds from the same modules (megatron/core/models/hybrid/
hybrid_layer_specs.py: a 'G' layer is a TransformerLayer around a GatedDeltaNet whose in_proj
carries the layer's input norm; '*' an attention-only TransformerLayer; 'E' a MoE layer with its
pre-MLP norm).  So each HuggingFace layer becomes two symbols, its mixer then its MLP:
``GEGEGE*E`` repeated for the 80B model, the same tensors Bridge maps one to one.

The other settings are Bridge's: RMSNorm with zero-centred weights (``--apply-layernorm-1p``,
Qwen3NextRMSNorm scales by ``1 + weight``), q/k norms, the attention output gate (q_proj is twice
as wide: the query and a sigmoid gate per head, ``--attention-output-gate``), partial RoPE
(``partial_rotary_factor`` -> ``--rotary-percent``), SwiGLU experts with a gated shared expert
(``shared_expert_gate``, an h -> 1 linear: ``--moe-shared-expert-gate``), untied embeddings, no
linear biases.  The checkpoint also holds one MTP layer (``mtp.*``) that transformers does not
load and the config does not describe; it is not mapped.
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.reader import MOE_TRAINING_KEYS, ConfigReader, is_count, is_number, show_value
from megatron_estimator.inputs.hf.rope import supply_rope
from megatron_estimator.inputs.hf.shape import (
    core_shape, supply_core_shape, supply_dropout, supply_gated_silu, supply_positions_vocab_rmsnorm,
    supply_query_groups)

MIXERS = {"linear_attention": "G", "full_attention": "*"}
GDN_KEYS = (("linear_num_key_heads", "--linear-num-key-heads"), ("linear_num_value_heads", "--linear-num-value-heads"),
            ("linear_key_head_dim", "--linear-key-head-dim"), ("linear_value_head_dim", "--linear-value-head-dim"),
            ("linear_conv_kernel_dim", "--linear-conv-kernel-dim"))
# Qwen3NextConfig keys the model does not read (Qwen3 MoE's sliding-window keys) or that say how
# the checkpoint was produced.
IGNORED_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "full_attention_interval")


def map_qwen3_next(r: ConfigReader) -> None:
    """Qwen3-Next-80B-A3B (Instruct, Thinking, Base)."""
    from megatron_estimator.megatron.flags import flag_table

    if "--attention-output-gate" not in flag_table(r.release):
        r.problem("hf-unsupported-feature", "model_type",
                  f"Qwen3-Next needs Megatron 0.16.1 or later (--attention-output-gate, the gated delta net's "
                  f"--linear-* flags); the chosen release is {r.release}")
    layers, hidden, ffn, heads = core_shape(r)
    kv_heads = r.positive_int("num_key_value_heads")
    experts = r.count("num_experts")
    mixers = _mixers(r, layers)
    mlps = _mlps(r, layers, experts)
    if mixers is not None and mlps is not None:
        flag = "--hybrid-layer-pattern" if "--hybrid-layer-pattern" in flag_table(r.release) else "--hybrid-override-pattern"
        key = "layer_types" if r.has("layer_types") else "full_attention_interval"
        r.supply(flag, "".join(m + e for m, e in zip(mixers, mlps)), key)
    supply_core_shape(r, None, hidden, ffn, heads)      # Megatron derives the layer count from the pattern
    supply_query_groups(r, heads, kv_heads)
    head_dim = r.positive_int("head_dim", 256)
    if head_dim:
        r.supply("--kv-channels", head_dim, "head_dim")
    supply_positions_vocab_rmsnorm(r, "rms_norm_eps", 1e-6)
    r.supply("--apply-layernorm-1p", True, "model_type")
    supply_gated_silu(r)
    if r.boolean("attention_bias", False, note_default=False):
        r.problem("hf-unsupported-feature", "attention_bias",
                  "attention_bias true gives q/k/v/o biases without MLP biases; Megatron's bias switches "
                  "cannot give o_proj a bias alone")
    else:
        r.supply("--disable-bias-linear", True, "attention_bias" if r.has("attention_bias") else "model_type")
    r.supply("--qk-layernorm", True, "model_type")
    r.supply("--attention-output-gate", True, "model_type")
    supply_dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")
    r.supply("--position-embedding-type", "rope", "model_type")
    supply_rope(r, 10000.0)
    _partial_rotary(r)
    for key, flag in GDN_KEYS:
        value = r.positive_int(key)
        if value:
            r.supply(flag, value, key)
    _experts(r, experts)
    r.ignore(*IGNORED_KEYS, *MOE_TRAINING_KEYS)


def _mixers(r: ConfigReader, layers: int | None) -> list[str] | None:
    """Each layer's mixer from ``layer_types``, else every ``full_attention_interval``-th layer
    is full attention (Qwen3NextConfig)."""
    types = r.raw("layer_types")
    if types is None:
        interval = r.positive_int("full_attention_interval", 4)
        if interval is None or layers is None:
            return None
        return ["*" if (i + 1) % interval == 0 else "G" for i in range(layers)]
    if not isinstance(types, list) or not all(t in MIXERS for t in types):
        r.problem("hf-bad-value", "layer_types",
                  f"layer_types must be a list of \"linear_attention\" / \"full_attention\", got {show_value(types)}")
        return None
    if layers is not None and len(types) != layers:
        r.problem("hf-conflicting-keys", "layer_types",
                  f"layer_types names {len(types)} layers but num_hidden_layers is {layers}")
        return None
    r.ignore("full_attention_interval")
    return [MIXERS[t] for t in types]


def _mlps(r: ConfigReader, layers: int | None, experts: int | None) -> list[str] | None:
    """'E' where Qwen3NextDecoderLayer builds the sparse MoE block (num_experts > 0, the layer not in
    mlp_only_layers and (index + 1) % decoder_sparse_step == 0), else '-' (a dense SwiGLU MLP of
    intermediate_size, Megatron's --ffn-hidden-size)."""
    step = r.positive_int("decoder_sparse_step", 1, note_default=False)
    only_dense = r.raw("mlp_only_layers", []) or []
    if not isinstance(only_dense, list) or not all(is_count(i) for i in only_dense):
        r.problem("hf-bad-value", "mlp_only_layers",
                  f"mlp_only_layers must be a list of layer indices, got {show_value(only_dense)}")
        return None
    if experts is None or step is None or layers is None:
        return None
    return ["E" if experts and i not in only_dense and (i + 1) % step == 0 else "-" for i in range(layers)]


def _partial_rotary(r: ConfigReader) -> None:
    params = r.config.get("rope_parameters")
    if isinstance(params, dict) and "partial_rotary_factor" in params:
        value, key = params["partial_rotary_factor"], "rope_parameters.partial_rotary_factor"
        r.ignore("partial_rotary_factor")
    else:
        value, key = r.raw("partial_rotary_factor", 0.25), "partial_rotary_factor"
        if not r.has(key):
            r.note("hf-default-used", key, f"{key} is not in the file; using the {r.class_name} default 0.25")
    if not is_number(value) or not 0 < value <= 1:
        r.problem("hf-bad-value", key, f"{key} must be a number above 0 and at most 1, got {show_value(value)}")
        return
    r.supply("--rotary-percent", float(value), key)


def _experts(r: ConfigReader, experts: int | None) -> None:
    if not experts:
        r.ignore("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob")
        return
    topk = r.positive_int("num_experts_per_tok")
    moe_ffn = r.positive_int("moe_intermediate_size")
    shared = r.count("shared_expert_intermediate_size", 0, note_default=False)
    norm_topk = r.boolean("norm_topk_prob", True, note_default=False)
    r.supply("--num-experts", experts, "num_experts")
    if topk:
        r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    if moe_ffn:
        r.supply("--moe-ffn-hidden-size", moe_ffn, "moe_intermediate_size")
    if shared:
        r.supply("--moe-shared-expert-intermediate-size", shared, "shared_expert_intermediate_size")
        # Qwen3NextSparseMoeBlock scales the shared expert by sigmoid(shared_expert_gate(x)), h -> 1.
        r.supply("--moe-shared-expert-gate", True, "model_type")
    if norm_topk is False:
        # Softmax over all experts, top-k kept without renormalising (as decoder.py maps Qwen MoE).
        r.supply("--moe-router-pre-softmax", True, "norm_topk_prob")
