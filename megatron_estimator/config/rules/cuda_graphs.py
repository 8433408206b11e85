"""CUDA graphs: the implementation, captured modules, and what they cannot capture.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _cuda_graph_impl, _flag, _graph_modules, _int, _modules, release_behaviour


def cuda_graph_full_recompute(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from 2b343d739f, 0.16):
    # with CUDA graphs, full recompute is only supported by --cuda-graph-impl full_iteration.
    impl = _cuda_graph_impl(ns)
    if impl in ("none", "full_iteration") or ns.get("recompute_granularity") != "full":
        return
    if release_behaviour("cuda_graph_full_recompute_rejected", run) != "1":
        return
    yield Problem("cuda-graph-full-recompute", raw.location("recompute_granularity"),
                  f"--recompute-granularity full with CUDA graphs (--cuda-graph-impl {impl}) is refused: full "
                  "recompute needs --cuda-graph-impl full_iteration")


def cuda_graph_nccl_graph_register(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (from 2b343d739f, 0.16): TE CUDA graphs with
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True need NCCL_GRAPH_REGISTER=0.
    if _cuda_graph_impl(ns) != "transformer_engine":
        return
    if "expandable_segments:True" not in env.get("PYTORCH_CUDA_ALLOC_CONF", "") or env.get("NCCL_GRAPH_REGISTER", "") == "0":
        return
    if release_behaviour("cuda_graph_nccl_graph_register", run) != "1":
        return
    launch = run.launch_location
    yield Problem("cuda-graph-nccl-graph-register",
                  f"{launch} NCCL_GRAPH_REGISTER" if launch else "NCCL_GRAPH_REGISTER",
                  "Transformer Engine CUDA graphs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True need "
                  f"NCCL_GRAPH_REGISTER=0 in the environment (it is {env.get('NCCL_GRAPH_REGISTER', 'unset')}); "
                  "Megatron stops otherwise")


LOCAL_GRAPH_OFFLOAD_MODULES = ("expert_fc1", "moe_act", "fused_group_mlp")


def offloading_with_local_cuda_graphs(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (from 69c486825c, #3697,
    # 0.19): fine-grained activation offloading with --cuda-graph-impl local offloads only the
    # modules that local CUDA graphs can capture.
    if not ns.get("fine_grained_activation_offloading") or _cuda_graph_impl(ns) != "local":
        return
    if release_behaviour("local_cuda_graph_offload_modules", run) != "1":
        return
    unsupported = sorted(set(ns.get("offload_modules") or []) - set(LOCAL_GRAPH_OFFLOAD_MODULES))
    if unsupported:
        yield Problem("offload-modules-with-local-cuda-graphs", raw.location("offload_modules"),
                      f"with --cuda-graph-impl local, fine-grained activation offloading supports only "
                      f"--offload-modules {', '.join(LOCAL_GRAPH_OFFLOAD_MODULES)}; not {', '.join(unsupported)}")


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


def cuda_graphs_with_offloading(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/transformer_config.py __post_init__ (lines 2940-2968, as from
    # 69c486825c, 0.19.0: megatron_behaviour.tsv local_cuda_graph_offload_modules; the forms of
    # 0.16-0.18 are not mirrored): fine-grained activation offloading under CUDA graphs.
    impl = _cuda_graph_impl(ns)
    if not ns.get("fine_grained_activation_offloading") or impl == "none":
        return
    if release_behaviour("local_cuda_graph_offload_modules", run) != "1":
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


def _full_iteration_graph(ns: Namespace) -> bool:
    """A full-iteration CUDA graph: --cuda-graph-impl full_iteration (0.18.0 on), or a local
    graph (--cuda-graph-impl local, or the deprecated --enable-cuda-graph) with the
    full_iteration scope (0.14.0-0.17.x spelling)."""
    impl = ns.get("cuda_graph_impl") or "none"
    if impl == "full_iteration":
        return True
    scope = ns.get("cuda_graph_scope")
    scopes = scope if isinstance(scope, (list, tuple)) else [scope]
    names = {str(getattr(s, "name", s)) for s in scopes}
    return (impl == "local" or bool(ns.get("enable_cuda_graph"))) and "full_iteration" in names


def full_iteration_graph_nan_check(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args: a full-iteration CUDA graph asserts
    # --no-check-for-nan-in-loss-and-grad (core_v0.14.0 lines 669-671, d98e8a64 lines 1235-1237;
    # every release 0.14.0-main; 0.15.x-0.16.x skip it under --inference-dynamic-batching:
    # megatron_behaviour.tsv full_iteration_graph_nan_check_exempts_inference).  Before it, fp16
    # with dynamic loss scaling (no --loss-scale) turns the NaN check off (core_v0.14.0 line 649,
    # d98e8a64 lines 1195-1201), so the assert passes there.
    if not _full_iteration_graph(ns) or not ns.get("check_for_nan_in_loss_and_grad", True):
        return
    if ns.get("fp16") and not ns.get("loss_scale"):
        return
    if ns.get("inference_dynamic_batching") and release_behaviour("full_iteration_graph_nan_check_exempts_inference", run) == "1":
        return
    where = "cuda_graph_impl" if raw.given("cuda_graph_impl") else (
        "cuda_graph_scope" if raw.given("cuda_graph_scope") else "enable_cuda_graph")
    yield Problem("full-iteration-graph-nan-check", raw.location(where),
                  "a full-iteration CUDA graph needs --no-check-for-nan-in-loss-and-grad "
                  "(megatron/training/arguments.py validate_args)")
