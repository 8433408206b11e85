"""Test-only reference harness: what megatron-core 0.16.1 itself builds and saves.

The estimator is checked against this module, so every number here comes from running
megatron-core's own model-building code (``GPTModel`` with ``get_gpt_layer_local_spec`` /
``get_gpt_decoder_block_spec`` / ``get_gpt_mtp_block_spec``, chosen as
megatron/training/models/gpt.py chooses them), never from a formula.  torch and megatron-core
are imported lazily, inside the functions; tests call :func:`megatron_core_available` and skip
with its reason when they are absent.  Everything runs in-process (a few hundred ms per
configuration after megatron-core's ~10 s import); each call sets up and tears down its own
fake process group and ``parallel_state``.

Public API
==========

``megatron_core_available() -> tuple[bool, str]``
    Whether torch + megatron-core import here ("megatron-core 0.16.1"), or why not.

``reference_parameter_counts(spec: Mapping) -> list[StageCount]``
    Builds the model on the meta device once per pipeline rank and virtual stage, with
    torch.distributed on the single-process ``fake`` backend (what Megatron's
    ``--fake-process-group`` does, megatron/training/initialize.py) and ``parallel_state``
    initialised for the spec's TP/PP/CP/EP/ETP/VPP sizes, this process playing TP/CP/EP/DP
    rank 0 of each pipeline rank in turn.  Returns, ordered by pipeline rank then virtual
    stage, the parameters one GPU of that stage holds (every rank of a stage holds the same
    shapes: megatron-core asserts even splits).  A :class:`StageCount` lists every tensor
    (:class:`ParamCount`, named with global layer numbers) and sums by prefix
    (``embedding``, ``decoder.layers``, ``decoder.final_layernorm``, ``output_layer``,
    ``mtp``).  ``total`` is what the local spec builds, ``te_total`` what the Transformer
    Engine spec holds on that GPU (see "Local vs TE spec").

``saved_activation_bytes(spec, seq_length, micro_batch_size, dtype="bf16", kernels="gpu")
-> ActivationMeasurement``
    Builds the whole model as one stage (pipeline keys are ignored: what a layer saves does
    not depend on its stage) on the CPU with real tiny tensors, wraps it in Float16Module as
    Megatron does, and runs one training-mode forward pass with the loss -- embedding,
    ``num_layers`` decoder layers, final norm, output layer, vocab-parallel cross entropy --
    under ``torch.autograd.graph.saved_tensors_hooks``.  Every saved tensor is recorded once
    per storage (``untyped_storage().data_ptr()``: a saved view keeps its whole storage
    alive, so bytes are the storage's ``nbytes``), parameters excluded, and only storages
    the autograd graph still holds when the forward pass ends are reported (megatron builds
    some graph pieces that it then drops, e.g. the bias-dropout-add it runs under
    ``torch.enable_grad`` inside a fully recomputed chunk).  Each storage is attributed to
    the module that saved it first, the torch function that saved it (``op``) and the
    megatron source line (``site``), and grouped: ``layer`` (with the 0-based layer index;
    a layer's input belongs to that layer), ``shared`` (saved by more than one layer, or a
    decoder-wide input: the attention mask, the RoPE table), ``embedding``,
    ``final_layernorm``, ``output_layer``, ``loss``, ``mtp``, ``host`` (CPU tensors on a GPU
    run too: the fused softmax's scale, the checkpointed attention's mask-type tensor).
    ``kernels="gpu"`` gives the CPU run the saving behaviour of the CUDA kernels (table
    below); ``kernels="cpu"`` reports what this machine's kernels save.  TP > 1, with or
    without sequence parallelism, runs on the fake process group: shapes are exact, values
    after a fake collective are garbage, which changes nothing that is saved for dense
    layers.  Measure MoE layers with TP = EP = 1 so that routing runs on real values (the
    total routed bytes do not depend on the routing; per-expert shares do).  Context
    parallelism needs TEDotProductAttention and is refused.

``PUBLISHED_MODELS: dict[str, PublishedModel]``
    Specs (and the equivalent Megatron flags) that rebuild LLaMA-3-8B, LLaMA-3-70B,
    Mixtral-8x7B and DeepSeek-V2-Lite exactly, with their published parameter counts.  They
    give the unpadded ``vocab_size`` so that padding follows TP as in Megatron.

``SpecError``: raised for unknown or missing spec keys and for configurations megatron-core
rejects (its message included).

Spec keys (Megatron argument dests)
===================================
Model: ``num_layers``, ``hidden_size``, ``num_attention_heads`` (required);
``num_query_groups`` (taken as given, None = heads; ``group_query_attention=False`` drops
it, as a command line without --group-query-attention does), ``ffn_hidden_size`` (default
4h, or ``int(4h*2/3/64)*64`` with swiglu), ``kv_channels`` (default h/a),
``padded_vocab_size`` or ``vocab_size`` (padded to a multiple of
``make_vocab_size_divisible_by`` (128) * TP, megatron/training/vocab_utils.py),
``max_position_embeddings``, ``position_embedding_type`` (learned_absolute),
``rotary_percent``, ``rotary_base``, ``normalization`` (LayerNorm), ``norm_epsilon``,
``swiglu`` / ``squared_relu`` (Megatron flags) or ``gated_linear_unit`` + ``activation``
(gelu | silu | squared_relu | swiglu), ``add_bias_linear`` (True), ``add_qkv_bias``,
``qk_layernorm``, ``untie_embeddings_and_output_weights`` (False), ``hidden_dropout`` /
``attention_dropout`` (0.1), ``num_experts``, ``moe_ffn_hidden_size``, ``moe_router_topk``,
``moe_shared_expert_intermediate_size``, ``moe_layer_freq`` (int, list, or Megatron's string
form ``"([0]*1+[1]*26)"``), ``moe_grouped_gemm``, ``multi_latent_attention`` with
``q_lora_rank``, ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim``, ``v_head_dim``;
``mtp_num_layers``.
Parallelism: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``context_parallel_size``, ``expert_model_parallel_size``, ``expert_tensor_parallel_size``
(defaults to TP, as Megatron), ``sequence_parallel``, ``num_virtual_stages_per_pipeline_rank``
/ ``num_layers_per_virtual_pipeline_stage`` / ``virtual_pipeline_model_parallel_size``,
``decoder_first_pipeline_num_layers``, ``decoder_last_pipeline_num_layers``,
``account_for_embedding_in_pipeline_split``, ``account_for_loss_in_pipeline_split``,
``pipeline_model_parallel_layout`` (its stage count sets the VPP size, as in Megatron).
Activations: ``recompute_granularity`` / ``recompute_activations``, ``recompute_method``,
``recompute_num_layers``, ``recompute_modules``, ``masked_softmax_fusion`` (True),
``bias_gelu_fusion`` (True; off without biases), ``bias_swiglu_fusion`` (True),
``bias_dropout_fusion`` (True), ``apply_rope_fusion`` (True; only with rope),
``attention_softmax_in_fp32`` (False; True with ``apply_query_key_layer_scaling``),
``cross_entropy_loss_fusion``, ``fp16_lm_cross_entropy``,
``create_attention_mask_in_dataloader`` (True).  Defaults in parentheses are Megatron's
argparse defaults where they differ from TransformerConfig's.  Any other key naming a
``TransformerConfig`` / ``MLATransformerConfig`` field passes through unchanged (as
``core_transformer_config_from_args`` does); anything else raises :class:`SpecError`.

Local vs TE spec (parameters; megatron/core/models/gpt/gpt_layer_specs.py,
megatron/core/transformer/multi_latent_attention.py)
======================================================================================
- The TE spec folds ``input_layernorm`` into ``linear_qkv`` (TELayerNormColumnParallelLinear:
  ``layer_norm_weight`` [+ ``layer_norm_bias``]) and, for dense MLPs, ``pre_mlp_layernorm``
  into ``linear_fc1``; MoE layers keep a separate ``pre_mlp_layernorm``; with MLA and
  ``qk_layernorm`` the q / kv norms fold into ``linear_q_up_proj`` / ``linear_kv_up_proj``.
  Same element counts, other names.
- MLA down projections (``linear_q_down_proj``, ``linear_kv_down_proj``) are ``TELinear`` with
  ``parallel_mode="duplicated"`` in the TE spec -- whole on every TP rank -- but
  ``ColumnParallelLinear`` (split over TP) in the local spec.  ``te_numel`` / ``te_total``
  apply exactly that; nothing else differs per GPU.
- ``moe_grouped_gemm``: the local spec's legacy GroupedMLP needs the ``grouped_gemm`` CUDA
  package, so the harness builds SequentialMLP, which holds the same expert weights (per
  expert fc1 ``h x F`` (``2F`` gated) / ETP, fc2 ``F / ETP x h``), as TEGroupedMLP does.

Saved activations: CPU kernels vs CUDA kernels (``kernels="gpu"`` emulates the right column)
==========================================================================================
============================  ==================================  ==============================
op                            CPU (this machine, torch 2.13)      CUDA
============================  ==================================  ==============================
dropout, 0 < p < 1            ``_dropout``: a noise tensor in the ``native_dropout``: bool mask,
(aten/native/Dropout.cpp)     input dtype (2 B/elt in bf16)       1 B/elt
LayerNorm statistics          mean, rstd in the param dtype       mean, rstd in fp32 (the acc
(native_layer_norm)           (bf16: 2 B per row each)            type): 4 B per row each
RMSNorm (torch.nn.RMSNorm ->  composite: fp32 copy of the input,  ``_fused_rms_norm`` kernel
``_fused_rms_norm``)          fp32 rstd, fp32 normalised copy     (torch >= 2.8): input (bf16)
                                                                  + fp32 rstd; older torch
                                                                  runs the composite, as CPU
megatron FusedScaleMask-      no fused kernel: torch path saves   ScaledUpperTriangMasked-
Softmax                       the bool mask (masked_fill_, once   Softmax when
                              for all layers) and the probs       ``is_kernel_available`` (bf16 /
                              (fp32 with softmax_in_fp32)         fp16, 16 < sk <= 4096, sq, sk,
                                                                  b*np % 4, b*np % batch-per-
                                                                  block): only the probs, in
                                                                  the input dtype; no mask
RoPE with apply_rope_fusion   needs Transformer Engine; the       TE FusedRoPEFunc saves only
                              unfused path saves cos and sin (in  the fp32 freqs table, shared
                              the input dtype) per q / k call     by all layers
============================  ==================================  ==============================
The emulations (exact forward and backward, checked in tests) assume the CUDA kernels that a
GPU run of the local spec uses: apex's ``scaled_*_softmax_cuda`` extensions (without them
megatron-core 0.16.1 raises ImportError in ``is_kernel_available``) and Transformer Engine's
fused RoPE.  Not emulated: MLA's fused RoPE (a Triton kernel; its unfused path is measured)
and ``torch.compile``: megatron's compiled helpers (bias-dropout-add, inner GeLU / SwiGLU math)
run eagerly here.  Megatron's own autograd Functions (GeLU, SwiGLU, linear layers, router
GEMM, vocab-parallel cross entropy, checkpointing) save the same tensors on both.

What the harness changes so that megatron-core runs here (all inside context managers)
=======================================================================================
``torch.cuda.current_device()`` names the CPU and ``Tensor.cuda()`` is the identity
(megatron allocates buffers on ``current_device()`` and moves the duplicated tied embedding
with ``.cuda()``); the CUDA RNG tracker forks nothing; dynamo is disabled; without TE,
``multi_latent_attention.HAVE_TE`` is False (TE's MagicMock placeholders otherwise break its
isinstance checks) and ``moe_utils.te_general_gemm`` is None (0.16.1 leaves it unbound);
MLA's core attention is DotProductAttention with the ``v_head_dim`` output width (the local
spec passes ``k_channels`` / ``v_channels`` that only TEDotProductAttention accepts); with
sequence parallelism the torch norms are built as apex's FusedLayerNorm would be (the torch
wrapper refuses SP; local-spec RMSNorm cannot run SP in 0.16.1 at all); the attention mask
is passed as Megatron's dataloader builds it (the local fallback creates it on "cuda").
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

__all__ = [
    "ActivationMeasurement",
    "ParamCount",
    "PUBLISHED_MODELS",
    "PublishedModel",
    "SavedTensor",
    "SpecError",
    "StageCount",
    "megatron_core_available",
    "reference_parameter_counts",
    "saved_activation_bytes",
]


class SpecError(ValueError):
    """The spec cannot be built: unknown keys, missing required keys, bad values."""


# --------------------------------------------------------------------------------------
# Availability
# --------------------------------------------------------------------------------------

def megatron_core_available() -> tuple[bool, str]:
    """(True, version) when torch and megatron-core import here, else (False, reason)."""
    try:
        import torch  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return False, f"torch is not importable: {exc}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core import package_info
            import megatron.core.models.gpt  # noqa: F401
    except Exception as exc:
        return False, f"megatron-core is not importable: {exc}"
    return True, f"megatron-core {package_info.__version__}"


def _import_megatron() -> None:
    """Import the megatron-core modules the harness uses once, without their import-time
    warnings (no Apex / no Transformer Engine / deprecated module paths)."""
    with _quiet():
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.transformer.multi_latent_attention  # noqa: F401
        import megatron.core.transformer.moe.moe_utils  # noqa: F401
        import torch.testing._internal.distributed.fake_pg  # noqa: F401


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParamCount:
    """One parameter tensor as one GPU holds it."""
    name: str                    # global naming: decoder.layers.<global index>.<...>
    shape: tuple[int, ...]       # local shard shape
    numel: int                   # local elements (local spec)
    te_numel: int                # local elements with the Transformer Engine spec
    expert: bool                 # routed-expert weight (sharded over EP, and ETP)


@dataclass(frozen=True)
class StageCount:
    """Parameters one GPU of one pipeline rank / virtual stage holds."""
    pipeline_rank: int
    virtual_stage: int | None          # None without interleaving
    total: int                         # local spec, as built
    te_total: int                      # Transformer Engine spec on the same GPU
    expert_total: int                  # of total, routed-expert parameters
    by_prefix: Mapping[str, int]       # embedding / decoder.layers / decoder.final_layernorm /
                                       # output_layer / mtp (only those present)
    layer_numbers: tuple[int, ...]     # global 1-based decoder layer numbers built here
    mtp_layers: int
    tensors: tuple[ParamCount, ...]

    def to_json(self) -> dict:
        return {
            "pipeline_rank": self.pipeline_rank,
            "virtual_stage": self.virtual_stage,
            "total": self.total,
            "te_total": self.te_total,
            "expert_total": self.expert_total,
            "by_prefix": dict(self.by_prefix),
            "layer_numbers": list(self.layer_numbers),
            "mtp_layers": self.mtp_layers,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "numel": t.numel,
                 "te_numel": t.te_numel, "expert": t.expert}
                for t in self.tensors
            ],
        }


@dataclass(frozen=True)
class SavedTensor:
    """One storage kept alive for backward."""
    module: str                  # module that saved it first (global layer numbering)
    op: str                      # torch function that saved it first, e.g. "baddbmm"
    site: str                    # megatron source line that ran it, e.g.
                                 # "megatron/core/transformer/dot_product_attention.py:170"
    shape: tuple[int, ...]       # shape of the first saved view
    dtype: str                   # e.g. "bfloat16", "bool", "float32", "int64"
    nbytes: int                  # storage bytes
    group: str                   # "layer" | "shared" | "embedding" | "final_layernorm" |
                                 # "output_layer" | "loss" | "mtp" | "other" | "host" (kept in
                                 # host memory on a GPU run too: the fused softmax's scale)
    layer: int | None            # 0-based decoder layer index for group "layer"


@dataclass(frozen=True)
class ActivationMeasurement:
    """Saved-for-backward bytes of one forward pass (one microbatch, one GPU)."""
    seq_length: int
    micro_batch_size: int
    dtype: str
    kernels: str
    loss: float                  # mean per-token loss of the measured forward pass
    tensors: tuple[SavedTensor, ...]

    def layer_bytes(self, layer: int) -> int:
        """Bytes that decoder layer ``layer`` (0-based) alone keeps."""
        return sum(t.nbytes for t in self.tensors if t.group == "layer" and t.layer == layer)

    def layer_tensors(self, layer: int) -> tuple[SavedTensor, ...]:
        return tuple(t for t in self.tensors if t.group == "layer" and t.layer == layer)

    def group_bytes(self, group: str) -> int:
        return sum(t.nbytes for t in self.tensors if t.group == group)

    @property
    def total_bytes(self) -> int:
        """Device bytes: every group but ``host``."""
        return sum(t.nbytes for t in self.tensors if t.group != "host")

    def to_json(self) -> dict:
        groups = sorted({t.group for t in self.tensors})
        layers = sorted({t.layer for t in self.tensors if t.layer is not None})
        return {
            "seq_length": self.seq_length,
            "micro_batch_size": self.micro_batch_size,
            "dtype": self.dtype,
            "kernels": self.kernels,
            "loss": self.loss,
            "total_bytes": self.total_bytes,
            "group_bytes": {g: self.group_bytes(g) for g in groups},
            "layer_bytes": {str(i): self.layer_bytes(i) for i in layers},
            "tensors": [dataclasses.asdict(t) for t in self.tensors],
        }


# --------------------------------------------------------------------------------------
# Spec normalisation: Megatron argument dests -> TransformerConfig / GPTModel arguments
# --------------------------------------------------------------------------------------

# Megatron-only keys (megatron/training/arguments.py), translated below.
_MEGATRON_KEYS = {
    "num_experts", "swiglu", "squared_relu", "activation", "group_query_attention",
    "padded_vocab_size", "vocab_size", "make_vocab_size_divisible_by",
    "max_position_embeddings", "position_embedding_type", "rotary_percent", "rotary_base",
    "rotary_seq_len_interpolation_factor", "use_rope_scaling", "rope_scaling_factor",
    "untie_embeddings_and_output_weights", "norm_epsilon",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage",
    "recompute_activations", "bias_gelu_fusion", "bias_swiglu_fusion",
    "fp16_lm_cross_entropy", "bf16", "fp16", "create_attention_mask_in_dataloader",
}

# Megatron's argparse defaults where they differ from TransformerConfig's dataclass defaults
# (megatron/training/arguments.py _add_training_args / _add_mixed_precision_args).
_MEGATRON_DEFAULTS = {
    "masked_softmax_fusion": True,
    "bias_dropout_fusion": True,
    "apply_rope_fusion": True,
    "attention_softmax_in_fp32": False,
    "bias_gelu_fusion": True,
    "bias_swiglu_fusion": True,
}


@dataclass(frozen=True)
class _Normalized:
    tc_kwargs: dict
    mla: bool
    vocab_size: int
    max_sequence_length: int
    position_embedding_type: str
    rotary_percent: float
    rotary_base: int
    seq_len_interpolation_factor: float | None
    rope_scaling: bool
    rope_scaling_factor: float
    share_embeddings_and_output_weights: bool
    fp16_lm_cross_entropy: bool
    rope_fusion: bool
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int | None


def _parse_moe_layer_freq(value: Any) -> int | list[int]:
    """Megatron's --moe-layer-freq: an int, a list, or a Python list expression string."""
    if isinstance(value, bool):
        raise SpecError(f"moe_layer_freq: expected int, list or string, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)

        def ev(node: ast.AST):
            if isinstance(node, ast.Expression):
                return ev(node.body)
            if isinstance(node, ast.List):
                return [ev(e) for e in node.elts]
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
                left, right = ev(node.left), ev(node.right)
                return left + right if isinstance(node.op, ast.Add) else left * right
            raise SpecError(f"moe_layer_freq: unsupported expression {value!r}")

        result = ev(ast.parse(text, mode="eval"))
        if not isinstance(result, list):
            raise SpecError(f"moe_layer_freq: {value!r} does not evaluate to a list")
        return [int(v) for v in result]
    raise SpecError(f"moe_layer_freq: expected int, list or string, got {value!r}")


def _normalize(spec: Mapping[str, Any]) -> _Normalized:
    import torch
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    spec = dict(spec)
    mla = bool(spec.get("multi_latent_attention", False))
    config_class = MLATransformerConfig if mla else TransformerConfig
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(k for k in spec if k not in fields and k not in _MEGATRON_KEYS)
    if unknown:
        raise SpecError("unknown spec keys: " + ", ".join(unknown))
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if spec.get(k) is None]
    if missing:
        raise SpecError("missing required spec keys: " + ", ".join(missing))
    for key, default in _MEGATRON_DEFAULTS.items():
        spec.setdefault(key, default)

    h = int(spec["hidden_size"])
    a = int(spec["num_attention_heads"])
    tp = int(spec.get("tensor_model_parallel_size") or 1)
    pp = int(spec.get("pipeline_model_parallel_size") or 1)
    cp = int(spec.get("context_parallel_size") or 1)
    ep = int(spec.get("expert_model_parallel_size") or 1)
    etp = spec.get("expert_tensor_parallel_size")
    etp = tp if etp is None else int(etp)

    # Activation: Megatron's --swiglu / --squared-relu (core_transformer_config_from_args),
    # or an explicit activation name.
    activation = spec.pop("activation", None)
    swiglu = bool(spec.pop("swiglu", False)) or activation == "swiglu"
    relu2 = bool(spec.pop("squared_relu", False)) or activation == "squared_relu"
    gated = bool(spec.get("gated_linear_unit", False)) or swiglu
    if activation not in (None, "gelu", "silu", "swiglu", "squared_relu"):
        raise SpecError(f"activation: unsupported {activation!r}")
    if swiglu and relu2:
        raise SpecError("swiglu and squared_relu are exclusive")
    if swiglu or activation == "silu":
        act = F.silu
    elif relu2:
        act = squared_relu
    else:
        act = F.gelu
    bias_linear = bool(spec.get("add_bias_linear", True))
    bias_gelu_fusion = bool(spec.pop("bias_gelu_fusion")) and bias_linear
    bias_swiglu_fusion = bool(spec.pop("bias_swiglu_fusion"))
    # megatron/core/transformer/mlp.py fuses only (gated) GeLU and gated SiLU; Megatron takes
    # --bias-swiglu-fusion with --swiglu and --bias-gelu-fusion otherwise.
    if act is F.silu and gated:
        bias_activation_fusion = bias_swiglu_fusion
    elif act is F.gelu:
        bias_activation_fusion = bias_gelu_fusion
    else:
        bias_activation_fusion = False

    ffn = spec.get("ffn_hidden_size")
    if ffn is None:  # megatron/training/arguments.py validate_args
        ffn = int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h
    kv_channels = spec.get("kv_channels") or h // a

    if spec.pop("group_query_attention", True) is False:
        spec["num_query_groups"] = None

    num_experts = spec.pop("num_experts", None) or None

    padded = spec.pop("padded_vocab_size", None)
    vocab = spec.pop("vocab_size", None)
    divisor = int(spec.pop("make_vocab_size_divisible_by", 128))
    if padded is None:
        if vocab is None:
            raise SpecError("give padded_vocab_size or vocab_size")
        multiple = divisor * tp  # megatron/training/vocab_utils.py
        padded = int(math.ceil(int(vocab) / multiple) * multiple)

    pos_type = spec.pop("position_embedding_type", "learned_absolute")
    max_pos = spec.pop("max_position_embeddings", None)
    if max_pos is None:
        if pos_type == "learned_absolute":
            raise SpecError("max_position_embeddings is required with learned_absolute positions")
        max_pos = 4096
    apply_rope_fusion = bool(spec.pop("apply_rope_fusion")) and pos_type == "rope"

    if spec.pop("recompute_activations", False):
        spec["recompute_granularity"] = "selective"

    vpp = spec.pop("virtual_pipeline_model_parallel_size", None)
    stages = spec.pop("num_virtual_stages_per_pipeline_rank", None)
    per_stage = spec.pop("num_layers_per_virtual_pipeline_stage", None)
    if sum(x is not None for x in (vpp, stages, per_stage)) > 1:
        raise SpecError("give at most one of virtual_pipeline_model_parallel_size, "
                        "num_virtual_stages_per_pipeline_rank, num_layers_per_virtual_pipeline_stage")
    if stages is not None:
        vpp = stages
    elif per_stage is not None:
        layers = int(spec["num_layers"]) + bool(spec.get("account_for_embedding_in_pipeline_split")) \
            + bool(spec.get("account_for_loss_in_pipeline_split"))
        vpp = layers // pp // int(per_stage)
    layout = spec.get("pipeline_model_parallel_layout")
    if layout is not None:
        # megatron/training/arguments.py: the layout's stage count fixes the VPP size
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout,
        )
        if isinstance(layout, str):
            num_stages = PipelineParallelLayerLayout.get_num_stages_from_str(layout)
        else:
            num_stages = len(layout)
        if num_stages % pp:
            raise SpecError(f"pipeline_model_parallel_layout has {num_stages} stages, "
                            f"not a multiple of pipeline_model_parallel_size {pp}")
        if vpp is not None and int(vpp) != num_stages // pp:
            raise SpecError("pipeline_model_parallel_layout conflicts with the virtual stage count")
        vpp = num_stages // pp
    vpp = int(vpp) if vpp is not None and int(vpp) > 1 else None

    fp16 = bool(spec.pop("fp16", False))
    bf16 = bool(spec.pop("bf16", True)) and not fp16
    params_dtype = torch.bfloat16 if bf16 else (torch.float16 if fp16 else torch.float32)

    spec.pop("create_attention_mask_in_dataloader", None)  # read by saved_activation_bytes
    eps = spec.pop("norm_epsilon", None)
    if eps is not None:
        spec["layernorm_epsilon"] = eps
    first = spec.pop("decoder_first_pipeline_num_layers", None)
    last = spec.pop("decoder_last_pipeline_num_layers", None)

    tc = {k: v for k, v in spec.items() if k in fields}
    if "moe_layer_freq" in tc:
        tc["moe_layer_freq"] = _parse_moe_layer_freq(tc["moe_layer_freq"])
    # TransformerConfig refuses apply_rope_fusion without Transformer Engine; the GPU
    # emulation of the fused RoPE is switched on after construction (_gpu_kernels).
    tc["apply_rope_fusion"] = False
    if tc.get("apply_query_key_layer_scaling"):
        tc["attention_softmax_in_fp32"] = True
    tc.update(
        hidden_size=h,
        num_attention_heads=a,
        ffn_hidden_size=int(ffn),
        kv_channels=int(kv_channels),
        gated_linear_unit=gated,
        activation_func=act,
        bias_activation_fusion=bias_activation_fusion,
        num_moe_experts=num_experts,
        num_layers_in_first_pipeline_stage=first,
        num_layers_in_last_pipeline_stage=last,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        virtual_pipeline_model_parallel_size=vpp,
        sequence_parallel=bool(spec.get("sequence_parallel", False)) and tp > 1,
        bf16=bf16,
        fp16=fp16,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        use_cpu_initialization=True,
        # weight-gradient fusion needs a CUDA extension; it changes no saved activation
        gradient_accumulation_fusion=False,
    )
    if num_experts is None:
        # a dense model: Megatron's MoE flags have no effect without --num-experts
        for key in [k for k in tc if k.startswith("moe_")]:
            tc.pop(key)
    else:
        if tc.get("moe_ffn_hidden_size") is None:
            tc["moe_ffn_hidden_size"] = int(ffn)
        # The local spec's grouped GEMM is the legacy GroupedMLP, which needs the
        # grouped_gemm CUDA package; SequentialMLP builds the same expert weights (per expert
        # fc1 h x F(x2 gated)/etp, fc2 F/etp x h), as does TEGroupedMLP on a GPU.
        tc["moe_grouped_gemm"] = False
    if not mla:
        for key in ("rotary_base", "rotary_percent"):
            tc.pop(key, None)

    return _Normalized(
        tc_kwargs=tc,
        mla=mla,
        vocab_size=int(padded),
        max_sequence_length=int(max_pos),
        position_embedding_type=pos_type,
        rotary_percent=float(spec.get("rotary_percent", 1.0)),
        rotary_base=int(spec.get("rotary_base", 10000)),
        seq_len_interpolation_factor=spec.get("rotary_seq_len_interpolation_factor"),
        rope_scaling=bool(spec.get("use_rope_scaling", False)),
        rope_scaling_factor=float(spec.get("rope_scaling_factor", 8.0)),
        share_embeddings_and_output_weights=not bool(
            spec.get("untie_embeddings_and_output_weights", False)),
        fp16_lm_cross_entropy=bool(spec.get("fp16_lm_cross_entropy", False)),
        rope_fusion=apply_rope_fusion and not mla,
        tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp,
    )


