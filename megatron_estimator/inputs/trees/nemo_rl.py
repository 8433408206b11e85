"""NeMo-RL's YAML configurations (``examples/configs/*.yaml``) read into Megatron settings.

Facts, from NVIDIA-NeMo/RL (commit 7ea279ab):

- Loading (``nemo_rl/utils/config.py``): ``load_config_with_inheritance`` reads a file with
  OmegaConf; a top-level ``defaults:`` (one path or a list, relative to the file's folder) names
  parent files loaded the same way and merged in order (the last wins), then the file itself;
  a mapping marked ``_override_: true`` replaces the parent's instead of merging.  Command-line
  overrides (``key.path=value``) are Hydra override strings applied to the merged config in
  struct mode (``parse_hydra_overrides``).  Resolvers ``add``, ``mul``, ``div``, ``max``
  (``register_omegaconf_resolvers``).  Interpolations (``${policy.model_name}``) resolve after.
- Megatron (``nemo_rl/models/megatron/setup.py``): used only when ``policy.megatron_cfg.enabled``;
  the parallel sizes and ``sequence_parallel`` go to the model config as named;
  ``activation_checkpointing`` sets ``recompute_granularity`` (``recompute_granularity``, default
  full: method uniform, one layer; ``_apply_performance_config``); ``policy.precision`` gives
  bf16/fp16 (``dtype_map``); ``megatron_cfg.optimizer`` is Megatron's OptimizerConfig
  (``use_distributed_optimizer``, ``optimizer_cpu_offload`` with ``optimizer_offload_fraction``,
  ``use_precision_aware_optimizer``); ``distributed_data_parallel_config`` is Megatron's DDP config
  (``grad_reduce_in_fp32``, ``overlap_grad_reduce``, ``overlap_param_gather``).
- The batch: ``policy.train_micro_batch_size`` sequences of ``policy.max_total_sequence_length``
  tokens; with ``policy.sequence_packing.enabled`` a micro batch is sequences packed to
  ``train_mb_tokens`` tokens in one row.
- The world (``nemo_rl/algorithms/grpo.py`` ``setup``): ``cluster.num_nodes`` x
  ``cluster.gpus_per_node``; with ``policy.generation.colocated.enabled: false`` the generation
  engine's ``resources`` are taken away (its GPUs per node on one node, else its nodes).
- Other models on the GPU: the reference model's weights are kept on the CPU
  (``setup.py`` ``setup_reference_model_state``: ``reference_state_dict`` copied to ``cpu``); the
  colocated vLLM engine is put to sleep (``llm.sleep(level=1)``, ``vllm_worker.py``: weights
  offloaded, KV cache freed) before training runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import read_input_text
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.inputs.trees.common import extra_problem, override_locator, first_line

_SETUP = "nemo_rl/models/megatron/setup.py"


@dataclass(frozen=True)
class TreeReading:
    """A tree configuration as Megatron settings, with the run's world size and the notes to state."""

    raw: RawArgs = field(default_factory=RawArgs)
    problems: tuple[Problem, ...] = ()
    world_size: int | None = None
    world_size_source: str | None = None
    notes: tuple[str, ...] = ()
    skip: str | None = None            # why it is no Megatron training job (``--skip-unknown``)


def register_resolvers() -> None:
    """NeMo-RL's resolvers (nemo_rl/utils/config.py register_omegaconf_resolvers)."""
    from omegaconf import OmegaConf

    for name, fn in (("add", lambda a, b: a + b), ("mul", lambda a, b: a * b),
                     ("div", lambda a, b: a / b), ("max", lambda a, b: max(a, b))):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


class TreeError(Exception):
    def __init__(self, location: str, message: str):
        super().__init__(message)
        self.problem = Problem("tree-config", location, message)


def _merge(base, child):
    from omegaconf import DictConfig, OmegaConf

    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue
        value = child[key]
        if isinstance(value, DictConfig) and value.get("_override_", False):
            value.pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, child)


def _checked_merge(base, child, path: str):
    """``_merge``, its OmegaConf errors (an interpolation read while merging) a ``TreeError``."""
    try:
        return _merge(base, child)
    except (TreeError, RecursionError):
        raise
    except Exception as error:          # OmegaConf's own errors
        raise TreeError(path, f"cannot be merged with its defaults: {first_line(error)}") from None


# Files read for one config, counted with repeats (README.md "Limits"): NeMo-RL reads a default
# once per path that inherits it, so eight defaults of eight defaults... grow exponentially.
MAX_FILES = 64


