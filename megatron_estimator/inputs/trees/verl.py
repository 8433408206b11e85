"""verl's Hydra trainer configurations (``verl/trainer/config/ppo_megatron_trainer.yaml`` and files
written like it) read into the Megatron settings of the actor.

Facts, from volcengine/verl (commit b178a3cd):

- Composition: a trainer config has a Hydra ``defaults:`` list (``actor@actor_rollout_ref.actor:
  megatron_actor``, ``ref@...``, ``critic@critic: megatron_critic``, ``_self_``) resolved against
  its config folder; ``python3 -m verl.trainer.main_ppo --config-path P --config-name N key=value``
  composes N from P with the overrides (``@hydra.main`` in ``verl/trainer/main_ppo.py``).  Here
  Hydra's compose API does the same (``initialize_config_dir`` + ``compose``).
- The actor's Megatron settings are ``actor_rollout_ref.actor.megatron.*``
  (``verl/workers/config/engine.py`` ``McoreEngineConfig``: the parallel sizes,
  ``sequence_parallel``, ``use_distributed_optimizer``, ``dtype``), and
  ``override_transformer_config`` is laid over the TransformerConfig as named.
- The micro batch: ``ppo_micro_batch_size_per_gpu`` sequences of ``data.max_prompt_length +
  data.max_response_length`` tokens; with ``use_dynamic_bsz`` micro batches are packed to
  ``ppo_max_token_len_per_gpu`` tokens (``verl/utils/seqlen_balancing.py``).
- The world: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` (the hybrid engine colocates actor,
  reference, critic and rollout on the same GPUs: ``verl/trainer/main_ppo.py``
  ``ResourcePoolManager``).
- Offload (``verl/workers/megatron_workers.py``): ``param_offload``/``grad_offload``/
  ``optimizer_offload`` move them to the CPU between phases and load them back before the update,
  so during the update they are on the GPU.  The rollout engine with ``free_cache_engine: true``
  releases its weights and KV cache before training (``rollout_mode`` / ``trainer_mode`` sleep,
  ``verl/workers/rollout/vllm_rollout``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Callable, Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.co_resident import CoResident
from megatron_estimator.inputs.trees.common import extra_problem, override_locator, first_line
from megatron_estimator.inputs.trees.nemo_rl import Settings, TreeError, TreeReading, _integer, get, model_settings

_ENGINE = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
           "expert_model_parallel_size", "expert_tensor_parallel_size")


_WORKERS = "verl/workers/megatron_workers.py"


def _layout(tree: dict, prefix: str, actor: str) -> tuple[int, int]:
    """(tp, pp) of a model's ``megatron.*`` block, the actor's where it sets none."""
    sizes = []
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        value = get(tree, prefix + key, get(tree, actor + key, 1))
        sizes.append(value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1)
    return sizes[0], sizes[1]


def _co_resident(tree: dict, locate: Callable[[str], str], actor: str) -> tuple[CoResident, ...]:
    """The reference model and the critic beside the actor on its GPUs (the hybrid engine colocates
    them, verl/trainer/main_ppo.py), and what of each stays on the GPU while the actor trains."""
    terms = []
    # verl/trainer/ppo/utils.py:72-76 need_reference_policy: use_kl_in_reward or use_kl_loss.
    if get(tree, "algorithm.use_kl_in_reward", False) or get(tree, "actor_rollout_ref.actor.use_kl_loss", False):
        ref = "actor_rollout_ref.ref.megatron."
        offload = bool(get(tree, ref + "param_offload", False))
        tp, pp = _layout(tree, ref, actor)
        # megatron_workers.py:374 reads ref.megatron.param_offload; :637-638 (after building) and
        # :855-856 (after compute_ref_log_prob) move the frozen reference weights to the CPU.
        terms.append(CoResident("verl reference model", tp, pp, weights=not offload,
                                source=f"{_WORKERS}:374,637-638,855-856 ref.megatron.param_offload {offload}",
                                location=locate(ref + "param_offload")))
    # verl/trainer/ppo/utils.py:86-92 need_critic: critic.enable, else adv_estimator gae.
    enable = get(tree, "critic.enable")
    if (bool(enable) if enable is not None else get(tree, "algorithm.adv_estimator") == "gae") \
            and get(tree, "critic.strategy", "megatron") == "megatron":
        c = "critic.megatron."
        params, optim = bool(get(tree, c + "param_offload", False)), bool(get(tree, c + "optimizer_offload", False))
        tp, pp = _layout(tree, c, actor)
        # megatron_workers.py:1043-1044 and :1175-1178 / :1253-1256: after building and after each
        # update the critic's params and grad buffers (param_offload, verl/utils/megatron_utils.py:411
        # offload_megatron_model_to_cpu) and its optimizer states (optimizer_offload) go to the CPU.
        terms.append(CoResident("verl critic", tp, pp, weights=not params, gradients=not params,
                                optimizer=not optim,
                                source=f"{_WORKERS}:1043-1044,1175-1178,1253-1256 critic.megatron.param_offload "
                                       f"{params}, optimizer_offload {optim}",
                                location=locate(c + "param_offload")))
    return tuple(terms)


def compose(config_dir: str, config_name: str, overrides: Sequence[str], where: str) -> dict:
    """The config Hydra composes for ``--config-path config_dir --config-name config_name overrides``."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import warnings

    GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():             # Hydra warns of an unreachable searchpath; the error says it
            warnings.simplefilter("ignore")
            return _compose(config_dir, config_name, overrides, hydra_compose, initialize_config_dir, OmegaConf)
    except Exception as error:
        first = first_line(error)
        if "Could not load" in first:   # hydra.searchpath names verl's own folder (verl/trainer/config)
            first += ("; a defaults entry is in verl's own config folder (verl/trainer/config), found through the "
                      "file's hydra.searchpath: run from verl's checkout, or install verl where this runs")
        raise TreeError(where, f"Hydra cannot compose it: {first}") from None
    finally:
        GlobalHydra.instance().clear()


