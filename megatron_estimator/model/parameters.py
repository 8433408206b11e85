"""Parameters exactly as megatron-core builds them, per pipeline stage, on one GPU.

Every parameter tensor is listed with its local (per-GPU) element count, so that model
states, buffer padding and expert sharding can be computed from the same list.  Shapes
follow megatron-core (0.16.1 and the Megatron-LM commit the project's flag table was read
from):

- attention: megatron/core/transformer/attention.py ``SelfAttention``: linear_qkv
  ``h -> (a + 2g) d`` column-parallel (bias when add_bias_linear or add_qkv_bias),
  linear_proj ``a d -> h`` row-parallel (bias h, not split), q/k layernorm of size d; with
  --softmax-type learnable the core attention's ``softmax_offset``, ``a/t`` elements
  (transformer/dot_product_attention.py);
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
- ``G`` (hybrid_stack_spec ``gdn_layer``): a TransformerLayer whose self_attention is a
  GatedDeltaNet (megatron/core/ssm/gated_delta_net/common.py ``_GDNBase.__init__``; GatedDeltaNet2,
  gdn2.py, with --experimental-attention-variant gdn2), no input norm of its own: in_proj
  ``h -> 2 Hk dk + 2 Hv dv + extra`` column-parallel with the norm fused in (extra = beta and
  alpha, ``2 Hv``; gdn2: f and b per key channel and w per value channel, ``2 Hk dk + Hv dv``),
  conv1d weight ``(2 Hk dk + Hv dv)/t x 1 x K`` without bias, dt_bias and A_log (``Hv/t`` each;
  gdn2: ``Hk dk/t`` and ``Hk/t``), out_norm over one value head (``dv``, replicated), out_proj
  ``Hv dv -> h`` row-parallel; no biases (bias=False, conv_bias=False);
- ``D`` (``dsa_layer``): a TransformerLayer with a separate input norm and an
  AbsorbedMLASelfAttention (experimental_attention_variant/absorbed_mla.py): the MLA projections
  with the down projections duplicated (TELinear, parallel_mode duplicated), the q / kv norms
  only with --qk-layernorm, linear_proj without bias; its DSAttention core (dsa.py) holds a
  DSAIndexer on the layers that compute their top-k: linear_wq_b ``q_lora (h without it) ->
  n_idx d_idx``, linear_wk ``h -> d_idx``, a LayerNorm of ``d_idx`` (weight and bias) and
  linear_weights_proj ``h -> n_idx``, all duplicated on every TP rank.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import groupby

from typing import NamedTuple
from dataclasses import dataclass

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model.layout import ModelChunk


class ParamTensor(NamedTuple):
    """A parameter tensor on one GPU, or ``count`` identical ones (a named tuple).

    The local experts of a MoE layer are one block of records: each record of the block
    (expert e's fc1 weight, its bias, fc2 weight, bias) has ``span`` = the block's length and
    ``count`` = the local experts, and stands for that tensor of every local expert; in
    module order the block repeats ``count`` times (expert 0's tensors, expert 1's, ...).
    Sums over records weigh each by ``count`` (``count``, ``expanded``); the distributed
    optimizer's layout walks a block as ``count`` repeats (model/states.py
    ``_buffer_numel``).  So an estimate's records do not grow with the number of experts."""
    name: str
    numel: int          # elements of one such tensor on one GPU
    expert: bool = False
    kind: str = "linear"    # linear (a GEMM weight TE can run in fp8) | bias | norm | embedding | router
    count: int = 1      # identical tensors this record stands for (the local experts)
    span: int = 1       # records of the block that repeats ``count`` times (1: no block)


