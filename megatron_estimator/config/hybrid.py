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

from megatron_estimator.core.dataclass import dataclass
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from typing import Any, Iterator, Mapping

from megatron_estimator.core.problems import Problem

SYMBOLS: dict[str, str] = {
    "M": "Mamba", "G": "gated delta net", "*": "attention", "D": "DeepSeek sparse attention",
    "+": "multi-latent attention", "-": "MLP", "E": "MoE",
}
MODELLED_SYMBOLS = "M*+-E"
# What modelling the other symbols would need (their megatron-core modules).
UNMODELLED_NEEDS = {
    "G": "the gated delta net mixer (megatron/core/ssm/gated_delta_net.py)",
    "D": "DeepSeek sparse attention with its indexer (megatron/core/transformer/experimental_attention_variant/dsa.py)",
}
PIPE, MTP_SEPARATOR = "|", "/"
PATTERN_DESTS = ("hybrid_layer_pattern", "hybrid_override_pattern")


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


def hybrid_config(ns: Mapping[str, Any]) -> HybridConfig | None:
    """The typed hybrid configuration of a validated namespace (None without a pattern)."""
    pattern = ns.get("hybrid_pattern_unified")
    if not isinstance(pattern, str):
        return None
    parsed, _ = parse_pattern(pattern)
    segments = parsed.segments
    d_inner, heads, head_dim, state, groups = mamba_shape(ns)
    return HybridConfig(
        layer_kinds=tuple(parsed.layers),
        segments=tuple(len(s) for s in segments) if len(segments) > 1 else (),
        mtp_kinds=tuple(parsed.mtp or ""), mtp_depths=parsed.mtp_depths if parsed.mtp else 0,
        d_inner=d_inner, num_heads=heads, head_dim=head_dim, state_dim=state, num_groups=groups)
