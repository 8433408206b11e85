"""A stage's records as runs of one decoder layer kind (model/parameters.py ``RecordBlock``:
a stage's N identical layers one block repeated N times, each repeat holding the layer's
records, which may hold expert blocks) give exactly the integers of the records written out
one per tensor, per layer.

The reference is the fully expanded computation: ``expanded(chunk_tensors(...))`` (every
layer's tensors under its own prefix, every local expert's written out), summed record by
record, and the distributed optimizer's layout walked one tensor at a time
(tests/test_expert_grouping.py ``reference_buffer_numel``).  Counts, not timings: the records
the memory model builds and walks must not grow with the number of layers."""

from __future__ import annotations

import random

import pytest

from conftest import TINY_GPT, resolve
from test_expert_grouping import CASES, ODD, case_config, reference_buffer_numel
from megatron_estimator.model import parameters, stage as stage_model
from megatron_estimator.model.layout import pipeline_stages
from megatron_estimator.model.parameters import (ParamTensor, chunk_blocks, chunk_structure,
                                                 chunk_tensors, count, expanded)
from megatron_estimator.model.stage import stage_parameters, stage_states, total_parameters
from megatron_estimator.model.states import _blocks_numel, model_states

SMALL_BUCKETS = "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size {}"
GPT8 = TINY_GPT.replace("--num-layers 4", "--num-layers 8")
ODD8 = ODD.replace("--num-layers 4", "--num-layers 8")

GPT_CASES = [
    (GPT8, 1, ""),
    (GPT8, 2, "--use-distributed-optimizer"),
    (GPT8, 4, "--pipeline-model-parallel-size 2 " + SMALL_BUCKETS.format(3001)),
    (GPT8, 4, "--pipeline-model-parallel-size 2 " + SMALL_BUCKETS.format(100)),        # a bucket per tensor
    (ODD8, 4, "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --global-batch-size 8 "
              + SMALL_BUCKETS.format(7777)),
    (ODD8, 6, "--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 2 "
              "--decoder-last-pipeline-num-layers 2 --untie-embeddings-and-output-weights "
              + SMALL_BUCKETS.format(20000)),
    (ODD8, 2, "--pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split "
              "--account-for-loss-in-pipeline-split " + SMALL_BUCKETS.format(12345)),
    (ODD8, 4, "--pipeline-model-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope "
              + SMALL_BUCKETS.format(5000)),
    (ODD8, 8, "--num-experts 8 --expert-model-parallel-size 4 --moe-layer-freq [0,1,1,1,1,1,0,1] "
              "--pipeline-model-parallel-size 2 --moe-ffn-hidden-size 37 " + SMALL_BUCKETS.format(999)),
    (ODD8, 8, "--num-experts 8 --expert-model-parallel-size 2 --mtp-num-layers 2 --position-embedding-type rope "
              "--moe-shared-expert-intermediate-size 40 --moe-shared-expert-gate " + SMALL_BUCKETS.format(4321)),
    (GPT8, 8, "--num-experts 8 --expert-model-parallel-size 2 --use-megatron-fsdp "
              "--data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion "
              "--ckpt-format fsdp_dtensor"),
    # Megatron-FSDP without pipeline parallelism: its device mesh has none (mcore_fsdp_adapter.py _get_dp_tp_mesh)
    (GPT8, 8, "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads "
              "--no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor"),
    (GPT8, 8, "--num-experts 8 --expert-model-parallel-size 2 --optimizer muon --use-distributed-optimizer"),
    (GPT8, 8, "--num-experts 8 --expert-model-parallel-size 2 --optimizer muon "
              "--use-distributed-optimizer --no-use-layer-wise-param-layout --pipeline-model-parallel-size 2"),
    (GPT8, 4, "--fp8-format hybrid --fp8-recipe delayed --fp8-param-gather " + SMALL_BUCKETS.format(2000)),
    (GPT8, 8, "--num-experts 8 --tensor-model-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel "
              "--use-distributed-optimizer --load /nowhere/ckpt --ckpt-fully-parallel-load --disable-bias-linear"),
]


