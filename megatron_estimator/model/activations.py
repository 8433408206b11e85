"""Activation memory: the bytes a forward pass keeps alive for its backward pass.

Itemized per saved tensor, per transformer layer and per microbatch, on one GPU.  Notation:
s = seq_length / cp (the local sequence), b micro batch, h hidden, a heads, g query
groups, d kv channels, F ffn hidden, t tensor parallel, T = s b / t under sequence parallel
else s b (the tokens of the tensors TP leaves replicated: norms, dropout, residual), V padded
vocab, k router top-k, R the routed token rows one expert rank processes.

Transformer Engine layers (megatron/core/models/gpt/gpt_layer_specs.py), from Transformer
Engine's pytorch/module/layernorm_linear.py, linear.py, layernorm.py and
attention/dot_product_attention/backends.py:
- a LayerNorm+Linear saves its input (2 B), the normalized output (2 B, or 1 B as fp8), and
  mu / rsigma in fp32 (LayerNorm 8 B, RMSNorm 4 B per token), all sharded under SP;
- the QKV GEMM output stays alive: V (and K without RoPE) are views into it that the
  attention kernel saves (megatron/core/transformer/attention.py splits it with views);
  Q is a copy (the reshape of a strided view, or the RoPE output), K too with RoPE;
- flash / fused attention saves Q, K, V, the output and fp32 softmax statistics (4 B per
  head per token): no s x s term.  The output is also linear_proj's saved input (under fp8
  linear_proj keeps its own 1-byte copy);
- unfused attention (TE UnfusedDotProductAttention, megatron-core DotProductAttention)
  keeps the softmax output (b a s^2 / t elements), with attention dropout a 1-byte mask and
  the dropped-out probabilities (Korthikanti et al. 2022: 5 a s^2 b), K and V repeated to
  all heads under GQA, and an fp32 softmax when the fused softmax kernel is off;
- the MLP keeps the fc1 output for the activation's backward (2F wide when gated) and the
  activation output as fc2's input (two more F-wide tensors for an unfused SwiGLU);
- multi-latent attention (megatron/core/transformer/multi_latent_attention.py) keeps the
  compressed q / kv and their norms, the up-projected Q, K (with the rope part) and the
  KV up-projection V is a view of;
- MoE layers (megatron/core/transformer/moe/): a separate pre-MLP norm, router logits and
  scores in fp32, the R dispatched rows (fc1 input, fc1 output, activation output, probs)
  of the local experts, and the shared expert like a dense MLP;
- bias-dropout-add keeps a 1-byte mask per element when hidden dropout > 0.
Selective recompute (megatron/core/transformer/transformer_config.py ``recompute_modules``)
drops what each module recomputes: ``core_attn`` the attention internals, ``mlp`` the MLP,
``layernorm`` the normalized outputs, ``mla_up_proj`` the up-projected Q/K/V, ``moe`` the
whole MoE block, ``moe_act`` the experts' activation outputs, ``shared_experts`` the shared
expert.  Full recompute keeps only each group's input (transformer_block.py; hybrid stacks use the
same megatron/core/recompute.py ``checkpointed_forward``).

Hybrid layers (megatron/core/models/hybrid/hybrid_layer_specs.py): ``*`` / ``+`` keep a layer's
attention half, ``-`` / ``E`` its MLP / MoE half, each with one bias-dropout-add.  A Mamba
layer (``M``, megatron/core/ssm/mamba_mixer.py ``MambaMixer._ssm_training``, the default
memory-efficient path) keeps: the fused norm + in_proj's input, normalized output and
statistics; the contiguous ``zxBCdt`` in_proj output ``(2 d_inner + 2 groups state + heads)/t``
wide and the scan's pre-gate output ``d_inner/t`` (mamba_ssm/ops/triton/ssd_combined.py
``MambaSplitConv1dScanCombinedFn.forward`` saves ``zxbcdt`` and ``out_x``, and recomputes the
convolution and the chunk states in backward); the gated RMSNorm's input ``d_inner/t`` and fp32
rstd per group (mamba_ssm/ops/triton/layernorm_gated.py ``LayerNormFn``); out_proj's input
(1 byte under fp8).  The kernels are mamba_ssm's, outside megatron-core: what they save is
taken from mamba_ssm 2.x and assumed.  Selective recompute modules do not apply to it.  Under
context parallelism (megatron/core/ssm/mamba_context_parallel.py, all-to-all) the scan runs on
the whole sequence with a 1/cp share of the heads, so its saved tensors keep their size per
GPU but for the B / C group states repeated when cp exceeds the local groups
(``mamba_zxbcdt_width``); the parameters are the TP shard's, sliced, not copied.


A gated delta net layer (``G``, megatron/core/ssm/gated_delta_net/gdn.py ``GatedDeltaNet.forward``;
widths per GPU, ``Hk`` / ``Hv`` key / value heads, ``dk`` / ``dv`` their dims; under context
parallelism its all-to-all trades sequence for heads, so the element counts are the same) keeps:
the fused norm + in_proj's input, normalized output and statistics ('layernorm' recompute does not
apply: the norm is inside in_proj); the whole in_proj output (the convolution's input and the
z / beta / alpha gates are views of it); the L2-normalized q, k and their fp32 rstd; the chunked
kernel's q, k (repeated to the value heads), v, fp32 g, beta and its ``64``-wide (chunk size)
triangular solve A; the kernel output and the gate z the gated norm saves, with its fp32 rstd per
value head; out_proj's input.  Selective 'gdn_norm_out' (common.py ``recompute_norm_out``) keeps
only the norm's inputs.  The convolution, L2 norm and chunked delta rule are flash-linear-
attention's kernels (fla), outside megatron-core: what they save is taken from fla's autograd
functions (CausalConv1dFunction saves its input x; L2NormFunction its output and fp32 rstd;
ChunkGatedDeltaRuleFunction q, k, v, the chunk-cumulated g, beta and A) and assumed for the
installed version (fla releases whose causal_conv1d makes its input contiguous save a copy of q, k,
v instead of keeping in_proj's output alive: less); gdn2 is taken to save the same with its
channel-wise f / b / w gates.

A DeepSeek sparse attention layer (``D``, experimental_attention_variant/absorbed_mla.py
``AbsorbedMLASelfAttention.forward`` and dsa.py ``DSAttention.forward``; n = a / t local heads,
L kv_lora, P the rope dims) keeps: its input norm (a separate TENorm); the compressed q (and, with
--qk-layernorm, the norms' inputs and statistics); the up-projected Q (the k-absorption einsum saves
a view of it; 'mla_up_proj' drops it and keeps the checkpoint's gathered kv and rope inputs). The
indexer runs under no_grad (no --dsa-indexer-loss-coeff) and saves nothing.  Its core, on the
PyTorch path (--dsa-kernel-backend none, dsa.py ``_unfused_absorbed_dsa_fn``): the fp32 query, the
fp32 key expanded to every head (torch.matmul copies a broadcast batch operand), per element of
the b n s x s_kv scores the exponentials and masked probabilities (fp32), the probabilities cast
for the value matmul and three bool masks (each ``~valid_mask``), per row the max's int64 index,
the where's condition and the fp32 row sum (clamp and divide), the latent value expanded to every
head, the latent output and the contiguous copy of the V up-projection weight its einsum saves;
with --dsa-kernel-backend tilelang / cudnn the fused kernel is assumed to save its query, key,
latent output, fp32 log-sum-exp per head and int32 top-k indices.  'core_attn' keeps the
checkpoint's inputs (query, key) instead.  linear_proj keeps its input.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from megatron_estimator.config.typed import EstimatorConfig


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one transformer layer keeps per microbatch, by part."""
    attention: int
    mlp: int
    norms_and_dropout: int

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.norms_and_dropout


