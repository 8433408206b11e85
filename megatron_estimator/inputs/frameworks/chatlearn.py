"""ChatLearn (alibaba/ChatLearn): ``python chatlearn_entrypoint.py grpo --config-file X.yaml key=value ...``.

The entry program (Pai-Megatron-Patch examples/qwen3/chatlearn_entrypoint.py, ChatLearn's own
``chatlearn/entrypoint.py``) parses an algorithm name, ``--config-file`` and Hydra overrides
(``models.policy_trainer.tensor_model_parallel_size=4`` ...); ChatLearn's trainer builds
Megatron's arguments from that tree, with the model read from a HuggingFace checkpoint
(``models.policy.load``) and a vLLM/SGLang rollout engine colocated on the same GPUs
(``runtime_args.colocation``).  The estimator reads neither ChatLearn's config tree nor its
rollout engine's memory: such a launch is one ``unsupported-stack`` problem, and
``check --skip-unknown`` says "not checked" for it, never "launches no training".
"""

from __future__ import annotations

from megatron_estimator.inputs.frameworks.adapter import Framework

_WHY = ("ChatLearn builds Megatron's arguments from its own config tree (--config-file and key=value "
        "overrides, the model from a HuggingFace checkpoint) and colocates its rollout engine on the "
        "training GPUs; the estimator reads neither")


def _not_checked(entry_path: str | None) -> str:
    return f"a ChatLearn training launch: {_WHY}"


FRAMEWORK = Framework(
    name="ChatLearn",
    entry_patterns=("chatlearn_entrypoint.py", "chatlearn/entrypoint.py"),
    imports=("chatlearn",),
    unsupported=_WHY,
    not_checked=_not_checked,
)
