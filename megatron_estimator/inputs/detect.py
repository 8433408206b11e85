"""Which input format a file is, from its name and its first lines; never imports yaml.

- ``shell``: a ``.sh``/``.bash``/``.slurm``/``.sbatch`` name, a ``#!`` line naming a shell, a
  ``#SBATCH`` line, or (when no YAML key is found) a line starting ``torchrun``, ``srun``,
  ``mpirun`` or ``python``.
- ``hf-config``: JSON (``.json``, or text starting with ``{``) whose top-level object has
  ``model_type`` or ``architectures``; also a directory holding such a ``config.json``.
- ``megatron-yaml``: a top-level ``language_model:`` or ``model_parallel:`` key (Megatron's
  ``--yaml-cfg`` format).
- ``seed-yaml``: the seed guide's format, told by its shape (``seed_shaped``): a top-level
  ``model:`` or ``parallelism:`` section, and at least half of its keys -- the top-level ones and
  those of its seed sections (model, parallelism, training, precision) -- are the keys
  schemas/seed-config.schema.json gives that place.  So a seed file with a typo or two is still
  read (and its typos reported), while YAML of other formats with a ``model:`` key (verl's
  ``megatron_critic.yaml``: ``_target_``, ``strategy``...; model cards) is ``unknown``, and
  Megatron-Bridge files, whose ``model:`` sits beside ``train:``, ``optimizer:``..., are
  ``bridge-yaml``.
- ``bridge-yaml``: Megatron-Bridge's ``ConfigContainer`` YAML or an override file for one, told by
  its shape (``inputs/trees/bridge.bridge_shaped``): two or more of its top-level sections
  (model, train, optimizer, ddp, dataset, scheduler, checkpoint, logger...), one of them
  ``model:`` or ``train:``, and no top-level key that is not a ``ConfigContainer`` field.
- ``mixed-yaml``: a seed-shaped file that also has a top-level key of Megatron's ``--yaml-cfg``
  format (a mistake to report, not a file to skip).
- ``megatron-log``: a Megatron training log: the header of the arguments block rank 0 prints
  (``------------------------ arguments ------------------------``), a ``report_memory`` line
  (``[Rank N] ... memory (MB) | allocated: ...``) or PyTorch's ``CUDA out of memory.`` message,
  with or without a launcher's rank prefix.
- ``nemo-rl-yaml``: a top-level ``policy:`` beside ``cluster:``, ``defaults:`` or an algorithm
  section (``grpo:``, ``sft:``, ``dpo:``, ``loss_fn:``): NeMo-RL's config (``inputs/trees/nemo_rl.py``).
- ``verl-yaml``: a top-level ``actor_rollout_ref:`` (verl's trainer config, ``inputs/trees/verl.py``).
- ``unknown``: anything else, including a file that cannot be read.

Top-level YAML keys are found by a line scan (a key at column 0), so a file with a YAML
syntax error is still routed to its loader, which then reports the error with its line.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from megatron_estimator.core.resources import load_schema, parse_bound_error, path_string, path_suffix, read_input_bytes

FORMATS = ("seed-yaml", "megatron-yaml", "bridge-yaml", "mixed-yaml", "shell", "hf-config", "megatron-log",
           "nemo-rl-yaml", "verl-yaml", "unknown")


Format = Literal["seed-yaml", "megatron-yaml", "bridge-yaml", "mixed-yaml", "shell", "hf-config", "megatron-log",
                 "nemo-rl-yaml", "verl-yaml", "unknown"]

_SHELL_SUFFIXES = (".sh", ".bash", ".zsh", ".slurm", ".sbatch")
_SHEBANG_SHELL = re.compile(r"^#!\s*\S*/(?:env\s+)?(?:ba|z|k|da)?sh\b")
_TOP_LEVEL_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:(?:\s|$)", re.MULTILINE)
_LAUNCH_LINE = re.compile(r"^\s*(?:exec\s+)?(?:torchrun|srun|mpirun|python3?)\s", re.MULTILINE)
# inputs/megatron_log.py describes these lines.
_LOG_LINE = re.compile(r"-{24} arguments -{24}\s*$|\[Rank \d+\] .*memory \(MB\) \| allocated: "
                        r"|CUDA out of memory\. Tried to allocate ", re.MULTILINE)
_SEED_KEYS = {"model", "parallelism"}
_KEY = re.compile(r"([A-Za-z_][\w-]*)\s*:(?:\s|$)")
_KEY_IN_FLOW = re.compile(r"([A-Za-z_][\w-]*)\s*:")
_MEGATRON_KEYS = {"language_model", "model_parallel"}
_HEAD_BYTES = 256 * 1024
_JSON_BYTES = 4 * 1024 * 1024


def detect_format(path: str | os.PathLike) -> Format:
    suffix = path_suffix(path).lower()
    path = path_string(path)     # as pathlib.Path(path) names it (os.path strings: no pathlib import)
    if os.path.isdir(path):
        return "hf-config" if _is_hf_config(os.path.join(path, "config.json")) else "unknown"
    if suffix in _SHELL_SUFFIXES:
        return "shell"
    head = _read_head(path, _HEAD_BYTES)
    if head is None:
        return "unknown"
    first_line = head.split("\n", 1)[0]
    if _SHEBANG_SHELL.match(first_line) or ("#SBATCH" in head and re.search(r"^#SBATCH\b", head, re.MULTILINE)):
        return "shell"
    if suffix == ".json" or head.lstrip().startswith("{"):
        return "hf-config" if _is_hf_config(path) else "unknown"
    if _LOG_LINE.search(head):
        return "megatron-log"
    keys = set(_TOP_LEVEL_KEY.findall(head))
    megatron, seed = bool(keys & _MEGATRON_KEYS), bool(keys & _SEED_KEYS) and seed_shaped(head)
    if megatron and not seed:
        return "megatron-yaml"
    if seed and not megatron:
        return "seed-yaml"
    if seed and megatron:
        return "mixed-yaml"
    if "actor_rollout_ref" in keys:
        return "verl-yaml"
    if "policy" in keys and ({"cluster", "defaults", "grpo", "sft", "dpo", "loss_fn"} & keys):
        return "nemo-rl-yaml"
    if not megatron and _bridge_shaped(keys):
        return "bridge-yaml"
    if not keys and _LAUNCH_LINE.search(head):
        return "shell"
    return "unknown"


# Megatron-Bridge's ConfigContainer fields (src/megatron/bridge/training/config.py:962-1010), and
# the sections that mark a file as one (or as an override file for one).
BRIDGE_SECTIONS = ("env_vars", "rng", "rerun_state_machine", "train", "model", "optimizer",
                   "optimizer_config_override_provider", "ddp", "validation", "scheduler", "dataset", "logger",
                   "tokenizer", "checkpoint", "dist", "ft", "straggler", "nvrx_straggler", "profiling", "peft",
                   "comm_overlap", "mixed_precision", "tensor_inspect", "inprocess_restart")
_BRIDGE_SHAPE = frozenset({"model", "train", "optimizer", "ddp", "dataset", "scheduler", "checkpoint", "logger",
                           "tokenizer", "mixed_precision", "rng", "dist", "comm_overlap", "profiling"})


def _bridge_shaped(keys: set[str]) -> bool:
    """Two or more of Bridge's sections, one of them model: or train:, and nothing else at the top."""
    found = keys & _BRIDGE_SHAPE
    return len(found) >= 2 and bool(found & {"model", "train"}) and keys <= set(BRIDGE_SECTIONS) | {"defaults"}


