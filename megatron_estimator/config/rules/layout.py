"""The parallel layout: the product of the parallel sizes, the sequence and context-parallel split,
the distributed optimizer's instances, tensor-parallel splits of weights and FFN, context-parallel
communication.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _flag, _int, _ints, _size


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


def tp_comm_overlap_needs_sp(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 lines 1441-1442)
    if ns.get("tp_comm_overlap") and not ns.get("sequence_parallel"):
        yield Problem("tp-comm-overlap-needs-sp", raw.location("tp_comm_overlap"),
                      "--tp-comm-overlap needs --sequence-parallel (and tensor parallel size > 1)")


def hybrid_cp_with_pp(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 lines 1444-1445)
    if ns.get("hybrid_context_parallel") and ns.get("pipeline_model_parallel_size", 1) > 1:
        yield Problem("hybrid-cp-with-pp", raw.location("hybrid_context_parallel"),
                      "hybrid context parallelism does not support pipeline parallelism")


def tp_pp_dp_mapping_expert_dp(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/parallel_state.py initialize_model_parallel (core_v0.14.0 lines 719-723,
    # d98e8a64 lines 898-902; every release 0.14.0-main): an order that does not end in pp
    # (--use-tp-pp-dp-mapping: tp-cp-ep-pp-dp) with pp > 1 asserts expert DP == DP, i.e. with
    # the same pp: etp x ep == tp x cp.
    if not ns.get("use_tp_pp_dp_mapping") or _size(ns, "pipeline_model_parallel_size") == 1:
        return
    tp, cp, ep = (_size(ns, d) for d in ("tensor_model_parallel_size", "context_parallel_size",
                                         "expert_model_parallel_size"))
    etp = _int(ns.get("expert_tensor_parallel_size")) or tp
    if etp * ep != tp * cp:
        yield Problem("tp-pp-dp-mapping-expert-dp", raw.location("use_tp_pp_dp_mapping"),
                      f"--use-tp-pp-dp-mapping with pipeline parallelism needs the expert layers' data-parallel "
                      f"size to equal the attention layers': etp({etp}) x ep({ep}) = {etp * ep} must equal "
                      f"tp({tp}) x cp({cp}) = {tp * cp} (megatron/core/parallel_state.py)")
