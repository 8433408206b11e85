"""Activation bytes per layer and per stage: exact itemized integers on a tiny GPT."""

import pytest

from megatron_estimator.model.activations import layer_activations, loss_activations
from megatron_estimator.model.stage import chunk_activation_bytes

from conftest import LLAMA3_8B, TINY_GPT, estimate, resolve

# TINY_GPT: s 32, b 2, h 64, a 4 (d 16), F 256, LayerNorm, biases, dropout 0.1, bf16.
S, B, H, A, F = 32, 2, 64, 4, 256
TOKENS = S * B
VOCAB = 1024          # 1000 padded to a multiple of 128 (make_vocab_size_divisible_by x tp)
# The last stage's loss, per microbatch: the final LayerNorm's input, output and fp32 mu/rsigma,
# and the fp32 logits megatron/core/tensor_parallel/cross_entropy.py saves (exp in place).
LOSS_KEPT = 2 * TOKENS * H + 2 * TOKENS * H + 8 * TOKENS + 4 * TOKENS * VOCAB


def flash_gpt_layer_parts() -> tuple[int, int, int]:
    """One TINY_GPT layer with Transformer Engine's flash attention, per saved tensor (bytes):
    (norms and dropout, attention, MLP), itemised from the shape alone."""
    # TE pytorch/module/layernorm_linear.py (LayerNormLinear forward, ctx.save_for_backward):
    # the input (2 B), the normalized output (2 B) and mu + rsigma in fp32 (8 B per token),
    # once before QKV and once before fc1.
    norms = 2 * (2 * TOKENS * H + 2 * TOKENS * H + 8 * TOKENS)
    # megatron/core/fusions/fused_bias_dropout.py (bias-dropout-add after attention and after
    # the MLP, hidden dropout 0.1): a 1-byte mask per element each.
    masks = 2 * (1 * TOKENS * H)
    # megatron/core/transformer/attention.py get_query_key_value_tensors: Q, K and V are views
    # of the QKV GEMM output [s, b, 3h] (g == a, no RoPE), so its whole storage stays alive.
    qkv = 2 * TOKENS * 3 * H
    # TE attention/dot_product_attention/backends.py FlashAttention: saves its output (also
    # linear_proj's saved input) and the fp32 softmax log-sum-exp, one per head per token.
    out = 2 * TOKENS * H
    softmax_stats = 4 * B * A * S
    # megatron/core/transformer/mlp.py: the fc1 output [s, b, F] for the GeLU backward
    # (bias_gelu fusion saves its input) and the GeLU output as fc2's saved input.
    mlp = 2 * TOKENS * F + 2 * TOKENS * F
    return norms + masks, qkv + out + softmax_stats, mlp


def test_flash_attention_layer():
    layer = layer_activations(resolve(TINY_GPT), 0)
    norms_and_dropout, attention, mlp = flash_gpt_layer_parts()
    assert layer.norms_and_dropout == norms_and_dropout
    assert layer.attention == attention
    assert layer.mlp == mlp
    assert layer.total == norms_and_dropout + attention + mlp


