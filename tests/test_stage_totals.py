"""Whole-stage totals and device overheads, every term derived by hand from the tiny GPT's shape.

TINY_GPT: 4 layers, s 32, b 2, h 64, a 4, F 256, vocab 1000 (padded 1024), 32 learned positions,
LayerNorm, biases, tied embeddings, dropout 0.1, bf16, Adam, no distributed optimizer,
Transformer Engine with flash attention.  The GPU is not named, so Hopper (compute capability
9.0) is assumed; the default overheads are a 512 MiB CUDA context, 512 MiB of NCCL buffers per
communicator and 5% fragmentation (megatron_estimator/model/overhead.py, stated assumptions).
"""

from conftest import TINY_GPT, estimate

MiB = 1 << 20
L, S, B, H, A, F, V = 4, 32, 2, 64, 4, 256, 1024
T = S * B

# Parameters (megatron/core/transformer/attention.py, mlp.py; two LayerNorms of 2h per layer).
LAYER_PARAMS = 2 * H + (H * 3 * H + 3 * H) + (H * H + H) + 2 * H + (H * F + F) + (F * H + H)
EMBEDDING, POSITIONS, FINAL_NORM = V * H, S * H, 2 * H
PARAMS = L * LAYER_PARAMS + EMBEDDING + POSITIONS + FINAL_NORM

# One layer's saved activations per microbatch (see tests/test_activations.py for the per-tensor
# sources): two LayerNorm+Linear blocks (input, normalized output, fp32 mu/rsigma), two 1-byte
# dropout masks, the QKV output (Q/K/V are views), flash attention's output and fp32
# log-sum-exp, the fc1 output and the GeLU output.
LAYER_ACTS = (2 * (2 * T * H + 2 * T * H + 8 * T) + 2 * T * H
              + 2 * T * 3 * H + 2 * T * H + 4 * B * A * S
              + 2 * T * F + 2 * T * F)
EMBEDDING_MASK = T * H                       # the embedding's 1-byte dropout mask
# The final LayerNorm's input, output and statistics, and the fp32 logits the vocab-parallel
# cross entropy saves (megatron/core/tensor_parallel/cross_entropy.py).
LOSS_KEPT = 2 * T * H + 2 * T * H + 8 * T + 4 * T * V
LOSS_TRANSIENT = 2 * T * V                   # the bf16 logits next to their fp32 copy
# The backward of one layer: fc1's output gradient and the incoming and outgoing [s, b, h] gradients.
LAYER_BACKWARD = 2 * T * F + 2 * 2 * T * H

# PyTorch's cuBLAS workspaces from Hopper on (CUBLAS_WORKSPACE_CONFIG :4096:8, c10/cuda
# CublasHandlePool), for the forward thread and autograd's thread.
CUBLAS = 2 * 4096 * 1024 * 8
TE_WORKSPACE = 32 * MiB + 1024               # transformer_engine/pytorch/module/base.py, sm90+
# The microbatch (megatron/core/datasets/gpt_dataset.py): tokens, labels, position ids in int64,
# the fp32 loss mask, and the bool [b, 1, s, s] causal mask the dataloader creates by default.
BATCH = (3 * 8 + 4) * T + B * S * S


def test_one_gpu_stage_total_itemised():
    [stage] = estimate(TINY_GPT).stages
    # megatron/core/distributed/param_and_grad_buffer.py and optimizer/optimizer.py: bf16 params,
    # fp32 main grads, fp32 master params + Adam's exp_avg and exp_avg_sq.
    assert (stage.bytes.weights, stage.bytes.gradients, stage.bytes.optimizer_states) == (
        2 * PARAMS, 4 * PARAMS, 12 * PARAMS)
    # One microbatch per step (global batch = micro batch x dp), so one in flight.
    assert stage.microbatches_in_flight == (1,)
    assert stage.bytes.activations == EMBEDDING_MASK + L * LAYER_ACTS + LOSS_KEPT
    # The peak's transient is the larger of the loss's logits and one layer's backward.
    assert LOSS_TRANSIENT > LAYER_BACKWARD
    assert stage.bytes.other == LOSS_TRANSIENT + CUBLAS + TE_WORKSPACE + BATCH
    total = 18 * PARAMS + EMBEDDING_MASK + L * LAYER_ACTS + LOSS_KEPT + LOSS_TRANSIENT + CUBLAS + TE_WORKSPACE + BATCH
    assert stage.allocated_peak_bytes == total
    # One GPU: no communicator moves data, so no NCCL buffers.
    assert stage.device_overhead.cuda_context == 512 * MiB
    assert stage.device_overhead.communication_buffers == 0
    assert stage.device_overhead.fragmentation == int(total * 0.05)
    assert stage.device_peak_bytes == total + 512 * MiB + int(total * 0.05)


def test_two_pipeline_stages_itemised():
    first, last = estimate(TINY_GPT, 2, "--pipeline-model-parallel-size 2").stages
    # Stage 0: the embedding, positions and layers 0-1; stage 1: layers 2-3, the final norm and
    # its own copy of the tied word embeddings for the output layer.
    assert first.parameters == EMBEDDING + POSITIONS + 2 * LAYER_PARAMS
    assert last.parameters == 2 * LAYER_PARAMS + FINAL_NORM + EMBEDDING
    # 1F1B (megatron/core/pipeline_parallel/schedules.py) with one microbatch: one in flight each.
    assert first.microbatches_in_flight == last.microbatches_in_flight == (1,)
    assert first.bytes.activations == EMBEDDING_MASK + 2 * LAYER_ACTS
    assert last.bytes.activations == 2 * LAYER_ACTS + LOSS_KEPT
    # Both stages load the microbatch (the first its tokens, the last its labels and loss mask).
    assert first.bytes.other == LAYER_BACKWARD + CUBLAS + TE_WORKSPACE + BATCH
    assert last.bytes.other == LOSS_TRANSIENT + CUBLAS + TE_WORKSPACE + BATCH
    for stage in (first, last):
        assert stage.allocated_peak_bytes == 18 * stage.parameters + stage.bytes.activations + stage.bytes.other
        # One communicator moves data: the pipeline-parallel one.
        assert stage.device_overhead.communication_buffers == 512 * MiB


def test_communicators_each_add_nccl_buffers():
    # world 8 = tp 2 x pp 2 x dp 2: tensor-, pipeline- and data-parallel communicators.
    stage = estimate(TINY_GPT, 8, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2").stages[0]
    assert stage.device_overhead.communication_buffers == 3 * 512 * MiB
    assert stage.device_peak_bytes == (stage.allocated_peak_bytes + 512 * MiB + 3 * 512 * MiB
                                       + int(stage.allocated_peak_bytes * 0.05))