@dataclass(frozen=True)
class Dims:
    s: int              # local sequence length (seq / cp)
    b: int
    t: int
    tokens: int         # s * b
    tokens_r: int       # tokens of SP-sharded tensors
    act: int            # bytes of a 16-bit (or fp32) activation element
    residual: int       # bytes of a residual-stream element (fp32 with --fp32-residual-connection)
    linear_in: int      # bytes of a saved linear input (1 under fp8)
    stat: int           # norm statistics per token
    recompute: frozenset


@lru_cache(maxsize=256)
def dims(config: EstimatorConfig) -> Dims:
    m, p, tr = config.model, config.parallel, config.training
    s = tr.seq_length // p.cp
    b = tr.micro_batch_size
    t = p.tp
    act = 2 if config.precision.params_dtype != "fp32" else 4
    recompute = frozenset(tr.recompute_modules) if tr.recompute_granularity == "selective" else frozenset()
    return Dims(
        s=s, b=b, t=t, tokens=s * b, tokens_r=s * b // (t if tr.sequence_parallel else 1), act=act,
        residual=4 if tr.fp32_residual_connection else act,
        linear_in=1 if config.precision.fp8 else act,
        stat=8 if m.normalization == "LayerNorm" else 4,
        recompute=recompute,
    )


def replicated_elements(config: EstimatorConfig) -> int:
    """Elements of one [s, b, h] tensor on one GPU: sharded by t under sequence parallel."""
    return dims(config).tokens_r * config.model.hidden_size


