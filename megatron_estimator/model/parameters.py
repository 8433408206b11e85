"""Parameters exactly as megatron-core builds them, per pipeline stage, on one GPU.

Every parameter tensor is listed with its local (per-GPU) element count, so that model
states, buffer padding and expert sharding can be computed from the same list.  Shapes
follow megatron-core (0.16.1 and the Megatron-LM commit the project's flag table was read
from):

- attention: megatron/core/transformer/attention.py ``SelfAttention``: linear_qkv
  ``h -> (a + 2g) d`` column-parallel (bias when add_bias_linear or add_qkv_bias),
  linear_proj ``a d -> h`` row-parallel (bias h, not split), q/k layernorm of size d;
- multi-latent attention: megatron/core/transformer/multi_latent_attention.py: q path
  (``linear_q_proj`` or down ``h -> q_lora`` + norm + up ``q_lora -> a (qk + pe)``), kv path
  (down ``h -> kv_lora + pe`` + norm + up ``kv_lora -> a (qk + v)``), out ``a v -> h``; the two
  norms exist only with --qk-layernorm;
  Transformer Engine duplicates the down projections on every TP rank, the local spec
  splits them like any column-parallel linear;
- MLP: megatron/core/transformer/mlp.py: fc1 ``h -> F`` (``2F`` gated), fc2 ``F -> h``;
- MoE: megatron/core/transformer/moe/: router ``E x h`` fp32-created (bias E with
  add_bias_linear), ``E / ep`` local experts each split by etp, shared expert split by tp,
  plus a ``1 x h`` gate with --moe-shared-expert-gate;
- norms: LayerNorm has weight and bias, RMSNorm a weight; two per layer and a final one
  (Transformer Engine fuses them into the following linear; the count is the same);
- embedding: megatron/core/models/common/embeddings/language_model_embedding.py
  (``V/t x h`` word embeddings, learned absolute positions ``max_pos x h`` not split);
  output layer ``V/t x h`` (megatron/core/models/gpt/gpt_model.py);
- MTP: megatron/core/transformer/multi_token_prediction.py: per MTP layer two norms
  (enorm, hnorm), ``eh_proj`` ``2h -> h`` column-parallel, one transformer layer, a final norm;
  a hybrid model's MTP layer holds the layers of its MTP pattern instead (a nested HybridStack
  without a final norm);
- hybrid layers (megatron/core/models/hybrid/hybrid_layer_specs.py ``hybrid_stack_spec``):
  ``*`` an attention-only TransformerLayer, ``+`` an MLA-only one (its q / kv norms IdentityOp),
  ``-`` an MLPLayer (norm fused into fc1), ``E`` a MoE layer with its pre-MLP norm, ``M`` a
  MambaLayer whose MambaMixer (megatron/core/ssm/mamba_mixer.py) holds: in_proj
  ``h -> 2 d_inner + 2 groups state + heads`` column-parallel with the layer's norm fused in,
  conv1d weight ``(d_inner + 2 groups state)/t x 4`` and bias, dt_bias, A_log and D of
  ``heads/t`` each, the gated RMSNorm of ``d_inner/t``, out_proj ``d_inner -> h``
  row-parallel, no biases.  Float16Module casts all of them to the training dtype.
"""

from __future__ import annotations

from megatron_estimator.core.dataclass import NamedTuple, dataclass

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model.layout import ModelChunk


class ParamTensor(NamedTuple):
    """One parameter tensor on one GPU (a named tuple: an estimate makes thousands)."""
    name: str
    numel: int          # elements on one GPU
    expert: bool = False
    kind: str = "linear"    # linear (a GEMM weight TE can run in fp8) | bias | norm | embedding | router


def _norm(name: str, size: int, normalization: str) -> list[ParamTensor]:
    tensors = [ParamTensor(name + ".weight", size, kind="norm")]
    if normalization == "LayerNorm":
        tensors.append(ParamTensor(name + ".bias", size, kind="norm"))
    return tensors


def _linear(name: str, in_features: int, out_features: int, bias: bool,
            bias_size: int | None = None, expert: bool = False) -> list[ParamTensor]:
    # Only GEMM weights (linear) run in fp8; the router's weight is a plain fp32-created matmul.
    kind = "router" if name.endswith(".router") else "linear"
    tensors = [ParamTensor(name + ".weight", in_features * out_features, expert, kind)]
    if bias:
        tensors.append(ParamTensor(name + ".bias", out_features if bias_size is None else bias_size, expert, "bias"))
    return tensors


