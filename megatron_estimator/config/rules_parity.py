"""Megatron's checks that the differential harness found missing (issue 12).

``scripts/megatron_validate`` runs Megatron-LM's own parse_args, validate_args, the
TransformerConfig ``__post_init__`` and a meta-device model build over the CI command lines
and their mutations; each rule here mirrors a refusal it found that no rule of ``rules.py``
made.  Each has the signature of a ``rules.py`` rule and is listed in ``PARITY_RULES``, which
``rules.py`` appends to its ``RULES``; release-dependent ones read ``data/megatron_behaviour.tsv``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

Namespace = Mapping[str, Any]

from megatron_estimator.core.problems import Problem
from megatron_estimator.config.run_context import RunContext
from megatron_estimator.inputs.rawargs import RawArgs

PARITY_RULES: list[Callable[[Namespace, RawArgs, Mapping[str, str], RunContext], Iterable[Problem]]] = []


def rule(func):
    PARITY_RULES.append(func)
    return func


def _release_rule(rule_name: str, run: RunContext) -> str:
    """The run's Megatron release's value for ``rule_name`` (data/megatron_behaviour.tsv)."""
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule_name, run.release)


def _cuda_graph_impl(ns: Namespace) -> str:
    """``--cuda-graph-impl`` after validate_args (megatron/training/arguments.py): the deprecated
    ``--enable-cuda-graph`` means ``local``, ``--external-cuda-graph`` ``transformer_engine``."""
    if ns.get("enable_cuda_graph"):
        return "local"
    if ns.get("external_cuda_graph"):
        return "transformer_engine"
    return ns.get("cuda_graph_impl") or "none"


@rule
def moe_bias_expert_tensor_parallel(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from a329dd6da5, 0.15):
    # MoE with linear biases (the default) asserts expert_tensor_parallel_size == 1; the expert
    # TP size defaults to the TP size (megatron/training/arguments.py validate_args).
    if not ns.get("num_experts") or not ns.get("add_bias_linear", True):
        return
    if _release_rule("moe_bias_needs_etp1", run) != "1":
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


@rule
def cuda_graph_full_recompute(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from 2b343d739f, 0.16):
    # with CUDA graphs, full recompute is only supported by --cuda-graph-impl full_iteration.
    impl = _cuda_graph_impl(ns)
    if impl in ("none", "full_iteration") or ns.get("recompute_granularity") != "full":
        return
    if _release_rule("cuda_graph_full_recompute_rejected", run) != "1":
        return
    yield Problem("cuda-graph-full-recompute", raw.location("recompute_granularity"),
                  f"--recompute-granularity full with CUDA graphs (--cuda-graph-impl {impl}) is refused: full "
                  "recompute needs --cuda-graph-impl full_iteration")


@rule
def cuda_graph_nccl_graph_register(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (from 2b343d739f, 0.16): TE CUDA graphs with
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True need NCCL_GRAPH_REGISTER=0.
    if _cuda_graph_impl(ns) != "transformer_engine":
        return
    if "expandable_segments:True" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "") or env.get("NCCL_GRAPH_REGISTER", "") == "0":
        return
    if _release_rule("cuda_graph_nccl_graph_register", run) != "1":
        return
    launch = run.launch_location
    yield Problem("cuda-graph-nccl-graph-register",
                  f"{launch} NCCL_GRAPH_REGISTER" if launch else "NCCL_GRAPH_REGISTER",
                  "Transformer Engine CUDA graphs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True need "
                  f"NCCL_GRAPH_REGISTER=0 in the environment (it is {env.get('NCCL_GRAPH_REGISTER', 'unset')}); "
                  "Megatron stops otherwise")


@rule
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


LOCAL_GRAPH_OFFLOAD_MODULES = ("expert_fc1", "moe_act", "fused_group_mlp")


@rule
def offloading_with_local_cuda_graphs(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from 69c486825c, #3697,
    # 0.19): fine-grained activation offloading with --cuda-graph-impl local offloads only the
    # modules that local CUDA graphs can capture.
    if not ns.get("fine_grained_activation_offloading") or _cuda_graph_impl(ns) != "local":
        return
    if _release_rule("local_cuda_graph_offload_modules", run) != "1":
        return
    unsupported = sorted(set(ns.get("offload_modules") or []) - set(LOCAL_GRAPH_OFFLOAD_MODULES))
    if unsupported:
        yield Problem("offload-modules-with-local-cuda-graphs", raw.location("offload_modules"),
                      f"with --cuda-graph-impl local, fine-grained activation offloading supports only "
                      f"--offload-modules {', '.join(LOCAL_GRAPH_OFFLOAD_MODULES)}; not {', '.join(unsupported)}")


# ---------------------------------------------------------------------------------------------
# The audit of the configuration __post_init__ checks (tests/data/megatron_config_checks.tsv):
# every flag-reachable raise / assert of megatron/core/model_parallel_config.py and
# megatron/core/transformer/transformer_config.py (TransformerConfig, MLATransformerConfig)
# at main d98e8a64 that no other rule made.  Line numbers are d98e8a64's.

def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(ns: Namespace, dest: str) -> int:
    value = _int(ns.get(dest))
    return value if value is not None else 1


def _modules(ns: Namespace, dest: str) -> list:
    value = ns.get(dest)
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, (list, tuple)) else []


def _selective_modules(ns: Namespace) -> list:
    """The selective-recompute modules (Megatron's default: core_attn), or [] without selective."""
    if ns.get("recompute_granularity") != "selective":
        return []
    return _modules(ns, "recompute_modules") or ["core_attn"]


@rule
def weight_shards_vs_tp(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/model_parallel_config.py resolve_tensor_parallel_weight_shards (lines 32, 37;
    # called by validate_args and __post_init__): an explicit weight-shard count must be a
    # multiple of (and so at least) its tensor-parallel size.
    tp = _size(ns, "tensor_model_parallel_size")
    etp = _int(ns.get("expert_tensor_parallel_size")) or tp
    for dest, size, size_flag in (("tensor_parallel_num_weight_shards", tp, "--tensor-model-parallel-size"),
                                  ("expert_tensor_parallel_num_weight_shards", etp, "--expert-tensor-parallel-size")):
        shards = _int(ns.get(dest))
        if shards is None or size < 1 or (shards >= size and shards % size == 0):
            continue
        yield Problem("weight-shards-vs-tp", raw.location(dest),
                      f"{_flag(dest)} {shards} must be a multiple of {size_flag} {size} (at least {size})")


@rule
def defer_embedding_wgrad(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/model_parallel_config.py __post_init__ (lines 546, 551, 556)
    if not ns.get("defer_embedding_wgrad_compute"):
        return
    where = raw.location("defer_embedding_wgrad_compute")
    if _size(ns, "pipeline_model_parallel_size") == 1:
        yield Problem("defer-embedding-wgrad", where,
                      "--defer-embedding-wgrad-compute needs pipeline parallelism (--pipeline-model-parallel-size > 1)")
    if not ns.get("gradient_accumulation_fusion", True):
        yield Problem("defer-embedding-wgrad", raw.location("gradient_accumulation_fusion"),
                      "--defer-embedding-wgrad-compute needs gradient-accumulation fusion; drop "
                      "--no-gradient-accumulation-fusion")
    limit = _int(ns.get("wgrad_deferral_limit"))
    if limit is not None and limit < 0:
        yield Problem("defer-embedding-wgrad", raw.location("wgrad_deferral_limit"),
                      f"--wgrad-deferral-limit must be 0 or more with --defer-embedding-wgrad-compute (it is {limit})")


@rule
def p2p_warmup_flush(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/model_parallel_config.py __post_init__ (line 572): overlapped p2p in warmup
    # and flush needs overlapped, not batched, p2p; validate_args turns the overlap off without
    # the interleaved schedule, and argument_utils.py batches p2p exactly when it is off.
    if not ns.get("overlap_p2p_comm_warmup_flush"):
        return
    if ns.get("virtual_pipeline_model_parallel_size") and ns.get("overlap_p2p_comm", True):
        return
    why = ("--no-overlap-p2p-communication is set" if not ns.get("overlap_p2p_comm", True)
           else "without virtual pipeline stages Megatron turns p2p overlap off")
    yield Problem("p2p-warmup-flush", raw.location("overlap_p2p_comm_warmup_flush"),
                  "--overlap-p2p-communication-warmup-flush needs overlapped p2p communication, which needs the "
                  f"interleaved schedule (--num-virtual-stages-per-pipeline-rank); {why}")


@rule
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


CAPACITY_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


@rule
def moe_routing(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__: the router, capacity and
    # expert-size checks (lines 1414, 1702, 1829-1857, 2621, 2651-2686).
    experts = _int(ns.get("num_experts"))
    if ns.get("moe_use_grouped_tensor") and not ns.get("moe_grouped_gemm"):
        yield Problem("moe-grouped-tensor-needs-grouped-gemm", raw.location("moe_use_grouped_tensor"),
                      "--moe-use-grouped-tensor needs --moe-grouped-gemm")
    # from e8e79a43e9 (0.18.0; megatron_behaviour.tsv moe_ffn_hidden_size_needs_experts)
    if experts is None and ns.get("moe_ffn_hidden_size") is not None \
            and _release_rule("moe_ffn_hidden_size_needs_experts", run) == "1":
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


@rule
def moe_dispatch_and_overlap(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__: the flex dispatcher's
    # backends (lines 1747-1786, 1870-1879), shared-expert overlap (1824, 1996), whole-layer MoE
    # recompute (2020), the EP all-to-all overlap (3024-3042) and the wgrad overlaps (3075-3098).
    dispatcher = ns.get("moe_token_dispatcher_type") or "allgather"
    backend = ns.get("moe_flex_dispatcher_backend") or "deepep"
    if ns.get("moe_enable_deepep"):
        if dispatcher == "flex" and backend == "hybridep":     # not flex: deepep-needs-flex (rules.py)
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
              and _release_rule("rank_capacity_hybridep_checked", run) == "1"):      # 2d7060f44f, 0.19.0
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
            # with full recompute moe-overlap-with-full-recompute (rules.py) explains it, with
            # selective the recompute rule does
            if ns.get(dest) is not None and ns.get("recompute_granularity") is None:
                yield Problem("moe-overlap-conflict", raw.location(dest),
                              f"--overlap-moe-expert-parallel-comm cannot be combined with {_flag(dest)}")
        if "moe" in _selective_modules(ns) and _release_rule("moe_overlap_moe_recompute_rejected", run) == "1":
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


def _activation(ns: Namespace) -> str:
    """The MLP activation argument_utils.py core_transformer_config_from_args chooses."""
    if ns.get("swiglu"):
        return "silu"
    if ns.get("squared_relu"):
        return "squared_relu"
    if ns.get("quick_geglu"):
        return "quick_gelu"
    return "gelu"


@rule
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
            and _release_rule("swiglu_clamp_checked", run) == "1":
        where = raw.location("activation_func_clamp_value")
        if not (clamp > 0 and clamp != float("inf")):
            yield Problem("swiglu-clamp", where, f"--activation-func-clamp-value must be finite and above 0 (it is {clamp})")
        if ns.get("num_experts") is None:
            yield Problem("swiglu-clamp", where, "--activation-func-clamp-value for SwiGLU is supported only with MoE (--num-experts)")
        if offset:
            yield Problem("swiglu-clamp", where, "--activation-func-clamp-value needs --glu-linear-offset 0")
        if te_act:
            yield Problem("swiglu-clamp", where, "--activation-func-clamp-value cannot be combined with --use-te-activation-func")


@rule
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


def _graph_modules(ns: Namespace) -> list[str]:
    """--cuda-graph-modules (or the deprecated --cuda-graph-scope) as names; 'full' is none."""
    names = _modules(ns, "cuda_graph_modules") or _modules(ns, "cuda_graph_scope_deprecated")
    return [str(getattr(m, "name", m)) for m in names if str(getattr(m, "name", m)) != "full"]


@rule
def cuda_graph_settings(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (the deprecated switches, asserted there
    # first) and megatron/core/transformer/transformer_config.py __post_init__ (lines
    # 2699-2717, 2794-2849).
    deprecated = [d for d in ("enable_cuda_graph", "external_cuda_graph") if ns.get(d)]
    if deprecated and (ns.get("cuda_graph_impl") or "none") != "none":
        yield Problem("cuda-graph-flags", raw.location(deprecated[0]),
                      f"{_flag(deprecated[0])} is deprecated and cannot be combined with --cuda-graph-impl")
    if len(deprecated) == 2:
        yield Problem("cuda-graph-flags", raw.location("external_cuda_graph"),
                      "--enable-cuda-graph and --external-cuda-graph cannot both be set")
    if _modules(ns, "cuda_graph_scope_deprecated") and _modules(ns, "cuda_graph_modules"):
        yield Problem("cuda-graph-flags", raw.location("cuda_graph_scope_deprecated"),
                      "--cuda-graph-scope (deprecated) cannot be combined with --cuda-graph-modules")
    impl = _cuda_graph_impl(ns)
    if impl == "none":
        return
    modules = _graph_modules(ns)
    where = raw.location("cuda_graph_modules" if raw.given("cuda_graph_modules") else "cuda_graph_scope_deprecated")
    if impl == "full_iteration" and modules:
        yield Problem("cuda-graph-modules", where,
                      "--cuda-graph-modules must be empty with --cuda-graph-impl full_iteration")
    if ns.get("cpu_offloading") and impl != "full_iteration":
        yield Problem("cuda-graph-cpu-offloading", raw.location("cpu_offloading_num_layers"),
                      f"CUDA graphs (--cuda-graph-impl {impl}) are not supported with CPU offloading "
                      "(--cpu-offloading-num-layers); only full_iteration is")
    if impl not in ("local", "transformer_engine") or not modules:
        return
    if impl == "local" and ("moe_router" in modules or "moe_preprocess" in modules):
        modules = sorted(set(modules) | {"moe_router", "moe_preprocess"})   # local captures both
    if "moe" in modules and "moe_router" in modules:
        yield Problem("cuda-graph-modules", where, "--cuda-graph-modules cannot name both moe and moe_router")
    if "moe_preprocess" in modules and "moe_router" not in modules:
        yield Problem("cuda-graph-modules", where, "the moe_preprocess CUDA graph needs moe_router in --cuda-graph-modules")
    experts = _int(ns.get("num_experts"))
    if experts is None or experts <= 1:
        named = [m for m in ("moe", "moe_router") if m in modules]
        if named:
            yield Problem("cuda-graph-modules", where,
                          f"--cuda-graph-modules {' '.join(named)} needs an MoE model (--num-experts)")
        return
    freq = ns.get("moe_layer_freq", 1)
    if "mlp" in modules and (freq == 1 or (isinstance(freq, list) and 0 not in freq)):
        yield Problem("cuda-graph-modules", where,
                      "--cuda-graph-modules mlp needs dense layers, but every layer is MoE (--moe-layer-freq)")
    factor = ns.get("moe_expert_capacity_factor")
    if isinstance(factor, (int, float)) and factor < 0:
        factor = None
    if factor is None or not ns.get("moe_pad_expert_input_to_capacity"):
        if "moe" in modules:
            yield Problem("cuda-graph-modules", where,
                          "the moe CUDA graph needs drop-and-pad MoE (--moe-expert-capacity-factor with "
                          "--moe-pad-expert-input-to-capacity)")
        if ((ns.get("moe_token_dispatcher_type") or "allgather") == "alltoall" and "moe_preprocess" in modules
                and (factor is not None or ns.get("moe_router_padding_for_fp8"))):
            yield Problem("cuda-graph-modules", where,
                          "the moe_preprocess CUDA graph is not supported with the alltoall dispatcher and a capacity "
                          "factor or router padding (the preprocess step copies to the host)")


MOE_INNER_OFFLOADS = ("expert_fc1", "moe_act", "fused_group_mlp")


@rule
def offloading_and_stash(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 2169, 2188, 2191,
    # 2212-2222): fine-grained offloading inside MoE, and the MoE paged stash.
    offload = _modules(ns, "offload_modules") if ns.get("fine_grained_activation_offloading") else []
    where = raw.location("offload_modules")
    if offload:
        inner = [m for m in MOE_INNER_OFFLOADS if m in offload]
        if inner and "moe" in _selective_modules(ns) and _release_rule("offload_inside_moe_recompute_rejected", run) == "1":
            yield Problem("offload-inside-moe-recompute", where,
                          f"offloading {', '.join(inner)} cannot be combined with recomputing the whole MoE layer "
                          "(moe in --recompute-modules)")
        if "fused_group_mlp" in offload and _release_rule("fused_group_mlp_offload_checked", run) == "1":
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


@rule
def grouped_expert_weights(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 1709, 1726-1741)
    weight, bias = ns.get("moe_single_grouped_weight"), ns.get("moe_single_grouped_bias")
    if not (weight or bias):
        return
    where = raw.location("moe_single_grouped_weight" if weight else "moe_single_grouped_bias")
    # main from 883533e049 (megatron_behaviour.tsv single_grouped_needs_grouped_tensor)
    grouped_tensor_checked = _release_rule("single_grouped_needs_grouped_tensor", run) == "1"
    if not ns.get("moe_grouped_gemm"):
        yield Problem("moe-single-grouped", where,
                      "--moe-single-grouped-weight / --moe-single-grouped-bias need --moe-grouped-gemm")
    if weight:
        recipe = ns.get("fp8_recipe") or "delayed"
        if (ns.get("fp8") and recipe != "mxfp8") or (ns.get("fp4") and (ns.get("fp4_recipe") or "nvfp4") != "nvfp4"):
            yield Problem("moe-single-grouped", where,
                          "--moe-single-grouped-weight supports high-precision weights, --fp8-recipe mxfp8 or "
                          "--fp4-recipe nvfp4")
        if ns.get("fp4") and not ns.get("fp4_param_gather") and _release_rule("single_grouped_fp4_needs_param_gather", run) == "1":
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


@rule
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


@rule
def cuda_graphs_with_offloading(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 2940-2968, as from
    # 69c486825c, 0.19.0: megatron_behaviour.tsv local_cuda_graph_offload_modules; the forms of
    # 0.16-0.18 are not mirrored): fine-grained activation offloading under CUDA graphs.
    impl = _cuda_graph_impl(ns)
    if not ns.get("fine_grained_activation_offloading") or impl == "none":
        return
    if _release_rule("local_cuda_graph_offload_modules", run) != "1":
        return
    modules = _graph_modules(ns)
    where = raw.location("cuda_graph_modules" if raw.given("cuda_graph_modules") else "cuda_graph_impl")
    if impl == "local" and not modules:
        yield Problem("cuda-graph-offloading", where,
                      "fine-grained activation offloading with --cuda-graph-impl local needs partial capture "
                      "(--cuda-graph-modules), not whole-layer graphs")
    if "moe" in modules:
        yield Problem("cuda-graph-offloading", where,
                      "the moe CUDA graph (token-drop MoE) is not supported with fine-grained activation offloading")
    steps = _int(ns.get("cuda_graph_warmup_steps"))
    if steps is not None and steps <= 0:
        yield Problem("cuda-graph-offloading", raw.location("cuda_graph_warmup_steps"),
                      f"--cuda-graph-warmup-steps must be above 0 with fine-grained activation offloading (it is {steps})")
    inflight = ns.get("fine_grained_offloading_max_inflight_offloads")
    if impl == "full_iteration" and (_int(inflight) is None or inflight < 0):
        yield Problem("cuda-graph-offloading", raw.location("fine_grained_offloading_max_inflight_offloads"),
                      "fine-grained activation offloading with --cuda-graph-impl full_iteration needs "
                      "--fine-grained-offloading-max-inflight-offloads 0 or more")


@rule
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


@rule
def batch_invariant_mode(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 3212-3268); which of
    # the checks the release makes: megatron_behaviour.tsv batch_invariant_checks.
    if not ns.get("batch_invariant_mode"):
        return
    checks = set(_release_rule("batch_invariant_checks", run).split(","))
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
