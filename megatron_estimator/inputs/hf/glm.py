"""GLM-4.5 / GLM-4.5-Air (``glm4_moe``): a grouped-query attention decoder with q/k/v biases,
per-head q/k RMSNorm (``use_qk_norm``) and partial RoPE, dense first layers, then DeepSeek-V3
style experts (sigmoid routing with an expert bias, shared experts) and MTP layers.

The mapping follows Megatron-Bridge's GLM45Bridge (src/megatron/bridge/models/glm/glm45_bridge.py:
``attention_bias`` -> add_qkv_bias, ``use_qk_norm`` -> qk_layernorm, ``partial_rotary_factor`` ->
rotary_percent, ``first_k_dense_replace`` -> moe_layer_freq, ``n_shared_experts`` x
``moe_intermediate_size`` -> the shared expert, ``num_nextn_predict_layers`` -> mtp_num_layers)
and the HuggingFace model (transformers modeling_glm4_moe.py: q/k/v projections with bias,
o_proj without; the MLP and experts without biases).
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.deepseek import deepseek_experts
from megatron_estimator.inputs.hf.reader import MOE_TRAINING_KEYS, ConfigReader, is_fraction
from megatron_estimator.inputs.hf.rope import supply_rope
from megatron_estimator.inputs.hf.shape import (
    core_shape, supply_core_shape, supply_dropout, supply_gated_silu, supply_positions_vocab_rmsnorm,
    supply_query_groups)


def map_glm4_moe(r: ConfigReader) -> None:
    """GLM-4.5 and GLM-4.5-Air (Glm4MoeForCausalLM)."""
    layers, hidden, ffn, heads = core_shape(r)
    kv_heads = r.positive_int("num_key_value_heads")
    supply_core_shape(r, layers, hidden, ffn, heads)
    supply_query_groups(r, heads, kv_heads)
    # Glm4MoeAttention: head_dim from the config, else hidden / heads (96 heads do not divide 5120).
    head_dim = r.positive_int("head_dim", None, allow_none=True, note_default=False)
    if head_dim:
        r.supply("--kv-channels", head_dim, "head_dim")
    elif hidden and heads:
        r.note("hf-default-used", "head_dim",
               f"head_dim is not in the file; using hidden_size / num_attention_heads = {hidden // heads}")
    supply_positions_vocab_rmsnorm(r, "rms_norm_eps", 1e-5)
    supply_gated_silu(r)
    r.supply("--disable-bias-linear", True, "model_type")  # o_proj, the MLP and experts have none
    if r.boolean("attention_bias", False, note_default=False):
        r.supply("--add-qkv-bias", True, "attention_bias")
    if r.boolean("use_qk_norm", False, note_default=False):
        r.supply("--qk-layernorm", True, "use_qk_norm")
    supply_dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")
    r.supply("--position-embedding-type", "rope", "model_type")
    supply_rope(r, 10000.0)
    partial = r.value("partial_rotary_factor", 0.5, lambda v: is_fraction(v) and v > 0, "a number in (0, 1]")
    if partial is not None and partial != 1:
        r.supply("--rotary-percent", float(partial), "partial_rotary_factor")
    r.ignore(*MOE_TRAINING_KEYS)
    experts = r.positive_int("n_routed_experts")
    if experts:
        # Glm4MoeConfig's routing defaults: sigmoid scores with e_score_correction_bias, scale 1.0.
        deepseek_experts(r, experts, layers, True, 1.0)
    mtp = r.count("num_nextn_predict_layers", 0, note_default=False)
    if mtp:
        r.supply("--mtp-num-layers", mtp, "num_nextn_predict_layers")
