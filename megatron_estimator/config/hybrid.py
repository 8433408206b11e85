"""Hybrid (Mamba) layer patterns: parsed and validated once, typed into ``HybridConfig``.

Megatron-LM main (d98e8a64) reads one unified pattern, ``--hybrid-layer-pattern`` (the
deprecated ``--hybrid-override-pattern`` is its alias), in
megatron/core/models/hybrid/hybrid_layer_allocation.py (``Symbols``,
``parse_hybrid_pattern``, ``select_pipeline_segment``) and megatron/training/arguments.py
``validate_args``:

- layer symbols ``M`` Mamba, ``G`` gated delta net, ``*`` attention, ``D`` DeepSeek sparse
  attention, ``+`` multi-latent attention, ``-`` MLP, ``E`` MoE; attention and MLA / DSA never
  in one pattern;
- ``|`` splits the main pattern into pipeline segments (segment ``vp * pp + rank`` runs on
  pipeline rank ``rank``, virtual stage ``vp``; more segments than ranks derive the virtual
  pipeline size); without ``|`` and pp > 1 the layers split evenly (or by
  --decoder-first/last-pipeline-num-layers);
- ``/`` starts the MTP patterns, one per prediction depth, all identical; the legacy
  ``--mtp-hybrid-override-pattern`` with --mtp-num-layers N is converted to N of them;
- --num-layers is the main pattern's layer count (it overrides a given --num-layers) and
  --mtp-num-layers the MTP depth count.

Release 0.16.1 differs: no ``|`` or ``/`` syntax (MTP through --mtp-hybrid-override-pattern),
the ratios --hybrid-attention-ratio / --hybrid-mlp-ratio instead; main's behaviour is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from megatron_estimator.core.problems import Problem

SYMBOLS: dict[str, str] = {
    "M": "Mamba", "G": "gated delta net", "*": "attention", "D": "DeepSeek sparse attention",
    "+": "multi-latent attention", "-": "MLP", "E": "MoE",
}
MODELLED_SYMBOLS = "MG*D+-E"
# What modelling the other symbols would need (their megatron-core modules); every symbol of
# Megatron-LM main d98e8a64's pattern syntax is modelled now.
UNMODELLED_NEEDS: dict[str, str] = {}
PIPE, MTP_SEPARATOR = "|", "/"
PATTERN_DESTS = ("hybrid_layer_pattern", "hybrid_override_pattern")


@dataclass(frozen=True)
class GdnShape:
    """A gated delta net mixer's shape ('G' layers; megatron/core/ssm/gated_delta_net/common.py
    ``_GDNBase.__init__``, TransformerConfig's linear_* fields)."""
    variant: str                      # "gdn" (GatedDeltaNet) or "gdn2" (GatedDeltaNet2, gdn2.py)
    key_heads: int                    # --linear-num-key-heads
    value_heads: int                  # --linear-num-value-heads
    key_head_dim: int                 # --linear-key-head-dim
    value_head_dim: int               # --linear-value-head-dim
    conv_kernel: int                  # --linear-conv-kernel-dim


@dataclass(frozen=True)
class DsaShape:
    """DeepSeek sparse attention's indexer and kernel choice ('D' layers;
    megatron/core/transformer/experimental_attention_variant/dsa.py ``DSAIndexer``, ``DSAttention``)."""
    index_heads: int                  # --dsa-indexer-n-heads
    index_head_dim: int               # --dsa-indexer-head-dim
    topk: int                         # --dsa-indexer-topk
    topk_freq: int                    # --dsa-indexer-topk-freq (> 1: layers share a computing layer's top-k)
    skip_topk_offset: int             # --dsa-indexer-skip-topk-offset
    kernel_backend: str               # --dsa-kernel-backend: none (PyTorch) | tilelang | cudnn
    qk_layernorm: bool                # --qk-layernorm: DSA's standalone q / kv norms (mla_qk_norm_config.py)

    def computes_topk(self, layer_number: int) -> bool:
        """Whether the layer (1-based, as HybridStack numbers it) builds and runs an indexer
        (dsa.py ``is_dsa_skip_topk_layer``); the others reuse a computing layer's top-k."""
        return dsa_source_layer(layer_number, self.topk_freq, self.skip_topk_offset) == layer_number


