"""Precision: fp16 / bf16 / fp8 / fp4, the optimizer's precision, batch-invariant numerics.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _flag, _int, _size, release_behaviour


def optimizer_and_precision(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    if ns.get("fp16") and ns.get("bf16"):
        yield Problem("conflicting-precision", raw.location("fp16"), "--fp16 and --bf16 cannot both be set")
    # arguments.py validate_args
    if ns.get("overlap_param_gather"):
        if not (ns.get("use_distributed_optimizer") or ns.get("use_megatron_fsdp")
                or ns.get("use_layer_wise_distributed_optimizer")):
            yield Problem("overlap-param-gather-needs-dist-opt", raw.location("overlap_param_gather"),
                          "--overlap-param-gather needs --use-distributed-optimizer (or Megatron-FSDP)")
        if not ns.get("overlap_grad_reduce"):
            yield Problem("overlap-param-gather-needs-grad-reduce", raw.location("overlap_param_gather"),
                          "--overlap-param-gather needs --overlap-grad-reduce")
    # arguments.py validate_args `if args.overlap_param_gather_with_optimizer_step:` (core_v0.14.0
    # lines 595-603, d98e8a64 lines 1066-1074; every release 0.14.0-main); use_dist_ckpt is
    # --ckpt-format other than torch (megatron/training/utils common_utils.py update_use_dist_ckpt).
    if ns.get("overlap_param_gather_with_optimizer_step"):
        for refused, what in ((not ns.get("use_distributed_optimizer"), "needs --use-distributed-optimizer"),
                              (not ns.get("overlap_param_gather"), "needs --overlap-param-gather"),
                              (not ns.get("virtual_pipeline_model_parallel_size"),
                               "needs the interleaved pipeline schedule (--num-layers-per-virtual-pipeline-stage "
                               "or --num-virtual-stages-per-pipeline-rank)"),
                              ((ns.get("ckpt_format") or "torch_dist") != "torch",
                               "is not supported with distributed checkpointing (it needs --ckpt-format torch)")):
            if refused:
                yield Problem("overlap-param-gather-with-optimizer-step", raw.location(
                    "overlap_param_gather_with_optimizer_step"), f"--overlap-param-gather-with-optimizer-step {what}")
                break           # Megatron stops at the first assert
    if ns.get("fp8_param_gather") and not (ns.get("use_distributed_optimizer") or ns.get("use_megatron_fsdp")
                                           or ns.get("use_torch_fsdp2")):
        yield Problem("fp8-param-gather-needs-dist-opt", raw.location("fp8_param_gather"),
                      "--fp8-param-gather needs --use-distributed-optimizer (or FSDP)")
    if ns.get("fp8_param_gather") and not ns.get("fp8"):
        yield Problem("fp8-param-needs-fp8", raw.location("fp8_param_gather"),
                      "--fp8-param-gather needs --fp8-format")
    # megatron/core/optimizer/optimizer_config.py
    if ns.get("use_precision_aware_optimizer"):
        if ns.get("optimizer") != "adam":
            yield Problem("precision-aware-optimizer-needs-adam", raw.location("use_precision_aware_optimizer"),
                          f"--use-precision-aware-optimizer supports only --optimizer adam, not {ns.get('optimizer')}")
    else:
        for dest, value in (("main_grads_dtype", "fp32"), ("main_params_dtype", "fp32"),
                            ("exp_avg_dtype", "fp32"), ("exp_avg_sq_dtype", "fp32")):
            if ns.get(dest, value) != value:
                yield Problem("dtype-needs-precision-aware-optimizer", raw.location(dest),
                              f"{_flag(dest)} {ns[dest]} needs --use-precision-aware-optimizer "
                              "(only fp32 without it)")
    if ns.get("optimizer_cpu_offload") and not ns.get("use_precision_aware_optimizer"):
        yield Problem("cpu-offload-needs-precision-aware-optimizer", raw.location("optimizer_cpu_offload"),
                      "--optimizer-cpu-offload needs --use-precision-aware-optimizer")
    if ns.get("fp16_lm_cross_entropy") and not ns.get("fp16"):
        yield Problem("fp16-lm-cross-entropy-needs-fp16", raw.location("fp16_lm_cross_entropy"),
                      "--fp16-lm-cross-entropy needs --fp16")
    if ns.get("fp32_residual_connection") and not (ns.get("fp16") or ns.get("bf16")):
        yield Problem("fp32-residual-needs-half", raw.location("fp32_residual_connection"),
                      "--fp32-residual-connection needs --fp16 or --bf16")
    if (ns.get("cross_entropy_loss_fusion") and ns.get("cross_entropy_fusion_impl") == "te"
            and release_behaviour("te_cross_entropy_fusion_rejected", run) == "1"):
        # arguments.py validate_args from 168cb15d70 (0.19.0); legal before (megatron_behaviour.tsv)
        yield Problem("te-cross-entropy-disabled", raw.location("cross_entropy_fusion_impl"),
                      "Megatron disables Transformer Engine's cross entropy fusion; use "
                      "--cross-entropy-fusion-impl native or drop --cross-entropy-loss-fusion")
    if ns.get("use_megatron_fsdp"):
        # arguments.py validate_args from ab43d43f0b (0.18.0; megatron_behaviour.tsv)
        if ns.get("optimizer") not in ("sgd", "adam") and release_behaviour("fsdp_optimizer_checked", run) == "1":
            yield Problem("fsdp-optimizer", raw.location("optimizer"),
                          f"Megatron-FSDP supports --optimizer adam or sgd, not {ns.get('optimizer')}")
        if ns.get("ckpt_format") != "fsdp_dtensor":
            yield Problem("fsdp-ckpt-format", raw.location("ckpt_format"),
                          "Megatron-FSDP requires --ckpt-format fsdp_dtensor")


def low_precision_recipes(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 1530-1586)
    fp8, fp4 = ns.get("fp8"), ns.get("fp4")
    recipe = ns.get("fp8_recipe") or "delayed"
    if fp8 and ns.get("first_last_layers_bf16"):
        where = raw.location("first_last_layers_bf16")
        if recipe == "delayed":
            yield Problem("fp8-bf16-layers", where,
                          "--first-last-layers-bf16 is not supported with the delayed-scaling fp8 recipe "
                          "(--fp8-recipe, default delayed)")
        layers, pp = _int(ns.get("num_layers")), _size(ns, "pipeline_model_parallel_size")
        if layers is not None and pp > 0:
            per_stage = layers // pp
            for dest in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
                count = _int(ns.get(dest))
                if count is not None and not 0 <= count <= per_stage:
                    yield Problem("fp8-bf16-layers", raw.location(dest),
                                  f"{_flag(dest)} {count} must be between 0 and the {per_stage} layers per "
                                  f"pipeline stage ({layers} // pp {pp})")
    if fp8 and recipe == "custom" and not ns.get("fp8_quantizer_factory"):
        yield Problem("quantizer-factory-required", raw.location("fp8_recipe"),
                      "--fp8-recipe custom needs --fp8-quantizer-factory (a Python import path)")
    if fp4 and (ns.get("fp4_recipe") or "nvfp4") == "custom" and not ns.get("fp4_quantizer_factory"):
        yield Problem("quantizer-factory-required", raw.location("fp4_recipe"),
                      "--fp4-recipe custom needs --fp4-quantizer-factory (a Python import path)")
    if ns.get("fp8_output_proj"):
        if not fp8:
            yield Problem("fp8-output-proj", raw.location("fp8_output_proj"),
                          "--fp8-output-proj needs fp8 (--fp8-format)")
        elif recipe != "mxfp8":
            yield Problem("fp8-output-proj", raw.location("fp8_output_proj"),
                          f"--fp8-output-proj needs --fp8-recipe mxfp8 (it is {recipe})")
    # Also megatron/training/arguments.py validate_args, which raises first.
    if ns.get("fp4_param_gather") and not fp4:
        yield Problem("fp4-conflict", raw.location("fp4_param_gather"),
                      "--fp4-param-gather needs --fp4-format")
    if fp4 and fp8:
        yield Problem("fp4-conflict", raw.location("fp4"),
                      "--fp4-format and --fp8-format cannot both be set")


def batch_invariant_mode(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 3212-3268); which of
    # the checks the release makes: megatron_behaviour.tsv batch_invariant_checks.
    if not ns.get("batch_invariant_mode"):
        return
    checks = set(release_behaviour("batch_invariant_checks", run).split(","))
    where = raw.location("batch_invariant_mode")
    if "bf16" in checks and not ns.get("bf16"):
        yield Problem("batch-invariant-mode", where, "--batch-invariant-mode needs bf16 parameters (--bf16)")
    if "flash" in checks and (ns.get("attention_backend") or "auto") != "flash":
        yield Problem("batch-invariant-mode", raw.location("attention_backend"),
                      "--batch-invariant-mode needs --attention-backend flash")
    if "fa_version" in checks and ns.get("flash_attention_version") not in (3, 4):
        yield Problem("batch-invariant-mode", raw.location("flash_attention_version"),
                      "--batch-invariant-mode needs --flash-attention-version 3 or 4")
    if "cp" in checks and _size(ns, "context_parallel_size") != 1:
        yield Problem("batch-invariant-mode", raw.location("context_parallel_size"),
                      "--batch-invariant-mode does not support context parallelism")
    dropout = ns.get("attention_dropout", 0.1)
    if "dropout" in checks and isinstance(dropout, (int, float)) and dropout != 0:
        yield Problem("batch-invariant-mode", raw.location("attention_dropout"),
                      f"--batch-invariant-mode needs --attention-dropout 0 (it is {dropout}, the default 0.1 unless set)")
    if "moe" not in checks or not (_int(ns.get("num_experts")) or 0) > 0:
        return
    if ns.get("transformer_impl") != "inference_optimized" and (ns.get("moe_token_dispatcher_type") or "allgather") != "alltoall":
        yield Problem("batch-invariant-mode", raw.location("moe_token_dispatcher_type"),
                      "batch-invariant MoE training needs --moe-token-dispatcher-type alltoall")
    if ns.get("fp8") or ns.get("fp4"):
        yield Problem("batch-invariant-mode", raw.location("fp8" if ns.get("fp8") else "fp4"),
                      "batch-invariant MoE is bf16 only: drop --fp8-format / --fp4-format")
    fused = [d for d in ("moe_permute_fusion", "moe_permute_fusion_into_hybridep") if ns.get(d)]
    if fused:
        yield Problem("batch-invariant-mode", raw.location(fused[0]),
                      f"batch-invariant MoE needs the unfused permutation: drop {_flag(fused[0])}")
    padded = [d for d in ("moe_pad_expert_input_to_capacity", "moe_pad_experts_for_cuda_graph_inference") if ns.get(d)]
    if padded:
        yield Problem("batch-invariant-mode", raw.location(padded[0]),
                      f"batch-invariant MoE supports dropless routing only: drop {_flag(padded[0])}")
