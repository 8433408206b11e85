"""Reading a config.json file and choosing the mapper for its ``model_type``.

``load_hf_config(source)`` reads a local file (or the ``config.json`` inside a directory), an
inline JSON object or a hub model id (``source.py``: which form an argument is, and the
reading); ``parse_hf_config(text, source)`` maps its text.  Neither raises on bad input:
problems come back in the ``HfImport``.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from megatron_estimator.core.problems import Problem
from megatron_estimator.megatron.releases import NEWEST
from megatron_estimator.core.resources import parse_bound_error
from megatron_estimator.inputs.hf.decoder import FAMILIES, map_decoder
from megatron_estimator.inputs.hf.deepseek import map_deepseek
from megatron_estimator.inputs.hf.glm import map_glm4_moe
from megatron_estimator.inputs.hf.gpt import map_gpt2, map_gpt_neox
from megatron_estimator.inputs.hf.gpt_oss import map_gpt_oss
from megatron_estimator.inputs.hf.nemotron import map_nemotron_h
from megatron_estimator.inputs.hf.qwen3_next import map_qwen3_next
from megatron_estimator.inputs.hf.reader import ConfigReader, key_lines, pairs_hook, show_value
from megatron_estimator.inputs.hf.result import HfImport, failed_import
from megatron_estimator.inputs.hf.source import read_hf_source


SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "glm4_moe",
    "gpt2",
    "gpt_neox",
    "gpt_oss",
    "kimi_k2",
    "llama",
    "mistral",
    "mixtral",
    "nemotron_h",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
)


MAPPERS: dict[str, Callable[[ConfigReader], None]] = {
    **{name: map_decoder for name in FAMILIES},
    "deepseek_v2": map_deepseek,
    "deepseek_v3": map_deepseek,
    "deepseek_v32": map_deepseek,
    "glm4_moe": map_glm4_moe,
    "gpt2": map_gpt2,
    "gpt_neox": map_gpt_neox,
    "gpt_oss": map_gpt_oss,
    "kimi_k2": map_deepseek,
    "nemotron_h": map_nemotron_h,
    "qwen3_next": map_qwen3_next,
}


def load_hf_config(source: str | os.PathLike, release: str = NEWEST) -> HfImport:
    """Read a config.json into Megatron settings: a local file (or the one inside a directory),
    an inline JSON object, or a hub model id ``OWNER/NAME[@REVISION]`` (``source.py`` says how
    the form is decided).  ``release``: the label of the release whose flags it is written in."""
    text, where, problem = read_hf_source(source)
    if problem is not None:
        return failed_import(where, problem)
    return parse_hf_config(text, where, release)


def parse_hf_config(text: str, source: str, release: str = NEWEST) -> HfImport:
    """Map config.json text to Megatron settings; ``source`` names the file in locations."""
    duplicates: list[str] = []
    try:
        config = json.loads(text, object_pairs_hook=pairs_hook(duplicates))
    except json.JSONDecodeError as error:
        return failed_import(
            source,
            Problem(
                "hf-malformed-json",
                f"{source}:{error.lineno}",
                f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})",
            ),
        )
    except (RecursionError, ValueError) as error:      # a parser bound: nesting, integer digits
        bound = parse_bound_error(error, text)
        if bound is None:
            raise
        return failed_import(source, Problem("hf-malformed-json", f"{source}:{bound[0]}", f"cannot read: {bound[1]}"))
    if not isinstance(config, dict):
        return failed_import(
            source,
            Problem("hf-malformed-json", f"{source}:1", "a config.json holds one JSON object {...}"),
        )
    reader = ConfigReader(config, key_lines(text), source, release)
    for key in duplicates:
        reader.note(
            "hf-duplicate-key", key,
            f"{key} appears more than once; the last value is used (as HuggingFace does)",
        )

    model_type = config.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        reader.problem(
            "hf-missing-key", "",
            f"model_type is missing, so the architecture is unknown; supported model types: {supported}",
        )
    elif not isinstance(model_type, str):
        reader.problem(
            "hf-bad-value", "model_type",
            f"model_type must be a string, got {show_value(model_type)}",
        )
    elif model_type not in MAPPERS:
        reader.problem(
            "unsupported-hf-model", "model_type",
            f"{source} describes model_type {model_type!r}, which this importer does not map; "
            f"supported model types: {supported}",
        )
    else:
        MAPPERS[model_type](reader)
        reader.note_unread_keys()
    return reader.result(reader.model_type)
