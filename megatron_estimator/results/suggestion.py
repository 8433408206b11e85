"""Suggestions on refusal as data: the nearest changes that make every stage of a refused
launch fit, each re-estimated through the normal path.

``planner/suggest.py`` builds them; ``report/text.py`` renders them (text, markdown, JSON:
the verdict's ``suggestions`` list).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_estimator.results.estimate import Estimate
from megatron_estimator.results.plan import ProxyBreakdown


@dataclass(frozen=True)
class Suggestion:
    """One change of a refused launch that makes every stage fit."""
    changes: tuple[str, ...]         # what changes, in words ("recompute", "tensor parallel", ...)
    flags: tuple[str, ...]           # Megatron flags to add to (or change on) the input
    remove_flags: tuple[str, ...]    # flags of the input to delete (no flag turns them off)
    peak_stage: int                  # figures of the normal path's estimate with the change
    device_peak_bytes: int
    allocated_peak_bytes: int
    headroom_bytes: int
    cost: ProxyBreakdown             # the planner's throughput proxy of the changed layout
    estimate: Estimate | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {
            "flags": list(self.flags),
            "remove_flags": list(self.remove_flags),
            "changes": list(self.changes),
            "peak_stage": self.peak_stage,
            "device_peak_bytes": self.device_peak_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "headroom_bytes": self.headroom_bytes,
            "cost": self.cost.to_json(),
        }


@dataclass(frozen=True)
class Suggestions:
    """The suggestions for one refused launch, nearest first; ``note`` says why there are none."""
    suggestions: tuple[Suggestion, ...]
    searched: int = 0                # layouts the neighbourhood search tried
    fitting: int = 0                 # of them, those whose every stage fits
    note: str | None = None
