"""ModelOpt knowledge distillation: the teacher's shape and the distillation config.

Megatron-LM's post-training path (megatron/post_training/model_builder.py,
``modelopt_gpt_hybrid_builder``, from the release that moved it there) builds, with
``--export-kd-teacher-load DIR``, a teacher beside the student:

- ``_load_teacher_model_config`` (model_builder.py:117-161 at d98e8a64): the teacher's
  arguments are a copy of the student's (already validated) arguments with ``kv_channels``
  dropped, overlaid with the YAML mapping in ``--export-kd-teacher-model-config`` or, without
  it, ``DIR/model_config.yaml``; with neither, the teacher is the student's architecture
  (model_builder.py:131-137 logs "Assuming teacher model architecture same as student's").
- ``_build_teacher_model`` (model_builder.py:164-196) builds it with the student's
  ``model_kwargs``: the student's padded vocabulary, embedding tying, position embedding and
  pipeline stage (pre_process / post_process), under the same parallel state, so the teacher
  is sharded like the student (its layers split over the same pipeline ranks).
- ModelOpt's ``DistillationConfig`` (modelopt/torch/distill/plugins/megatron.py) read from
  ``--export-kd-cfg``: ``skip_lm_loss`` (default true: the student's cross entropy is
  replaced by zeros while training, ``adjust_distillation_model_for_mcore``),
  ``intermediate_layer_pairs`` (each keeps the teacher layer's output until the loss).

The files are often on the job's machine only; a file not on this machine is an assumption
the report states, never a refusal.  A file that is here and malformed is a problem located
``file:line key``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, NamedTuple

from megatron_estimator.config.typed import Distillation, EstimatorConfig, build_config
from megatron_estimator.core.hints import did_you_mean
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.inputs.yamlpos import YamlNode, key_location, load_yaml_with_lines
from megatron_estimator.megatron.flags import flag_table

# What the teacher takes from the student's model_kwargs whatever its file says
# (model_builder.py _build_teacher_model passes the student's kwargs; gpt_builders.py builds
# them from the student's arguments).
STUDENT_KWARGS = ("untie_embeddings_and_output_weights", "position_embedding_type",
                  "max_position_embeddings", "padded_vocab_size", "vocab_size")

# modelopt/torch/distill/plugins/megatron.py DistillationConfig fields (0.35 to 0.47).
KD_CFG_FIELDS = ("intermediate_layer_pairs", "logit_layers", "skip_lm_loss", "kd_loss_scale",
                 "logit_kl_temperature", "criterion", "loss_balancer")


def _teacher_file(ns: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the teacher's model-config file when it is on this machine, why not otherwise)."""
    given = ns.get("export_kd_teacher_model_config")
    path = given if given else os.path.join(ns["export_kd_teacher_load"], "model_config.yaml")
    if os.path.isfile(path):
        return path, path
    if given:
        return None, (f"same as the student's: --export-kd-teacher-model-config {given} is not on this "
                      "machine")
    return None, (f"same as the student's: no {path} on this machine (Megatron then builds the "
                  "student's architecture, megatron/post_training/model_builder.py:131-137)")


def _mapping(path: str, problems: list[Problem]) -> YamlNode | None:
    doc = load_yaml_with_lines(path)
    problems.extend(doc.problems)
    if doc.root is None or doc.problems:
        return None
    if not doc.root.is_mapping:
        problems.append(Problem("invalid-yaml", key_location(path, doc.root.line),
                                "expected a mapping of settings at the top level"))
        return None
    return doc.root


def teacher_overrides(ns: Mapping[str, Any], release: str, problems: list[Problem]) -> tuple[dict, str]:
    """(the teacher's settings by Megatron dest, where they came from)."""
    path, source = _teacher_file(ns)
    if path is None:
        return {}, source
    root = _mapping(path, problems)
    if root is None:
        return {}, source
    known = set(flag_table(release).dests())
    overrides = {}
    for key, node in root.entries.items():
        if key not in known:
            problems.append(Problem("unknown-key", key_location(path, node.line, key),
                                    f"not a Megatron argument (the teacher's settings are named as "
                                    f"get_args() names them){did_you_mean(key, known)}"))
            continue
        overrides[key] = node.value
    return overrides, source