def test_unfused_attention_adds_the_s_squared_terms():
    flash = layer_activations(resolve(TINY_GPT), 0).total
    unfused = layer_activations(resolve(TINY_GPT, extra="--attention-backend unfused"), 0).total
    softmax_stats = 4 * B * A * S
    s2 = B * A * S * S
    assert unfused - flash == 2 * s2 + s2 + 2 * s2 - softmax_stats
    # Korthikanti et al.'s sbh(34 + 5as/h), plus the fp32 LayerNorm statistics.
    assert unfused == S * B * H * (34 + 5 * A * S // H) + 2 * 8 * TOKENS


def test_tensor_and_sequence_parallel():
    t = 2
    tp = layer_activations(resolve(TINY_GPT, 2, extra="--tensor-model-parallel-size 2"), 0)
    sp = layer_activations(resolve(TINY_GPT, 2, extra="--tensor-model-parallel-size 2 --sequence-parallel"), 0)
    # TP splits attention and MLP (column-parallel outputs, a/t heads per rank); the norms and
    # dropout stay whole unless sequence parallel shards them along s (Korthikanti et al. 2022).
    norms_and_dropout, _, mlp = flash_gpt_layer_parts()
    assert tp.norms_and_dropout == norms_and_dropout
    assert sp.norms_and_dropout == norms_and_dropout // t
    assert tp.mlp == sp.mlp == mlp // t
    assert tp.attention == sp.attention == 2 * TOKENS * 3 * H // t + 2 * TOKENS * H // t + 4 * B * (A // t) * S


def test_context_parallel_divides_the_sequence():
    one = layer_activations(resolve(TINY_GPT), 0).total
    cp2 = layer_activations(resolve(TINY_GPT, 2, extra="--context-parallel-size 2"), 0).total
    assert cp2 * 2 == one


def test_swiglu_keeps_the_wide_fc1_output():
    layer = layer_activations(resolve(TINY_GPT, extra="--swiglu --ffn-hidden-size 256"), 0)
    assert layer.mlp == 2 * TOKENS * 2 * F + 2 * TOKENS * F


def test_selective_recompute_of_mlp_drops_it():
    layer = layer_activations(resolve(TINY_GPT, extra="--recompute-granularity selective --recompute-modules mlp"), 0)
    assert layer.mlp == 0


def test_selective_core_attention_recompute_drops_s_squared():
    base = "--attention-backend unfused"
    full = layer_activations(resolve(TINY_GPT, extra=base), 0).attention
    recomputed = layer_activations(resolve(TINY_GPT, extra=base + " --recompute-activations"), 0).attention
    assert full - recomputed == 5 * B * A * S * S


def test_full_recompute_keeps_group_inputs():
    uniform = resolve(TINY_GPT, extra="--recompute-granularity full --recompute-method uniform --recompute-num-layers 2")
    from megatron_estimator.model.layout import pipeline_stages

    chunk = pipeline_stages(uniform)[0].chunks[0]
    kept, recompute = chunk_activation_bytes(uniform, chunk)
    per_layer = sum(flash_gpt_layer_parts())         # full recompute does not change the layer itself
    embedding_mask = TOKENS * H                        # the embedding's 1-byte dropout mask
    loss_kept = LOSS_KEPT
    assert kept == 2 * (2 * TOKENS * H) + embedding_mask + loss_kept
    assert recompute == 2 * per_layer

    block = resolve(TINY_GPT, extra="--recompute-granularity full --recompute-method block --recompute-num-layers 1")
    chunk = pipeline_stages(block)[0].chunks[0]
    kept, recompute = chunk_activation_bytes(block, chunk)
    assert kept == 2 * TOKENS * H + 3 * per_layer + embedding_mask + loss_kept
    assert recompute == per_layer


def test_loss_keeps_fp32_logits():
    kept, transient = loss_activations(resolve(TINY_GPT))
    assert kept == LOSS_KEPT
    assert transient == 2 * TOKENS * VOCAB


def test_pipeline_stages_hold_microbatches_per_schedule():
    # pp 4, 8 microbatches: stage r holds min(4 - r, 8) microbatches of its own layers.
    est = estimate(LLAMA3_8B, 4, "--pipeline-model-parallel-size 4 --global-batch-size 8")
    assert [s.microbatches_in_flight for s in est.stages] == [(4,), (3,), (2,), (1,)]
    # One LLaMA-3-8B layer per microbatch, itemised like flash_gpt_layer_parts (s 8192, b 1,
    # h 4096, a 32, g 8, d 128, F 14336, RMSNorm, RoPE, SwiGLU, dropout 0.1 by default).
    s, b, h, a, g, d, f = 8192, 1, 4096, 32, 8, 128, 14336
    tokens = s * b
    # TE layernorm_linear.py with RMSNorm: input, normalized output, rsigma in fp32 (4 B).
    norms = 2 * (2 * tokens * h + 2 * tokens * h + 4 * tokens)
    masks = 2 * tokens * h                                  # fused_bias_dropout.py, 1-byte masks
    # attention.py: V stays a view of the QKV output (its whole storage, (a + 2g) d wide);
    # RoPE (apply_rotary_pos_emb) makes K and Q copies; 1 < g < a makes Q's reshape a copy too.
    qkv_storage = 2 * tokens * (a + 2 * g) * d
    k_rope, q_rope = 2 * tokens * g * d, 2 * tokens * a * d
    flash = 2 * tokens * a * d + 4 * b * a * s              # output + fp32 log-sum-exp (TE backends.py)
    # mlp.py with --swiglu and the default bias_swiglu fusion (fused_bias_swiglu.py saves its
    # 2F-wide input): fc1 output 2F, then the SwiGLU output as fc2's input.
    mlp = 2 * tokens * 2 * f + 2 * tokens * f
    per_layer = norms + masks + qkv_storage + k_rope + q_rope + flash + mlp
    assert est.stages[1].bytes.activations == 3 * 8 * per_layer
    assert est.stages[2].bytes.activations == 2 * 8 * per_layer


def test_cpu_offloading_drops_offloaded_layers():
    base = resolve(TINY_GPT)
    offloaded = resolve(TINY_GPT, extra="--cpu-offloading-num-layers 2")
    from megatron_estimator.model.layout import pipeline_stages

    kept_base, _ = chunk_activation_bytes(base, pipeline_stages(base)[0].chunks[0])
    kept_off, _ = chunk_activation_bytes(offloaded, pipeline_stages(offloaded)[0].chunks[0])
    assert kept_base - kept_off == 2 * sum(flash_gpt_layer_parts())


def test_fine_grained_offloading_moves_attention_tensors():
    extra = ("--fine-grained-activation-offloading --offload-modules core_attn attn_proj "
             "--min-offloaded-tensor-size 0")
    full = layer_activations(resolve(TINY_GPT), 0)
    off = layer_activations(resolve(TINY_GPT, extra=extra), 0)
    assert off.attention == 0
    assert off.mlp == full.mlp


def test_moe_routed_rows_scale_with_topk_and_capacity():
    from megatron_estimator.model.activations import routed_rows

    moe = "--num-experts 8 --moe-router-topk 2"
    assert routed_rows(resolve(TINY_GPT, extra=moe)) == TOKENS * 2
    assert routed_rows(resolve(TINY_GPT, extra=moe), imbalance=0.5) == TOKENS * 3
    capped = moe + " --moe-expert-capacity-factor 1.25"
    assert routed_rows(resolve(TINY_GPT, extra=capped), imbalance=0.5) == int(TOKENS * 2 * 1.25)
    padded = capped + " --moe-pad-expert-input-to-capacity"
    assert routed_rows(resolve(TINY_GPT, extra=padded)) == int(TOKENS * 2 * 1.25)


# --- the attention kernel Transformer Engine picks in deterministic training -------------------

def _kernel_and_layer(extra: str, environ: dict, capability: float | None, flash_attn: str | None):
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config

    from conftest import flags

    raw, problems = parse_megatron_argv(flags(TINY_GPT, extra))
    assert not problems
    config = resolve_config(raw, world_size=1, environ=environ, compute_capability=capability, flash_attn=flash_attn)
    return config.kernels.attention_backend, layer_activations(config, 0).total


DETERMINISTIC = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}


