"""The planner's search space: what it chooses, and every choice within ``SearchSpace``.

The planner chooses only the layout settings (``PLANNED_DESTS``): tensor (tp), pipeline (pp),
virtual pipeline (v) and context (cp) parallel sizes, expert (ep) and expert tensor (etp)
parallel sizes, the micro batch size, sequence parallelism, activation recomputation and the
distributed optimizer.  Every other setting stays as the user gave it.

The space (``results.plan.SearchSpace``; each bound is a field):

- tp: divisors of the world size up to the GPUs of one node (TP across nodes is never
  competitive); cp: divisors of world / tp up to ``max_context_parallel``; pp: divisors of
  world / (tp cp) up to the number of layers; MoE models: ep any divisor of the number of
  experts, etp 1 or tp (Megatron's default is tp);
- v = 1..``max_virtual_stages`` virtual stages per rank; the layers are split evenly when
  they divide, else with ``--decoder-first/last-pipeline-num-layers`` (a balanced middle,
  the first and last stages no heavier), else with a balanced
  ``--pipeline-model-parallel-layout``; the user's own split is one more choice for the
  user's pp; a hybrid model's splits are its pattern's (planner/hybrid.py);
- micro batch sizes ``micro_batch_sizes``; sequence parallel on and off when tp > 1;
  recompute none, selective ``core_attn``, full uniform (one layer per group), full block
  with ``block_recompute_fractions`` of a model chunk's layers; distributed optimizer off/on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.results.plan import NO_RECOMPUTE, SELECTIVE_CORE_ATTN, PipelineChoice, Recompute, SearchSpace

# -------------------------------------------------------------------------------------------
# What the planner chooses

PARALLEL_DESTS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size")
SPLIT_DESTS = ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
               "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "microbatch_group_size_per_vp_stage")
BATCH_DESTS = ("micro_batch_size", "global_batch_size", "use_distributed_optimizer")
RECOMPUTE_DESTS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
                   "recompute_activations", "distribute_saved_activations")
SEQUENCE_PARALLEL_DESTS = ("sequence_parallel",)
PLANNED_DESTS = PARALLEL_DESTS + SPLIT_DESTS + BATCH_DESTS + RECOMPUTE_DESTS + SEQUENCE_PARALLEL_DESTS


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _layout_text(stages: list[str]) -> str:
    """A ``--pipeline-model-parallel-layout`` string for these stages, runs folded as (s|)*n."""
    def short(stage: str) -> str:
        out, i = [], 0
        while i < len(stage):
            j = i
            while j < len(stage) and stage[j] == stage[i]:
                j += 1
            out.append(stage[i] + (f"*{j - i}" if j - i > 2 else stage[i] * (j - i - 1)))
            i = j
        return "".join(out)

    parts, i, last = [], 0, len(stages) - 1
    while i < last:
        j = i
        while j + 1 < last and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        parts.append(f"({short(stages[i])}|)*{run}" if run > 1 else short(stages[i]) + "|")
        i = j + 1
    parts.append(short(stages[last]))
    return "".join(parts)


def pipeline_choices(num_layers: int, mtp_layers: int, pp: int, max_virtual_stages: int) -> list[PipelineChoice]:
    """The splits the planner tries for ``pp`` ranks: one per number of virtual stages."""
    if pp == 1:
        return [PipelineChoice(1, None, (), "no pipeline")]
    choices = []
    for v in range(1, max_virtual_stages + 1):
        if pp * v > num_layers:
            break
        choice = _split(num_layers, mtp_layers, pp, v)
        if choice is not None:
            choices.append(choice)
    return choices


def _split(num_layers: int, mtp: int, pp: int, v: int) -> PipelineChoice | None:
    vpp = v if v > 1 else None
    virtual = (("num_virtual_stages_per_pipeline_rank", v),) if v > 1 else ()
    n = pp * v
    if num_layers % n == 0:
        per = num_layers // n
        return PipelineChoice(pp, vpp, virtual, f"even, {per} layer{'s' if per != 1 else ''} per chunk")
    # Uneven first/last stages (megatron/training/arguments.py; with v virtual stages every
    # count divisible by v): a balanced middle, ends no heavier than it.
    middle = pp - 2
    if middle == 0:
        first = (num_layers // 2) // v * v
        last = num_layers - first
        if first >= v and last % v == 0:
            return PipelineChoice(pp, vpp, (("decoder_first_pipeline_num_layers", first),
                                            ("decoder_last_pipeline_num_layers", last)) + virtual,
                                  f"first {first}, last {last}")
    else:
        k = -(-num_layers // pp)
        k = -(-k // v) * v
        while k * middle <= num_layers - 2 * v:
            rest = num_layers - k * middle
            first = (rest // 2) // v * v
            last = rest - first
            if rest % v == 0 and v <= first <= k and v <= last <= k:
                return PipelineChoice(pp, vpp, (("decoder_first_pipeline_num_layers", first),
                                                ("decoder_last_pipeline_num_layers", last)) + virtual,
                                      f"first {first}, middle {k}, last {last}")
            k += v
    # A layout string (megatron/core/transformer/pipeline_parallel_layer_layout.py): the layers
    # spread evenly, the extra ones on the middle stages first.
    if n > num_layers:
        return None
    base, extra = divmod(num_layers, n)
    counts = [base] * n
    for index in (list(range(1, n - 1)) + [n - 1, 0])[:extra]:
        counts[index] += 1
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp + "L"
    text = _layout_text(stages)
    return PipelineChoice(pp, vpp, (("pipeline_model_parallel_layout", text),), f"layout {text}")


def recompute_choices(max_chunk_layers: int, fractions: Sequence[float]) -> list[Recompute]:
    """None, selective core_attn, full uniform 1, full block n for each fraction of the layers
    of the largest model chunk (n below that count: block of all is uniform 1)."""
    choices = [NO_RECOMPUTE, SELECTIVE_CORE_ATTN]
    if max_chunk_layers >= 1:
        choices.append(Recompute("full", "uniform", 1))
    blocks = sorted({max(1, int(f * max_chunk_layers)) for f in fractions})
    choices += [Recompute("full", "block", n) for n in blocks if n < max_chunk_layers]
    return choices


def user_pipeline_choice(raw: RawArgs) -> PipelineChoice | None:
    """The split the user gave (layout, uneven stages, accounting, virtual stages), if any."""
    given = tuple((d, raw.value(d)) for d in SPLIT_DESTS
                  if d != "microbatch_group_size_per_vp_stage" and raw.given(d) and raw.value(d) not in (None, False))
    if not given:
        return None
    pp = raw.value("pipeline_model_parallel_size", 1)
    label = "as given: " + " ".join("--" + d.replace("_", "-") + ("" if v is True else f" {v}") for d, v in given)
    return PipelineChoice(pp, None, given, label)


@dataclass(frozen=True)
class LayoutChoice:
    """An outer choice: the parallel sizes and the pipeline split."""
    tp: int
    cp: int
    pp: int
    ep: int
    etp: int
    pipeline: PipelineChoice


def family_settings(tp: int, cp: int, pp: int, pipeline: PipelineChoice) -> dict[str, Any]:
    """The planned settings a layout family (tp, cp, pp, split) fixes, the inner choices at
    their defaults (Megatron's unset where the planner sets nothing)."""
    out: dict[str, Any] = {d: None for d in SPLIT_DESTS}
    out.update({"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "context_parallel_size": cp,
                "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
                "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
                "recompute_activations": False, "distribute_saved_activations": False})
    out.update(dict(pipeline.settings))
    if pipeline.settings and "hybrid_layer_pattern" in out:
        # A hybrid pattern re-split into '|' segments (planner/hybrid.py): what validate_args
        # derives from it (config/hybrid.py normalize_namespace keeps the unified pattern).
        out["hybrid_pattern_unified"] = out["hybrid_layer_pattern"]
    return out


def extra_dests(pipeline: PipelineChoice) -> tuple[str, ...]:
    """The settings a split changes besides ``PLANNED_DESTS``: a hybrid model's re-split
    layer pattern (planner/hybrid.py); none for a GPT decoder's."""
    return tuple(d for d, _ in pipeline.settings if d not in PLANNED_DESTS)


def layout_families(namespace: Mapping[str, Any], world: int, space: SearchSpace,
                    user_pipeline: PipelineChoice | None, splits=None) -> Iterator[tuple[int, int, int, PipelineChoice]]:
    """(tp, cp, pp, split) of every layout family.  ``splits`` (pp, max virtual stages) -> the
    splits, when not ``pipeline_choices`` (a hybrid model's: planner/hybrid.py)."""
    num_layers = namespace.get("num_layers") or 1
    mtp = namespace.get("mtp_num_layers") or 0
    for tp in divisors(world):
        if tp > space.tensor_parallel_limit:
            break
        for cp in divisors(world // tp):
            if cp > space.max_context_parallel:
                break
            for pp in divisors(world // (tp * cp)):
                if pp > num_layers:
                    break
                choices = (pipeline_choices(num_layers, mtp, pp, space.max_virtual_stages) if splits is None
                           else splits(pp, space.max_virtual_stages))
                if user_pipeline is not None and user_pipeline.pp == pp and user_pipeline.settings not in [
                        c.settings for c in choices]:
                    choices.insert(0, user_pipeline)
                for choice in choices:
                    yield tp, cp, pp, choice


def expert_choices(namespace: Mapping[str, Any], world: int, tp: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs: every divisor of the number of experts, etp 1 or tp (dense: (1, tp))."""
    experts = namespace.get("num_experts") or 0
    if not experts:
        return [(1, tp)]
    return [(ep, etp) for ep in divisors(experts) if ep <= world for etp in sorted({1, tp})]


def batch_choices(space: SearchSpace) -> list[tuple[bool, int]]:
    """(distributed optimizer, micro batch size) pairs, in loop order."""
    return [(do, mbs) for do in space.distributed_optimizer for mbs in space.micro_batch_sizes]


def sequence_parallel_choices(tp: int) -> tuple[bool, ...]:
    """Sequence parallelism is a choice only with tensor parallelism."""
    return (False, True) if tp > 1 else (False,)
