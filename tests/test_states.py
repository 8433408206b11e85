"""Model states: weights, gradients and optimizer states in bytes."""

from megatron_estimator.memory.parameters import ParamTensor
from megatron_estimator.memory.states import _buffer_numel

from conftest import TINY_GPT, estimate

PARAMS = 267648  # the tiny GPT (test_parameters)


def test_plain_adam_is_18_bytes_per_parameter():
    b = estimate(TINY_GPT).stages[0].bytes
    assert (b.weights, b.gradients, b.optimizer_states) == (2 * PARAMS, 4 * PARAMS, 12 * PARAMS)


def test_fp32_training_has_no_master_copy():
    b = estimate(TINY_GPT.replace("--bf16", "")).stages[0].bytes
    assert (b.weights, b.gradients, b.optimizer_states) == (4 * PARAMS, 4 * PARAMS, 8 * PARAMS)


def test_grad_reduce_in_bf16_halves_gradients():
    b = estimate(TINY_GPT, extra="--grad-reduce-in-bf16").stages[0].bytes
    assert b.gradients == 2 * PARAMS


def test_sgd_keeps_one_momentum_buffer():
    b = estimate(TINY_GPT, extra="--optimizer sgd").stages[0].bytes
    assert b.optimizer_states == (4 + 4) * PARAMS


def test_buffer_layout_pads_param_starts_and_bucket_end():
    # Reverse order: 64 elements at 0, 10 at 64 (start padded to 64), 100 at 128;
    # the bucket ends at 228, padded to lcm(dp 2, 128) = 128 -> 256.
    tensors = [ParamTensor("a", 100), ParamTensor("b", 10), ParamTensor("c", 64)]
    assert _buffer_numel(tensors, None, 2, True, False) == 256
    assert _buffer_numel(tensors, None, 2, False, False) == 174
    # lcm(dp 3, 128) = 384
    assert _buffer_numel(tensors, None, 3, True, False) == 384


def test_buckets_split_at_bucket_size():
    # Bucket size 100: 'c' (64) + 'b' (64..74) stays below, 'a' closes the bucket at 228 -> 256;
    tensors = [ParamTensor("a", 100), ParamTensor("b", 10), ParamTensor("c", 64)]
    assert _buffer_numel(tensors, 100, 2, True, False) == 256
    # Bucket size 60: 'c' closes a bucket at 64 -> 128; 'b' at 128..138, 'a' at 192..292 -> 384.
    assert _buffer_numel(tensors, 60, 2, True, False) == 384


def test_distributed_optimizer_shards_over_data_parallel():
    est = estimate(TINY_GPT, world_size=4, extra="--use-distributed-optimizer")
    b = est.stages[0].bytes
    numel = PARAMS
    padded = numel + dict(est.stages[0].details)["buffer_padding_elements"]
    assert padded % 128 == 0 and padded >= numel
    assert b.weights == 2 * padded
    assert b.gradients == 4 * padded
    assert b.optimizer_states == 12 * numel // 4


def test_distributed_optimizer_instances_shard_less():
    one = estimate(TINY_GPT, world_size=8, extra="--use-distributed-optimizer").stages[0].bytes
    two = estimate(TINY_GPT, world_size=8, extra="--use-distributed-optimizer --num-distributed-optimizer-instances 2").stages[0].bytes
    assert one.optimizer_states == 12 * PARAMS // 8
    assert two.optimizer_states == 12 * PARAMS // 4


def test_precision_aware_optimizer_dtypes():
    extra = ("--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype bf16 "
             "--exp-avg-sq-dtype bf16 --main-params-dtype fp16")
    b = estimate(TINY_GPT, world_size=2, extra=extra).stages[0].bytes
    assert b.optimizer_states == (2 + 2 + 2) * PARAMS // 2
