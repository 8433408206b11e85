"""Megatron-Bridge's ``ConfigContainer`` YAML -> Megatron dests, with ``file:line key`` locations.

Facts from NVIDIA-NeMo/Megatron-Bridge (the commit in ``data/frameworks/bridge_mixed_precision.tsv``):

- ``ConfigContainer`` (src/megatron/bridge/training/config.py:962) holds one section per
  dataclass: ``model`` (a ``GPTModelProvider``, a subclass of megatron-core's
  ``TransformerConfig``: its fields are megatron-core's names), ``train`` (``TrainingConfig``:
  ``micro_batch_size``, ``global_batch_size``), ``dataset`` (``seq_length``), ``ddp``
  (megatron-core's ``DistributedDataParallelConfig``), ``optimizer`` (megatron-core's
  ``OptimizerConfig``), ``checkpoint``, ``mixed_precision`` (a registered recipe's name, or a
  ``MixedPrecisionConfig``), and sections that do not change what a GPU holds (``logger``,
  ``scheduler``, ``rng``, ``tokenizer``, ``profiling``...).
- ``ConfigContainer.to_yaml()`` writes each dataclass with a ``_target_`` key, and a dtype or a
  function as ``{_target_: torch.bfloat16, _call_: false}`` (Megatron-LM
  megatron/training/config/yaml_utils.py ``_torch_dtype_representer``, ``_function_representer``).
- Override files and ``key.path=value`` overrides are laid over the container with OmegaConf
  (training/utils/omegaconf_utils.py, scripts/training/run_recipe.py): here with OmegaConf's
  ``merge`` and Hydra's override grammar, never by hand.
- ``mixed_precision`` is applied last: every ``MixedPrecisionConfig`` field, defaults included,
  overwrites the field of that name on the model, optimizer and DDP configs
  (mixed_precision.py ``update_config_with_precision_overrides``).
- ``ConfigContainer.validate`` asserts ``model.seq_length == dataset.seq_length`` (config.py:1644).

Key groups and what an unmapped key is: in ``model``, ``train``, ``ddp``, ``optimizer`` and
``checkpoint``, a key that is a Megatron argument is mapped (checked for its type and choices);
other ``model`` keys that are provider fields (HF ids, generation settings) and the other keys of
``train``, ``dataset``, ``ddp``, ``optimizer`` and ``checkpoint`` are listed as notes: they set
schedules, logging and I/O, not what a GPU holds.  A ``model.activation_func`` the estimator
cannot express, an unknown ``mixed_precision`` recipe, ``peft`` (frozen weights without
gradients, not modelled) and an unknown top-level section are located problems.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

from megatron_estimator.core.hints import closest, describe_value
from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import read_data_text
from megatron_estimator.inputs.detect import BRIDGE_SECTIONS as SECTIONS
from megatron_estimator.inputs.megatron_yaml import _RENAMED, _has_kind, _keys
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.inputs.trees.common import EXTRA, located_leaves, missing_extra, omegaconf_or_none, first_line
from megatron_estimator.inputs.yamlpos import YamlNode, key_location, parse_yaml_with_lines

MAPPED_SECTIONS = ("model", "train", "ddp", "optimizer", "checkpoint")
# The model's shape: without these the file is an override file, laid over a recipe.
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads")

# Bridge field -> Megatron dest where the names differ.
_DDP_RENAMED = {"grad_reduce_in_fp32": "accumulate_allreduce_grads_in_fp32", "bucket_size": "ddp_bucket_size",
                "use_custom_fsdp": "use_megatron_fsdp"}
_MP_RENAMED = {"grad_reduce_in_fp32": "accumulate_allreduce_grads_in_fp32", "fp8_param": "fp8_param_gather",
               "fp4_param": "fp4_param_gather"}
# MixedPrecisionConfig's defaults (mixed_precision.py:41-76), which a recipe overwrites onto the
# configs too; the fields that are Megatron arguments.
_MP_DEFAULTS = {"fp16": False, "bf16": False, "grad_reduce_in_fp32": True, "fp8": None, "fp8_recipe": "tensorwise",
                "first_last_layers_bf16": False, "fp8_param_gather": False, "fp4": None, "fp4_recipe": "nvfp4",
                "fp4_param_gather": False, "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0}
# torch dtypes as Megatron's dtype flags spell them (--main-grads-dtype fp32 ...).
_DTYPES = {"torch.float32": "fp32", "torch.float": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
           "torch.half": "fp16", "torch.uint8": "fp8", "torch.float8_e4m3fn": "fp8"}
# Model fields set from the precision (params_dtype from bf16/fp16) or read by nothing the estimator models.
_DERIVED = {"should_pad_vocab", "params_dtype", "pipeline_dtype", "autocast_dtype", "_target_", "gated_linear_unit",
            "activation_func", "share_embeddings_and_output_weights", "num_query_groups"}


@dataclass(frozen=True)
class BridgeLoad:
    raw: RawArgs
    problems: tuple[Problem, ...]
    notes: tuple[str, ...] = ()
    partial: bool = False                    # an override file: no model shape of its own
    provider: str | None = None              # model._target_
    assumptions: tuple[str, ...] = field(default=())


@lru_cache(maxsize=1)
def mixed_precision_recipes() -> tuple[str, dict[str, tuple[int, dict]]]:
    """(the table's source, {recipe name: (its line in mixed_precision.py, the fields it sets)})."""
    text = read_data_text("frameworks", "bridge_mixed_precision.tsv")
    lines = text.splitlines()
    source = lines[0].lstrip("# ").split(";")[0]
    table = {}
    for line in lines[2:]:
        name, number, fields = line.split("\t")
        table[name] = (int(number), json.loads(fields))
    return source, table


def load_bridge_yaml(path: str, text: str, overrides: Sequence[tuple[str, str]] = (),
                     override_files: Sequence[tuple[str, str]] = (), release: str = "main") -> BridgeLoad:
    """Read ``text`` (the file ``path``), lay ``override_files`` ((name, text), in order) and
    ``overrides`` ((``key.path=value``, its location)) over it with OmegaConf, and map the result."""
    if omegaconf_or_none() is None:
        return BridgeLoad(RawArgs({}, path), (missing_extra(path, "a Megatron-Bridge config"),))
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    problems: list[Problem] = []
    where: dict[tuple[str, ...], str] = {}
    layers = []
    for name, body in ((path, text), *override_files):
        doc = parse_yaml_with_lines(body, name)
        problems.extend(doc.problems)
        if doc.root is None:
            continue
        if not doc.root.is_mapping:
            problems.append(Problem("wrong-type", key_location(name, doc.root.line),
                                    f"a Megatron-Bridge config is a mapping of sections, not {describe_value(doc.root.value)}"))
            continue
        where.update(located_leaves(doc.root, name))
        try:    # OmegaConf parses every ${...} as it builds the tree (its grammar recurses)
            layers.append(OmegaConf.create(doc.root.value))
        except (OmegaConfBaseException, RecursionError) as error:
            message = first_line(error)
            problems.append(Problem("interpolation", name, f"OmegaConf cannot read it: {message}"))
    if problems or not layers:
        return BridgeLoad(RawArgs({}, path), tuple(problems))
    try:
        merged = OmegaConf.merge(*layers)
        problems.extend(_apply_overrides(merged, overrides, where))
        tree = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, RecursionError) as error:
        message = first_line(error)
        return BridgeLoad(RawArgs({}, path), (*problems, Problem("interpolation", path, f"OmegaConf: {message}")))
    mapper = _Mapper(path, where, release)
    mapper.read(tree)
    return BridgeLoad(RawArgs(mapper.settings, path, mapper.absent), (*problems, *mapper.problems),
                      tuple(mapper.notes), mapper.partial, mapper.provider, tuple(mapper.assumptions))


