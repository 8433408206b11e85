"""Rotary position embeddings: where a config keeps RoPE (``rope_theta`` + ``rope_scaling`` or
transformers 5's ``rope_parameters``), the rotary base, and RoPE scaling for standard attention.
Scaling changes positions only, never parameters or memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_estimator.inputs.hf.reader import ConfigReader, is_number, show_value


@dataclass(frozen=True)
class RopeKeys:
    """Where a config keeps RoPE: ``rope_theta`` + ``rope_scaling`` or, from transformers 5,
    one ``rope_parameters`` object.  ``scaling`` is None for plain RoPE."""

    theta_key: str
    theta: Any
    scaling_key: str
    scaling: dict | None
    kind: str
    kind_key: str


def rope_keys(r: ConfigReader, theta_key: str = "rope_theta") -> RopeKeys:
    params = r.config.get("rope_parameters")
    if isinstance(params, dict):
        r.read.add("rope_parameters")
        kind_key = "rope_type" if "rope_type" in params else "type"
        kind = params.get(kind_key, "default")
        return RopeKeys(
            "rope_parameters.rope_theta", params.get("rope_theta"), "rope_parameters",
            None if kind == "default" else params, kind, f"rope_parameters.{kind_key}",
        )
    r.read.add(theta_key)
    scaling = r.raw("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        r.problem(
            "hf-bad-value", "rope_scaling",
            f"rope_scaling must be an object or null, got {show_value(scaling)}",
        )
        scaling = None
    kind_key = "rope_type" if scaling and "rope_type" in scaling else "type"
    kind = "default" if scaling is None else str(scaling.get(kind_key, "default"))
    return RopeKeys(
        theta_key, r.config.get(theta_key), "rope_scaling",
        None if kind == "default" else scaling, kind, f"rope_scaling.{kind_key}",
    )


def supply_rotary_base(r: ConfigReader, rope: RopeKeys, default: float) -> None:
    theta = rope.theta
    if theta is None:
        r.note(
            "hf-default-used", rope.theta_key,
            f"{rope.theta_key} is not in the file; using the {r.class_name} default "
            f"{show_value(default)}",
        )
        theta = default
    if not is_number(theta) or theta <= 0:
        r.problem(
            "hf-bad-value", rope.theta_key,
            f"{rope.theta_key} must be a positive number, got {show_value(theta)}",
        )
        return
    base = int(round(theta))
    if base != theta:
        r.note(
            "hf-approximated", rope.theta_key,
            f"{rope.theta_key} {theta} is not an integer; Megatron's --rotary-base takes an "
            f"integer, {base}",
        )
    r.supply("--rotary-base", base, rope.theta_key)


def supply_rope(r: ConfigReader, default_theta: float, theta_key: str = "rope_theta") -> None:
    """RoPE base and scaling for standard attention.  Scaling changes positions, not memory."""
    rope = rope_keys(r, theta_key)
    supply_rotary_base(r, rope, default_theta)
    scaling = rope.scaling
    if scaling is None:
        return
    factor = scaling.get("factor")
    if rope.kind == "llama3" and is_number(factor):
        # megatron/core/models/common/embeddings/rotary_pos_embedding.py `_apply_scaling`:
        # low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192 are fixed.
        r.supply("--use-rope-scaling", True, rope.kind_key)
        r.supply("--rope-scaling-factor", float(factor), f"{rope.scaling_key}.factor")
        fixed = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}
        differ = [f"{k} {scaling[k]} (Megatron uses {v})" for k, v in fixed.items() if k in scaling and scaling[k] != v]
        if differ:
            r.note(
                "hf-approximated", rope.scaling_key,
                "llama3 RoPE scaling with " + ", ".join(differ) + "; positions only, memory is unchanged",
            )
    elif rope.kind == "linear" and is_number(factor) and float(factor).is_integer():
        r.supply("--rotary-seq-len-interpolation-factor", int(factor), f"{rope.scaling_key}.factor")
    else:
        r.note(
            "hf-not-mapped", rope.scaling_key,
            f"{rope.scaling_key} type {rope.kind!r} is not mapped to a Megatron flag; RoPE scaling "
            f"changes positions only, so parameters and memory are unchanged",
        )