def _make_config(norm: _Normalized, **overrides):
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )
    config_class = MLATransformerConfig if norm.mla else TransformerConfig
    kwargs = dict(norm.tc_kwargs)
    kwargs.update(overrides)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return config_class(**kwargs)
    except (AssertionError, ValueError, TypeError) as exc:
        raise SpecError(f"megatron-core rejects the configuration: {exc}") from exc


# --------------------------------------------------------------------------------------
# A single-process "distributed" megatron: fake process group + parallel_state
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    import logging
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


@contextlib.contextmanager
def _parallel_state(norm: _Normalized, pipeline_rank: int) -> Iterator[None]:
    """torch.distributed on the fake backend (as Megatron's --fake-process-group does, see
    megatron/training/initialize.py) plus parallel_state for the spec's sizes, with this
    process playing TP rank 0 / CP rank 0 / EP rank 0 / DP rank 0 of ``pipeline_rank``."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from megatron.core import parallel_state as ps

    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process")
    # Megatron: world % (tp*pp*cp) == 0 and world % (etp*ep*pp) == 0.
    per_stage = math.lcm(norm.tp * norm.cp, norm.etp * norm.ep)
    world = norm.pp * per_stage
    # order tp-cp-ep-dp-pp: pp is the slowest-varying rank coordinate.
    rank = pipeline_rank * per_stage
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        try:
            with _quiet():
                ps.initialize_model_parallel(
                    tensor_model_parallel_size=norm.tp,
                    pipeline_model_parallel_size=norm.pp,
                    virtual_pipeline_model_parallel_size=norm.vpp,
                    context_parallel_size=norm.cp,
                    expert_model_parallel_size=norm.ep,
                    expert_tensor_parallel_size=norm.etp,
                    create_gloo_process_groups=False,
                )
        except (AssertionError, RuntimeError, ValueError) as exc:
            raise SpecError(f"megatron-core rejects the parallel sizes: {exc}") from exc
        assert ps.get_pipeline_model_parallel_rank() == pipeline_rank
        assert ps.get_tensor_model_parallel_rank() == 0
        yield
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@contextlib.contextmanager
def _cpu_only_megatron() -> Iterator[None]:
    """Let megatron-core's CUDA-assuming code run on the CPU.

    megatron-core creates buffers with ``device=torch.cuda.current_device()`` (global memory
    buffer, all-gather outputs, router weights) and moves the duplicated tied embedding with
    ``.cuda()``; its RNG tracker forks the CUDA generator around dropout.  Here
    ``current_device`` names the CPU, ``.cuda()`` is the identity, and the RNG tracker forks
    nothing (dropout then draws from the CPU generator: which elements drop does not change
    what is saved).  ``torch.compile``'d helpers run eagerly.
    """
    import torch
    import torch._dynamo
    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import multi_latent_attention as mla_module

    class _CpuRngTracker:
        def is_initialized(self):
            return True

        def reset(self):
            pass

        def get_states(self):
            return {}

        def set_states(self, states):
            pass

        def add(self, name, seed):
            pass

        def fork(self, name=None):
            return contextlib.nullcontext()

    saved = {
        "current_device": torch.cuda.current_device,
        "tensor_cuda": torch.Tensor.cuda,
        "tracker": mrandom._CUDA_RNG_STATE_TRACKER,
        "tracker_init": mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        "get_state": mrandom._get_cuda_rng_state,
        "set_state": mrandom._set_cuda_rng_state,
        "dynamo_disable": torch._dynamo.config.disable,
        "mla_have_te": mla_module.HAVE_TE,
    }
    # Without Transformer Engine, megatron/core/extensions/transformer_engine.py leaves
    # MagicMock placeholders for TELinear & co., so multi_latent_attention.py's import
    # succeeds and sets HAVE_TE = True; its isinstance(..., TELinear) checks then fail.
    if not getattr(te_ext, "HAVE_TE", False):
        mla_module.HAVE_TE = False
    # transformer/moe/moe_utils.py binds te_general_gemm only when Transformer Engine imports,
    # then tests `te_general_gemm is not None` in the router's gating GEMM.
    from megatron.core.transformer.moe import moe_utils
    had_gemm = hasattr(moe_utils, "te_general_gemm")
    if not had_gemm:
        moe_utils.te_general_gemm = None
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    mrandom._CUDA_RNG_STATE_TRACKER = _CpuRngTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    torch._dynamo.config.disable = True
    try:
        yield
    finally:
        torch.cuda.current_device = saved["current_device"]
        torch.Tensor.cuda = saved["tensor_cuda"]
        mrandom._CUDA_RNG_STATE_TRACKER = saved["tracker"]
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = saved["tracker_init"]
        mrandom._get_cuda_rng_state = saved["get_state"]
        mrandom._set_cuda_rng_state = saved["set_state"]
        torch._dynamo.config.disable = saved["dynamo_disable"]
        mla_module.HAVE_TE = saved["mla_have_te"]
        if not had_gemm:
            del moe_utils.te_general_gemm


def _layer_spec(config, norm: _Normalized, vp_stage: int | None, pipeline_rank: int):
    """The decoder spec Megatron's GPT builder picks for the local implementation
    (megatron/training/models/gpt.py default_layer_spec / _te_or_local_layer_spec)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
    )
    if config.num_moe_experts is not None:
        return get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=config.normalization,
            qk_l2_norm=config.qk_l2_norm, vp_stage=vp_stage, pp_rank=pipeline_rank)
    return get_gpt_layer_local_spec(
        config.num_moe_experts, config.moe_grouped_gemm, config.qk_layernorm,
        config.multi_latent_attention, normalization=config.normalization,
        qk_l2_norm=config.qk_l2_norm)


