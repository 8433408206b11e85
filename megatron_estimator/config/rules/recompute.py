"""Activation recomputation and offloading.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _modules, _selective_modules, release_behaviour


# transformer_config.py __post_init__ allowed_modules (d98e8a64 lines 1945-1957).
RECOMPUTE_MODULES = frozenset({"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                               "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"})


def recompute(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # transformer_config.py __post_init__
    granularity = ns.get("recompute_granularity")
    method = ns.get("recompute_method")
    count = ns.get("recompute_num_layers")
    where = raw.location("recompute_granularity")
    if granularity == "full":
        if method is None:
            yield Problem("recompute-method-required", where,
                          "--recompute-granularity full needs --recompute-method uniform or block")
        # transformer_config.py __post_init__ (main d98e8a64 lines 1919-1925; 0.8 on) asks only that
        # the count be set.  Block recomputes the first `count` layers of each stage
        # (megatron/core/recompute.py lines 167-181 at d98e8a64; transformer_block.py
        # _checkpointed_forward from 0.8 to 0.18), so 0 recomputes none; uniform steps through the
        # stage `count` layers at a time (recompute.py lines 157-166), so 0 never ends.
        if count is None:
            yield Problem("recompute-num-layers-required", where,
                          "--recompute-granularity full needs --recompute-num-layers (uniform: layers per "
                          "recompute group; block: layers recomputed per stage)")
        elif isinstance(count, int) and count < 1 and method == "uniform":
            yield Problem("out-of-range", raw.location("recompute_num_layers"),
                          "--recompute-num-layers must be at least 1 with --recompute-method uniform: "
                          "Megatron steps through each stage's layers that many at a time, and 0 never ends "
                          "(with block, 0 recomputes no layer)")
    elif granularity == "selective":
        if method is not None:
            yield Problem("recompute-method-with-selective", raw.location("recompute_method"),
                          "--recompute-method is not supported with selective recompute")
        if count is not None:
            yield Problem("recompute-num-layers-with-selective", raw.location("recompute_num_layers"),
                          "--recompute-num-layers must not be set with selective recompute")
        modules = ns.get("recompute_modules") or []
        # transformer_config.py __post_init__ checks the module names only under selective
        # recompute (d98e8a64 lines 1943-1962; core_v0.14.0 lines 867-882): with full or no
        # recompute any name is accepted, and the model reads the list only under selective.
        unknown = sorted(set(modules) - RECOMPUTE_MODULES)
        if unknown:
            yield Problem("invalid-choice", raw.location("recompute_modules"),
                          f"--recompute-modules {' '.join(unknown)}: not one of "
                          f"{', '.join(sorted(RECOMPUTE_MODULES))} (selective recompute)")
        if "moe_act" in modules and not ns.get("moe_grouped_gemm"):
            yield Problem("recompute-module-unsupported", raw.location("recompute_modules"),
                          "recompute module moe_act needs --moe-grouped-gemm")
        if "mla_up_proj" in modules and not ns.get("multi_latent_attention"):
            yield Problem("recompute-module-unsupported", raw.location("recompute_modules"),
                          "recompute module mla_up_proj needs --multi-latent-attention")
        if "gdn_norm_out" in modules and ns.get("experimental_attention_variant") not in ("gdn", "gdn2", "gated_delta_net"):
            yield Problem("recompute-module-unsupported", raw.location("recompute_modules"),
                          "recompute module gdn_norm_out needs --experimental-attention-variant gdn or gdn2")
    if ns.get("distribute_saved_activations"):
        where = raw.location("distribute_saved_activations")
        if ns.get("tensor_model_parallel_size", 1) <= 1:
            yield Problem("distribute-saved-activations", where,
                          "--distribute-saved-activations needs tensor parallel size > 1")
        if granularity != "full" or method is None:
            yield Problem("distribute-saved-activations", where,
                          "--distribute-saved-activations needs --recompute-granularity full and a --recompute-method")
        if ns.get("sequence_parallel"):
            yield Problem("distribute-saved-activations", where,
                          "--distribute-saved-activations cannot be used with --sequence-parallel")


OFFLOAD_MODULES = {"core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act", "attn_norm",
                   "mlp_norm", "qkv_linear", "gdp_qkv"}


def activation_offloading(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args and transformer_config.py __post_init__
    if not ns.get("fine_grained_activation_offloading"):
        return
    where = raw.location("fine_grained_activation_offloading")
    if ns.get("transformer_impl") != "transformer_engine":
        yield Problem("offloading-needs-te", where,
                      "fine-grained activation offloading needs --transformer-impl transformer_engine")
    if ns.get("cpu_offloading"):
        yield Problem("offloading-conflict", where,
                      "--fine-grained-activation-offloading cannot be combined with --cpu-offloading-num-layers")
    modules = list(ns.get("offload_modules") or [])
    if not modules:
        yield Problem("offload-modules-required", where,
                      "--fine-grained-activation-offloading needs --offload-modules")
    unknown = sorted(set(modules) - OFFLOAD_MODULES)
    if unknown:
        yield Problem("invalid-choice", raw.location("offload_modules"),
                      f"unknown --offload-modules {', '.join(unknown)}; choose from {', '.join(sorted(OFFLOAD_MODULES))}")
    if "attn_proj" in modules and "core_attn" not in modules:
        yield Problem("offload-attn-proj-needs-core-attn", raw.location("offload_modules"),
                      "offloading attn_proj needs core_attn too: attn_proj's input is core_attn's output")


def fp8_delayed_recompute_modules(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from 781e765818, every
    # release the estimator knows): selective recompute of moe_act or layernorm under fp8 with
    # the delayed-scaling recipe (--fp8-recipe's default) raises ValueError.
    if ns.get("recompute_granularity") != "selective" or not ns.get("fp8"):
        return
    modules = [m for m in (ns.get("recompute_modules") or []) if m in ("moe_act", "layernorm")]
    if not modules or (ns.get("fp8_recipe") or "delayed") != "delayed":
        return
    yield Problem("fp8-delayed-recompute", raw.location("recompute_modules"),
                  f"recomputing {' and '.join(modules)} under fp8 needs an fp8 recipe other than delayed "
                  "scaling (--fp8-recipe, default delayed)")


MOE_INNER_OFFLOADS = ("expert_fc1", "moe_act", "fused_group_mlp")


def offloading_and_stash(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 2169, 2188, 2191,
    # 2212-2222): fine-grained offloading inside MoE, and the MoE paged stash.
    offload = _modules(ns, "offload_modules") if ns.get("fine_grained_activation_offloading") else []
    where = raw.location("offload_modules")
    if offload:
        inner = [m for m in MOE_INNER_OFFLOADS if m in offload]
        if inner and "moe" in _selective_modules(ns) and release_behaviour("offload_inside_moe_recompute_rejected", run) == "1":
            yield Problem("offload-inside-moe-recompute", where,
                          f"offloading {', '.join(inner)} cannot be combined with recomputing the whole MoE layer "
                          "(moe in --recompute-modules)")
        if "fused_group_mlp" in offload and release_behaviour("fused_group_mlp_offload_checked", run) == "1":
            if not ns.get("use_transformer_engine_op_fuser"):
                yield Problem("offload-fused-group-mlp", where,
                              "offloading fused_group_mlp needs --use-transformer-engine-op-fuser")
            partial = [m for m in ("expert_fc1", "moe_act") if m in offload]
            if partial:
                yield Problem("offload-fused-group-mlp", where,
                              f"offloading fused_group_mlp (the whole grouped MLP) cannot be combined with {', '.join(partial)}")
    if ns.get("moe_paged_stash"):
        stash = raw.location("moe_paged_stash")
        if ns.get("cpu_offloading"):
            yield Problem("moe-paged-stash", stash, "--moe-paged-stash cannot be combined with --cpu-offloading-num-layers")
        if ns.get("moe_expert_rank_capacity_factor") is None:
            yield Problem("moe-paged-stash", stash, "--moe-paged-stash needs --moe-expert-rank-capacity-factor")
        clash = [m for m in MOE_INNER_OFFLOADS if m in offload]
        if clash:
            yield Problem("moe-paged-stash", where,
                          f"with --moe-paged-stash, --offload-modules cannot include {', '.join(clash)}")


def mtp_uniform_recompute(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionLayer: with full
    # recompute (training) and --recompute-method uniform it asserts recompute_num_layers == 1
    # (core_v0.14.0 lines 625-631 ... d98e8a64 lines 1621-1627; every release 0.14.0-main), at the
    # first training step.
    mtp = ns.get("mtp_num_layers")
    count = ns.get("recompute_num_layers")
    if not mtp or ns.get("recompute_granularity") != "full" or ns.get("recompute_method") != "uniform":
        return
    if isinstance(count, int) and count != 1:
        yield Problem("mtp-uniform-recompute", raw.location("recompute_num_layers"),
                      f"--recompute-method uniform with MTP layers (--mtp-num-layers {mtp}) needs "
                      f"--recompute-num-layers 1, not {count} (megatron/core/transformer/multi_token_prediction.py "
                      "asserts it at the first training step)")


def cpu_offloading(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # transformer_config.py __post_init__ (d98e8a64 line 1885 and the checks beside it):
    # --cpu-offloading-num-layers within the layers, no pipeline parallelism, no recompute.
    if ns.get("cpu_offloading"):
        where = raw.location("cpu_offloading_num_layers")
        if ns.get("pipeline_model_parallel_size", 1) > 1:
            yield Problem("cpu-offloading-with-pp", where,
                          "CPU activation offloading does not support pipeline parallelism")
        if ns.get("recompute_granularity") is not None:
            yield Problem("cpu-offloading-with-recompute", where,
                          "CPU activation offloading does not work with activation recomputation")
        if isinstance(ns.get("num_layers"), int) and ns["cpu_offloading_num_layers"] >= ns["num_layers"]:
            yield Problem("out-of-range", where,
                          f"--cpu-offloading-num-layers must be below --num-layers ({ns['num_layers']})")
