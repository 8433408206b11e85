"""The local experts as one block of grouped records (model/parameters.py ``ParamTensor``
``count`` / ``span``) give exactly the integers of one record per expert tensor.

The reference here is the one-record-per-tensor computation: ``expanded`` writes every
block's repeats out, and ``reference_buffer_numel`` is the distributed optimizer's layout
walked one tensor at a time (megatron/core/optimizer/distrib_optimizer.py
``_compute_per_buffer_param_layout``: reverse order, 64-element starts, a bucket closed at
bucket_size and padded to lcm(dp_shard, 128), a tied embedding in a bucket of its own), the
walk the estimator made before the grouping.  Counts, not timings: the number of records
and of ``_linear`` calls must not grow with the number of experts."""

from __future__ import annotations

import math
import random

import pytest

from conftest import TINY_GPT, resolve
from megatron_estimator.model import parameters
from megatron_estimator.model.checkpoint import load_exchange_bytes
from megatron_estimator.model.layout import pipeline_stages
from megatron_estimator.model.parameters import ParamTensor, chunk_tensors, count, expanded
from megatron_estimator.model.stage import total_parameters
from megatron_estimator.model.states import _buffer_numel, model_states

SHARED = ("embedding.word_embeddings.weight", "output_layer.weight")


def reference_buffer_numel(tensors, bucket_size, dp_shard, padded, shared_embedding):
    """One tensor at a time, in absolute offsets (records must be plain: count 1)."""
    assert all(t.count == 1 and t.span == 1 for t in tensors)
    if not padded:
        return sum(t.numel for t in tensors)
    divisor = math.lcm(dp_shard, 128)

    def pad_end(index):
        return -(-index // divisor) * divisor

    start = bucket_start = end = 0
    bucket_has_params = False
    for tensor in reversed(tensors):
        start = -(-start // 64) * 64
        own_bucket = shared_embedding and tensor.name in SHARED
        if own_bucket and bucket_has_params:
            bucket_start = pad_end(start)
            start = bucket_start
            bucket_has_params = False
        end = start + tensor.numel
        bucket_has_params = True
        if (bucket_size is not None and end - bucket_start >= bucket_size) or own_bucket:
            bucket_start = pad_end(end)
            start = bucket_start
            bucket_has_params = False
        else:
            start = end
    return pad_end(end) if bucket_has_params else bucket_start


def random_records(rng: random.Random) -> list[ParamTensor]:
    """Plain tensors and blocks of grouped ones, in a random order, sizes near and off 64."""
    records: list[ParamTensor] = []
    if rng.random() < 0.5:
        records.append(ParamTensor(SHARED[0], rng.randint(1, 5000), kind="embedding"))
    for b in range(rng.randint(1, 4)):
        for j in range(rng.randint(0, 3)):
            records.append(ParamTensor(f"dense.{b}.{j}", rng.choice((0, 1, 63, 64, 65, 128, rng.randint(1, 3000)))))
        span = rng.randint(1, 4)
        copies = rng.choice((1, 2, 3, 7, 32, 257, rng.randint(1, 600)))
        for j in range(span):
            numel = rng.choice((1, 63, 64, 65, 100, 4096, rng.randint(1, 20000)))
            records.append(ParamTensor(f"layers.{b}.mlp.experts.E.t{j}", numel, True, count=copies, span=span))
    if rng.random() < 0.5:
        records.append(ParamTensor(SHARED[1], rng.randint(1, 5000), kind="embedding"))
    return records


@pytest.mark.parametrize("seed", range(60))
def test_the_block_walk_equals_the_walk_one_tensor_at_a_time(seed):
    rng = random.Random(seed)
    records = random_records(rng)
    flat = expanded(records)
    assert len(flat) == sum(t.count for t in records)
    total = sum(t.numel for t in flat)
    for bucket_size in (None, 1, 64, 1000, 4096, 10_000, rng.randint(1, max(total, 1)), total, total + 1):
        for shard in (1, 2, 3, 6, 64, 384):
            for shared_embedding in (False, True):
                expect = reference_buffer_numel(flat, bucket_size, shard, True, shared_embedding)
                assert _buffer_numel(records, bucket_size, shard, True, shared_embedding) == expect, (
                    bucket_size, shard, shared_embedding)
                assert _buffer_numel(flat, bucket_size, shard, True, shared_embedding) == expect
    assert _buffer_numel(records, None, 8, False, False) == total


# MoE shapes: odd sizes (nothing a multiple of 64), small DDP buckets that close inside an
# expert block, grouped GEMM or not, expert tensor parallel above 1, shared experts, MTP,
# fp8, FSDP, the legacy layer-wise optimizer's ping-pong, a resumed load that exchanges.  (Expert
# tensor parallel above 1 needs --disable-bias-linear: transformer_config.py, a329dd6da5.)
ODD = ("--num-layers 4 --hidden-size 72 --ffn-hidden-size 100 --num-attention-heads 4 --seq-length 32 "
       "--max-position-embeddings 32 --micro-batch-size 1 --vocab-size 1000 --bf16")
CASES = [
    (TINY_GPT, 8, "--num-experts 8 --expert-model-parallel-size 4 --use-distributed-optimizer"),
    (TINY_GPT, 8, "--num-experts 8 --expert-model-parallel-size 4 --use-distributed-optimizer "
                  "--overlap-grad-reduce --ddp-bucket-size 5000"),
    (ODD, 8, "--num-experts 16 --expert-model-parallel-size 2 --use-distributed-optimizer "
             "--overlap-grad-reduce --ddp-bucket-size 7777 --moe-ffn-hidden-size 37"),
    (ODD, 8, "--num-experts 16 --expert-model-parallel-size 2 --use-distributed-optimizer "
             "--overlap-grad-reduce --ddp-bucket-size 7777 --moe-ffn-hidden-size 37 --moe-grouped-gemm"),
    (ODD, 8, "--num-experts 12 --tensor-model-parallel-size 2 --expert-model-parallel-size 2 "
             "--expert-tensor-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce "
             "--ddp-bucket-size 3001 --moe-ffn-hidden-size 50 --sequence-parallel --disable-bias-linear"),
    (ODD, 16, "--num-experts 64 --expert-model-parallel-size 8 --pipeline-model-parallel-size 2 "
              "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 100000 "
              "--moe-shared-expert-intermediate-size 88 --moe-layer-freq [0,1,1,1] --disable-bias-linear "
              "--swiglu --normalization RMSNorm"),
    (ODD, 8, "--num-experts 8 --expert-model-parallel-size 2 --mtp-num-layers 1 --position-embedding-type rope "
             "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 9000 "
             "--num-distributed-optimizer-instances 2"),
    (TINY_GPT, 8, "--num-experts 32 --expert-model-parallel-size 1 --use-distributed-optimizer "
                  "--overlap-grad-reduce --ddp-bucket-size 65536 --moe-grouped-gemm --swiglu"),
    (TINY_GPT, 8, "--num-experts 8 --expert-model-parallel-size 2 --use-distributed-optimizer "
                  "--fp8-format hybrid --fp8-recipe delayed --fp8-param-gather"),
    (TINY_GPT, 8, "--num-experts 8 --expert-model-parallel-size 2 --use-megatron-fsdp "
                  "--data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion "
                  "--ckpt-format fsdp_dtensor"),
    (TINY_GPT, 8, "--num-experts 8 --expert-model-parallel-size 2 --optimizer muon "
                  "--use-distributed-optimizer --no-use-layer-wise-param-layout"),
    (TINY_GPT, 8, "--num-experts 8 --tensor-model-parallel-size 2 --expert-model-parallel-size 2 "
                  "--sequence-parallel --use-distributed-optimizer --load /nowhere/ckpt --ckpt-fully-parallel-load "
                  "--disable-bias-linear"),
]


def case_config(text, world, extra):
    if "--load" not in extra:
        return resolve(text, world, extra=extra)
    from conftest import flags
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.argv import parse_megatron_argv

    raw, problems = parse_megatron_argv(flags(text, extra))
    assert not problems, problems
    return resolve_config(raw, world_size=world, world_size_source="test", environ={}, resume="yes")


@pytest.mark.parametrize("text,world,extra", CASES)
def test_grouped_records_give_the_integers_of_one_record_per_expert(text, world, extra):
    config = case_config(text, world, extra)
    stages = pipeline_stages(config)
    grouped = [[chunk_tensors(config, chunk) for chunk in stage.chunks] for stage in stages]
    flat = [[expanded(tensors) for tensors in chunks] for chunks in grouped]
    assert any(t.count > 1 for chunks in grouped for tensors in chunks for t in tensors)
    assert total_parameters(config, stages, grouped) == total_parameters(config, stages, flat)
    assert total_parameters(config, stages) == total_parameters(config, stages, flat)    # by layer kind
    opt, p = config.optimizer, config.parallel
    bucket = (opt.ddp_bucket_size or max(40_000_000, 1_000_000 * p.dp * p.cp)) if opt.overlap_grad_reduce else None
    instances = max(opt.num_distributed_optimizer_instances, 1)
    for chunks, flat_chunks in zip(grouped, flat):
        assert model_states(config, chunks) == model_states(config, flat_chunks)
        assert load_exchange_bytes(config, chunks) == load_exchange_bytes(config, flat_chunks)
        for tensors, plain in zip(chunks, flat_chunks):
            assert count(tensors) == count(plain)
            for expert, shard in ((False, max(p.dp * p.cp // instances, 1)), (True, max(p.edp // instances, 1))):
                group = [t for t in tensors if t.expert == expert]
                expect = reference_buffer_numel([t for t in plain if t.expert == expert], bucket, shard, True,
                                                not expert and not config.model.untie_embeddings_and_output_weights)
                assert _buffer_numel(group, bucket, shard, True,
                                     not expert and not config.model.untie_embeddings_and_output_weights) == expect


def test_expanded_names_each_local_expert():
    config = resolve(TINY_GPT, 8, extra="--num-experts 8 --expert-model-parallel-size 4")
    names = [t.name for t in expanded(chunk_tensors(config, pipeline_stages(config)[0].chunks[0]))]
    # 8 experts / ep 4 = 2 local experts per layer, fc1 and fc2 with biases each.
    assert [n for n in names if n.startswith("decoder.layers.0.mlp.experts.")] == [
        f"decoder.layers.0.mlp.experts.{e}.linear_fc{i}.{k}" for e in (0, 1) for i in (1, 2) for k in ("weight", "bias")]


def test_ep_must_divide_the_experts():
    # megatron/core/transformer/moe/moe_layer.py asserts num_moe_experts % ep == 0: an uneven
    # split never reaches the model.
    from conftest import problems_of

    found = problems_of(TINY_GPT + " --num-experts 6 --expert-model-parallel-size 4", world_size=8)
    assert found and all("expert" in problem.message for problem in found), found


@pytest.mark.parametrize("grouped_gemm", ("", "--moe-grouped-gemm"))
def test_records_and_linear_calls_do_not_grow_with_the_experts(monkeypatch, grouped_gemm):
    calls = []
    real = parameters._linear

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(parameters, "_linear", counting)
    seen = set()
    for experts in (8, 64, 256, 1024):
        config = resolve(TINY_GPT, 8, extra=f"--num-experts {experts} --expert-model-parallel-size 2 {grouped_gemm}")
        calls.clear()
        records = sum(len(chunk_tensors(config, chunk)) for stage in pipeline_stages(config) for chunk in stage.chunks)
        seen.add((records, len(calls)))
        local = sum(t.count for t in chunk_tensors(config, pipeline_stages(config)[0].chunks[0])
                    if t.name.startswith("decoder.layers.0.mlp.experts.") and t.name.endswith("linear_fc1.weight"))
        assert local == experts // 2
    assert len(seen) == 1, seen


@pytest.mark.parametrize("extra,world", [
    ("", 1),
    ("--pipeline-model-parallel-size 2", 2),                                   # tied: the output copy
    ("--tensor-model-parallel-size 2 --untie-embeddings-and-output-weights", 2),
    ("--position-embedding-type rope --mtp-num-layers 2 --pipeline-model-parallel-size 2", 2),
    ("--num-experts 4 --moe-layer-freq [1,0,1,0] --expert-model-parallel-size 2 "
     "--moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate", 2),
])
def test_the_total_by_layer_kind_is_the_sum_over_every_record(extra, world):
    # model/stage.py total_parameters without records counts each decoder layer by its
    # kind's records; with them it sums every record of every chunk.
    config = resolve(TINY_GPT, world, extra=extra)
    stages = pipeline_stages(config)
    records = [[expanded(chunk_tensors(config, chunk)) for chunk in stage.chunks] for stage in stages]
    assert total_parameters(config, stages) == total_parameters(config, stages, records)


def test_the_total_by_layer_kind_of_a_hybrid_model():
    from test_hybrid import config as hybrid_config

    for pattern, extra, world in (("M*M-", "", 1), ("M*-E", "--num-experts 4", 1),
                                  ("M*M-/MM", "--position-embedding-type rope", 1),
                                  ("M*|M-", "--pipeline-model-parallel-size 2", 2)):
        config = hybrid_config(pattern, extra, world)
        stages = pipeline_stages(config)
        records = [[expanded(chunk_tensors(config, chunk)) for chunk in stage.chunks] for stage in stages]
        assert total_parameters(config, stages) == total_parameters(config, stages, records), pattern


def test_a_repeated_estimate_equals_one_with_the_model_caches_emptied():
    # The memory model memoises per configuration (chunk records, stage states and terms,
    # activations): a cached answer must be the one a first estimate computes, and no caller
    # may change what a cache holds.
    from conftest import estimate

    extra = ("--num-experts 8 --expert-model-parallel-size 2 --pipeline-model-parallel-size 2 "
             "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 5000")
    first = estimate(TINY_GPT, 8, extra)
    config = resolve(TINY_GPT, 8, extra=extra)
    for stage in pipeline_stages(config):
        for chunk in stage.chunks:
            chunk_tensors(config, chunk).clear()           # a caller's list is its own
    again = estimate(TINY_GPT, 8, extra)
    from conftest import model_caches

    for cache in model_caches():
        cache.cache_clear()
    fresh = estimate(TINY_GPT, 8, extra)
    assert first == again == fresh
