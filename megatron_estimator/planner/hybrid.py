"""The pipeline splits of a hybrid (Mamba) model, as Megatron-LM lays its layer pattern out.

Megatron-LM main (d98e8a64) decides a hybrid model's pipeline split from its
``--hybrid-layer-pattern`` (megatron/training/arguments.py validate_args,
megatron/core/models/hybrid/hybrid_layer_allocation.py ``select_pipeline_segment``):

- a pattern with ``|`` separators fixes the split: its S segments run segment ``vp * pp + rank``
  on pipeline rank ``rank``, virtual stage ``vp``; pp must divide S, and S > pp derives
  S / pp virtual stages.  The planner tries every pp that divides S, the split as given
  (--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,
  --pipeline-model-parallel-layout and the embedding / loss accounting are refused with a
  pattern; --decoder-first/last-pipeline-num-layers with '|');
- a pattern without ``|`` on pp > 1 ranks (Megatron's backward-compatible path, deprecated in
  favour of '|') splits the layers evenly, or with --decoder-first/last-pipeline-num-layers
  (the middle ranks even), and allows no virtual stages: the planner tries the even split or
  ``planner.space``'s balanced first/last split as given, and the same layers re-split into
  pp x v balanced '|' segments (``--hybrid-layer-pattern`` rewritten, the MTP part kept) for
  v = 2 .. ``max_virtual_stages`` virtual stages, and for v = 1 where neither split exists;
  never a layout string.  The pattern's layers never change: only where the '|' fall.

Which tp / cp / ep / etp a hybrid accepts is the rules' (config/hybrid.py ``pattern_problems``:
Mamba heads and groups over tp, and over tp x cp under context parallelism), as for every layout.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from megatron_estimator.config.hybrid import parse_pattern
from megatron_estimator.planner.space import _split
from megatron_estimator.results.plan import PipelineChoice

SplitChoices = Callable[[int, int], list[PipelineChoice]]


def pattern_segments(namespace: Mapping[str, Any]) -> tuple[int, ...]:
    """Layers per '|' segment of the unified pattern (one entry without '|')."""
    parsed, _ = parse_pattern(namespace["hybrid_pattern_unified"])
    return tuple(len(segment) for segment in parsed.segments)


def hybrid_pipeline_choices(namespace: Mapping[str, Any], release: str) -> SplitChoices:
    """(pp, max virtual stages) -> the splits the planner tries for this hybrid pattern (none
    without a pattern: ``missing-hybrid-pattern`` is the model's problem then)."""
    if not namespace.get("hybrid_pattern_unified"):
        return lambda pp, max_virtual_stages: []
    segments = pattern_segments(namespace)
    num_layers = sum(segments)
    mtp = namespace.get("mtp_num_layers") or 0

    def choices(pp: int, max_virtual_stages: int) -> list[PipelineChoice]:
        if len(segments) > 1:
            if len(segments) % pp:
                return []
            vpp = len(segments) // pp if len(segments) > pp else None
            label = (f"the pattern's {len(segments)} '|' segments"
                     + (f", {vpp} virtual stages" if vpp else ""))
            return [PipelineChoice(pp, vpp, (), label)]
        if pp == 1:
            return [PipelineChoice(1, None, (), "no pipeline")]
        found = []
        choice = _split(num_layers, mtp, pp, 1)
        if choice is not None and not any(d == "pipeline_model_parallel_layout" for d, _ in choice.settings):
            found.append(choice)
        for v in range(1 if not found else 2, max_virtual_stages + 1):
            if pp * v > num_layers:
                break
            if resplit is not None:
                found.append(resplit(pp, v))
        return found

    resplit = _resplitter(namespace, release)
    return choices


def _resplitter(namespace: Mapping[str, Any], release: str) -> Callable[[int, int], PipelineChoice] | None:
    """(pp, v) -> the pattern re-split into pp x v balanced '|' segments: how Megatron interleaves
    a hybrid (v virtual stages), or splits one unevenly.  None where the pattern cannot be
    rewritten as one --hybrid-layer-pattern: the legacy --mtp-hybrid-override-pattern, or a
    release whose flags have no --hybrid-layer-pattern (0.16.1 and before: --hybrid-override-pattern
    only, without '|' segments)."""
    from megatron_estimator.megatron.flags import flag_table

    if namespace.get("mtp_hybrid_override_pattern") is not None or flag_table(release).by_dest("hybrid_layer_pattern") is None:
        return None
    parsed, _ = parse_pattern(namespace["hybrid_pattern_unified"])
    layers = parsed.layers
    mtp = "".join("/" + parsed.mtp for _ in range(parsed.mtp_depths)) if parsed.mtp is not None else ""
    # The deprecated alias is replaced by the pattern it names, re-split.
    alias = (("hybrid_override_pattern", None),) if namespace.get("hybrid_override_pattern") is not None else ()

    def resplit(pp: int, v: int) -> PipelineChoice:
        n = pp * v
        base, extra = divmod(len(layers), n)
        counts = [base] * n
        for index in (list(range(1, n - 1)) + [n - 1, 0])[:extra]:   # the extra layers mid-model first
            counts[index] += 1
        segments, start = [], 0
        for c in counts:
            segments.append(layers[start:start + c])
            start += c
        text = "|".join(segments) + mtp
        sizes = f"{min(counts)}" + (f"-{max(counts)}" if max(counts) != min(counts) else "")
        label = f"'|' segments of {sizes} layers" + (f", {v} virtual stages" if v > 1 else "")
        return PipelineChoice(pp, v if v > 1 else None, (("hybrid_layer_pattern", text),) + alias, label)

    return resplit


def pipe_free_note(namespace: Mapping[str, Any], stages) -> str | None:
    """For a plan whose best layout splits a pattern without '|' over pp > 1 ranks (``stages``:
    its ``model.layout.StageLayout`` records): Megatron's deprecated path, and the same split
    written with '|' (arguments.py warns and asks for the separators)."""
    pattern = namespace.get("hybrid_pattern_unified")
    if not pattern or len(stages) < 2 or len(pattern_segments(namespace)) > 1:
        return None
    parsed, _ = parse_pattern(pattern)
    layers = parsed.layers
    text = "|".join("".join(layers[i] for i in stage.layers) for stage in stages)
    if parsed.mtp is not None:
        text += "".join("/" + parsed.mtp for _ in range(parsed.mtp_depths))
    return (f"the hybrid layer pattern has no '|': Megatron splits it over {len(stages)} pipeline stages by its "
            "deprecated pipe-free path (megatron/core/models/hybrid/hybrid_layer_allocation.py "
            f"select_pipeline_segment); the best layout's split written with '|' is --hybrid-layer-pattern '{text}'")


# What Megatron's default layout (pp 1) fails with for a pattern of several '|' segments: they
# derive virtual stages, which need pp > 1.  No layout the pattern allows has pp 1 then.
PIPE_ONLY_PROBLEMS = frozenset({"vpp-needs-pipeline"})


def default_layout_problems(namespace: Mapping[str, Any], problems) -> tuple:
    """The problems of Megatron's default layout worth a plan note: without those a pattern's
    '|' segments make inevitable on one pipeline rank."""
    if not namespace.get("hybrid_pattern_unified") or len(pattern_segments(namespace)) == 1:
        return tuple(problems)
    return tuple(p for p in problems if p.code not in PIPE_ONLY_PROBLEMS)