@pytest.mark.parametrize("extra, environ, capability, flash_attn, kernel", [
    # A100, deterministic, no flash-attn (or one older than 2.4.1): TE rules out cuDNN fused
    # attention before sm90 and flash-attn, so only unfused attention is left.
    ("", DETERMINISTIC, 8.0, "none", "unfused"),
    ("--deterministic-mode", {}, 8.0, "2.3.6", "unfused"),
    ("", DETERMINISTIC, 8.0, "2.3", "unfused"),
    # flash-attn >= 2.4.1 is deterministic: TE keeps it.
    ("", DETERMINISTIC, 8.0, "2.4.1", "flash"),
    ("", DETERMINISTIC, 8.0, "2.7.4.post1", "flash"),
    ("", DETERMINISTIC, 8.0, None, "flash"),               # not said: >= 2.4.1 assumed
    # Hopper keeps cuDNN fused attention in deterministic mode.
    ("", DETERMINISTIC, 9.0, "none", "flash"),
    # Not deterministic, the GPU not known, or the backend chosen explicitly: no fallback.
    ("", {}, 8.0, "none", "flash"),
    ("", DETERMINISTIC, None, "none", "flash"),
    ("--attention-backend flash", DETERMINISTIC, 8.0, "none", "flash"),
])
def test_deterministic_training_without_flash_attn_falls_back_to_unfused(extra, environ, capability, flash_attn,
                                                                          kernel):
    chosen, total = _kernel_and_layer(extra, environ, capability, flash_attn)
    assert chosen == kernel
    unfused = layer_activations(resolve(TINY_GPT, extra="--attention-backend unfused"), 0).total
    assert total == (unfused if kernel == "unfused" else sum(flash_gpt_layer_parts()))


def test_the_fallback_is_explained_in_the_report():
    from megatron_estimator import api
    from megatron_estimator.model.overhead import Overheads

    from conftest import flags

    inp, problems = api.input_from_flags(flags(TINY_GPT, "--deterministic-mode"), environ={})
    a100 = Overheads(compute_capability=8.0, gpu_known=True)
    assumed = api.evaluate(inp, world_size=1, environ={}, overheads=a100).estimate
    fallback = api.evaluate(inp, world_size=1, environ={},
                            overheads=Overheads(compute_capability=8.0, gpu_known=True, flash_attn="none")).estimate
    [kernel] = [a.text for a in assumed.assumptions if a.key == "attention_backend"]
    assert "assumes flash-attn >= 2.4.1" in kernel and "--flash-attn none" in kernel
    [kernel] = [a.text for a in fallback.assumptions if a.key == "attention_backend"]
    # The facts the sentence must carry: the kernel, the flag and why (deterministic mode, the
    # compute capability given, no flash-attn), and the s^2 cost.
    assert kernel.startswith("attention kernel: unfused")
    for fact in ("--attention-backend auto", "deterministic mode", "compute capability 8", "no flash-attn", "s^2"):
        assert fact in kernel, fact
    # Unfused attention per layer keeps the bf16 softmax output, the 1-byte attention-dropout
    # mask and the bf16 dropped-out probabilities (5 b a s^2, Korthikanti et al.) instead of
    # flash attention's fp32 log-sum-exp (4 b a s); one microbatch of 4 layers on the one stage.
    per_layer = 5 * B * A * S * S - 4 * B * A * S
    assert fallback.stages[0].bytes.activations - assumed.stages[0].bytes.activations == 4 * per_layer
