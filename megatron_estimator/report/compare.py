"""Rendering a log comparison (``results.comparison.LogComparison``): text, JSON, markdown (the text).

The estimate itself is rendered as ``check`` renders it (report/text.py); the comparison adds
a table per logged rank, the out-of-memory verdicts and, when asked, the suggested settings
as a ``[tool.megatron-estimator]`` table to commit.
"""

from __future__ import annotations

import json

from megatron_estimator.report.text import _table, gib, render_text, verdict_to_json

RANK_COLUMNS = ("rank", "stage", "iteration", "max alloc", "est alloc", "error", "max reserved", "est reserved", "error",
                "est device", "error")


def _percent(error: float | None) -> str:
    return "-" if error is None else f"{error * 100:+.1f}%"


def _refused(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "no budget"}[value]


def suggested_toml(comparison) -> str:
    """The ``[tool.megatron-estimator]`` table, each value with how it was derived."""
    lines = [f"# implied by {comparison.source} (megatron-estimator compare --suggest-settings)",
             "[tool.megatron-estimator]"]
    for setting in comparison.suggested_settings:
        line = f"{setting.key} = {setting.toml_value}"
        lines.append(line if setting.value is not None else "# " + line)
        lines.append(f"#   {setting.derivation}")
    return "\n".join(lines) + "\n"


def render_compare_text(comparison) -> str:
    verdict = comparison.verdict
    out = render_text([verdict]).rstrip("\n")
    if verdict.estimate is None:
        return out + "\n"
    lines = [out, "", "  measured (report_memory, MiB figures) against the estimate of the rank's stage, GiB:"]
    if comparison.ranks:
        rows = [[str(r.rank), str(r.pipeline_rank), "-" if r.iteration is None else
                 str(r.iteration) + ("*" if r.state != "steady" else ""),
                 gib(r.measured_max_allocated_bytes), gib(r.allocated_peak_bytes),
                 _percent(r.allocated_error), gib(r.measured_max_reserved_bytes), gib(r.reserved_estimate_bytes),
                 _percent(r.reserved_error), gib(r.device_peak_bytes), _percent(r.device_error)]
                for r in comparison.ranks]
        lines += ["  " + line for line in _table(rows, RANK_COLUMNS)]
        lines.append("  error = (estimate - measured) / measured; est reserved = allocated peak + fragmentation; "
                     "est device also holds the CUDA context and NCCL buffers, which reserved does not")
        if any(r.state != "steady" for r in comparison.ranks):
            lines.append("  iteration*: logged by the end of the step that creates the optimizer's moments: "
                         "estimated without them")
    else:
        lines.append("  no rank logged memory")
    for oom in comparison.out_of_memory:
        who = f"rank {oom.rank}" if oom.rank is not None else "a rank"
        stage = f"stage {oom.pipeline_rank}" if oom.pipeline_rank is not None else "the peak stage (rank not known)"
        lines.append(f"  out of memory: {oom.location}: {who} ({oom.rank_source}) with {gib(oom.allocated_bytes)} GiB "
                     f"allocated, {gib(oom.reserved_bytes)} GiB reserved of {gib(oom.total_capacity_bytes)} GiB, "
                     f"asking {gib(oom.requested_bytes)} GiB more")
        budget = f"{gib(oom.budget_bytes)} GiB ({oom.budget_source})" if oom.budget_bytes is not None else "none"
        lines.append(f"    estimate of {stage}: {gib(oom.device_peak_bytes)} GiB against budget {budget}: "
                     f"refused the stage: {_refused(oom.stage_refused)}; refused the launch: "
                     f"{_refused(oom.launch_refused)}")
    for note in comparison.notes:
        lines.append(f"  note: {note}")
    text = "\n".join(lines) + "\n"
    if comparison.suggested_settings is not None:
        text += "\n" + suggested_toml(comparison)
    return text


def comparison_to_json(comparison) -> dict:
    doc = verdict_to_json(comparison.verdict)
    doc["ranks"] = [r.to_json() for r in comparison.ranks]
    doc["out_of_memory"] = [o.to_json() for o in comparison.out_of_memory]
    doc["suggested_settings"] = (None if comparison.suggested_settings is None
                                 else [s.to_json() for s in comparison.suggested_settings])
    doc["suggested_toml"] = None if comparison.suggested_settings is None else suggested_toml(comparison)
    doc["notes"] = list(comparison.notes)
    return doc


def render_compare_json(comparison) -> str:
    return json.dumps(comparison_to_json(comparison), indent=2) + "\n"


def render_compare_markdown(comparison) -> str:
    return "```\n" + render_compare_text(comparison) + "```\n"


RENDERERS = {"text": render_compare_text, "json": render_compare_json, "markdown": render_compare_markdown}
