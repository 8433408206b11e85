"""Megatron's refusals that an independent differential run found unmirrored (issue 29).

Most stop a job after validate_args: when the model is built (the local spec's norms and
attention, the MLP's tensor-parallel split), when it is wrapped (Megatron-FSDP) or at the first
training step (MTP recompute); the rest are validate_args asserts (torch FSDP2, CUDA graphs,
context-parallel communication).  Each has the signature of a ``rules.py`` rule and is listed in
``BUILD_RULES``, which ``rules.py`` appends to its ``RULES``; each cites the Megatron file and
line it mirrors and the releases where it holds (labels of ``data/megatron_releases.tsv``);
release-dependent ones read ``data/megatron_behaviour.tsv``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs

Namespace = Mapping[str, Any]
BUILD_RULES: list[Callable[[Namespace, RawArgs, Mapping[str, str], RunContext], Iterable[Problem]]] = []


def rule(func):
    BUILD_RULES.append(func)
    return func


def _size(ns: Namespace, dest: str) -> int:
    value = ns.get(dest)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _behaviour(rule_name: str, run: RunContext) -> str:
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule_name, run.release)


@rule
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


@rule
def local_attention_context_parallel(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/dot_product_attention.py DotProductAttention.__init__ asserts
    # context_parallel_size == 1 (core_v0.14.0 line 53, core_v0.15.3 ... d98e8a64 line 58; every
    # release 0.14.0-main): only TEDotProductAttention does context parallelism.
    cp = _size(ns, "context_parallel_size")
    if ns.get("transformer_impl") == "local" and cp > 1:
        yield Problem("local-attention-with-cp", raw.location("context_parallel_size"),
                      f"--context-parallel-size {cp} needs --transformer-impl transformer_engine: the local "
                      "attention (megatron/core/transformer/dot_product_attention.py) refuses context parallelism")


# megatron/training/arguments.py validate_args, `if args.use_torch_fsdp2:` (core_v0.14.0 lines
# 570-582, core_v0.16.1 608-620, d98e8a64 1033-1047; every release 0.14.0-main); the
# CUDA_DEVICE_MAX_CONNECTIONS assert after them is rules.py fsdp_device_connections.
_FSDP2_ASSERTS = (
    ("pipeline_model_parallel_size", lambda v: _int_above_one(v), "pipeline parallelism"),
    ("expert_model_parallel_size", lambda v: _int_above_one(v), "expert parallelism"),
    ("use_distributed_optimizer", bool, "the distributed optimizer (--use-distributed-optimizer)"),
    ("gradient_accumulation_fusion", bool,
     "gradient-accumulation fusion (on by default: add --no-gradient-accumulation-fusion)"),
    ("ckpt_format", lambda v: v not in ("torch_dist", "torch_dcp"),
     "this --ckpt-format (it needs torch_dist or torch_dcp)"),
    ("untie_embeddings_and_output_weights", lambda v: not v,
     "tied embeddings (it needs --untie-embeddings-and-output-weights)"),
    ("fp16", bool, "--fp16"),
)


def _int_above_one(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


@rule
def torch_fsdp2(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    if not ns.get("use_torch_fsdp2"):
        return
    for dest, refused, what in _FSDP2_ASSERTS:
        if refused(ns.get(dest)):
            where = raw.location(dest) if raw.given(dest) else raw.location("use_torch_fsdp2")
            yield Problem("torch-fsdp2-conflict", where,
                          f"--use-torch-fsdp2 is not supported with {what} (megatron/training/arguments.py)")


@rule
def megatron_fsdp_pipeline(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/distributed/fsdp/mcore_fsdp_adapter.py _get_dp_tp_mesh / _get_hsdp_tp_mesh
    # lay torch.arange(world_size) out as (dp_cp [ep] tp) with no pipeline dimension
    # (core_v0.14.0 line 283, d98e8a64 lines 826-832; every release 0.14.0-main), so the wrap
    # fails (einops / the mesh-vs-group assert) when pipeline parallelism makes the world larger.
    pp = _size(ns, "pipeline_model_parallel_size")
    if ns.get("use_megatron_fsdp") and pp > 1:
        yield Problem("megatron-fsdp-with-pp", raw.location("pipeline_model_parallel_size"),
                      f"--use-megatron-fsdp does not support pipeline parallelism (pp {pp}): Megatron-FSDP's "
                      "device mesh has no pipeline dimension and the model wrap fails "
                      "(megatron/core/distributed/fsdp/mcore_fsdp_adapter.py)")


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


@rule
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
    if ns.get("inference_dynamic_batching") and _behaviour("full_iteration_graph_nan_check_exempts_inference", run) == "1":
        return
    where = "cuda_graph_impl" if raw.given("cuda_graph_impl") else (
        "cuda_graph_scope" if raw.given("cuda_graph_scope") else "enable_cuda_graph")
    yield Problem("full-iteration-graph-nan-check", raw.location(where),
                  "a full-iteration CUDA graph needs --no-check-for-nan-in-loss-and-grad "
                  "(megatron/training/arguments.py validate_args)")


@rule
def cp_a2a_p2p_hierarchy(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (core_v0.14.0 lines 391-393, d98e8a64 lines
    # 583-585; every release 0.14.0-main, whatever the context-parallel size).
    types = ns.get("cp_comm_type")
    types = types if isinstance(types, (list, tuple)) else [types]
    if "a2a+p2p" in types and ns.get("hierarchical_context_parallel_sizes") is None:
        yield Problem("cp-a2a-p2p-needs-hierarchy", raw.location("cp_comm_type"),
                      "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes")


def _has_dense_mlp(ns: Namespace) -> bool:
    """Whether some decoder layer has a dense MLP of --ffn-hidden-size."""
    pattern = ns.get("hybrid_pattern_unified")
    if isinstance(pattern, str):
        return "-" in pattern
    if not ns.get("num_experts"):
        return True
    freq = ns.get("moe_layer_freq", 1)
    if isinstance(freq, (list, tuple)):
        return 0 in freq
    return isinstance(freq, int) and freq > 1


@rule
def ffn_hidden_size_vs_tp(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/transformer/mlp.py builds linear_fc2 as a RowParallelLinear of input
    # --ffn-hidden-size, which megatron/core/tensor_parallel/layers.py splits with
    # megatron/core/utils.py divide (ensure_divisibility asserts; d98e8a64 line 592): a model
    # build failure in every release 0.14.0-main.
    ffn, tp = ns.get("ffn_hidden_size"), _size(ns, "tensor_model_parallel_size")
    if not isinstance(ffn, int) or isinstance(ffn, bool) or ffn <= 0 or tp <= 1 or ffn % tp == 0:
        return
    if not _has_dense_mlp(ns):
        return
    where = raw.location("ffn_hidden_size" if raw.given("ffn_hidden_size") else "tensor_model_parallel_size")
    yield Problem("ffn-hidden-size-vs-tp", where,
                  f"--ffn-hidden-size {ffn} is not divisible by tp({tp}) ({ffn}/{tp} = {ffn / tp:g}): the dense "
                  "MLP's tensor-parallel linear layers split it evenly (megatron/core/utils.py divide)")


@rule
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
