"""GPT-2 and GPT-NeoX (Pythia): LayerNorm, GeLU MLPs and biases; learned absolute positions (GPT-2)
or rotary on part of each head (GPT-NeoX).
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.reader import ConfigReader
from megatron_estimator.inputs.hf.rope import supply_rope
from megatron_estimator.inputs.hf.shape import core_shape, supply_core_shape, supply_dropout, supply_tie, supply_vocab


def map_gpt2(r: ConfigReader) -> None:
    """GPT-2: learned absolute positions, LayerNorm, GeLU MLP, biases everywhere, tied output."""
    layers = r.positive_int("n_layer")
    hidden = r.positive_int("n_embd")
    heads = r.positive_int("n_head")
    inner = r.positive_int("n_inner", None, allow_none=True, note_default=False)
    positions = r.positive_int("n_positions")
    if layers:
        r.supply("--num-layers", layers, "n_layer")
    if hidden:
        r.supply("--hidden-size", hidden, "n_embd")
    if hidden and not (r.has("n_inner") and r.config["n_inner"] is not None and inner is None):
        # GPT2MLP: inner_dim = n_inner if set, else 4 * n_embd.
        r.supply("--ffn-hidden-size", inner or 4 * hidden, "n_inner")
    if heads:
        r.supply("--num-attention-heads", heads, "n_head")
    if positions:
        r.supply("--max-position-embeddings", positions, "n_positions")
    supply_vocab(r, "vocab_size")
    supply_tie(r, default=True)
    r.supply("--normalization", "LayerNorm", "model_type")
    eps = r.number("layer_norm_epsilon", 1e-5)
    if eps is not None:
        r.supply("--norm-epsilon", eps, "layer_norm_epsilon")
    r.supply("--position-embedding-type", "learned_absolute", "model_type")
    # Biases on every linear layer are Megatron's default (add_bias_linear True).
    act = r.text("activation_function", "gelu_new")
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        r.note(
            "hf-approximated", "activation_function",
            f"activation_function {act!r} is the tanh GeLU; Megatron's default GeLU is the tanh "
            f"form when bias-GeLU fusion is on (its default) and erf otherwise; same memory",
        )
    elif act not in (None, "gelu"):
        r.note(
            "hf-approximated", "activation_function",
            f"activation_function {act!r} is not available; Megatron's GeLU is used (same "
            "parameters)",
        )
    attn = r.fraction("attn_pdrop", 0.1, note_default=False)
    resid = r.fraction("resid_pdrop", 0.1, note_default=False)
    embd = r.fraction("embd_pdrop", 0.1, note_default=False)
    if attn is not None:
        r.supply("--attention-dropout", float(attn), "attn_pdrop")
    if resid is not None:
        r.supply("--hidden-dropout", float(resid), "resid_pdrop")
    if embd is not None and resid is not None and embd != resid:
        r.note(
            "hf-approximated", "embd_pdrop",
            f"embd_pdrop {embd} differs from resid_pdrop {resid}; Megatron applies "
            "--hidden-dropout to the embeddings too",
        )
    if r.boolean("scale_attn_by_inverse_layer_idx", False, note_default=False):
        r.note(
            "hf-not-mapped", "scale_attn_by_inverse_layer_idx",
            "attention scaled by 1/layer index is not mapped (no parameter or memory effect)",
        )
    if r.boolean("scale_attn_weights", True, note_default=False) is False:
        r.note(
            "hf-not-mapped", "scale_attn_weights",
            "unscaled attention scores are not mapped (no parameter or memory effect)",
        )
    r.ignore("n_ctx", "reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
             "summary_proj_to_labels", "summary_first_dropout")


def map_gpt_neox(r: ConfigReader) -> None:
    """GPT-NeoX / Pythia: rotary on part of each head, LayerNorm, GeLU, biases, parallel residual."""
    layers, hidden, ffn, heads = core_shape(r)
    supply_core_shape(r, layers, hidden, ffn, heads)
    max_positions = r.positive_int("max_position_embeddings")
    if max_positions:
        r.supply("--max-position-embeddings", max_positions, "max_position_embeddings")
    supply_vocab(r, "vocab_size")
    supply_tie(r, default=False)
    r.supply("--normalization", "LayerNorm", "model_type")
    eps = r.number("layer_norm_eps", 1e-5)
    if eps is not None:
        r.supply("--norm-epsilon", eps, "layer_norm_eps")
    act = r.text("hidden_act", "gelu")
    if act not in (None, "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
        r.note(
            "hf-approximated", "hidden_act",
            f"hidden_act {act!r}: Megatron's GeLU MLP is used (same parameters)",
        )
    if r.boolean("attention_bias", True, note_default=False) is False:
        r.supply("--disable-bias-linear", True, "attention_bias")
        r.note(
            "hf-approximated", "attention_bias",
            "attention_bias false: GPT-NeoX keeps MLP biases, Megatron's --disable-bias-linear "
            "removes them too",
        )
    supply_dropout(r, "attention_dropout", "--attention-dropout", 0.0)
    supply_dropout(r, "hidden_dropout", "--hidden-dropout", 0.0)
    r.supply("--position-embedding-type", "rope", "model_type")
    rotary_pct = r.fraction("rotary_pct", 0.25)
    if rotary_pct is not None:
        r.supply("--rotary-percent", float(rotary_pct), "rotary_pct")
    # GPTNeoXConfig names the RoPE base rotary_emb_base (rope_theta in newer transformers).
    supply_rope(r, 10000.0, "rotary_emb_base" if r.has("rotary_emb_base") else "rope_theta")
    if r.boolean("use_parallel_residual", True, note_default=False):
        r.note(
            "hf-approximated", "use_parallel_residual",
            "use_parallel_residual: GPT-NeoX adds attention and MLP outputs to the same input "
            "(x + attn(ln1(x)) + mlp(ln2(x))); Megatron has no parallel residual and runs them in "
            "sequence. Parameters are identical; activations are estimated for the sequential form",
        )
    r.ignore("classifier_dropout")