def hybrid_cases():
    from test_hybrid import MOE
    from test_hybrid_gd import DSA, GDN

    bucket = SMALL_BUCKETS.format(6007)
    return [
        ("MM*-MM*-MMM-", "", 1),
        ("MMMM*-MMMM*-", bucket + "", 2),
        ("MMM*|MMM-|M*M-", "--pipeline-model-parallel-size 3 " + bucket, 3),
        ("MMEE*EEE", MOE + "--expert-model-parallel-size 2 " + bucket, 2),
        ("GGG-DDD-", GDN + DSA + bucket, 1),
        ("GGDD|DDG-", GDN + DSA + "--pipeline-model-parallel-size 2 --dsa-indexer-topk-freq 2 " + bucket, 2),
        ("MMM-MMM-/M*", "--position-embedding-type rope " + bucket, 1),
        ("MMMM-E/GD", GDN + DSA + MOE + bucket, 1),
        ("MM*-MM*-", "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
                     "--no-gradient-accumulation-fusion --ckpt-format fsdp_dtensor", 2),
    ]


def gpt_configs():
    out = [pytest.param(lambda c=c: case_config(*c), id=f"case{i}") for i, c in enumerate(CASES + GPT_CASES)]
    for i, (pattern, extra, world) in enumerate(hybrid_cases()):
        def make(pattern=pattern, extra=extra, world=world):
            from test_hybrid import config as hybrid_config
            return hybrid_config(pattern, extra, world)
        out.append(pytest.param(make, id=f"hybrid{i}-{pattern}"))
    return out


