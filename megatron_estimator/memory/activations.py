"""Activation memory: the bytes a forward pass keeps alive for its backward pass.

Itemized per saved tensor, per transformer layer and per microbatch, on one GPU.  Notation:
s = seq_length / cp (the local sequence), b micro batch, h hidden, a heads, g query
groups, d kv channels, F ffn hidden, t tensor parallel, r = 1/t under sequence parallel
else 1 (the tensors TP leaves replicated: norms, dropout, residual), V padded vocab.

Transformer Engine layer (megatron/core/models/gpt/gpt_layer_specs.py TE spec), from
Transformer Engine's pytorch/module/layernorm_linear.py, linear.py and
attention/dot_product_attention/backends.py (``FusedAttnFunc``, flash attention):
- each LayerNorm+Linear saves its input and the normalized output (2 B each, sharded by t
  under SP) plus mu / rsigma in fp32 (LayerNorm 8 B, RMSNorm 4 B per token);
- the QKV GEMM output stays alive: V (and K without RoPE) are views into it that the
  attention kernel saves (megatron/core/transformer/attention.py splits it with views);
  Q is a copy (the reshape of a strided view, or the RoPE output), K too with RoPE;
- flash / fused attention saves Q, K, V, the output and fp32 softmax statistics (4 B per
  head per token); no s x s term.  The output is also linear_proj's saved input;
- unfused attention (TE UnfusedDotProductAttention, megatron-core DotProductAttention)
  keeps the softmax output (2 B x b a s^2 / t) and, with attention dropout, a 1-byte mask
  and the dropped-out probabilities (Korthikanti et al. 2022: 5 a s^2 b);
- the MLP keeps the fc1 output for the activation's backward (gated: 2F wide) and the
  activation output as fc2's input;
- bias-dropout-add keeps a 1-byte mask per element when hidden dropout > 0.
Selective recompute of ``core_attn`` drops what only the attention kernel needs (the s^2
terms, the softmax statistics); ``mlp`` drops the fc1 / activation outputs; ``layernorm``
drops the normalized outputs.  Full recompute keeps only each recompute group's input
(megatron/core/transformer/transformer_block.py ``_checkpointed_forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import EstimatorConfig


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one transformer layer keeps per microbatch, by part."""
    attention: int
    mlp: int
    norms_and_dropout: int

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.norms_and_dropout


def _dims(config: EstimatorConfig):
    m, p, tr = config.model, config.parallel, config.training
    s = tr.seq_length // p.cp
    b = tr.micro_batch_size
    t = p.tp
    sp = tr.sequence_parallel
    return m, s, b, t, sp


def replicated_elements(config: EstimatorConfig) -> int:
    """Elements of one [s, b, h] tensor on one GPU: sharded by t under sequence parallel."""
    m, s, b, t, sp = _dims(config)
    return s * b * m.hidden_size // (t if sp else 1)


