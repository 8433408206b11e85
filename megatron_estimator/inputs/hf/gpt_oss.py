"""gpt-oss (``model_type`` ``gpt_oss``): OpenAI's gpt-oss-20b and gpt-oss-120b MoE decoders.

The mapping follows Megatron-Bridge's GPTOSSBridge (src/megatron/bridge/models/gpt_oss/
gpt_oss_bridge.py) and Megatron-LM's own launch settings for these checkpoints
(examples/post_training/modelopt/conf/openai/gpt-oss-*.sh): a GPTModel with biases on every
linear layer (q/k/v/o, the router and each expert's fc1 / fc2), the attention sinks as
``--softmax-type learnable`` (one learnable softmax offset per head, ``self_attn.sinks``),
sliding-window attention on every other layer (``--window-size W-1,0 --window-attn-skip-freq 2``),
YaRN RoPE, untied embeddings, and the clamped SwiGLU of the experts as Megatron's quick GeGLU
(``x * sigmoid(1.702 x)``) with ``--glu-linear-offset 1`` (the HF model multiplies by
``up + 1``) and ``--activation-func-clamp-value`` (``swiglu_limit``).

The HuggingFace model (modeling_gpt_oss.py) holds per layer two RMSNorms, q/k/v/o projections
with biases, ``sinks`` (heads), a router (weight and bias) and the experts' ``gate_up_proj``
(E x h x 2F) and ``down_proj`` (E x F x h) with their biases; the checkpoint's MXFP4 storage of
the expert weights (``quantization_config``) says nothing about the model Megatron trains.
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.reader import MOE_TRAINING_KEYS, ConfigReader, is_number, show_value
from megatron_estimator.inputs.hf.rope import rope_keys, supply_rotary_base
from megatron_estimator.inputs.hf.shape import (
    supply_local_experts,
    core_shape, supply_core_shape, supply_dropout, supply_positions_vocab_rmsnorm, supply_query_groups)

# modeling_gpt_oss.py GptOssExperts: glu = gate * sigmoid(gate * alpha); Megatron's quick_gelu
# (megatron/core/fusions/fused_bias_geglu.py) uses the same fixed 1.702.
QUICK_GELU_ALPHA = 1.702

# Keys of gpt-oss configs that change nothing Megatron builds: the checkpoint's storage format,
# and the original release's duplicates of keys read here (experts_per_token is
# num_experts_per_tok; initial_context_length is YaRN's original context).
IGNORED_KEYS = ("quantization_config", "experts_per_token", "initial_context_length", "hidden_act")


def map_gpt_oss(r: ConfigReader) -> None:
    """gpt-oss-20b / gpt-oss-120b."""
    layers, hidden, ffn, heads = core_shape(r)
    kv_heads = r.positive_int("num_key_value_heads")
    supply_core_shape(r, layers, hidden, ffn, heads)
    supply_query_groups(r, heads, kv_heads)
    head_dim = r.positive_int("head_dim")
    if head_dim:
        r.supply("--kv-channels", head_dim, "head_dim")
    supply_positions_vocab_rmsnorm(r, "rms_norm_eps", 1e-5)
    if r.boolean("attention_bias", True, note_default=False) is False:
        r.problem("hf-unsupported-feature", "attention_bias",
                  "attention_bias false: the gpt-oss router and experts keep their biases, and Megatron's "
                  "--disable-bias-linear removes every linear bias at once, so this model cannot be rebuilt")
    # Biases on every linear layer are Megatron's default (add_bias_linear): no flag needed.
    r.supply("--softmax-type", "learnable", "model_type")     # self_attn.sinks, one per head
    supply_dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")
    _activation(r)
    _window(r, layers)
    _yarn(r)
    _experts(r, ffn)
    r.ignore(*IGNORED_KEYS, *MOE_TRAINING_KEYS)


def _activation(r: ConfigReader) -> None:
    r.supply("--quick-geglu", True, "model_type")
    r.supply("--glu-linear-offset", 1.0, "model_type")
    alpha = r.number("swiglu_alpha", QUICK_GELU_ALPHA, note_default=False)
    if alpha is not None and alpha != QUICK_GELU_ALPHA:
        r.note("hf-approximated", "swiglu_alpha",
               f"swiglu_alpha {alpha}: Megatron's quick GeGLU uses {QUICK_GELU_ALPHA} (numerics only, same memory)")
    limit = r.number("swiglu_limit", 7.0, note_default=False)
    if limit is not None:
        if limit > 0:
            r.supply("--activation-func-clamp-value", float(limit), "swiglu_limit")
        else:
            r.problem("hf-bad-value", "swiglu_limit", f"swiglu_limit must be above 0, got {show_value(limit)}")


def _window(r: ConfigReader, layers: int | None) -> None:
    """Sliding-window layers: Megatron's (left, right) window counts the tokens before the
    current one, so a window of W tokens is W-1,0 (GPTOSSBridge; the modelopt launch scripts);
    --window-attn-skip-freq says which layers use it (megatron/core/transformer/utils.py
    is_layer_window_attention: an int N makes every N-th layer (1-based) full attention, a
    0/1 list marks the window layers with 1)."""
    window = r.positive_int("sliding_window", None, allow_none=True, note_default=False)
    types = r.raw("layer_types")
    if types is None:
        kinds = None if layers is None else [int(i % 2 == 0) for i in range(layers)]  # GptOssConfig default
    elif not isinstance(types, list) or not all(t in ("sliding_attention", "full_attention") for t in types):
        r.problem("hf-bad-value", "layer_types",
                  f"layer_types must be a list of \"sliding_attention\" / \"full_attention\", got {show_value(types)}")
        return
    else:
        kinds = [int(t == "sliding_attention") for t in types]
        if layers is not None and len(kinds) != layers:
            r.problem("hf-conflicting-keys", "layer_types",
                      f"layer_types names {len(kinds)} layers but num_hidden_layers is {layers}")
            return
    if not window or not kinds or not any(kinds):
        return
    r.supply("--window-size", (window - 1, 0), "sliding_window")
    if all(kinds):
        return
    key = "layer_types" if types is not None else "model_type"
    alternate = [int((i + 1) % 2 != 0) for i in range(len(kinds))]
    r.supply("--window-attn-skip-freq", 2 if kinds == alternate else kinds, key)


def _yarn(r: ConfigReader) -> None:
    """YaRN RoPE as Megatron-LM's GPT flags give it (from 0.19.0: --position-embedding-type yarn,
    --rotary-scaling-factor read as yarn_rotary_scaling_factor in megatron/training/argument_utils.py,
    --yarn-*); positions only, so an older release gets plain RoPE and a note."""
    from megatron_estimator.megatron.flags import flag_table

    rope = rope_keys(r)
    supply_rotary_base(r, rope, 150000.0)
    scaling = rope.scaling
    if scaling is None:
        r.supply("--position-embedding-type", "rope", "model_type")
        return
    if rope.kind != "yarn":
        r.supply("--position-embedding-type", "rope", "model_type")
        r.note("hf-not-mapped", rope.scaling_key,
               f"{rope.scaling_key} type {rope.kind!r} is not mapped; RoPE scaling changes positions only")
        return
    if "--yarn-beta-fast" not in flag_table(r.release):
        r.supply("--position-embedding-type", "rope", "model_type")
        r.note("hf-approximated", rope.scaling_key,
               f"YaRN RoPE for GPT models needs Megatron 0.19.0 or later (--position-embedding-type yarn); "
               f"the chosen release {r.release} is given plain RoPE: positions only, same memory")
        return
    r.supply("--position-embedding-type", "yarn", rope.kind_key)
    prefix = rope.scaling_key
    for key, flag in (("factor", "--rotary-scaling-factor"),
                      ("original_max_position_embeddings", "--yarn-original-max-position-embeddings"),
                      ("beta_fast", "--yarn-beta-fast"), ("beta_slow", "--yarn-beta-slow")):
        value = scaling.get(key)
        if value is None:
            continue
        if not is_number(value) or value <= 0:
            r.problem("hf-bad-value", f"{prefix}.{key}", f"{prefix}.{key} must be a positive number, got {show_value(value)}")
            continue
        r.supply(flag, int(value) if flag.startswith("--yarn-original") else float(value), f"{prefix}.{key}")
    if scaling.get("truncate") is False:
        # HF's truncate false keeps the correction range unrounded (Megatron rounds by default).
        r.supply("--no-yarn-correction-range-round-to-int", True, f"{prefix}.truncate")


def _experts(r: ConfigReader, ffn: int | None) -> None:
    supply_local_experts(r)
    if ffn:
        # Each expert is intermediate_size wide (GPTOSSBridge: moe_ffn_hidden_size = intermediate_size).
        r.supply("--moe-ffn-hidden-size", ffn, "intermediate_size")
    # The router takes the top-k logits and softmaxes them (GptOssTopKRouter): Megatron's default
    # softmax router without --moe-router-pre-softmax.
