"""model/stage.py ``states_config``: the model states and parameter counts are computed on the
configuration without its training settings, so configurations that differ only in the batch,
the sequence or recompute share them.  Its training group is ``TRAINING_NOT_READ``, which
raises on any read: the whole suite estimating through it is the proof that those figures never
read the training settings; here the shared figures are also held to the ones computed, with
every cache emptied, on the full configuration."""

from __future__ import annotations


import pytest

from megatron_estimator.config.resolve import resolve_config
from megatron_estimator.inputs.argv import parse_megatron_argv
from megatron_estimator.model import stage as stage_module
from megatron_estimator.model.layout import pipeline_stages
from megatron_estimator.model.parameters import chunk_structure
from megatron_estimator.model.stage import TRAINING_NOT_READ, states_config

BASE = ("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1000 --bf16 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2").split()
MOE = ("--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 --moe-grouped-gemm "
       "--moe-layer-freq ([0]*1+[1]*7) --sequence-parallel --disable-bias-linear").split()
LAYOUTS = [
    [],
    ["--use-distributed-optimizer"],
    ["--use-distributed-optimizer", "--overlap-param-gather", "--overlap-grad-reduce"],
    MOE,
    MOE + ["--use-distributed-optimizer", "--expert-tensor-parallel-size", "1"],
    ["--num-layers-per-virtual-pipeline-stage", "2"],
    ["--untie-embeddings-and-output-weights", "--mtp-num-layers", "1", "--position-embedding-type", "rope"],
    ["--fp8-format", "hybrid", "--fp8-param-gather", "--use-distributed-optimizer"],
    # pipeline 1: Megatron-FSDP's device mesh has no pipeline dimension (mcore_fsdp_adapter.py _get_dp_tp_mesh)
    ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--use-distributed-optimizer",
     "--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor", "--pipeline-model-parallel-size", "1"],
    ["--load", "/ckpt/run", "--use-distributed-optimizer"],      # resumed: the load's buffers
]
TRAINING = [
    ["--micro-batch-size", "1", "--global-batch-size", "16"],
    ["--micro-batch-size", "2", "--global-batch-size", "64", "--recompute-granularity", "full",
     "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    ["--micro-batch-size", "4", "--global-batch-size", "32", "--recompute-granularity", "selective",
     "--seq-length", "256"],
]


def config_of(flags):
    raw, problems = parse_megatron_argv(list(flags))
    assert not problems, problems
    return resolve_config(raw, world_size=16, environ={}, resume="yes" if "--load" in flags else "auto")


def _model_caches():
    from conftest import model_caches

    return model_caches()


def test_training_settings_are_not_readable():
    config = states_config(config_of(BASE + TRAINING[0]))
    assert config.training is TRAINING_NOT_READ
    with pytest.raises(RuntimeError, match="micro_batch_size"):
        config.training.micro_batch_size


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_configurations_differing_in_training_share_one(layout):
    configs = [config_of(BASE + LAYOUTS[layout] + t) for t in TRAINING]
    assert len({id(c) for c in configs}) == len(configs)
    shared = {id(states_config(c)) for c in configs}
    assert len(shared) == 1
    assert states_config(config_of(BASE + LAYOUTS[layout] + TRAINING[0] + ["--hidden-size", "512"])) is not states_config(configs[0])


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_shared_figures_are_the_full_configurations(layout):
    for training in TRAINING:
        config = config_of(BASE + LAYOUTS[layout] + training)
        stages = pipeline_stages(config)
        for cache in _model_caches():
            cache.cache_clear()
        # The full configuration, through the uncached functions: the figures before sharing.
        full = [stage_module._structure_states.__wrapped__(
            config, tuple(chunk_structure(config, chunk) for chunk in stage.chunks)) for stage in stages]
        full_total = stage_module._total_parameters.__wrapped__(config, stages)
        for cache in _model_caches():
            cache.cache_clear()
        shared = [stage_module.stage_parameters(config, stage) for stage in stages]
        assert shared == full
        assert pipeline_stages(states_config(config)) == pipeline_stages.__wrapped__(config)   # build_estimate's
        assert stage_module.total_parameters(config, stages) == full_total