def _mtp_spec(config, vp_stage: int | None, pipeline_rank: int):
    """megatron/training/models/gpt.py mtp_block_spec: the MTP layer reuses the spec of the
    last decoder layer of the whole model."""
    if not config.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_layer_specs,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    if config.num_moe_experts is not None:
        last = get_gpt_decoder_layer_specs(
            config, use_transformer_engine=False, normalization=config.normalization,
            qk_l2_norm=config.qk_l2_norm)[-1]
    else:
        last = get_gpt_layer_local_spec(
            None, False, config.qk_layernorm, config.multi_latent_attention,
            normalization=config.normalization, qk_l2_norm=config.qk_l2_norm)
    return get_gpt_mtp_block_spec(config, last, use_transformer_engine=False,
                                  vp_stage=vp_stage, pp_rank=pipeline_rank)


@contextlib.contextmanager
def _norms_accept_sequence_parallel(config) -> Iterator[None]:
    """The local spec's torch norms (megatron/core/transformer/torch_norm.py WrappedTorchNorm)
    refuse sequence parallelism; apex's FusedLayerNorm, which a GPU run of the local spec
    uses for LayerNorm, accepts it and marks its weights ``sequence_parallel``.  With SP the
    harness builds the torch norm the same way.  (Local-spec RMSNorm always takes the torch
    norm, so megatron-core 0.16.1 cannot run RMSNorm + SP with the local spec at all; the TE
    spec can, and saves the same per-shard tensors.)"""
    if not config.sequence_parallel:
        yield
        return
    import copy
    from megatron.core.transformer import torch_norm

    original = torch_norm.WrappedTorchNorm.__new__

    def new(cls, config, hidden_size, eps=1e-5, **kwargs):
        relaxed = copy.copy(config)
        relaxed.sequence_parallel = False
        norm = original(cls, relaxed, hidden_size, eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    torch_norm.WrappedTorchNorm.__new__ = new
    try:
        yield
    finally:
        torch_norm.WrappedTorchNorm.__new__ = original


def _mla_core_attention_class():
    """megatron-core 0.16.1's local spec cannot build MLA: MLASelfAttention passes
    ``k_channels`` / ``v_channels`` to its core attention (multi_latent_attention.py), which
    only TEDotProductAttention accepts.  This stand-in is megatron-core's own
    DotProductAttention (parameter-free, the same unfused math) with the output width of
    ``v_head_dim`` heads; MLASelfAttention passes its softmax scale explicitly."""
    import copy
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, config, layer_number, attn_mask_type, attention_type,
                     attention_dropout=None, softmax_scale=None, k_channels=None,
                     v_channels=None, cp_comm_type=None, pg_collection=None):
            # Attention.__init__ builds a first core attention without k/v channels, and
            # MLASelfAttention then replaces it; both get the v_head_dim output width.
            config = copy.copy(config)
            config.kv_channels = v_channels if v_channels is not None else config.v_head_dim
            super().__init__(config, layer_number, attn_mask_type, attention_type,
                             attention_dropout=attention_dropout, softmax_scale=softmax_scale,
                             cp_comm_type=cp_comm_type, pg_collection=pg_collection)

    return MLADotProductAttention


