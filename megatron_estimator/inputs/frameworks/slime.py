"""slime (THUDM/slime): RL post-training whose actor trains with Megatron.

Facts, from slime's source (the commit of ``data/frameworks/slime_flags.tsv``):

- entry programs ``train.py`` and ``train_async.py`` at the repository root; the flags come
  from ``slime/utils/arguments.py`` (``get_slime_extra_args_provider``, handed to Megatron's
  parser with ``ignore_unknown_args=True``; the ``--sglang-*`` flags are parsed apart);
- the world size of the training actor is ``--actor-num-nodes`` x ``--actor-num-gpus-per-node``
  (``slime/backends/megatron_utils/arguments.py`` ``megatron_parse_args``; defaults 1 and 8);
  the rollout engines run on ``--rollout-num-gpus`` GPUs of their own unless ``--colocate``;
- Megatron defaults it changes (``reset_arg``): ``--micro-batch-size`` 1; ``--global-batch-size``
  is ``--rollout-batch-size`` x ``--n-samples-per-prompt`` // ``--num-steps-per-rollout`` when
  that is given (``slime_validate_args``);
- Megatron arguments it sets (``_set_default_megatron_args``): ``use_distributed_optimizer``
  True, ``bf16 = not fp16``, ``seq_length`` 4096 and ``max_position_embeddings = seq_length``
  when not given; ``validate_args`` sets ``variable_seq_lengths`` True;
- ``--use-dynamic-batch-size``: micro batches are packed up to ``--max-tokens-per-gpu`` x
  context-parallel size tokens (``slime/utils/dp_schedule.py``, ``max_per_bin``), one packed
  sequence each: modelled as ``micro_batch_size`` 1 of that many tokens;
- ``--colocate``: the rollout engines share the actor's GPUs; ``--offload-rollout`` (on by
  default with ``--colocate``, ``slime_validate_args``) releases the engine's weights and KV
  cache while training runs (torch_memory_saver); ``--no-offload-rollout`` keeps them.
"""

from __future__ import annotations

from megatron_estimator.inputs.co_resident import CoResident
from megatron_estimator.inputs.frameworks.adapter import UNKNOWN, Adaptation, Framework, FrameworkFlags

_SOURCE = "slime/backends/megatron_utils/arguments.py"


def _layout(flags: FrameworkFlags) -> tuple[int, int]:
    sizes = []
    for names in (("--tensor-model-parallel-size", "--tp"), ("--pipeline-model-parallel-size", "--pp")):
        value = next((flags.value(n) for n in names if flags.given(n)), 1)
        try:
            sizes.append(max(int(value), 1))
        except (TypeError, ValueError):
            sizes.append(1)
    return sizes[0], sizes[1]


def _co_resident(flags: FrameworkFlags) -> tuple[CoResident, ...]:
    """The reference model and the critic beside the actor, and what of them is on the GPU while
    the actor trains: nothing, in both cases (slime's source, below)."""
    tp, pp = _layout(flags)
    terms = []
    if flags.given("--ref-load"):
        # slime/backends/megatron_utils/actor.py:133 loads --ref-load into a pinned CPU backup
        # (slime/utils/tensor_backper.py:61 torch.empty_like(..., device=cpu, pin_memory=True));
        # actor.py:435-438 swaps it into the actor's own parameters for the reference log-probs
        # before the actor's update, so no second copy is on the GPU while it trains.
        terms.append(CoResident("slime reference model", tp, pp, weights=False,
                                source="slime/utils/tensor_backper.py:61, slime/backends/megatron_utils/actor.py:133,"
                                       "435-438", location="--ref-load"))
    if flags.value("--advantage-estimator") == "ppo":
        # slime/utils/arguments.py:1909 use_critic = advantage_estimator == "ppo"; :1911-1912 puts the critic on the actor's GPUs and :1961-1962 forces
        # --offload-train with it, so each model's training state is released while the other trains.
        terms.append(CoResident("slime critic", tp, pp, weights=False,
                                source="slime/utils/arguments.py:1909-1912,1961-1962 (--offload-train forced)",
                                location="--advantage-estimator ppo"))
    return tuple(terms)


