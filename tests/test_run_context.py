"""The typed configuration and what the run knows beyond its flags (config/run_context.py),
the one copy of validate_args' optimizer sharding (config/derive.py), and the assumption
sentences the report says from the model's facts (report/assumptions.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from megatron_estimator.config.derive import optimizer_sharding, shards_optimizer_states
from megatron_estimator.config.resolve import resolve_config
from megatron_estimator.config.rules import check_rules, device_connections
from megatron_estimator.config.run_context import Resume, RunContext
from megatron_estimator.config.typed import EstimatorConfig, with_distributed_optimizer
from megatron_estimator.core.units import GiB, MiB
from megatron_estimator.inputs.argv import parse_megatron_argv
from megatron_estimator.model.parameters import chunk_tensors
from megatron_estimator.model.layout import pipeline_stages
from megatron_estimator.report.assumptions import size, state
from megatron_estimator.results.estimate import Assumed

from conftest import TINY_GPT, flags, resolve

MODEL = Path(__file__).resolve().parent.parent / "megatron_estimator" / "model"


def test_the_typed_configuration_holds_no_raw_namespace():
    names = {f.name for f in dataclasses.fields(EstimatorConfig)}
    assert "namespace" not in names and "run" in names
    config = resolve(TINY_GPT)
    assert not hasattr(config, "namespace")
    assert isinstance(config.run, RunContext)


def test_the_memory_model_reads_no_raw_keys():
    # model/ reads typed fields only: no namespace, no underscore side-channel keys.
    for path in sorted(MODEL.glob("*.py")):
        text = path.read_text()
        assert ".namespace" not in text, path.name
        assert not re.search(r"""\.get\(["']_""", text), path.name


def test_the_run_context_defaults_are_a_fresh_run_on_an_unnamed_gpu():
    run = RunContext()
    assert (run.gpu_compute_capability, run.flash_attn, run.job_environment, run.launch_location) == (
        None, None, False, None)
    assert run.resume == Resume("no", None, None) and not run.resume.resumes


def test_resume_resumes_as_asked_or_as_found():
    assert Resume("yes", "/ckpt").resumes
    assert not Resume("yes", None).resumes                       # nothing to load
    assert not Resume("no", "/ckpt", "latest_checkpointed_iteration.txt").resumes
    assert Resume("auto", "/ckpt", "iter_0000050").resumes
    assert not Resume("auto", "/ckpt", None).resumes


def _raw(text: str):
    raw, problems = parse_megatron_argv(flags(text))
    assert not problems, problems
    return raw


def test_rules_get_the_gpu_and_the_launch_line_as_a_parameter():
    # megatron/training/arguments.py validate_args: before Blackwell (compute capability 10),
    # tensor parallelism needs CUDA_DEVICE_MAX_CONNECTIONS=1.
    config = resolve(TINY_GPT, world_size=2, extra="--tensor-model-parallel-size 2")
    raw = _raw(TINY_GPT + " --tensor-model-parallel-size 2")
    ns = {"tensor_model_parallel_size": 2, "context_parallel_size": 1}
    hopper = RunContext(gpu_compute_capability=9.0, launch_location="train.sh:7")
    [problem] = device_connections(ns, raw, {}, hopper)
    assert problem.code == "cuda-device-max-connections"
    assert problem.location == "train.sh:7 CUDA_DEVICE_MAX_CONNECTIONS"
    assert "compute capability 9)" in problem.message and "(it is unset)" in problem.message
    assert list(device_connections(ns, raw, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, hopper)) == []
    assert list(device_connections(ns, raw, {}, RunContext(gpu_compute_capability=10.0))) == []
    assert list(device_connections(ns, raw, {}, RunContext())) == []          # GPU not named
    # check_rules passes the run context to every rule; without one the GPU is unknown.
    assert config.run.gpu_compute_capability is None
    assert "cuda-device-max-connections" not in {p.code for p in check_rules({**ns, "world_size": 2}, raw, {})}


def test_resolve_puts_the_run_facts_on_the_configuration():
    config = resolve_config(_raw(TINY_GPT + " --load /ckpt"), world_size=1, environ={}, compute_capability=8.0,
                            flash_attn="none", resume="yes", launch_location="run.sh:3")
    assert config.run == RunContext(gpu_compute_capability=8.0, flash_attn="none",
                                    resume=Resume("yes", "/ckpt", None), job_environment=False,
                                    launch_location="run.sh:3")


def test_optimizer_sharding_as_validate_args_sets_it():
    # megatron/training/arguments.py: emerging optimizers (neither adam nor sgd) asked for the
    # distributed optimizer run the layer-wise distributed optimizer instead.
    assert optimizer_sharding("adam", True) == (True, False)
    assert optimizer_sharding("sgd", True) == (True, False)
    assert optimizer_sharding("adam", False) == (False, False)
    assert optimizer_sharding("muon", True) == (False, True)
    assert optimizer_sharding("muon", False) == (False, False)


def test_the_typed_optimizer_is_the_derived_one():
    muon = resolve(TINY_GPT, extra="--optimizer muon --use-distributed-optimizer")
    assert (muon.optimizer.use_distributed_optimizer, muon.optimizer.use_layer_wise_distributed_optimizer) == (
        False, True)
    dist_muon = resolve(TINY_GPT, extra="--optimizer dist_muon")
    assert dist_muon.optimizer.optimizer == "muon" and dist_muon.optimizer.use_layer_wise_distributed_optimizer
    assert shards_optimizer_states({"use_layer_wise_distributed_optimizer": True})
    assert not shards_optimizer_states({"use_distributed_optimizer": False})
    # The planner's switch applies the same rule to a built configuration.
    off = with_distributed_optimizer(muon, False).optimizer
    assert (off.use_distributed_optimizer, off.use_layer_wise_distributed_optimizer) == (False, False)
    adam = resolve(TINY_GPT)
    on = with_distributed_optimizer(adam, True).optimizer
    assert (on.use_distributed_optimizer, on.use_layer_wise_distributed_optimizer) == (True, False)
    assert with_distributed_optimizer(adam, False) is adam


def test_typed_fields_carry_the_flags_the_model_reads():
    config = resolve(TINY_GPT, extra="--fp8-format hybrid --fp8-amax-history-len 16 --wgrad-deferral-limit 3 "
                                     "--no-create-attention-mask-in-dataloader --attention-output-gate")
    assert config.precision.fp8_amax_history_len == 16
    assert config.training.wgrad_deferral_limit == 3
    assert not config.training.create_attention_mask_in_dataloader
    assert config.optimizer.sgd_momentum == 0.9                 # Megatron's --sgd-momentum default
    # --attention-output-gate: a gate of a x d beside Q, K, V in linear_qkv (h = 64, a = g = 4,
    # d = 16): (4 + 2 x 4) x 16 + 4 x 16 = 256 outputs.
    stage = pipeline_stages(config)[0]
    [qkv] = [t for t in chunk_tensors(config, stage.chunks[0]) if t.name == "decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.numel == 64 * 256


def test_assumption_sentences_from_facts():
    assert size(2_253_568) == "2.1 MiB"                       # 2,253,568 / 2^20 = 2.149
    assert size(3 * GiB // 2) == "1.50 GiB"
    assert state(Assumed("cuda_context", 512 * MiB)).text == "CUDA context 512 MiB per GPU, outside the allocator"
    nccl = state(Assumed("nccl_buffers", 256 * MiB, {"communicators": ()}))
    assert (nccl.key, nccl.text, nccl.value) == ("nccl_buffers", "NCCL buffers 256 MiB per communicator (none)",
                                                 256 * MiB)
    assert state(Assumed("fragmentation", 0.05)).text == "allocator fragmentation 5% of allocated memory"
    assert state(Assumed("routing", 0.3)).text == (
        "MoE routing imbalance: every stage is estimated for its busiest expert rank, whose experts receive "
        "30% more than the even share of routed tokens (--routing-imbalance; the routed-token activations "
        "grow with it, within the capacity factor)")
    overlap = state(Assumed("tp_comm_overlap"))
    assert overlap.key == "not_modelled" and overlap.text.startswith("--tp-comm-overlap: ")
    # :4096:8 on two handles: 2 x 4096 KiB x 8 = 64 MiB.
    cublas = state(Assumed("cublas_workspace", 64 * MiB, {"source": "PyTorch's default", "compute_capability": 9.0,
                                                          "grouped_gemm": True, "tp_comm_overlap": False}))
    assert cublas.text == ("cuBLAS workspaces 64 MiB (PyTorch's default) and Transformer Engine's workspace for "
                           "compute capability 9 (and one per grouped-GEMM stream)")
