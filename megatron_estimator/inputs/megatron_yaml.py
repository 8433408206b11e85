"""Megatron's own ``--yaml-cfg`` format -> Megatron dests, with ``file:line key`` locations.

Facts from megatron/training/yaml_arguments.py and arguments.py (Megatron-LM d98e8a64):

- The YAML REPLACES the command line.  ``parse_args`` still parses every flag (an unknown
  flag or a bad value still stops the launch), then, when ``--yaml-cfg`` is given, throws the
  whole namespace away for the YAML's (``load_yaml``); only RANK and WORLD_SIZE come from the
  environment afterwards.  ``flags_ignored_by_yaml_cfg`` names the flags that lose their
  effect, so a front end can say so.
- Sections: ``language_model:`` holds TransformerConfig fields, ``model_parallel:``
  ModelParallelConfig fields, every other top-level key is a training argument named by its
  argparse dest.  ``validate_yaml`` merges the three into one namespace with
  ``SimpleNamespace(**a, **b)``, so a key given in two of them is a TypeError
  (``duplicate-across-sections`` here).  It reads some keys from one section only: the
  parallel sizes, ``sequence_parallel``, ``fp16``/``bf16`` and ``tp_comm_overlap`` from
  ``model_parallel:``; ``num_layers``, ``hidden_size``, ``num_attention_heads`` and
  ``activation_func`` from ``language_model:`` (``missing-key`` when absent there).
- Derived values: ``activation_func`` (swiglu | squaredrelu | gelu, asserted) sets the MLP:
  swiglu is gated whatever ``gated_linear_unit`` says, the others take ``gated_linear_unit``;
  the top-level ``swiglu``/``squared_relu``/``group_query_attention`` keys do not shape the
  model (only FLOP and memory reports read them).  ``num_query_groups`` goes straight into
  TransformerConfig (no ``group_query_attention`` gate, unlike the flags): null means one
  group per head.  ``num_moe_experts`` is Megatron's ``num_experts``; the virtual pipeline
  size comes only from ``num_layers_per_virtual_pipeline_stage`` (validate_yaml overwrites
  ``model_parallel.virtual_pipeline_model_parallel_size``); ``params_dtype`` is derived from
  ``fp16``/``bf16``; ``encoder_num_layers`` / ``encoder_seq_length`` stand in for a null
  ``num_layers`` / ``seq_length`` (both set is an error).
- ``${VAR}`` is NOT expanded.  yaml_arguments.py registers a ``${...}`` resolver with
  ``yaml.add_implicit_resolver``/``add_constructor`` without a Loader, which PyYAML applies
  to ``yaml.Loader``, ``FullLoader`` and ``UnsafeLoader`` only, and ``load_yaml`` parses with
  ``yaml.safe_load`` (SafeLoader).  So ``seq_length: ${SEQ}`` reaches Megatron as the string
  ``'${SEQ}'``.  Where such a string stands for a number, a boolean or a choice this is a
  problem ``env-not-expanded`` naming the variable (and its value in ``environ``, if set);
  for a string-valued key it is a notice.

What is reported: unknown keys (``unknown-key``, with did-you-mean against the section's
known keys, or the section the key belongs in), values of the wrong type for their argparse
dest (``wrong-type``; YAML 1.1 reads ``1e-5`` as a string), values outside the flag's
choices (``invalid-choice``), Megatron's own required keys and conflicts.  ``null`` for a
boolean reads as false (Megatron only tests truthiness); ``null`` elsewhere leaves the key
unset.  Megatron does not reject unknown keys (they just land in the namespace); reporting
them is this tool's choice, because a misspelled key silently changes nothing.

Notices (``MegatronYamlLoad.notices``) are facts worth telling that do not stop a launch:
keys Megatron overwrites or ignores, keys retired from Megatron, unexpanded ``${VAR}`` in
string values, and TransformerConfig fields the file leaves out (at this commit
``core_transformer_config_from_yaml`` raises for each missing one).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.core.hints import KIND_WORDS, closest, describe_value as _describe, yaml_float_hint as _float_hint
from megatron_estimator.inputs.yamlpos import YamlNode, key_location, load_yaml_with_lines

KEYS_PATH = Path(__file__).resolve().parents[1] / "data" / "megatron_yaml_keys.json"

LANGUAGE_MODEL = "language_model"
MODEL_PARALLEL = "model_parallel"
SECTIONS = (LANGUAGE_MODEL, MODEL_PARALLEL)

# Section fields whose Megatron dest has another name (argument_utils.py
# core_transformer_config_from_args, yaml_arguments.py validate_yaml).
_RENAMED = {
    "num_moe_experts": "num_experts",
    "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
    "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
    "fp8_param": "fp8_param_gather",
    "fp4_param": "fp4_param_gather",
}
_FIELD_OF_DEST = {dest: field_name for field_name, dest in _RENAMED.items()}
# Read by core_transformer_config_from_yaml from language_model but not a TransformerConfig field.
_EXTRA_LANGUAGE_MODEL = ("bias_swiglu_fusion",)
# Section fields that Megatron overwrites (validate_yaml, core_transformer_config_from_yaml):
# key -> (the value that changes nothing, what Megatron puts there instead).
_OVERWRITTEN = {
    "virtual_pipeline_model_parallel_size": (None, "validate_yaml derives it from the top-level "
                                                   "num_layers_per_virtual_pipeline_stage"),
    "params_dtype": (None, "validate_yaml derives it from model_parallel.fp16 / bf16"),
    "pipeline_dtype": (None, "core_transformer_config_from_yaml sets it to params_dtype"),
    "variable_seq_lengths": (False, "validate_yaml sets it to false"),
}
# Top-level keys that do not shape the model in the YAML path, and what does instead.
_NOT_FOR_THE_MODEL = {
    "swiglu": "language_model.activation_func",
    "squared_relu": "language_model.activation_func",
    "quick_geglu": "language_model.activation_func",
    "openai_gelu": "language_model.activation_func",
    "group_query_attention": "language_model.num_query_groups",
}
# Config fields that validate_yaml reads at the top level.
_TOP_LEVEL_READS = ("account_for_embedding_in_pipeline_split",)
# Top-level keys of the shipped example that are no longer Megatron arguments.
_RETIRED = ("use_legacy_models", "standalone_embedding_stage")

ACTIVATIONS = ("swiglu", "squaredrelu", "gelu")      # yaml_arguments.py asserts these

# Keys validate_yaml reads unconditionally from one place (AttributeError when absent there)
# and that matter for the model; None values are rejected for the first group too.
_REQUIRED = {
    LANGUAGE_MODEL: ("num_layers", "hidden_size", "num_attention_heads", "activation_func"),
    MODEL_PARALLEL: ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                     "context_parallel_size", "expert_model_parallel_size", "sequence_parallel",
                     "tp_comm_overlap", "fp16", "bf16"),
}
_NOT_NULL = {"num_layers", "hidden_size", "num_attention_heads", "activation_func",
             "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
             "expert_model_parallel_size", "micro_batch_size"}

_ENV = re.compile(r"\$\{(.*?)\}")


@dataclass(frozen=True)
class MegatronYamlLoad:
    raw: RawArgs
    problems: tuple[Problem, ...]
    notices: tuple[Problem, ...] = field(default=())


@dataclass(frozen=True)
class _Keys:
    model_parallel: frozenset[str]
    language_model: frozenset[str]          # TransformerConfig (not ModelParallelConfig) + MLA + extras
    transformer_fields: tuple[str, ...]     # every TransformerConfig field, for completeness notices
    dests: Mapping[str, Mapping[str, Any]]


@lru_cache(maxsize=1)
def _keys() -> _Keys:
    data = json.loads(KEYS_PATH.read_text(encoding="utf-8"))
    return _Keys(
        model_parallel=frozenset(data["model_parallel"]),
        language_model=frozenset(data["language_model"] + data["mla"] + list(_EXTRA_LANGUAGE_MODEL)),
        transformer_fields=tuple(data["model_parallel"] + data["language_model"]),
        dests=data["dests"],
    )


# --- the command line under --yaml-cfg -------------------------------------------------------

def yaml_cfg_path(argv: Sequence[str]) -> str | None:
    """The value of ``--yaml-cfg`` in a training script's arguments (the last one wins, as in argparse)."""
    path = None
    for i, token in enumerate(argv):
        if token == "--yaml-cfg" and i + 1 < len(argv):
            path = argv[i + 1]
        elif token.startswith("--yaml-cfg="):
            path = token.split("=", 1)[1]
    return path


