"""Other models an RL job keeps on the actor's GPUs while the actor trains.

A framework's reader (``inputs/trees/verl.py``, ...) says which models share the GPU and which of
their states stay there during the actor's update; the memory model (``model/co_resident.py``)
sizes them with the actor's shape under their own parallel layout.  Each carries the framework
source that says so, for the report's assumption line.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoResident:
    """A model beside the trained actor: its own tensor / pipeline layout and which of its states
    stay on the GPU while the actor trains (all False: offloaded, nothing counted)."""

    role: str                 # "reference model", "critic"
    tp: int
    pp: int
    weights: bool             # its parameters (params dtype)
    gradients: bool = False   # its main-grad buffer (a trained model: the critic)
    optimizer: bool = False   # its optimizer states
    source: str = ""          # the framework's file:line that says so
    location: str = ""        # the config key that sets it

    @property
    def on_gpu(self) -> bool:
        return self.weights or self.gradients or self.optimizer