def kd_settings(ns: Mapping[str, Any], problems: list[Problem]) -> tuple[bool, int, str]:
    """(skip_lm_loss, intermediate layer pairs, source) of --export-kd-cfg."""
    path = ns.get("export_kd_cfg")
    if not path:
        return True, 0, "ModelOpt's default DistillationConfig (no --export-kd-cfg): logits only, skip_lm_loss"
    if not os.path.isfile(path):
        return True, 0, (f"ModelOpt's DistillationConfig defaults (logits only, skip_lm_loss): {path} is not "
                         "on this machine")
    root = _mapping(path, problems)
    if root is None:
        return True, 0, path
    skip, pairs = True, 0
    for key, node in root.entries.items():
        where = key_location(path, node.line, key)
        if key not in KD_CFG_FIELDS:
            problems.append(Problem("unknown-key", where, "not a field of ModelOpt's DistillationConfig"
                                    + did_you_mean(key, KD_CFG_FIELDS)))
        elif key == "skip_lm_loss":
            if not isinstance(node.value, bool):
                problems.append(Problem("invalid-value", where, f"expected true or false, got {node.value!r}"))
            else:
                skip = node.value
        elif key == "intermediate_layer_pairs":
            if not isinstance(node.value, list):
                problems.append(Problem("invalid-value", where, "expected a list of [student, teacher] layer names"))
            else:
                pairs = len(node.value)
    return skip, pairs, path


class KdFiles(NamedTuple):
    """What the teacher's and the distillation config's files say (read once per input)."""
    overrides: dict
    teacher_source: str
    skip_lm_loss: bool
    intermediate_pairs: int
    kd_cfg_source: str


def read_kd_files(ns: Mapping[str, Any], release: str, problems: list[Problem]) -> KdFiles:
    """The teacher's settings and the distillation config, their problems added to ``problems``."""
    overrides, source = teacher_overrides(ns, release, problems)
    skip, pairs, kd_source = kd_settings(ns, problems)
    return KdFiles(overrides, source, skip, pairs, kd_source)


def attach_distillation(config: EstimatorConfig, derived: Mapping[str, Any], vocab, environ: Mapping[str, str],
                        family: str, files: KdFiles) -> EstimatorConfig:
    """``config`` (built from ``derived``) with its ``Distillation``: the teacher built from the
    same derived namespace overlaid with its file's settings (the planner calls it per layout)."""
    ns = dict(derived)
    ns.update({k: v for k, v in files.overrides.items() if k not in STUDENT_KWARGS})
    if "kv_channels" not in files.overrides:
        # Dropped before the overlay (model_builder.py:143), so TransformerConfig recomputes it:
        # megatron/core/transformer/transformer_config.py __post_init__ kv_channels = h / heads.
        ns["kv_channels"] = ns["hidden_size"] // ns["num_attention_heads"]
    if not ns.get("group_query_attention"):
        # Without GQA Megatron passes num_query_groups=None (megatron/training/argument_utils.py
        # :330-333) and TransformerConfig takes the teacher's heads (transformer_config.py:1458).
        ns["num_query_groups"] = ns["num_attention_heads"]
    teacher = build_config(ns, vocab, config.world_size_source, environ, (), frozenset(), config.run,
                           family=family).model
    kd = Distillation(teacher=teacher, teacher_source=files.teacher_source,
                      teacher_overrides=tuple(sorted(files.overrides)), skip_lm_loss=files.skip_lm_loss,
                      intermediate_pairs=files.intermediate_pairs, kd_cfg_source=files.kd_cfg_source)
    return replace(config, distillation=kd)


def with_distillation(config: EstimatorConfig, derived: Mapping[str, Any], raw: RawArgs, vocab,
                      environ: Mapping[str, str], family: str, problems: list[Problem]) -> EstimatorConfig:
    """``config`` with its ``Distillation`` when --export-kd-teacher-load is set; the problems
    of the teacher's and the distillation config's files are added to ``problems``."""
    if not derived.get("export_kd_teacher_load"):
        return config
    files = read_kd_files(derived, config.run.release.version, problems)
    return attach_distillation(config, derived, vocab, environ, family, files)