def load_with_inheritance(path: str, files: list[str], depth: int = 0):
    """nemo_rl/utils/config.py load_config_with_inheritance, reading through the bounded reader;
    ``files`` gets every file read (the child last)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if depth > 32:
        raise TreeError(f"{path} defaults", "defaults: inherit in a circle")
    if len(files) >= MAX_FILES:     # a file inherited along many paths is read once per path
        raise TreeError(f"{path} defaults", f"defaults: the inheritance reads more than {MAX_FILES} files "
                        "in all (a file inherited along many paths), the limit of what this tool follows")
    try:
        config = OmegaConf.create(read_input_text(path, "yaml"))
    except OSError as error:
        raise TreeError(path, f"cannot be read: {error.strerror or error}") from None
    except Exception as error:          # YAML syntax, bound: OmegaConf's and PyYAML's own words
        raise TreeError(path, f"not a NeMo-RL config: {first_line(error)}") from None
    if not isinstance(config, DictConfig):
        raise TreeError(path, "not a mapping (NeMo-RL configs are dictionaries)")
    if "defaults" in config:
        try:    # str() resolves an interpolation, as NeMo-RL's own loader does
            defaults = config.pop("defaults")
            defaults = [str(defaults)] if not isinstance(defaults, ListConfig) else [str(d) for d in defaults]
        except Exception as error:      # OmegaConf's errors: an interpolation that does not resolve
            raise TreeError(f"{path} defaults", f"cannot be read: {first_line(error)}") from None
        base = OmegaConf.create({})
        for default in defaults:
            parent = default if os.path.isabs(default) else os.path.join(os.path.dirname(path), default)
            if not os.path.isfile(parent):
                raise TreeError(f"{path} defaults", f"names {default}, which is not a file ({parent})")
            base = _checked_merge(base, load_with_inheritance(parent, files, depth + 1), path)
        config = _checked_merge(base, config, path)
    files.append(path)
    return config


def apply_overrides(config, overrides: Sequence[str], where: str):
    """Hydra override strings on a composed config, as nemo_rl/utils/config.py parse_hydra_overrides."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    if not overrides:
        return config
    try:
        OmegaConf.set_struct(config, True)
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
        ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=config)
    except Exception as error:
        raise TreeError(where, f"override refused: {first_line(error)}") from None
    OmegaConf.set_struct(config, False)
    return config


def resolved(config, where: str) -> dict:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(config, resolve=True)
    except Exception as error:
        raise TreeError(where, f"an interpolation does not resolve: {first_line(error)}") from None


def get(tree: dict, key: str, default: Any = None) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


class Settings:
    """Megatron dests filled from keys of a tree, each located at the file that last set it."""

    def __init__(self, tree: dict, locate: Callable[[str], str], source: str):
        self.tree, self.locate, self.source = tree, locate, source
        self.settings: dict[str, RawSetting] = {}
        self.problems: list[Problem] = []

    def put(self, dest: str, key: str, convert: Callable[[Any], Any] = lambda v: v) -> Any:
        value = get(self.tree, key)
        if value is None:
            return None
        try:
            value = convert(value)
        except (TypeError, ValueError):
            self.problems.append(Problem("wrong-type", self.locate(key), f"{key}: {value!r} is not {dest}'s type"))
            return None
        self.settings[dest] = RawSetting(dest, value, self.locate(key))
        return value

    def force(self, dest: str, value: Any, key: str) -> None:
        self.settings[dest] = RawSetting(dest, value, self.locate(key))

    def raw(self, model: RawArgs | None, model_problems: Sequence[Problem] = ()) -> RawArgs:
        # A model that could not be read is its one problem: the shape keys it would give are
        # located there, so validation's "required" findings fold into it (api.evaluate).
        at = model_problems[0].location if model_problems else None
        mine = RawArgs(dict(self.settings), self.source, absent=(lambda dest: at) if at else None)
        return model.merged(mine) if model is not None else mine


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(value)
    return value


def model_settings(name: Any, location: str, release: str) -> tuple[RawArgs | None, tuple[Problem, ...], tuple[str, ...]]:
    """The model's Megatron settings from an HF id or folder, as ``--hf-config`` reads it."""
    from megatron_estimator.inputs.hf import load_hf_config

    if not isinstance(name, str) or not name:
        return None, (Problem("missing-key", location, "names no model (an HF id or folder)"),), ()
    hf = load_hf_config(os.path.expanduser(name), release)
    if hf.problems:
        return None, tuple(Problem(p.code, p.location, f"{p.message} (the model of {location})") for p in hf.problems), ()
    return hf.raw, (), tuple(f"{hf_key} -> {flag} {value}" for hf_key, flag, value in hf.mapping)