def _norm_block(d: Dims, h: int, fused_output_bytes: int) -> int:
    """A norm (fused with the next linear, or not): input, normalized output, statistics."""
    out = 0 if "layernorm" in d.recompute else fused_output_bytes * d.tokens_r * h
    return d.residual * d.tokens_r * h + out + d.stat * d.tokens_r


def core_attention_bytes(config: EstimatorConfig, heads: int, qk_dim: int, v_dim: int, kv_heads: int) -> int:
    """What the attention kernel keeps beyond its Q/K/V inputs: output and internals."""
    m, k = config.model, config.kernels
    d = dims(config)
    a = heads // d.t
    out = d.act * d.tokens * heads * v_dim // d.t
    if config.precision.fp8:
        out += d.tokens * heads * v_dim // d.t            # linear_proj's fp8 copy of its input
    if "core_attn" in d.recompute:
        return out
    if k.attention_backend in ("flash", "fused"):
        return out + 4 * d.b * a * d.s
    probs = d.b * a * d.s * d.s
    internals = d.act * probs
    if not k.masked_softmax_fusion and config.precision.attention_softmax_in_fp32 and d.act == 2:
        internals += 4 * probs                            # fp32 softmax output next to its 16-bit cast
    if m.attention_dropout > 0:
        internals += probs + d.act * probs                # 1-byte mask and the dropped-out probabilities
    if kv_heads < heads and config.model.mla is None:
        internals += d.act * d.tokens * heads * (qk_dim + v_dim) // d.t   # K, V repeated to every head
    return out + internals


def attention_bytes(config: EstimatorConfig) -> int:
    m = config.model
    d = dims(config)
    if m.mla is not None:
        return _mla_bytes(config)
    a, g, kv = m.num_attention_heads, m.num_query_groups, m.kv_channels
    rope = m.position_embedding_type in ("rope", "yarn", "mrope")
    # Unfused attention repeats K and V to every head under GQA and saves the copies, not the
    # views; when core attention is recomputed its checkpoint saves the views instead.
    repeats = (g < a and config.kernels.attention_backend not in ("flash", "fused")
               and "core_attn" not in d.recompute)
    total = 0
    if not repeats:
        # V (and K without RoPE) are views of the QKV output: its whole storage stays alive.
        total += d.act * d.tokens * (a + 2 * g) * kv // d.t
        if rope or m.qk_layernorm:
            total += d.act * d.tokens * g * kv // d.t                   # K copy
    # else: unfused GQA saves K and V repeated to every head (core_attention_bytes), not the views.
    if 1 < g < a or rope or m.qk_layernorm:
        # Q is a copy when the reshape of its strided view cannot be a view (1 < g < a), or the
        # output of RoPE / the q norm; with g == a (or g == 1) it is a view of the QKV output.
        total += d.act * d.tokens * a * kv // d.t
    if m.qk_layernorm:
        total += d.act * d.tokens * (a + g) * kv // d.t + d.stat * d.tokens * (a + g) // d.t
    return total + core_attention_bytes(config, a, kv, kv, g)


