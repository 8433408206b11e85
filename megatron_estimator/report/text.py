"""Rendering verdicts: text for a terminal, JSON for machines, markdown for reviews.

Renderers read ``results.Verdict`` objects and never compute memory.  The JSON layout is
the contract described by ``schemas/report.schema.json``.
"""

from __future__ import annotations

from typing import Sequence

from megatron_estimator.core import units
from megatron_estimator.core.problems import escape_text
from megatron_estimator.results.estimate import Estimate, StageEstimate, Verdict


def gib(n: int | None) -> str:
    """``"79.18"`` (GiB), or ``"-"`` for a figure that is not there."""
    return "-" if n is None else units.gib(n)


def _layer_span(indices: tuple[int, ...]) -> str:
    if not indices:
        return "-"
    spans, start, prev = [], indices[0], indices[0]
    for i in indices[1:]:
        if i == prev + 1:
            prev = i
            continue
        spans.append((start, prev))
        start = prev = i
    spans.append((start, prev))
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _parallel_line(estimate: Estimate) -> str:
    p = estimate.parallelism
    parts = [f"{k} {p[k] if p[k] is not None else '-'}" for k in ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "edp")]
    return " | ".join(parts)


COLUMNS = ("stage", "layers", "params", "weights", "grads", "optim", "activ", "other", "peak", "headroom")


def _stage_row(stage: StageEstimate, peak_rank: int) -> list[str]:
    b = stage.bytes
    marker = "*" if stage.pipeline_rank == peak_rank else " "
    return [
        f"{marker}{stage.pipeline_rank}",
        f"{stage.layers} ({_layer_span(stage.layer_indices)})",
        f"{stage.parameters / 1e9:.3f}B" if stage.parameters >= 1e8 else f"{stage.parameters / 1e6:.2f}M",
        gib(b.weights), gib(b.gradients), gib(b.optimizer_states), gib(b.activations), gib(b.other),
        gib(stage.device_peak_bytes), gib(stage.headroom_bytes),
    ]