def _patch_mla_core_attention(spec, replacement, seen=None) -> None:
    """Walk a (block / layer / MTP) spec and swap MLA's core attention for ``replacement``."""
    from megatron.core.transformer.multi_latent_attention import MLASelfAttentionSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    seen = set() if seen is None else seen
    if spec is None or id(spec) in seen:
        return
    seen.add(id(spec))
    if isinstance(spec, MLASelfAttentionSubmodules):
        spec.core_attention = replacement
        return
    if isinstance(spec, ModuleSpec):
        _patch_mla_core_attention(spec.submodules, replacement, seen)
        return
    if isinstance(spec, (list, tuple)):
        for item in spec:
            _patch_mla_core_attention(item, replacement, seen)
        return
    if dataclasses.is_dataclass(spec):
        for f in dataclasses.fields(spec):
            _patch_mla_core_attention(getattr(spec, f.name), replacement, seen)


def _build_gpt(config, norm: _Normalized, pipeline_rank: int, vp_stage: int | None):
    """One model chunk, as megatron/training/models/gpt.py GPTModelBuilder.build_model makes
    it: pre_process on the first chunk of PP rank 0, post_process on the last of the last."""
    from megatron.core.models.gpt import GPTModel

    chunks = norm.vpp or 1
    first_chunk = vp_stage is None or vp_stage == 0
    last_chunk = vp_stage is None or vp_stage == chunks - 1
    try:
        layer_spec = _layer_spec(config, norm, vp_stage, pipeline_rank)
        mtp_spec = _mtp_spec(config, vp_stage, pipeline_rank)
        if norm.mla:
            replacement = _mla_core_attention_class()
            _patch_mla_core_attention(layer_spec, replacement)
            _patch_mla_core_attention(mtp_spec, replacement)
        with _quiet(), _norms_accept_sequence_parallel(config):
            return GPTModel(
                config=config,
                transformer_layer_spec=layer_spec,
                vocab_size=norm.vocab_size,
                max_sequence_length=norm.max_sequence_length,
                pre_process=pipeline_rank == 0 and first_chunk,
                post_process=pipeline_rank == norm.pp - 1 and last_chunk,
                fp16_lm_cross_entropy=norm.fp16_lm_cross_entropy,
                parallel_output=True,
                share_embeddings_and_output_weights=norm.share_embeddings_and_output_weights,
                position_embedding_type=norm.position_embedding_type,
                rotary_percent=norm.rotary_percent,
                rotary_base=norm.rotary_base,
                rope_scaling=norm.rope_scaling,
                rope_scaling_factor=norm.rope_scaling_factor,
                seq_len_interpolation_factor=norm.seq_len_interpolation_factor,
                mtp_block_spec=mtp_spec,
                vp_stage=vp_stage,
            )
    except (AssertionError, ValueError) as exc:
        # megatron-core checks shapes with asserts (divide(), layouts) while building
        raise SpecError(f"megatron-core rejects the configuration: {exc}") from exc