def _section_keys(text: str) -> list[tuple[str, list[str]]]:
    """(top-level key, the keys of its mapping) in file order, by a line scan: a section's keys
    are the lines at its first indentation, or the keys of a one-line ``{...}`` flow mapping."""
    sections: list[tuple[str, list[str]]] = []
    indent = None
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        depth = len(line) - len(stripped)
        match = _KEY.match(stripped)
        if depth == 0:
            if match is None:
                continue
            sections.append((match.group(1), []))
            indent = None
            rest = stripped[match.end():].split(" #", 1)[0].strip()
            if rest.startswith("{"):
                sections[-1][1].extend(_KEY_IN_FLOW.findall(rest))
            continue
        if not sections or match is None:
            continue
        if indent is None:
            indent = depth
        if depth == indent:
            sections[-1][1].append(match.group(1))
    return sections


def seed_shaped(text: str) -> bool:
    """Whether YAML ``text`` has the seed format's shape (see the module's docstring)."""
    places = load_schema("seed-config.schema.json")["properties"]
    sections = _section_keys(text)
    if not any(name in _SEED_KEYS for name, _ in sections):
        return False
    seed = total = 0
    for name, keys in sections:
        total += 1
        place = places.get(name)
        if place is None:
            continue
        seed += 1
        known = place.get("properties", {})
        total += len(keys)
        seed += sum(key in known for key in keys)
    return 2 * seed >= total


def _read_head(path: str, size: int) -> str | None:
    try:
        data = read_input_bytes(path, "yaml", head=size)
    except OSError:
        return None
    # data.decode("utf-8-sig", errors="replace"), as that codec does it (a leading BOM dropped,
    # the rest UTF-8), without importing the codec's module
    return (data[3:] if data[:3] == b"\xef\xbb\xbf" else data).decode("utf-8", errors="replace")


def _is_hf_config(path: str) -> bool:
    text = _read_head(path, _JSON_BYTES)
    if text is None:
        return False
    import json

    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        # past a parser bound (nesting, integer digits): the HF reader says so, where it is
        return parse_bound_error(error, "") is not None and ('"model_type"' in text or '"architectures"' in text)
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)
