"""Fully sharded data parallelism: torch FSDP2 and Megatron-FSDP.

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _size


# megatron/training/arguments.py validate_args, `if args.use_torch_fsdp2:` (core_v0.14.0 lines
# 570-582, core_v0.16.1 608-620, d98e8a64 1033-1047; every release 0.14.0-main); the
# CUDA_DEVICE_MAX_CONNECTIONS assert after them is environment.py fsdp_device_connections.
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


def torch_fsdp2(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    if not ns.get("use_torch_fsdp2"):
        return
    for dest, refused, what in _FSDP2_ASSERTS:
        if refused(ns.get(dest)):
            where = raw.location(dest) if raw.given(dest) else raw.location("use_torch_fsdp2")
            yield Problem("torch-fsdp2-conflict", where,
                          f"--use-torch-fsdp2 is not supported with {what} (megatron/training/arguments.py)")


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


def fsdp_manual_registration(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args `if args.fsdp_manual_registration:`
    # (core_v0.16.1 lines 693-695, d98e8a64 lines 1189-1191; the flag exists from 0.16.x)
    if not ns.get("fsdp_manual_registration"):
        return
    for dest, what in (("use_megatron_fsdp", "--use-megatron-fsdp"), ("nccl_ub", "--use-nccl-ub")):
        if not ns.get(dest):
            yield Problem("fsdp-manual-registration", raw.location("fsdp_manual_registration"),
                          f"--fsdp-manual-registration needs {what}")


def checkpoint_format(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args, the torch_dcp and fsdp_dtensor checkpoint
    # format checks (core_v0.14.0 lines 969-978, d98e8a64 lines 1667-1677; every release 0.14.0-main)
    fmt = ns.get("ckpt_format")
    where = raw.location("ckpt_format")
    if fmt == "torch_dcp":
        for refused, what in ((not ns.get("use_torch_fsdp2"), "needs --use-torch-fsdp2"),
                              (_size(ns, "tensor_model_parallel_size") > 1, "is not supported with tensor parallelism"),
                              (_size(ns, "pipeline_model_parallel_size") > 1,
                               "is not supported with pipeline parallelism")):
            if refused:
                yield Problem("ckpt-format-conflict", where, f"--ckpt-format torch_dcp {what}")
    elif fmt == "fsdp_dtensor" and not ns.get("use_megatron_fsdp"):
        yield Problem("ckpt-format-conflict", where, "--ckpt-format fsdp_dtensor needs --use-megatron-fsdp")