def flags_ignored_by_yaml_cfg(argv: Sequence[str]) -> tuple[str, ...]:
    """The flags in ``argv`` whose values Megatron discards because ``--yaml-cfg`` is given.

    Megatron parses the command line first (unknown flags and bad values still abort), then
    replaces the namespace with the YAML (megatron/training/arguments.py ``parse_args``), so
    every flag but ``--yaml-cfg`` itself loses its effect.  Returns them as spelled, in order,
    without values; empty when ``--yaml-cfg`` is absent.
    """
    if yaml_cfg_path(argv) is None:
        return ()
    ignored = []
    skip_next = False
    for token in argv:
        if skip_next:
            skip_next = False
            continue
        if token == "--yaml-cfg":
            skip_next = True
            continue
        if token.startswith("--yaml-cfg="):
            continue
        if token.startswith("--") and len(token) > 2:
            ignored.append(token.split("=", 1)[0])
    return tuple(ignored)


# --- the file ---------------------------------------------------------------------------------

def load_megatron_yaml(path: str | Path, environ: Mapping[str, str] | None = None) -> MegatronYamlLoad:
    """Read a ``--yaml-cfg`` file into Megatron dests; every problem is returned, none raised."""
    name = str(path)
    doc = load_yaml_with_lines(path)
    if doc.root is None:
        problems = doc.problems or (Problem(
            "empty-file", key_location(name, 1),
            "the file is empty; a --yaml-cfg file needs language_model: and model_parallel: "
            "sections and top-level training keys"),)
        return MegatronYamlLoad(RawArgs({}, name), tuple(problems))
    reader = _Reader(doc.root, name, os.environ if environ is None else environ)
    reader.read()
    problems = list(doc.problems) + [p for _, p in sorted(reader.problems, key=lambda item: item[0])]
    notices = [p for _, p in sorted(reader.notices, key=lambda item: item[0])]
    return MegatronYamlLoad(RawArgs(reader.settings, name, reader.absent_location), tuple(problems), tuple(notices))


