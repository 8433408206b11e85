"""Rendering plans: text for a terminal, JSON for machines, markdown for reviews.

Renderers read ``results.plan.Plan`` records (and, for bad input, the problems) and never compute
memory.  JSON layout::

    {"status": "fits" | "none_fit" | "invalid", "candidates": [...best first...],
     "searched": N, "valid": N, "fitting": N, "seconds": x, ...}

each candidate as ``results.plan.Candidate.to_json`` writes it (``flags``, ``parallelism``,
``micro_batch_size``, ``recompute``, ``distributed_optimizer``, ``peak_stage``,
``device_peak_bytes``, ``allocated_peak_bytes``, ``headroom_bytes``, ``throughput_proxy``).
"""

from __future__ import annotations

import json
import shlex
from typing import Sequence

from megatron_estimator.core.problems import Problem, escape_text
from megatron_estimator.core.units import gib
from megatron_estimator.results.plan import PROXY_FORMULA, Candidate, Plan

COLUMNS = ("#", "tp", "pp", "vpp", "cp", "dp", "ep", "etp", "mbs", "M", "sp", "recompute", "dist-opt",
           "peak GiB", "stage", "headroom", "step", "bubble", "recomp", "comm")


def _status(plan: Plan) -> str:
    return "fits" if plan.fits else "none_fit"


def _row(rank: int, c: Candidate) -> list[str]:
    p, x = c.parallel, c.proxy
    return [
        str(rank), str(p.tp), str(p.pp), str(p.vpp or "-"), str(p.cp), str(p.dp), str(p.ep), str(p.etp),
        str(c.micro_batch_size), str(c.num_microbatches), "on" if c.sequence_parallel else "off",
        c.recompute.label, "on" if c.distributed_optimizer else "off",
        gib(c.device_peak_bytes), str(c.peak_stage), gib(c.headroom_bytes),
        f"{x.step:.3f}", f"{x.bubble:.3f}", f"{x.recompute:.3f}",
        f"{x.tp_comm + x.cp_comm + x.ep_comm + x.dp_comm:.3f}",
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [list(COLUMNS)] + rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(COLUMNS, widths))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) if COLUMNS[i] == "recompute" else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
    return lines


def _command(tokens: Sequence[str]) -> str:
    return " ".join(shlex.quote(t) for t in tokens) if tokens else "(none: the input's layout)"


def _summary(plan: Plan) -> list[str]:
    lines = [
        f"plan for {escape_text(plan.source)}: {plan.world_size} GPUs, global batch {plan.global_batch_size}, "
        f"budget {gib(plan.budget_bytes)} GiB per GPU ({plan.budget_source})",
        f"searched {plan.searched:,} layouts in {plan.seconds:.2f} s: {plan.valid:,} pass Megatron's checks, "
        f"{plan.fitting:,} fit",
    ]
    if plan.rejections:
        lines.append("rejected by: " + ", ".join(f"{code} ({n:,})" for code, n in plan.rejections[:6]))
    return lines


def render_text(plan: Plan) -> str:
    lines = _summary(plan)
    for note in plan.notes:
        lines.append(f"note: {note}")
    lines.append("")
    if not plan.candidates:
        lines.append(f"no layout fits in {gib(plan.budget_bytes)} GiB: add GPUs, raise the budget or shrink "
                     "the model or the sequence")
        return "\n".join(lines) + "\n"
    lines += _table([_row(i, c) for i, c in enumerate(plan.candidates, 1)])
    lines.append("")
    lines.append(f"ranked by the relative step time: {PROXY_FORMULA}")
    lines.append("  step 1.0 = compute alone; bubble, recomp and comm are fractions of the compute "
                 f"(comm at {plan.proxy.intra_node_bandwidth / 1e9:g} GB/s in a node, "
                 f"{plan.proxy.inter_node_bandwidth / 1e9:g} GB/s across, compute at "
                 f"{plan.proxy.achieved_flops / 1e12:g} TFLOP/s); peak: the peak stage's device bytes")
    lines.append("")
    lines.append("flags (added to the input's; the model's flags stay as given):")
    for i, c in enumerate(plan.candidates, 1):
        lines.append(f"  #{i}: {_command(c.flags)}")
        if c.remove_flags:
            lines.append(f"      remove: {' '.join(c.remove_flags)}")
        lines.append(f"      split: {c.pipeline.label}")
    return "\n".join(lines) + "\n"


def plan_to_json(plan: Plan) -> dict:
    return {
        "status": _status(plan),
        "source": plan.source,
        "world_size": plan.world_size,
        "global_batch_size": plan.global_batch_size,
        "budget_bytes": plan.budget_bytes,
        "budget_source": plan.budget_source,
        "candidates": [c.to_json() for c in plan.candidates],
        "searched": plan.searched,
        "valid": plan.valid,
        "fitting": plan.fitting,
        "seconds": round(plan.seconds, 3),
        "rejections": dict(plan.rejections),
        "throughput_proxy": {"formula": PROXY_FORMULA, "assumptions": plan.proxy.to_json()},
        "search_space": plan.space.to_json(),
        "notes": list(plan.notes),
        "problems": [],
    }


def render_json(plan: Plan) -> str:
    return json.dumps(plan_to_json(plan), indent=2) + "\n"


def render_markdown(plan: Plan) -> str:
    out = ["### Layout plan: " + ("fits" if plan.fits else "nothing fits"), ""]
    out += [line + "  " for line in _summary(plan)]
    out.append("")
    if plan.candidates:
        out.append("| " + " | ".join(COLUMNS) + " | flags |")
        out.append("|" + "---|" * (len(COLUMNS) + 1))
        for i, c in enumerate(plan.candidates, 1):
            flags = _command(c.flags) + (f" (remove {' '.join(c.remove_flags)})" if c.remove_flags else "")
            # A '|' ends a table cell even inside backticks (layout strings have them).
            out.append("| " + " | ".join(_row(i, c)) + f" | `{flags.replace('|', chr(92) + '|')}` |")
        out.append("")
        out.append(f"Ranked by the relative step time `{PROXY_FORMULA}` (1.0 = compute alone).")
        out.append("")
    for note in plan.notes:
        out.append(f"- {note}")
    return "\n".join(out) + "\n"


RENDERERS = {"text": render_text, "json": render_json, "markdown": render_markdown}


def render_invalid(problems: Sequence[Problem], fmt: str, source: str = "plan", searched: int = 0) -> str:
    """The input's problems, one per line, in the plan's format (``searched``: the layouts tried
    before none passed Megatron's checks)."""
    if fmt == "json":
        return json.dumps({"status": "invalid", "source": source, "candidates": [], "searched": searched, "valid": 0,
                           "fitting": 0, "problems": [p.to_json() for p in problems]}, indent=2) + "\n"
    if fmt == "markdown":
        lines = [f"### {escape_text(source)}: invalid", ""] + [f"- `{p.location}`: {p.message} (`{p.code}`)" for p in problems]
        return "\n".join(lines) + "\n"
    lines = [f"{escape_text(source)}: invalid input, {len(problems)} problem{'s' if len(problems) != 1 else ''}:"]
    lines += [f"  error: {p.location}: {p.message} [{p.code}]" for p in problems]
    return "\n".join(lines) + "\n"
