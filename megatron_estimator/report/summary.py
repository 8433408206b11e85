"""``check --summary``: one table across the files, after their reports.

A row per file (``summary_rows``, the JSON form; text and markdown render the same rows): the
model (family, parameters, layers x hidden), the parallel layout, the GPUs, the micro batch and
sequence, the parameters, the peak stage's weights + gradients + optimizer states and its
activations, its device peak, and the verdict; an invalid file is a row with verdict
``invalid`` and no figures.  Then the least and the most memory-hungry files by device peak.
Renderers read ``results.Verdict`` objects and never compute memory.
"""

from __future__ import annotations

from typing import Sequence

from megatron_estimator.results.estimate import Verdict
from megatron_estimator.report.text import RENDERERS, _table, gib, verdict_to_json

LAYOUT = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")
HEADER = ("file", "model", "/".join(LAYOUT), "GPUs", "micro", "seq", "params", "weights+optim", "activ", "peak",
          "verdict")


def summary_row(verdict: Verdict) -> dict:
    """One file's row, as the JSON report's ``summary.rows`` entries (bytes, counts, names)."""
    e = verdict.estimate
    family = verdict.family.name if verdict.family is not None else None
    if e is None:
        return {"source": verdict.source, "status": verdict.status, "family": family, "num_layers": None,
                "hidden_size": None, "total_parameters": None, "parallelism": None, "world_size": None,
                "micro_batch_size": None, "seq_length": None, "peak_stage": None, "model_states_bytes": None,
                "activations_bytes": None, "device_peak_bytes": None}
    peak = e.peak_stage
    b, m = peak.bytes, e.model
    return {
        "source": verdict.source, "status": verdict.status, "family": family or "gpt",
        "num_layers": m.num_layers if m else None, "hidden_size": m.hidden_size if m else None,
        "total_parameters": e.total_parameters, "parallelism": dict(e.parallelism), "world_size": e.world_size,
        "micro_batch_size": m.micro_batch_size if m else None, "seq_length": m.seq_length if m else None,
        "peak_stage": peak.pipeline_rank, "model_states_bytes": b.weights + b.gradients + b.optimizer_states,
        "activations_bytes": b.activations, "device_peak_bytes": peak.device_peak_bytes,
    }


def summary_rows(verdicts: Sequence[Verdict]) -> dict:
    """The JSON report's ``summary``: the rows, and the files with the least and the most device
    peak (the first such file on a tie; null when no file was estimated)."""
    rows = [summary_row(v) for v in verdicts]
    estimated = [r for r in rows if r["device_peak_bytes"] is not None]
    least = min(estimated, key=lambda r: r["device_peak_bytes"], default=None)
    most = max(estimated, key=lambda r: r["device_peak_bytes"], default=None)
    return {"rows": rows, "least": least["source"] if least else None, "most": most["source"] if most else None}


def _count(n: int) -> str:
    """``8.03B``, ``124.4M``: a parameter count for the table."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _model(row: dict) -> str:
    """``gpt 8.0B (32x4096)``: family, parameters, layers x hidden; an invalid file's family."""
    if row["total_parameters"] is None:
        return row["family"] or "-"
    shape = f" ({row['num_layers']}x{row['hidden_size']})" if row["num_layers"] is not None else ""
    n = row["total_parameters"]
    size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    return f"{row['family']} {size}{shape}"


def _verdict(row: dict, verdict: Verdict) -> str:
    if verdict.estimate is not None and verdict.estimate.fits is None:
        return "no budget"
    return row["status"].replace("_", " ")


def _cells(row: dict, verdict: Verdict) -> list[str]:
    if row["device_peak_bytes"] is None:
        return [row["source"], _model(row)] + ["-"] * 8 + [_verdict(row, verdict)]
    p = row["parallelism"]
    layout = "/".join("-" if p.get(k) is None else str(p[k]) for k in LAYOUT)
    stage = f" (stage {row['peak_stage']})"
    return [row["source"], _model(row), layout, str(row["world_size"]), str(row["micro_batch_size"]),
            str(row["seq_length"]), _count(row["total_parameters"]), gib(row["model_states_bytes"]),
            gib(row["activations_bytes"]), gib(row["device_peak_bytes"]) + stage, _verdict(row, verdict)]


def _extremes(summary: dict) -> str:
    peaks = {r["source"]: r["device_peak_bytes"] for r in summary["rows"]}
    if summary["least"] is None:
        return "no file was estimated"
    return (f"least memory: {summary['least']} ({gib(peaks[summary['least']])} GiB peak); "
            f"most memory: {summary['most']} ({gib(peaks[summary['most']])} GiB peak)")


def summary_text(verdicts: Sequence[Verdict]) -> str:
    summary = summary_rows(verdicts)
    rows = [_cells(r, v) for r, v in zip(summary["rows"], verdicts)]
    lines = ["summary:"] + ["  " + line for line in _table(rows, HEADER)]
    lines.append("  GiB per GPU, of each file's peak stage (weights+optim: weights, gradients and optimizer states)")
    lines.append("  " + _extremes(summary))
    return "\n".join(lines) + "\n"


def summary_markdown(verdicts: Sequence[Verdict]) -> str:
    summary = summary_rows(verdicts)
    out = ["### Summary", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r, v in zip(summary["rows"], verdicts):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r, v)) + " |")
    out += ["", "GiB per GPU, of each file's peak stage (weights+optim: weights, gradients and optimizer states).",
            "", _extremes(summary)[0].upper() + _extremes(summary)[1:] + "."]
    return "\n".join(out) + "\n"


def render_with_summary(verdicts: Sequence[Verdict], files: Sequence[Verdict], fmt: str,
                        verbose: bool = False) -> str:
    """Every verdict's report (``verdicts``: the settings' problems too, when there are), then the
    summary of the ``files``; JSON: ``{"results": [...], "summary": {...}}``."""
    if fmt == "json":
        import json

        return json.dumps({"results": [verdict_to_json(v) for v in verdicts], "summary": summary_rows(files)},
                          indent=2) + "\n"
    reports = RENDERERS[fmt](verdicts, verbose=verbose) + "\n" if verdicts else ""
    return reports + (summary_markdown(files) if fmt == "markdown" else summary_text(files))