def _global_layer_names(model) -> dict[str, str]:
    """Local module path prefix -> global one (decoder.layers.<i> uses the global index)."""
    mapping = {}
    for i, layer in enumerate(model.decoder.layers):
        mapping[f"decoder.layers.{i}."] = f"decoder.layers.{layer.layer_number - 1}."
    return mapping


def _rename(name: str, mapping: Mapping[str, str]) -> str:
    for local, global_ in mapping.items():
        if name.startswith(local):
            return global_ + name[len(local):]
    return name


def _prefix_of(name: str) -> str:
    if name.startswith("decoder.layers."):
        return "decoder.layers"
    if name.startswith("decoder.final_layernorm"):
        return "decoder.final_layernorm"
    return name.split(".", 1)[0]


_TE_REPLICATED_SUFFIXES = (
    # megatron/core/transformer/multi_latent_attention.py: TELinear(parallel_mode="duplicated")
    "self_attention.linear_q_down_proj.weight",
    "self_attention.linear_kv_down_proj.weight",
)


# --------------------------------------------------------------------------------------
# Part 1: parameter counts
# --------------------------------------------------------------------------------------

def reference_parameter_counts(spec: Mapping[str, Any]) -> list[StageCount]:
    """Parameters per pipeline rank (and virtual stage) on one GPU, as megatron-core builds
    them.  Ordered by pipeline rank, then virtual stage."""
    import torch

    _import_megatron()
    norm = _normalize(spec)
    results: list[StageCount] = []
    stages = range(norm.vpp) if norm.vpp else [None]
    for rank in range(norm.pp):
        with _parallel_state(norm, rank), _cpu_only_megatron():
            # sequence parallelism changes no parameter shape
            config = _make_config(norm, perform_initialization=False, sequence_parallel=False)
            for vp_stage in stages:
                with torch.device("meta"):
                    model = _build_gpt(config, norm, rank, vp_stage)
                results.append(_count_stage(model, norm, rank, vp_stage))
                del model
    return results


def _count_stage(model, norm: _Normalized, rank: int, vp_stage: int | None) -> StageCount:
    mapping = _global_layer_names(model)
    tensors = []
    for local_name, param in model.named_parameters():  # shared parameters appear once
        name = _rename(local_name, mapping)
        numel = param.numel()
        te_numel = numel
        if norm.tp > 1 and name.endswith(_TE_REPLICATED_SUFFIXES):
            te_numel = numel * norm.tp
        tensors.append(ParamCount(
            name=name,
            shape=tuple(param.shape),
            numel=numel,
            te_numel=te_numel,
            expert=".mlp.experts." in name,
        ))
    by_prefix: dict[str, int] = {}
    for t in tensors:
        key = _prefix_of(t.name)
        by_prefix[key] = by_prefix.get(key, 0) + t.numel
    mtp_layers = len(model.mtp.layers) if getattr(model, "mtp_process", False) else 0
    return StageCount(
        pipeline_rank=rank,
        virtual_stage=vp_stage,
        total=sum(t.numel for t in tensors),
        te_total=sum(t.te_numel for t in tensors),
        expert_total=sum(t.numel for t in tensors if t.expert),
        by_prefix=by_prefix,
        layer_numbers=tuple(layer.layer_number for layer in model.decoder.layers),
        mtp_layers=mtp_layers,
        tensors=tuple(tensors),
    )