def expanded(tensors: list[ParamTensor]) -> list[ParamTensor]:
    """The tensors one record each, in module order (each block's repeats written out,
    ``.E.`` in a name made ``.0.``, ``.1.``, ...): what the grouped records stand for."""
    out: list[ParamTensor] = []
    i = 0
    while i < len(tensors):
        t = tensors[i]
        if t.span == 1 and t.count == 1:
            out.append(t)
            i += 1
            continue
        block = tensors[i:i + t.span]
        for e in range(t.count):
            out += [ParamTensor(b.name.replace(".E.", f".{e}."), b.numel, b.expert, b.kind) for b in block]
        i += t.span
    return out


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
        # The q / kv norms exist only with --qk-layernorm (IdentityOp otherwise): standalone in
        # the local spec, fused into the up projections (layer_norm_weight [+ _bias], whole on
        # every TP rank) in the TE and hybrid specs; without --q-lora-rank the q norm is over the
        # hidden size, fused into linear_q_proj, from 0.19.0 only (MlaConfig.q_proj_norm).
        if mla.q_lora_rank is None:
            if mla.q_proj_norm:
                tensors += _norm(prefix + "self_attention.q_layernorm", h, norm)
            tensors += _linear(prefix + "self_attention.linear_q_proj", h, a * q_head // t, False)
        else:
            tensors += _linear(prefix + "self_attention.linear_q_down_proj", h, mla.q_lora_rank // down_split, False)
            if m.qk_layernorm:
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
    if m.softmax_type == "learnable":
        # dot_product_attention.py (and TEDotProductAttention): softmax_offset, one learnable
        # logit per attention head of this TP rank (gpt-oss's attention sinks).
        tensors.append(ParamTensor(prefix + "self_attention.core_attention.softmax_offset", a // t, kind="bias"))
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
    # The local experts: one block of records standing for every local expert (ParamTensor).
    block = _mlp(f"{prefix}mlp.experts.E.", h, moe.ffn_hidden_size, m.gated_linear_unit,
                 m.add_bias_linear, p.etp, expert=True)
    local = moe.num_experts // p.ep
    tensors += [t._replace(count=local, span=len(block)) for t in block]
    if moe.shared_expert_intermediate_size:
        tensors += _mlp(prefix + "mlp.shared_experts.", h, moe.shared_expert_intermediate_size,
                        m.gated_linear_unit, m.add_bias_linear, p.tp, expert=False)
        if moe.shared_expert_gate:
            tensors.append(ParamTensor(prefix + "mlp.shared_experts.gate_weight", h, kind="router"))
    return tensors


# The kind of a 'D' layer without an indexer (dsa.py is_dsa_skip_topk_layer).
SHARED_TOPK_DSA = "D:shared-top-k"


def layer_tensors(config: EstimatorConfig, layer_index: int | None, prefix: str) -> list[ParamTensor]:
    """One decoder layer's tensors on one GPU, their names under ``prefix``: the records of
    its kind (``layer_template``: a GPT layer, dense or MoE, or a hybrid pattern symbol)."""
    return _prefixed(prefix, layer_template(config, layer_kind(config, layer_index)))


def layer_kind(config: EstimatorConfig, layer_index: int | None) -> str | bool:
    """What decides a decoder layer's tensors: its hybrid pattern symbol, else whether it is
    a MoE layer (``layer_index`` None: the MoE layer of a MoE model); a 'D' layer that reuses
    another layer's top-k builds no indexer and is its own kind, ``SHARED_TOPK_DSA``."""
    hybrid, moe = config.model.hybrid, config.model.moe
    if hybrid is not None and layer_index is not None:
        kind = hybrid.layer_kinds[layer_index]
        if kind == "D" and not hybrid.dsa.computes_topk(layer_index + 1):
            return SHARED_TOPK_DSA      # HybridStack numbers its layers from 1
        return kind
    return moe is not None and (layer_index is None or moe.layer_pattern[layer_index])


@lru_cache(maxsize=1024)
def layer_template(config: EstimatorConfig, kind: str | bool) -> tuple[ParamTensor, ...]:
    """The records of a decoder layer of this kind (a hybrid symbol, or whether a GPT layer
    is MoE), named from the layer: every layer of a kind holds the same tensors."""
    if kind == SHARED_TOPK_DSA:
        return tuple(dsa_tensors(config, "", None, shared_topk=True))
    if isinstance(kind, str):
        return tuple(hybrid_layer_tensors(config, kind, ""))
    return tuple(attention_tensors(config, "") + mlp_tensors(config, "", None, moe_layer=kind))


def _prefixed(prefix: str, template: tuple[ParamTensor, ...]) -> list[ParamTensor]:
    make = tuple.__new__        # ParamTensor's fields as they are, the name under ``prefix``
    return [make(ParamTensor, (prefix + t[0],) + t[1:]) for t in template]


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


def gdn_tensors(config: EstimatorConfig, prefix: str) -> list[ParamTensor]:
    """A 'G' layer (a TransformerLayer around a gated delta net) on one GPU (see the module notes)."""
    from megatron_estimator.config.hybrid import gdn_in_proj_width

    m, gdn, t = config.model, config.model.hybrid.gdn, config.parallel.tp
    h = m.hidden_size
    qk, v = gdn.key_heads * gdn.key_head_dim, gdn.value_heads * gdn.value_head_dim
    p = prefix + "self_attention."
    tensors = _norm(p + "in_proj.layer_norm", h, m.normalization)     # TELayerNormColumnParallelLinear
    tensors += _linear(p + "in_proj", h, gdn_in_proj_width(gdn.variant, qk, v, gdn.value_heads) // t, False)
    tensors.append(ParamTensor(p + "conv1d.weight", (2 * qk + v) // t * gdn.conv_kernel, kind="conv"))
    if gdn.variant == "gdn":
        gates = gdn.value_heads // t, gdn.value_heads // t
    else:
        gates = qk // t, gdn.key_heads // t
    tensors += [ParamTensor(p + "dt_bias", gates[0], kind="bias"),
                ParamTensor(p + "A_log", gates[1], kind="bias")]
    tensors += _norm(p + "out_norm", gdn.value_head_dim, m.normalization)
    tensors += _linear(p + "out_proj", v // t, h, False)
    return tensors


def dsa_tensors(config: EstimatorConfig, prefix: str, layer_number: int | None,
                shared_topk: bool = False) -> list[ParamTensor]:
    """A 'D' layer (AbsorbedMLASelfAttention + DSAttention) on one GPU (see the module notes);
    ``shared_topk``: a layer known to reuse another's top-k (no indexer)."""
    m, mla, dsa, t = config.model, config.model.mla, config.model.hybrid.dsa, config.parallel.tp
    h, a, norm = m.hidden_size, m.num_attention_heads, m.normalization
    p = prefix + "self_attention."
    q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    tensors = _norm(prefix + "input_layernorm", h, norm)
    if mla.q_lora_rank is None:
        tensors += _linear(p + "linear_q_proj", h, a * q_head // t, False)
    else:
        tensors += _linear(p + "linear_q_down_proj", h, mla.q_lora_rank, False)     # duplicated
        if dsa.qk_layernorm:
            tensors += _norm(p + "q_layernorm", mla.q_lora_rank, norm)
        tensors += _linear(p + "linear_q_up_proj", mla.q_lora_rank, a * q_head // t, False)
    tensors += _linear(p + "linear_kv_down_proj", h, mla.kv_lora_rank + mla.qk_pos_emb_head_dim, False)
    if dsa.qk_layernorm:
        tensors += _norm(p + "kv_layernorm", mla.kv_lora_rank, norm)
    tensors += _linear(p + "linear_kv_up_proj", mla.kv_lora_rank, a * (mla.qk_head_dim + mla.v_head_dim) // t, False)
    tensors += _linear(p + "linear_proj", a * mla.v_head_dim // t, h, False)
    if not shared_topk and (layer_number is None or dsa.computes_topk(layer_number)):
        i = p + "core_attention.indexer."
        q_in = mla.q_lora_rank if mla.q_lora_rank is not None else h
        tensors += _linear(i + "linear_wq_b", q_in, dsa.index_heads * dsa.index_head_dim, False)
        tensors += _linear(i + "linear_wk", h, dsa.index_head_dim, False)
        tensors += _norm(i + "k_norm", dsa.index_head_dim, "LayerNorm")       # always a LayerNorm
        tensors += _linear(i + "linear_weights_proj", h, dsa.index_heads, False)
    return tensors


def hybrid_layer_tensors(config: EstimatorConfig, kind: str, prefix: str,
                         layer_number: int | None = None) -> list[ParamTensor]:
    """One hybrid layer of this pattern symbol (hybrid_layer_specs.py); ``layer_number`` is
    the 1-based number its HybridStack gives it (a 'D' layer's indexer depends on it)."""
    if kind == "M":
        return mamba_tensors(config, prefix)
    if kind == "G":
        return gdn_tensors(config, prefix)
    if kind == "D":
        return dsa_tensors(config, prefix, layer_number)
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
            tensors += hybrid_layer_tensors(config, kind, f"{prefix}mtp_model_layer.layers.{j}.",
                                            layer_number=j + 1)     # the nested stack numbers from 1
        return tensors + _norm(prefix + "final_layernorm", h, m.normalization)
    # MTP layers replicate the structure of the last decoder layer (MoE when it is MoE).
    last = m.num_layers - 1
    tensors += layer_tensors(config, last, prefix + "transformer_layer.")
    tensors += _norm(prefix + "final_layernorm", h, m.normalization)
    return tensors


def chunk_tensors(config: EstimatorConfig, chunk: ModelChunk) -> list[ParamTensor]:
    """Every parameter tensor one GPU of this model chunk holds, in module order."""
    return list(_chunk_records(config, chunk))


@lru_cache(maxsize=1024)     # a chunk's records (a few hundred bytes each)
def _chunk_records(config: EstimatorConfig, chunk: ModelChunk) -> tuple[ParamTensor, ...]:
    tensors: list[ParamTensor] = []
    if chunk.embedding:
        tensors += embedding_tensors(config)
    for i in chunk.layers:
        tensors += layer_tensors(config, i, f"decoder.layers.{i}.")
    tensors += _chunk_tail(config, chunk.post_process, chunk.mtp_layers, chunk.output_weight)
    return tuple(tensors)


class RecordBlock(NamedTuple):
    """A run of a chunk's records in module order, repeated ``repeats`` times: the records of
    one decoder layer kind standing for ``repeats`` consecutive layers of that kind (``layers``
    True: each repeat is one decoder layer, an FSDP unit, and the records are named without
    their ``decoder.layers.<i>.`` prefix), or a chunk's other records once.  The records may
    themselves hold expert blocks (``ParamTensor.count`` / ``span``).  So building and walking
    a chunk's records costs per run of a layer kind, not per layer (model/states.py
    ``model_states_of_blocks``)."""
    records: tuple[ParamTensor, ...]
    repeats: int = 1
    layers: bool = False


@lru_cache(maxsize=4096)
def layer_runs(config: EstimatorConfig, layers: tuple[int, ...]) -> tuple[tuple[str | bool, int], ...]:
    """The decoder layers as runs of one ``layer_kind``: (kind, consecutive layers)."""
    if not layers:
        return ()
    m = config.model
    if m.hybrid is None:
        if m.moe is None:
            return ((False, len(layers)),)
        return _pattern_runs(m.moe.layer_pattern, layers)
    kinds = [layer_kind(config, i) for i in layers]
    return tuple((kind, len(list(group))) for kind, group in groupby(kinds))


@lru_cache(maxsize=4096)
def _pattern_runs(pattern: tuple[bool, ...], layers: tuple[int, ...]) -> tuple[tuple[bool, int], ...]:
    # A GPT decoder's runs depend on its MoE layer pattern alone: shared by configurations
    # that differ elsewhere (the batch, the optimizer, ...).
    return tuple((kind, len(list(group))) for kind, group in groupby([pattern[i] for i in layers]))


@lru_cache(maxsize=1024)
def representative_layer(config: EstimatorConfig, kind: str | bool) -> int:
    """The first decoder layer of this ``layer_kind``: what a layer of the kind holds (its
    records, its activations) is read from it."""
    return next(i for i in range(config.model.num_layers) if layer_kind(config, i) == kind)


def chunk_structure(config: EstimatorConfig, chunk: ModelChunk) -> tuple:
    """What a chunk's records depend on besides the configuration: the embedding, the runs of
    decoder layer kinds (not the layers' numbers), the final norm, MTP layers, output weight."""
    return (chunk.embedding, layer_runs(config, chunk.layers), chunk.post_process, chunk.mtp_layers,
            chunk.output_weight)


@lru_cache(maxsize=1024)
def chunk_blocks(config: EstimatorConfig, structure: tuple) -> tuple[RecordBlock, ...]:
    """A chunk's records (``chunk_structure``) as ``RecordBlock`` runs: its embedding, one block
    per run of a decoder layer kind (the kind's ``layer_template``), then the final norm, MTP
    layers and output weight.  Written out (each layer's records under its prefix), they are
    ``chunk_tensors``."""
    embedding, runs, post_process, mtp_layers, output_weight = structure
    blocks: list[RecordBlock] = []
    if embedding:
        blocks.append(RecordBlock(tuple(embedding_tensors(config))))
    for kind, n in runs:
        blocks.append(RecordBlock(layer_template(config, kind), n, True))
    rest = _chunk_tail(config, post_process, mtp_layers, output_weight)
    if rest:
        blocks.append(RecordBlock(rest))
    return tuple(blocks)


def _chunk_tail(config: EstimatorConfig, post_process: bool, mtp_layers: int,
                output_weight: bool) -> tuple[ParamTensor, ...]:
    tensors: list[ParamTensor] = []
    if post_process:
        tensors += _norm("decoder.final_layernorm", config.model.hidden_size, config.model.normalization)
    for j in range(mtp_layers):
        tensors += mtp_tensors(config, j)
    if output_weight:
        tensors.append(ParamTensor("output_layer.weight",
                                   config.model.padded_vocab_size // config.parallel.tp * config.model.hidden_size,
                                   kind="embedding"))
    return tuple(tensors)


def weighted(blocks: tuple[RecordBlock, ...]) -> list[ParamTensor]:
    """The blocks' records once each, ``count`` multiplied by the block's repeats: for sums
    over records (elements, bytes by kind), not for the buffer layout (whose order it loses)."""
    out: list[ParamTensor] = []
    for b in blocks:
        if b.repeats == 1:
            out += b.records
        else:
            out += [t._replace(count=t.count * b.repeats) for t in b.records]
    return out


@dataclass(frozen=True)
class ParameterCount:
    dense: int           # replicated over data parallel (sharded over dp x cp by the dist. optimizer)
    expert: int          # sharded over expert data parallel by the dist. optimizer

    @property
    def total(self) -> int:
        return self.dense + self.expert


def count(tensors: list[ParamTensor]) -> ParameterCount:
    dense = expert = 0
    for t in tensors:
        if t.expert:
            expert += t.numel * t.count
        else:
            dense += t.numel * t.count
    return ParameterCount(dense, expert)