def layer_activations(config: EstimatorConfig, layer_index: int) -> LayerActivations:
    m, s, b, t, sp = _dims(config)
    h, a = m.hidden_size, m.num_attention_heads
    g, d = m.num_query_groups, m.kv_channels
    tokens_r = s * b // (t if sp else 1)          # tokens of replicated tensors
    act_bytes = 2 if config.precision.params_dtype != "fp32" else 4
    recompute = set(config.training.recompute_modules) if config.training.recompute_granularity == "selective" else set()
    stat_bytes = 8 if m.normalization == "LayerNorm" else 4

    # Norms (each fused LayerNorm+Linear): input and normalized output, plus statistics.
    norm_out = 0 if "layernorm" in recompute else act_bytes * tokens_r * h
    norms = 2 * (act_bytes * tokens_r * h + norm_out + stat_bytes * tokens_r)
    dropout_masks = 2 * tokens_r * h if m.hidden_dropout > 0 else 0

    # Attention.
    backend = config.kernels.attention_backend
    rope = m.position_embedding_type in ("rope", "yarn", "mrope")
    if m.mla is not None:
        attention = _mla_attention(config, s, b, t, act_bytes)
    else:
        qkv = act_bytes * s * b * (a + 2 * g) * d // t
        q_copy = act_bytes * s * b * a * d // t if (g > 1 or rope or m.qk_layernorm) else 0
        k_copy = act_bytes * s * b * g * d // t if (rope or m.qk_layernorm) else 0
        qk_norm = 0
        if m.qk_layernorm:
            qk_norm = act_bytes * s * b * (a + g) * d // t + 2 * stat_bytes * s * b * (a + g) // t
        out = act_bytes * s * b * a * d // t
        attention = qkv + q_copy + k_copy + qk_norm + out
        if backend in ("flash", "fused"):
            if "core_attn" not in recompute:
                attention += 4 * b * (a // t) * s
        else:
            if "core_attn" not in recompute:
                probs = act_bytes * b * (a // t) * s * s
                attention += probs
                if m.attention_dropout > 0:
                    attention += b * (a // t) * s * s + act_bytes * b * (a // t) * s * s

    # MLP (dense); MoE layers are modelled in moe_activations.
    f = m.ffn_hidden_size
    if "mlp" in recompute:
        mlp = 0
    else:
        fc1_width = 2 * f if m.gated_linear_unit else f
        mlp = act_bytes * s * b * fc1_width // t + act_bytes * s * b * f // t
    return LayerActivations(attention, mlp, norms + dropout_masks)


def _mla_attention(config: EstimatorConfig, s: int, b: int, t: int, act_bytes: int) -> int:
    """Multi-latent attention (megatron/core/transformer/multi_latent_attention.py): the
    compressed q / kv (replicated down projections), their norms, the up-projected q, k, v
    for the attention kernel, the output."""
    m = config.model
    mla = m.mla
    a = m.num_attention_heads
    q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    total = 0
    if mla.q_lora_rank is not None:
        total += 2 * act_bytes * s * b * mla.q_lora_rank      # q_compressed and its norm output
    total += 2 * act_bytes * s * b * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
    total += act_bytes * s * b * a * q_head // t               # q
    total += act_bytes * s * b * a * (mla.qk_head_dim + mla.v_head_dim) // t   # kv up-projection
    total += act_bytes * s * b * a * q_head // t               # k with the rope part
    total += act_bytes * s * b * a * mla.v_head_dim // t       # output
    total += 4 * b * (a // t) * s
    return total


def layer_input_bytes(config: EstimatorConfig) -> int:
    """What full recompute keeps per recompute group: the group's input [s, b, h]."""
    act_bytes = 2 if config.precision.params_dtype != "fp32" else 4
    elements = replicated_elements(config)
    if config.training.distribute_saved_activations and not config.training.sequence_parallel:
        elements //= config.parallel.tp
    return act_bytes * elements


def embedding_activations(config: EstimatorConfig) -> int:
    """First stage: the embedding's dropout mask (the output is the first layer's input)."""
    m = config.model
    return replicated_elements(config) if m.hidden_dropout > 0 else 0


def loss_activations(config: EstimatorConfig) -> tuple[int, int]:
    """Last stage: (kept per microbatch, transient at the loss).

    Kept: the final norm's input and statistics, the output layer's input, and the fp32
    softmax the vocab-parallel cross entropy saves (megatron/core/tensor_parallel/
    cross_entropy.py: logits are cast to fp32 and exponentiated in place).  Transient: the
    16-bit logits alive next to their fp32 copy (and, in backward, the 16-bit gradient next
    to the fp32 one).
    """
    m, s, b, t, sp = _dims(config)
    act_bytes = 2 if config.precision.params_dtype != "fp32" else 4
    stat_bytes = 8 if m.normalization == "LayerNorm" else 4
    tokens_r = s * b // (t if sp else 1)
    kept = 2 * act_bytes * tokens_r * m.hidden_size + stat_bytes * tokens_r
    logits = s * b * m.padded_vocab_size // t
    kept += 4 * logits
    transient = act_bytes * logits if act_bytes != 4 else 0
    return kept, transient


def mtp_layer_activations(config: EstimatorConfig) -> int:
    """One multi-token-prediction layer (megatron/core/transformer/multi_token_prediction.py):
    the shifted tokens' embedding and the incoming hidden state, each normalized (enorm,
    hnorm: input, output, statistics), their concatenation (eh_proj's 2h-wide input), a
    transformer layer like the last decoder layer, its final norm, and its own logits and
    cross entropy (the same terms as the main loss)."""
    act_bytes = 2 if config.precision.params_dtype != "fp32" else 4
    m = config.model
    stat_bytes = 8 if m.normalization == "LayerNorm" else 4
    tokens_r = replicated_elements(config) // m.hidden_size
    h = m.hidden_size
    norms = 2 * (2 * act_bytes * tokens_r * h + stat_bytes * tokens_r)
    concat = 2 * act_bytes * tokens_r * h
    layer = layer_activations(config, m.num_layers - 1).total
    loss_kept, _ = loss_activations(config)
    return norms + concat + layer + loss_kept