@dataclass(frozen=True)
class HybridConfig:
    """A hybrid model's layers and Mamba mixer shape (megatron/core/ssm/mamba_mixer.py)."""
    layer_kinds: tuple[str, ...]      # one symbol per global decoder layer
    segments: tuple[int, ...]         # layers per '|' segment in segment order; () without '|'
    mtp_kinds: tuple[str, ...]        # the symbols of one MTP depth
    mtp_depths: int
    d_inner: int                      # mamba heads x head dim (2 h without --mamba-num-heads)
    num_heads: int
    head_dim: int
    state_dim: int
    num_groups: int
    conv_kernel: int = 4              # MambaMixer d_conv
    gdn: GdnShape | None = None       # with 'G' layers
    dsa: DsaShape | None = None       # with 'D' layers

    def kinds_text(self, layers: tuple[int, ...]) -> str:
        return "".join(self.layer_kinds[i] for i in layers)


def pattern_location_dest(ns: Mapping[str, Any]) -> str:
    return next((d for d in PATTERN_DESTS if ns.get(d) is not None), "hybrid_layer_pattern")


def unified_pattern(ns: Mapping[str, Any]) -> str | None:
    """The pattern validate_args ends with: the alias taken, the legacy MTP pattern appended."""
    pattern = ns.get("hybrid_layer_pattern")
    if pattern is None:
        pattern = ns.get("hybrid_override_pattern")
    legacy, depths = ns.get("mtp_hybrid_override_pattern"), ns.get("mtp_num_layers")
    if (isinstance(legacy, str) and isinstance(depths, int) and depths > 0
            and (pattern is None or MTP_SEPARATOR not in pattern)):
        pattern = (pattern or "") + MTP_SEPARATOR + MTP_SEPARATOR.join([legacy] * depths)
    return pattern if isinstance(pattern, str) else None


@dataclass(frozen=True)
class ParsedPattern:
    main: str                         # with '|'
    mtp: str | None
    mtp_depths: int

    @property
    def layers(self) -> str:
        return self.main.replace(PIPE, "")

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.main.split(PIPE)) if self.main else ("",)


def parse_pattern(pattern: str) -> tuple[ParsedPattern, list[str]]:
    """The pattern's parts and every reason Megatron rejects it (parse_hybrid_pattern)."""
    errors: list[str] = []
    parts = pattern.split(MTP_SEPARATOR)
    main, mtp_parts = parts[0], [p for p in parts[1:]]
    mtp = None
    depths = 0
    if mtp_parts and not all(p == "" for p in mtp_parts):
        mtp = mtp_parts[0]
        depths = len(mtp_parts)
        for i, part in enumerate(mtp_parts[1:], start=2):
            if part != mtp:
                errors.append(f"every MTP pattern after '/' must be the same: pattern 1 is {mtp!r}, pattern {i} is {part!r}")
    for name, text, pipes in (("main", main, True), ("MTP", mtp or "", False)):
        bad = sorted({c for c in text if c not in SYMBOLS and not (pipes and c == PIPE)})
        if bad:
            errors.append(f"{', '.join(repr(c) for c in bad)} {'is' if len(bad) == 1 else 'are'} not "
                          f"{'a valid layer symbol' if len(bad) == 1 else 'valid layer symbols'} in the {name} pattern; "
                          f"valid: {' '.join(SYMBOLS)}" + (" and '|'" if pipes else ""))
        if "*" in text and ("D" in text or "+" in text):
            errors.append(f"the {name} pattern mixes attention ('*') with MLA / DSA ('+' / 'D'), which Megatron does not support")
    return ParsedPattern(main, mtp, depths), errors


def normalize_namespace(ns: dict) -> None:
    """What validate_args derives from the pattern before anything reads --num-layers: the
    unified pattern, the layer count, the MTP depth count, and MLA for '+' / 'D' layers."""
    pattern = unified_pattern(ns)
    if pattern is None:
        return
    parsed, errors = parse_pattern(pattern)
    if errors:
        return
    ns["hybrid_pattern_unified"] = pattern
    ns["num_layers"] = len(parsed.layers)
    if parsed.mtp is not None and parsed.mtp_depths:
        ns["mtp_num_layers"] = parsed.mtp_depths
    if "+" in pattern or "D" in pattern:
        ns["multi_latent_attention"] = True


def segment_count(ns: Mapping[str, Any]) -> int:
    """Pipeline segments of the main pattern (1 without '|')."""
    pattern = ns.get("hybrid_pattern_unified")
    if not isinstance(pattern, str):
        return 1
    return pattern.split(MTP_SEPARATOR)[0].count(PIPE) + 1