def _mla_bytes(config: EstimatorConfig) -> int:
    m = config.model
    mla = m.mla
    d = dims(config)
    a = m.num_attention_heads
    q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    total = 0
    normed = m.qk_layernorm        # the compressed q / kv are normalized only with --qk-layernorm
    if mla.q_lora_rank is not None:
        total += d.act * d.tokens_r * mla.q_lora_rank
        if normed:
            total += d.linear_in * d.tokens_r * mla.q_lora_rank + d.stat * d.tokens_r
    elif mla.q_proj_norm:
        # linear_q_proj fused with the q norm (mla_qk_norm_config.py, 0.19.0 on): its normalized
        # hidden states (the GEMM's input) and the norm's statistics; its input is the layer's.
        total += d.linear_in * d.tokens_r * m.hidden_size + d.stat * d.tokens_r
    total += d.act * d.tokens_r * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
    if normed:
        total += d.linear_in * d.tokens_r * mla.kv_lora_rank + d.stat * d.tokens_r
    if "mla_up_proj" not in d.recompute:
        total += d.act * d.tokens * a * q_head // d.t                                 # Q
        total += d.act * d.tokens * a * (mla.qk_head_dim + mla.v_head_dim) // d.t     # KV up, V's storage
        total += d.act * d.tokens * a * q_head // d.t                                 # K with the rope part
    return total + core_attention_bytes(config, a, q_head, mla.v_head_dim, a)


def dense_mlp_bytes(config: EstimatorConfig, ffn: int, tokens: int, split: int) -> int:
    m, k = config.model, config.kernels
    d = dims(config)
    fc1_width = 2 * ffn if m.gated_linear_unit else ffn
    fc1_out = d.act * tokens * fc1_width // split
    act_out = d.linear_in * tokens * ffn // split
    total = fc1_out + act_out
    if m.gated_linear_unit and not k.bias_swiglu_fusion:
        # megatron/core/transformer/mlp.py glu(): act(x1) * (x2 + glu_linear_offset) keeps the
        # activation output and the offset copy of x2 for the product's backward.
        total += 2 * d.act * tokens * ffn // split
    return total


def routed_rows(config: EstimatorConfig, imbalance: float = 0.0) -> int:
    """Token rows one expert rank processes: T k etp when balanced (all dispatchers);
    a hot rank receives (1 + imbalance) times that, bounded by the capacity factor, and
    padding to capacity makes it exactly the capacity
    (megatron/core/transformer/moe/token_dispatcher.py, moe_utils.get_capacity)."""
    moe = config.model.moe
    d = dims(config)
    tokens = d.tokens // d.t if config.training.sequence_parallel else d.tokens
    balanced = tokens * moe.router_topk * config.parallel.etp
    factor = 1.0 + imbalance
    if moe.expert_capacity_factor is not None:
        cap = moe.expert_capacity_factor
        factor = cap if moe.pad_expert_input_to_capacity else min(factor, cap)
    return int(balanced * factor)


def _experts_keep_unweighted_activation(config: EstimatorConfig) -> bool:
    """Whether the experts save their activation output twice: before and after the router
    probabilities scale it.  Without a fused weighted kernel, megatron/core/transformer/moe/
    experts.py ``TEGroupedMLP.forward`` (``bias_act_func``) and megatron/core/transformer/mlp.py
    ``MLP.forward`` (SequentialMLP's experts, ``per_token_scale``) compute
    ``(act(fc1) * probs).to(dtype)``: the product keeps ``act(fc1)`` for the probabilities'
    gradient and fc2 keeps the cast result.  The fused weighted SwiGLU / quick-GeGLU kernels
    (bias activation fusion, i.e. --bias-swiglu-fusion for SwiGLU, --bias-gelu-fusion otherwise)
    and the fused weighted squared ReLU save only their input; with --moe-apply-probs-on-input
    the probabilities are ones that need no gradient."""
    m, k = config.model, config.kernels
    if m.moe is not None and m.moe.apply_probs_on_input:
        return False
    if k.te_activation_func:
        return True
    if m.activation == "squared_relu":
        return not k.fused_weighted_squared_relu
    fusion = config.kernels.bias_swiglu_fusion if m.activation == "swiglu" else config.kernels.bias_gelu_fusion
    return not (fusion and m.activation in ("swiglu", "quick_geglu"))