def _adapt(flags: FrameworkFlags) -> Adaptation:
    nodes = flags.value("--actor-num-nodes", 1)
    per_node = flags.value("--actor-num-gpus-per-node", 8)
    said = [f"slime: the training actor runs on --actor-num-nodes x --actor-num-gpus-per-node = "
            f"{nodes} x {per_node} GPUs ({_SOURCE} megatron_parse_args)"]
    settings: dict = {"use_distributed_optimizer": True}
    said.append(f"slime forces the distributed optimizer ({_SOURCE} _set_default_megatron_args); its "
                "variable sequence lengths (validate_args) change pipeline message shapes only")
    if not flags.given("--fp16"):
        settings["bf16"] = True
        said.append(f"slime trains in bf16 unless --fp16 ({_SOURCE}: bf16 = not fp16)")
    if not flags.given("--micro-batch-size"):
        settings["micro_batch_size"] = 1
        said.append("slime's default --micro-batch-size 1 (slime/utils/arguments.py reset_arg)")
    steps = flags.value("--num-steps-per-rollout")
    rollout, samples = flags.value("--rollout-batch-size"), flags.value("--n-samples-per-prompt", 1)
    if isinstance(steps, int) and steps > 0 and isinstance(rollout, int) and isinstance(samples, int):
        # slime/utils/arguments.py slime_validate_args (asserts an explicit --global-batch-size agrees)
        settings["global_batch_size"] = rollout * samples // steps
        said.append(f"slime: --global-batch-size = --rollout-batch-size x --n-samples-per-prompt // "
                    f"--num-steps-per-rollout = {rollout} x {samples} // {steps} = {rollout * samples // steps} "
                    "(slime/utils/arguments.py slime_validate_args)")
    if flags.value("--use-dynamic-batch-size", False):
        tokens = flags.value("--max-tokens-per-gpu")
        cp = flags.value("--context-parallel-size") or flags.value("--cp") or 1
        try:
            cp = int(cp)
        except (TypeError, ValueError):
            cp = 1
        if isinstance(tokens, int):
            settings.update(micro_batch_size=1, seq_length=tokens * cp)
            said.append(f"slime --use-dynamic-batch-size: each micro batch is one packed sequence of up to "
                        f"--max-tokens-per-gpu x context-parallel size = {tokens} x {cp} tokens "
                        "(slime/utils/dp_schedule.py max_per_bin), estimated as --micro-batch-size 1 "
                        f"--seq-length {tokens * cp}")
    elif not flags.given("--seq-length"):
        settings["seq_length"] = 4096
        said.append(f"slime's default --seq-length 4096 ({_SOURCE} _set_default_megatron_args)")
    if not flags.given("--max-position-embeddings"):
        settings["max_position_embeddings"] = settings.get("seq_length") or flags.value("--seq-length") or 4096
        if isinstance(settings["max_position_embeddings"], str):
            settings["max_position_embeddings"] = int(settings["max_position_embeddings"])
    if flags.value("--colocate", False):
        keeps = flags.value("--offload-rollout")
        offload = flags.value("--offload", False)
        if keeps is False and not offload:
            said.append("slime --colocate --no-offload-rollout: the SGLang engines keep their weights and KV "
                        "cache on the actor's GPUs while training runs; that memory is NOT counted here "
                        "(it is the engines' --sglang-mem-fraction-static share of each GPU): lower the budget by it")
        else:
            said.append("slime --colocate: the rollout engines share the actor's GPUs and release their weights "
                        "and KV cache while training runs (--offload-rollout, on by default with --colocate, "
                        "slime/utils/arguments.py slime_validate_args); counted as nothing beyond the CUDA "
                        "context already in the overheads")
    else:
        said.append("slime: the rollout engines run on GPUs of their own (--rollout-num-gpus), not estimated")
    beside = _co_resident(flags)
    unknown = tuple((flag, "the world size") for flag, value in
                    (("--actor-num-nodes", nodes), ("--actor-num-gpus-per-node", per_node)) if value is UNKNOWN)
    if flags.value("--use-dynamic-batch-size", False) and flags.value("--max-tokens-per-gpu") is UNKNOWN:
        unknown += (("--max-tokens-per-gpu", "the tokens of a micro batch"),)
    return Adaptation(world_size=nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else None,
                      world_size_source="--actor-num-nodes x --actor-num-gpus-per-node (slime)",
                      settings=settings, assumptions=tuple(said), unknown=unknown,
                      co_resident=beside)


FRAMEWORK = Framework(
    name="slime",
    entry_patterns=("train.py", "train_async.py"),
    flag_table="slime_flags.tsv",
    provider_files=("slime/utils/arguments.py", "slime/backends/sglang_utils/arguments.py"),
    imports=("slime",),
    # slime/backends/sglang_utils/arguments.py: SGLang's server flags (--sglang-*) and its router's
    # (RouterArgs.add_cli_args(use_router_prefix=True): --router-*), parsed by their own parser
    prefixes=("--sglang-", "--router-"),
    adapt=_adapt,
    patched_megatron="slime_megatron_patch_flags.tsv",
)