def _apply_overrides(cfg, overrides: Sequence[tuple[str, str]], where: dict) -> list[Problem]:
    """Hydra's override grammar (``a.b=1``, ``+a.b=1``, ``~a.b``), applied with OmegaConf."""
    if not overrides:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    problems = []
    for text, location in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException as error:
            problems.append(Problem("invalid-override", location, f"{text}: {first_line(error)}"))
            continue
        key = override.key_or_group
        if override.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is not None and leaf in node:
                node.pop(leaf)
            continue
        OmegaConf.update(cfg, key, override.value(), merge=True, force_add=True)
        where[tuple(key.split("."))] = f"{location} {key}"
    return problems


def _plain_target(value: Any) -> Any:
    """``{_target_: torch.bfloat16, _call_: false}`` -> ``"torch.bfloat16"``; other values as they are."""
    if isinstance(value, dict) and "_target_" in value and value.get("_call_") is False:
        return value["_target_"]
    return value


class _Mapper:
    def __init__(self, path: str, where: dict, release: str) -> None:
        from megatron_estimator.megatron.flags import flag_table

        self.path = path
        self.where = where
        self.table = flag_table(release)
        self.keys = _keys()
        self.settings: dict[str, RawSetting] = {}
        self.problems: list[Problem] = []
        self.notes: list[str] = []
        self.assumptions: list[str] = []
        self.partial = False
        self.provider: str | None = None

    def loc(self, *key: str) -> str:
        for n in range(len(key), 0, -1):
            found = self.where.get(key[:n])
            if found is not None:
                return found if n == len(key) else f"{found.split(' ', 1)[0]} {'.'.join(key)}"
        return key_location(self.path, 1, ".".join(key))

    def absent(self, dest: str) -> str:
        return key_location(self.path, 1, f"model.{dest}")

    def put(self, dest: str, value: Any, *key: str) -> None:
        spec = self.keys.dests.get(dest)
        name = ".".join(key)
        if value is None:                  # null: the dataclass's None, Megatron's unset
            if spec is not None and spec["kind"] == "bool":
                self.settings[dest] = RawSetting(dest, False, self.loc(*key))
            else:
                self.settings.pop(dest, None)
            return
        if spec is not None:
            if not _has_kind(value, spec["kind"]):
                self.problems.append(Problem("wrong-type", self.loc(*key), f"{name} must be {spec['kind']}, "
                                             f"not {describe_value(value)}"))
                return
            choices = spec.get("choices")
            if choices and value not in choices:
                hint = closest(str(value), [str(c) for c in choices])
                self.problems.append(Problem("invalid-choice", self.loc(*key), f"{name} must be one of "
                                             f"{', '.join(map(str, choices))}, not {value!r}"
                                             + (f"; did you mean {hint}?" if hint else "")))
                return
            if spec["kind"] == "float":
                value = float(value)
        self.settings[dest] = RawSetting(dest, value, self.loc(*key))

    def note(self, keys: list[str], section: str, why: str) -> None:
        if keys:
            self.notes.append(f"{self.path}: {section}: not read ({why}): {', '.join(sorted(keys))}")

    def read(self, tree: dict) -> None:
        for section in tree:
            if section not in SECTIONS and section != "defaults":
                hint = closest(section, SECTIONS)
                self.problems.append(Problem("unknown-key", self.loc(section), f"{section} is not a section of "
                                             "Megatron-Bridge's ConfigContainer (config.py:962)"
                                             + (f"; did you mean {hint}?" if hint else "")))
        model = tree.get("model") or {}
        if not isinstance(model, dict) or any(model.get(k) is None for k in SHAPE_KEYS):
            self.partial = True
            return
        self._model(model)
        for section in ("train", "ddp", "optimizer", "checkpoint"):
            body = tree.get(section) or {}
            if isinstance(body, dict):
                self._plain_section(section, body)
        self._dataset(tree.get("dataset") or {}, model)
        if "max_position_embeddings" not in self.settings and "seq_length" in self.settings:
            # GPTModelProvider.provide builds GPTModel(max_sequence_length=self.seq_length) (gpt_provider.py:298)
            seq = self.settings["seq_length"]
            self.settings["max_position_embeddings"] = RawSetting("max_position_embeddings", seq.value, seq.location)
        self._mixed_precision(tree.get("mixed_precision"))
        if tree.get("peft"):
            self.problems.append(Problem("unsupported-setting", self.loc("peft"), "peft: parameter-efficient "
                                         "fine-tuning (frozen base weights without gradients or optimizer states) is "
                                         "not modelled; the estimate would count the full model's training states"))
        quiet = [s for s in tree if s in SECTIONS and s not in MAPPED_SECTIONS + ("dataset", "mixed_precision", "peft")]
        self.note(quiet, "sections", "schedules, logging, I/O and process setup: nothing a GPU holds")

    def _model(self, model: dict) -> None:
        self.provider = model.get("_target_") if isinstance(model.get("_target_"), str) else None
        unread = []
        for key, value in model.items():
            value = _plain_target(value)
            if key in _DERIVED:
                continue
            dest = _RENAMED.get(key, key)
            if self.table.by_dest(dest) is not None:
                self.put(dest, value, "model", key)
            else:
                unread.append(key)
        self._activation(model)
        if not model.get("should_pad_vocab", False) and "vocab_size" in self.settings:
            # GPTModelProvider.provide pads the vocabulary only when should_pad_vocab (default False,
            # gpt_provider.py:184, 266); Megatron pads to make_vocab_size_divisible_by x tp: 1 keeps it
            # (a multiple of tp, which the vocab-parallel embedding needs anyway)
            self.settings["make_vocab_size_divisible_by"] = RawSetting(
                "make_vocab_size_divisible_by", 1, self.loc("model", "should_pad_vocab"))
            self.assumptions.append("Megatron-Bridge: the vocabulary is model.vocab_size unpadded "
                                    "(GPTModelProvider.should_pad_vocab false, gpt_provider.py:184)")
        groups, heads = model.get("num_query_groups"), model.get("num_attention_heads")
        if groups is not None:
            self.put("group_query_attention", groups != heads, "model", "num_query_groups")
            self.put("num_query_groups", groups, "model", "num_query_groups")
        if "share_embeddings_and_output_weights" in model:
            shared = model["share_embeddings_and_output_weights"]
            if isinstance(shared, bool):
                self.put("untie_embeddings_and_output_weights", not shared, "model", "share_embeddings_and_output_weights")
        self.note(unread, "model", "model-provider fields that are not Megatron arguments: conversion and "
                  "generation settings")

    def _activation(self, model: dict) -> None:
        func = _plain_target(model.get("activation_func"))
        if func is None:
            return
        name = str(func).rsplit(".", 1)[-1]
        gated = model.get("gated_linear_unit", False)
        # megatron-core TransformerConfig: the MLP applies activation_func, gated when gated_linear_unit
        if name == "silu" and gated:
            self.put("swiglu", True, "model", "activation_func")
        elif name == "gelu" and not gated:
            pass                                           # Megatron's default MLP
        elif name in ("squared_relu", "relu2") and not gated:
            self.put("squared_relu", True, "model", "activation_func")
        elif name == "quick_gelu" and gated:
            self.put("quick_geglu", True, "model", "activation_func")
        else:
            self.problems.append(Problem("unsupported-setting", self.loc("model", "activation_func"),
                                         f"activation_func {func} with gated_linear_unit {gated}: no Megatron "
                                         "argument gives this MLP; the estimate would model another"))

    def _plain_section(self, section: str, body: dict) -> None:
        unread = []
        renamed = _DDP_RENAMED if section == "ddp" else {}
        for key, value in body.items():
            value = _plain_target(value)
            dest = renamed.get(key, key)
            if key == "_target_" or self.table.by_dest(dest) is None:
                unread.append(key) if key != "_target_" else None
                continue
            if isinstance(value, str) and value.startswith("torch."):
                if value not in _DTYPES:
                    self.problems.append(Problem("invalid-choice", self.loc(section, key),
                                                 f"{section}.{key}: the dtype {value} has no Megatron spelling"))
                    continue
                value = _DTYPES[value]
            if isinstance(value, (dict, list)) and dest not in ("rampup_batch_size",):
                unread.append(key)
                continue
            self.put(dest, value, section, key)
        self.note(unread, section, "not Megatron arguments the estimate reads")

    def _dataset(self, dataset: dict, model: dict) -> None:
        if not isinstance(dataset, dict):
            return
        seq = dataset.get("seq_length")
        if seq is not None:
            if model.get("seq_length") is not None and model["seq_length"] != seq:
                self.problems.append(Problem("conflict", self.loc("dataset", "seq_length"), f"dataset.seq_length "
                                             f"{seq} differs from model.seq_length {model['seq_length']} "
                                             f"({self.loc('model', 'seq_length')}); Megatron-Bridge's "
                                             "ConfigContainer.validate asserts they match (config.py:1644)"))
            self.put("seq_length", seq, "dataset", "seq_length")
        self.note([k for k in dataset if k not in ("seq_length", "_target_")], "dataset",
                  "data paths and loader settings")

    def _mixed_precision(self, value: Any) -> None:
        if value is None:
            return
        source, table = mixed_precision_recipes()
        if isinstance(value, str):
            found = table.get(value.replace("-", "_"))
            if found is None:
                hint = closest(value, list(table))
                self.problems.append(Problem("invalid-choice", self.loc("mixed_precision"), f"mixed_precision "
                                             f"{value!r} is not a recipe of Megatron-Bridge's mixed_precision.py "
                                             f"({source})" + (f"; did you mean {hint}?" if hint else "")))
                return
            line, fields = found
            fields = {**_MP_DEFAULTS, **fields}
            self.assumptions.append(f"Megatron-Bridge mixed_precision {value!r}: the fields of "
                                    f"src/megatron/bridge/training/mixed_precision.py:{line} ({source}) overwrite "
                                    "the model's, optimizer's and DDP's")
        elif isinstance(value, dict):
            fields = {**_MP_DEFAULTS, **{k: v for k, v in value.items() if k != "_target_"}}
        else:
            self.problems.append(Problem("wrong-type", self.loc("mixed_precision"), "mixed_precision must be a "
                                         f"recipe name or a MixedPrecisionConfig, not {describe_value(value)}"))
            return
        for key, field_value in fields.items():
            dest = _MP_RENAMED.get(key, key)
            if key.startswith(("fp8_", "fp4_")) and not fields.get(key[:3]):
                continue                    # a recipe of a low precision the config does not use
            field_value = _plain_target(field_value)
            if self.table.by_dest(dest) is None or (dest not in self.settings and field_value in (None, False, 0)):
                continue                    # Megatron's default already: nothing to overwrite
            self.put(dest, field_value, "mixed_precision")


_TOP_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:(?:\s|$)", re.MULTILINE)


def skip_reason(text: str) -> str | None:
    """Why ``check --skip-unknown`` passes over a Bridge file: an override file has no model
    shape; without the ``frameworks`` extra no Bridge file can be read."""
    if omegaconf_or_none() is None:
        return f"not checked: reading a Megatron-Bridge config needs pip install '{EXTRA}'"
    model = re.search(r"^model\s*:\s*\n((?:[ \t]+.*\n?|\s*\n)*)", text, re.MULTILINE)
    body = model.group(1) if model else ""
    if all(re.search(rf"^\s+{k}\s*:", body, re.MULTILINE) for k in SHAPE_KEYS):
        return None
    return ("not checked: a Megatron-Bridge override file (no model.num_layers / hidden_size / "
            "num_attention_heads of its own); it is laid over a recipe: check the launch that applies it "
            "(run_recipe.py --recipe NAME --config-file FILE), or the full config "
            "(ConfigContainer.to_yaml(), or the config.yaml Bridge saves with a run)")
