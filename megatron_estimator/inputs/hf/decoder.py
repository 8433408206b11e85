"""LLaMA-like decoders: LLaMA 1/2/3/3.x, Mistral, Mixtral, Qwen2/2.5, Qwen3 and their MoE
variants, each described by how it differs from LLaMA (transformers' ``modeling_*.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_estimator.inputs.hf.reader import MOE_TRAINING_KEYS, REQUIRED, ConfigReader, is_count, show_value
from megatron_estimator.inputs.hf.rope import supply_rope
from megatron_estimator.inputs.hf.shape import (
    supply_local_experts,
    core_shape,
    supply_core_shape,
    supply_dropout,
    supply_gated_silu,
    supply_positions_vocab_rmsnorm,
    supply_query_groups,
)


@dataclass(frozen=True)
class DecoderFamily:
    """How one LLaMA-like HuggingFace architecture differs from LLaMA (transformers' modeling_*.py)."""

    rms_norm_eps: float  # the config class default
    rope_theta: float  # the config class default
    qkv_bias: str  # "attention_bias": q,k,v,o biases from that key; "always": q,k,v only (Qwen2)
    qk_norm: bool = False  # RMSNorm on each q and k head (Qwen3)
    moe: str | None = None  # "mixtral" or "qwen"
    sliding_window: str | None = None  # "mistral": always on when set; "qwen": use_sliding_window
    kv_heads_default_is_heads: bool = False  # LlamaConfig: num_key_value_heads None -> heads


FAMILIES = {
    "llama": DecoderFamily(1e-6, 10000.0, "attention_bias", kv_heads_default_is_heads=True),
    "mistral": DecoderFamily(1e-6, 10000.0, "none", sliding_window="mistral"),
    "mixtral": DecoderFamily(1e-5, 1e6, "none", moe="mixtral", sliding_window="mistral"),
    "qwen2": DecoderFamily(1e-6, 10000.0, "always", sliding_window="qwen"),
    "qwen2_moe": DecoderFamily(1e-6, 10000.0, "always", moe="qwen", sliding_window="qwen"),
    "qwen3": DecoderFamily(1e-6, 10000.0, "attention_bias", qk_norm=True, sliding_window="qwen"),
    "qwen3_moe": DecoderFamily(1e-6, 10000.0, "attention_bias", qk_norm=True, moe="qwen", sliding_window="qwen"),
}


def map_decoder(r: ConfigReader) -> None:
    """LLaMA 1/2/3/3.x, Mistral, Mixtral, Qwen2/2.5, Qwen3 and their MoE variants."""
    family = FAMILIES[r.model_type]
    layers, hidden, ffn, heads = core_shape(r)
    kv_default = heads if family.kv_heads_default_is_heads else REQUIRED
    kv_heads = r.positive_int(
        "num_key_value_heads", kv_default, note_default=False, allow_none=family.kv_heads_default_is_heads
    )
    if kv_heads is None and family.kv_heads_default_is_heads:
        kv_heads = heads  # LlamaConfig: num_key_value_heads None means one per attention head
    supply_core_shape(r, layers, hidden, ffn, heads)
    supply_query_groups(r, heads, kv_heads)
    head_dim = r.positive_int("head_dim", None, allow_none=True)
    if head_dim:
        # Qwen3 and newer LLaMA/Mistral configs state the head size; it need not be hidden/heads.
        r.supply("--kv-channels", head_dim, "head_dim")
    elif r.model_type == "qwen3" and not r.has("head_dim") and heads and hidden:
        r.note(
            "hf-default-used", "head_dim",
            f"head_dim is not in the file; using the {r.class_name} default 128",
        )
        r.supply("--kv-channels", 128, "head_dim")
    supply_positions_vocab_rmsnorm(r, "rms_norm_eps", family.rms_norm_eps)
    supply_gated_silu(r)
    _decoder_biases(r, family, hidden)
    if family.qk_norm:
        r.supply("--qk-layernorm", True, "model_type")
    supply_dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    r.supply("--hidden-dropout", 0.0, "model_type")
    r.supply("--position-embedding-type", "rope", "model_type")
    supply_rope(r, family.rope_theta)
    _sliding_window(r, family)
    r.ignore("pretraining_tp")  # LLaMA: tensor-parallel slicing used in pretraining; same math
    if family.moe == "mixtral":
        _mixtral_experts(r)
    elif family.moe == "qwen":
        _qwen_experts(r, layers)


def _decoder_biases(r: ConfigReader, family: DecoderFamily, hidden: int | None) -> None:
    if family.qkv_bias == "always":
        # Qwen2/Qwen2-MoE: q_proj, k_proj, v_proj have biases; o_proj and the MLP do not.
        qkv = r.boolean("qkv_bias", True, note_default=False) if r.model_type == "qwen2_moe" else True
        r.supply("--disable-bias-linear", True, "model_type")
        if qkv:
            r.supply("--add-qkv-bias", True, "qkv_bias" if r.has("qkv_bias") else "model_type")
        return
    if family.qkv_bias == "none":
        r.supply("--disable-bias-linear", True, "model_type")
        return
    attention_bias = r.boolean("attention_bias", False, note_default=False)
    mlp_bias = r.boolean("mlp_bias", False, note_default=False) if r.model_type == "llama" else False
    if attention_bias is None or mlp_bias is None:
        return
    if not attention_bias and not mlp_bias:
        key = "attention_bias+mlp_bias" if r.model_type == "llama" else "attention_bias"
        r.supply("--disable-bias-linear", True, key if r.has("attention_bias") else "model_type")
    elif attention_bias and not mlp_bias:
        r.supply("--disable-bias-linear", True, "mlp_bias" if r.has("mlp_bias") else "model_type")
        r.supply("--add-qkv-bias", True, "attention_bias")
        r.note(
            "hf-approximated", "attention_bias",
            f"attention_bias true also gives o_proj a bias; Megatron can add q/k/v biases alone "
            f"(--add-qkv-bias) or every linear bias, so the o_proj bias ({hidden} parameters per "
            f"layer) is left out",
        )
    elif mlp_bias and not attention_bias:
        r.note(
            "hf-approximated", "mlp_bias",
            "mlp_bias true with attention_bias false: Megatron's bias switch covers every linear "
            "layer, so the attention output projection gets a bias the model does not have",
        )
    # Both true: Megatron's default (biases on every linear layer) matches.


def _sliding_window(r: ConfigReader, family: DecoderFamily) -> None:
    if family.sliding_window is None:
        return
    if family.sliding_window == "mistral":
        window = r.positive_int("sliding_window", None, allow_none=True, note_default=False)
        if window:
            # TransformerConfig.window_size is (left, right); causal attention looks left only.
            r.supply("--window-size", (window, 0), "sliding_window")
            r.note(
                "hf-approximated", "sliding_window",
                f"sliding-window attention over {window} tokens: parameters and flash-attention "
                f"memory are unchanged; unfused attention still builds full s x s scores",
            )
        return
    if r.boolean("use_mrope", False, note_default=False):
        r.note(
            "hf-not-mapped", "use_mrope",
            "use_mrope (multimodal RoPE sections) is not mapped; positions only, memory unchanged",
        )
    use = r.boolean("use_sliding_window", False, note_default=False)
    r.ignore("sliding_window", "max_window_layers")  # inactive unless use_sliding_window
    layer_types = r.raw("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        r.note(
            "hf-not-mapped", "layer_types",
            "layer_types names sliding-window layers; Megatron is given full attention on every "
            "layer (same parameters and flash-attention memory)",
        )
    if use:
        r.note(
            "hf-not-mapped", "use_sliding_window",
            "use_sliding_window true (sliding window on layers from max_window_layers on) is not "
            "mapped: Megatron is given full attention; parameters and flash-attention memory are the same",
        )


def _mixtral_experts(r: ConfigReader) -> None:
    supply_local_experts(r)
    # Expert width is intermediate_size: Megatron's moe_ffn_hidden_size defaults to
    # ffn_hidden_size (validate_args in megatron/training/arguments.py).
    jitter = r.number("router_jitter_noise", 0.0, note_default=False)
    if jitter:
        r.note(
            "hf-not-mapped", "router_jitter_noise",
            "router_jitter_noise is a training-time router perturbation; not mapped (no memory "
            "effect)",
        )
    r.ignore(*MOE_TRAINING_KEYS)


def _qwen_experts(r: ConfigReader, layers: int | None) -> None:
    experts = r.count("num_experts")
    topk = r.positive_int("num_experts_per_tok")
    moe_ffn = r.positive_int("moe_intermediate_size")
    step = r.positive_int("decoder_sparse_step", 1, note_default=False)
    only_dense = r.raw("mlp_only_layers", [])
    if only_dense is None:
        only_dense = []
    if not isinstance(only_dense, list) or not all(is_count(i) for i in only_dense):
        r.problem(
            "hf-bad-value", "mlp_only_layers",
            f"mlp_only_layers must be a list of layer indices, got {show_value(only_dense)}",
        )
        only_dense = None
    if r.model_type == "qwen2_moe":
        shared = r.count("shared_expert_intermediate_size")
    else:
        shared = 0
    norm_topk = r.boolean("norm_topk_prob", False, note_default=False)
    r.ignore(*MOE_TRAINING_KEYS)
    if experts == 0:
        return  # no experts: every layer is the dense MLP of intermediate_size
    if not (experts and topk and moe_ffn and step and layers) or only_dense is None or norm_topk is None:
        return
    r.supply("--num-experts", experts, "num_experts")
    r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    r.supply("--moe-ffn-hidden-size", moe_ffn, "moe_intermediate_size")
    # transformers modeling_qwen2_moe.py / modeling_qwen3_moe.py: a layer is sparse when it is not
    # in mlp_only_layers and (index + 1) % decoder_sparse_step == 0.
    pattern = [0 if (i in only_dense or (i + 1) % step) else 1 for i in range(layers)]
    if any(p == 0 for p in pattern):
        key = "decoder_sparse_step+mlp_only_layers" if only_dense else "decoder_sparse_step"
        r.supply("--moe-layer-freq", pattern, key)
    if shared:
        r.supply("--moe-shared-expert-intermediate-size", shared, "shared_expert_intermediate_size")
        # Qwen2-MoE scales the shared expert by sigmoid(shared_expert_gate(x)), an h -> 1 linear.
        r.supply("--moe-shared-expert-gate", True, "model_type")
    if not norm_topk:
        # Softmax over all experts, then top-k without renormalising: Megatron's pre-softmax
        # router (megatron/core/transformer/moe/moe_utils.py topk_softmax_with_capacity).
        r.supply("--moe-router-pre-softmax", True, "norm_topk_prob")