@pytest.mark.parametrize("make", gpt_configs())
def test_blocks_give_the_integers_of_every_tensor_written_out(make):
    config = make()
    opt, p = config.optimizer, config.parallel
    bucket = (opt.ddp_bucket_size or max(40_000_000, 1_000_000 * p.dp * p.cp)) if opt.overlap_grad_reduce else None
    instances = max(opt.num_distributed_optimizer_instances, 1)
    shared = not config.model.untie_embeddings_and_output_weights and p.pp > 1
    stages = pipeline_stages(config)
    flat_stages = []
    for stage in stages:
        flat = [expanded(chunk_tensors(config, chunk)) for chunk in stage.chunks]
        flat_stages.append(flat)
        params, held = stage_parameters(config, stage)
        assert params == sum(t.numel for ts in flat for t in ts)
        assert held == stage_states(config, flat)
        blocks = [chunk_blocks(config, chunk_structure(config, chunk)) for chunk in stage.chunks]
        assert held.states == model_states(config, flat)
        for chunk_b, plain in zip(blocks, flat):
            assert count(parameters.weighted(chunk_b)) == count(plain)
            for expert, shard in ((False, max(p.dp * p.cp // instances, 1)), (True, max(p.edp // instances, 1))):
                runs = [(tuple(t for t in b.records if t.expert == expert), b.repeats) for b in chunk_b]
                expect = reference_buffer_numel([t for t in plain if t.expert == expert], bucket, shard, True,
                                                shared and not expert)
                assert _blocks_numel(runs, bucket, shard, True, shared and not expert) == expect
                assert _blocks_numel(runs, None, shard, True, shared and not expert) == reference_buffer_numel(
                    [t for t in plain if t.expert == expert], None, shard, True, shared and not expert)
    assert total_parameters(config, stages) == total_parameters(config, stages, flat_stages)


def test_blocks_written_out_are_the_chunk_records():
    config = case_config(ODD8, 8, "--num-experts 8 --expert-model-parallel-size 4 --moe-layer-freq [0,1,1,1,1,1,0,1] "
                                  "--pipeline-model-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope")
    for stage in pipeline_stages(config):
        for chunk in stage.chunks:
            blocks = chunk_blocks(config, chunk_structure(config, chunk))
            layers = iter(chunk.layers)
            written = []
            for b in blocks:
                for _ in range(b.repeats):
                    prefix = f"decoder.layers.{next(layers)}." if b.layers else ""
                    written += [t._replace(name=prefix + t.name) for t in b.records]
            assert written == chunk_tensors(config, chunk)
            assert next(layers, None) is None
            # Runs of one kind: layer 0 dense, 1-3 MoE | 4-5 MoE, 6 dense, 7 MoE.
            kinds = [(b.repeats, any(t.expert for t in b.records)) for b in blocks if b.layers]
            assert kinds == ([(1, False), (3, True)] if stage.pp_rank == 0 else [(2, True), (1, False), (1, True)])


def random_layer(rng: random.Random, name: str) -> tuple[ParamTensor, ...]:
    records: list[ParamTensor] = []
    for j in range(rng.randint(1, 4)):
        records.append(ParamTensor(f"{name}.{j}", rng.choice((0, 1, 63, 64, 65, 128, rng.randint(1, 3000)))))
    if rng.random() < 0.6:
        span = rng.randint(1, 3)
        copies = rng.choice((1, 2, 3, 7, 32, rng.randint(1, 100)))
        for j in range(span):
            records.append(ParamTensor(f"{name}.E.{j}", rng.choice((1, 64, 100, rng.randint(1, 2000))),
                                       count=copies, span=span))
        for j in range(rng.randint(0, 2)):
            records.append(ParamTensor(f"{name}.after.{j}", rng.randint(1, 500)))
    return tuple(records)


def test_random_runs_of_layers_walk_like_every_tensor():
    # Runs of identical layers (each with an expert block or not) repeated 1 to 300 times,
    # buckets from a few tensors to many layers, shards that make the padding odd: the block
    # walk equals the walk of every tensor written out.
    rng = random.Random(20261204)
    for trial in range(400):
        runs = []
        if rng.random() < 0.5:
            runs.append(((ParamTensor("embedding.word_embeddings.weight", rng.randint(1, 5000), kind="embedding"),), 1))
        for r in range(rng.randint(1, 4)):
            runs.append((random_layer(rng, f"layer{r}"), rng.choice((1, 2, 3, 5, 17, 64, rng.randint(1, 300)))))
        if rng.random() < 0.5:
            runs.append(((ParamTensor("output_layer.weight", rng.randint(1, 5000), kind="embedding"),), 1))
        flat = [t for records, repeats in runs for _ in range(repeats) for t in expanded(list(records))]
        total = sum(t.numel for t in flat)
        shared = rng.random() < 0.5
        for bucket in (None, 1, 64, 500, rng.randint(100, 20000), rng.randint(1, max(total, 1) + 1), total + 10):
            for shard in (1, 3, 8, 384):
                expect = reference_buffer_numel(flat, bucket, shard, True, shared)
                got = _blocks_numel(runs, bucket, shard, True, shared)
                assert got == expect, (trial, bucket, shard, runs)
        assert _blocks_numel(runs, None, 8, False, False) == total


def _model_caches():
    from conftest import model_caches

    return model_caches()


def _records_walked(monkeypatch, text: str, world: int, extra: str) -> tuple[int, int]:
    """(records handed to the model-state computation, decoder layers written out) over one
    estimate computed with the memory model's caches emptied."""
    from megatron_estimator.results.estimate import build_estimate

    config = resolve(text, world, extra=extra)
    for cache in _model_caches():
        cache.cache_clear()
    walked = [0]
    written = [0]
    real_states, real_layer = stage_model.model_states_of_blocks, parameters.layer_tensors

    def states(config, chunks_blocks):
        walked[0] += sum(len(b.records) for blocks in chunks_blocks for b in blocks)
        return real_states(config, chunks_blocks)

    def layer(config, index, prefix):
        written[0] += 1
        return real_layer(config, index, prefix)

    monkeypatch.setattr(stage_model, "model_states_of_blocks", states)
    monkeypatch.setattr(parameters, "layer_tensors", layer)
    try:
        build_estimate(config, budget=None, environ={})
    finally:
        monkeypatch.undo()
    return walked[0], written[0]


@pytest.mark.parametrize("extra", [
    "--pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 3001",
    "--pipeline-model-parallel-size 2 --num-experts 8 --expert-model-parallel-size 2 --moe-layer-freq 1 "
    "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 999 --mtp-num-layers 1 "
    "--position-embedding-type rope",
])
def test_records_walked_do_not_grow_with_the_layers(monkeypatch, extra):
    # Only an MTP layer's own copy of the last decoder layer is written out under a prefix.
    counts = set()
    for layers in (4, 8, 64):
        text = TINY_GPT.replace("--num-layers 4", f"--num-layers {layers}")
        counts.add(_records_walked(monkeypatch, text, 4, extra))
    assert len(counts) == 1, counts