class _Reader:
    def __init__(self, root: YamlNode, name: str, environ: Mapping[str, str]) -> None:
        self.root = root
        self.name = name
        self.environ = environ
        self.keys = _keys()
        self.settings: dict[str, RawSetting] = {}
        self.problems: list[tuple[int, Problem]] = []
        self.notices: list[tuple[int, Problem]] = []

    # where and what to report
    def loc(self, node: YamlNode, key_path: str) -> str:
        return key_location(self.name, node.line, key_path)

    def problem(self, code: str, node: YamlNode, key_path: str, message: str) -> None:
        self.problems.append((node.line, Problem(code, self.loc(node, key_path), message)))

    def notice(self, code: str, node: YamlNode, key_path: str, message: str) -> None:
        self.notices.append((node.line, Problem(code, self.loc(node, key_path), message)))

    def put(self, dest: str, value: Any, node: YamlNode, key_path: str) -> None:
        self.settings[dest] = RawSetting(dest, value, self.loc(node, key_path))

    def absent_location(self, dest: str) -> str:
        """Where a Megatron setting that the file does not give (or gives unusably) goes: its
        key in its section (or at the top level), as the file's own problems name it."""
        key = _FIELD_OF_DEST.get(dest, dest)
        root = self.root
        for section in SECTIONS:
            if key in (self.keys.language_model if section == LANGUAGE_MODEL else self.keys.model_parallel):
                node = root.entries.get(section) if root.is_mapping else None
                if node is None or not node.is_mapping:
                    return self.loc(node or root, section)
                return self.loc(node.entries.get(key, node), f"{section}.{key}")
        node = root.entries.get(key) if root.is_mapping else None
        return self.loc(node or root, key)

    # the walk
    def read(self) -> None:
        root = self.root
        if not root.is_mapping:
            self.problem("wrong-type", root, "", "the top level of a --yaml-cfg file must be a mapping, "
                         f"not {_describe(root.value)}")
            return
        sections: dict[str, dict[str, YamlNode]] = {}
        for section in SECTIONS:
            node = root.entries.get(section)
            if node is None:
                self.problem("missing-key", root, section,
                             f"the {section}: section is missing; Megatron's validate_yaml reads it")
            elif not node.is_mapping:
                self.problem("wrong-type", node, section,
                             f"{section}: must be a mapping of fields, not {_describe(node.value)}")
            else:
                sections[section] = dict(node.entries)
        top = {k: v for k, v in root.entries.items() if k not in SECTIONS}

        self._check_collisions(top, sections)
        for section, entries in sections.items():
            for key, node in entries.items():
                self._section_key(section, key, node)
        for key, node in top.items():
            self._top_level_key(key, node)
        self._required(sections, top)
        self._derived(sections, top)
        self._completeness(sections)

    def _check_collisions(self, top, sections) -> None:
        known = self.keys.language_model | self.keys.model_parallel
        places = [("the top level", top)] + [(f"{s}:", sections.get(s, {})) for s in SECTIONS]
        for i, (here, entries) in enumerate(places[1:], start=1):
            for key, node in entries.items():
                if key not in known:
                    continue                        # reported as unknown-key
                for there, other in places[:i]:
                    if key in other:
                        self.problem(
                            "duplicate-across-sections", node, f"{SECTIONS[i - 1]}.{key}",
                            f"{key} is given both here and at {there} (line {other[key].line}); Megatron "
                            "merges the sections into one namespace (megatron/training/yaml_arguments.py) "
                            "and a key in two of them is a TypeError there")

    def _section_key(self, section: str, key: str, node: YamlNode) -> None:
        key_path = f"{section}.{key}"
        keys = self.keys
        known_here = keys.language_model if section == LANGUAGE_MODEL else keys.model_parallel
        known_other = keys.model_parallel if section == LANGUAGE_MODEL else keys.language_model
        if key not in known_here and key not in known_other:
            self.problem("unknown-key", node, key_path, self._unknown(key, section))
            return
        if key in _OVERWRITTEN:
            no_op, instead = _OVERWRITTEN[key]
            if node.value is not no_op:
                self.notice("ignored-key", node, key_path, f"{key} is ignored: {instead}")
            return
        if key == "activation_func":
            self._activation(node, key_path)
            return
        if key == "gated_linear_unit":
            if not isinstance(node.value, bool) and node.value is not None:
                self.problem("wrong-type", node, key_path,
                             f"gated_linear_unit must be true or false, not {_describe(node.value)}")
            return                                  # resolved with activation_func in _derived
        if key == "num_query_groups":
            if self._typed("num_query_groups", node, key_path):
                if node.value is None:
                    self.put("group_query_attention", False, node, key_path)
                else:
                    self.put("group_query_attention", True, node, key_path)
                    self.put("num_query_groups", node.value, node, key_path)
            return
        if key == "persist_layer_norm":
            if isinstance(node.value, bool):
                self.put("no_persist_layer_norm", not node.value, node, key_path)
            return
        dest = _RENAMED.get(key, key)
        if dest in keys.dests:
            self._map(dest, node, key_path)
        else:
            self._env_notice(node, key_path)

    def _top_level_key(self, key: str, node: YamlNode) -> None:
        keys = self.keys
        if key in _RETIRED:
            self.notice("retired-key", node, key,
                        f"{key} is no longer a Megatron argument at this version; Megatron ignores it")
            return
        is_field = key in keys.language_model or key in keys.model_parallel
        if key not in keys.dests and not is_field:
            self.problem("unknown-key", node, key, self._unknown(key, None))
            return
        if key in _NOT_FOR_THE_MODEL:
            self._env_notice(node, key)
            self.notice("ignored-key", node, key,
                        f"{key} does not shape the model under --yaml-cfg: {_NOT_FOR_THE_MODEL[key]} does "
                        "(core_transformer_config_from_yaml); Megatron reads this key only for its FLOP "
                        "and memory reports")
            return
        if is_field and key not in _TOP_LEVEL_READS:
            home = LANGUAGE_MODEL if key in keys.language_model else MODEL_PARALLEL
            self.notice("wrong-section", node, key,
                        f"{key} is a TransformerConfig field: core_transformer_config_from_yaml reads it "
                        f"only from {LANGUAGE_MODEL}: and {MODEL_PARALLEL}:, so the model config does not see "
                        f"this top-level value (other code reading args.{key} does); move it under {home}:")
        if key in keys.dests:
            self._map(key, node, key)

    def _unknown(self, key: str, section: str | None) -> str:
        keys = self.keys
        where = f"in section {section}" if section else "at the top level"
        message = f"unknown key {key} {where}"
        if section and key in keys.dests:
            return f"{message}: {key} is a top-level training argument, not a {section} field"
        if section is None:
            for home, known in ((LANGUAGE_MODEL, keys.language_model), (MODEL_PARALLEL, keys.model_parallel)):
                if key in known:
                    return f"{message}: {key} belongs under {home}:"
        if section == LANGUAGE_MODEL:
            own, others = keys.language_model | keys.model_parallel, keys.dests.keys()
        elif section == MODEL_PARALLEL:
            own, others = keys.model_parallel | keys.language_model, keys.dests.keys()
        else:
            own, others = keys.dests.keys(), keys.language_model | keys.model_parallel
        match = closest(key, own, cutoff=0.75)
        if match is not None:
            return f"{message}; did you mean {match}?"
        match = closest(key, others, cutoff=0.75)
        if match is not None:
            home = "at the top level" if match in keys.dests else (
                f"under {LANGUAGE_MODEL}:" if match in keys.language_model else f"under {MODEL_PARALLEL}:")
            return f"{message}; did you mean {match} ({home})?"
        return message

    # values
    def _map(self, dest: str, node: YamlNode, key_path: str) -> None:
        if not self._typed(dest, node, key_path):
            return
        spec = self.keys.dests[dest]
        value = node.value
        if value is None:
            if spec["kind"] == "bool":
                self.put(dest, False, node, key_path)
            return
        self._env_notice(node, key_path)
        if spec.get("list") and not isinstance(value, list):
            # argparse's nargs gives a list; validate_yaml splits a data_path string on whitespace.
            value = value.split() if dest == "data_path" and isinstance(value, str) else [value]
        if spec["kind"] == "float":
            value = [float(v) for v in value] if isinstance(value, list) else float(value)
        self.put(dest, value, node, key_path)

    def _typed(self, dest: str, node: YamlNode, key_path: str) -> bool:
        """Report a value that Megatron's argparse type for ``dest`` would not produce."""
        spec = self.keys.dests[dest]
        value = node.value
        key = key_path.rsplit(".", 1)[-1]
        if value is None:
            return True
        kind = spec["kind"]
        items = value if isinstance(value, list) and spec.get("list") else [value]
        choices = spec.get("choices")
        for item in items:
            env = _ENV.findall(item) if isinstance(item, str) else []
            if env and (kind != "str" or choices):
                wanted = "one of " + ", ".join(map(str, choices)) if choices else _KIND_TEXT[kind]
                self.problem("env-not-expanded", node, key_path, self._env_message(key, item, env, wanted))
                return False
            if not _has_kind(item, kind):
                self.problem("wrong-type", node, key_path,
                             f"{key} must be {_KIND_TEXT[kind]}, not {_describe(item)}{_float_hint(item)}")
                return False
            if choices and item not in choices:
                match = closest(str(item), [str(c) for c in choices])
                hint = f"; did you mean {match}?" if match else ""
                self.problem("invalid-choice", node, key_path,
                             f"{key} must be one of {', '.join(map(str, choices))}, not {item!r}{hint}")
                return False
        return True

    def _env_message(self, key: str, value: str, names: list[str], wanted: str) -> str:
        states = []
        for name in names:
            states.append(f"{name} is {self.environ[name]!r} here" if name in self.environ else f"{name} is not set here")
        return (f"Megatron will not expand {value!r}: load_yaml parses with yaml.safe_load, and the ${{...}} "
                "resolver in megatron/training/yaml_arguments.py is registered only on yaml.Loader, "
                f"FullLoader and UnsafeLoader, so {key} would be that string, not {wanted} "
                f"({'; '.join(states)}); write the value itself")

    def _env_notice(self, node: YamlNode, key_path: str) -> None:
        if isinstance(node.value, str):
            names = _ENV.findall(node.value)
            if names:
                key = key_path.rsplit(".", 1)[-1]
                self.notice("env-not-expanded", node, key_path,
                            f"{key} stays the literal string {node.value!r}: Megatron parses the file "
                            "with yaml.safe_load, which does not expand ${...}")

    def _activation(self, node: YamlNode, key_path: str) -> None:
        value = node.value
        if value is None:
            return                                  # reported by _required
        if value not in ACTIVATIONS:
            if isinstance(value, str) and _ENV.findall(value):
                self.problem("env-not-expanded", node, key_path,
                             self._env_message("activation_func", value, _ENV.findall(value),
                                               "one of " + ", ".join(ACTIVATIONS)))
                return
            match = closest(str(value), ACTIVATIONS)
            hint = f"; did you mean {match}?" if match else ""
            self.problem("invalid-choice", node, key_path,
                         f"activation_func must be one of {', '.join(ACTIVATIONS)} "
                         f"(megatron/training/yaml_arguments.py asserts it), not {value!r}{hint}")
            return
        self.put("swiglu", value == "swiglu", node, key_path)
        self.put("squared_relu", value == "squaredrelu", node, key_path)

    # rules that need several keys
    def _required(self, sections, top) -> None:
        for section, names in _REQUIRED.items():
            if section not in sections:
                continue
            entries = sections[section]
            section_node = self.root.entries[section]
            for key in names:
                node = entries.get(key)
                if node is None:
                    if key == "num_layers" and _given(top.get("encoder_num_layers")):
                        continue
                    elsewhere = [f"{s}:" for s in SECTIONS if s != section and key in sections.get(s, {})]
                    elsewhere += ["the top level"] if key in top else []
                    found = f" (it is at {elsewhere[0]}, where Megatron does not read it)" if elsewhere else ""
                    self.problem("missing-key", section_node, f"{section}.{key}",
                                 f"{section}.{key} is missing{found}; Megatron's validate_yaml reads it")
                elif node.value is None and key in _NOT_NULL and not (
                        key == "num_layers" and _given(top.get("encoder_num_layers"))):
                    self.problem("missing-key", node, f"{section}.{key}",
                                 f"{key} is null; Megatron requires a value")
        mbs = top.get("micro_batch_size")
        if mbs is None:
            self.problem("missing-key", self.root, "micro_batch_size",
                         "micro_batch_size is missing; Megatron's validate_yaml asserts it is set")
        elif mbs.value is None:
            self.problem("missing-key", mbs, "micro_batch_size", "micro_batch_size is null; Megatron requires a value")
        if not _given(top.get("seq_length")) and not _given(top.get("encoder_seq_length")):
            node = top.get("seq_length", self.root)
            self.problem("missing-key", node, "seq_length",
                         "seq_length (or encoder_seq_length) is missing or null; Megatron's validate_yaml needs one")

    def _derived(self, sections, top) -> None:
        lm = sections.get(LANGUAGE_MODEL, {})
        # encoder_num_layers / encoder_seq_length stand in for null num_layers / seq_length.
        for primary, primary_path, stand_in in (
                (lm.get("num_layers"), "language_model.num_layers", "encoder_num_layers"),
                (top.get("seq_length"), "seq_length", "encoder_seq_length")):
            other = top.get(stand_in)
            if _given(primary) and _given(other):
                self.problem("conflicting-keys", other, stand_in,
                             f"{stand_in} and {primary_path} (line {primary.line}) are both set; "
                             "Megatron's validate_yaml allows only one")
            elif _given(other) and not _given(primary) and stand_in in self.settings:
                dest = primary_path.rsplit(".", 1)[-1]
                self.settings[dest] = RawSetting(dest, other.value, self.loc(other, stand_in))
        # gated_linear_unit only counts for gelu and squaredrelu; swiglu is always gated.
        act, gated = lm.get("activation_func"), lm.get("gated_linear_unit")
        if act is not None and gated is not None and act.value in ACTIVATIONS:
            path = "language_model.gated_linear_unit"
            if act.value == "swiglu" and gated.value is False:
                self.notice("ignored-key", gated, path,
                            "activation_func: swiglu always makes the MLP gated; gated_linear_unit: false is ignored")
            elif act.value != "swiglu" and gated.value is True:
                self.problem("unsupported-setting", gated, path,
                             f"gated_linear_unit: true with activation_func: {act.value} (a gated "
                             f"{'GeLU' if act.value == 'gelu' else 'squared-ReLU'} MLP) is valid in Megatron's "
                             "YAML path but has no command-line equivalent, and the estimator models "
                             "Megatron's flag-defined MLPs only")
        # Top-level keys that do not shape the model: say so when they disagree with the model.
        swiglu_top = top.get("swiglu")
        if act is not None and swiglu_top is not None and isinstance(swiglu_top.value, bool) \
                and act.value in ACTIVATIONS and swiglu_top.value != (act.value == "swiglu"):
            self.notice("conflicting-keys", swiglu_top, "swiglu",
                        f"swiglu: {str(swiglu_top.value).lower()} disagrees with language_model.activation_func: "
                        f"{act.value} (line {act.line}); the model follows activation_func")

    def _completeness(self, sections) -> None:
        if set(sections) != set(SECTIONS):
            return
        present = set(sections[LANGUAGE_MODEL]) | set(sections[MODEL_PARALLEL])
        missing = [f for f in self.keys.transformer_fields if f not in present]
        if missing:
            shown = ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else "")
            node = self.root.entries[LANGUAGE_MODEL]
            self.notice("incomplete-transformer-config", node, LANGUAGE_MODEL,
                        f"{len(missing)} TransformerConfig fields are in neither language_model: nor "
                        f"model_parallel: ({shown}); Megatron at this version raises 'Missing argument' "
                        "for each in core_transformer_config_from_yaml. The estimate uses Megatron's defaults")


def _given(node: YamlNode | None) -> bool:
    return node is not None and node.value is not None


_KIND_TEXT = {"int": KIND_WORDS["integer"], "float": KIND_WORDS["number"], "bool": KIND_WORDS["boolean"],
              "str": KIND_WORDS["string"], "other": "a value"}


def _has_kind(value: Any, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return True
