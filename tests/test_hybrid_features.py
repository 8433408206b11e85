"""Every estimator feature on hybrid stages, counted by hand on tests/test_hybrid.py's toy:
the distributed optimizer's buffers and shards, fp8, recompute (full and selective: which
modules a Mamba layer has), activation offloading (fine-grained; --cpu-offloading-num-layers,
which HybridStack ignores) and Mamba under context parallelism."""

from __future__ import annotations

from megatron_estimator.model.activations import layer_activations
from megatron_estimator.model.parameters import count, layer_tensors

from test_hybrid import GROUPS, H, HEADS, STATE, D_INNER, attention_params, config, hybrid_estimate, mamba_layer_bytes, mamba_params, mlp_params

TOKENS = 32 * 2                      # seq 32 x micro batch 2

# "M*-" on one GPU, tied embeddings: each tensor's elements (megatron/core/ssm/mamba_mixer.py,
# the hybrid spec's attention-only and MLP-only TransformerLayers, gpt embedding + final LayerNorm).
EMBEDDING = [1024 * H, 32 * H]                                   # word, learned positions
MAMBA = [H, H, H * (2 * D_INNER + 2 * GROUPS * STATE + HEADS),   # in_proj's LayerNorm w, b; in_proj
         (D_INNER + 2 * GROUPS * STATE) * 4, D_INNER + 2 * GROUPS * STATE,   # conv1d weight, bias
         HEADS, HEADS, HEADS, D_INNER, D_INNER * H]              # dt_bias, A_log, D, gated norm, out_proj
ATTENTION = [H, H, 3 * H * H, 3 * H, H * H, H]
MLP = [H, H, 4 * H * H, 4 * H, 4 * H * H, H]
FINAL_NORM = [H, H]
TENSORS = EMBEDDING + MAMBA + ATTENTION + MLP + FINAL_NORM
PARAMS = sum(TENSORS)
LINEAR = MAMBA[2] + MAMBA[9] + ATTENTION[2] + ATTENTION[4] + MLP[2] + MLP[4]


def test_the_itemised_tensors_are_the_hand_counted_layers():
    assert sum(MAMBA) == mamba_params(1) and sum(ATTENTION) == attention_params(1) and sum(MLP) == mlp_params(1)
    _, est = hybrid_estimate("M*-")
    assert est.stages[0].parameters == PARAMS


def test_plain_adam_on_a_hybrid_stage():
    b = hybrid_estimate("M*-")[1].stages[0].bytes
    assert (b.weights, b.gradients, b.optimizer_states) == (2 * PARAMS, 4 * PARAMS, 12 * PARAMS)


