"""Mixture of experts: expert counts and parallelism, routing, dispatchers, overlaps, grouped
weights.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _cuda_graph_impl, _flag, _graph_modules, _int, _modules, _selective_modules, release_behaviour


def experts(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    ep = ns.get("expert_model_parallel_size")
    e = ns.get("num_experts")
    if isinstance(ep, int) and ep > 1:
        if not e:
            yield Problem("ep-without-experts", raw.location("expert_model_parallel_size"),
                          f"--expert-model-parallel-size {ep} needs --num-experts")
        elif e % ep:
            yield Problem("experts-not-divisible-by-ep", raw.location("num_experts"),
                          f"--num-experts {e} is not a multiple of --expert-model-parallel-size {ep}")
    freq = ns.get("moe_layer_freq")
    if e and isinstance(freq, list) and isinstance(ns.get("num_layers"), int) and len(freq) != ns["num_layers"]:
        yield Problem("moe-layer-freq-length", raw.location("moe_layer_freq"),
                      f"--moe-layer-freq lists {len(freq)} layers but --num-layers is {ns['num_layers']}")
    if e and isinstance(ns.get("moe_router_topk"), int) and ns["moe_router_topk"] > e:
        yield Problem("topk-exceeds-experts", raw.location("moe_router_topk"),
                      f"--moe-router-topk {ns['moe_router_topk']} exceeds --num-experts {e}")


def moe_features(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    yield from _moe_overlap(ns, raw)        # transformer_config.py asserts it for dense models too
    if not ns.get("num_experts"):
        return
    # megatron/core/transformer/moe/moe_layer.py: training MoE with TP needs sequence parallel
    # (every release).  With expert parallel > 1 as well, megatron/core/model_parallel_config.py
    # raises as soon as the model configuration is built in 0.14 and only warns from 0532e92748
    # (#3678, 0.15): megatron_behaviour.tsv moe_ep_tp_without_sp.
    if (ns.get("tensor_model_parallel_size") or 1) > 1 and not ns.get("sequence_parallel"):
        early = (ns.get("expert_model_parallel_size") or 1) > 1 and release_behaviour("moe_ep_tp_without_sp", run) == "error"
        when = ("when it builds the model configuration, model_parallel_config.py" if early
                else "at the first training step, moe_layer.py")
        yield Problem("moe-tp-needs-sequence-parallel", raw.location("tensor_model_parallel_size"),
                      f"MoE with tensor parallel size > 1 needs --sequence-parallel (Megatron raises {when})")
    # transformer_config.py __post_init__
    if ns.get("moe_enable_deepep") and ns.get("moe_token_dispatcher_type") != "flex":
        yield Problem("deepep-needs-flex", raw.location("moe_enable_deepep"),
                      "--moe-enable-deepep needs --moe-token-dispatcher-type flex")
    if ns.get("moe_pad_expert_input_to_capacity") and ns.get("moe_expert_capacity_factor") is None:
        yield Problem("pad-needs-capacity-factor", raw.location("moe_pad_expert_input_to_capacity"),
                      "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor")


def _moe_overlap(ns: Namespace, raw: RawArgs) -> Iterator[Problem]:
    # transformer_config.py __post_init__ (core_v0.14.0 lines 1298-1311 ... d98e8a64 lines
    # 3002-3013; every release): not gated on experts, so a dense model is refused too.
    if ns.get("overlap_moe_expert_parallel_comm"):
        where = raw.location("overlap_moe_expert_parallel_comm")
        if (ns.get("pipeline_model_parallel_size") or 1) > 1 and not ns.get("virtual_pipeline_model_parallel_size"):
            yield Problem("moe-overlap-needs-vpp", where,
                          "--overlap-moe-expert-parallel-comm with pipeline parallelism needs virtual "
                          "pipeline stages (--num-virtual-stages-per-pipeline-rank)")
        if (ns.get("expert_model_parallel_size") or 1) <= 1:
            yield Problem("moe-overlap-needs-ep", where,
                          "--overlap-moe-expert-parallel-comm needs --expert-model-parallel-size > 1")
        if ns.get("moe_token_dispatcher_type") not in ("alltoall", "flex"):
            yield Problem("moe-overlap-dispatcher", where,
                          "--overlap-moe-expert-parallel-comm needs --moe-token-dispatcher-type alltoall or flex")
        if ns.get("recompute_granularity") == "full":
            yield Problem("moe-overlap-with-full-recompute", where,
                          "--overlap-moe-expert-parallel-comm cannot be combined with full recompute")


def moe_bias_expert_tensor_parallel(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from a329dd6da5, 0.15):
    # MoE with linear biases (the default) asserts expert_tensor_parallel_size == 1; the expert
    # TP size defaults to the TP size (megatron/training/arguments.py validate_args).
    if not ns.get("num_experts") or not ns.get("add_bias_linear", True):
        return
    if release_behaviour("moe_bias_needs_etp1", run) != "1":
        return
    etp = ns.get("expert_tensor_parallel_size")
    given = etp is not None         # set by a flag, a config file or the planner's layout
    if not given:
        etp = ns.get("tensor_model_parallel_size") or 1
    if not isinstance(etp, int) or etp == 1:
        return
    where = raw.location("expert_tensor_parallel_size" if raw.given("expert_tensor_parallel_size")
                         else "tensor_model_parallel_size")
    source = "--expert-tensor-parallel-size" if given else "--tensor-model-parallel-size, which it defaults to"
    yield Problem("moe-bias-needs-etp1", where,
                  f"MoE layers with linear biases need expert tensor parallel size 1 (it is {etp}, from "
                  f"{source}); add --disable-bias-linear or set --expert-tensor-parallel-size 1")


CAPACITY_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


def moe_routing(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__: the router, capacity and
    # expert-size checks (lines 1414, 1702, 1829-1857, 2621, 2651-2686).
    experts = _int(ns.get("num_experts"))
    if ns.get("moe_use_grouped_tensor") and not ns.get("moe_grouped_gemm"):
        yield Problem("moe-grouped-tensor-needs-grouped-gemm", raw.location("moe_use_grouped_tensor"),
                      "--moe-use-grouped-tensor needs --moe-grouped-gemm")
    # from e8e79a43e9 (0.18.0; megatron_behaviour.tsv moe_ffn_hidden_size_needs_experts)
    if experts is None and ns.get("moe_ffn_hidden_size") is not None \
            and release_behaviour("moe_ffn_hidden_size_needs_experts", run) == "1":
        yield Problem("moe-ffn-hidden-size-without-experts", raw.location("moe_ffn_hidden_size"),
                      "--moe-ffn-hidden-size is set but --num-experts is not")
    # The router checks below do not ask for experts: Megatron makes them on dense models too.
    balancing = ns.get("moe_router_load_balancing_type") or "aux_loss"
    if isinstance(balancing, (list, tuple)) and len(balancing) == 1:
        balancing = balancing[0]            # validate_args keeps a single type as a string
    coeff = ns.get("moe_aux_loss_coeff")
    if isinstance(coeff, (list, tuple)) and len(coeff) == 1:
        coeff = coeff[0]
    if isinstance(balancing, (list, tuple)) and not (isinstance(coeff, (list, tuple)) and len(coeff) == len(balancing)):
        have = f"{len(coeff)} values" if isinstance(coeff, (list, tuple)) else "one value"
        yield Problem("moe-aux-loss-coeff-length", raw.location("moe_aux_loss_coeff"),
                      f"--moe-router-load-balancing-type lists {len(balancing)} types, so --moe-aux-loss-coeff "
                      f"needs {len(balancing)} values (it has {have})")
    factor = ns.get("moe_expert_capacity_factor")
    if isinstance(factor, (int, float)) and factor >= 0:    # a negative factor means none
        types = list(balancing) if isinstance(balancing, (list, tuple)) else [balancing]
        bad = [t for t in types if t not in CAPACITY_LOAD_BALANCING]
        if bad:
            yield Problem("moe-capacity-factor-load-balancing", raw.location("moe_expert_capacity_factor"),
                          f"--moe-expert-capacity-factor works only with --moe-router-load-balancing-type "
                          f"{', '.join(CAPACITY_LOAD_BALANCING)}; not {', '.join(bad)}")
    score = ns.get("moe_router_score_function") or "softmax"
    if ns.get("moe_router_enable_expert_bias") and score not in ("sigmoid", "sqrtsoftplus"):
        yield Problem("moe-expert-bias-score-function", raw.location("moe_router_enable_expert_bias"),
                      "--moe-router-enable-expert-bias (aux-loss-free routing) needs --moe-router-score-function "
                      f"sigmoid or sqrtsoftplus (it is {score})")
    if ns.get("moe_router_padding_for_quantization") or ns.get("moe_router_padding_for_fp8"):
        dest = ("moe_router_padding_for_quantization" if ns.get("moe_router_padding_for_quantization")
                else "moe_router_padding_for_fp8")
        if not ns.get("fp8") and not ns.get("fp4"):
            yield Problem("moe-router-padding", raw.location(dest),
                          f"{_flag(dest)} needs --fp8-format or --fp4-format")
        if (ns.get("moe_token_dispatcher_type") or "allgather") == "allgather":
            yield Problem("moe-router-padding", raw.location(dest),
                          f"{_flag(dest)} is not supported by the allgather token dispatcher "
                          "(--moe-token-dispatcher-type, default allgather)")
    if (ns.get("moe_router_topk") == 1 and score == "softmax" and not ns.get("moe_router_pre_softmax")
            and balancing != "sinkhorn"):
        yield Problem("moe-topk1-needs-pre-softmax", raw.location("moe_router_topk"),
                      "--moe-router-topk 1 with softmax scoring needs --moe-router-pre-softmax (a softmax over "
                      "one selected expert has no gradient)")
    group_topk = _int(ns.get("moe_router_group_topk"))
    if group_topk:
        groups = _int(ns.get("moe_router_num_groups"))
        where = raw.location("moe_router_group_topk")
        if not groups:
            yield Problem("moe-group-topk", where,
                          "--moe-router-group-topk (group-limited routing) needs --moe-router-num-groups")
        elif experts is None:
            yield Problem("moe-group-topk", where, "--moe-router-group-topk (group-limited routing) needs --num-experts")
        else:
            if experts % groups:
                yield Problem("moe-group-topk", raw.location("moe_router_num_groups"),
                              f"--num-experts {experts} is not divisible by --moe-router-num-groups {groups}")
            if group_topk > groups:
                yield Problem("moe-group-topk", where,
                              f"--moe-router-group-topk {group_topk} exceeds --moe-router-num-groups {groups}")


def moe_dispatch_and_overlap(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__: the flex dispatcher's
    # backends (lines 1747-1786, 1870-1879), shared-expert overlap (1824, 1996), whole-layer MoE
    # recompute (2020), the EP all-to-all overlap (3024-3042) and the wgrad overlaps (3075-3098).
    dispatcher = ns.get("moe_token_dispatcher_type") or "allgather"
    backend = ns.get("moe_flex_dispatcher_backend") or "deepep"
    if ns.get("moe_enable_deepep"):
        if dispatcher == "flex" and backend == "hybridep":     # not flex: deepep-needs-flex (moe_features)
            yield Problem("flex-dispatcher-backend", raw.location("moe_enable_deepep"),
                          "--moe-enable-deepep cannot be combined with --moe-flex-dispatcher-backend hybridep")
        backend = "deepep"
    if dispatcher == "flex" and ns.get("moe_pad_expert_input_to_capacity") and backend == "deepep":
        yield Problem("flex-dispatcher-backend", raw.location("moe_pad_expert_input_to_capacity"),
                      "--moe-pad-expert-input-to-capacity is not supported by the flex dispatcher's deepep backend "
                      "(--moe-flex-dispatcher-backend, default deepep)")
    if backend == "ncclep":
        if dispatcher != "flex":
            yield Problem("flex-dispatcher-backend", raw.location("moe_flex_dispatcher_backend"),
                          "--moe-flex-dispatcher-backend ncclep needs --moe-token-dispatcher-type flex")
        if ns.get("moe_use_grouped_tensor") and not ns.get("use_transformer_engine_op_fuser"):
            yield Problem("flex-dispatcher-backend", raw.location("moe_use_grouped_tensor"),
                          "--moe-use-grouped-tensor with the ncclep backend needs --use-transformer-engine-op-fuser")
    low = [d for d in ("moe_dispatch_fwd_dtype", "moe_combine_bwd_dtype") if (ns.get(d) or "bf16") != "bf16"]
    if low:
        where = raw.location(low[0])
        if dispatcher != "flex" or backend != "ncclep":
            yield Problem("flex-dispatcher-backend", where,
                          f"{', '.join(_flag(d) for d in low)} other than bf16 need --moe-token-dispatcher-type flex "
                          "with --moe-flex-dispatcher-backend ncclep")
        if not (ns.get("use_transformer_engine_op_fuser") and ns.get("moe_grouped_gemm")):
            yield Problem("flex-dispatcher-backend", where,
                          f"{', '.join(_flag(d) for d in low)} mxfp8 need both --use-transformer-engine-op-fuser "
                          "and --moe-grouped-gemm")
    if ns.get("moe_expert_rank_capacity_factor") is not None:
        where = raw.location("moe_expert_rank_capacity_factor")
        if backend not in ("hybridep", "ncclep"):
            yield Problem("flex-dispatcher-backend", where,
                          "--moe-expert-rank-capacity-factor needs --moe-flex-dispatcher-backend hybridep or ncclep")
        elif (backend == "hybridep" and not (ns.get("use_transformer_engine_op_fuser") or ns.get("moe_use_grouped_tensor"))
              and release_behaviour("rank_capacity_hybridep_checked", run) == "1"):      # 2d7060f44f, 0.19.0
            yield Problem("flex-dispatcher-backend", where,
                          "--moe-expert-rank-capacity-factor with hybridep needs --use-transformer-engine-op-fuser "
                          "or --moe-use-grouped-tensor")
    shared = ns.get("moe_shared_expert_intermediate_size") is not None
    if shared and ns.get("moe_shared_expert_overlap"):
        if dispatcher not in ("alltoall", "flex"):
            yield Problem("moe-shared-expert-overlap-dispatcher", raw.location("moe_shared_expert_overlap"),
                          "--moe-shared-expert-overlap needs --moe-token-dispatcher-type alltoall or flex "
                          f"(it is {dispatcher})")
        if "shared_experts" in _selective_modules(ns):
            yield Problem("moe-shared-expert-overlap-recompute", raw.location("recompute_modules"),
                          "recomputing shared_experts cannot be combined with --moe-shared-expert-overlap")
    if ns.get("moe_layer_recompute") and ns.get("recompute_granularity") == "full":
        yield Problem("moe-layer-recompute-with-full", raw.location("moe_layer_recompute"),
                      "--moe-layer-recompute cannot be combined with --recompute-granularity full")
    if ns.get("overlap_moe_expert_parallel_comm"):
        where = raw.location("overlap_moe_expert_parallel_comm")
        for dest in ("recompute_method", "recompute_num_layers"):
            # with full recompute moe-overlap-with-full-recompute (_moe_overlap) explains it, with
            # selective the recompute rule does
            if ns.get(dest) is not None and ns.get("recompute_granularity") is None:
                yield Problem("moe-overlap-conflict", raw.location(dest),
                              f"--overlap-moe-expert-parallel-comm cannot be combined with {_flag(dest)}")
        if "moe" in _selective_modules(ns) and release_behaviour("moe_overlap_moe_recompute_rejected", run) == "1":
            yield Problem("moe-overlap-conflict", raw.location("recompute_modules"),
                          "--overlap-moe-expert-parallel-comm cannot be combined with recomputing the moe module")
        if not (ns.get("bf16") or ns.get("fp16")):
            yield Problem("moe-overlap-conflict", where,
                          "--overlap-moe-expert-parallel-comm needs --bf16 or --fp16")
        if ns.get("moe_shared_expert_overlap"):
            yield Problem("moe-overlap-conflict", raw.location("moe_shared_expert_overlap"),
                          "--overlap-moe-expert-parallel-comm cannot be combined with --moe-shared-expert-overlap")
        mtp = _int(ns.get("mtp_num_layers"))
        if mtp is not None and mtp > 1:
            yield Problem("moe-overlap-conflict", raw.location("mtp_num_layers"),
                          f"--overlap-moe-expert-parallel-comm supports at most one MTP layer (--mtp-num-layers {mtp})")
    if ns.get("delay_wgrad_compute") and not ns.get("overlap_moe_expert_parallel_comm"):
        yield Problem("moe-wgrad-overlap", raw.location("delay_wgrad_compute"),
                      "--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm")
    if ns.get("overlap_dispatch_backward_with_experts_wgrad"):
        where = raw.location("overlap_dispatch_backward_with_experts_wgrad")
        for dest in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):
            if ns.get(dest):
                yield Problem("moe-wgrad-overlap", where,
                              f"--overlap-dispatch-backward-with-experts-wgrad cannot be combined with {_flag(dest)}")
    if ns.get("ep_overlap_early_attn_memory_release") and not ns.get("overlap_moe_expert_parallel_comm"):
        yield Problem("moe-wgrad-overlap", raw.location("ep_overlap_early_attn_memory_release"),
                      "--ep-overlap-early-attn-memory-release needs --overlap-moe-expert-parallel-comm")


def grouped_expert_weights(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 1709, 1726-1741)
    weight, bias = ns.get("moe_single_grouped_weight"), ns.get("moe_single_grouped_bias")
    if not (weight or bias):
        return
    where = raw.location("moe_single_grouped_weight" if weight else "moe_single_grouped_bias")
    # main from 883533e049 (megatron_behaviour.tsv single_grouped_needs_grouped_tensor)
    grouped_tensor_checked = release_behaviour("single_grouped_needs_grouped_tensor", run) == "1"
    if not ns.get("moe_grouped_gemm"):
        yield Problem("moe-single-grouped", where,
                      "--moe-single-grouped-weight / --moe-single-grouped-bias need --moe-grouped-gemm")
    if weight:
        recipe = ns.get("fp8_recipe") or "delayed"
        if (ns.get("fp8") and recipe != "mxfp8") or (ns.get("fp4") and (ns.get("fp4_recipe") or "nvfp4") != "nvfp4"):
            yield Problem("moe-single-grouped", where,
                          "--moe-single-grouped-weight supports high-precision weights, --fp8-recipe mxfp8 or "
                          "--fp4-recipe nvfp4")
        if ns.get("fp4") and not ns.get("fp4_param_gather") and release_behaviour("single_grouped_fp4_needs_param_gather", run) == "1":
            yield Problem("moe-single-grouped", where, "--moe-single-grouped-weight under fp4 needs --fp4-param-gather")
        if not ns.get("moe_use_grouped_tensor") and grouped_tensor_checked:
            yield Problem("moe-single-grouped", where, "--moe-single-grouped-weight needs --moe-use-grouped-tensor")
    if bias:
        if not ns.get("add_bias_linear", True):
            yield Problem("moe-single-grouped", raw.location("moe_single_grouped_bias"),
                          "--moe-single-grouped-bias needs linear biases (drop --disable-bias-linear)")
        if not ns.get("moe_use_grouped_tensor") and grouped_tensor_checked:
            yield Problem("moe-single-grouped", raw.location("moe_single_grouped_bias"),
                          "--moe-single-grouped-bias needs --moe-use-grouped-tensor")


def ep_overlap_graphs_and_offloads(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 3054, 3065) under
    # --overlap-moe-expert-parallel-comm.
    if not ns.get("overlap_moe_expert_parallel_comm"):
        return
    if _cuda_graph_impl(ns) == "transformer_engine":
        named = [m for m in ("moe", "mlp") if m in _graph_modules(ns)]
        if named:
            yield Problem("moe-overlap-conflict", raw.location("cuda_graph_modules"),
                          f"--cuda-graph-modules {' '.join(named)} with --cuda-graph-impl transformer_engine is not "
                          "supported with --overlap-moe-expert-parallel-comm")
    if ((ns.get("moe_token_dispatcher_type") or "allgather") == "flex" and ns.get("moe_flex_dispatcher_backend") == "ncclep"
            and ns.get("fine_grained_activation_offloading") and "expert_fc1" in _modules(ns, "offload_modules")):
        yield Problem("moe-overlap-conflict", raw.location("offload_modules"),
                      "--overlap-moe-expert-parallel-comm on the ncclep backend cannot offload expert_fc1")