def moe_mlp_bytes(config: EstimatorConfig, imbalance: float = 0.0) -> int:
    m = config.model
    moe = m.moe
    d = dims(config)
    h = m.hidden_size
    if "moe" in d.recompute:
        return 0
    tokens = d.tokens // d.t if config.training.sequence_parallel else d.tokens
    # Per local token: the routing map (bool) and its probabilities (16-bit, fp32 with
    # --moe-router-dtype fp32) over E experts; top-k indices (int64), top-k probabilities
    # (fp32) and the permutation indices (int64): 20 bytes per k.
    prob_bytes = 4 if moe.router_dtype in ("fp32", "fp64") else 2
    router = tokens * (moe.num_experts * (1 + prob_bytes) + 20 * moe.router_topk)
    if moe.score_function == "sigmoid":
        # megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function
        # (core_v0.16.1:717): torch.sigmoid(logits.float()) saves its fp32 [T, E] output for
        # backward, whatever --moe-router-dtype (measured with megatron-core's own router:
        # tests/test_mcore_crosscheck.py).
        router += tokens * 4 * moe.num_experts
    rows = routed_rows(config, imbalance)
    etp = config.parallel.etp
    fc1_width = 2 * moe.ffn_hidden_size if m.gated_linear_unit else moe.ffn_hidden_size
    routed = d.linear_in * rows * h + 2 * rows                        # dispatched input, permuted probs
    routed += d.act * rows * fc1_width // etp                          # fc1 output
    if "moe_act" not in d.recompute:
        routed += d.linear_in * rows * moe.ffn_hidden_size // etp      # activation output
        if _experts_keep_unweighted_activation(config):
            routed += d.act * rows * moe.ffn_hidden_size // etp        # ... before the probs multiply
    shared = 0
    if moe.shared_expert_intermediate_size and "shared_experts" not in d.recompute:
        shared = dense_mlp_bytes(config, moe.shared_expert_intermediate_size, d.tokens, d.t)
    return router + routed + shared


