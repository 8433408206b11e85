"""Raw input, before validation: the Megatron settings a user gave and where each came from.

Every input format (command-line flags, the seed YAML format, Megatron's ``--yaml-cfg``,
launch scripts, HuggingFace configs) is read into a ``RawArgs``: Megatron argument *dests*
(``tensor_model_parallel_size``) mapped to the value given, each with the location to name in
a message (``--tensor-model-parallel-size`` or ``train.yaml:7 parallelism.tensor_model_parallel_size``).
Defaults are not filled in here; validation and configuration do that from the flag table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class RawSetting:
    dest: str
    value: Any
    location: str


@dataclass(frozen=True)
class RawArgs:
    settings: Mapping[str, RawSetting] = field(default_factory=dict)
    source: str = "command line"
    # Where a setting that was not given (or not usable) would go, in the input's own terms
    # (``train.yaml:3 model.hidden_size``); None: the flag (``--hidden-size``).
    absent: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    # Dests given with a value that cannot be known statically (a launch script's ``$CKPT``),
    # already reported or noticed where it was read: not "missing".
    opaque: frozenset = frozenset()
    # Other models an RL framework keeps on the GPU beside this one (inputs/co_resident.py).
    co_resident: tuple = ()

    def given(self, dest: str) -> bool:
        return dest in self.settings

    def value(self, dest: str, default: Any = None) -> Any:
        setting = self.settings.get(dest)
        return default if setting is None else setting.value

    def location(self, dest: str, fallback: str | None = None) -> str:
        setting = self.settings.get(dest)
        if setting is not None:
            return setting.location
        if fallback is not None:
            return fallback
        return self.absent(dest) if self.absent is not None else "--" + dest.replace("_", "-")

    def merged(self, other: "RawArgs") -> "RawArgs":
        """These settings with ``other``'s laid over them (``other`` wins)."""
        settings = dict(self.settings)
        settings.update(other.settings)
        return RawArgs(settings, other.source if other.settings else self.source, other.absent or self.absent,
                       (self.opaque | other.opaque) - frozenset(other.settings),
                       self.co_resident + other.co_resident)