def attention_tensors(config: EstimatorConfig, prefix: str) -> list[ParamTensor]:
    m = config.model
    t = config.parallel.tp
    h, a, norm = m.hidden_size, m.num_attention_heads, m.normalization
    tensors = _norm(prefix + "input_layernorm", h, norm)
    if m.mla is not None:
        mla = m.mla
        duplicated = config.kernels.transformer_impl == "transformer_engine"
        down_split = 1 if duplicated else t
        q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
        if mla.q_lora_rank is None:
            tensors += _linear(prefix + "self_attention.linear_q_proj", h, a * q_head // t, False)
        else:
            tensors += _linear(prefix + "self_attention.linear_q_down_proj", h, mla.q_lora_rank // down_split, False)
            if m.qk_layernorm:  # the q / kv norms exist only with --qk-layernorm (IdentityOp otherwise)
                tensors += _norm(prefix + "self_attention.q_layernorm", mla.q_lora_rank, norm)
            tensors += _linear(prefix + "self_attention.linear_q_up_proj", mla.q_lora_rank, a * q_head // t, False)
        kv_down = mla.kv_lora_rank + mla.qk_pos_emb_head_dim
        tensors += _linear(prefix + "self_attention.linear_kv_down_proj", h, kv_down // down_split, False)
        if m.qk_layernorm:
            tensors += _norm(prefix + "self_attention.kv_layernorm", mla.kv_lora_rank, norm)
        tensors += _linear(prefix + "self_attention.linear_kv_up_proj", mla.kv_lora_rank,
                           a * (mla.qk_head_dim + mla.v_head_dim) // t, False)
        tensors += _linear(prefix + "self_attention.linear_proj", a * mla.v_head_dim // t, h,
                           m.add_bias_linear)
        return tensors
    d, g = m.kv_channels, m.num_query_groups
    qkv_out = (a + 2 * g) * d
    if config.model.attention_output_gate:
        qkv_out += a * d
    tensors += _linear(prefix + "self_attention.linear_qkv", h, qkv_out // t, m.add_bias_linear or m.add_qkv_bias)
    if m.qk_layernorm:
        tensors += _norm(prefix + "self_attention.q_layernorm", d, norm)
        tensors += _norm(prefix + "self_attention.k_layernorm", d, norm)
    tensors += _linear(prefix + "self_attention.linear_proj", a * d // t, h, m.add_bias_linear)
    return tensors


def _mlp(prefix: str, h: int, ffn: int, gated: bool, bias: bool, split: int, expert: bool) -> list[ParamTensor]:
    fc1_out = ffn * (2 if gated else 1) // split
    return (_linear(prefix + "linear_fc1", h, fc1_out, bias, expert=expert)
            + _linear(prefix + "linear_fc2", ffn // split, h, bias, expert=expert))


def mlp_tensors(config: EstimatorConfig, prefix: str, layer_index: int | None,
                moe_layer: bool | None = None) -> list[ParamTensor]:
    m = config.model
    h = m.hidden_size
    tensors = _norm(prefix + "pre_mlp_layernorm", h, m.normalization)
    moe = m.moe
    if moe_layer is None:
        moe_layer = moe is not None and (layer_index is None or moe.layer_pattern[layer_index])
    if not moe_layer:
        tensors += _mlp(prefix + "mlp.", h, m.ffn_hidden_size, m.gated_linear_unit,
                        m.add_bias_linear, config.parallel.tp, expert=False)
        return tensors
    p = config.parallel
    tensors += _linear(prefix + "mlp.router", h, moe.num_experts, m.add_bias_linear)
    for e in range(moe.num_experts // p.ep):
        tensors += _mlp(f"{prefix}mlp.experts.{e}.", h, moe.ffn_hidden_size, m.gated_linear_unit,
                        m.add_bias_linear, p.etp, expert=True)
    if moe.shared_expert_intermediate_size:
        tensors += _mlp(prefix + "mlp.shared_experts.", h, moe.shared_expert_intermediate_size,
                        m.gated_linear_unit, m.add_bias_linear, p.tp, expert=False)
        if moe.shared_expert_gate:
            tensors.append(ParamTensor(prefix + "mlp.shared_experts.gate_weight", h, kind="router"))
    return tensors


def layer_tensors(config: EstimatorConfig, layer_index: int | None, prefix: str) -> list[ParamTensor]:
    if config.model.hybrid is not None and layer_index is not None:
        return hybrid_layer_tensors(config, config.model.hybrid.layer_kinds[layer_index], prefix)
    return attention_tensors(config, prefix) + mlp_tensors(config, prefix, layer_index)


def mamba_tensors(config: EstimatorConfig, prefix: str) -> list[ParamTensor]:
    """A MambaLayer (megatron/core/ssm/mamba_layer.py, mamba_mixer.py) on one GPU."""
    m, hy, t = config.model, config.model.hybrid, config.parallel.tp
    h = m.hidden_size
    d_inner, heads, groups_state = hy.d_inner // t, hy.num_heads // t, hy.num_groups // t * hy.state_dim
    conv_dim = d_inner + 2 * groups_state
    p = prefix + "mixer."
    tensors = _norm(p + "in_proj_layernorm", h, m.normalization)       # TELayerNormColumnParallelLinear
    tensors += _linear(p + "in_proj", h, 2 * d_inner + 2 * groups_state + heads, False)
    tensors += [ParamTensor(p + "conv1d.weight", conv_dim * hy.conv_kernel, kind="conv"),
                ParamTensor(p + "conv1d.bias", conv_dim, kind="bias"),
                ParamTensor(p + "ssm.dt_bias", heads, kind="bias"),
                ParamTensor(p + "ssm.A_log", heads, kind="bias"),
                ParamTensor(p + "ssm.D", heads, kind="bias"),
                ParamTensor(p + "norm.weight", d_inner, kind="norm")]
    tensors += _linear(p + "out_proj", d_inner, h, False)
    return tensors


def hybrid_layer_tensors(config: EstimatorConfig, kind: str, prefix: str) -> list[ParamTensor]:
    """One hybrid layer of this pattern symbol (hybrid_layer_specs.py)."""
    if kind == "M":
        return mamba_tensors(config, prefix)
    if kind in ("*", "+"):
        return attention_tensors(config, prefix)
    return mlp_tensors(config, prefix, None, moe_layer=kind == "E")


def embedding_tensors(config: EstimatorConfig) -> list[ParamTensor]:
    m = config.model
    tensors = [ParamTensor("embedding.word_embeddings.weight",
                           m.padded_vocab_size // config.parallel.tp * m.hidden_size, kind="embedding")]
    if m.position_embedding_type == "learned_absolute":
        tensors.append(ParamTensor("embedding.position_embeddings.weight",
                                   m.max_position_embeddings * m.hidden_size, kind="embedding"))
    return tensors


def mtp_tensors(config: EstimatorConfig, index: int) -> list[ParamTensor]:
    m = config.model
    h = m.hidden_size
    prefix = f"mtp.layers.{index}."
    tensors = _norm(prefix + "enorm", h, m.normalization) + _norm(prefix + "hnorm", h, m.normalization)
    tensors += _linear(prefix + "eh_proj", 2 * h, h // config.parallel.tp, False)
    if m.hybrid is not None:
        # A hybrid MTP layer runs its own pattern (multi_token_prediction.py, nested HybridStack).
        for j, kind in enumerate(m.hybrid.mtp_kinds):
            tensors += hybrid_layer_tensors(config, kind, f"{prefix}mtp_model_layer.layers.{j}.")
        return tensors + _norm(prefix + "final_layernorm", h, m.normalization)
    # MTP layers replicate the structure of the last decoder layer (MoE when it is MoE).
    last = m.num_layers - 1
    tensors += layer_tensors(config, last, prefix + "transformer_layer.")
    tensors += _norm(prefix + "final_layernorm", h, m.normalization)
    return tensors


def chunk_tensors(config: EstimatorConfig, chunk: ModelChunk) -> list[ParamTensor]:
    """Every parameter tensor one GPU of this model chunk holds, in module order."""
    tensors: list[ParamTensor] = []
    if chunk.embedding:
        tensors += embedding_tensors(config)
    for i in chunk.layers:
        tensors += layer_tensors(config, i, f"decoder.layers.{i}.")
    if chunk.post_process:
        tensors += _norm("decoder.final_layernorm", config.model.hidden_size, config.model.normalization)
    for j in range(chunk.mtp_layers):
        tensors += mtp_tensors(config, j)
    if chunk.output_weight:
        tensors.append(ParamTensor("output_layer.weight",
                                   config.model.padded_vocab_size // config.parallel.tp * config.model.hidden_size,
                                   kind="embedding"))
    return tensors


@dataclass(frozen=True)
class ParameterCount:
    dense: int           # replicated over data parallel (sharded over dp x cp by the dist. optimizer)
    expert: int          # sharded over expert data parallel by the dist. optimizer

    @property
    def total(self) -> int:
        return self.dense + self.expert


def count(tensors: list[ParamTensor]) -> ParameterCount:
    dense = sum(t.numel for t in tensors if not t.expert)
    expert = sum(t.numel for t in tensors if t.expert)
    return ParameterCount(dense, expert)
