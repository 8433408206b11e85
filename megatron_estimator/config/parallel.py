"""The parallel dimensions of a Megatron job, and the arithmetic that makes them valid.

One object owns the layout: tensor (tp), pipeline (pp), virtual pipeline (vpp), context (cp),
data (dp), expert (ep), expert tensor (etp) and expert data (edp) parallel sizes and the world
size they multiply into.  ``ParallelDims.check`` explains a bad product with its arithmetic,
the way Megatron's ``validate_args`` and ``parallel_state.initialize_model_parallel`` reject
it (megatron/training/arguments.py, megatron/core/parallel_state.py):

    world % (tp * pp * cp) == 0, dp = world // (tp * pp * cp)
    world % (etp * ep * pp) == 0, edp = world // (etp * ep * pp)

This module imports nothing of the project's but ``errors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from megatron_estimator.core.problems import Problem


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vpp: int | None = None

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.world_size // self.model_parallel_size

    @property
    def expert_model_parallel_size(self) -> int:
        return self.etp * self.ep * self.pp

    @property
    def edp(self) -> int:
        return self.world_size // self.expert_model_parallel_size

    @property
    def virtual_stages(self) -> int:
        return self.vpp or 1

    def as_dict(self) -> dict:
        return {
            "tp": self.tp, "pp": self.pp, "vpp": self.vpp, "cp": self.cp, "dp": self.dp,
            "ep": self.ep, "etp": self.etp, "edp": self.edp,
        }

    @staticmethod
    def check(
        world_size: int,
        tp: int,
        pp: int,
        cp: int,
        ep: int,
        etp: int,
        location: Callable[[str], str],
        world_size_source: str = "world size",
    ) -> list[Problem]:
        """Every way these sizes fail to tile ``world_size``, each with its arithmetic.

        ``location(dest)`` names where a size was set (a flag or ``file:line key``).
        """
        problems: list[Problem] = []
        dense = tp * pp * cp
        if dense and world_size % dense:
            problems.append(Problem(
                "world-size-not-divisible",
                location("tensor_model_parallel_size"),
                f"tp({tp}) x pp({pp}) x cp({cp}) = {dense} does not divide world size "
                f"{world_size} ({world_size_source}); the data-parallel size would be "
                f"{world_size}/{dense} = {world_size / dense:g}",
            ))
        expert = etp * ep * pp
        # With the default etp = tp and no expert parallelism the expert layout repeats the
        # dense one; report it only when it says something new.
        repeats_dense = problems and expert == dense
        if expert and world_size % expert and not repeats_dense:
            problems.append(Problem(
                "expert-world-size-not-divisible",
                location("expert_model_parallel_size"),
                f"etp({etp}) x ep({ep}) x pp({pp}) = {expert} does not divide world size "
                f"{world_size} ({world_size_source}); the expert data-parallel size would be "
                f"{world_size}/{expert} = {world_size / expert:g}",
            ))
        return problems

    @staticmethod
    def smallest_world(tp: int, pp: int, cp: int, ep: int, etp: int) -> int:
        """The smallest world size both the dense and the expert layout tile (dp = 1 when ep fits)."""
        import math

        return math.lcm(tp * pp * cp, etp * ep * pp)