def _table(rows: list[list[str]], header: Sequence[str], left: int = 2) -> list[str]:
    widths = [max(len(str(r[i])) for r in [list(header)] + rows) for i in range(len(header))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths))]
    for row in rows:
        lines.append("  ".join(str(c).rjust(w) if i >= left else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
    return lines


def render_text(verdicts: Sequence[Verdict], verbose: bool = False) -> str:
    blocks = [_text_block(v, verbose) for v in verdicts]
    return "\n\n".join(blocks) + "\n"


# A stage's modules (results ModuleBytes) as the breakdown names them.
MODULE_NAMES = {"embedding": "embedding", "final_norm": "final norm", "mtp": "MTP layers",
                "output_layer": "output layer, loss", "padding": "buffer padding, rounding"}
LAYER_NAMES = {"dense": "decoder layer", "moe": "MoE layer", "M": "Mamba layer (M)", "*": "attention layer (*)",
               "+": "MLA layer (+)", "-": "MLP layer (-)", "E": "MoE layer (E)", "G": "gated delta net layer (G)",
               "D": "DSA layer (D)", "D:shared-top-k": "DSA layer, shared top-k (D)"}
MODULE_COLUMNS = ("stage", "chunk", "module", "layers", "params", "weights", "grads", "optim", "activ")
MODULES_NOTE = ("MiB per GPU (after TP / EP sharding); activ: held at the stage's peak, every microbatch in flight; "
                "the total rows are the stage table's")


def mib(n: int) -> str:
    return f"{n / 1048576:.2f}"


def module_name(m) -> str:
    return LAYER_NAMES.get(m.kind, f"layer {m.kind}") if m.module == "layers" else MODULE_NAMES.get(m.module, m.module)


def module_rows(e: Estimate) -> tuple[tuple[str, ...], list[list[str]]]:
    """The ``--verbose`` breakdown (header, rows): each stage's modules (per virtual stage: the
    chunk column, with virtual stages only), then its totals."""
    rows = []
    vpp = any(len(s.microbatches_in_flight) > 1 for s in e.stages)
    for s in e.stages:
        for m in s.modules:
            rows.append([str(s.pipeline_rank), "-" if m.chunk is None else str(m.chunk), module_name(m),
                         str(m.count) if m.module in ("layers", "mtp") else "", f"{m.parameters:,}",
                         mib(m.weights), mib(m.gradients), mib(m.optimizer_states), mib(m.activations)])
        b = s.bytes
        rows.append([str(s.pipeline_rank), "", "total", str(s.layers), f"{s.parameters:,}", mib(b.weights),
                     mib(b.gradients), mib(b.optimizer_states), mib(b.activations)])
    if vpp:
        return MODULE_COLUMNS, rows
    return MODULE_COLUMNS[:1] + MODULE_COLUMNS[2:], [row[:1] + row[2:] for row in rows]


def model_lines(m) -> list[tuple[str, str]]:
    """The summary lines of a ``results.estimate.ModelShape``: model, experts, vocabulary,
    batch, precision."""
    attention = f"{m.num_attention_heads} heads"
    if m.multi_latent_attention:
        attention += ", multi-latent attention"
    elif m.num_query_groups != m.num_attention_heads:
        attention += f", {m.num_query_groups} query groups"
    rows = [
        ("model", f"{m.num_layers} layers, hidden {m.hidden_size}, ffn {m.ffn_hidden_size}, {attention}"),
        ("vocabulary", f"{m.padded_vocab_size} ({m.vocab_source})"),
        ("batch", f"micro {m.micro_batch_size} x seq {m.seq_length}, global {m.global_batch_size} "
                  f"({m.num_microbatches} microbatches per step)"),
        ("precision", f"{m.params_dtype} params, {m.main_grads_dtype} grads, {m.optimizer}"
                      + (", distributed optimizer" if m.distributed_optimizer else "")),
    ]
    if m.experts is not None:
        experts, topk, ffn, layers = m.experts
        rows.insert(1, ("experts", f"{experts} experts, top-{topk}, ffn {ffn}, {layers} MoE layers"))
    return rows


def fits_on_text(names: Sequence[str]) -> str:
    """The ``fits on:`` line's text: the catalog GPUs on which every stage fits."""
    return ", ".join(names) if names else "no GPU of the catalog"


def _family_line(family) -> str:
    """The model family line: ``model family: gpt (the entry script pretrain_gpt.py, ...)``."""
    return f"  model family: {family.name} ({family.source})"


def _megatron_line(verdict: Verdict) -> str:
    """``  megatron: 0.16.1 (--megatron-version)``: the release the input was checked against."""
    from megatron_estimator.megatron.releases import default_release
    chosen = verdict.megatron or default_release()
    return f"  megatron: {chosen.version} ({chosen.source})"


def _megatron_json(verdict: Verdict) -> dict:
    from megatron_estimator.megatron.releases import default_release
    return (verdict.megatron or default_release()).as_json()


def _text_block(verdict: Verdict, verbose: bool = False) -> str:
    lines = [f"{escape_text(verdict.source)}:"]
    if verdict.estimate is None:
        if verdict.family is not None and verdict.family.name != "gpt":
            lines.append(_family_line(verdict.family))
        lines.append(f"  invalid input, {len(verdict.problems)} problem{'s' if len(verdict.problems) != 1 else ''}:")
        for problem in verdict.problems:
            lines.append(f"  error: {problem.location}: {problem.message} [{problem.code}]")
        if verdict.notes:
            lines.append("  notices (what the check assumed about the rest):")
            lines += [f"  - {escape_text(str(note))}" for note in verdict.notes]
        return "\n".join(lines)
    e = verdict.estimate
    lines.append(f"  world size {e.world_size} ({e.world_size_source}); {_parallel_line(e)}")
    lines.append(_megatron_line(verdict))
    lines += [f"  job stack: {package}" for package in verdict.stack]
    if verdict.family is not None:
        lines.append(_family_line(verdict.family))
    if e.model is not None:
        lines += [f"  {key}: {text}" for key, text in model_lines(e.model)]
    kinds = [(s.pipeline_rank, s.layer_kinds) for s in e.stages if s.layer_kinds is not None]
    if kinds:
        lines.append("  hybrid layers (M Mamba, G gated delta net, * attention, D DSA, + MLA, - MLP, E MoE; | virtual stages, / MTP): "
                     + "; ".join(f"stage {r} {k or '-'}" for r, k in kinds))
    lines.append(f"  parameters: {e.total_parameters:,}")
    if e.budget_bytes is not None:
        lines.append(f"  budget: {gib(e.budget_bytes)} GiB per GPU ({e.budget_source})")
    else:
        lines.append("  budget: none given (report only)")
    if e.fits_on is not None:
        lines.append(f"  fits on: {fits_on_text(e.fits_on)}")
    lines.append("")
    peak = e.peak_stage
    rows = [_stage_row(s, peak.pipeline_rank) for s in e.stages]
    header = list(COLUMNS)
    lines += ["  " + line for line in _table(rows, header)]
    lines.append("  GiB per GPU; * marks the peak stage; peak = allocated + CUDA context, NCCL buffers, fragmentation")
    lines.append(f"  peak stage {peak.pipeline_rank}: allocated {gib(peak.allocated_peak_bytes)} GiB "
                 f"(torch.cuda.max_memory_allocated), device {gib(peak.device_peak_bytes)} GiB; {peak.peak_moment}")
    if verbose:
        lines.append("")
        lines.append("  modules per stage:")
        header, rows = module_rows(e)
        lines += ["  " + line for line in _table(rows, header, left=len(header) - 6)]
        lines.append("  " + MODULES_NOTE)
    lines.append("")
    lines.append("  assumptions:")
    for a in e.assumptions:
        lines.append(f"  - {a.text}")
    if e.fits is None:
        lines.append(f"  verdict: NOT CHECKED against a budget: none given (--budget, --gpu, MEGATRON_ESTIMATOR_BUDGET "
                     f"or the settings file's budget / gpu); peak {gib(peak.device_peak_bytes)} GiB on stage "
                     f"{peak.pipeline_rank}")
    elif e.fits:
        lines.append(f"  verdict: FITS: peak {gib(peak.device_peak_bytes)} GiB on stage {peak.pipeline_rank}, "
                     f"{gib(peak.headroom_bytes)} GiB headroom")
    else:
        over = [s for s in e.stages if s.fits is False]
        lines.append(f"  verdict: OVER BUDGET on {len(over)} of {len(e.stages)} stage(s): stage "
                     f"{peak.pipeline_rank} needs {gib(peak.device_peak_bytes)} GiB of {gib(e.budget_bytes)} GiB "
                     f"({gib(-peak.headroom_bytes)} GiB over)")
    lines += _suggestion_lines(verdict.suggestions)
    return "\n".join(lines)


def _cost_text(cost) -> str:
    """The planner's throughput proxy of a suggestion (planner/cost.py), as fractions of compute."""
    return (f"proxy step {cost.step:.3f} (bubble {cost.bubble:.3f}, recompute {cost.recompute:.3f}, "
            f"communication tp {cost.tp_comm:.3f} cp {cost.cp_comm:.3f} ep {cost.ep_comm:.3f} dp {cost.dp_comm:.3f})")


def _suggestion_flags(s) -> str:
    import shlex

    parts = [" ".join(shlex.quote(t) for t in s.flags)] if s.flags else []
    if s.remove_flags:
        parts.append("remove " + " ".join(s.remove_flags))
    return "; ".join(parts)


def _suggestion_lines(suggestions) -> list[str]:
    if suggestions is None:
        return []
    if not suggestions.suggestions:
        return [f"  suggestions: {suggestions.note}"]
    lines = ["  suggestions (nearest first; each re-estimated, every stage fits):"]
    for i, s in enumerate(suggestions.suggestions, 1):
        lines.append(f"  {i}. {_suggestion_flags(s)}")
        lines.append(f"     changes {', '.join(s.changes)}: peak {gib(s.device_peak_bytes)} GiB on stage "
                     f"{s.peak_stage}, {gib(s.headroom_bytes)} GiB headroom; {_cost_text(s.cost)}")
    return lines


def verdict_to_json(verdict: Verdict) -> dict:
    e = verdict.estimate
    doc = {
        "source": verdict.source,
        "status": verdict.status,
        "megatron": _megatron_json(verdict),
        "budget_bytes": e.budget_bytes if e else None,
        "world_size": e.world_size if e else None,
        "world_size_source": e.world_size_source if e else None,
        "parallelism": dict(e.parallelism) if e else None,
        "stages": [s.to_json() for s in e.stages] if e else [],
        "peak_stage": e.peak_stage.pipeline_rank if e else None,
        "total_parameters": e.total_parameters if e else None,
        "fits_on": list(e.fits_on) if e and e.fits_on is not None else None,
        "problems": [p.to_json() for p in verdict.problems],
        "assumptions": [a.to_json() for a in e.assumptions] if e else [],
        "model": verdict.family.to_json() if verdict.family is not None else None,
    }
    if verdict.stack:                # run: the job's packages, from their metadata
        doc["stack"] = [package.to_json() for package in verdict.stack]
    if verdict.notes:                # a refused input's notices (a valid one's are its assumptions)
        doc["notices"] = list(verdict.notes)
    found = verdict.suggestions
    if found is not None:            # a refusal the caller asked suggestions for
        doc["suggestions"] = [s.to_json() for s in found.suggestions]
        if found.note:
            doc["suggestions_note"] = found.note
    return doc


def render_json(verdicts: Sequence[Verdict], verbose: bool = False) -> str:
    import json

    if len(verdicts) == 1:
        return json.dumps(verdict_to_json(verdicts[0]), indent=2) + "\n"
    return json.dumps({"results": [verdict_to_json(v) for v in verdicts]}, indent=2) + "\n"


def render_markdown(verdicts: Sequence[Verdict], verbose: bool = False) -> str:
    out = []
    for v in verdicts:
        out.append(f"### {escape_text(v.source)}: {v.status.replace('_', ' ')}")
        out.append("")
        if v.family is not None and (v.estimate is not None or v.family.name != "gpt"):
            out.append(f"Model family: {v.family.name} ({v.family.source}).")
            out.append("")
        if v.estimate is None:
            for p in v.problems:
                out.append(f"- `{p.location}`: {p.message} (`{p.code}`)")
            out.append("")
            if v.notes:
                out.append("Notices:")
                out += [f"- {note}" for note in v.notes]
                out.append("")
            continue
        e = v.estimate
        out.append(f"World size {e.world_size} ({e.world_size_source}); {_parallel_line(e)}.")
        if e.budget_bytes is not None:
            out.append(f"Budget {gib(e.budget_bytes)} GiB per GPU ({e.budget_source}).")
        if e.fits_on is not None:
            out.append(f"Fits on: {fits_on_text(e.fits_on)}.")
        out.append("")
        peak = e.peak_stage
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        for s in e.stages:
            row = _stage_row(s, peak.pipeline_rank)
            row[0] = f"**{row[0].strip('*')}**" if s.pipeline_rank == peak.pipeline_rank else row[0].strip()
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out.append("GiB per GPU; the peak stage is in bold.")
        out.append("")
        if verbose:
            header, rows = module_rows(e)
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out += ["| " + " | ".join(row) + " |" for row in rows]
            out.append("")
            out.append(MODULES_NOTE + ".")
            out.append("")
        out.append("Assumptions:")
        for a in e.assumptions:
            out.append(f"- {a.text}")
        out.append("")
        if v.suggestions is not None:
            out += _suggestion_markdown(v.suggestions)
    return "\n".join(out) + "\n"


def _suggestion_markdown(suggestions) -> list[str]:
    if not suggestions.suggestions:
        return [f"Suggestions: {suggestions.note}", ""]
    out = ["Suggestions (nearest first; each re-estimated, every stage fits):", ""]
    for i, s in enumerate(suggestions.suggestions, 1):
        out.append(f"{i}. `{_suggestion_flags(s)}`: changes {', '.join(s.changes)}; peak "
                   f"{gib(s.device_peak_bytes)} GiB on stage {s.peak_stage}, {gib(s.headroom_bytes)} GiB headroom; "
                   f"{_cost_text(s.cost)}")
    out.append("")
    return out


RENDERERS = {"text": render_text, "json": render_json, "markdown": render_markdown}