def _has_key(config, key: str) -> bool:
    """Whether ``key`` is written in this one file (no interpolation resolved)."""
    from omegaconf import DictConfig

    node = config
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():
            return False
        node = node._get_node(part)
        node = node if isinstance(node, DictConfig) else node
    return True


def _locator(files: Sequence[str], overrides: Sequence[str], where_overrides: str | Sequence[str]
             ) -> Callable[[str], str]:
    from omegaconf import OmegaConf

    loaded = []
    for file in files:
        try:
            loaded.append((file, OmegaConf.create(read_input_text(file, "yaml"))))
        except Exception:
            continue

    given = override_locator(overrides, where_overrides)

    def locate(key: str) -> str:
        if given(key) is not None:
            return given(key)
        for file, config in reversed(loaded):
            if _has_key(config, key):
                return f"{file} {key}"
        return f"{files[-1] if files else 'command line'} {key}"
    return locate


def read_nemo_rl(path: str, overrides: Sequence[str] = (), *, release: str = "main",
                 overrides_at: str | Sequence[str] = "command line") -> TreeReading:
    """A NeMo-RL config file (with its ``defaults:`` parents) and Hydra overrides as Megatron settings."""
    missing = extra_problem(path, "a NeMo-RL config")
    if missing is not None:
        return TreeReading(problems=(missing,))
    register_resolvers()
    files: list[str] = []
    try:
        config = apply_overrides(load_with_inheritance(path, files), overrides,
                                 overrides_at if isinstance(overrides_at, str) else
                                 (overrides_at[0] if overrides_at else path))
        tree = resolved(config, path)
    except TreeError as error:
        return TreeReading(problems=(error.problem,))
    return map_nemo_rl(tree, _locator(files, overrides, overrides_at), path, release)


