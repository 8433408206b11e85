"""The seed YAML format -> Megatron dests, with ``file:line section.key`` locations.

The format is the seed tool's (yzlnew/infra-skills megatron-memory-estimator: its
configuration guide, its example files and the scripts that read them): sections ``model``,
``parallelism``, ``training``, ``precision``, and ``world_size`` under ``training:`` (where
the seed's scripts read it) or at the top level.  ``schemas/seed-config.schema.json``
describes it exactly; every schema error is its own problem, located at the key's line (a
missing key at its section's line), with a stable code: ``unknown-key`` (with did-you-mean,
or the section the key belongs to), ``missing-key``, ``wrong-type``, ``out-of-range``,
``invalid-choice``; anything else the schema rejects is ``schema``.  ``null`` means unset
for every key (the seed's files write ``num_experts: null``, ``moe_router_topk: null``); a
required key that is null is missing.

How the keys become Megatron dests (megatron/training/arguments.py, argument_utils.py):

- Most keys keep their name: ``model.num_layers`` -> ``num_layers``, ``training.seq_length``
  -> ``seq_length``, ``parallelism.tensor_model_parallel_size`` -> the same dest, and so on
  (``model.fp16_lm_cross_entropy`` -> ``fp16_lm_cross_entropy``, Megatron's flag).
- ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage`` ->
  ``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers``.
- ``virtual_pipeline_model_parallel_size`` -> ``num_virtual_stages_per_pipeline_rank`` (the
  flag that sets Megatron's virtual pipeline size directly and, unlike
  ``--num-layers-per-virtual-pipeline-stage``, works with uneven first/last stages).
- ``num_query_groups`` other than ``num_attention_heads`` -> ``group_query_attention=True``
  plus ``num_query_groups`` (Megatron ignores ``--num-query-groups`` without
  ``--group-query-attention``); equal to the head count it is plain multi-head attention.
- ``activation_func: swiglu`` -> ``swiglu=True`` (Megatron's gated SiLU MLP);
  ``squared_relu`` -> ``squared_relu=True``; ``gelu`` is Megatron's default.
  ``gated_linear_unit`` follows the activation when absent (true for swiglu, false
  otherwise): Megatron's flags make the MLP gated only with ``--swiglu``, so ``true`` with
  another activation is ``unsupported-setting`` and ``false`` with swiglu ``conflicting-keys``.
- ``params_dtype: bf16`` -> ``bf16=True``, ``fp16`` -> ``fp16=True``, ``fp32`` -> neither
  (Megatron's default).  ``fp8: true`` -> ``fp8='hybrid'`` (``--fp8-format hybrid``: E4M3
  forward, E5M2 backward, the format Megatron's example launches use); ``fp8: e4m3`` or
  ``hybrid`` name the format directly.
- ``layernorm_epsilon`` -> ``layernorm_epsilon`` (the dest of ``--norm-epsilon``).
- ``ffn_hidden_size``: the guide calls it required, but Megatron derives it when it is not
  given (4 * hidden_size, or int(4 * hidden_size * 2 / 3 / 64) * 64 with swiglu), so the seed
  format makes it optional and leaves it unset when absent; the schema's description warns
  that real models rarely use the derived value.

Defaults: the seed's, not Megatron's.  What a file does not say takes the value the seed's
tool gives it: the guide's stated defaults, and the model the seed's scripts build (its
``create_args_from_config`` / ``create_transformer_config`` hard-code rotary positions,
``rotary_percent`` 1.0 and base 10000, an output layer of its own, no linear or QKV biases,
grouped-GEMM experts).  Where such a default differs from Megatron's flag default, the loader
writes it out as a setting located ``file section.key (seed-format default)`` and states it as
a note, which the report lists among its assumptions (``SEED_DEFAULTS``): RMSNorm, SwiGLU, rope,
untied embeddings and output layer, no linear biases, the distributed optimizer and bf16
always; for a MoE model ``moe_grouped_gemm`` and ``expert_tensor_parallel_size: 1`` (the
guide's default; Megatron's is the tensor parallel size); with full recompute
``recompute_num_layers: 0`` (the seed's scripts read 0 when it is absent; with block it
recomputes no layer, with uniform Megatron refuses it).  Defaults the seed shares with
Megatron (``moe_router_topk`` 2, ``layernorm_epsilon`` 1e-5, one query group per head, no QKV
bias, dropout 0.1, which the seed's model keeps) need no setting.  A key the file sets wins
(``position_embedding_type``, ``untie_embeddings_and_output_weights``, ``add_bias_linear``,
``moe_grouped_gemm`` and the other extension keys exist for that).

The padded vocabulary follows Megatron, not the seed: the seed's estimator takes
``padded_vocab_size = vocab_size``, but a Megatron run pads the vocabulary to a multiple of
``make_vocab_size_divisible_by`` (128) x the tensor parallel size
(megatron/training/tokenizer/tokenizer.py ``_vocab_size_with_padding``), and that is what
the GPUs hold; ``config/vocab.py`` pads every input alike and the report says so.

Cross-field rules of Megatron itself (divisibility, world size tiling, recompute
combinations) are not checked here: validation checks every input format the same way.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import load_schema, schema_validator
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.core.hints import (
    describe_value as _describe, did_you_mean, expected_kind as _expected, yaml_float_hint as _float_hint,
)
from megatron_estimator.inputs.yamlpos import YamlNode, key_location, load_yaml_with_lines

_SCHEMA_NAME = "seed-config.schema.json"


def __getattr__(name: str):
    # SEED_SCHEMA_PATH, the schema file as a Path, made on first use (pathlib is not imported at
    # start-up).  Installed, schemas/ is the package megatron_estimator.schemas (setup.cfg); in a
    # checkout it sits beside the package.
    if name == "SEED_SCHEMA_PATH":
        from megatron_estimator.core.resources import schema_path

        return schema_path(_SCHEMA_NAME)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SECTIONS = ("model", "parallelism", "training", "precision")

# (section, key) -> Megatron dest, for keys whose value passes through unchanged.
_SAME_VALUE = {
    ("model", "num_layers"): "num_layers",
    ("model", "hidden_size"): "hidden_size",
    ("model", "num_attention_heads"): "num_attention_heads",
    ("model", "ffn_hidden_size"): "ffn_hidden_size",
    ("model", "num_experts"): "num_experts",
    ("model", "moe_router_topk"): "moe_router_topk",
    ("model", "moe_ffn_hidden_size"): "moe_ffn_hidden_size",
    ("model", "moe_shared_expert_intermediate_size"): "moe_shared_expert_intermediate_size",
    ("model", "vocab_size"): "vocab_size",
    ("model", "max_position_embeddings"): "max_position_embeddings",
    ("model", "normalization"): "normalization",
    ("model", "layernorm_epsilon"): "layernorm_epsilon",
    ("model", "qk_layernorm"): "qk_layernorm",
    ("model", "multi_latent_attention"): "multi_latent_attention",
    ("model", "fp16_lm_cross_entropy"): "fp16_lm_cross_entropy",
    ("model", "moe_grouped_gemm"): "moe_grouped_gemm",
    ("model", "position_embedding_type"): "position_embedding_type",
    ("model", "untie_embeddings_and_output_weights"): "untie_embeddings_and_output_weights",
    ("model", "add_bias_linear"): "add_bias_linear",
    ("model", "add_qkv_bias"): "add_qkv_bias",
    ("model", "hidden_dropout"): "hidden_dropout",
    ("model", "attention_dropout"): "attention_dropout",
    ("model", "kv_channels"): "kv_channels",
    ("model", "moe_layer_freq"): "moe_layer_freq",
    ("model", "q_lora_rank"): "q_lora_rank",
    ("model", "kv_lora_rank"): "kv_lora_rank",
    ("model", "qk_head_dim"): "qk_head_dim",
    ("model", "qk_pos_emb_head_dim"): "qk_pos_emb_head_dim",
    ("model", "v_head_dim"): "v_head_dim",
    ("parallelism", "tensor_model_parallel_size"): "tensor_model_parallel_size",
    ("parallelism", "pipeline_model_parallel_size"): "pipeline_model_parallel_size",
    ("parallelism", "num_layers_in_first_pipeline_stage"): "decoder_first_pipeline_num_layers",
    ("parallelism", "num_layers_in_last_pipeline_stage"): "decoder_last_pipeline_num_layers",
    ("parallelism", "expert_model_parallel_size"): "expert_model_parallel_size",
    ("parallelism", "expert_tensor_parallel_size"): "expert_tensor_parallel_size",
    ("parallelism", "context_parallel_size"): "context_parallel_size",
    ("parallelism", "virtual_pipeline_model_parallel_size"): "num_virtual_stages_per_pipeline_rank",
    ("training", "micro_batch_size"): "micro_batch_size",
    ("training", "seq_length"): "seq_length",
    ("training", "global_batch_size"): "global_batch_size",
    ("training", "use_distributed_optimizer"): "use_distributed_optimizer",
    ("training", "sequence_parallel"): "sequence_parallel",
    ("training", "recompute_granularity"): "recompute_granularity",
    ("training", "recompute_method"): "recompute_method",
    ("training", "recompute_num_layers"): "recompute_num_layers",
    ("training", "recompute_modules"): "recompute_modules",
}

_KEY_OF_DEST = {dest: key for key, dest in _SAME_VALUE.items()}

# The seed's defaults that differ from Megatron's flag defaults, applied where the file leaves
# the key out or null: (section, key, dest, value, when, why).  ``when``: None (always), "moe"
# (the model has experts) or "full" (recompute_granularity: full).  ``why`` is what the note
# says; the seed's estimate.py create_args_from_config / create_transformer_config is where
# the seed's scripts take each value.
SEED_DEFAULTS = (
    ("model", "normalization", "normalization", "RMSNorm", None,
     "the seed guide's default; Megatron's is LayerNorm"),
    ("model", "position_embedding_type", "position_embedding_type", "rope", None,
     "the seed's model uses rotary embeddings, rotary_percent 1.0, base 10000; Megatron's default is "
     "learned_absolute"),
    ("model", "untie_embeddings_and_output_weights", "untie_embeddings_and_output_weights", True, None,
     "the seed's model has an output layer of its own; Megatron's default ties it to the embedding"),
    ("model", "add_bias_linear", "add_bias_linear", False, None,
     "the seed's model has no linear biases; Megatron's default has them"),
    ("model", "moe_grouped_gemm", "moe_grouped_gemm", True, "moe",
     "the seed's model uses grouped-GEMM experts; Megatron's default is off"),
    ("parallelism", "expert_tensor_parallel_size", "expert_tensor_parallel_size", 1, "moe",
     "the seed guide's default; Megatron's is the tensor parallel size"),
    ("training", "use_distributed_optimizer", "use_distributed_optimizer", True, None,
     "the seed guide's default; Megatron's is off"),
    ("training", "recompute_num_layers", "recompute_num_layers", 0, "full",
     "the seed's scripts read 0 when it is absent; Megatron has no default"),
)
DEFAULT_ACTIVATION = "swiglu"        # Megatron: gelu
DEFAULT_PARAMS_DTYPE = "bf16"        # Megatron: fp32
_DEFAULT_WHY = {
    "activation_func": "the seed guide's default; Megatron's is gelu",
    "params_dtype": "the seed guide's default; Megatron's is fp32",
}
FP8_TRUE_FORMAT = "hybrid"           # --fp8-format hybrid, as in Megatron's example launches


@dataclass(frozen=True)
class SeedLoad:
    raw: RawArgs
    world_size: int | None
    world_size_location: str
    problems: tuple[Problem, ...]
    notes: tuple[str, ...] = ()            # each seed-format default applied, as the report states it
    world_size_unknown: Problem | None = None   # the problem when the file gives no world size


def seed_schema() -> dict:
    """The JSON Schema of the seed format: schemas/seed-config.schema.json."""
    return load_schema(_SCHEMA_NAME)


def load_seed_yaml(path: str | os.PathLike) -> SeedLoad:
    """Read a seed-format YAML file into Megatron dests; every problem is returned, none raised."""
    name = str(path)
    doc = load_yaml_with_lines(path)
    problems = list(doc.problems)
    root = doc.root
    if root is None:
        if not problems:
            problems.append(Problem("empty-file", key_location(name, 1),
                                    "the file is empty; a seed configuration needs the sections "
                                    "model, parallelism and training and a world_size"))
        return SeedLoad(RawArgs({}, name), None, name, tuple(problems))
    if not root.is_mapping:
        problems.append(Problem("wrong-type", key_location(name, root.line),
                                f"the top level must be a mapping of sections, not {_describe(root.value)}"))
        return SeedLoad(RawArgs({}, name), None, name, tuple(problems))

    found, bad_paths = _schema_problems(root, name)
    mapper = _Mapper(root, name, bad_paths)
    mapper.map_all()
    found.extend(mapper.problems)
    found.sort(key=lambda item: (item[0], item[1]))
    problems.extend(problem for _, _, problem in found)

    world_size, world_size_location, unknown = _world_size(root, name, bad_paths, problems)
    return SeedLoad(RawArgs(mapper.settings, name, mapper.absent_location), world_size, world_size_location,
                    tuple(problems), tuple(mapper.notes), unknown)


def _world_size(root: YamlNode, name: str, bad_paths: set[tuple[str, ...]], problems: list[Problem]
                ) -> tuple[int | None, str, Problem | None]:
    """(world size, its location, the problem if none is given): ``training.world_size`` (where
    the seed's scripts read it) or the top-level ``world_size``; both with different values is
    a problem at the later one.  None given is a problem only where the caller gives no world
    size either (``--world-size``): api.evaluate adds ``world_size_unknown`` then."""
    training = root.entries.get("training")
    candidates = ((("world_size",), root.entries.get("world_size")),
                  (("training", "world_size"), training.entries.get("world_size")
                   if training is not None and training.entries is not None else None))
    given = sorted((node.line, key_location(name, node.line, ".".join(path)), _as_int(node.value))
                   for path, node in candidates
                   if node is not None and node.value is not None and path not in bad_paths
                   and path[:1] not in bad_paths)
    if not given:
        where = key_location(name, (training or root).line, "training.world_size")
        if any(path in bad_paths for path, _ in candidates):
            return None, where, None            # a bad value, reported already
        return None, where, Problem("missing-key", where, "the world size is not given: set training.world_size "
                                    "(or world_size at the top level), or pass --world-size")
    (_, where, value), later = given[0], given[1:]
    for _, other_where, other in later:
        if other != value:
            problems.append(Problem("conflicting-keys", other_where,
                                    f"the world size is given twice: {other} here, {value} at {where}; give it once"))
            return None, where, None            # which one is meant is not known
    return value, where, None


# --- schema errors -> problems ---------------------------------------------------------------

def _schema_problems(root: YamlNode, name: str) -> tuple[list[tuple[int, str, Problem]], set[tuple[str, ...]]]:
    """Every schema error as (line, key path, problem), and the key paths whose values are unusable."""
    schema = seed_schema()
    validator = schema_validator(_SCHEMA_NAME)
    found: list[tuple[int, str, Problem]] = []
    bad: set[tuple[str, ...]] = set()
    seen_required: set[tuple[str, ...]] = set()
    for error in validator.iter_errors(root.value):
        path = tuple(str(p) for p in error.absolute_path)
        for line, key_path, problem in _translate(error, path, root, name, schema, seen_required):
            found.append((line, key_path, problem))
        if error.validator not in ("required", "additionalProperties"):
            bad.add(path[:2])
    return found, bad


def _translate(error, path, root, name, schema, seen_required):
    kind = error.validator
    if kind == "additionalProperties":
        known = error.schema.get("properties", {})
        for key in error.instance:
            if key in known:
                continue
            node = _node_at(root, path + (key,))
            key_path = ".".join(path + (key,))
            yield node.line, key_path, Problem(
                "unknown-key", key_location(name, node.line, key_path),
                _unknown_key_message(key, path, known, schema))
        return
    if kind == "required":
        if path in seen_required:
            return
        seen_required.add(path)
        owner = _node_at(root, path)
        where = ".".join(path) if path else "the top level"
        for key in error.validator_value:
            if key in error.instance:
                continue
            key_path = ".".join(path + (key,))
            what = "section" if not path and key in SECTIONS else "key"
            yield owner.line, key_path, Problem(
                "missing-key", key_location(name, owner.line, key_path),
                f"required {what} {key} is missing from {where}")
        return

    key_path_parts = path[:2]
    node = _node_at(root, key_path_parts)
    key_path = ".".join(key_path_parts)
    key = key_path_parts[-1] if key_path_parts else "the top level"
    item = f" (item {int(path[2]) + 1})" if len(path) > 2 else ""
    value = error.instance
    if kind == "type" and value is None and len(path) == 2:
        code, message = "missing-key", f"required key {key} is null (null means unset)"
    elif kind == "type":
        code, message = "wrong-type", (f"{key}{item} must be {_expected(error.validator_value)}, "
                                       f"not {_describe(value)}{_float_hint(value)}")
    elif kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bound = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[kind]
        code, message = "out-of-range", f"{key}{item} must be {bound} {error.validator_value:g}, not {value!r}"
    elif kind == "enum":
        choices = [c for c in error.validator_value if c is not None]    # null (unset) is always allowed
        hint = did_you_mean(str(value), [str(c) for c in choices if isinstance(c, str)])
        code, message = "invalid-choice", (f"{key}{item} must be one of "
                                           f"{', '.join(_yaml_text(c) for c in choices)}, "
                                           f"not {_yaml_text(value)}{hint}")
    elif kind == "oneOf":
        code, message = "wrong-type", (f"{key} must be a positive integer or a list of 0 and 1, "
                                       f"not {_describe(value)}")
    elif kind == "minItems":
        code, message = "out-of-range", f"{key} must list at least {error.validator_value} item(s)"
    elif kind == "uniqueItems":
        code, message = "invalid-choice", f"{key} lists an item more than once: {value!r}"
    else:
        code, message = "schema", f"{key}: {error.message}"
    yield node.line, key_path, Problem(code, key_location(name, node.line, key_path), message)


def _unknown_key_message(key: str, path: tuple[str, ...], known, schema) -> str:
    top = schema["properties"]
    here = path[0] if path else None
    message = f"unknown key {key} in section {here}" if here else f"unknown key {key} at the top level"
    if here and key in top:
        return f"{message}: {key} belongs at the top level, not under {here}:"
    homes = [section for section in SECTIONS if section != here and key in top[section]["properties"]]
    if homes:
        return f"{message}: {key} belongs under {homes[0]}:"
    return message + did_you_mean(key, known)


def _node_at(root: YamlNode, path: tuple[str, ...]) -> YamlNode:
    node = root
    for part in path:
        if node.entries is None or part not in node.entries:
            break
        node = node.entries[part]
    return node


def _yaml_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _as_int(value: Any) -> Any:
    """JSON Schema calls 4096.0 an integer; Megatron's argparse would give 4096."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# --- keys -> dests ---------------------------------------------------------------------------

class _Mapper:
    def __init__(self, root: YamlNode, name: str, bad_paths: set[tuple[str, ...]]) -> None:
        self.root = root
        self.name = name
        self.bad = bad_paths
        self.settings: dict[str, RawSetting] = {}
        self.problems: list[tuple[int, str, Problem]] = []
        self.notes: list[str] = []
        self._integer_keys = {
            (section, key)
            for section in SECTIONS
            for key, spec in seed_schema()["properties"][section]["properties"].items()
            if "integer" in (spec.get("type") if isinstance(spec.get("type"), list) else [spec.get("type")])
        }

    def node(self, section: str, key: str) -> YamlNode | None:
        """The key's node when its section and it are usable (present, not null, schema-valid)."""
        if (section,) in self.bad or (section, key) in self.bad:
            return None
        section_node = self.root.entries.get(section)
        if section_node is None or section_node.entries is None:
            return None
        node = section_node.entries.get(key)
        return node if node is not None and node.value is not None else None

    def present(self, section: str, key: str) -> bool:
        """The file sets the key (null is unset), whether or not its value is usable."""
        node = self.root.entries.get(section)
        if node is None or node.entries is None:
            return False
        entry = node.entries.get(key)
        return entry is not None and entry.value is not None

    def section_usable(self, section: str) -> bool:
        node = self.root.entries.get(section)
        return (section,) not in self.bad and (node is None or node.entries is not None)

    def where(self, section: str, key: str, node: YamlNode | None) -> str:
        if node is not None:
            return key_location(self.name, node.line, f"{section}.{key}")
        return f"{self.name} {section}.{key} (seed-format default)"

    def report(self, code: str, section: str, key: str, node: YamlNode, message: str) -> None:
        self.problems.append((node.line, f"{section}.{key}",
                              Problem(code, self.where(section, key, node), message)))

    def put(self, dest: str, value: Any, location: str) -> None:
        self.settings[dest] = RawSetting(dest, value, location)

    def put_default(self, section: str, key: str, dest: str, value: Any, why: str) -> None:
        """A seed-format default: the setting, located as such, and the note the report lists."""
        self.put(dest, value, self.where(section, key, None))
        self.notes.append(f"seed-format default: {section}.{key} {_yaml_text(value)} ({why})")

    def absent_location(self, dest: str) -> str:
        """Where a Megatron setting that this file does not give would go: its key (where a
        problem about it is already reported), else its section, else the flag."""
        key = _KEY_OF_DEST.get(dest)
        if key is None:
            return "--" + dest.replace("_", "-")
        section, name = key
        section_node = self.root.entries.get(section)
        if section_node is None or section_node.entries is None:
            return key_location(self.name, section_node.line if section_node else self.root.line, section)
        node = section_node.entries.get(name)
        return key_location(self.name, (node or section_node).line, f"{section}.{name}")

    def map_all(self) -> None:
        for (section, key), dest in _SAME_VALUE.items():
            node = self.node(section, key)
            if node is None:
                continue
            value = _as_int(node.value) if (section, key) in self._integer_keys else node.value
            self.put(dest, value, self.where(section, key, node))
        conditions = {None: True, "moe": self.node("model", "num_experts") is not None,
                      "full": getattr(self.node("training", "recompute_granularity"), "value", None) == "full"}
        for section, key, dest, value, when, why in SEED_DEFAULTS:
            if conditions[when] and self.section_usable(section) and not self.present(section, key):
                self.put_default(section, key, dest, value, why)
        self._map_query_groups()
        self._map_activation()
        self._map_precision()

    def _map_query_groups(self) -> None:
        node = self.node("model", "num_query_groups")
        if node is None:
            return
        groups = _as_int(node.value)
        heads = self.node("model", "num_attention_heads")
        if heads is not None and _as_int(heads.value) == groups:
            return                      # one group per head: plain multi-head attention
        location = self.where("model", "num_query_groups", node)
        self.put("group_query_attention", True, location)
        self.put("num_query_groups", groups, location)

    def _map_activation(self) -> None:
        if not self.section_usable("model") or ("model", "activation_func") in self.bad \
                or ("model", "gated_linear_unit") in self.bad:
            return
        act_node = self.node("model", "activation_func")
        gated_node = self.node("model", "gated_linear_unit")
        activation = act_node.value if act_node is not None else DEFAULT_ACTIVATION
        act_where = self.where("model", "activation_func", act_node)
        gated = gated_node.value if gated_node is not None else None
        if act_node is None and gated is not False:
            self.notes.append(f"seed-format default: model.activation_func {DEFAULT_ACTIVATION} "
                              f"({_DEFAULT_WHY['activation_func']})")
        if activation == "swiglu":
            if gated is False:
                self.report(
                    "conflicting-keys", "model", "gated_linear_unit", gated_node,
                    "gated_linear_unit: false contradicts activation_func: swiglu"
                    + ("" if act_node is not None else " (the seed-format default)")
                    + "; SwiGLU is a gated MLP (Megatron's --swiglu); set activation_func: gelu "
                      "or squared_relu for an ungated MLP")
                return
            self.put("swiglu", True, act_where)
        elif gated is True:
            self.report(
                "unsupported-setting", "model", "gated_linear_unit", gated_node,
                f"gated_linear_unit: true with activation_func: {activation} has no Megatron "
                "command-line equivalent: Megatron's flags make the MLP gated only with --swiglu; "
                "use activation_func: swiglu or gated_linear_unit: false")
        elif activation == "squared_relu":
            self.put("squared_relu", True, act_where)

    def _map_precision(self) -> None:
        if not self.section_usable("precision"):
            return
        if ("precision", "params_dtype") not in self.bad:
            node = self.node("precision", "params_dtype")
            dtype = node.value if node is not None else DEFAULT_PARAMS_DTYPE
            where = self.where("precision", "params_dtype", node)
            if node is None:
                self.notes.append(f"seed-format default: precision.params_dtype {DEFAULT_PARAMS_DTYPE} "
                                  f"({_DEFAULT_WHY['params_dtype']})")
            if dtype == "bf16":
                self.put("bf16", True, where)
            elif dtype == "fp16":
                self.put("fp16", True, where)
        node = self.node("precision", "fp8")
        if node is not None and node.value is not False:
            self.put("fp8", FP8_TRUE_FORMAT if node.value is True else node.value,
                     self.where("precision", "fp8", node))