def derived_vpp(ns: Mapping[str, Any], pp: int) -> tuple[bool, int | None]:
    """(whether the pattern decides the virtual pipeline size, that size): segments / pp when
    there are more segments than ranks (arguments.py)."""
    if not isinstance(ns.get("hybrid_pattern_unified"), str):
        return False, None
    segments = segment_count(ns)
    if segments > pp and segments % pp == 0:
        return True, segments // pp
    return True, None


def _ints(ns, *dests) -> bool:
    return all(isinstance(ns.get(d), int) and not isinstance(ns.get(d), bool) and ns.get(d) > 0 for d in dests)


def mamba_shape(ns: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """(d_inner, heads, head dim, state dim, groups) as MambaMixer.__init__ derives them."""
    head_dim, state, groups = ns["mamba_head_dim"], ns["mamba_state_dim"], ns["mamba_num_groups"]
    heads = ns.get("mamba_num_heads")
    if heads is not None:
        d_inner = heads * head_dim
    else:
        d_inner = 2 * ns["hidden_size"]          # expand = 2
        heads = d_inner // head_dim
    return d_inner, heads, head_dim, state, groups


def pattern_problems(ns: Mapping[str, Any], location) -> Iterator[Problem]:
    """Megatron's checks of the pattern and of what it builds (arguments.py validate_args,
    hybrid_layer_allocation.py, mamba_mixer.py), plus the symbols the estimator does not model."""
    given = [d for d in PATTERN_DESTS if ns.get(d) is not None]
    if len(given) == 2:
        yield Problem("conflicting-hybrid-patterns", location("hybrid_override_pattern"),
                      "--hybrid-override-pattern (deprecated) and --hybrid-layer-pattern cannot both be set")
    pattern = unified_pattern(ns)
    if pattern is None:
        return
    where = location(pattern_location_dest(ns))
    parsed, errors = parse_pattern(pattern)
    for error in errors:
        yield Problem("invalid-hybrid-pattern", where, error)
    if errors:
        return
    used = set(parsed.layers) | set(parsed.mtp or "")
    for symbol in sorted(used - set(MODELLED_SYMBOLS)):
        yield Problem("unmodelled-layer", where,
                      f"{SYMBOLS[symbol]} layers ({symbol!r}) are not modelled: estimating them needs "
                      f"{UNMODELLED_NEEDS[symbol]}; the estimator models {' '.join(MODELLED_SYMBOLS)} layers")
    for dest in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                 "pipeline_model_parallel_layout"):
        if ns.get(dest) is not None:
            yield Problem("hybrid-pattern-conflict", location(dest),
                          f"--{dest.replace('_', '-')} cannot be used with a hybrid layer pattern: its '|' "
                          "segments define the pipeline stages")
    for dest in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if ns.get(dest):
            yield Problem("hybrid-pattern-conflict", location(dest),
                          f"--{dest.replace('_', '-')} cannot be used with a hybrid layer pattern")
    segments = len(parsed.segments)
    if segments > 1:
        for dest in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            if ns.get(dest) is not None:
                yield Problem("hybrid-pattern-conflict", location(dest),
                              f"--{dest.replace('_', '-')} cannot be used when the hybrid layer pattern has '|' "
                              "separators: they define the pipeline layout")
        pp = ns.get("pipeline_model_parallel_size")
        if isinstance(pp, int) and pp > 0 and segments % pp:
            yield Problem("hybrid-segments-vs-pp", where,
                          f"the pattern's {segments} '|'-separated segments do not divide over pipeline size {pp}")
    if "E" in used and not ns.get("num_experts"):
        yield Problem("hybrid-moe-without-experts", where,
                      "the pattern has MoE layers ('E') but --num-experts is not set")
    if "M" in used and _ints(ns, "mamba_head_dim", "mamba_state_dim", "mamba_num_groups", "hidden_size",
                             "tensor_model_parallel_size"):
        t = ns["tensor_model_parallel_size"]
        if ns.get("mamba_num_heads") is None and (2 * ns["hidden_size"]) % ns["mamba_head_dim"]:
            yield Problem("mamba-shape", location("mamba_head_dim"),
                          f"d_inner = 2 x --hidden-size {ns['hidden_size']} = {2 * ns['hidden_size']} is not divisible "
                          f"by --mamba-head-dim {ns['mamba_head_dim']} (megatron/core/ssm/mamba_mixer.py)")
            return
        _, heads, _, _, groups = mamba_shape(ns)
        if heads % t:
            yield Problem("mamba-shape", location("mamba_num_heads" if ns.get("mamba_num_heads") else "mamba_head_dim"),
                          f"{heads} Mamba heads do not divide over tensor parallel size {t}")
        if groups % t:
            yield Problem("mamba-shape", location("mamba_num_groups"),
                          f"--mamba-num-groups {groups} does not divide over tensor parallel size {t}")
        if heads % groups:
            yield Problem("mamba-shape", location("mamba_num_groups"),
                          f"{heads} Mamba heads are not divisible by --mamba-num-groups {groups}")
        cp = ns.get("context_parallel_size")
        if isinstance(cp, int) and cp > 1 and not heads % t and not groups % t:
            yield from _mamba_context_parallel_problems(heads // t, groups // t, t, cp, location)
    if "G" in used:
        yield from gdn_problems(ns, location)
    if "D" in used:
        yield from dsa_problems(ns, location)
        yield from dsa_sharing_problems(ns, parsed, where)


def gdn_variant(ns: Mapping[str, Any]) -> str:
    """The gated delta net a 'G' layer builds: GatedDeltaNet2 with --experimental-attention-variant
    gdn2, else GatedDeltaNet (hybrid_block.py HybridStack.__init__)."""
    return "gdn2" if ns.get("experimental_attention_variant") == "gdn2" else "gdn"


def gdn_in_proj_width(variant: str, qk: int, v: int, value_heads: int) -> int:
    """The fused in_proj's output features (q, k, v, z, then the variant's gates): beta and
    alpha per value head (gdn.py), or f, b per key channel and w per value channel (gdn2.py)."""
    return 2 * qk + 2 * v + (2 * value_heads if variant == "gdn" else 2 * qk + v)


def gdn_problems(ns: Mapping[str, Any], location) -> Iterator[Problem]:
    """What megatron-core refuses for 'G' layers: transformer_config.py __post_init__ (the
    linear_* checks, which the gated delta net modules rely on whether or not the variant is
    named) and gated_delta_net/common.py _GDNBase.__init__ (the fp8 alignment)."""
    variant = ns.get("experimental_attention_variant")
    if variant in ("gdn", "gated_delta_net") and ns.get("linear_attention_freq") is None:
        yield Problem("gdn-needs-linear-attention-freq", location("experimental_attention_variant"),
                      f"--experimental-attention-variant {variant} needs --linear-attention-freq "
                      "(megatron/core/transformer/transformer_config.py __post_init__), even though a hybrid "
                      "pattern's 'G' layers do not read it; gdn2 does not")
    dests = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim", "linear_conv_kernel_dim")
    for dest in dests:
        if ns.get(dest) is None:
            yield Problem("gdn-shape", location(dest),
                          f"'G' layers need --{dest.replace('_', '-')} (megatron/core/transformer/transformer_config.py)")
    if not _ints(ns, *dests, "tensor_model_parallel_size"):
        return
    hk, hv = ns["linear_num_key_heads"], ns["linear_num_value_heads"]
    t, cp = ns["tensor_model_parallel_size"], ns.get("context_parallel_size") or 1
    if hv % hk:
        yield Problem("gdn-shape", location("linear_num_value_heads"),
                      f"--linear-num-value-heads {hv} is not a multiple of --linear-num-key-heads {hk} "
                      "(transformer_config.py: q and k are repeated to every value head)")
    for dest, heads in (("linear_num_key_heads", hk), ("linear_num_value_heads", hv)):
        if heads % (t * cp):
            yield Problem("gdn-shape", location(dest),
                          f"--{dest.replace('_', '-')} {heads} does not divide over tensor parallel x context "
                          f"parallel = {t} x {cp} (transformer_config.py __post_init__)")
    if ns.get("fp8"):
        align = 32 if ns.get("fp8_recipe") == "mxfp8" else 16        # fp8_utils.py get_fp8_align_size
        width = gdn_in_proj_width(gdn_variant(ns), hk * ns["linear_key_head_dim"],
                                  hv * ns["linear_value_head_dim"], hv)
        if width % align:
            yield Problem("gdn-shape", location("fp8"),
                          f"under fp8 the gated delta net's in_proj output width ({width}) must be a multiple of "
                          f"{align} (megatron/core/ssm/gated_delta_net/common.py)")


def dsa_source_layer(layer_number: int, topk_freq: int, skip_topk_offset: int) -> int:
    """The layer whose top-k a 'D' layer uses (dsa.py ``source_dsa_compute_layer``): itself
    when it computes one."""
    offset = max(skip_topk_offset, 1)
    if topk_freq <= 1 or layer_number <= offset:
        return layer_number
    return layer_number - (layer_number - offset) % topk_freq


def dsa_sharing_problems(ns: Mapping[str, Any], parsed: "ParsedPattern", where: str) -> Iterator[Problem]:
    """With --dsa-indexer-topk-freq > 1 a 'D' layer that does not compute its top-k reads its
    source layer's from a per-forward holder: the source must be a 'D' layer of the same
    pipeline segment (dsa.py DSAttention.forward raises otherwise: "Cross-PP top-k sharing is
    not supported").  Checked per '|' segment and for the MTP pattern (its nested stack numbers
    its layers from 1); without '|' the even pipeline split is not checked here."""
    freq, offset = ns.get("dsa_indexer_topk_freq") or 1, ns.get("dsa_indexer_skip_topk_offset") or 0
    if not isinstance(freq, int) or not isinstance(offset, int) or freq <= 1 or offset < 0:
        return
    groups, start = [], 1
    for segment in parsed.segments:
        groups.append(("main pattern", start, segment))
        start += len(segment)
    if parsed.mtp:
        groups.append(("MTP pattern", 1, parsed.mtp))
    for name, first, text in groups:
        for i, kind in enumerate(text):
            number = first + i
            source = dsa_source_layer(number, freq, offset)
            if kind != "D" or source == number:
                continue
            index = source - first
            if index < 0 or text[index] != "D":
                found = ("in an earlier pipeline segment" if index < 0
                         else f"{'an' if SYMBOLS[text[index]] in ('attention', 'MLP', 'MoE') else 'a'} {SYMBOLS[text[index]]} layer")
                yield Problem("dsa-topk-sharing", where,
                              f"'D' layer {number} of the {name} reuses the top-k of layer {source} "
                              f"(--dsa-indexer-topk-freq {freq}, --dsa-indexer-skip-topk-offset {offset}), which is "
                              f"{found}: Megatron needs a DSA layer of the same pipeline segment there "
                              "(experimental_attention_variant/dsa.py DSAttention.forward)")


DSA_SHAPE_DESTS = ("dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk")


def dsa_problems(ns: Mapping[str, Any], location) -> Iterator[Problem]:
    """What megatron-core refuses for 'D' layers (the hybrid spec's dsa_layer: an
    AbsorbedMLASelfAttention whose core attention is DSAttention with a DSAIndexer):
    experimental_attention_variant/absorbed_mla.py and dsa.py, mla_qk_norm_config.py, and
    transformer_config.py __post_init__ for --experimental-attention-variant dsa."""
    for dest in DSA_SHAPE_DESTS:
        if ns.get(dest) is None:
            yield Problem("dsa-shape", location(dest),
                          f"'D' layers need --{dest.replace('_', '-')} (the DSA indexer's shape, "
                          "experimental_attention_variant/dsa.py DSAIndexer)")
    pe = ns.get("qk_pos_emb_head_dim")
    head_dim = ns.get("dsa_indexer_head_dim")
    if isinstance(pe, int) and isinstance(head_dim, int) and head_dim < pe:
        yield Problem("dsa-shape", location("dsa_indexer_head_dim"),
                      f"--dsa-indexer-head-dim {head_dim} is smaller than --qk-pos-emb-head-dim {pe}: the indexer "
                      "applies RoPE to the first qk-pos-emb-head-dim channels of each head (dsa.py)")
    freq, offset = ns.get("dsa_indexer_topk_freq"), ns.get("dsa_indexer_skip_topk_offset")
    if isinstance(freq, int) and freq < 1:
        yield Problem("dsa-shape", location("dsa_indexer_topk_freq"),
                      f"--dsa-indexer-topk-freq must be positive, got {freq} (dsa.py is_dsa_skip_topk_layer)")
    if isinstance(offset, int) and offset < 0:
        yield Problem("dsa-shape", location("dsa_indexer_skip_topk_offset"),
                      f"--dsa-indexer-skip-topk-offset must be non-negative, got {offset} (dsa.py)")
    if ns.get("add_bias_linear"):
        yield Problem("dsa-conflict", location("add_bias_linear"),
                      "'D' layers are AbsorbedMLASelfAttention, which does not support linear biases: add "
                      "--disable-bias-linear (experimental_attention_variant/absorbed_mla.py)")
    t = ns.get("tensor_model_parallel_size")
    if isinstance(t, int) and t > 1 and not ns.get("sequence_parallel"):
        yield Problem("dsa-conflict", location("sequence_parallel"),
                      f"'D' layers (AbsorbedMLASelfAttention) need --sequence-parallel with tensor parallel size {t} "
                      "(experimental_attention_variant/absorbed_mla.py)")
    cp = ns.get("context_parallel_size")
    if isinstance(cp, int) and cp > 1:
        types = ns.get("cp_comm_type") or ["p2p"]
        types = types if isinstance(types, list) else [types]
        if not all(isinstance(c, str) and c.replace("_", "").lower() == "allgather" for c in types):
            yield Problem("dsa-conflict", location("cp_comm_type"),
                          f"'D' layers under context parallel size {cp} need --cp-comm-type allgather "
                          "(experimental_attention_variant/dsa.py DSAttention.forward)")
    if (ns.get("experimental_attention_variant") == "dsa" and ns.get("qk_layernorm")
            and ns.get("q_lora_rank") is None):
        yield Problem("dsa-conflict", location("qk_layernorm"),
                      "--qk-layernorm with DSA needs --q-lora-rank: DSA cannot fuse the q norm into "
                      "linear_q_proj (megatron/core/transformer/mla_qk_norm_config.py)")

def _mamba_context_parallel_problems(heads: int, groups: int, t: int, cp: int, location) -> Iterator[Problem]:
    """megatron/core/ssm/mamba_context_parallel.py ``MambaContextParallel.__init__`` (asserted
    when the model is built): each CP rank takes a share of the TP rank's heads, and of its
    groups (or one group's heads, its state repeated)."""
    where = location("context_parallel_size")
    if heads % cp:
        yield Problem("mamba-context-parallel", where,
                      f"context parallel size {cp} does not divide the {heads} Mamba heads of a tensor parallel "
                      f"rank (heads / tp {t}); megatron/core/ssm/mamba_context_parallel.py needs heads divisible "
                      "by tp x cp")
    if groups < cp and cp % groups:
        yield Problem("mamba-context-parallel", where,
                      f"context parallel size {cp} is not a multiple of the {groups} Mamba groups of a tensor "
                      "parallel rank (groups / tp); megatron/core/ssm/mamba_context_parallel.py needs cp to divide "
                      "them or be a multiple of them")
    elif groups >= cp and groups % cp:
        yield Problem("mamba-context-parallel", where,
                      f"context parallel size {cp} does not divide the {groups} Mamba groups of a tensor parallel "
                      "rank (groups / tp); megatron/core/ssm/mamba_context_parallel.py needs cp to divide them or "
                      "be a multiple of them")


def hybrid_config(ns: Mapping[str, Any]) -> HybridConfig | None:
    """The typed hybrid configuration of a validated namespace (None without a pattern)."""
    pattern = ns.get("hybrid_pattern_unified")
    if not isinstance(pattern, str):
        return None
    parsed, _ = parse_pattern(pattern)
    segments = parsed.segments
    d_inner, heads, head_dim, state, groups = mamba_shape(ns)
    used = set(parsed.layers) | set(parsed.mtp or "")
    gdn = dsa = None
    if "G" in used:
        gdn = GdnShape(variant=gdn_variant(ns), key_heads=ns["linear_num_key_heads"],
                       value_heads=ns["linear_num_value_heads"], key_head_dim=ns["linear_key_head_dim"],
                       value_head_dim=ns["linear_value_head_dim"], conv_kernel=ns["linear_conv_kernel_dim"])
    if "D" in used:
        dsa = DsaShape(index_heads=ns["dsa_indexer_n_heads"], index_head_dim=ns["dsa_indexer_head_dim"],
                       topk=ns["dsa_indexer_topk"], topk_freq=ns.get("dsa_indexer_topk_freq") or 1,
                       skip_topk_offset=ns.get("dsa_indexer_skip_topk_offset") or 0,
                       kernel_backend=ns.get("dsa_kernel_backend") or "none",
                       qk_layernorm=bool(ns.get("qk_layernorm")))
    return HybridConfig(
        layer_kinds=tuple(parsed.layers),
        segments=tuple(len(s) for s in segments) if len(segments) > 1 else (),
        mtp_kinds=tuple(parsed.mtp or ""), mtp_depths=parsed.mtp_depths if parsed.mtp else 0,
        d_inner=d_inner, num_heads=heads, head_dim=head_dim, state_dim=state, num_groups=groups,
        gdn=gdn, dsa=dsa)
