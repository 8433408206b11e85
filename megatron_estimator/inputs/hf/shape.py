"""Mapping steps every architecture shares: the core shape (layers, hidden, FFN, heads), query
groups, vocabulary, tied embeddings, the gated SiLU MLP and dropout.
"""

from __future__ import annotations

from megatron_estimator.inputs.hf.reader import ConfigReader


def core_shape(r: ConfigReader) -> tuple:
    """Layers, hidden, ffn and heads as the config gives them (each read once)."""
    layers = r.positive_int("num_hidden_layers")
    hidden = r.positive_int("hidden_size")
    ffn = r.positive_int("intermediate_size")
    heads = r.positive_int("num_attention_heads")
    return layers, hidden, ffn, heads


def supply_core_shape(r: ConfigReader, layers, hidden, ffn, heads) -> None:
    if layers:
        r.supply("--num-layers", layers, "num_hidden_layers")
    if hidden:
        r.supply("--hidden-size", hidden, "hidden_size")
    if ffn:
        r.supply("--ffn-hidden-size", ffn, "intermediate_size")
    if heads:
        r.supply("--num-attention-heads", heads, "num_attention_heads")


def supply_query_groups(r: ConfigReader, heads: int | None, kv_heads: int | None) -> None:
    if heads and kv_heads and kv_heads != heads:
        r.supply("--group-query-attention", True, "num_key_value_heads")
        r.supply("--num-query-groups", kv_heads, "num_key_value_heads")


def supply_vocab(r: ConfigReader, key: str) -> None:
    vocab = r.positive_int(key)
    if vocab:
        r.supply("--vocab-size", vocab, key)
        if vocab % 128:
            padded = -(-vocab // 128) * 128
            r.note(
                "hf-vocab-padded", key,
                f"Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by "
                f"(128) x TP: {vocab} becomes {padded} at TP=1; pass "
                f"--make-vocab-size-divisible-by 1 to keep {vocab} (HuggingFace parameter counts use {vocab})",
            )


def supply_tie(r: ConfigReader, default: bool) -> None:
    tied = r.boolean("tie_word_embeddings", default, note_default=False)
    if tied is False:
        r.supply("--untie-embeddings-and-output-weights", True, "tie_word_embeddings")


def supply_gated_silu(r: ConfigReader) -> None:
    act = r.text("hidden_act", "silu")
    if act is None:
        return
    r.supply("--swiglu", True, "hidden_act")
    if act not in ("silu", "swish"):
        r.note(
            "hf-approximated", "hidden_act",
            f"hidden_act {act!r}: Megatron's gated MLP is built with --swiglu (SiLU); parameters "
            f"and activation shapes are the same, the activation function is not",
        )


def supply_dropout(r: ConfigReader, key: str, flag: str, default: float) -> None:
    value = r.fraction(key, default, note_default=False)
    if value is not None:
        r.supply(flag, float(value), key)


def supply_positions_vocab_rmsnorm(r: ConfigReader, eps_key: str, eps_default: float) -> None:
    """What the RMSNorm decoders' configs share after their shape: --max-position-embeddings,
    the vocabulary, untied embeddings unless the file ties them, RMSNorm and its epsilon
    (``eps_key``, ``eps_default`` when absent)."""
    max_positions = r.positive_int("max_position_embeddings")
    if max_positions:
        r.supply("--max-position-embeddings", max_positions, "max_position_embeddings")
    supply_vocab(r, "vocab_size")
    supply_tie(r, default=False)
    r.supply("--normalization", "RMSNorm", "model_type")
    eps = r.number(eps_key, eps_default)
    if eps is not None:
        r.supply("--norm-epsilon", eps, eps_key)


def supply_hybrid_pattern(r: ConfigReader, pattern: str, mtp: tuple[str, int] | None, key: str,
                          mtp_key: str) -> None:
    """A hybrid layer pattern (and ``mtp``: one MTP depth's pattern, the depth count) in the
    chosen release's spelling (megatron/training/arguments.py): main reads one
    --hybrid-layer-pattern with '/' MTP parts; releases before 0.17.0 have only
    --hybrid-override-pattern, and MTP patterns before main go in --mtp-hybrid-override-pattern
    with --mtp-num-layers.  Megatron derives --num-layers (and the MTP depth) from the pattern.
    ``key`` / ``mtp_key`` locate the pattern and the MTP layers in the file."""
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table(r.release)
    flag = "--hybrid-layer-pattern" if "--hybrid-layer-pattern" in table else "--hybrid-override-pattern"
    if mtp is None or r.release == "main":
        r.supply(flag, pattern if mtp is None else "/".join([pattern] + [mtp[0]] * mtp[1]), key)
        return
    r.supply(flag, pattern, key)
    if "--mtp-hybrid-override-pattern" not in table:
        r.problem("hf-unsupported-feature", mtp_key,
                  f"MTP layers in a hybrid model need Megatron 0.17.0 or later (--mtp-hybrid-override-pattern); "
                  f"the chosen release is {r.release}")
        return
    r.supply("--mtp-hybrid-override-pattern", mtp[0], mtp_key)
    r.supply("--mtp-num-layers", mtp[1], "num_nextn_predict_layers")


def supply_local_experts(r: ConfigReader) -> None:
    """``num_local_experts`` and ``num_experts_per_tok`` (Mixtral's and gpt-oss's names) as
    ``--num-experts`` and ``--moe-router-topk``."""
    experts = r.positive_int("num_local_experts")
    topk = r.positive_int("num_experts_per_tok")
    if experts:
        r.supply("--num-experts", experts, "num_local_experts")
    if topk:
        r.supply("--moe-router-topk", topk, "num_experts_per_tok")