def test_distributed_optimizer_buffers_and_shards_on_a_hybrid_stage():
    # megatron/core/distributed/param_and_grad_buffer.py: every tensor starts on a 64-element
    # boundary (the conv1d bias 160 -> 192, dt_bias / A_log / D 8 -> 64 each), the one bucket
    # ends on a multiple of lcm(dp 4, 128); the last tensor in the buffer (reverse order: the
    # word embedding, 64 x 1024) needs no start padding after it.
    _, est = hybrid_estimate("M*-", "--use-distributed-optimizer --global-batch-size 8", world_size=4)
    starts = sum(-(-n // 64) * 64 for n in TENSORS)
    assert starts - PARAMS == 32 + 3 * 56
    padded = -(-starts // 128) * 128
    stage = est.stages[0]
    assert dict(stage.details)["buffer_padding_elements"] == padded - PARAMS
    assert (stage.bytes.weights, stage.bytes.gradients) == (2 * padded, 4 * padded)
    assert stage.bytes.optimizer_states == 12 * PARAMS // 4       # fp32 master + two moments, over dp 4


def test_fp8_on_a_hybrid_stage():
    extra = "--fp8-format hybrid --fp8-recipe tensorwise"
    plain = hybrid_estimate("M*-")[1].stages[0].bytes.weights
    cfg, est = hybrid_estimate("M*-", extra)
    # Mamba's in_proj (TELayerNormColumnParallelLinear) and out_proj (TERowParallelLinear) are TE
    # linears like the attention and MLP ones: a row-wise and a column-wise fp8 copy each.
    assert est.stages[0].bytes.weights - plain == 2 * LINEAR
    # Activations: in_proj's normalized output and out_proj's saved input are fp8 (1 byte).
    t = TOKENS
    mamba = mamba_layer_bytes(1, False, t) - (2 - 1) * t * H - (2 - 1) * t * D_INNER
    assert layer_activations(cfg, 0).total == mamba


def test_selective_recompute_leaves_a_mamba_layer_whole():
    # Selective recompute modules (transformer_config.py) are TransformerLayer's: the MLP-only
    # layer (ssm/mlp_layer.py MLPLayer is a TransformerLayer) keeps only its input under 'mlp';
    # the MambaLayer has none of them.
    cfg = config("M-", "--recompute-granularity selective --recompute-modules mlp core_attn layernorm")
    assert layer_activations(cfg, 0).total == mamba_layer_bytes(1, False, TOKENS)
    assert layer_activations(cfg, 1).total == 2 * TOKENS * H           # the bf16 input of the MLP block


def test_full_recompute_groups_hybrid_layers_like_a_transformer_block():
    # megatron/core/recompute.py checkpointed_forward, uniform 2: groups (M *), (- M) keep their
    # inputs; the largest group re-materialised in backward is the peak transient.
    from megatron_estimator.model.layout import pipeline_stages
    from megatron_estimator.model.stage import chunk_activation_bytes

    cfg = config("M*-M", "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2")
    [stage] = pipeline_stages(cfg)
    chunk = chunk_activation_bytes(cfg, stage.chunks[0])
    layers = [layer_activations(cfg, i).total for i in range(4)]
    assert layers[0] == layers[3] == mamba_layer_bytes(1, False, TOKENS)
    assert chunk.recompute_peak == max(layers[0] + layers[1], layers[2] + layers[3])


def test_fine_grained_offloading_moves_nothing_of_a_mamba_layer():
    # fine_grained_activation_offload.py's hooks sit in TransformerLayer's modules; MambaLayer has none.
    cfg = config("M-", "--fine-grained-activation-offloading --offload-modules attn_norm qkv_linear core_attn "
                       "attn_proj mlp_norm --min-offloaded-tensor-size 1")
    assert layer_activations(cfg, 0).total == mamba_layer_bytes(1, False, TOKENS)
    plain = config("M-")
    assert layer_activations(cfg, 1).total == layer_activations(plain, 1).total - 2 * TOKENS * H   # mlp_norm's input


def test_cpu_offloading_layers_change_nothing_on_a_hybrid_model():
    # megatron/core/models/hybrid/hybrid_block.py never enters transformer_block.py's CPU offload context.
    _, plain = hybrid_estimate("M*-M")
    cfg, offloaded = hybrid_estimate("M*-M", "--cpu-offloading-num-layers 2")
    assert offloaded.stages[0].bytes == plain.stages[0].bytes
    assert any("--cpu-offloading-num-layers 2 offloads nothing" in note for note in cfg.notes)


def test_mamba_under_context_parallelism():
    # megatron/core/ssm/mamba_context_parallel.py: all-to-all to the whole sequence (32 x 2 tokens)
    # with heads / (tp cp) per GPU: the scan's saved tensors keep the per-GPU size of the local
    # 16 x 2 tokens, but tp 2 leaves 1 group for cp 2: its state repeated on both CP ranks (B, C).
    t, cp, local = 2, 2, 16 * 2
    cfg = config("M-", f"--tensor-model-parallel-size {t} --context-parallel-size {cp}", world_size=4)
    inner, heads = D_INNER // t, HEADS // t
    norm = 2 * local * H + 2 * local * H + 8 * local
    # [s, b, z x / cp + B C of the 1 group per CP rank + dt / cp]
    zxbcdt = 2 * (cp * local) * (2 * inner // cp + 2 * 1 * STATE + heads // cp)
    assert zxbcdt == 2 * local * (2 * inner + 2 * cp * STATE + heads)
    rest = 2 * local * inner + (2 * local * inner + 4 * local * (GROUPS // t)) + 2 * local * inner
    assert layer_activations(cfg, 0).total == norm + zxbcdt + rest
    # With groups / tp = cp there is nothing to repeat: the cp = 1 figure of the local tokens.
    cfg = config("M-", "--context-parallel-size 2", world_size=2)
    assert layer_activations(cfg, 0).total == mamba_layer_bytes(1, False, local)
    # The parameters are the TP shard's (sliced views per CP rank, not copies).
    assert count(layer_tensors(cfg, 0, "")).total == mamba_params(1)


def test_megatron_fsdp_shards_mamba_layers_as_units():
    # mcore_fsdp_adapter.py: the FSDP units are TransformerLayer, MoETransformerLayer and MambaLayer,
    # so with optim_grads_params all three hybrid layers are sharded over dp 2 and all-gathered
    # (bf16) before their backward; the embedding and the final norm, outside every unit, keep
    # their unsharded bf16 copy beside the shard.  The buffer is padded as above (lcm(2, 128) = 128).
    _, est = hybrid_estimate("M*-", "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params "
                                    "--ckpt-format fsdp_dtensor --global-batch-size 4", world_size=2)
    stage = est.stages[0]
    padded = -(-sum(-(-n // 64) * 64 for n in TENSORS) // 128) * 128
    units = sum(MAMBA) + sum(ATTENTION) + sum(MLP)
    outside = sum(EMBEDDING) + sum(FINAL_NORM)
    assert stage.bytes.weights == 2 * padded // 2 + 2 * outside
    assert stage.bytes.gradients == 4 * padded // 2
    assert stage.bytes.optimizer_states == 12 * PARAMS // 2
    assert dict(stage.details)["fsdp_unsharded_in_flight"] == 2 * units


def test_megatron_fsdp_units_of_a_hybrid_mtp_depth_are_its_nested_layers():
    # A hybrid MTP depth runs a nested HybridStack (multi_token_prediction.py): its MambaLayer /
    # TransformerLayer modules are FSDP units; enorm, hnorm, eh_proj and the depth's final norm are not.
    from megatron_estimator.model.layout import pipeline_stages
    from megatron_estimator.model.parameters import chunk_tensors
    from megatron_estimator.model.states import _fsdp_unit

    cfg = config("M*-/M-", "--position-embedding-type rope")
    [stage] = pipeline_stages(cfg)
    mtp = [t for t in chunk_tensors(cfg, stage.chunks[0]) if t.name.startswith("mtp.")]
    unit = sum(t.numel for t in mtp if _fsdp_unit(t))
    assert unit == sum(MAMBA) + sum(MLP)