def map_nemo_rl(tree: dict, locate: Callable[[str], str], source: str, release: str) -> TreeReading:
    policy = get(tree, "policy", {})
    if not isinstance(policy, dict) or not policy:
        return TreeReading(skip="a NeMo-RL config without policy: (no training job)")
    if not get(tree, "policy.megatron_cfg.enabled", False):
        return TreeReading(skip="its policy trains with DTensor/FSDP2 (policy.megatron_cfg.enabled is not true): "
                                "not Megatron", problems=(Problem(
                                    "unsupported-stack", locate("policy.megatron_cfg.enabled"),
                                    "NeMo-RL's policy here is DTensor/FSDP2, not Megatron "
                                    "(policy.megatron_cfg.enabled is not true); the estimator models Megatron only"),))
    s = Settings(tree, locate, source)
    notes: list[str] = []
    m = "policy.megatron_cfg."
    for dest in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "expert_tensor_parallel_size"):
        s.put(dest, m + dest, _integer)
    s.put("sequence_parallel", m + "sequence_parallel", bool)
    s.put("decoder_first_pipeline_num_layers", m + "num_layers_in_first_pipeline_stage", _integer)
    s.put("decoder_last_pipeline_num_layers", m + "num_layers_in_last_pipeline_stage", _integer)
    if get(tree, m + "activation_checkpointing", False):
        granularity = get(tree, m + "recompute_granularity", "full")
        s.force("recompute_granularity", granularity, m + "activation_checkpointing")
        if granularity == "full":       # setup.py _apply_performance_config
            s.force("recompute_method", "uniform", m + "activation_checkpointing")
            s.force("recompute_num_layers", 1, m + "activation_checkpointing")
        elif get(tree, m + "recompute_modules") is not None:
            s.put("recompute_modules", m + "recompute_modules", list)
    precision = get(tree, "policy.precision", "float32")
    if precision in ("bfloat16", "float16"):    # setup.py dtype_map: model_cfg.bf16 = dtype == bfloat16
        s.force("bf16" if precision == "bfloat16" else "fp16", True, "policy.precision")
    elif precision != "float32":
        s.problems.append(Problem("invalid-choice", locate("policy.precision"),
                                  f"policy.precision {precision!r}: NeMo-RL knows float32, bfloat16, float16"))
    o = m + "optimizer."
    s.put("optimizer", o + "optimizer", str)
    s.put("use_distributed_optimizer", o + "use_distributed_optimizer", bool)
    s.put("use_precision_aware_optimizer", o + "use_precision_aware_optimizer", bool)
    if s.put("optimizer_cpu_offload", o + "optimizer_cpu_offload", bool):
        s.put("optimizer_offload_fraction", o + "optimizer_offload_fraction", float)
        notes.append(f"NeMo-RL optimizer_cpu_offload: the optimizer's states and step run on the CPU "
                     f"(HybridDeviceOptimizer, {_SETUP})")
    d = m + "distributed_data_parallel_config."
    s.put("accumulate_allreduce_grads_in_fp32", d + "grad_reduce_in_fp32", bool)
    s.put("overlap_grad_reduce", d + "overlap_grad_reduce", bool)
    s.put("overlap_param_gather", d + "overlap_param_gather", bool)
    s.put("global_batch_size", "policy.train_global_batch_size", _integer)
    micro = s.put("micro_batch_size", "policy.train_micro_batch_size", _integer)
    seq = s.put("seq_length", "policy.max_total_sequence_length", _integer)
    packed = get(tree, "policy.sequence_packing.train_mb_tokens")
    if get(tree, "policy.sequence_packing.enabled", False) and isinstance(packed, int):
        s.force("micro_batch_size", 1, "policy.sequence_packing.train_mb_tokens")
        s.force("seq_length", packed, "policy.sequence_packing.train_mb_tokens")
        notes.append(f"NeMo-RL sequence packing: each micro batch is one row of up to train_mb_tokens = "
                     f"{packed} tokens (policy.train_micro_batch_size {micro} x max_total_sequence_length {seq} "
                     "unless set), estimated as --micro-batch-size 1 --seq-length "
                     f"{packed} (nemo_rl/data/packing)")
    level = get(tree, m + "empty_unused_memory_level", 1)
    notes.append(f"NeMo-RL empty_unused_memory_level {level}: torch.cuda.empty_cache() after the forward-backward "
                 "pass (>= 1) and after the optimizer step (>= 2) (nemo_rl/models/policy/workers/"
                 "megatron_policy_worker.py train); the estimate counts what is allocated, not what is cached")
    beside: tuple = ()
    if get(tree, "loss_fn.reference_policy_kl_penalty", 0):
        from megatron_estimator.inputs.co_resident import CoResident

        # setup.py:2039 setup_reference_model_state keeps the reference weights as a CPU state dict
        # (:2168 reference_state_dict[name] = cpu_item), swapped in only for the reference log-probs.
        beside = (CoResident("NeMo-RL reference model", get(tree, m + "tensor_model_parallel_size", 1) or 1,
                             get(tree, m + "pipeline_model_parallel_size", 1) or 1, weights=False,
                             source=f"{_SETUP}:2039,2168 (a CPU state dict)",
                             location=locate("loss_fn.reference_policy_kl_penalty")),)
    colocated = get(tree, "policy.generation.colocated.enabled", True)
    backend = get(tree, "policy.generation.backend")
    if backend == "vllm" and colocated:
        notes.append("NeMo-RL colocated vLLM: the engine sleeps while training runs (llm.sleep(level=1), "
                     "nemo_rl/models/generation/vllm/vllm_worker.py:1286-1309: weights offloaded to the CPU, KV "
                     "cache freed); what vLLM keeps asleep (its CUDA graphs' pool, its own CUDA context) is not "
                     "counted beyond the CUDA context already in the overheads")
    elif backend is not None and colocated and backend != "megatron":
        notes.append(f"NeMo-RL colocated {backend} generation: what it keeps on the GPU while training runs "
                     "is not modelled; lower the budget by it")
    nodes, per_node = get(tree, "cluster.num_nodes", 1), get(tree, "cluster.gpus_per_node")
    world = source_words = None
    if isinstance(nodes, int) and isinstance(per_node, int):
        world, source_words = nodes * per_node, f"cluster.num_nodes x cluster.gpus_per_node = {nodes} x {per_node}"
        if backend is not None and not colocated:   # grpo.py setup: non-colocated resources
            inf_nodes = get(tree, "policy.generation.colocated.resources.num_nodes")
            inf_gpus = get(tree, "policy.generation.colocated.resources.gpus_per_node")
            if nodes == 1 and isinstance(inf_gpus, int):
                world, source_words = per_node - inf_gpus, f"{source_words}, less the generation's {inf_gpus} GPUs"
            elif isinstance(inf_nodes, int):
                world = (nodes - inf_nodes) * per_node
                source_words = f"{source_words}, less the generation's {inf_nodes} nodes"
        source_words += " (NeMo-RL nemo_rl/algorithms/grpo.py setup)"
    model_raw, model_problems, model_notes = model_settings(get(tree, "policy.model_name"),
                                                            locate("policy.model_name"), release)
    raw = replace(s.raw(model_raw, model_problems), co_resident=beside)
    return TreeReading(raw, tuple(s.problems) + model_problems, world, source_words, tuple(notes) + model_notes)