def _compose(config_dir, config_name, overrides, hydra_compose, initialize_config_dir, OmegaConf) -> dict:
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
        config = hydra_compose(config_name=config_name, overrides=list(overrides))
    return OmegaConf.to_container(config, resolve=True)


def read_verl(path: str, overrides: Sequence[str] = (), *, release: str = "main",
              overrides_at: str | Sequence[str] = "command line") -> TreeReading:
    """A verl trainer config file composed from its folder (Hydra) with overrides, as Megatron settings
    (``overrides_at``: where the overrides were given, one place or one per override)."""
    missing = extra_problem(path, "a verl config")
    if missing is not None:
        return TreeReading(problems=(missing,))
    folder, name = os.path.split(os.path.abspath(path))
    try:
        tree = compose(folder, os.path.splitext(name)[0], overrides, path)
    except TreeError as error:
        return TreeReading(problems=(error.problem,))

    given = override_locator(overrides, overrides_at)

    def locate(key: str) -> str:
        return given(key) or f"{path} {key}"
    return map_verl(tree, locate, path, release)


def map_verl(tree: dict, locate: Callable[[str], str], source: str, release: str) -> TreeReading:
    actor = "actor_rollout_ref.actor."
    if get(tree, actor + "strategy") != "megatron":
        return TreeReading(skip="its actor's strategy is not megatron (FSDP): not Megatron", problems=(Problem(
            "unsupported-stack", locate(actor + "strategy"),
            f"verl's actor strategy here is {get(tree, actor + 'strategy')!r}, not megatron; the estimator "
            "models Megatron only"),))
    from megatron_estimator.megatron.flags import flag_table

    s = Settings(tree, locate, source)
    notes: list[str] = []
    m = actor + "megatron."
    for dest in _ENGINE:
        s.put(dest, m + dest, _integer)
    vpp = s.put("num_layers_per_virtual_pipeline_stage", m + "num_layers_per_virtual_pipeline_stage", _integer)
    if vpp is None and get(tree, m + "virtual_pipeline_model_parallel_size") is not None:
        s.put("num_virtual_stages_per_pipeline_rank", m + "virtual_pipeline_model_parallel_size", _integer)
    s.put("sequence_parallel", m + "sequence_parallel", bool)
    s.put("use_distributed_optimizer", m + "use_distributed_optimizer", bool)
    dtype = get(tree, m + "dtype", "bfloat16")
    if dtype in ("bfloat16", "float16"):
        s.force("bf16" if dtype == "bfloat16" else "fp16", True, m + "dtype")
    table = flag_table(release)
    unmapped = []
    for key, value in (get(tree, m + "override_transformer_config", {}) or {}).items():
        if value is None or key == "attention_backend":
            continue
        if table.by_dest(key) is not None:
            s.put(key, f"{m}override_transformer_config.{key}")
        else:
            unmapped.append(key)
    if unmapped:
        notes.append("verl override_transformer_config keys with no Megatron flag, not modelled: " + ", ".join(unmapped))
    prompt, response = get(tree, "data.max_prompt_length"), get(tree, "data.max_response_length")
    if get(tree, actor + "use_dynamic_bsz", False):
        tokens = get(tree, actor + "ppo_max_token_len_per_gpu")
        s.force("micro_batch_size", 1, actor + "use_dynamic_bsz")
        s.put("seq_length", actor + "ppo_max_token_len_per_gpu", _integer)
        notes.append(f"verl use_dynamic_bsz: each micro batch is sequences packed to ppo_max_token_len_per_gpu = "
                     f"{tokens} tokens (verl/utils/seqlen_balancing.py), estimated as --micro-batch-size 1 "
                     f"--seq-length {tokens}")
    else:
        s.put("micro_batch_size", actor + "ppo_micro_batch_size_per_gpu", _integer)
        # One optimizer step takes a mini batch: ppo_mini_batch_size prompts x rollout.n responses,
        # split over the data-parallel ranks, each split into micro batches
        # (verl/workers/megatron_workers.py:354-355, workers/actor/megatron_actor.py:456): Megatron's global batch.
        mini, n = get(tree, actor + "ppo_mini_batch_size"), get(tree, "actor_rollout_ref.rollout.n", 1)
        if isinstance(mini, int) and isinstance(n, int) and not isinstance(mini, bool):
            s.force("global_batch_size", mini * n, actor + "ppo_mini_batch_size")
            notes.append(f"verl: the global batch is actor.ppo_mini_batch_size x rollout.n = {mini} x {n} = "
                         f"{mini * n} sequences per optimizer step")
        if isinstance(prompt, int) and isinstance(response, int):
            s.force("seq_length", prompt + response, "data.max_response_length")
            notes.append(f"verl: a sequence is data.max_prompt_length + data.max_response_length = "
                         f"{prompt} + {response} = {prompt + response} tokens")
    for what in ("param_offload", "grad_offload", "optimizer_offload"):
        if get(tree, m + what, False):
            notes.append(f"verl {what}: moved to the CPU between phases and loaded back for the update "
                         "(verl/workers/megatron_workers.py), so counted on the GPU while training runs")
    beside = _co_resident(tree, locate, m)
    rollout = "actor_rollout_ref.rollout."
    if get(tree, rollout + "free_cache_engine", True):     # verl/workers/config/rollout.py:161 default True
        notes.append("verl rollout free_cache_engine: before the actor trains the hybrid engine sleeps at level 2 "
                     "(verl/workers/rollout/vllm_rollout/vllm_async_server.py:563-571: weights and KV cache "
                     "discarded; megatron_workers.py:714,734 resume them for the next rollout); what vLLM keeps "
                     "asleep (its CUDA graphs' pool, its own CUDA context) is not counted beyond the CUDA context "
                     "already in the overheads")
    else:
        frac = get(tree, rollout + "gpu_memory_utilization")
        notes.append(f"verl rollout without free_cache_engine (vllm_async_server.py:563-564 returns without "
                     f"sleeping): the engine keeps its gpu_memory_utilization {frac} share of each GPU while "
                     "training runs; NOT counted here: lower the budget by it")
    nodes, per_node = get(tree, "trainer.nnodes"), get(tree, "trainer.n_gpus_per_node")
    world = words = None
    if isinstance(nodes, int) and isinstance(per_node, int):
        world, words = nodes * per_node, f"trainer.nnodes x trainer.n_gpus_per_node = {nodes} x {per_node} (verl)"
    model_raw, model_problems, model_notes = model_settings(get(tree, "actor_rollout_ref.model.path"),
                                                            locate("actor_rollout_ref.model.path"), release)
    raw = replace(s.raw(model_raw, model_problems), co_resident=beside)
    return TreeReading(raw, tuple(s.problems) + model_problems, world, words, tuple(notes) + model_notes)
