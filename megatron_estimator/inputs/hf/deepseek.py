"""DeepSeek-V2 / V2-Lite / V3 and V3's relatives: multi-latent attention with its YaRN RoPE,
shared + routed experts with group-limited routing, and V3's multi-token prediction.

Kimi-K2 (``kimi_k2``) is DeepSeek-V3's architecture with other sizes (Megatron-Bridge's KimiK2Bridge
builds it as V3).  DeepSeek-V3.2-Exp (``deepseek_v32``) adds DeepSeek sparse attention: a lightning
indexer (``index_n_heads`` heads of ``index_head_dim``, keeping ``index_topk`` tokens) on every
layer.  Megatron builds it as AbsorbedMLASelfAttention with a DSAttention core
(megatron/core/transformer/experimental_attention_variant/dsa.py), in a GPT decoder with
--experimental-attention-variant dsa or as the 'D' layers of a hybrid pattern
(megatron/core/models/hybrid/hybrid_layer_specs.py ``dsa_layer``); both hold the same tensors.
The estimator models DSA in hybrid patterns only, so a V3.2 layer is mapped to a 'D' layer
followed by its MLP ('-', the first_k_dense_replace layers) or MoE ('E') layer, and each MTP
depth to ``DE``.
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.reader import MOE_TRAINING_KEYS, REQUIRED, ConfigReader, is_number, is_positive_int, show_value
from megatron_estimator.inputs.hf.rope import rope_keys, supply_rotary_base
from megatron_estimator.inputs.hf.shape import (
    core_shape, supply_core_shape, supply_dropout, supply_gated_silu, supply_hybrid_pattern,
    supply_positions_vocab_rmsnorm)

# Model types built as DeepSeek-V3 (sigmoid routing with an expert bias, MTP); deepseek_v32 adds DSA.
V3_TYPES = frozenset({"deepseek_v3", "deepseek_v32", "kimi_k2"})


def map_deepseek(r: ConfigReader) -> None:
    """DeepSeek-V2 / V2-Lite / V3 / V3.2, Kimi-K2: MLA attention, shared + routed experts, optional MTP."""
    v3 = r.model_type in V3_TYPES
    sparse = r.model_type == "deepseek_v32"
    layers, hidden, ffn, heads = core_shape(r)
    # A hybrid pattern states the layer count (one 'D' and one MLP / MoE layer per decoder layer).
    supply_core_shape(r, None if sparse else layers, hidden, ffn, heads)
    r.ignore("pretraining_tp")
    r.ignore("num_key_value_heads")  # MLA has no key/value head groups (DeepSeek sets it = heads)
    supply_positions_vocab_rmsnorm(r, "rms_norm_eps", 1e-6)
    supply_gated_silu(r)
    if r.boolean("attention_bias", False, note_default=False):
        r.note(
            "hf-approximated", "attention_bias",
            "attention_bias true: Megatron's MLA is built without attention biases",
        )
    r.supply("--disable-bias-linear", True, "attention_bias" if r.has("attention_bias") else "model_type")
    supply_dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")

    # Multi-latent attention (megatron/core/transformer/multi_latent_attention.py).
    r.supply("--multi-latent-attention", True, "model_type")
    if "q_lora_rank" not in r.config:
        r.value("q_lora_rank", REQUIRED, is_positive_int, "a positive integer or null (no query compression)")
    q_lora = r.positive_int("q_lora_rank", None, allow_none=True)
    if q_lora:
        r.supply("--q-lora-rank", q_lora, "q_lora_rank")
    for key, flag in (
        ("kv_lora_rank", "--kv-lora-rank"),
        ("qk_nope_head_dim", "--qk-head-dim"),
        ("qk_rope_head_dim", "--qk-pos-emb-head-dim"),
        ("v_head_dim", "--v-head-dim"),
    ):
        value = r.positive_int(key)
        if value:
            r.supply(flag, value, key)
    # The q_a_layernorm (when q_lora_rank is set) and kv_a_layernorm are MLA's q/kv layernorms.
    r.supply("--qk-layernorm", True, "model_type")
    # MTP needs --position-embedding-type rope (validate_args); MLA applies its own RoPE/YaRN.
    r.supply("--position-embedding-type", "rope", "model_type")
    _mla_rope(r)

    # Experts (transformers modeling_deepseek_v2/v3.py: a layer is MoE when n_routed_experts is
    # set, index >= first_k_dense_replace and index % moe_layer_freq == 0).
    experts = r.positive_int("n_routed_experts", None, allow_none=True, note_default=False)
    if experts is None and "n_routed_experts" in r.config and r.config["n_routed_experts"] is not None:
        return  # bad value already reported
    r.ignore(*MOE_TRAINING_KEYS)
    mtp = r.count("num_nextn_predict_layers", 0, note_default=False) if v3 else 0
    moe_layers = None
    if not experts:
        r.ignore("moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace",
                 "moe_layer_freq", "topk_method", "n_group", "topk_group", "scoring_func",
                 "norm_topk_prob", "routed_scaling_factor")
        moe_layers = [0] * layers if layers else None
    else:
        moe_layers = deepseek_experts(r, experts, layers, v3, 2.5 if v3 else 1.0, layer_freq=not sparse)
    if sparse:
        _sparse_attention(r, moe_layers, mtp, bool(experts))
    elif mtp:
        r.supply("--mtp-num-layers", mtp, "num_nextn_predict_layers")
    quant = r.raw("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        r.note(
            "hf-not-mapped", "quantization_config",
            f"quantization_config ({method}) describes how the checkpoint is stored; Megatron "
            f"trains in the precision chosen by its own flags (--bf16, --fp8-format, ...)",
        )


def _mla_rope(r: ConfigReader) -> None:
    rope = rope_keys(r)
    supply_rotary_base(r, rope, 10000.0)
    scaling = rope.scaling
    if scaling is None or rope.kind != "yarn":
        key = rope.kind_key if scaling is not None else ("rope_scaling" if r.has("rope_scaling") else "model_type")
        r.supply("--rope-type", "rope", key)
        # MLATransformerConfig.__post_init__ rejects rope fusion unless rope_type is yarn.
        r.supply("--no-rope-fusion", True, key)
    if scaling is None:
        return
    if rope.kind != "yarn":
        r.note(
            "hf-not-mapped", rope.scaling_key,
            f"{rope.scaling_key} type {rope.kind!r} is not mapped for MLA (plain RoPE is used); "
            "positions only, memory unchanged",
        )
        return
    r.supply("--rope-type", "yarn", rope.kind_key)
    for key, flag in (("factor", "--rotary-scaling-factor"), ("mscale", "--mscale"), ("mscale_all_dim", "--mscale-all-dim")):
        if key in scaling:
            name = f"{rope.scaling_key}.{key}"
            if is_number(scaling[key]):
                r.supply(flag, float(scaling[key]), name)
            else:
                r.problem("hf-bad-value", name, f"{name} must be a number, got {show_value(scaling[key])}")
    # MLATransformerConfig (megatron/core/transformer/transformer_config.py) fixes these; no flag.
    fixed = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
    differ = [f"{k} {scaling[k]} (Megatron's MLA uses {v})" for k, v in fixed.items() if k in scaling and scaling[k] != v]
    if differ:
        r.note(
            "hf-approximated", rope.scaling_key,
            "YaRN with " + ", ".join(differ) + "; positions only, memory unchanged",
        )


def _sparse_attention(r: ConfigReader, moe_layers: list[int] | None, mtp: int | None, experts: bool) -> None:
    """DeepSeek-V3.2's lightning indexer as --dsa-indexer-* and the layers as a hybrid pattern
    (see the module notes): 'D' then '-' (dense) or 'E' (MoE) per decoder layer, ``DE`` (or
    ``D-`` without experts) per MTP depth, as the MTP layer repeats a MoE decoder layer."""
    for key, flag in (("index_n_heads", "--dsa-indexer-n-heads"), ("index_head_dim", "--dsa-indexer-head-dim"),
                      ("index_topk", "--dsa-indexer-topk")):
        value = r.positive_int(key)
        if value:
            r.supply(flag, value, key)
    # The DSA q / kv norms stay standalone modules (mla_qk_norm_config.py, is_dsa).
    r.supply("--experimental-attention-variant", "dsa", "model_type")
    if moe_layers is None or mtp is None:
        return  # a bad value is already reported
    pattern = "".join("DE" if moe else "D-" for moe in moe_layers)
    key = "first_k_dense_replace" if experts and r.has("first_k_dense_replace") else "num_hidden_layers"
    supply_hybrid_pattern(r, pattern, (("DE" if experts else "D-"), mtp) if mtp else None, key,
                          "num_nextn_predict_layers")


def deepseek_experts(r: ConfigReader, experts: int, layers: int | None, sigmoid: bool, scale_default: float,
                     *, layer_freq: bool = True) -> list[int] | None:
    """DeepSeek-style experts (also GLM-4.5's): routed + shared experts, dense first layers,
    softmax or ``sigmoid`` group-limited routing; the 0/1 MoE layer pattern, which is
    --moe-layer-freq when ``layer_freq`` (None when unreadable)."""
    v3 = sigmoid
    moe_ffn = r.positive_int("moe_intermediate_size")
    topk = r.positive_int("num_experts_per_tok")
    shared = r.count("n_shared_experts", None, allow_none=True, note_default=False) or 0
    first_dense = r.count("first_k_dense_replace", 0, note_default=False)
    freq = r.positive_int("moe_layer_freq", 1, note_default=False)
    r.supply("--num-experts", experts, "n_routed_experts")
    if moe_ffn:
        r.supply("--moe-ffn-hidden-size", moe_ffn, "moe_intermediate_size")
    if topk:
        r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    pattern = None
    if layers and first_dense is not None and freq:
        pattern = [1 if (i >= first_dense and i % freq == 0) else 0 for i in range(layers)]
        if layer_freq and any(p == 0 for p in pattern):
            r.supply("--moe-layer-freq", pattern, "first_k_dense_replace+moe_layer_freq")
    if shared and moe_ffn:
        r.supply("--moe-shared-expert-intermediate-size", shared * moe_ffn, "n_shared_experts+moe_intermediate_size")

    # Routing: softmax (V2) or sigmoid (V3) scores; group-limited top-k; V3's aux-loss-free bias.
    scoring = r.text("scoring_func", "sigmoid" if v3 else "softmax", note_default=False)
    method = r.text("topk_method", "noaux_tc" if v3 else "greedy", note_default=False)
    norm_topk = r.boolean("norm_topk_prob", v3, note_default=False)
    groups = r.positive_int("n_group", None, allow_none=True, note_default=False)
    group_topk = r.positive_int("topk_group", None, allow_none=True, note_default=False)
    scale = r.number("routed_scaling_factor", scale_default, note_default=False)
    if scoring in ("softmax", "sigmoid"):
        if scoring == "sigmoid":
            r.supply("--moe-router-score-function", "sigmoid", "scoring_func")
    elif scoring is not None:
        r.note(
            "hf-not-mapped", "scoring_func",
            f"scoring_func {scoring!r} is not mapped; Megatron's softmax router is used (no "
            "memory effect)",
        )
    if method == "noaux_tc":
        # e_score_correction_bias: Megatron keeps it as the router's expert_bias buffer (not a parameter).
        r.supply("--moe-router-enable-expert-bias", True, "topk_method")
    if method in ("group_limited_greedy", "noaux_tc") and groups and groups > 1 and group_topk:
        r.supply("--moe-router-num-groups", groups, "n_group")
        r.supply("--moe-router-group-topk", group_topk, "topk_group")
    elif method not in (None, "greedy", "group_limited_greedy", "noaux_tc"):
        r.note(
            "hf-not-mapped", "topk_method",
            f"topk_method {method!r} is not mapped (routing only, no memory effect)",
        )
    if scoring == "softmax" and norm_topk is False:
        r.supply("--moe-router-pre-softmax", True, "norm_topk_prob")
    if scoring == "sigmoid" and norm_topk is False and topk and topk > 1:
        r.note(
            "hf-approximated", "norm_topk_prob",
            "sigmoid routing without renormalised top-k: Megatron renormalises (routing only, no "
            "memory effect)",
        )
    if scale is not None and scale != 1.0:
        r.supply("--moe-router-topk-scaling-factor", float(scale), "routed_scaling_factor")
    return pattern
