"""Attention and the layer's other modules: heads and query groups, MLA, attention variants and
backends, norms, activations, hyper-connections, position embeddings.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _int, _ints, _selective_modules, _size, release_behaviour


def attention_heads(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    if not _ints(ns, "hidden_size", "num_attention_heads", "tensor_model_parallel_size"):
        return
    h, a, t = ns["hidden_size"], ns["num_attention_heads"], ns["tensor_model_parallel_size"]
    # arguments.py: kv_channels = hidden // heads requires hidden % heads == 0.
    if not raw.given("kv_channels") and h % a:
        yield Problem("heads-not-dividing-hidden", raw.location("num_attention_heads"),
                      f"--hidden-size {h} is not divisible by --num-attention-heads {a} "
                      f"({h}/{a} = {h / a:g}); set --kv-channels or change one of them")
    # transformer_config.py __post_init__
    if a % t:
        yield Problem("heads-not-divisible-by-tp", raw.location("num_attention_heads"),
                      f"--num-attention-heads {a} must be a multiple of tp({t}) "
                      f"({a}/{t} = {a / t:g})")
    if ns.get("multi_latent_attention"):
        return
    g = ns.get("num_query_groups")
    if not ns.get("group_query_attention") or not isinstance(g, int) or g <= 0:
        return  # without --group-query-attention, groups = heads, checked above
    where = raw.location("num_query_groups")
    if release_behaviour("query_groups_below_tp", run) == "1":
        # transformer_config.py __post_init__ (d98e8a64 lines 1461-1468): a multiple or a divisor;
        # fewer groups than TP ranks sub-shard the QKV activations in every backend
        # (attention.py lines 353-379, f7dfb99795, 0.16.0 on: megatron_behaviour.tsv).
        if g % t and t % g:
            yield Problem("query-groups-vs-tp", where,
                          f"--num-query-groups {g} must be a multiple or a divisor of tp({t})")
    elif g % t:
        # transformer_config.py __post_init__ (core_v0.14.0 line 696, through 0.15.x).
        yield Problem("query-groups-vs-tp", where,
                      f"--num-query-groups {g} must be a multiple of tp({t}) in {run.release.version} "
                      f"({g}/{t} = {g / t:g}); fewer query groups than TP ranks need Megatron 0.16.0 or later")
    if a % g:
        yield Problem("heads-not-divisible-by-groups", where,
                      f"--num-attention-heads {a} is not divisible by --num-query-groups {g} "
                      "(megatron/core/transformer/attention.py splits heads per group)")


# The MLA projections' sizes; Megatron reads them only under --multi-latent-attention
# (megatron/training/argument_utils.py builds MLATransformerConfig only then), so without MLA any
# value is accepted (coverage case main#1582: --kv-lora-rank 0 on a GQA model).
MLA_SIZES = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "v_head_dim")


def mla_sizes(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # Megatron has no check: with MLA a size 0 builds an empty projection
    # (megatron/core/transformer/multi_latent_attention.py); the estimator needs each >= 1.
    if not ns.get("multi_latent_attention"):
        return
    for dest in MLA_SIZES:
        value = ns.get(dest)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            yield Problem("out-of-range", raw.location(dest),
                          f"{value} is out of range: must be >= 1 (with --multi-latent-attention)")


def mla_with_gqa(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 line 1974), from dd546099fa (0.16.1; megatron_behaviour.tsv)
    if ns.get("multi_latent_attention") and ns.get("group_query_attention") \
            and release_behaviour("mla_gqa_rejected", run) == "1":
        yield Problem("mla-with-gqa", raw.location("group_query_attention"),
                      "--group-query-attention cannot be combined with --multi-latent-attention")


def mtp_position_embedding(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 lines 1942-1948): MTP needs position ids.
    if ns.get("mtp_num_layers") and ns.get("position_embedding_type") not in ("rope", "none", "yarn"):
        yield Problem("mtp-position-embedding", raw.location("mtp_num_layers"),
                      f"multi-token prediction needs --position-embedding-type rope or none, not "
                      f"{ns.get('position_embedding_type')}")


def attention_backend_local(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 lines 436-437; 0.14.0-main)
    if ns.get("attention_backend") == "local" and (ns.get("spec") or [None])[0] != "local":
        yield Problem("attention-backend-local-needs-spec", raw.location("attention_backend"),
                      "--attention-backend local is only supported with --spec local")


def no_position_embedding(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 line 1633): --no-position-embedding is deprecated.
    if not ns.get("add_position_embedding", True) and ns.get("position_embedding_type") != "rope":
        yield Problem("deprecated-flag", raw.location("add_position_embedding"),
                      "--no-position-embedding is deprecated; use --position-embedding-type")


def mla_qk_norm(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # What MLA's q / kv norm placement refuses (--multi-latent-attention, or a hybrid pattern
    # with '+' / 'D' layers, which sets it).
    if not ns.get("multi_latent_attention"):
        return
    pattern = ns.get("hybrid_pattern_unified")
    hybrid = isinstance(pattern, str)
    resolved = release_behaviour("mla_qk_norm_resolved", run) == "1"
    if ns.get("qk_l2_norm") and (not hybrid or resolved):
        # megatron/core/models/gpt/gpt_layer_specs.py asserts it for the MLA specs (every
        # release); megatron/core/transformer/mla_qk_norm_config.py raises for MLA and DSA
        # layers (4464d1c197, 0.19.0 on).
        yield Problem("mla-with-qk-l2-norm", raw.location("qk_l2_norm"),
                      "--qk-l2-norm is not supported with multi-latent attention "
                      "(megatron/core/transformer/mla_qk_norm_config.py)")
    if not (ns.get("qk_layernorm") and resolved and ns.get("transformer_impl") == "local"):
        return
    # From 4464d1c197 (0.19.0; megatron_behaviour.tsv mla_qk_norm_resolved) QKNormConfigResolver
    # (mla_qk_norm_config.py) builds the MLA norms; the local backend has no fused norm + linear.
    where = raw.location("qk_layernorm")
    if hybrid and "+" in pattern:
        # The hybrid '+' spec names TE linears with trivial norms: the resolver needs the
        # backend's fused norm + linear for them (RuntimeError).
        yield Problem("mla-qk-norm-needs-te", where,
                      "--qk-layernorm on the hybrid pattern's '+' (MLA) layers needs --transformer-impl "
                      "transformer_engine: the local backend has no fused norm + linear to hold the q / kv "
                      "norms (megatron/core/transformer/mla_qk_norm_config.py)")
    elif not hybrid and ns.get("q_lora_rank") is None:
        # The local GPT spec's explicit q norm has no q LoRA projection to follow (ValueError).
        yield Problem("mla-q-norm-unused", where,
                      "--qk-layernorm with --transformer-impl local needs --q-lora-rank: without it the local "
                      "spec's q norm would not be used, which megatron/core/transformer/mla_qk_norm_config.py "
                      "refuses (Megatron 0.19.0 and later)")


def _activation(ns: Namespace) -> str:
    """The MLP activation argument_utils.py core_transformer_config_from_args chooses."""
    if ns.get("swiglu"):
        return "silu"
    if ns.get("squared_relu"):
        return "squared_relu"
    if ns.get("quick_geglu"):
        return "quick_gelu"
    return "gelu"


def activation_fusions(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 2422-2493): the
    # bias-activation fusion (argument_utils.py: --no-bias-swiglu-fusion for SwiGLU, else
    # --no-bias-gelu-fusion, which validate_args turns off without linear biases), TE's
    # activation functions, fused residual RMSNorm and the SwiGLU clamp.
    act = _activation(ns)
    if act == "silu":
        fusion, fusion_flag = ns.get("bias_swiglu_fusion", True), "--no-bias-swiglu-fusion"
    else:
        fusion, fusion_flag = ns.get("bias_gelu_fusion", True) and ns.get("add_bias_linear", True), "--no-bias-gelu-fusion"
    offset = ns.get("glu_linear_offset") or 0.0
    te_act = ns.get("use_te_activation_func")
    if fusion:
        if act == "squared_relu":
            yield Problem("bias-activation-fusion", raw.location("squared_relu"),
                          f"--squared-relu has no fused bias-activation kernel: add {fusion_flag} "
                          "(or --disable-bias-linear)")
        if offset and act != "quick_gelu":
            yield Problem("bias-activation-fusion", raw.location("glu_linear_offset"),
                          f"--glu-linear-offset {offset} with the fused bias-activation needs --quick-geglu; "
                          f"or add {fusion_flag}")
        if te_act:
            yield Problem("bias-activation-fusion", raw.location("use_te_activation_func"),
                          f"--use-te-activation-func cannot be combined with the fused bias-activation; add {fusion_flag}")
    if te_act and act not in ("gelu", "silu"):
        yield Problem("bias-activation-fusion", raw.location("use_te_activation_func"),
                      f"--use-te-activation-func supports gelu and SwiGLU activations, not {act.replace('_', '-')}")
    if ns.get("fused_residual_rmsnorm") and (ns.get("normalization") or "LayerNorm") != "RMSNorm":
        yield Problem("fused-residual-rmsnorm", raw.location("fused_residual_rmsnorm"),
                      f"--fused-residual-rmsnorm needs --normalization RMSNorm (it is {ns.get('normalization') or 'LayerNorm'})")
    clamp = ns.get("activation_func_clamp_value")
    # main from 2a75ac12c5 (megatron_behaviour.tsv swiglu_clamp_checked)
    if clamp is not None and act == "silu" and isinstance(clamp, (int, float)) \
            and release_behaviour("swiglu_clamp_checked", run) == "1":
        where = raw.location("activation_func_clamp_value")
        if not (clamp > 0 and clamp != float("inf")):
            yield Problem("swiglu-clamp", where, f"--activation-func-clamp-value must be finite and above 0 (it is {clamp})")
        if ns.get("num_experts") is None:
            yield Problem("swiglu-clamp", where, "--activation-func-clamp-value for SwiGLU is supported only with MoE (--num-experts)")
        if offset:
            yield Problem("swiglu-clamp", where, "--activation-func-clamp-value needs --glu-linear-offset 0")
        if te_act:
            yield Problem("swiglu-clamp", where, "--activation-func-clamp-value cannot be combined with --use-te-activation-func")


def attention_variants(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ (lines
    # 2527, 3105, 3139-3150) and MLATransformerConfig.__post_init__ (3346-3352).
    mla = ns.get("multi_latent_attention")
    if mla and ns.get("rotary_interleaved"):
        yield Problem("mla-rope-conflict", raw.location("rotary_interleaved"),
                      "--rotary-interleaved is not supported with --multi-latent-attention")
    if mla and ns.get("apply_rope_fusion", True) and (ns.get("rope_type") or "yarn") != "yarn":
        yield Problem("mla-rope-conflict", raw.location("rope_type"),
                      f"RoPE fusion with multi-latent attention needs --rope-type yarn (it is {ns.get('rope_type')}); "
                      "or add --no-rope-fusion")
    if mla and ns.get("attention_output_gate"):
        yield Problem("mla-rope-conflict", raw.location("attention_output_gate"),
                      "--attention-output-gate is not supported with --multi-latent-attention")
    if mla and ns.get("cache_mla_latents") and ns.get("apply_rope_fusion", True):
        yield Problem("mla-rope-conflict", raw.location("cache_mla_latents"),
                      "--cache-mla-latents needs --no-rope-fusion")
    # megatron/core/models/gpt/experimental_attention_variant_module_specs.py
    # _get_backend_spec_provider asserts the TE spec (core_v0.16.1 line 356, d98e8a64 line 498;
    # 0.16.x-main, the releases with --experimental-attention-variant)
    if ns.get("experimental_attention_variant") and (ns.get("transformer_impl") or "transformer_engine") != \
            "transformer_engine":
        yield Problem("experimental-attention-needs-te", raw.location("transformer_impl"),
                      f"--experimental-attention-variant {ns.get('experimental_attention_variant')} needs "
                      "--transformer-impl transformer_engine")
    layers = _int(ns.get("num_layers"))
    types = ns.get("cp_comm_type")
    if _size(ns, "context_parallel_size") > 1 and isinstance(types, (list, tuple)) and len(types) > 1 \
            and layers is not None and len(types) != layers:
        yield Problem("cp-comm-type-length", raw.location("cp_comm_type"),
                      f"--cp-comm-type lists {len(types)} types; give one, or one per layer ({layers})")
    freq = ns.get("no_rope_freq")
    if isinstance(freq, str):
        text = freq.strip()
        if text.lstrip("-").isdigit():
            freq = int(text)
        elif text.startswith("[") and text.endswith("]"):
            parts = [p.strip() for p in text[1:-1].split(",") if p.strip()]
            freq = parts
    if freq:
        if ns.get("flash_decode"):
            yield Problem("no-rope-freq", raw.location("flash_decode"),
                          "--flash-decode cannot be combined with --no-rope-freq")
        if layers is not None:
            if isinstance(freq, int) and freq > 0 and layers % freq:
                yield Problem("no-rope-freq", raw.location("no_rope_freq"),
                              f"--no-rope-freq {freq} must divide --num-layers {layers}")
            elif isinstance(freq, (list, tuple)) and len(freq) != layers:
                yield Problem("no-rope-freq", raw.location("no_rope_freq"),
                              f"--no-rope-freq lists {len(freq)} layers but --num-layers is {layers}")


def hyper_connections(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 2030-2122): manifold
    # hyper connections (--enable-mhc-connections) and their selective recompute.
    mhc = ns.get("enable_mhc_connections")
    modules = _selective_modules(ns)
    if "mhc" in modules:
        where = raw.location("recompute_modules")
        if not mhc:
            yield Problem("mhc-conflict", where, "recomputing mhc needs --enable-mhc-connections")
        if "mlp" in modules:
            yield Problem("mhc-conflict", where, "recompute modules mhc and mlp cannot be combined")
        count = ns.get("mhc_recompute_layer_num")
        if count is not None and (_int(count) is None or count < 1):
            yield Problem("mhc-conflict", raw.location("mhc_recompute_layer_num"),
                          f"--mhc-recompute-layer-num must be a positive integer (it is {count})")
        if ns.get("fine_grained_activation_offloading"):
            yield Problem("mhc-conflict", where,
                          "recomputing mhc cannot be combined with --fine-grained-activation-offloading")
    if not mhc:
        return
    where = raw.location("enable_mhc_connections")
    if ns.get("mtp_num_layers") is not None:
        yield Problem("mhc-conflict", raw.location("mtp_num_layers"),
                      "--enable-mhc-connections cannot be combined with multi-token prediction (--mtp-num-layers)")
    if ns.get("recompute_granularity") == "full":
        yield Problem("mhc-conflict", raw.location("recompute_granularity"),
                      "--enable-mhc-connections cannot be combined with full recompute")
    if _size(ns, "pipeline_model_parallel_size") > 1:
        yield Problem("mhc-conflict", raw.location("pipeline_model_parallel_size"),
                      "--enable-mhc-connections does not support pipeline parallelism")
    if ns.get("fp32_residual_connection"):
        yield Problem("mhc-conflict", raw.location("fp32_residual_connection"),
                      "--enable-mhc-connections cannot be combined with --fp32-residual-connection")
    iterations = _int(ns.get("mhc_sinkhorn_iterations"))
    if iterations is not None and iterations < 1:
        yield Problem("mhc-conflict", raw.location("mhc_sinkhorn_iterations"),
                      f"--mhc-sinkhorn-iterations must be at least 1 (it is {iterations})")
    gating = ns.get("mhc_init_gating_factor")
    if isinstance(gating, (int, float)) and gating < 0:
        yield Problem("mhc-conflict", raw.location("mhc_init_gating_factor"),
                      f"--mhc-init-gating-factor must not be negative (it is {gating})")


def local_norm_sequence_parallel(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/torch_norm.py WrappedTorchNorm.__new__ asserts no sequence
    # parallelism (core_v0.14.0 line 32 ... d98e8a64 line 52; every release 0.14.0-main).  The
    # local spec builds every RMSNorm as WrappedTorchNorm (megatron/core/models/backends.py
    # LocalSpecProvider.layer_norm(rms_norm=True); gpt_layer_specs.py get_gpt_layer_local_spec),
    # so the model build stops.  (validate_args turns --sequence-parallel off at TP 1: derive.py.)
    if ns.get("transformer_impl") == "local" and ns.get("normalization") == "RMSNorm" and ns.get("sequence_parallel"):
        yield Problem("local-norm-sequence-parallel", raw.location("sequence_parallel"),
                      "--sequence-parallel with --transformer-impl local and --normalization RMSNorm is refused: "
                      "the local spec builds RMSNorm as torch's norm, which does not support sequence parallelism "
                      "(megatron/core/transformer/torch_norm.py); use --transformer-impl transformer_engine")


def local_attention_context_parallel(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/dot_product_attention.py DotProductAttention.__init__ asserts
    # context_parallel_size == 1 (core_v0.14.0 line 53, core_v0.15.3 ... d98e8a64 line 58; every
    # release 0.14.0-main): only TEDotProductAttention does context parallelism.
    cp = _size(ns, "context_parallel_size")
    if ns.get("transformer_impl") == "local" and cp > 1:
        yield Problem("local-attention-with-cp", raw.location("context_parallel_size"),
                      f"--context-parallel-size {cp} needs --transformer-impl transformer_engine: the local "
                      "attention (megatron/core/transformer/dot_product_attention.py) refuses context parallelism")
