"""What a HuggingFace import produces: ``HfImport``, its ``MappedFlag`` records, the Megatron flags
an import may supply, and how those flags are written as command-line tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs


# Megatron flag -> (argument dest, how the flag is given).  "value": takes a value;
# "switch": store_true (dest becomes True); "off": store_false (dest becomes False).
# Dests and actions as in megatron/training/arguments.py (and the dataclass-generated flags).
SUPPLIED_FLAGS: dict[str, tuple[str, str]] = {
    "--num-layers": ("num_layers", "value"),
    "--hidden-size": ("hidden_size", "value"),
    "--ffn-hidden-size": ("ffn_hidden_size", "value"),
    "--num-attention-heads": ("num_attention_heads", "value"),
    "--group-query-attention": ("group_query_attention", "switch"),
    "--num-query-groups": ("num_query_groups", "value"),
    "--kv-channels": ("kv_channels", "value"),
    "--max-position-embeddings": ("max_position_embeddings", "value"),
    "--vocab-size": ("vocab_size", "value"),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", "switch"),
    "--normalization": ("normalization", "value"),
    "--norm-epsilon": ("layernorm_epsilon", "value"),
    "--swiglu": ("swiglu", "switch"),
    "--disable-bias-linear": ("add_bias_linear", "off"),
    "--add-qkv-bias": ("add_qkv_bias", "switch"),
    "--qk-layernorm": ("qk_layernorm", "switch"),
    "--attention-dropout": ("attention_dropout", "value"),
    "--hidden-dropout": ("hidden_dropout", "value"),
    "--position-embedding-type": ("position_embedding_type", "value"),
    "--rotary-base": ("rotary_base", "value"),
    "--rotary-percent": ("rotary_percent", "value"),
    "--use-rope-scaling": ("use_rope_scaling", "switch"),
    "--rope-scaling-factor": ("rope_scaling_factor", "value"),
    "--rotary-seq-len-interpolation-factor": ("rotary_seq_len_interpolation_factor", "value"),
    "--window-size": ("window_size", "value"),
    "--num-experts": ("num_experts", "value"),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", "value"),
    "--moe-router-topk": ("moe_router_topk", "value"),
    "--moe-layer-freq": ("moe_layer_freq", "value"),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", "value"),
    "--moe-shared-expert-gate": ("moe_shared_expert_gate", "switch"),
    "--moe-router-pre-softmax": ("moe_router_pre_softmax", "switch"),
    "--moe-router-score-function": ("moe_router_score_function", "value"),
    "--moe-router-enable-expert-bias": ("moe_router_enable_expert_bias", "switch"),
    "--moe-router-num-groups": ("moe_router_num_groups", "value"),
    "--moe-router-group-topk": ("moe_router_group_topk", "value"),
    "--moe-router-topk-scaling-factor": ("moe_router_topk_scaling_factor", "value"),
    "--multi-latent-attention": ("multi_latent_attention", "switch"),
    "--q-lora-rank": ("q_lora_rank", "value"),
    "--kv-lora-rank": ("kv_lora_rank", "value"),
    "--qk-head-dim": ("qk_head_dim", "value"),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", "value"),
    "--v-head-dim": ("v_head_dim", "value"),
    "--rope-type": ("rope_type", "value"),
    "--no-rope-fusion": ("apply_rope_fusion", "off"),
    "--rotary-scaling-factor": ("rotary_scaling_factor", "value"),
    "--mscale": ("mscale", "value"),
    "--mscale-all-dim": ("mscale_all_dim", "value"),
    "--mtp-num-layers": ("mtp_num_layers", "value"),
    "--experimental-attention-variant": ("experimental_attention_variant", "value"),
    "--dsa-indexer-n-heads": ("dsa_indexer_n_heads", "value"),
    "--dsa-indexer-head-dim": ("dsa_indexer_head_dim", "value"),
    "--dsa-indexer-topk": ("dsa_indexer_topk", "value"),
    "--hybrid-layer-pattern": ("hybrid_layer_pattern", "value"),
    "--hybrid-override-pattern": ("hybrid_override_pattern", "value"),
    "--mtp-hybrid-override-pattern": ("mtp_hybrid_override_pattern", "value"),
    "--mamba-num-heads": ("mamba_num_heads", "value"),
    "--mamba-head-dim": ("mamba_head_dim", "value"),
    "--mamba-state-dim": ("mamba_state_dim", "value"),
    "--mamba-num-groups": ("mamba_num_groups", "value"),
    "--squared-relu": ("squared_relu", "switch"),
    "--fp32-residual-connection": ("fp32_residual_connection", "switch"),
    # gpt-oss and Qwen3-Next (gpt_oss.py, qwen3_next.py)
    "--softmax-type": ("softmax_type", "value"),
    "--quick-geglu": ("quick_geglu", "switch"),
    "--glu-linear-offset": ("glu_linear_offset", "value"),
    "--activation-func-clamp-value": ("activation_func_clamp_value", "value"),
    "--window-attn-skip-freq": ("window_attn_skip_freq", "value"),
    "--yarn-original-max-position-embeddings": ("yarn_original_max_position_embeddings", "value"),
    "--yarn-beta-fast": ("yarn_beta_fast", "value"),
    "--yarn-beta-slow": ("yarn_beta_slow", "value"),
    "--no-yarn-correction-range-round-to-int": ("yarn_correction_range_round_to_int", "off"),
    "--attention-output-gate": ("attention_output_gate", "switch"),
    "--apply-layernorm-1p": ("layernorm_zero_centered_gamma", "switch"),
    "--linear-num-key-heads": ("linear_num_key_heads", "value"),
    "--linear-num-value-heads": ("linear_num_value_heads", "value"),
    "--linear-key-head-dim": ("linear_key_head_dim", "value"),
    "--linear-value-head-dim": ("linear_value_head_dim", "value"),
    "--linear-conv-kernel-dim": ("linear_conv_kernel_dim", "value"),
}


class MappedFlag(NamedTuple):
    """One Megatron flag the import supplies, and the config.json key it comes from.

    ``value`` is the flag's value as Megatron parses it, or True for a switch.  ``hf_key`` is
    the key read (``model_type`` for what the architecture implies; ``a+b`` when two keys
    decide one flag).
    """

    hf_key: str
    flag: str
    value: Any

    def describe(self) -> str:
        """``--num-layers 32 (num_hidden_layers)``."""
        text = self.flag if self.value is True else f"{self.flag} {flag_text(self.value)}"
        return f"{text} ({self.hf_key})"


@dataclass(frozen=True)
class HfImport:
    """What one config.json means as Megatron input.

    ``raw`` holds Megatron argument dests with the values argparse would produce (ints, floats,
    a ``(left, right)`` tuple for ``window_size``, a 0/1 list for ``moe_layer_freq``), each
    located at ``config.json:LINE key``.  ``flags`` are the same settings as command-line
    tokens.  When ``problems`` is not empty, ``raw``, ``flags`` and ``mapping`` are empty.
    ``notes`` are what the user should know that does not stop the import (an approximation,
    an assumed default, a key the importer does not read): ``Problem`` values (code, location,
    message), shown as notes, never as errors.
    """

    source: str
    model_type: str | None
    raw: RawArgs
    flags: tuple[str, ...]
    mapping: tuple[MappedFlag, ...]
    problems: tuple[Problem, ...]
    notes: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def command_line(self) -> str:
        """The flags as one shell-safe line."""
        import shlex

        return " ".join(shlex.quote(token) for token in self.flags)


def flag_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, list):
        return layer_pattern_text(value)
    return str(value)


def flag_tokens(mapping: list[MappedFlag]) -> tuple[str, ...]:
    tokens: list[str] = []
    for item in mapping:
        tokens.append(item.flag)
        if item.value is not True:
            tokens.append(flag_text(item.value))
    return tuple(tokens)


def failed_import(source: str, problem: Problem) -> HfImport:
    return HfImport(source, None, RawArgs({}, source), (), (), (problem,), ())


def layer_pattern_text(pattern: list[int]) -> str:
    """Megatron's --moe-layer-freq list syntax: ``([0]*3+[1]*58)`` or ``([1]*3+[0])*12``."""
    length = len(pattern)
    for period in range(1, length + 1):
        if length % period == 0 and pattern[:period] * (length // period) == pattern:
            break
    unit = pattern[:period]
    runs: list[str] = []
    start = 0
    for index in range(1, period + 1):
        if index == period or unit[index] != unit[start]:
            size = index - start
            runs.append(f"[{unit[start]}]" if size == 1 else f"[{unit[start]}]*{size}")
            start = index
    body = "+".join(runs)
    repeat = length // period
    return f"({body})" if repeat == 1 else f"({body})*{repeat}"
