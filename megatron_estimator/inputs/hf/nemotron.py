"""Nemotron-H (``model_type`` ``nemotron_h``): hybrid Mamba-2 / attention / MLP / MoE stacks,
Nemotron-H 4B-56B, Nemotron Nano 9B/12B v2 and the Nemotron 3 MoE models.

The mapping follows Megatron-Bridge's NemotronHBridge (src/megatron/bridge/models/nemotronh/
nemotron_h_bridge.py) and Megatron-LM's own launch settings for these checkpoints
(examples/post_training/modelopt/conf/nvidia/*Nemotron*.sh): a HybridModel with
``--hybrid-layer-pattern``, ``--mamba-num-heads`` / ``--mamba-head-dim`` / ``--mamba-state-dim`` /
``--mamba-num-groups``, RMSNorm, squared-ReLU MLPs without a gate, no position embedding, and for
MoE layers a sigmoid router with an expert bias and one shared expert.

The HuggingFace model (modeling_nemotron_h.py) builds each block as a norm plus one mixer,
chosen per layer by ``hybrid_override_pattern`` (or, in newer configs, ``layers_block_type``):
``M`` / ``mamba`` a Mamba-2 mixer (in_proj, conv1d with bias, dt_bias, A_log, D, a gated RMSNorm
of heads x head dim, out_proj), ``*`` / ``attention`` attention without RoPE, ``-`` / ``mlp`` an
up/down MLP, ``E`` / ``moe`` routed experts plus a shared expert.  Megatron's pattern uses the
same four symbols.
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.reader import METADATA_KEYS, MOE_TRAINING_KEYS, ConfigReader, is_count, show_value
from megatron_estimator.inputs.hf.shape import (
    supply_core_shape, supply_hybrid_pattern, supply_positions_vocab_rmsnorm, supply_query_groups)

# layers_block_type names -> Megatron's pattern symbols (hybrid_layer_allocation.py Symbols).
BLOCK_SYMBOLS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
PATTERN_SYMBOLS = frozenset(BLOCK_SYMBOLS.values())
# MambaMixer's fixed shape (megatron/core/ssm/mamba_mixer.py): d_conv 4, conv bias, no projection biases.
MEGATRON_CONV_KERNEL = 4

# Keys of NemotronHConfig that change nothing Megatron builds: the SSM's numerics and init, the
# kernels the HF model picks, and RoPE keys the attention layers do not use (no position embedding).
IGNORED_KEYS = (
    "chunk_size", "time_step_min", "time_step_max", "time_step_floor", "time_step_limit",
    "time_step_rank", "rescale_prenorm_residual", "use_mamba_kernels", "mamba_ssm_cache_dtype",
    "num_logits_to_keep", "sliding_window", "hidden_dropout", "expand", "rms_norm_eps", "norm_eps",
    "rope_theta", "partial_rotary_factor", "hidden_act", "mamba_hidden_act",
)


def _pattern(r: ConfigReader, key: str) -> str | None:
    """The layer pattern from ``hybrid_override_pattern`` or ``layers_block_type`` (``key``)."""
    value = r.raw(key)
    if key.endswith("pattern"):
        if not isinstance(value, str) or not value:
            r.problem("hf-bad-value", key, f"{key} must be a string of layer symbols (M * - E), got {show_value(value)}")
            return None
        bad = sorted(set(value) - PATTERN_SYMBOLS)
        if bad:
            r.problem("hf-bad-value", key,
                      f"{key} holds {', '.join(repr(c) for c in bad)}; a Nemotron-H pattern uses M (Mamba), "
                      "* (attention), - (MLP) and E (MoE)")
            return None
        return value
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        r.problem("hf-bad-value", key, f"{key} must be a list of block names ({', '.join(BLOCK_SYMBOLS)}), "
                                       f"got {show_value(value)}")
        return None
    bad = sorted({v for v in value if v not in BLOCK_SYMBOLS})
    if bad:
        r.problem("hf-bad-value", key, f"{key} names {', '.join(show_value(v) for v in bad)}; "
                                       f"known block types: {', '.join(BLOCK_SYMBOLS)}")
        return None
    return "".join(BLOCK_SYMBOLS[v] for v in value)


def _main_pattern(r: ConfigReader) -> str | None:
    given = [key for key in ("hybrid_override_pattern", "layers_block_type") if r.has(key)]
    if not given:
        r.problem("hf-missing-key", "",
                  "hybrid_override_pattern (or layers_block_type) is missing: a nemotron_h config.json "
                  "states which block each layer is")
        return None
    patterns = {key: _pattern(r, key) for key in given}
    if any(p is None for p in patterns.values()):
        return None
    if len(set(patterns.values())) > 1:
        r.problem("hf-conflicting-keys", "layers_block_type",
                  f"layers_block_type ({patterns['layers_block_type']}) and hybrid_override_pattern "
                  f"({patterns['hybrid_override_pattern']}) describe different layers")
    pattern = patterns[given[0]]
    layers = r.positive_int("num_hidden_layers", None, note_default=False)
    if layers is not None and layers != len(pattern):
        r.problem("hf-conflicting-keys", "num_hidden_layers",
                  f"num_hidden_layers is {layers} but {given[0]} has {len(pattern)} layers")
    # After a conflict the import fails, but the pattern still says which mixers to check.
    return pattern


def _mtp_pattern(r: ConfigReader) -> tuple[str, int] | None:
    """(one MTP depth's pattern, the depth count), or None without MTP (or after a problem)."""
    depths = r.count("num_nextn_predict_layers", 0, note_default=False)
    keys = [key for key in ("mtp_hybrid_override_pattern", "mtp_layers_block_type") if r.has(key)]
    if not depths:
        r.ignore(*keys)
        return None
    if not keys:
        r.problem("hf-missing-key", "num_nextn_predict_layers",
                  f"num_nextn_predict_layers is {depths} but mtp_hybrid_override_pattern (or "
                  "mtp_layers_block_type) is missing: it states the blocks of each prediction depth")
        return None
    patterns = {key: _pattern(r, key) for key in keys}
    if any(p is None for p in patterns.values()):
        return None
    if len(set(patterns.values())) > 1:
        r.problem("hf-conflicting-keys", "mtp_layers_block_type",
                  "mtp_layers_block_type and mtp_hybrid_override_pattern describe different MTP layers")
        return None
    return patterns[keys[0]], depths


def _supply_pattern(r: ConfigReader, pattern: str, mtp: tuple[str, int] | None) -> None:
    key = "hybrid_override_pattern" if r.has("hybrid_override_pattern") else "layers_block_type"
    mtp_key = "mtp_hybrid_override_pattern" if r.has("mtp_hybrid_override_pattern") else "mtp_layers_block_type"
    supply_hybrid_pattern(r, pattern, mtp, key, mtp_key)


def map_nemotron_h(r: ConfigReader) -> None:
    """Nemotron-H / Nemotron Nano v2 / Nemotron 3: the hybrid layer pattern and its mixers."""
    r.ignore("num_hidden_layers")  # checked against the pattern when the pattern is readable
    pattern = _main_pattern(r)
    mtp = _mtp_pattern(r)
    hidden = r.positive_int("hidden_size")
    ffn = r.positive_int("intermediate_size")
    heads = r.positive_int("num_attention_heads")
    kv_heads = r.positive_int("num_key_value_heads")
    if pattern is not None:
        _supply_pattern(r, pattern, mtp)
    supply_core_shape(r, None, hidden, ffn, heads)      # the layer count comes from the pattern
    supply_query_groups(r, heads, kv_heads)
    head_key = "head_dim" if r.has("head_dim") else "attention_head_dim"
    head_dim = r.positive_int(head_key, None, note_default=False)
    r.ignore("head_dim", "attention_head_dim")
    if head_dim:
        r.supply("--kv-channels", head_dim, head_key)
    elif hidden and heads:
        r.note("hf-default-used", "head_dim",
               f"head_dim is not in the file; using hidden_size / num_attention_heads = {hidden // heads}")
    supply_positions_vocab_rmsnorm(r, "layer_norm_epsilon", 1e-5)
    # The attention layers apply no rotary embedding (NemotronHBridge: position_embedding_type none).
    r.supply("--position-embedding-type", "none", "model_type")
    r.supply("--hidden-dropout", 0.0, "model_type")
    dropout = r.fraction("attention_dropout", 0.0, note_default=False)
    if dropout is not None:
        r.supply("--attention-dropout", float(dropout), "attention_dropout")
    _biases(r)
    act = r.text("mlp_hidden_act", "relu2", note_default=False)
    if act == "relu2":
        r.supply("--squared-relu", True, "mlp_hidden_act")
    elif act is not None:
        r.note("hf-approximated", "mlp_hidden_act",
               f"mlp_hidden_act {act!r}: Megatron's MLP is given its default GELU; the MLP has no gate "
               "either way, so parameters and activation shapes are the same")
    if r.boolean("residual_in_fp32", False, note_default=False):
        r.supply("--fp32-residual-connection", True, "residual_in_fp32")
    used = set(pattern or "") | set(mtp[0] if mtp else "")
    _mamba(r, "M" in used)
    _experts(r, "E" in used)
    r.ignore(*IGNORED_KEYS)
    _unknown_mixer_keys(r)


# Key prefixes of the mixers' shapes: an unknown key with one of them may change what is built.
MIXER_PREFIXES = ("mamba_", "ssm_", "moe_", "mtp_", "n_", "num_")


def _unknown_mixer_keys(r: ConfigReader) -> None:
    """A Mamba / MoE / MTP key this mapping does not know is refused (it may shape the model);
    other unknown keys become the importer's usual hf-key-not-read notes."""
    for key in r.config:
        if key in r.read or key in r.ignored or key in METADATA_KEYS or not key.startswith(MIXER_PREFIXES):
            continue
        r.read.add(key)
        r.problem("hf-unsupported-feature", key,
                  f"{key} is a nemotron_h key the importer does not know; it may change the Mamba, MoE or MTP "
                  "layers' shapes, so the model cannot be rebuilt faithfully")


def _biases(r: ConfigReader) -> None:
    attention = r.boolean("attention_bias", False, note_default=False)
    mlp = r.boolean("mlp_bias", False, note_default=False)
    for key in ("use_bias", "mamba_proj_bias"):
        if r.boolean(key, False, note_default=False):
            r.problem("hf-unsupported-feature", key,
                      f"{key} true gives the Mamba in_proj / out_proj biases; megatron-core's MambaMixer "
                      "builds them without (megatron/core/ssm/mamba_mixer.py), so this model cannot be rebuilt")
    if attention is None or mlp is None:
        return
    if attention != mlp:
        r.problem("hf-unsupported-feature", "attention_bias" if attention else "mlp_bias",
                  f"attention_bias {str(attention).lower()} with mlp_bias {str(mlp).lower()}: Megatron's "
                  "--disable-bias-linear covers attention and MLP linears together")
    elif not attention:
        r.supply("--disable-bias-linear", True, "attention_bias+mlp_bias" if r.has("attention_bias") else "model_type")


def _mamba(r: ConfigReader, used: bool) -> None:
    keys = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups")
    if not used:
        r.ignore(*keys, "conv_kernel", "use_conv_bias")
        return
    values = {key: r.positive_int(key) for key in keys}
    for key, flag in zip(keys, ("--mamba-num-heads", "--mamba-head-dim", "--mamba-state-dim", "--mamba-num-groups")):
        if values[key]:
            r.supply(flag, values[key], key)
    conv = r.positive_int("conv_kernel", MEGATRON_CONV_KERNEL, note_default=False)
    if conv is not None and conv != MEGATRON_CONV_KERNEL:
        r.problem("hf-unsupported-feature", "conv_kernel",
                  f"conv_kernel {conv}: megatron-core's MambaMixer is built with d_conv {MEGATRON_CONV_KERNEL} "
                  "by the hybrid layer spec, which no flag changes")
    if r.boolean("use_conv_bias", True, note_default=False) is False:
        r.problem("hf-unsupported-feature", "use_conv_bias",
                  "use_conv_bias false: megatron-core's MambaMixer always gives conv1d a bias")


def _experts(r: ConfigReader, used: bool) -> None:
    moe_keys = ("n_routed_experts", "moe_intermediate_size", "num_experts_per_tok", "n_shared_experts",
                "moe_shared_expert_intermediate_size", "routed_scaling_factor", "n_group", "topk_group",
                "norm_topk_prob", "moe_latent_size", "moe_shared_expert_overlap")
    r.ignore(*MOE_TRAINING_KEYS)
    if not used:
        r.ignore(*moe_keys)
        return
    experts = r.positive_int("n_routed_experts")
    moe_ffn = r.positive_int("moe_intermediate_size")
    topk = r.positive_int("num_experts_per_tok")
    if experts:
        r.supply("--num-experts", experts, "n_routed_experts")
    if moe_ffn:
        r.supply("--moe-ffn-hidden-size", moe_ffn, "moe_intermediate_size")
    if topk:
        r.supply("--moe-router-topk", topk, "num_experts_per_tok")
    # modeling_nemotron_h.py: one shared expert of moe_shared_expert_intermediate_size when
    # n_shared_experts is set (NemotronHBridge maps the width as it is).
    shared_count = r.value("n_shared_experts", 1, is_count, "an integer >= 0 or null", allow_none=True,
                           note_default=False)
    shared = r.count("moe_shared_expert_intermediate_size", None, allow_none=True, note_default=False)
    if shared_count and shared:
        r.supply("--moe-shared-expert-intermediate-size", shared, "moe_shared_expert_intermediate_size")
    # The router: sigmoid scores with an e_score_correction_bias (Megatron's expert_bias buffer).
    r.supply("--moe-router-score-function", "sigmoid", "model_type")
    r.supply("--moe-router-enable-expert-bias", True, "model_type")
    scale = r.number("routed_scaling_factor", None, allow_none=True, note_default=False)
    if scale is not None and scale != 1.0:
        r.supply("--moe-router-topk-scaling-factor", float(scale), "routed_scaling_factor")
    groups = r.positive_int("n_group", None, allow_none=True, note_default=False)
    group_topk = r.positive_int("topk_group", None, allow_none=True, note_default=False)
    if groups and groups > 1 and group_topk:
        r.supply("--moe-router-num-groups", groups, "n_group")
        r.supply("--moe-router-group-topk", group_topk, "topk_group")
    if r.boolean("norm_topk_prob", True, note_default=False) is False and topk and topk > 1:
        r.note("hf-approximated", "norm_topk_prob",
               "sigmoid routing without renormalised top-k: Megatron renormalises (routing only, no memory effect)")
    latent = r.positive_int("moe_latent_size", None, allow_none=True, note_default=False)
    if latent:
        r.problem("hf-unsupported-feature", "moe_latent_size",
                  f"moe_latent_size {latent}: latent MoE (experts run in a {latent}-wide latent space, "
                  "Megatron's --moe-latent-size) is not modelled by the estimator yet")
    r.boolean("moe_shared_expert_overlap", False, note_default=False)  # a schedule choice, no memory shape
