"""Megatron's cross-field rules, one small function each.

Every rule takes the derived namespace (``derive.derive_namespace``), the raw input (for
locations), the job's environment and what the run knows beyond its flags (``RunContext``:
the GPU, the launch line) and yields problems.  Each mirrors a check Megatron makes before it trains; the
comment names the file.  Messages state the arithmetic, so the user sees why.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

from megatron_estimator.core.problems import Problem
from megatron_estimator.config.hybrid import pattern_problems, segment_count
from megatron_estimator.config.layout_syntax import LayoutSyntaxError, parse_layout
from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.config.rules_parity import PARITY_RULES
from megatron_estimator.config.run_context import RunContext
from megatron_estimator.inputs.rawargs import RawArgs

Namespace = Mapping[str, Any]
Rule = Callable[[Namespace, RawArgs, Mapping[str, str], RunContext], Iterable[Problem]]
RULES: list[Rule] = []


def rule(func: Rule) -> Rule:
    RULES.append(func)
    return func


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _ints(ns: Namespace, *dests: str) -> bool:
    """True when every dest holds a positive int (otherwise the schema already complained)."""
    for d in dests:
        value = ns.get(d)          # read once (the planner's namespace records each read)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return False
    return True


@rule
def parallel_product(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args; megatron/core/parallel_state.py
    dests = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size", "expert_tensor_parallel_size")
    if not _ints(ns, *dests):
        return
    yield from ParallelDims.check(
        ns["world_size"], ns["tensor_model_parallel_size"], ns["pipeline_model_parallel_size"],
        ns["context_parallel_size"], ns["expert_model_parallel_size"],
        ns["expert_tensor_parallel_size"], raw.location, ns.get("world_size_source", "world size"),
    )


@rule
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
    if _release_rule("query_groups_below_tp", run) == "1":
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


@rule
def sequence_length(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    if not _ints(ns, "seq_length", "max_position_embeddings"):
        return
    s, m = ns["seq_length"], ns["max_position_embeddings"]
    if m < s:
        yield Problem("seq-length-exceeds-positions", raw.location("seq_length"),
                      f"--seq-length {s} exceeds --max-position-embeddings {m}; Megatron requires "
                      "max_position_embeddings >= seq_length")
    cp = ns.get("context_parallel_size")
    if isinstance(cp, int) and cp > 1 and s % (2 * cp):
        yield Problem("seq-length-vs-cp", raw.location("seq_length"),
                      f"--seq-length {s} must be a multiple of 2 x cp = {2 * cp} when context "
                      f"parallel size is {cp} ({s} % {2 * cp} = {s % (2 * cp)})")


@rule
def batch_sizes(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/num_microbatches_calculator.py
    if not _ints(ns, "micro_batch_size", "global_batch_size", "data_parallel_size"):
        return
    mbs, gbs, dp = ns["micro_batch_size"], ns["global_batch_size"], ns["data_parallel_size"]
    if gbs % (mbs * dp):
        yield Problem("global-batch-not-divisible", raw.location("global_batch_size"),
                      f"--global-batch-size {gbs} is not divisible by micro batch ({mbs}) x "
                      f"data parallel ({dp}) = {mbs * dp}")


@rule
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


def _counted_layers(ns: Namespace) -> int:
    return ns["num_layers"] + bool(ns.get("account_for_embedding_in_pipeline_split")) + bool(
        ns.get("account_for_loss_in_pipeline_split"))


@rule
def pipeline_split(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args and transformer_config.py __post_init__ (uneven PP, layout).
    if not _ints(ns, "num_layers", "pipeline_model_parallel_size"):
        return
    if segment_count(ns) > 1:
        return          # a hybrid pattern's '|' segments are the split (hybrid_layer_pattern below)
    p, num_layers = ns["pipeline_model_parallel_size"], ns["num_layers"]
    layout = ns.get("pipeline_model_parallel_layout")
    vpp_flags = [d for d in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                             "pipeline_model_parallel_layout") if ns.get(d) is not None]
    if len(vpp_flags) > 1:
        yield Problem("conflicting-virtual-pipeline-flags", raw.location(vpp_flags[1]),
                      "at most one of " + ", ".join(_flag(d) for d in vpp_flags) + " can be set")
        return
    first, last = ns.get("decoder_first_pipeline_num_layers"), ns.get("decoder_last_pipeline_num_layers")
    accounting = ns.get("account_for_embedding_in_pipeline_split") or ns.get("account_for_loss_in_pipeline_split")
    if layout is not None:
        yield from _layout_problems(ns, raw, layout, p, num_layers)
        for dest in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                     "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
            if ns.get(dest):
                yield Problem("layout-conflict", raw.location(dest),
                              f"{_flag(dest)} cannot be combined with --pipeline-model-parallel-layout")
        return
    vpp = ns.get("virtual_pipeline_model_parallel_size")
    if (first is not None or last is not None) and accounting:
        yield Problem("uneven-split-conflict", raw.location(
            "decoder_first_pipeline_num_layers" if first is not None else "decoder_last_pipeline_num_layers"),
            "--decoder-first/last-pipeline-num-layers cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split")
        return
    if (first is not None or last is not None) and ns.get("num_layers_per_virtual_pipeline_stage") is not None:
        yield Problem("uneven-split-conflict", raw.location("num_layers_per_virtual_pipeline_stage"),
                      "with uneven pipeline stages use --num-virtual-stages-per-pipeline-rank, "
                      "not --num-layers-per-virtual-pipeline-stage")
        return
    if first is not None or last is not None:
        middle_layers = num_layers - (first or 0) - (last or 0)
        middle_stages = p - (first is not None) - (last is not None)
        where = raw.location("decoder_first_pipeline_num_layers" if first is not None
                             else "decoder_last_pipeline_num_layers")
        if middle_stages < 0 or (p == 1):
            yield Problem("uneven-split-invalid", where,
                          f"uneven first/last stages need at least {2 - middle_stages if middle_stages < 0 else 2} pipeline stages; "
                          f"pipeline size is {p}")
            return
        if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
            yield Problem("uneven-split-invalid", where,
                          f"{num_layers} layers - first {first or 0} - last {last or 0} = {middle_layers} "
                          f"middle layers for {middle_stages} middle stages")
            return
        middle_uneven = bool(middle_stages and middle_layers % middle_stages)
        if middle_uneven:
            yield Problem("uneven-split-invalid", where,
                          f"{middle_layers} middle layers do not divide over {middle_stages} middle stages "
                          f"({middle_layers}/{middle_stages} = {middle_layers / middle_stages:g})")
        if vpp:
            for name, count in (("decoder_first_pipeline_num_layers", first),
                                ("decoder_last_pipeline_num_layers", last)):
                if count is not None and count % vpp:
                    yield Problem("uneven-split-vs-vpp", raw.location(name),
                                  f"{_flag(name)} {count} must be divisible by the {vpp} virtual stages per rank")
            if middle_stages and not middle_uneven and (middle_layers // middle_stages) % vpp:
                yield Problem("uneven-split-vs-vpp", raw.location("num_virtual_stages_per_pipeline_rank"),
                              f"{middle_layers // middle_stages} layers per middle stage are not divisible by "
                              f"{vpp} virtual stages per rank")
        return
    counted = _counted_layers(ns)
    extra = ""
    if counted != num_layers:
        extra = f" + {counted - num_layers} (--account-for-embedding/loss-in-pipeline-split) = {counted}"
    if counted % p:
        yield Problem("layers-not-divisible-by-pp", raw.location("num_layers"),
                      f"--num-layers {num_layers}{extra} is not divisible by pp({p}) "
                      f"({counted}/{p} = {counted / p:g}); use --decoder-first/last-pipeline-num-layers "
                      "for an uneven split")
        return
    per_rank = counted // p
    nlpvs = ns.get("num_layers_per_virtual_pipeline_stage")
    if nlpvs is not None and per_rank % nlpvs:
        yield Problem("layers-not-divisible-by-vpp", raw.location("num_layers_per_virtual_pipeline_stage"),
                      f"{per_rank} layers per pipeline stage are not divisible by "
                      f"--num-layers-per-virtual-pipeline-stage {nlpvs}")
    nvspr = ns.get("num_virtual_stages_per_pipeline_rank")
    if nvspr is not None and per_rank % nvspr:
        yield Problem("layers-not-divisible-by-vpp", raw.location("num_virtual_stages_per_pipeline_rank"),
                      f"{per_rank} layers per pipeline stage are not divisible by "
                      f"--num-virtual-stages-per-pipeline-rank {nvspr}")
    if ns.get("account_for_embedding_in_pipeline_split") and vpp is None and per_rank < 1:
        yield Problem("layers-not-divisible-by-pp", raw.location("account_for_embedding_in_pipeline_split"),
                      "not enough layers in the first stage for the embedding")


def _layout_problems(ns: Namespace, raw: RawArgs, layout: str, p: int, num_layers: int) -> Iterator[Problem]:
    # megatron/core/transformer/pipeline_parallel_layer_layout.py
    where = raw.location("pipeline_model_parallel_layout")
    try:
        stages = parse_layout(layout)
    except LayoutSyntaxError as err:
        yield Problem("invalid-layout", where, f"{layout!r} at position {err.position}: {err}")
        return
    if len(stages) % p:
        yield Problem("invalid-layout", where,
                      f"the layout has {len(stages)} stages, not a multiple of pp({p})")
        return
    flat = [c for stage in stages for c in stage]
    mtp = ns.get("mtp_num_layers") or 0
    checks = [
        (flat[:1] == ["E"], "the first layer must be the embedding 'E'"),
        (flat[-1:] == ["L"], "the last layer must be the loss 'L'"),
        (flat.count("E") == 1, f"'E' must appear exactly once (found {flat.count('E')})"),
        (flat.count("L") == 1, f"'L' must appear exactly once (found {flat.count('L')})"),
        (flat.count("t") == num_layers,
         f"the layout has {flat.count('t')} transformer layers 't' but --num-layers is {num_layers}"),
        (flat.count("m") == mtp,
         f"the layout has {flat.count('m')} MTP layers 'm' but --mtp-num-layers is {mtp}"),
    ]
    if "m" in flat:
        checks.append((flat[flat.index("m"):].count("t") == 0, "transformer layers must come before MTP layers"))
    for ok, message in checks:
        if not ok:
            yield Problem("invalid-layout", where, f"{layout!r}: {message}")


@rule
def hybrid_layer_pattern(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args, models/hybrid/hybrid_layer_allocation.py,
    # ssm/mamba_mixer.py (config/hybrid.py)
    yield from pattern_problems(ns, raw.location)


@rule
def virtual_pipeline(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    vpp = ns.get("virtual_pipeline_model_parallel_size")
    p = ns.get("pipeline_model_parallel_size")
    if not vpp or not isinstance(p, int):
        return
    where = raw.location(next((d for d in ("num_layers_per_virtual_pipeline_stage",
                                           "num_virtual_stages_per_pipeline_rank",
                                           "pipeline_model_parallel_layout") if ns.get(d) is not None),
                              "num_virtual_stages_per_pipeline_rank"))
    # arguments.py: the interleaved schedule needs p > 1 (p > 2 without overlapped p2p).
    if ns.get("overlap_p2p_comm", True) and p <= 1:
        yield Problem("vpp-needs-pipeline", where,
                      f"the interleaved schedule ({vpp} virtual stages) needs pipeline size > 1, got {p}")
        return
    if not ns.get("overlap_p2p_comm", True) and p <= 2:
        yield Problem("vpp-needs-pipeline", where,
                      f"the interleaved schedule without overlapped p2p communication needs pipeline "
                      f"size > 2, got {p}")
        return
    # schedules.py forward_backward_pipelining_with_interleaving
    m = ns.get("num_microbatches")
    group = ns.get("microbatch_group_size_per_vp_stage") or p
    if isinstance(m, int):
        group_where = raw.location("microbatch_group_size_per_vp_stage") if raw.given(
            "microbatch_group_size_per_vp_stage") else raw.location("global_batch_size")
        if group > m or group < p:
            yield Problem("interleaved-microbatches", group_where,
                          f"the interleaved schedule needs pp({p}) <= microbatch group size ({group}) <= "
                          f"microbatches ({m}); microbatches = global batch / (micro batch x dp)")
        elif 0 < m % group < p:
            yield Problem("interleaved-microbatches", group_where,
                          f"{m} microbatches leave a final group of {m % group} (< pp {p}) with groups of "
                          f"{group}; Megatron's interleaved schedule rejects that")


@rule
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


@rule
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
            and _release_rule("te_cross_entropy_fusion_rejected", run) == "1"):
        # arguments.py validate_args from 168cb15d70 (0.19.0); legal before (megatron_behaviour.tsv)
        yield Problem("te-cross-entropy-disabled", raw.location("cross_entropy_fusion_impl"),
                      "Megatron disables Transformer Engine's cross entropy fusion; use "
                      "--cross-entropy-fusion-impl native or drop --cross-entropy-loss-fusion")
    if ns.get("use_megatron_fsdp"):
        # arguments.py validate_args from ab43d43f0b (0.18.0; megatron_behaviour.tsv)
        if ns.get("optimizer") not in ("sgd", "adam") and _release_rule("fsdp_optimizer_checked", run) == "1":
            yield Problem("fsdp-optimizer", raw.location("optimizer"),
                          f"Megatron-FSDP supports --optimizer adam or sgd, not {ns.get('optimizer')}")
        if ns.get("ckpt_format") != "fsdp_dtensor":
            yield Problem("fsdp-ckpt-format", raw.location("ckpt_format"),
                          "Megatron-FSDP requires --ckpt-format fsdp_dtensor")


@rule
def distributed_optimizer_instances(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    instances = ns.get("num_distributed_optimizer_instances")
    if not isinstance(instances, int) or isinstance(instances, bool) or instances <= 1:
        return
    where = raw.location("num_distributed_optimizer_instances")
    # megatron/core/distributed/distributed_data_parallel.py: "Partial DistOpt cannot be used
    # without DistOpt".
    if not ns.get("use_distributed_optimizer"):
        yield Problem("dist-opt-instances-need-dist-opt", where,
                      f"--num-distributed-optimizer-instances {instances} needs --use-distributed-optimizer")
    dests = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size")
    if not _ints(ns, "world_size", *dests):
        return
    tp, pp, cp, ep = (ns[d] for d in dests)
    etp = ns.get("expert_tensor_parallel_size") or tp
    if ns["world_size"] % (tp * pp * cp):
        return                                  # parallel_product explains the layout
    # megatron/core/parallel_state.py initialize_model_parallel: the data-parallel group (with
    # CP) splits into equal optimizer instances, and so does the expert data-parallel group.
    dp = ns["world_size"] // (tp * pp * cp)
    if (dp * cp) % instances:
        yield Problem("dist-opt-instances-not-dividing-dp", where,
                      f"dp({dp}) x cp({cp}) = {dp * cp} is not divisible by --num-distributed-optimizer-instances "
                      f"{instances}; Megatron splits the data-parallel group into equal optimizer instances")
    if ns.get("num_experts") and isinstance(etp, int) and etp > 0 and not ns["world_size"] % (etp * ep * pp):
        edp = ns["world_size"] // (etp * ep * pp)
        if edp % instances:
            yield Problem("dist-opt-instances-not-dividing-edp", where,
                          f"the expert data-parallel size world({ns['world_size']}) / (etp({etp}) x ep({ep}) x "
                          f"pp({pp})) = {edp} is not divisible by --num-distributed-optimizer-instances {instances}")


@rule
def features(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    if ns.get("tp_comm_overlap") and not ns.get("sequence_parallel"):
        yield Problem("tp-comm-overlap-needs-sp", raw.location("tp_comm_overlap"),
                      "--tp-comm-overlap needs --sequence-parallel (and tensor parallel size > 1)")
    if ns.get("multi_latent_attention") and ns.get("group_query_attention") \
            and _release_rule("mla_gqa_rejected", run) == "1":
        # arguments.py validate_args from dd546099fa (0.16.1; megatron_behaviour.tsv)
        yield Problem("mla-with-gqa", raw.location("group_query_attention"),
                      "--group-query-attention cannot be combined with --multi-latent-attention")
    if ns.get("mtp_num_layers") and ns.get("position_embedding_type") not in ("rope", "none", "yarn"):
        yield Problem("mtp-position-embedding", raw.location("mtp_num_layers"),
                      f"multi-token prediction needs --position-embedding-type rope or none, not "
                      f"{ns.get('position_embedding_type')}")
    if ns.get("attention_backend") == "local" and (ns.get("spec") or [None])[0] != "local":
        yield Problem("attention-backend-local-needs-spec", raw.location("attention_backend"),
                      "--attention-backend local is only supported with --spec local")
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
    if ns.get("hybrid_context_parallel") and ns.get("pipeline_model_parallel_size", 1) > 1:
        yield Problem("hybrid-cp-with-pp", raw.location("hybrid_context_parallel"),
                      "hybrid context parallelism does not support pipeline parallelism")
    if not ns.get("add_position_embedding", True) and ns.get("position_embedding_type") != "rope":
        yield Problem("deprecated-flag", raw.location("add_position_embedding"),
                      "--no-position-embedding is deprecated; use --position-embedding-type")


@rule
def deprecated(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args: removed flags that Megatron rejects.
    replacements = {
        "batch_size": "--micro-batch-size",
        "warmup": "--lr-warmup-fraction",
        "model_parallel_size": "--tensor-model-parallel-size",
        "checkpoint_activations": "--recompute-activations or --recompute-granularity",
    }
    for dest, replacement in replacements.items():
        if raw.given(dest) and ns.get(dest) not in (None, False):
            yield Problem("deprecated-flag", raw.location(dest),
                          f"{_flag(dest)} is no longer valid; use {replacement}")


@rule
def training_schedule(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args: learning rate and iteration-vs-sample training.
    lr, min_lr = ns.get("lr"), ns.get("min_lr")
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and min_lr > lr:
        yield Problem("min-lr-exceeds-lr", raw.location("min_lr"), f"--min-lr {min_lr} exceeds --lr {lr}")
    if ns.get("train_iters") and ns.get("train_samples"):
        yield Problem("iters-and-samples", raw.location("train_samples"),
                      "--train-iters and --train-samples cannot both be set")
    if ns.get("save") is not None and not ns.get("save_interval"):
        yield Problem("save-needs-interval", raw.location("save"), "--save needs a positive --save-interval")
    sources = [d for d in ("mock_data", "data_path") if ns.get(d)]
    if len(sources) > 1:
        yield Problem("multiple-data-sources", raw.location("mock_data"),
                      "--mock-data and --data-path cannot both be set")


@rule
def environment(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/models/common/language_module/language_module.py _set_attention_backend
    if ns.get("transformer_impl") != "transformer_engine":
        return
    backend = ns.get("attention_backend", "auto")
    expected = {
        "local": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
        "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
        "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
        "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
        "auto": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "1"},
    }.get(backend, {})
    for var, value in expected.items():
        if var in env and env[var] != value:
            yield Problem("attention-backend-env-conflict", raw.location("attention_backend"),
                          f"{var}={env[var]} in the environment conflicts with --attention-backend {backend} "
                          f"(Megatron expects {var}={value} and stops); unset it or choose the matching "
                          "--attention-backend")


@rule
def moe_features(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    yield from _moe_overlap(ns, raw)        # transformer_config.py asserts it for dense models too
    if not ns.get("num_experts"):
        return
    # megatron/core/transformer/moe/moe_layer.py: training MoE with TP needs sequence parallel
    # (every release).  With expert parallel > 1 as well, megatron/core/model_parallel_config.py
    # raises as soon as the model configuration is built in 0.14 and only warns from 0532e92748
    # (#3678, 0.15): megatron_behaviour.tsv moe_ep_tp_without_sp.
    if (ns.get("tensor_model_parallel_size") or 1) > 1 and not ns.get("sequence_parallel"):
        early = (ns.get("expert_model_parallel_size") or 1) > 1 and _release_rule("moe_ep_tp_without_sp", run) == "error"
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


OFFLOAD_MODULES = {"core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act", "attn_norm",
                   "mlp_norm", "qkv_linear", "gdp_qkv"}


@rule
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


@rule
def device_connections(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 lines 1453-1478): before Blackwell, TP or CP asserts
    # CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-FSDP / torch FSDP2 / the MoE expert-parallel overlap
    # only warn).  Without a named GPU the run's assumed generation stands in, and is said.
    arch = run.gpu_compute_capability
    assumed = arch is None
    arch = run.assumed_compute_capability if assumed else arch
    if arch is None or (ns.get("tensor_model_parallel_size") or 1) <= 1 and (ns.get("context_parallel_size") or 1) <= 1:
        return
    if ns.get("use_megatron_fsdp") or ns.get("use_torch_fsdp2") or ns.get("overlap_moe_expert_parallel_comm"):
        return
    gpu = f"compute capability {arch:g}" + (", assumed: no --gpu named" if assumed else "")
    if arch >= 10 or env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        if assumed:
            yield Problem("gpu-generation-assumed", "--gpu",
                          f"GPU generation: no --gpu named; the CUDA_DEVICE_MAX_CONNECTIONS rule of tensor / context "
                          f"parallelism assumed compute capability {arch:g} (it applies before Blackwell, 10)")
    else:
        launch = run.launch_location      # a script's launch line, where its environment applies
        yield Problem("cuda-device-max-connections",
                      f"{launch} CUDA_DEVICE_MAX_CONNECTIONS" if launch else "CUDA_DEVICE_MAX_CONNECTIONS",
                      f"tensor or context parallelism on this GPU ({gpu}) needs CUDA_DEVICE_MAX_CONNECTIONS=1 in "
                      f"the environment; Megatron stops otherwise (it is {env.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')})")


@rule
def fsdp_device_connections(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (main d98e8a64): Megatron-FSDP and torch
    # FSDP2 assert CUDA_DEVICE_MAX_CONNECTIONS is not "1", on every GPU generation.
    fsdp = next((d for d in ("use_megatron_fsdp", "use_torch_fsdp2") if ns.get(d)), None)
    if fsdp is None or env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return
    launch = run.launch_location
    yield Problem("fsdp-cuda-device-max-connections",
                  f"{launch} CUDA_DEVICE_MAX_CONNECTIONS" if launch else "CUDA_DEVICE_MAX_CONNECTIONS",
                  f"{_flag(fsdp)} needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1; the environment sets "
                  "it to 1 and Megatron stops")


@rule
def mla_qk_norm(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # What MLA's q / kv norm placement refuses (--multi-latent-attention, or a hybrid pattern
    # with '+' / 'D' layers, which sets it).
    if not ns.get("multi_latent_attention"):
        return
    pattern = ns.get("hybrid_pattern_unified")
    hybrid = isinstance(pattern, str)
    resolved = _release_rule("mla_qk_norm_resolved", run) == "1"
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


@rule
def step_batch_size_schedule(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (main d98e8a64): a step batch-size schedule
    # and an explicit --global-batch-size cannot both be given (ValueError).
    if ns.get("step_batch_size_schedule") is not None and raw.given("global_batch_size") \
            and ns.get("global_batch_size") is not None:
        yield Problem("step-schedule-with-global-batch", raw.location("global_batch_size"),
                      "--global-batch-size cannot be combined with --step-batch-size-schedule "
                      "(the schedule sets the global batch size)")


# The rules whose content depends on the release (config/release_rules.py), after these.
from megatron_estimator.config.release_rules import RELEASE_RULES  # noqa: E402

RULES.extend(RELEASE_RULES)


def check_rules(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext = RunContext()) -> list[Problem]:
    problems: list[Problem] = []
    for check in RULES:
        problems.extend(check(ns, raw, env, run))
    return problems


def _release_rule(rule: str, run: RunContext) -> str:
    """The run's Megatron release's value for ``rule`` (data/megatron_behaviour.tsv)."""
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule, run.release)


# The checks the differential harness found missing (scripts/megatron_validate), kept apart.
RULES.extend(PARITY_RULES)
# The model-build, wrap and validate_args checks issue 29's independent run found (rules_build.py).
from megatron_estimator.config.rules_build import BUILD_RULES  # noqa: E402

RULES.extend(BUILD_RULES)