def mamba_zxbcdt_width(config: EstimatorConfig) -> int:
    """Elements per local token of the ``zxBCdt`` tensor the Mamba scan saves (and of its
    gradient), on one GPU.  Under context parallelism megatron/core/ssm/mamba_context_parallel.py
    ``pre_conv_ssm`` trades the sequence shard for a head shard (all-to-all: the full sequence,
    heads / (t cp) per GPU, the same elements), but B and C carry max(groups / t, cp) group
    states: with fewer local groups than CP ranks each group's state is repeated on the
    ``cp / (groups / t)`` ranks that share its heads."""
    hy = config.model.hybrid
    t, cp = config.parallel.tp, config.parallel.cp
    return 2 * (hy.d_inner // t) + 2 * max(hy.num_groups // t, cp) * hy.state_dim + hy.num_heads // t


def mamba_mixer_bytes(config: EstimatorConfig) -> int:
    """What a Mamba mixer keeps beyond its fused norm (see the module notes)."""
    hy = config.model.hybrid
    d = dims(config)
    inner = hy.d_inner // d.t
    zxbcdt = mamba_zxbcdt_width(config)
    return (d.act * d.tokens * zxbcdt            # in_proj output, transposed contiguous copy
            + d.act * d.tokens * inner           # scan output before the z gate (out_x)
            + d.act * d.tokens * inner           # gated RMSNorm input
            + 4 * d.tokens * (hy.num_groups // d.t)   # its rstd per group
            + d.linear_in * d.tokens * inner)    # out_proj input


def gdn_bytes(config: EstimatorConfig) -> int:
    """What a gated delta net layer keeps beyond its fused norm (see the module notes)."""
    from megatron_estimator.config.hybrid import gdn_in_proj_width

    gdn = config.model.hybrid.gdn
    d = dims(config)
    t, T = d.t, d.tokens
    qk, v = gdn.key_heads * gdn.key_head_dim // t, gdn.value_heads * gdn.value_head_dim // t
    hk, hv = gdn.key_heads // t, gdn.value_heads // t
    width = gdn_in_proj_width(gdn.variant, gdn.key_heads * gdn.key_head_dim,
                              gdn.value_heads * gdn.value_head_dim, gdn.value_heads) // t
    total = d.act * T * width                          # in_proj output (conv input, z, gates are views)
    total += d.act * T * 2 * qk + 4 * T * 2 * hk       # L2-normalized q, k and their fp32 rstd
    total += d.act * T * 2 * hv * gdn.key_head_dim     # kernel q, k (repeated to the value heads)
    total += d.act * T * v                             # kernel v
    if gdn.variant == "gdn":
        total += 4 * T * hv + d.act * T * hv           # fp32 g (cumulative decay), beta
    else:
        total += 4 * T * qk + d.act * T * qk + d.act * T * v   # gdn2: fp32 g, b per key channel, w
    total += d.act * T * hv * 64                       # the chunk's triangular solve A (chunk size 64)
    total += 2 * d.act * T * v                         # kernel output and gate z (the gated norm's inputs)
    if "gdn_norm_out" not in d.recompute:
        total += 4 * T * hv + d.linear_in * T * v      # the norm's fp32 rstd per value head, out_proj input
    return total


def dsa_bytes(config: EstimatorConfig) -> int:
    """What a DeepSeek sparse attention layer keeps beyond its input norm (see the module notes)."""
    m, mla, dsa = config.model, config.model.mla, config.model.hybrid.dsa
    d = dims(config)
    T, Tr = d.tokens, d.tokens_r
    n = m.num_attention_heads // d.t
    L, P = mla.kv_lora_rank, mla.qk_pos_emb_head_dim
    total = 0
    if mla.q_lora_rank is not None:
        total += d.act * Tr * mla.q_lora_rank                         # compressed q (q up-proj input)
        if dsa.qk_layernorm:
            total += d.act * Tr * mla.q_lora_rank + d.stat * Tr       # q norm output and statistics
    if dsa.qk_layernorm:
        total += d.act * Tr * (L + P) + d.stat * Tr                   # kv norm input (the kv down-proj output)
    if "mla_up_proj" in d.recompute:
        total += d.act * T * (L + P)                                  # the checkpoint's gathered kv and rope
    else:
        total += d.act * T * n * (mla.qk_head_dim + P)                # up-projected Q (absorption einsum)
    return total + dsa_core_bytes(config) + d.linear_in * T * n * mla.v_head_dim   # + linear_proj input


def dsa_core_bytes(config: EstimatorConfig) -> int:
    """What a DSA layer's core attention keeps (dsa.py ``_run_sparse_attention`` with the V
    up-projection einsum), or with 'core_attn' the checkpoint's query and key."""
    m, mla, dsa = config.model, config.model.mla, config.model.hybrid.dsa
    d = dims(config)
    T, b, s = d.tokens, d.b, d.s
    skv = s * config.parallel.cp                      # keys gathered over context parallel (allgather)
    n = m.num_attention_heads // d.t
    L, P = mla.kv_lora_rank, mla.qk_pos_emb_head_dim
    total = 0
    if "core_attn" in d.recompute:
        total += d.act * T * n * (L + P) + d.act * T * (L + P)        # checkpoint inputs: query, key
    elif (dsa.kernel_backend == "none" or config.kernels.attention_backend == "unfused"):
        scores = b * n * s * skv
        total += 4 * T * n * (L + P)                                  # fp32 query
        total += 4 * b * n * (L + P) * skv                            # fp32 key expanded to every head
        total += (4 + 4 + d.act + 3) * scores                         # exp, masked probs, cast probs, 3 masks
        total += (8 + 1 + 4 + 4) * b * n * s                          # row max index, where, row sum x2
        total += d.act * b * n * skv * L                              # latent value expanded to every head
        total += d.act * T * n * L + d.act * n * mla.v_head_dim * L   # latent output, V up weight copy
    else:
        total += d.act * T * n * (L + P) + d.act * skv * b * (L + P)  # fused kernel: query, key
        total += d.act * T * n * L + 4 * T * n + 4 * T * dsa.topk     # latent output, LSE, top-k indices
        total += d.act * n * mla.v_head_dim * L                       # V up weight copy (einsum)
    return total


@lru_cache(maxsize=1024)
def hybrid_layer_activations(config: EstimatorConfig, kind: str, imbalance: float = 0.0) -> LayerActivations:
    """One hybrid layer of this pattern symbol, per microbatch."""
    m = config.model
    d = dims(config)
    h = m.hidden_size
    mask = (1 if m.hidden_dropout > 0 else 0) * d.tokens_r * h
    if kind == "M":
        # MambaLayer (megatron/core/ssm/mamba_layer.py) is no TransformerLayer: the selective
        # 'layernorm' recompute never drops its fused norm's output.
        norm = d.residual * d.tokens_r * h + d.linear_in * d.tokens_r * h + d.stat * d.tokens_r
        return LayerActivations(mamba_mixer_bytes(config), 0, norm + mask)
    if kind == "G":     # the norm is fused into in_proj: 'layernorm' recompute does not reach it
        norm = d.residual * d.tokens_r * h + d.linear_in * d.tokens_r * h + d.stat * d.tokens_r
        return LayerActivations(gdn_bytes(config), 0, norm + mask)
    if kind == "D":
        return LayerActivations(dsa_bytes(config), 0, _norm_block(d, h, d.act) + mask)
    if kind in ("*", "+"):
        norm = _norm_block(d, h, d.linear_in if m.mla is None else d.act)
        return LayerActivations(attention_bytes(config), 0, norm + mask)
    if kind == "E":
        if "moe" in d.recompute:
            return LayerActivations(0, 0, d.residual * d.tokens_r * h + mask)
        return LayerActivations(0, moe_mlp_bytes(config, imbalance), _norm_block(d, h, d.act) + mask)
    if "mlp" in d.recompute:
        return LayerActivations(0, 0, d.residual * d.tokens_r * h + mask)
    return LayerActivations(0, dense_mlp_bytes(config, m.ffn_hidden_size, d.tokens, d.t),
                            _norm_block(d, h, d.linear_in) + mask)


def _full_layer(config: EstimatorConfig, layer_index: int, imbalance: float) -> LayerActivations:
    kind = config.model.layer_kind(layer_index)
    if kind is not None:
        return hybrid_layer_activations(config, kind, imbalance)
    return _layer_activations(config, config.model.is_moe_layer(layer_index), imbalance)


def layer_activations(config: EstimatorConfig, layer_index: int, imbalance: float = 0.0) -> LayerActivations:
    """What one layer keeps per microbatch, after fine-grained activation offloading."""
    full = _full_layer(config, layer_index, imbalance)
    offloaded = offloaded_bytes(config, layer_index, imbalance)
    if not offloaded:
        return full
    # Offloading moves the tensors of attention and of the MoE experts; take them from those parts.
    from_attention = min(offloaded, full.attention + full.norms_and_dropout)
    from_mlp = offloaded - from_attention
    norms = max(full.norms_and_dropout - max(from_attention - full.attention, 0), 0)
    return LayerActivations(max(full.attention - from_attention, 0), max(full.mlp - from_mlp, 0), norms)


def offloaded_bytes(config: EstimatorConfig, layer_index: int, imbalance: float = 0.0) -> int:
    """Bytes of one layer that --fine-grained-activation-offloading moves to the host after the
    layer's forward (megatron/core/pipeline_parallel/fine_grained_activation_offload.py): the
    saved tensors of each module in --offload-modules, times --activation-offload-fraction;
    tensors under --min-offloaded-tensor-size elements stay."""
    offload = config.offload
    if not offload.fine_grained:
        return 0
    modules = set(offload.modules)
    fraction = offload.fraction
    min_elements = offload.min_tensor_size
    m = config.model
    d = dims(config)
    h = m.hidden_size

    def big(nbytes: int, element_bytes: int) -> int:
        return nbytes if nbytes // max(element_bytes, 1) >= min_elements else 0

    moe_layer = m.is_moe_layer(layer_index)
    kind = m.layer_kind(layer_index)
    if kind in ("M", "G", "D"):
        # the offloading hooks are in TransformerLayer's modules, not MambaLayer's; for the gated
        # delta net and DSA attention they are not modelled: nothing is taken as offloaded
        return 0
    if kind in ("*", "+"):
        modules -= {"mlp_norm", "expert_fc1", "moe_act"}
    elif kind in ("-", "E"):
        modules -= {"attn_norm", "qkv_linear", "core_attn", "attn_proj"}
    total = 0
    if "attn_norm" in modules:
        total += big(d.residual * d.tokens_r * h, d.residual)
    if "qkv_linear" in modules:
        total += big(d.linear_in * d.tokens_r * h, d.linear_in)
    if "core_attn" in modules:
        attention = attention_bytes(config)
        out = d.act * d.tokens * m.num_attention_heads * (m.mla.v_head_dim if m.mla else m.kv_channels) // d.t
        total += big(attention - out, d.act)
        if "attn_proj" in modules:
            total += big(out, d.act)
    if "mlp_norm" in modules:
        total += big(d.residual * d.tokens_r * h, d.residual)
    if moe_layer and m.moe is not None:
        rows = routed_rows(config, imbalance)
        etp = config.parallel.etp
        fc1_width = 2 * m.moe.ffn_hidden_size if m.gated_linear_unit else m.moe.ffn_hidden_size
        if "expert_fc1" in modules:
            total += big(d.linear_in * rows * h, d.linear_in)
        if "moe_act" in modules:
            total += big(d.act * rows * fc1_width // etp, d.act)
    return int(total * fraction)


@lru_cache(maxsize=1024)
def _layer_activations(config: EstimatorConfig, moe_layer: bool, imbalance: float) -> LayerActivations:
    m = config.model
    d = dims(config)
    h = m.hidden_size
    masks = (2 if m.hidden_dropout > 0 else 0) * d.tokens_r * h
    norm1 = _norm_block(d, h, d.linear_in if m.mla is None else d.act)
    attention = attention_bytes(config)
    if moe_layer:
        if "moe" in d.recompute:
            norm2, mlp = d.residual * d.tokens_r * h, 0
        else:
            norm2 = _norm_block(d, h, d.act)               # a separate norm: its output feeds the router
            mlp = moe_mlp_bytes(config, imbalance)
    elif "mlp" in d.recompute:
        norm2, mlp = d.residual * d.tokens_r * h, 0         # the MLP block (with its norm) is recomputed
    else:
        norm2 = _norm_block(d, h, d.linear_in)
        mlp = dense_mlp_bytes(config, m.ffn_hidden_size, d.tokens, d.t)
    return LayerActivations(attention, mlp, norm1 + norm2 + masks)


def layer_input_bytes(config: EstimatorConfig) -> int:
    """What full recompute keeps per recompute group: the group's input [s, b, h]."""
    d = dims(config)
    elements = d.tokens_r * config.model.hidden_size
    if config.training.distribute_saved_activations and not config.training.sequence_parallel:
        elements //= config.parallel.tp
    return d.residual * elements


def embedding_activations(config: EstimatorConfig) -> int:
    """First stage: the embedding's dropout mask (the output is the first layer's input)."""
    return replicated_elements(config) if config.model.hidden_dropout > 0 else 0


def loss_activations(config: EstimatorConfig, main: bool = True) -> tuple[int, int]:
    """Last stage: (kept per microbatch, transient at the loss); ``main``: the main output
    layer's loss (False: an MTP layer's), which distillation with ``skip_lm_loss`` does not
    run while training (model/distillation.py): then only the output layer's input is kept.

    Kept: the final norm's input and statistics, the output layer's input, and the fp32
    softmax the vocab-parallel cross entropy saves (megatron/core/tensor_parallel/
    cross_entropy.py: logits are cast to fp32 and exponentiated in place).  Transient: the
    16-bit logits alive next to their fp32 copy (and, in backward, the 16-bit gradient next
    to the fp32 one).
    """
    m = config.model
    d = dims(config)
    kept = d.residual * d.tokens_r * m.hidden_size + d.act * d.tokens_r * m.hidden_size + d.stat * d.tokens_r
    if main and config.distillation is not None and config.distillation.skip_lm_loss:
        return kept, 0
    logits = d.tokens * m.padded_vocab_size // d.t
    kept += 4 * logits
    transient = d.act * logits if d.act != 4 else 0
    return kept, transient


def mtp_layer_activations(config: EstimatorConfig) -> int:
    """One multi-token-prediction layer (megatron/core/transformer/multi_token_prediction.py):
    the shifted tokens' embedding and the incoming hidden state, each normalized (enorm,
    hnorm: input, output, statistics), their concatenation (eh_proj's 2h-wide input), a
    transformer layer like the last decoder layer, and its own final norm, logits and cross
    entropy (the same terms as the main loss)."""
    m = config.model
    d = dims(config)
    h = m.hidden_size
    norms = 2 * (2 * d.act * d.tokens_r * h + d.stat * d.tokens_r)
    concat = 2 * d.act * d.tokens_r * h
    if m.hybrid is not None:      # a hybrid MTP layer runs its own pattern
        layer = sum(hybrid_layer_activations(config, kind).total for kind in m.hybrid.mtp_kinds)
    else:
        layer = layer_activations(config, m.num_layers - 1).total
    loss_kept, _ = loss_activations(config, main=False)
    return norms + concat + layer + loss_kept