# --------------------------------------------------------------------------------------
# Published models: the Megatron flags that rebuild them, and their published sizes
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PublishedModel:
    name: str
    parameters: int                    # published total parameter count
    spec: Mapping[str, Any]            # Megatron argument dests (TP = PP = 1)
    flags: tuple[str, ...]             # the same as Megatron command-line flags


_LLAMA_COMMON = {
    "position_embedding_type": "rope", "normalization": "RMSNorm", "swiglu": True,
    "add_bias_linear": False, "untie_embeddings_and_output_weights": True,
    "group_query_attention": True, "num_query_groups": 8, "kv_channels": 128,
    "hidden_dropout": 0.0, "attention_dropout": 0.0,
}

PUBLISHED_MODELS: dict[str, PublishedModel] = {
    "llama3-8b": PublishedModel(
        name="LLaMA-3-8B",
        parameters=8_030_261_248,
        spec={**_LLAMA_COMMON, "num_layers": 32, "hidden_size": 4096,
              "ffn_hidden_size": 14336, "num_attention_heads": 32,
              "vocab_size": 128256, "max_position_embeddings": 8192, "rotary_base": 500000},
        flags=("--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
               "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
               "--kv-channels", "128", "--max-position-embeddings", "8192",
               "--position-embedding-type", "rope", "--rotary-base", "500000",
               "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
               "--untie-embeddings-and-output-weights", "--attention-dropout", "0.0",
               "--hidden-dropout", "0.0", "--tokenizer-type", "HuggingFaceTokenizer",
               "(vocab 128256 = 1002 * 128: padded vocab 128256 at TP=1)"),
    ),
    "llama3-70b": PublishedModel(
        name="LLaMA-3-70B",
        parameters=70_553_706_496,
        spec={**_LLAMA_COMMON, "num_layers": 80, "hidden_size": 8192,
              "ffn_hidden_size": 28672, "num_attention_heads": 64,
              "vocab_size": 128256, "max_position_embeddings": 8192, "rotary_base": 500000},
        flags=("--num-layers", "80", "--hidden-size", "8192", "--ffn-hidden-size", "28672",
               "--num-attention-heads", "64", "--group-query-attention", "--num-query-groups", "8",
               "--kv-channels", "128", "--max-position-embeddings", "8192",
               "--position-embedding-type", "rope", "--rotary-base", "500000",
               "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
               "--untie-embeddings-and-output-weights", "--attention-dropout", "0.0",
               "--hidden-dropout", "0.0", "(vocab 128256: padded 128256 at TP=1)"),
    ),
    "mixtral-8x7b": PublishedModel(
        name="Mixtral-8x7B",
        parameters=46_702_792_704,
        spec={**_LLAMA_COMMON, "num_layers": 32, "hidden_size": 4096,
              "ffn_hidden_size": 14336, "num_attention_heads": 32,
              "vocab_size": 32000, "max_position_embeddings": 32768, "rotary_base": 1000000,
              "num_experts": 8, "moe_router_topk": 2, "moe_grouped_gemm": True,
              "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.01},
        flags=("--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
               "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
               "--max-position-embeddings", "32768", "--position-embedding-type", "rope",
               "--rotary-base", "1000000", "--normalization", "RMSNorm", "--swiglu",
               "--disable-bias-linear", "--untie-embeddings-and-output-weights",
               "--num-experts", "8", "--moe-router-topk", "2", "--moe-grouped-gemm",
               "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
               "(vocab 32000 = 250 * 128: padded 32000 at TP=1)"),
    ),
    "deepseek-v2-lite": PublishedModel(
        name="DeepSeek-V2-Lite",
        parameters=15_706_484_224,
        spec={"num_layers": 27, "hidden_size": 2048, "ffn_hidden_size": 10944,
              "num_attention_heads": 16, "kv_channels": 16, "multi_latent_attention": True,
              "q_lora_rank": None, "kv_lora_rank": 512, "qk_head_dim": 128,
              "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "qk_layernorm": True,
              "position_embedding_type": "rope", "normalization": "RMSNorm",
              "norm_epsilon": 1e-6, "swiglu": True, "add_bias_linear": False,
              "untie_embeddings_and_output_weights": True,
              "vocab_size": 102400, "make_vocab_size_divisible_by": 3200,
              "max_position_embeddings": 163840,
              "num_experts": 64, "moe_layer_freq": "([0]+[1]*26)", "moe_ffn_hidden_size": 1408,
              "moe_shared_expert_intermediate_size": 2816, "moe_router_topk": 6,
              "moe_grouped_gemm": True, "moe_router_score_function": "softmax",
              "moe_router_pre_softmax": True, "moe_router_topk_scaling_factor": 1.0,
              "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-3,
              "hidden_dropout": 0.0, "attention_dropout": 0.0},
        flags=("--num-layers", "27", "--hidden-size", "2048", "--ffn-hidden-size", "10944",
               "--num-attention-heads", "16", "--kv-channels", "16", "--multi-latent-attention",
               "--kv-lora-rank", "512", "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64",
               "--v-head-dim", "128", "--qk-layernorm", "--position-embedding-type", "rope",
               "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu",
               "--disable-bias-linear", "--untie-embeddings-and-output-weights",
               "--make-vocab-size-divisible-by", "3200", "--max-position-embeddings", "163840",
               "--num-experts", "64", "--moe-layer-freq", "([0]+[1]*26)",
               "--moe-ffn-hidden-size", "1408", "--moe-shared-expert-intermediate-size", "2816",
               "--moe-router-topk", "6", "--moe-grouped-gemm",
               "--moe-router-score-function", "softmax", "--moe-router-pre-softmax",
               "--moe-router-topk-scaling-factor", "1.0",
               "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-3",
               "(no --q-lora-rank: V2-Lite projects q directly; vocab 102400 = 32 * 3200)"),
    ),
}


# --------------------------------------------------------------------------------------
# Part 2: activation bytes saved for backward
# --------------------------------------------------------------------------------------

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def saved_activation_bytes(spec: Mapping[str, Any], seq_length: int, micro_batch_size: int,
                           dtype: str = "bf16", kernels: str = "gpu") -> ActivationMeasurement:
    """Every storage one forward pass (embedding, all decoder layers, final norm, output
    layer, loss) saves for backward, on one GPU of a TP/EP group (TP rank 0).

    Pipeline settings in ``spec`` are ignored: the whole model is built as one stage, since
    what a layer saves does not depend on where it sits.  ``kernels``: "gpu" (CUDA kernels'
    saving behaviour, see the module docstring) or "cpu" (what this machine's kernels save).
    """
    import torch

    _import_megatron()
    if dtype not in _DTYPES:
        raise SpecError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    if kernels not in ("gpu", "cpu"):
        raise SpecError(f"kernels: expected 'gpu' or 'cpu', got {kernels!r}")
    spec = {k: v for k, v in spec.items() if k not in _PIPELINE_KEYS}
    spec["bf16"] = dtype == "bf16"
    spec["fp16"] = dtype == "fp16"
    create_mask = bool(spec.pop("create_attention_mask_in_dataloader", True))
    norm = _normalize(spec)
    if norm.cp > 1:
        raise SpecError("context_parallel_size > 1 needs TEDotProductAttention; the local "
                        "spec cannot run it")
    s, b = int(seq_length), int(micro_batch_size)
    if norm.tc_kwargs.get("sequence_parallel") and s % norm.tp:
        raise SpecError("seq_length must be divisible by TP with sequence parallelism")

    with _parallel_state(norm, 0), _cpu_only_megatron():
        config = _make_config(norm, perform_initialization=True)
        torch.manual_seed(1234)
        model = _build_gpt(config, norm, 0, None)
        # megatron/training/training.py get_model: Float16Module casts every parameter
        # (norms included) to bf16/fp16 and the inputs of the first stage.
        runner = model
        if dtype != "fp32":
            from megatron.core.transformer.module import Float16Module
            runner = Float16Module(config, model)
        runner.train()
        generator = torch.Generator().manual_seed(4321)
        input_ids = torch.randint(0, norm.vocab_size, (b, s), generator=generator)
        labels = torch.randint(0, norm.vocab_size, (b, s), generator=generator)
        # the GPT dataset returns per-sample position ids; collated they are a [b, s] int64
        position_ids = torch.arange(s).repeat(b, 1)
        # megatron/training/utils.py get_ltor_masks_and_position_ids: bool [1, 1, s, s],
        # True where attention is masked.  Without it the local DotProductAttention builds
        # the same mask on "cuda" (transformer/utils.py get_default_causal_mask).
        attention_mask = torch.tril(torch.ones((1, s, s))).view(1, 1, s, s) < 0.5
        recorder = _SavedTensorRecorder(model)
        patches = _gpu_kernels(config, norm) if kernels == "gpu" else _cpu_kernels()
        with patches, recorder, _quiet():
            loss = runner(input_ids, position_ids, attention_mask if create_mask else None,
                          labels=labels)
        tensors = recorder.result()   # while `loss` keeps the graph alive
        mean_loss = float(loss.detach().float().mean())
        del loss, model, runner
    return ActivationMeasurement(seq_length=s, micro_batch_size=b, dtype=dtype,
                                 kernels=kernels, loss=mean_loss, tensors=tensors)


_PIPELINE_KEYS = {
    "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
}


class _Packed:
    """What the pack hook hands autograd: the saved tensor, weakly watched by the recorder.
    When autograd drops the graph node that saved it (megatron re-parents the outputs of a
    checkpointed chunk, discarding the graph its bias-dropout-add built under
    ``torch.enable_grad``), the wrapper dies with it."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


_FACTORIES = {"tensor", "as_tensor", "ones", "zeros", "empty", "full", "arange", "rand",
              "randn", "randint", "ones_like", "zeros_like", "empty_like", "full_like"}


class _SavedTensorRecorder:
    """saved_tensors_hooks + module hooks: which module saved which storage first, and which
    saved storages the autograd graph still holds when the forward pass ends."""

    def __init__(self, model):
        import torch
        self._torch = torch
        self._model = model
        self._stack: list[str] = []
        self._handles = []
        self._records: list[dict] = []
        self._current: dict[tuple[int, int], dict] = {}
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._layer_inputs: dict[int, int] = {}        # storage ptr -> layer index
        self._keep_alive: list = []                    # layer inputs: no ptr reuse
        self._shared_inputs: set[int] = set()          # storage ptrs of decoder-wide inputs
        self._op_stack: list[str] = []

    # -- module context -----------------------------------------------------------------
    def _install(self):
        for name, module in self._model.named_modules():
            self._handles.append(module.register_forward_pre_hook(
                self._enter(name), with_kwargs=True))
            self._handles.append(module.register_forward_hook(
                self._leave(name), always_call=True))

    def _enter(self, name):
        torch = self._torch

        def hook(module, args, kwargs):
            self._stack.append(name)
            if name.startswith("decoder.layers.") and name.count(".") == 2:
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                if isinstance(hidden, torch.Tensor):
                    self._layer_inputs.setdefault(
                        hidden.untyped_storage().data_ptr(), int(name.split(".")[2]))
                    self._keep_alive.append(hidden)
            if name == "decoder":
                for key in ("attention_mask", "rotary_pos_emb", "rotary_pos_cos",
                            "rotary_pos_sin", "context", "context_mask"):
                    value = kwargs.get(key)
                    if isinstance(value, torch.Tensor):
                        self._shared_inputs.add(value.untyped_storage().data_ptr())
            return None
        return hook

    def _leave(self, name):
        def hook(module, args, output):
            if self._stack and self._stack[-1] == name:
                self._stack.pop()
            return None
        return hook

    # -- saved tensors --------------------------------------------------------------------
    def _pack(self, tensor):
        import weakref
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_ptrs or storage.nbytes() == 0:
            return tensor
        packed = _Packed(tensor)
        key = (ptr, storage.nbytes())
        module = self._stack[-1] if self._stack else ""
        entry = self._current.get(key)
        if entry is None or not any(ref() is not None for ref in entry["refs"]):
            op, site = self._current_op()
            entry = {
                "ptr": ptr,
                "module": module,
                "op": op,
                "site": site,
                "shape": tuple(tensor.shape),
                "dtype": str(tensor.dtype).replace("torch.", ""),
                "nbytes": storage.nbytes(),
                "savers": set(),
                "host": False,
                "refs": [],
            }
            self._records.append(entry)
            self._current[key] = entry
        entry["savers"].add(module)
        entry["host"] = entry["host"] or bool(getattr(tensor, "_mcore_reference_host", False))
        entry["refs"].append(weakref.ref(packed))
        return packed

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Packed) else packed

    def _current_op(self) -> tuple[str, str]:
        """(op, site): the torch function being run (or, for a custom autograd Function,
        the megatron function that applied it) and the megatron source line that ran it."""
        import os
        import sys
        frame = sys._getframe(2)
        site, caller, emulated = "?", "?", None
        marker = os.sep + "megatron" + os.sep
        here = os.path.abspath(__file__)
        while frame is not None:
            path = frame.f_code.co_filename
            if emulated is None and os.path.abspath(path) == here and \
                    frame.f_code.co_qualname.startswith("_gpu_kernels."):
                # one of the CUDA-kernel emulations below (_gpu_kernels)
                emulated = frame.f_code.co_qualname.split("<locals>.", 1)[1]
            if marker in path and os.path.abspath(path) != here:
                site = "megatron/" + path.split(marker, 1)[1] + f":{frame.f_lineno}"
                caller = frame.f_code.co_qualname
                break
            frame = frame.f_back
        if emulated is not None:
            op = f"{emulated} (CUDA kernel emulation)"
        elif self._op_stack:
            op = self._op_stack[-1]
        else:
            op = f"autograd.Function in {caller}"
        return op, site

    def __enter__(self):
        from torch.overrides import TorchFunctionMode
        recorder = self

        class _OpNames(TorchFunctionMode):
            """Names the torch function running when a tensor is packed, and marks tensors
            made by factory calls without a device: on a GPU run those live in host
            memory too (e.g. the fused softmax's scale, the checkpointed attention's
            mask-type tensor)."""
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", str(func))
                recorder._op_stack.append(name)
                try:
                    result = func(*args, **(kwargs or {}))
                finally:
                    recorder._op_stack.pop()
                if name in _FACTORIES and (kwargs or {}).get("device") is None and \
                        isinstance(result, recorder._torch.Tensor) and \
                        not name.endswith("_like"):
                    try:
                        result._mcore_reference_host = True
                    except AttributeError:
                        pass
                return result

        self._install()
        self._mode = _OpNames()
        self._hooks = self._torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._mode.__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        return False

    def result(self) -> tuple[SavedTensor, ...]:
        """Saved storages the graph still holds (call while the loss is alive)."""
        out = []
        for entry in self._records:
            if not any(ref() is not None for ref in entry["refs"]):
                continue
            group, layer = self._classify(entry)
            if entry["host"]:
                group, layer = "host", None
            out.append(SavedTensor(
                module=entry["module"], op=entry["op"], site=entry["site"], shape=entry["shape"],
                dtype=entry["dtype"], nbytes=entry["nbytes"], group=group, layer=layer))
        return tuple(out)

    def _classify(self, entry: dict) -> tuple[str, int | None]:
        ptr = entry["ptr"]
        if ptr in self._layer_inputs:
            return "layer", self._layer_inputs[ptr]
        layers = {int(m.split(".")[2]) for m in entry["savers"] if m.startswith("decoder.layers.")}
        if ptr in self._shared_inputs or len(layers) > 1:
            return "shared", None
        module = entry["module"]
        if len(layers) == 1:
            return "layer", layers.pop()
        if module.startswith("embedding"):
            return "embedding", None
        if module.startswith("decoder.final_layernorm"):
            return "final_layernorm", None
        if module.startswith("output_layer"):
            return "output_layer", None
        if module.startswith("mtp"):
            return "mtp", None
        if module == "":
            return "loss", None
        return "other", None


@contextlib.contextmanager
def _gpu_kernels(config, norm: _Normalized) -> Iterator[None]:
    """Give this CPU forward pass the saving behaviour of the kernels a CUDA run uses.

    - dropout: at::dropout takes ``native_dropout`` on CUDA (aten/native/Dropout.cpp
      ``is_fused_kernel_acceptable``), saving a bool mask; the CPU path saves a noise tensor
      of the input dtype.
    - LayerNorm: CUDA ``native_layer_norm`` keeps mean/rstd in the accumulation type (fp32);
      the CPU kernel keeps them in the parameter dtype.
    - RMSNorm: torch.nn.RMSNorm -> ``_fused_rms_norm``, a CUDA kernel whose backward needs
      input, weight and the fp32 rstd (tools/autograd/derivatives.yaml); on the CPU it
      decomposes into ops that save fp32 copies.
    - masked softmax: megatron's FusedScaleMaskSoftmax takes the fused kernels when
      ``is_kernel_available`` (apex's ``scaled_*_softmax_cuda`` extensions, in NGC containers);
      they save only the probabilities in the input dtype (fusions/fused_softmax.py).  The
      batch-per-block rule is the CUDA kernel's ``get_batch_per_block``.
    - fused RoPE (apply_rope_fusion, Transformer Engine present): TE's FusedRoPEFunc saves only
      the fp32 ``freqs`` table (transformer_engine/pytorch/attention/rope.py).
    """
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.enums import AttnMaskType

    class CudaLayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, normalized_shape, weight, bias, eps):
            w = weight.float() if weight is not None else None
            b = bias.float() if bias is not None else None
            out, mean, rstd = torch.native_layer_norm(x.float(), normalized_shape, w, b, eps)
            ctx.normalized_shape = normalized_shape
            ctx.save_for_backward(x, weight, bias, mean, rstd)
            return out.to(x.dtype)

        @staticmethod
        def backward(ctx, grad):
            x, weight, bias, mean, rstd = ctx.saved_tensors
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
                grad.float(), x.float(), ctx.normalized_shape, mean, rstd,
                weight.float() if weight is not None else None,
                bias.float() if bias is not None else None,
                [True, weight is not None, bias is not None])
            return (gx.to(x.dtype), None, None if gw is None else gw.to(weight.dtype),
                    None if gb is None else gb.to(bias.dtype), None)

    class CudaRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, normalized_shape, weight, eps):
            dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
            x32 = x.float()
            eps = torch.finfo(torch.float32).eps if eps is None else eps
            rstd = torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + eps)
            out = x32 * rstd
            if weight is not None:
                out = out * weight.float()
            ctx.dims, ctx.eps = dims, eps
            ctx.save_for_backward(x, weight, rstd)
            return out.to(x.dtype)

        @staticmethod
        def backward(ctx, grad):
            x, weight, _ = ctx.saved_tensors
            with torch.enable_grad():
                xr = x.detach().float().requires_grad_()
                inputs = [xr]
                out = xr * torch.rsqrt(xr.pow(2).mean(ctx.dims, keepdim=True) + ctx.eps)
                if weight is not None:
                    wr = weight.detach().float().requires_grad_()
                    inputs.append(wr)
                    out = out * wr
                grads = torch.autograd.grad(out, inputs, grad.float())
            gw = grads[1].to(weight.dtype) if weight is not None else None
            return grads[0].to(x.dtype), None, gw, None

    class FusedSoftmax(torch.autograd.Function):
        """ScaledUpperTriangMaskedSoftmax / ScaledMaskedSoftmax / ScaledSoftmax: save
        (softmax_results, scale_t) only."""
        @staticmethod
        def forward(ctx, inputs, mask, scale, causal):
            x = inputs.float() * scale
            if causal:
                sq, sk = x.shape[-2], x.shape[-1]
                upper = torch.triu(torch.ones(sq, sk, dtype=torch.bool), diagonal=1)
                x = x.masked_fill(upper, float("-inf"))
            elif mask is not None:
                x = x.masked_fill(mask, -10000.0)
            probs = torch.softmax(x, dim=-1).to(inputs.dtype)
            scale_t = torch.tensor([scale])   # a host tensor on GPU runs too
            scale_t._mcore_reference_host = True
            ctx.save_for_backward(probs, scale_t)
            return probs

        @staticmethod
        def backward(ctx, grad):
            probs, scale_t = ctx.saved_tensors
            p = probs.float()
            g = grad.float()
            gx = scale_t[0] * p * (g - (g * p).sum(-1, keepdim=True))
            return gx.to(probs.dtype), None, None, None

    class UpperTriang:
        @staticmethod
        def apply(inputs, scale):
            return FusedSoftmax.apply(inputs, None, scale, True)

    class Masked:
        @staticmethod
        def apply(inputs, mask, scale):
            return FusedSoftmax.apply(inputs, mask, scale, False)

    class Unmasked:
        @staticmethod
        def apply(inputs, scale):
            return FusedSoftmax.apply(inputs, None, scale, False)

    def batch_per_block(sq, sk, b, np_):
        # scaled_masked_softmax.h get_batch_per_block (C10_WARP_SIZE = 32 on CUDA)
        next_power_of_two = 1 << max(0, (sk - 1).bit_length())
        warp_size = min(next_power_of_two, 32)
        batches_per_warp = 2 if next_power_of_two <= 128 else 1
        return (128 // warp_size) * batches_per_warp

    def is_kernel_available(self, mask, b, np_, sq, sk):
        attn_batches = b * np_
        if (self.scaled_masked_softmax_fusion and self.input_in_float16 and 16 < sk <= 4096
                and sq % 4 == 0 and sk % 4 == 0 and attn_batches % 4 == 0):
            bpb = batch_per_block(sq, sk, b, np_)
            if self.attn_mask_type == AttnMaskType.causal:
                return attn_batches % bpb == 0
            return sq % bpb == 0
        return False

    class FusedRoPE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, freqs, interleaved):
            if freqs.dtype != torch.float32:
                freqs = freqs.float()
            with torch.no_grad():
                out = rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=interleaved)
            ctx.interleaved = interleaved
            ctx.save_for_backward(freqs, None)
            return out

        @staticmethod
        def backward(ctx, grad):
            freqs, _ = ctx.saved_tensors
            # the rotation is orthogonal: its transpose rotates by -freqs
            with torch.no_grad():
                g = rope_utils._apply_rotary_pos_emb_bshd(grad, -freqs,
                                                          rotary_interleaved=ctx.interleaved)
            return g, None, None

    def fused_rope(t, freqs, interleaved=False, **kwargs):
        return FusedRoPE.apply(t, freqs, interleaved)

    original_dropout = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original_dropout(input, p, training, inplace)

    original_layer_norm = F.layer_norm

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        if input.requires_grad or (weight is not None and weight.requires_grad):
            return CudaLayerNorm.apply(input, tuple(normalized_shape), weight, bias, eps)
        return original_layer_norm(input, normalized_shape, weight, bias, eps)

    original_rms_norm = F.rms_norm

    def rms_norm(input, normalized_shape, weight=None, eps=None):
        same_dtype = weight is None or weight.dtype == input.dtype
        if same_dtype and (input.requires_grad or (weight is not None and weight.requires_grad)):
            return CudaRMSNorm.apply(input, tuple(normalized_shape), weight, eps)
        return original_rms_norm(input, normalized_shape, weight, eps)

    saved = {
        "dropout": F.dropout, "layer_norm": F.layer_norm, "rms_norm": F.rms_norm,
        "upper": fused_softmax.ScaledUpperTriangMaskedSoftmax,
        "masked": fused_softmax.ScaledMaskedSoftmax,
        "unmasked": fused_softmax.ScaledSoftmax,
        "available": fused_softmax.FusedScaleMaskSoftmax.is_kernel_available,
        "rope": rope_utils.fused_apply_rotary_pos_emb,
        "rope_fusion": config.apply_rope_fusion,
    }
    F.dropout, F.layer_norm, F.rms_norm = dropout, layer_norm, rms_norm
    fused_softmax.ScaledUpperTriangMaskedSoftmax = UpperTriang
    fused_softmax.ScaledMaskedSoftmax = Masked
    fused_softmax.ScaledSoftmax = Unmasked
    fused_softmax.FusedScaleMaskSoftmax.is_kernel_available = is_kernel_available
    if norm.rope_fusion:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope
        config.apply_rope_fusion = True
    try:
        yield
    finally:
        F.dropout, F.layer_norm, F.rms_norm = saved["dropout"], saved["layer_norm"], saved["rms_norm"]
        fused_softmax.ScaledUpperTriangMaskedSoftmax = saved["upper"]
        fused_softmax.ScaledMaskedSoftmax = saved["masked"]
        fused_softmax.ScaledSoftmax = saved["unmasked"]
        fused_softmax.FusedScaleMaskSoftmax.is_kernel_available = saved["available"]
        rope_utils.fused_apply_rotary_pos_emb = saved["rope"]
        config.apply_rope_fusion = saved["rope_fusion"]


@contextlib.contextmanager
def _cpu_kernels() -> Iterator[None]:
    """The CPU has no fused softmax extension: megatron's ``is_kernel_available`` would import
    ``scaled_masked_softmax_cuda`` and fail, so report it unavailable (the torch path)."""
    from megatron.core.fusions import fused_softmax
    saved = fused_softmax.FusedScaleMaskSoftmax.is_kernel_available
    fused_softmax.FusedScaleMaskSoftmax.is_kernel_available = lambda self, *args: False
    try:
        yield
    finally:
        fused_softmax.FusedScaleMaskSoftmax.is_kernel_available = saved
