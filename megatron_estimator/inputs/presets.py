"""Named models: the published HuggingFace config.json facts of well-known architectures.

Each preset is a ``data/presets/<name>.json`` file holding the architecture keys of the model's
published ``config.json`` (``_name_or_path`` names the HuggingFace repository they come from).
``load_preset`` maps it exactly as ``hf.load_hf_config`` maps a user's file, with locations
such as ``presets/llama3-8b.json:9 hidden_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.core.resources import data_path

if TYPE_CHECKING:  # the HuggingFace mapping is imported only when a preset is loaded
    from megatron_estimator.inputs.hf import HfImport


def _preset_files() -> dict:
    folder = data_path("presets")
    return {path.stem: path for path in folder.glob("*.json")}


def preset_names() -> tuple[str, ...]:
    """Every preset name, sorted (``deepseek-v3``, ``llama3-8b``, ...)."""
    return tuple(sorted(_preset_files()))


def load_preset(name: str, release: str = "main") -> "HfImport":
    """The Megatron settings of a named model, in release ``release``'s flags; an unknown name
    gives an ``unknown-preset`` problem."""
    from megatron_estimator.inputs.hf import HfImport, parse_hf_config

    files = _preset_files()
    path = files.get(name)
    if path is None:
        from megatron_estimator.core.hints import did_you_mean

        names = sorted(files)
        hint = did_you_mean(name, names)
        problem = Problem(
            "unknown-preset",
            name,
            f"no preset named {name!r}{hint} (known presets: {', '.join(names)})",
        )
        source = f"preset {name}"
        return HfImport(source, None, RawArgs({}, source), (), (), (problem,), ())
    return parse_hf_config(path.read_text(encoding="utf-8"), f"presets/{path.name}", release)
