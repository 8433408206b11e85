"""Megatron's checks that the differential harness found missing (issue 12).

``scripts/megatron_validate`` runs Megatron-LM's own parse_args, validate_args, the
TransformerConfig ``__post_init__`` and a meta-device model build over the CI command lines
and their mutations; each rule here mirrors a refusal it found that no rule of ``rules.py``
made.  Each has the signature of a ``rules.py`` rule and is listed in ``PARITY_RULES``, which
``rules.py`` appends to its ``RULES``; release-dependent ones read ``data/megatron_behaviour.tsv``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Iterator, Mapping

    Namespace = Mapping[str, Any]

from megatron_estimator.core.problems import Problem
from megatron_estimator.config.run_context import RunContext
from megatron_estimator.inputs.rawargs import RawArgs

PARITY_RULES: list[Callable[[Namespace, RawArgs, Mapping[str, str], RunContext], Iterable[Problem]]] = []


def rule(func):
    PARITY_RULES.append(func)
    return func


def _release_rule(rule_name: str) -> str:
    """The chosen Megatron release's value for ``rule_name`` (data/megatron_behaviour.tsv)."""
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule_name)


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
    if _release_rule("moe_bias_needs_etp1") != "1":
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
    if _release_rule("cuda_graph_full_recompute_rejected") != "1":
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
    if _release_rule("cuda_graph_nccl_graph_register") != "1":
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
    if _release_rule("local_cuda_graph_offload_modules") != "1":
        return
    unsupported = sorted(set(ns.get("offload_modules") or []) - set(LOCAL_GRAPH_OFFLOAD_MODULES))
    if unsupported:
        yield Problem("offload-modules-with-local-cuda-graphs", raw.location("offload_modules"),
                      f"with --cuda-graph-impl local, fine-grained activation offloading supports only "
                      f"--offload-modules {', '.join(LOCAL_GRAPH_OFFLOAD_MODULES)}; not {', '.join(unsupported)}")
